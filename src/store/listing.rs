//! The shapes of the console's lists, written once for both backends: the notification
//! list with its filters and either order, and what a search text means (an id prefix,
//! words of an address, part of a client's name). Each backend renders its placeholders
//! and binds the [`Arg`]s with its own types.
//!
//! What keeps them fast on a large store:
//! - Notifications are ordered by `seq` (the outbox order) either way and paged by it, so
//!   a cursor of either order is a plain `seq`. A time range is on `created_at`, which
//!   `notifications_by_created` indexes (a column that never changes, so PostgreSQL's
//!   lease and result updates stay HOT): with `from` given, a page reads the rows of that
//!   range and no more, however old the outbox is. No index holds `status` or `kind`
//!   (either would make every status change write it): those filter the rows a range, a
//!   client or a sensor selects, or the outbox walked from its newest end.
//! - A sensor id prefix is a range of the primary key (SQLite) or of `sensors_id_prefix`
//!   (PostgreSQL, `text_pattern_ops`, whatever the database's collation); the words of an
//!   address are a full-text index (SQLite FTS5 `sensor_search`, kept by triggers;
//!   PostgreSQL a GIN index over `to_tsvector('simple', address)`).
//! - A sensor's notifications are its own lane's (`notifications_by_sensor`) and the site
//!   events that named it (`notification_sensors`, rows of site notifications only): a
//!   page reads and orders that one sensor's rows, never the outbox. With a type given,
//!   only the one of the two that type can be in is read.
//! - Clients are few (a name is a person's choice, not a device's): a name is matched by
//!   scanning the clients table.

use super::{NotificationFilter, Page, PageRequest, Registry, Result};
use crate::domain::{Client, SensorId};

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    Text(String),
    Int(i64),
}

/// A statement and its arguments, `$1`… or `?1`… in the order given.
#[derive(Debug, Clone)]
pub(crate) struct Query {
    pub sql: String,
    pub args: Vec<Arg>,
}

/// How a backend writes its placeholders and what it adds to the notification list.
pub(crate) struct Dialect {
    /// The placeholder of argument `n` (1-based).
    pub placeholder: fn(usize) -> String,
    /// Written after `notifications n` when the list is bounded by `from`: SQLite's
    /// planner, seeing `ORDER BY seq … LIMIT`, would walk the whole outbox by `seq`
    /// instead of the range (PostgreSQL's weighs both: nothing).
    pub by_created: &'static str,
}

/// The notifications naming a sensor, from `notification_sensors`: a site's notification
/// travels in the lane of the first sensor it names (its `sensor_id`), so a sensor's list
/// finds the site events that named it there, by an index rather than in their bodies.
const NAMED: &str = "SELECT ns.seq FROM notification_sensors ns WHERE ns.sensor_id";

/// The notification list: [`super::rows::NOTIF_COLS`] of `notifications n` that match
/// `f`, after the cursor `after` in the list's order, at most `limit` rows.
pub(crate) fn notifications(
    d: &Dialect,
    f: &NotificationFilter,
    after: Option<i64>,
    limit: i64,
) -> Query {
    let mut args = Vec::new();
    let mut cond = Vec::new();
    let bind = |args: &mut Vec<Arg>, a: Arg| {
        args.push(a);
        (d.placeholder)(args.len())
    };
    if let Some(after) = after {
        let p = bind(&mut args, Arg::Int(after));
        cond.push(format!(
            "n.seq {} {p}",
            if f.newest_first { "<" } else { ">" }
        ));
    }
    if let Some(c) = &f.client_id {
        cond.push(format!(
            "n.client_id = {}",
            bind(&mut args, Arg::Text(c.clone()))
        ));
    }
    if let Some(s) = f.sensor_id {
        let p = bind(&mut args, Arg::Text(s.to_string()));
        cond.push(match f.kind {
            Some(k) if !k.is_site() => format!("n.sensor_id = {p}"),
            Some(_) => format!("n.seq IN ({NAMED} = {p})"),
            None => format!(
                "n.seq IN (SELECT o.seq FROM notifications o WHERE o.sensor_id = {p} \
                 UNION ALL {NAMED} = {p})"
            ),
        });
    }
    if let Some(s) = f.status {
        cond.push(format!(
            "n.status = {}",
            bind(&mut args, Arg::Text(s.as_str().into()))
        ));
    }
    if let Some(k) = f.kind {
        cond.push(format!(
            "n.kind = {}",
            bind(&mut args, Arg::Text(k.as_str().into()))
        ));
    }
    if let Some(site) = &f.site_id {
        cond.push(format!(
            "n.site_id = {}",
            bind(&mut args, Arg::Text(site.clone()))
        ));
    }
    if let Some(from) = f.created.from {
        cond.push(format!(
            "n.created_at >= {}",
            bind(&mut args, Arg::Int(from))
        ));
    }
    if let Some(to) = f.created.to {
        cond.push(format!("n.created_at < {}", bind(&mut args, Arg::Int(to))));
    }
    let limit = bind(&mut args, Arg::Int(limit));
    let hint = if f.created.from.is_some() {
        d.by_created
    } else {
        ""
    };
    let cond = if cond.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", cond.join(" AND "))
    };
    let order = if f.newest_first { "DESC" } else { "ASC" };
    Query {
        sql: format!(
            "SELECT {} FROM notifications n{hint}{cond} ORDER BY n.seq {order} LIMIT {limit}",
            super::rows::NOTIF_COLS
        ),
        args,
    }
}

/// What a search text asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Search {
    /// The text as typed, trimmed: a sensor id prefix when it could be one.
    pub text: String,
    /// Its words: runs of letters and digits, lower-cased, at most [`MAX_WORDS`]. A
    /// sensor matches when each is the start of a word of its address.
    pub words: Vec<String>,
}

/// Words of a search that count; more are ignored.
pub const MAX_WORDS: usize = 8;
/// Characters of one search word that count.
const MAX_WORD_CHARS: usize = 64;

impl Search {
    /// `None` for a text with nothing to search for.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .take(MAX_WORDS)
            .map(|w| {
                w.chars()
                    .take(MAX_WORD_CHARS)
                    .collect::<String>()
                    .to_lowercase()
            })
            .collect();
        (!words.is_empty()).then(|| Self {
            text: text.to_string(),
            words,
        })
    }

    /// The text as a sensor id prefix, when it could be the start of an id.
    pub(crate) fn id_prefix(&self) -> Option<&str> {
        SensorId::parse(&self.text).ok().map(|_| self.text.as_str())
    }

    /// SQLite FTS5: every word as a prefix of a token of the `address` column. Words are
    /// letters and digits only, so quoting them is enough.
    pub(crate) fn fts5(&self) -> String {
        self.words
            .iter()
            .map(|w| format!("address : \"{w}\"*"))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// PostgreSQL `to_tsquery('simple', …)`: every word as a prefix.
    pub(crate) fn tsquery(&self) -> String {
        self.words
            .iter()
            .map(|w| format!("'{w}':*"))
            .collect::<Vec<_>>()
            .join(" & ")
    }
}

/// Clients, by id, whose name holds the search's text, case aside (Unicode's, which SQL's
/// `lower` does not know on SQLite). Clients are few, so this pages through them all in
/// the store's own pages, `disabled` filtering as in [`Registry::list_clients`].
pub async fn find_clients(
    store: &dyn Registry,
    search: &Search,
    disabled: Option<bool>,
    page: PageRequest,
) -> Result<Page<Client>> {
    let needle = search.text.to_lowercase();
    let want = page.limit as usize + 1;
    let mut found = Vec::new();
    let mut after = page.after.clone();
    loop {
        let batch = store
            .list_clients(
                PageRequest {
                    limit: CLIENT_SCAN_PAGE,
                    after,
                },
                disabled,
            )
            .await?;
        found.extend(
            batch
                .items
                .into_iter()
                .filter(|c| c.name.to_lowercase().contains(&needle)),
        );
        if found.len() >= want || batch.next.is_none() {
            break;
        }
        after = batch.next;
    }
    found.truncate(want);
    Ok(Page::from_rows(found, page.limit, |c| c.id.clone()))
}

/// Clients read per round trip while searching them.
const CLIENT_SCAN_PAGE: u32 = 1000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EventKind, Status};
    use crate::store::TimeRange;

    fn dollar(n: usize) -> String {
        format!("${n}")
    }

    #[test]
    fn a_list_binds_only_the_filters_given_in_order() {
        let d = Dialect {
            placeholder: dollar,
            by_created: " INDEXED BY x",
        };
        let q = notifications(&d, &NotificationFilter::default(), None, 11);
        assert!(
            q.sql
                .ends_with("FROM notifications n ORDER BY n.seq ASC LIMIT $1"),
            "{}",
            q.sql
        );
        assert_eq!(q.args, [Arg::Int(11)]);
        let f = NotificationFilter {
            status: Some(Status::Failed),
            kind: Some(EventKind::ConnectionLost),
            created: TimeRange {
                from: Some(5),
                to: None,
            },
            newest_first: true,
            ..Default::default()
        };
        let q = notifications(&d, &f, Some(40), 3);
        assert!(
            q.sql.ends_with(
                "FROM notifications n INDEXED BY x WHERE n.seq < $1 AND n.status = $2 \
                 AND n.kind = $3 AND n.created_at >= $4 ORDER BY n.seq DESC LIMIT $5"
            ),
            "{}",
            q.sql
        );
        assert_eq!(
            q.args,
            [
                Arg::Int(40),
                Arg::Text("failed".into()),
                Arg::Text("sensor.connection_lost".into()),
                Arg::Int(5),
                Arg::Int(3)
            ]
        );
    }

    #[test]
    fn a_sensor_finds_its_lane_and_the_site_events_naming_it_by_index() {
        let d = Dialect {
            placeholder: dollar,
            by_created: "",
        };
        let of = |kind| NotificationFilter {
            sensor_id: Some(SensorId::parse("N3").unwrap()),
            kind,
            ..Default::default()
        };
        let q = notifications(&d, &of(None), None, 5);
        assert!(
            q.sql.contains(
                "WHERE n.seq IN (SELECT o.seq FROM notifications o WHERE o.sensor_id = $1 \
                 UNION ALL SELECT ns.seq FROM notification_sensors ns WHERE ns.sensor_id = $1)"
            ),
            "{}",
            q.sql
        );
        assert_eq!(q.args, [Arg::Text("N3".into()), Arg::Int(5)]);
        let q = notifications(&d, &of(Some(EventKind::SiteConnectionLost)), None, 5);
        assert!(
            q.sql.contains(
                "WHERE n.seq IN (SELECT ns.seq FROM notification_sensors ns \
                 WHERE ns.sensor_id = $1) AND n.kind = $2"
            ),
            "{}",
            q.sql
        );
        let q = notifications(&d, &of(Some(EventKind::StateChanged)), None, 5);
        assert!(
            q.sql.contains("WHERE n.sensor_id = $1 AND n.kind = $2"),
            "{}",
            q.sql
        );
    }

    #[test]
    fn a_search_is_an_id_prefix_and_words() {
        assert_eq!(Search::parse("  ,. "), None);
        let s = Search::parse(" Svobody st. 23 ").unwrap();
        assert_eq!(s.words, ["svobody", "st", "23"]);
        assert_eq!(s.id_prefix(), None);
        assert_eq!(
            s.fts5(),
            "address : \"svobody\"* AND address : \"st\"* AND address : \"23\"*"
        );
        assert_eq!(s.tsquery(), "'svobody':* & 'st':* & '23':*");
        let s = Search::parse("Door12").unwrap();
        assert_eq!(s.id_prefix(), Some("Door12"));
        assert_eq!(s.words, ["door12"]);
        assert_eq!(Search::parse("Ulица").unwrap().words, ["ulица"]);
        assert_eq!(
            Search::parse("a b c d e f g h i j").unwrap().words.len(),
            MAX_WORDS
        );
    }
}
