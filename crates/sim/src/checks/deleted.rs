//! Registry at send time for deleted clients and unlinked sensors (book: Registry at
//! send time): checked as each request arrives.

use latch::domain::{Millis, Notification};

use crate::model::Tables;

/// A deleted client gets nothing more (book, Guarantees: registry at send time): a
/// request that starts after its client's deletion committed holds only notifications a
/// claim leased before it, sent within that lease (one already on its way: it waited for
/// its client's request slot, or its process was frozen). None made before the deletion
/// is leased after it.
pub fn sent_to_deleted(
    t: &Tables,
    n: &Notification,
    now: Millis,
    claim_lease: Millis,
) -> Option<(&'static str, String)> {
    let audit = t.audit();
    let deleted = audit.client_deleted_at(&n.client_id)?;
    if deleted > now || n.created_at > deleted {
        return None;
    }
    let trail = audit.trail(&n.id)?;
    let why = match trail.claims.iter().rev().find(|c| c.0 <= deleted) {
        _ if trail.claims.iter().any(|c| c.0 > deleted) => "leased again after",
        None => "never leased before",
        Some(&(at, _)) if now > at + claim_lease => "leased longer ago than a claim lease before",
        Some(_) => return None,
    };
    Some((
        "nothing is sent to a deleted client",
        format!(
            "sent at {now}, {why} its client {} was deleted at {deleted} (claims {:?})",
            n.client_id,
            trail.claims.iter().map(|c| c.0).collect::<Vec<_>>()
        ),
    ))
}

/// Registry at send time (book): a client unlinked from a sensor gets nothing more of it.
/// The claim that leased `n` (the last before `now`) read the link: it must have been
/// there then. (A deleted client is [`sent_to_deleted`]'s; a client an alarm reached by
/// escalation is told of it without a link.)
pub fn sent_unlinked(t: &Tables, n: &Notification, now: Millis) -> Option<(&'static str, String)> {
    let audit = t.audit();
    if audit.client_deleted_at(&n.client_id).is_some()
        || t.reached(n.alarm_id.as_deref(), &n.client_id)
    {
        return None;
    }
    let trail = audit.trail(&n.id)?;
    let &(claimed, _) = trail.claims.iter().rfind(|c| c.0 <= now)?;
    (!audit.linked_at(&n.client_id, n.sensor_id, claimed)).then(|| {
        (
            "nothing is sent of a sensor its client was unlinked from",
            format!(
                "sent at {}, claimed at {} while {} was not linked to {}",
                now - crate::START,
                claimed - crate::START,
                n.client_id,
                n.sensor_id
            ),
        )
    })
}
