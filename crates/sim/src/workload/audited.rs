//! The audit trail under faults (issue #73, part 4): each registry change the workload
//! makes goes as the API makes it, with its record waiting for the store write
//! ([`latch::store::audit::scope`]); its path names the call (`/sim/{n}`), so the check
//! ([`crate::checks`], `audited`) finds each call's record, or its absence: one for a
//! change answered made, none for one refused or answered "nothing to change", at most one
//! for a call whose answer never came.

use latch::domain::audit::{Record, TokenRef};
use latch::store::{Error, Result};

use super::Workload;
use crate::log::Audited;

impl Workload {
    /// Runs `call` (a store write the API would make for `method` on `resource`) with its
    /// audit record waiting, and notes what the answer says of it: `changed` tells an
    /// answer that changed something from one that found nothing to change.
    pub(super) async fn audited<T>(
        &self,
        method: &str,
        resource: &str,
        call: impl std::future::Future<Output = Result<T>>,
        changed: impl FnOnce(&T) -> bool,
    ) -> Result<T> {
        // Noted before the call: a node killed during it never answers, and the call
        // may have landed.
        let (n, path) = {
            let mut log = self.log.lock().unwrap();
            let n = log.audited.len();
            let path = format!("/sim/{n}");
            log.audited.push((path.clone(), Audited::AtMostOne));
            (n, path)
        };
        let record = Record {
            at: self.world.now(),
            token: Some(TokenRef {
                id: "sim".into(),
                name: "the workload".into(),
            }),
            method: method.into(),
            path: path.clone(),
            resource: resource.into(),
            before: None,
            after: None,
        };
        let (result, _) = latch::store::audit::scope(record, call).await;
        let expect = match &result {
            Ok(v) if changed(v) => Audited::One,
            Ok(_) => Audited::None,
            Err(e) if e.maybe_written() => Audited::AtMostOne,
            Err(Error::Conflict(_) | Error::NotFound(_)) => Audited::None,
            // A refusal before any write (the store unavailable, its disk full).
            Err(_) => Audited::None,
        };
        self.log.lock().unwrap().audited[n].1 = expect;
        result
    }
}
