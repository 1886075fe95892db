//! Cluster mode's tables: the fixed partition count, one lease row per partition, and the
//! registered nodes. Every time is the database's `now()`, so nodes whose clocks disagree
//! still agree on when a lease runs out.
//!
//! A partition's owner and epoch change only under its advisory lock ([`PARTITION_LOCK`])
//! held exclusive, which every commit writing to it holds shared (the fence in
//! `commit.rs`). Release and the commit wait for those locks in partition order, acquire
//! only tries them, so they never deadlock; rows are locked in partition order too.

use super::db::{Bound, Sql};
use std::time::Duration;

use async_trait::async_trait;

use super::super::rows::{self as row, RUNTIME_COLS, RUNTIME_JOIN};
use super::super::{ClusterStore, Error, Lease, NodeRow, Owner, Result, SensorRuntime, SourceLink};
use super::PgStore;
use crate::domain::partition::{self, Partitioning};
use crate::domain::{Millis, SensorId, Source};

#[cfg(test)]
mod follow_tests;
#[cfg(test)]
mod scheme_tests;
#[cfg(test)]
mod tests;

/// A duration as whole milliseconds, which SQL turns into an interval
/// (`$n * interval '1 millisecond'`).
fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// The advisory lock key of partition `u.p` (or `p`) in this schema, as SQL: the schema's
/// hash in the high half, so two latch deployments in one database never share one.
pub(super) const PARTITION_LOCK: &str = "((hashtext(current_schema())::int8 << 32) | u.p::int8)";

fn leases(rows: &[tokio_postgres::Row]) -> Vec<Lease> {
    let mut leases: Vec<Lease> = rows
        .iter()
        .map(|r| Lease {
            partition: r.get::<_, i32>(0) as u32,
            epoch: r.get(1),
        })
        .collect();
    leases.sort_unstable();
    leases
}

/// Fixes the database's partitioning if nobody did yet — `wanted` partitions of the
/// exchange's function, or MD5 ranges when sensors are there already (registered by a
/// version before the scheme was kept: their `hash` is MD5) — creates the leases, and
/// returns what is fixed.
pub(super) async fn fix_partitioning(db: &super::db::Db, wanted: u32) -> Result<Partitioning> {
    let mut c = db.get("partitions").await?;
    let tx = c.transaction().await?;
    // A second node starting at the same moment waits on the key, then finds the row.
    tx.execute(
        "INSERT INTO latch_cluster (id, partitions, scheme) \
         SELECT 1, $1, CASE WHEN EXISTS (SELECT 1 FROM sensors) THEN 'md5' ELSE 'exchange' END \
         ON CONFLICT DO NOTHING",
        &[&(wanted as i32)],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT partitions, scheme FROM latch_cluster WHERE id = 1",
            &[],
        )
        .await?;
    let (count, scheme): (i32, &str) = (row.get(0), row.get(1));
    let scheme = partition::Scheme::parse(scheme).ok_or_else(|| {
        crate::store::Error::Backend(format!("unknown partition scheme {scheme:?}"))
    })?;
    // Both nodes insert in the same order, so neither waits on a row the other waits
    // for.
    tx.execute(
        "INSERT INTO latch_partitions (partition) \
         SELECT generate_series(0, $1::int4 - 1) ORDER BY 1 ON CONFLICT DO NOTHING",
        &[&count],
    )
    .await?;
    tx.commit().await?;
    Ok(Partitioning {
        count: count as u32,
        scheme,
    })
}

#[async_trait]
impl ClusterStore for PgStore {
    async fn partitions(&self, wanted: u32) -> Result<Partitioning> {
        self.fixed(wanted).await
    }

    async fn heartbeat(
        &self,
        node: &str,
        address: &str,
        live_within: Duration,
    ) -> Result<Vec<String>> {
        // What this node can open now (a key file read again), for `latch rotate-key`.
        let key_ids = self.keys.reachable_ids().join(",");
        let mut c = self.db.get("heartbeat").await?;
        let tx = c.transaction().await?;
        tx.execute(
            "INSERT INTO latch_nodes (id, address, heartbeat_at, key_ids) \
             VALUES ($1, $2, now(), $3) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
             heartbeat_at = excluded.heartbeat_at, key_ids = excluded.key_ids",
            &[&node, &address, &key_ids],
        )
        .await?;
        let live = tx
            .query(
                "SELECT id FROM latch_nodes \
                 WHERE heartbeat_at > now() - $1::int8 * interval '1 millisecond' ORDER BY id",
                &[&ms(live_within)],
            )
            .await?;
        tx.commit().await?;
        Ok(live.iter().map(|r| r.get(0)).collect())
    }

    async fn renew(&self, node: &str, lease: Duration) -> Result<Vec<Lease>> {
        // A lease that ran out but that nobody took is still this node's at its epoch
        // (taking it bumps the epoch), so it is extended too.
        let rows = self.db.get("renew").await?
            .query(
                "UPDATE latch_partitions SET expires_at = now() + $2::int8 * interval '1 millisecond' \
                 WHERE partition IN (SELECT partition FROM latch_partitions WHERE owner = $1 \
                 ORDER BY partition FOR UPDATE) \
                 RETURNING partition, epoch",
                &[&node, &ms(lease)],
            )
            .await?;
        Ok(leases(&rows))
    }

    async fn acquire(
        &self,
        node: &str,
        max: u32,
        lease: Duration,
        reclaim_own: bool,
    ) -> Result<Vec<Lease>> {
        // SKIP LOCKED: rows another node is taking are left for a later round, as are
        // partitions a commit is writing (their advisory lock held shared: a dead node's
        // commit stuck in the server ends with its session). The re-check of the condition
        // on the newest row version (READ COMMITTED) keeps a row just taken out.
        let rows = self
            .db
            .get("acquire")
            .await?
            .query(
                &format!(
                    "WITH free AS (SELECT partition FROM latch_partitions \
                     WHERE owner IS NULL OR expires_at < now() OR ($4 AND owner = $1) \
                     ORDER BY partition LIMIT $2 FOR UPDATE SKIP LOCKED), \
                     got AS (SELECT u.p FROM free AS u(p) \
                     WHERE pg_try_advisory_xact_lock({key})) \
                     UPDATE latch_partitions SET owner = $1, epoch = epoch + 1, \
                     expires_at = now() + $3::int8 * interval '1 millisecond' \
                     WHERE partition IN (SELECT p FROM got) \
                     RETURNING partition, epoch",
                    key = PARTITION_LOCK
                ),
                &[&node, &(max as i64), &ms(lease), &reclaim_own],
            )
            .await?;
        Ok(leases(&rows))
    }

    async fn release(&self, node: &str, leases: &[Lease]) -> Result<()> {
        if leases.is_empty() {
            return Ok(());
        }
        let parts: Vec<i32> = leases.iter().map(|l| l.partition as i32).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| l.epoch).collect();
        // The epoch is bumped too, so a commit of this node still in flight with the old
        // one is fenced; one that is writing is waited for (its advisory locks).
        let mut c = self.db.get("release").await?;
        let tx = c.transaction().await?;
        tx.execute(
            &format!(
                "SELECT count(pg_advisory_xact_lock(k.key)) FROM \
                 (SELECT {key} AS key FROM UNNEST($1::int4[]) AS u(p) ORDER BY u.p) k",
                key = PARTITION_LOCK
            ),
            &[&parts],
        )
        .await?;
        tx.execute(
            "UPDATE latch_partitions p SET owner = NULL, epoch = p.epoch + 1, \
             expires_at = '-infinity', released_by = $1, released_at = now() \
             FROM (SELECT q.partition FROM latch_partitions q \
             JOIN UNNEST($2::int4[], $3::int8[]) AS u(partition, epoch) \
             ON q.partition = u.partition AND q.epoch = u.epoch \
             WHERE q.owner = $1 ORDER BY q.partition FOR UPDATE OF q) mine \
             WHERE p.partition = mine.partition",
            &[&node, &parts, &epochs],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn deadline_floors(
        &self,
        node: &str,
        leases: &[Lease],
        since: Millis,
        within: Duration,
    ) -> Result<Vec<(u32, Millis)>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let parts: Vec<i32> = leases.iter().map(|l| l.partition as i32).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| l.epoch).collect();
        let rows = self
            .db
            .get("deadline_floors")
            .await?
            .query(
                "UPDATE latch_partitions p SET deadline_floor = CASE \
                 WHEN p.released_by <> $1 AND p.deadline_floor IS NOT NULL \
                 AND p.released_at >= now() - $5::int8 * interval '1 millisecond' \
                 THEN p.deadline_floor ELSE $4 END, released_by = NULL, released_at = NULL \
                 FROM UNNEST($2::int4[], $3::int8[]) AS u(partition, epoch) \
                 WHERE p.partition = u.partition AND p.epoch = u.epoch AND p.owner = $1 \
                 RETURNING p.partition, p.deadline_floor",
                &[&node, &parts, &epochs, &since, &ms(within)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i32>(0) as u32, r.get(1)))
            .collect())
    }

    async fn forget_outbox_leases(&self, node: &str) -> Result<u64> {
        Ok(self
            .db
            .get("forget_outbox_leases")
            .await?
            .execute(
                // Through the pending list: `notifications` has no index on the lessee.
                "UPDATE notifications n SET claimed_by = NULL, lease_until = NULL \
                 FROM notifications_pending p \
                 WHERE n.seq = p.seq AND n.status = 'pending' AND n.claimed_by = $1",
                &[&node],
            )
            .await?)
    }

    async fn leave(&self, node: &str) -> Result<()> {
        self.db
            .get("leave")
            .await?
            .execute("DELETE FROM latch_nodes WHERE id = $1", &[&node])
            .await?;
        Ok(())
    }

    async fn owners(&self) -> Result<Vec<Owner>> {
        // An owner without a registration cannot be reached, so it is not shown as one.
        let rows = self
            .db
            .get("owners")
            .await?
            .query(
                "SELECT p.partition, p.owner, n.address, p.epoch FROM latch_partitions p \
                 JOIN latch_nodes n ON n.id = p.owner \
                 WHERE p.expires_at > now() ORDER BY p.partition",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Owner {
                partition: r.get::<_, i32>(0) as u32,
                node: r.get(1),
                address: r.get(2),
                epoch: r.get(3),
            })
            .collect())
    }

    async fn set_source_link(
        &self,
        node: &str,
        source: Source,
        up: bool,
        at: Millis,
    ) -> Result<()> {
        self.db
            .get("set_source_link")
            .await?
            .execute(
                "INSERT INTO latch_source_links (source, node, up, at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (source, node) DO UPDATE SET up = excluded.up, at = excluded.at",
                &[&source.as_str(), &node, &up, &at],
            )
            .await?;
        Ok(())
    }

    async fn source_links(&self, live_within: Duration) -> Result<Vec<SourceLink>> {
        // Down while any live node's link is (since the first of them went down), else up
        // since the last reconnect: deadlines count from the latest return. A dead node's
        // record is not read once its heartbeat is older than a lease.
        let rows = self
            .db
            .get("source_links")
            .await?
            .query(
                "SELECT l.source, bool_and(l.up), \
                 CASE WHEN bool_and(l.up) THEN max(l.at) \
                      ELSE min(l.at) FILTER (WHERE NOT l.up) END \
                 FROM latch_source_links l JOIN latch_nodes n ON n.id = l.node \
                 WHERE n.heartbeat_at > now() - $1::int8 * interval '1 millisecond' \
                 GROUP BY l.source",
                &[&ms(live_within)],
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                Some(SourceLink {
                    source: Source::parse(r.get(0))?,
                    up: r.get(1),
                    at: r.get(2),
                })
            })
            .collect())
    }

    async fn nodes(&self, live_within: Duration) -> Result<Vec<NodeRow>> {
        let rows = self
            .db
            .get("nodes")
            .await?
            .query(
                "SELECT n.id, n.address, \
                 (extract(epoch FROM n.heartbeat_at) * 1000)::int8, \
                 (SELECT count(*) FROM latch_partitions p \
                  WHERE p.owner = n.id AND p.expires_at > now()) \
                 FROM latch_nodes n \
                 WHERE n.heartbeat_at > now() - $1::int8 * interval '1 millisecond' \
                 ORDER BY n.id",
                &[&ms(live_within)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| NodeRow {
                id: r.get(0),
                address: r.get(1),
                heartbeat_at: r.get(2),
                partitions: r.get::<_, i64>(3) as u32,
            })
            .collect())
    }

    async fn load_partitions(&self, parts: &[u32], partitions: u32) -> Result<Vec<SensorRuntime>> {
        let mut parts = parts.to_vec();
        parts.sort_unstable();
        parts.dedup();
        let (lo, hi): (Vec<i64>, Vec<i64>) = parts
            .iter()
            .map(|&p| partition::hash_range(p, partitions))
            .unzip();
        // One index range scan of `sensors.hash` per partition.
        let rows = self
            .db
            .get_for("load_partitions", Bound::Bulk)
            .await?
            .query(
                &format!(
                    "SELECT {RUNTIME_COLS} FROM UNNEST($1::int8[], $2::int8[]) AS r(lo, hi) \
                     JOIN sensors s ON s.hash >= r.lo AND s.hash < r.hi {RUNTIME_JOIN}"
                ),
                &[&lo, &hi],
            )
            .await?;
        rows.iter().map(row::runtime).collect()
    }

    async fn shared_secret(&self, candidate: &str) -> Result<String> {
        // One statement: of nodes asking at once, the first to lock the row stores its
        // candidate and the others read it back.
        let row = self
            .db
            .get("shared_secret")
            .await?
            .query_opt(
                "UPDATE latch_cluster SET secret = COALESCE(secret, $1) WHERE id = 1 \
                 RETURNING secret",
                &[&candidate],
            )
            .await?;
        row.map(|r| r.get(0))
            .ok_or(crate::store::Error::NotFound("cluster row"))
    }

    async fn secret_fingerprints(
        &self,
        node: &str,
        fingerprint: &str,
        form: &str,
        live_within: Duration,
    ) -> Result<Vec<(String, String)>> {
        let c = self.db.get("secret_fingerprints").await?;
        // Two statements, each committed on its own: of two nodes starting at once with
        // different secrets, the one that reads last sees the other's fingerprint. A node
        // of an older version records none (or one forgotten here) and is not judged.
        c.execute(
            "UPDATE latch_nodes SET secret_fingerprint = CASE WHEN id = $1 THEN $2 END \
             WHERE id = $1 OR left(secret_fingerprint, length($3)) <> $3",
            &[&node, &fingerprint, &form],
        )
        .await?;
        let rows = c
            .query(
                "SELECT id, secret_fingerprint FROM latch_nodes WHERE id <> $1 \
                 AND secret_fingerprint IS NOT NULL \
                 AND heartbeat_at > now() - $2::int8 * interval '1 millisecond' ORDER BY id",
                &[&node, &ms(live_within)],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn grant_rate(&self, client: &str, tokens: u32, interval_us: i64) -> Result<(i64, i64)> {
        // The schedule's end moves on by the lease, from now at the earliest (slots in the
        // past cannot be used); the lease starts where it was. The row's lock orders nodes
        // asking at once, so their leases never overlap.
        let span = i64::from(tokens).saturating_mul(interval_us);
        let row = self
            .db
            .get("grant_rate")
            .await?
            .query_one(
                "WITH n AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS us) \
                 INSERT INTO latch_rate_schedule AS r (client_id, end_us) \
                 SELECT $1, n.us + $2 FROM n \
                 ON CONFLICT (client_id) DO UPDATE \
                 SET end_us = GREATEST(r.end_us + $2, excluded.end_us) \
                 RETURNING r.end_us - $2, (SELECT us FROM n)",
                &[&client, &span],
            )
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    async fn registry_changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<(SensorId, Option<SensorRuntime>)>)> {
        let c = self.db.get("registry_changes").await?;
        let changes = c
            .query(
                "SELECT seq, sensor_id, deleted FROM sensor_changes WHERE seq > $1 ORDER BY seq",
                &[&after],
            )
            .await?;
        let newest = changes
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .max()
            .unwrap_or(after);
        let deleted: std::collections::BTreeSet<SensorId> = changes
            .iter()
            .filter(|r| r.get::<_, bool>(2))
            .filter_map(|r| SensorId::parse(r.get::<_, &str>(1)).ok())
            .collect();
        let mut ids: Vec<String> = changes.iter().map(|r| r.get(1)).collect();
        ids.sort();
        ids.dedup();
        if ids.is_empty() {
            return Ok((newest, vec![]));
        }
        let now: std::collections::HashMap<SensorId, SensorRuntime> = c
            .query(
                &format!(
                    "SELECT {RUNTIME_COLS} FROM sensors s {RUNTIME_JOIN} WHERE s.id = ANY($1)"
                ),
                &[&ids],
            )
            .await?
            .iter()
            .map(|r| row::runtime(r).map(|rt| (rt.0, rt)))
            .collect::<Result<_>>()?;
        let changed = ids
            .iter()
            .map(|id| {
                let id = SensorId::parse(id)
                    .map_err(|e| Error::Backend(format!("stored sensor id {id:?}: {e}")))?;
                Ok((id, now.get(&id).copied()))
            })
            .collect::<Result<_>>()?;
        Ok((newest, super::super::with_lives_ended(changed, &deleted)))
    }

    async fn newest_registry_change(&self) -> Result<i64> {
        let c = self.db.get("newest_registry_change").await?;
        let row = c
            .query_one("SELECT COALESCE(MAX(seq), 0) FROM sensor_changes", &[])
            .await?;
        Ok(row.get(0))
    }

    async fn prune_registry_changes(&self, before: Millis) -> Result<()> {
        self.db
            .get("prune_registry_changes")
            .await?
            .execute("DELETE FROM sensor_changes WHERE at < $1", &[&before])
            .await?;
        Ok(())
    }
}
