//! Sites' decisions on PostgreSQL: the group commit holds back liveness events of a site's
//! sensors ([`hold_for_sites`], under the site's row lock, so a round deciding the site
//! meanwhile is waited for), and a round decides each due site once across the cluster
//! ([`decide_sites`]: `FOR UPDATE SKIP LOCKED`, a node that takes a site decides it; one
//! killed mid-round leaves it to the next round of any node).

use std::collections::{HashMap, HashSet};

use super::super::{Decided, NotificationRef, Result};
use super::db::{Sql, Tx};
use super::site_rows::{SITE_ROW, insert_one, linked, members, site_row, state_of, stored_sensor};
use crate::domain::silence::Match;
use crate::domain::site::decide::{self, HeldEvent, Hold, Rules, SiteState};
use crate::domain::site::{Site, SiteEvent};
use crate::domain::{Detail, Event, EventKind, Millis, SensorId};

fn liveness(k: EventKind) -> bool {
    matches!(
        k,
        EventKind::ConnectionLost | EventKind::ConnectionRestored | EventKind::StillLost
    )
}

/// Which of `events` (their places) make no notification now: liveness events of a
/// site's sensors that the site's decision holds ([`decide::hold`]), written to
/// `site_held`, and reminders it drops. A loss while the site is up starts its grace.
pub(super) async fn hold_for_sites(
    tx: &Tx<'_>,
    events: &[&Event],
    now: Millis,
) -> Result<HashSet<usize>> {
    let mut skipped = HashSet::new();
    let ids: Vec<String> = events
        .iter()
        .filter(|e| liveness(e.kind))
        .map(|e| e.sensor_id.to_string())
        .collect();
    if ids.is_empty() {
        return Ok(skipped);
    }
    // Each site's row locked, in id order: a round deciding it is waited for. (A sensor
    // moving between sites waits for this commit and holds back the next: both take the
    // delete lock, `super::DELETE_LOCK`.)
    let locked = tx
        .query(
            "SELECT si.id FROM sites si WHERE si.id IN \
             (SELECT s.site_id FROM sensors s WHERE s.id = ANY($1)) ORDER BY si.id FOR UPDATE",
            &[&ids],
        )
        .await?;
    if locked.is_empty() {
        return Ok(skipped);
    }
    // Read after the lock, in a statement of its own: its snapshot sees what the decision
    // it waited for wrote. The statement that locks re-reads the locked row only, and its
    // `site_held` would still hold the rows that decision consumed (issue #68: a return
    // held on a site up, and never decided).
    let rows = tx
        .query(
            "SELECT s.id, si.id, si.down, si.since, si.pending_since, si.told, si.told_clients, \
             si.released, si.retold, EXISTS (SELECT 1 FROM site_held h WHERE h.site_id = si.id AND h.sensor_id = s.id) \
             FROM sensors s JOIN sites si ON si.id = s.site_id WHERE s.id = ANY($1)",
            &[&ids],
        )
        .await?;
    let mut site_of: HashMap<String, (String, SiteState, bool)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), state_of(r, 2), r.get(9))))
        .collect();
    let mut held = HeldCols::default();
    let mut pending: Vec<String> = Vec::new();
    for (k, e) in events.iter().enumerate() {
        if !liveness(e.kind) {
            continue;
        }
        let Some((site, state, held_before)) = site_of.get_mut(&e.sensor_id.to_string()) else {
            continue;
        };
        let hold = decide::hold(e.kind, state, e.sensor_id, *held_before);
        if decide::asks_decision(e.kind, state, hold) {
            pending.push(site.clone());
        }
        match hold {
            Hold::Send => continue,
            Hold::Drop => {}
            Hold::Hold => {
                held.push(site, e);
                *held_before = true;
            }
        }
        skipped.insert(k);
    }
    pending.sort_unstable();
    pending.dedup();
    // One statement each, whatever the number of events: an outage of a whole fleet is
    // one group commit of its losses, and a round trip per loss would outlast
    // `database_timeout` (10,000 sensors' losses took over 5 s in a debug build).
    let (_, _) = futures::try_join!(held.insert(tx), async {
        if pending.is_empty() {
            return Ok(0);
        }
        tx.execute(
            "UPDATE sites SET pending_since = $2 WHERE id = ANY($1) AND pending_since IS NULL",
            &[&pending, &now],
        )
        .await
    })?;
    Ok(skipped)
}

/// The events [`hold_for_sites`] holds, in order, as the columns of one `UNNEST`.
#[derive(Default)]
struct HeldCols {
    site: Vec<String>,
    sensor: Vec<String>,
    kind: Vec<&'static str>,
    at: Vec<i64>,
    data: Vec<Option<bool>>,
    previous: Vec<Option<bool>>,
    seen: Vec<Option<i64>>,
    lost: Vec<Option<i64>>,
    reminder: Vec<Option<i32>>,
}

impl HeldCols {
    fn push(&mut self, site: &str, e: &Event) {
        self.site.push(site.to_string());
        self.sensor.push(e.sensor_id.to_string());
        self.kind.push(e.kind.as_str());
        self.at.push(e.at);
        self.data.push(e.data);
        self.previous.push(e.previous);
        self.seen.push(e.last_seen_at);
        self.lost.push(e.detail.lost_since);
        self.reminder.push(e.detail.reminder.map(|r| r as i32));
    }

    /// Inserts them in their order: a round releases held events in the order of their ids.
    async fn insert(&self, tx: &Tx<'_>) -> Result<u64> {
        if self.site.is_empty() {
            return Ok(0);
        }
        tx.execute(
            "INSERT INTO site_held (site_id, sensor_id, kind, at, data, previous, \
             last_seen_at, lost_since, reminder) \
             SELECT u.site_id, u.sensor_id, u.kind, u.at, u.data, u.previous, \
             u.last_seen_at, u.lost_since, u.reminder \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::bool[], \
             $6::bool[], $7::int8[], $8::int8[], $9::int4[]) \
             WITH ORDINALITY AS u(site_id, sensor_id, kind, at, data, previous, \
             last_seen_at, lost_since, reminder, o) ORDER BY u.o",
            &[
                &self.site,
                &self.sensor,
                &self.kind,
                &self.at,
                &self.data,
                &self.previous,
                &self.seen,
                &self.lost,
                &self.reminder,
            ],
        )
        .await
    }
}

/// The sites a round decides (`$1`: the time a grace that ran out began before), as
/// `decide::due` says: those whose grace ran out, those down that a change of their
/// sensors asks to decide again, and those with held events not released yet and no
/// grace running (down, or up after a race).
pub(super) const DUE: &str = "((pending_since IS NOT NULL AND (down OR pending_since <= $1)) \
     OR (pending_since IS NULL AND EXISTS (SELECT 1 FROM site_held h \
         WHERE h.site_id = sites.id AND h.id > sites.released)))";

/// Sites one transaction decides. A decision reads and writes each site's sensors, held
/// events and clients: 50 dark sites of 200 sensors in one transaction took longer than
/// the store's deadline on a loaded node, so it was rolled back and tried again every
/// second, and their return was never told. A few at a time, each transaction stays
/// short, and so does the wait of a commit that holds back one of their sensors' losses.
pub(super) const SITES_PER_TX: i64 = 8;

/// Decides the due sites after `after` (in id order) this node can take, up to `limit`
/// (others' rounds hold the rest); answers the notifications made and the last site looked
/// at (`None`: no due site was left after `after`).
pub(super) async fn decide_sites(
    tx: &Tx<'_>,
    rules: Rules,
    now: Millis,
    after: &str,
    limit: i64,
) -> Result<(Decided, Option<String>)> {
    let due = tx
        .query(
            &format!(
                "SELECT {SITE_ROW} FROM sites WHERE ({DUE}) \
                 AND id > $2 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED"
            ),
            &[&(now - rules.grace), &after, &limit],
        )
        .await?;
    let last = (due.len() as i64 == limit).then(|| due[due.len() - 1].get(0));
    let mut decided = Decided::default();
    for r in due {
        let (site, state) = site_row(&r);
        let (made, changed) = decide_one(tx, &site, &state, rules, now).await?;
        decided.made.extend(made);
        decided.changed.extend(changed);
    }
    Ok((decided, last))
}

async fn decide_one(
    tx: &Tx<'_>,
    site: &Site,
    state: &SiteState,
    rules: Rules,
    now: Millis,
) -> Result<(Vec<NotificationRef>, Option<SiteEvent>)> {
    let members = members(tx, &site.id).await?;
    let (held, last_row) = held_rows(tx, &site.id, None).await?;
    let clients = linked(tx, &site.id).await?;
    let Some(mut d) = decide::decide(site, state, &members, &held, &clients, &rules, now) else {
        return Ok((Vec::new(), None));
    };
    let mut made = Vec::with_capacity(d.made.len());
    for m in &d.made {
        made.push(insert_one(tx, &m.client_id, &m.event, m.body.as_deref(), now).await?);
    }
    // Every row read, those of a kind this version does not know too.
    if let (true, Some(last)) = (d.consumes_held, last_row) {
        tx.execute(
            "DELETE FROM site_held WHERE site_id = $1 AND id <= $2",
            &[&site.id, &last],
        )
        .await?;
    }
    let seqs: Vec<i64> = made.iter().map(|n| n.seq).collect();
    let silenced = super::silences::silence_new(tx, &seqs, now).await?;
    d.untell(made.iter().filter(|n| silenced.contains(&n.seq)));
    made.retain(|n| !silenced.contains(&n.seq));
    tx.execute(
        "UPDATE sites SET down = $2, since = $3, pending_since = $4, told = $5, \
         told_clients = $6, released = $7, retold = $8 WHERE id = $1",
        &[
            &site.id,
            &d.state.down,
            &d.state.since,
            &d.state.pending_since,
            &Match::listed(&d.state.told),
            &Match::listed(&d.state.told_clients),
            &d.state.released,
            &super::super::rows::retold_listed(&d.state.retold),
        ],
    )
    .await?;
    Ok((made, d.changed))
}

/// The events site `site` holds (of `sensor` only, when given), in the order held, and the
/// id of the last row read (rows of a kind this version does not know are read and left
/// out, so a decision consumes them too).
pub(super) async fn held_rows(
    tx: &Tx<'_>,
    site: &str,
    sensor: Option<SensorId>,
) -> Result<(Vec<HeldEvent>, Option<i64>)> {
    let rows = tx
        .query(
            "SELECT id, sensor_id, kind, at, data, previous, last_seen_at, lost_since, reminder \
             FROM site_held WHERE site_id = $1 AND ($2::text IS NULL OR sensor_id = $2) \
             ORDER BY id",
            &[&site, &sensor.map(|s| s.to_string())],
        )
        .await?;
    let last_row: Option<i64> = rows.last().map(|r| r.get(0));
    let mut held = Vec::with_capacity(rows.len());
    for r in &rows {
        let Some(kind) = EventKind::parse(r.get(2)) else {
            continue;
        };
        held.push(HeldEvent {
            id: r.get(0),
            event: Event {
                sensor_id: stored_sensor(r.get(1))?,
                kind,
                at: r.get(3),
                data: r.get(4),
                previous: r.get(5),
                last_seen_at: r.get(6),
                detail: Detail {
                    lost_since: r.get(7),
                    reminder: r.get::<_, Option<i32>>(8).map(|v| v as u32),
                    flips_suppressed: None,
                },
            },
        });
    }
    Ok((held, last_row))
}
