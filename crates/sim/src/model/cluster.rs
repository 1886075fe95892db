//! Cluster mode's tables, `store/postgres/cluster.rs`: the partitioning fixed at first use,
//! one lease row per partition, the registered nodes, broker links and the shared rate
//! schedules. Every time is the database's (the model's clock), so every node agrees on
//! when a lease runs out. A partition's owner and epoch change only in `acquire` and
//! `release`, each a whole call here, which no commit's fence check can interleave with
//! (PostgreSQL's advisory locks give the same).
//!
//! A store of one node ([`super::Mode::Single`], SQLite) has no cluster side: every call
//! fails, as `store::connect_cluster` gives SQLite none.

use std::time::Duration;

use async_trait::async_trait;

use latch::domain::partition::{self, Partitioning};
use latch::domain::{Millis, SensorId, Source, Status};
use latch::store::{ClusterStore, Error, Lease, NodeRow, Owner, Result, SensorRuntime, SourceLink};

use super::node::NodeStore;
use super::tables::{Cx, NodeEntry, Tables};

/// A duration as whole milliseconds.
fn ms(d: Duration) -> Millis {
    d.as_millis().min(i64::MAX as u128) as Millis
}

impl Tables {
    fn cluster_only(&self) -> Result<()> {
        if self.shared {
            Ok(())
        } else {
            Err(Error::Backend(
                "cluster mode needs a shared store (PostgreSQL)".into(),
            ))
        }
    }

    fn live(
        &self,
        now: Millis,
        live_within: Duration,
    ) -> impl Iterator<Item = (&String, &NodeEntry)> {
        let since = now - ms(live_within);
        self.cluster
            .nodes
            .iter()
            .filter(move |(_, n)| n.heartbeat_at > since)
    }

    fn heartbeat(&mut self, cx: &Cx, node: &str, address: &str, live: Duration) -> Vec<String> {
        let entry = self
            .cluster
            .nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeEntry {
                address: String::new(),
                heartbeat_at: cx.now,
                secret_fingerprint: None,
            });
        entry.address = address.to_string();
        entry.heartbeat_at = cx.now;
        self.live(cx.now, live).map(|(id, _)| id.clone()).collect()
    }

    /// Extends every lease `node` holds, run out or not (nobody took it: still its own at
    /// its epoch).
    fn renew(&mut self, cx: &Cx, node: &str, lease: Duration) -> Vec<Lease> {
        let until = cx.now.saturating_add(ms(lease));
        let mut out = Vec::new();
        for p in &mut self.cluster.partitions {
            if p.owner.as_deref() == Some(node) {
                p.expires_at = until;
                out.push(Lease {
                    partition: p.partition,
                    epoch: p.epoch,
                });
            }
        }
        out
    }

    /// Up to `max` partitions free or run out (or still `node`'s, with `reclaim_own`),
    /// lowest first, each under a new epoch.
    fn acquire(&mut self, cx: &Cx, node: &str, max: u32, lease: Duration, own: bool) -> Vec<Lease> {
        let until = cx.now.saturating_add(ms(lease));
        let mut out = Vec::new();
        for p in &mut self.cluster.partitions {
            if out.len() >= max as usize {
                break;
            }
            let free = p.owner.is_none()
                || p.expires_at < cx.now
                || (own && p.owner.as_deref() == Some(node));
            if free {
                p.owner = Some(node.to_string());
                p.epoch += 1;
                p.expires_at = until;
                out.push(Lease {
                    partition: p.partition,
                    epoch: p.epoch,
                });
            }
        }
        out
    }

    /// Gives up the leases `node` still holds at those epochs: owner cleared, epoch
    /// bumped (a commit in flight with the old one is fenced), who and when kept.
    fn release(&mut self, cx: &Cx, node: &str, leases: &[Lease]) {
        for l in leases {
            let Some(p) = self.cluster.partitions.get_mut(l.partition as usize) else {
                continue;
            };
            if p.epoch == l.epoch && p.owner.as_deref() == Some(node) {
                p.owner = None;
                p.epoch += 1;
                p.expires_at = Millis::MIN;
                p.released_by = Some(node.to_string());
                p.released_at = Some(cx.now);
            }
        }
    }

    /// The floor of each partition `node` just acquired: the previous owner's when
    /// another node released it at most `within` ago and kept one, else `since`.
    fn deadline_floors(
        &mut self,
        cx: &Cx,
        node: &str,
        leases: &[Lease],
        since: Millis,
        within: Duration,
    ) -> Vec<(u32, Millis)> {
        let recent = cx.now - ms(within);
        let mut leases = leases.to_vec();
        leases.sort_unstable();
        leases.dedup();
        let mut out = Vec::new();
        for l in leases {
            let Some(p) = self.cluster.partitions.get_mut(l.partition as usize) else {
                continue;
            };
            if p.epoch != l.epoch || p.owner.as_deref() != Some(node) {
                continue;
            }
            let handed_over = p.released_by.as_deref().is_some_and(|by| by != node)
                && p.deadline_floor.is_some()
                && p.released_at.is_some_and(|at| at >= recent);
            let floor = match p.deadline_floor {
                Some(f) if handed_over => f,
                _ => since,
            };
            p.deadline_floor = Some(floor);
            p.released_by = None;
            p.released_at = None;
            out.push((p.partition, floor));
        }
        out
    }

    /// Partitions whose lease has not run out, with a registered owner.
    fn owners(&self, now: Millis) -> Vec<Owner> {
        self.cluster
            .partitions
            .iter()
            .filter(|p| p.expires_at > now)
            .filter_map(|p| {
                let node = p.owner.clone()?;
                let address = self.cluster.nodes.get(&node)?.address.clone();
                Some(Owner {
                    partition: p.partition,
                    node,
                    address,
                    epoch: p.epoch,
                })
            })
            .collect()
    }

    fn live_nodes(&self, now: Millis, live_within: Duration) -> Vec<NodeRow> {
        self.live(now, live_within)
            .map(|(id, n)| NodeRow {
                id: id.clone(),
                address: n.address.clone(),
                heartbeat_at: n.heartbeat_at,
                partitions: self
                    .cluster
                    .partitions
                    .iter()
                    .filter(|p| p.owner.as_ref() == Some(id) && p.expires_at > now)
                    .count() as u32,
            })
            .collect()
    }

    /// The sensors whose stored hash falls in one of `parts` of `partitions` ranges (the
    /// hash is written by the fixed partitioning: `Partitioning::hash`).
    fn load_partitions(&self, parts: &[u32], partitions: u32) -> Vec<SensorRuntime> {
        let Some(fixed) = self.cluster.fixed else {
            return Vec::new();
        };
        self.sensors
            .keys()
            .filter(|&&id| parts.contains(&partition::of_hash(fixed.hash(id), partitions)))
            .filter_map(|&id| self.runtime(id))
            .collect()
    }

    fn secret_fingerprints(
        &mut self,
        cx: &Cx,
        node: &str,
        fingerprint: &str,
        form: &str,
        live: Duration,
    ) -> Vec<(String, String)> {
        for n in self.cluster.nodes.values_mut() {
            if n.secret_fingerprint
                .as_deref()
                .is_some_and(|f| !f.starts_with(form))
            {
                n.secret_fingerprint = None;
            }
        }
        if let Some(n) = self.cluster.nodes.get_mut(node) {
            n.secret_fingerprint = Some(fingerprint.to_string());
        }
        self.live(cx.now, live)
            .filter(|(id, _)| id.as_str() != node)
            .filter_map(|(id, n)| Some((id.clone(), n.secret_fingerprint.clone()?)))
            .collect()
    }

    /// Leases the next `tokens` slots of the client's one schedule: where the schedule
    /// ends, from now at the earliest, in µs of the database's clock.
    fn grant_rate(&mut self, cx: &Cx, client: &str, tokens: u32, interval_us: i64) -> (i64, i64) {
        let us = cx.now.saturating_mul(1_000);
        let span = i64::from(tokens).saturating_mul(interval_us);
        let end = self
            .cluster
            .rates
            .entry(client.to_string())
            .and_modify(|end| *end = end.saturating_add(span).max(us.saturating_add(span)))
            .or_insert_with(|| us.saturating_add(span));
        (end.saturating_sub(span), us)
    }

    /// Per source, over the live nodes' records: down while any is down (since the first
    /// of them went down), else up since the latest reconnect.
    fn source_links(&self, now: Millis, live_within: Duration) -> Vec<SourceLink> {
        let live: Vec<&String> = self.live(now, live_within).map(|(id, _)| id).collect();
        Source::ALL
            .iter()
            .filter_map(|&source| {
                let records: Vec<(bool, Millis)> = self
                    .cluster
                    .links
                    .iter()
                    .filter(|((s, node), _)| *s == source.index() && live.contains(&node))
                    .map(|(_, &r)| r)
                    .collect();
                if records.is_empty() {
                    return None;
                }
                let up = records.iter().all(|(up, _)| *up);
                let at = if up {
                    records.iter().map(|(_, at)| *at).max()
                } else {
                    records
                        .iter()
                        .filter(|(up, _)| !up)
                        .map(|(_, at)| *at)
                        .min()
                };
                Some(SourceLink {
                    source,
                    up,
                    at: at.unwrap_or_default(),
                })
            })
            .collect()
    }
}

#[async_trait]
impl ClusterStore for NodeStore {
    async fn partitions(&self, wanted: u32) -> Result<Partitioning> {
        self.run("partitions", true, |t, _| {
            t.cluster_only()?;
            Ok(t.fix_partitioning(wanted))
        })
        .await
    }

    async fn heartbeat(&self, node: &str, address: &str, live: Duration) -> Result<Vec<String>> {
        self.run("heartbeat", true, |t, cx| {
            t.cluster_only()?;
            Ok(t.heartbeat(cx, node, address, live))
        })
        .await
    }

    async fn renew(&self, node: &str, lease: Duration) -> Result<Vec<Lease>> {
        self.run("renew", true, |t, cx| {
            t.cluster_only()?;
            Ok(t.renew(cx, node, lease))
        })
        .await
    }

    async fn acquire(
        &self,
        node: &str,
        max: u32,
        lease: Duration,
        reclaim_own: bool,
    ) -> Result<Vec<Lease>> {
        self.run("acquire", true, |t, cx| {
            t.cluster_only()?;
            Ok(t.acquire(cx, node, max, lease, reclaim_own))
        })
        .await
    }

    async fn release(&self, node: &str, leases: &[Lease]) -> Result<()> {
        self.run("release", true, |t, cx| {
            t.cluster_only()?;
            t.release(cx, node, leases);
            Ok(())
        })
        .await
    }

    async fn deadline_floors(
        &self,
        node: &str,
        leases: &[Lease],
        since: Millis,
        within: Duration,
    ) -> Result<Vec<(u32, Millis)>> {
        self.run("deadline_floors", true, |t, cx| {
            t.cluster_only()?;
            Ok(t.deadline_floors(cx, node, leases, since, within))
        })
        .await
    }

    async fn forget_outbox_leases(&self, node: &str) -> Result<u64> {
        self.run("forget_outbox_leases", true, |t, _| {
            t.cluster_only()?;
            let mut n = 0;
            for r in t.notifications.values_mut() {
                if r.notification.status == Status::Pending && r.claimed_by.as_deref() == Some(node)
                {
                    r.claimed_by = None;
                    r.lease_until = None;
                    n += 1;
                }
            }
            Ok(n)
        })
        .await
    }

    async fn leave(&self, node: &str) -> Result<()> {
        self.run("leave", true, |t, _| {
            t.cluster_only()?;
            t.cluster.nodes.remove(node);
            Ok(())
        })
        .await
    }

    async fn owners(&self) -> Result<Vec<Owner>> {
        self.run("owners", false, |t, cx| {
            t.cluster_only()?;
            Ok(t.owners(cx.now))
        })
        .await
    }

    async fn nodes(&self, live_within: Duration) -> Result<Vec<NodeRow>> {
        self.run("nodes", false, |t, cx| {
            t.cluster_only()?;
            Ok(t.live_nodes(cx.now, live_within))
        })
        .await
    }

    async fn load_partitions(&self, parts: &[u32], partitions: u32) -> Result<Vec<SensorRuntime>> {
        self.run("load_partitions", false, |t, _| {
            t.cluster_only()?;
            Ok(t.load_partitions(parts, partitions))
        })
        .await
    }

    async fn shared_secret(&self, candidate: &str) -> Result<String> {
        self.run("shared_secret", true, |t, _| {
            t.cluster_only()?;
            if t.cluster.fixed.is_none() {
                return Err(Error::NotFound("cluster row"));
            }
            Ok(t.cluster
                .secret
                .get_or_insert_with(|| candidate.to_string())
                .clone())
        })
        .await
    }

    async fn secret_fingerprints(
        &self,
        node: &str,
        fingerprint: &str,
        form: &str,
        live_within: Duration,
    ) -> Result<Vec<(String, String)>> {
        self.run("secret_fingerprints", true, |t, cx| {
            t.cluster_only()?;
            Ok(t.secret_fingerprints(cx, node, fingerprint, form, live_within))
        })
        .await
    }

    async fn grant_rate(&self, client: &str, tokens: u32, interval_us: i64) -> Result<(i64, i64)> {
        self.run("grant_rate", true, |t, cx| {
            t.cluster_only()?;
            Ok(t.grant_rate(cx, client, tokens, interval_us))
        })
        .await
    }

    async fn set_source_link(
        &self,
        node: &str,
        source: Source,
        up: bool,
        at: Millis,
    ) -> Result<()> {
        self.run("set_source_link", true, |t, _| {
            t.cluster_only()?;
            t.cluster
                .links
                .insert((source.index(), node.to_string()), (up, at));
            Ok(())
        })
        .await
    }

    async fn source_links(&self, live_within: Duration) -> Result<Vec<SourceLink>> {
        self.run("source_links", false, |t, cx| {
            t.cluster_only()?;
            Ok(t.source_links(cx.now, live_within))
        })
        .await
    }

    async fn registry_changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<(SensorId, Option<SensorRuntime>)>)> {
        self.run("registry_changes", false, |t, _| {
            Ok(t.registry_changes(after))
        })
        .await
    }

    async fn newest_registry_change(&self) -> Result<i64> {
        self.run("newest_registry_change", false, |t, _| {
            Ok(t.changes.keys().next_back().copied().unwrap_or(0))
        })
        .await
    }

    async fn prune_registry_changes(&self, before: Millis) -> Result<()> {
        self.run("prune_registry_changes", true, |t, _| {
            t.changes.retain(|_, (_, at, _)| *at >= before);
            Ok(())
        })
        .await
    }
}
