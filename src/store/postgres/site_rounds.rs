//! Sites' decisions on PostgreSQL, by [`rules::sites`] over `rules::sites::SiteTables`: the group
//! commit holds back liveness events of a site's sensors ([`hold_for_sites`], under the
//! site's row lock, so a round deciding the site meanwhile is waited for), and a round
//! decides each due site once across the cluster ([`decide_sites`]: `FOR UPDATE SKIP
//! LOCKED`, a node that takes a site decides it; one killed mid-round leaves it to the next
//! round of any node).

use std::collections::{HashMap, HashSet};

use super::super::{Decided, NotificationRef, Result};
use super::db::{Sql, Tx};
use super::site_rows::{SITE_ROW, insert_one, linked, members, site_row, state_of, stored_sensor};
use super::tables::Tables;
use crate::domain::silence::Match;
use crate::domain::site::Site;
use crate::domain::site::decide::{HeldEvent, Linked, Member, Rules, SiteState};
use crate::domain::{Detail, Event, EventKind, Millis, SensorId};
use crate::store::rules::{self, sites::SiteOf};

/// Which of `events` (their places) make no notification now ([`rules::sites`]).
pub(super) async fn hold_for_sites(
    tx: &Tx<'_>,
    events: &[&Event],
    now: Millis,
) -> Result<HashSet<usize>> {
    rules::sites::hold_for_sites(&mut Tables { tx }, events, now).await
}

impl rules::sites::SiteTables for Tables<'_> {
    /// Each site's row locked, in id order: a round deciding it is waited for. (A sensor
    /// moving between sites waits for this commit and holds back the next: both take the
    /// delete lock, `super::DELETE_LOCK`.)
    async fn sites_of(&mut self, sensors: &[SensorId]) -> Result<HashMap<SensorId, SiteOf>> {
        let ids: Vec<String> = sensors.iter().map(|s| s.to_string()).collect();
        let locked = self
            .tx
            .query(
                "SELECT si.id FROM sites si WHERE si.id IN \
                 (SELECT s.site_id FROM sensors s WHERE s.id = ANY($1)) ORDER BY si.id FOR UPDATE",
                &[&ids],
            )
            .await?;
        if locked.is_empty() {
            return Ok(HashMap::new());
        }
        // Read after the lock, in a statement of its own: its snapshot sees what the
        // decision it waited for wrote. The statement that locks re-reads the locked row
        // only, and its `site_held` would still hold the rows that decision consumed
        // (issue #68: a return held on a site up, and never decided).
        let rows = self
            .tx
            .query(
                "SELECT s.id, si.id, si.down, si.since, si.pending_since, si.told, \
                 si.told_clients, si.released, si.retold, EXISTS (SELECT 1 FROM site_held h \
                   WHERE h.site_id = si.id AND h.sensor_id = s.id) \
                 FROM sensors s JOIN sites si ON si.id = s.site_id WHERE s.id = ANY($1)",
                &[&ids],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    stored_sensor(r.get(0))?,
                    SiteOf {
                        site: r.get(1),
                        state: state_of(r, 2),
                        held: r.get(9),
                    },
                ))
            })
            .collect()
    }

    /// One statement each, whatever the number of events: an outage of a whole fleet is
    /// one group commit of its losses, and a round trip per loss would outlast
    /// `database_timeout` (10,000 sensors' losses took over 5 s in a debug build).
    async fn hold(&mut self, held: &[(&str, &Event)], asked: &[&str], now: Millis) -> Result<()> {
        let mut cols = HeldCols::default();
        for (site, e) in held {
            cols.push(site, e);
        }
        let tx = self.tx;
        futures::try_join!(cols.insert(tx), async {
            if asked.is_empty() {
                return Ok(0);
            }
            tx.execute(
                "UPDATE sites SET pending_since = $2 WHERE id = ANY($1) AND pending_since IS NULL",
                &[&asked, &now],
            )
            .await
        })?;
        Ok(())
    }

    /// Its row locked: a round deciding it waits.
    async fn site(&mut self, id: &str) -> Result<Option<(Site, SiteState)>> {
        Ok(self
            .tx
            .query_opt(
                &format!("SELECT {SITE_ROW} FROM sites WHERE id = $1 FOR UPDATE"),
                &[&id],
            )
            .await?
            .map(|r| site_row(&r)))
    }

    async fn members(&mut self, site: &str) -> Result<Vec<Member>> {
        members(self.tx, site).await
    }

    async fn held_events(&mut self, site: &str) -> Result<(Vec<HeldEvent>, Option<i64>)> {
        held_rows(self.tx, site, None).await
    }

    async fn linked(&mut self, site: &str) -> Result<Vec<Linked>> {
        linked(self.tx, site).await
    }

    async fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        body: Option<&str>,
        now: Millis,
    ) -> Result<NotificationRef> {
        insert_one(self.tx, client, e, body, now).await
    }

    async fn consume_held(&mut self, site: &str, last: i64) -> Result<()> {
        self.tx
            .execute(
                "DELETE FROM site_held WHERE site_id = $1 AND id <= $2",
                &[&site, &last],
            )
            .await?;
        Ok(())
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        rules::silences::apply(self, seqs, now).await
    }

    async fn write_state(&mut self, site: &str, state: &SiteState) -> Result<()> {
        self.tx
            .execute(
                "UPDATE sites SET down = $2, since = $3, pending_since = $4, told = $5, \
                 told_clients = $6, released = $7, retold = $8 WHERE id = $1",
                &[
                    &site,
                    &state.down,
                    &state.since,
                    &state.pending_since,
                    &Match::listed(&state.told),
                    &Match::listed(&state.told_clients),
                    &state.released,
                    &super::super::rows::retold_listed(&state.retold),
                ],
            )
            .await?;
        Ok(())
    }
}

/// The events a commit holds, in order, as the columns of one `UNNEST`.
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
    let due = due.iter().map(site_row).collect();
    let decided = rules::sites::decide_due(&mut Tables { tx }, due, rules, now).await?;
    Ok((decided, last))
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
                    ..Detail::default()
                },
            },
        });
    }
    Ok((held, last_row))
}
