//! The transaction the rules' table operations run in (`store::rules`): one type, to which
//! each concern's file gives the operations of its tables (`site_rounds`: a site's,
//! `silences`: a silence's, `site_moves`: a move's), so a rule that spans concerns (a
//! site's decision applies silences, a silence's end retells a site's loss) takes one value
//! and those files import none of each other.

use rusqlite::Transaction;

pub(super) struct Tables<'a> {
    pub tx: &'a Transaction<'a>,
}
