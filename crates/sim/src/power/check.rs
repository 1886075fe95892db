//! The checks of a store opened on a rebuilt folder (see the module's documentation): the
//! commits it holds are a prefix of those made, each whole, and the state, events and
//! notifications are those of that prefix.

use std::collections::HashMap;

use latch::config::Synchronous;
use latch::domain::{Millis, SensorId};
use latch::store::prelude::*;
use latch::store::sqlite::SqliteStore;
use latch::store::{NotificationFilter, PageRequest, TimeRange};

use super::workload::{Commit, Round};
use super::{MARKER, START};

/// What a rebuilt store holds.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    /// The commits it holds: the first this many.
    pub commits: usize,
    /// Acknowledged commits it lacks (a tail, allowed only with `normal`).
    pub lost: usize,
}

/// The checks of a rebuilt store (see the module's documentation).
pub async fn check(
    store: &SqliteStore,
    cut: usize,
    commits: &[Commit],
    rounds: &[Round],
    sync: Synchronous,
) -> Result<Held, String> {
    let begun: Vec<&Round> = rounds.iter().filter(|r| r.began < cut).collect();
    let history_before = begun.iter().map(|r| r.history_before).max();
    let notifications_before = begun.iter().map(|r| r.notifications_before).max();
    let may_be_pruned = |ts: Millis| history_before.is_some_and(|b| ts < b);

    // Every reading kept, by sensor and receive time (unique in the workload).
    let mut held: HashMap<(SensorId, Millis), (bool, bool, usize)> = HashMap::new();
    let mut sensors: Vec<SensorId> = commits
        .iter()
        .flat_map(|c| c.readings.iter().map(|r| r.sensor_id))
        .collect();
    sensors.sort_unstable();
    sensors.dedup();
    for id in &sensors {
        let mut page = PageRequest {
            limit: 1000,
            after: None,
        };
        loop {
            let p = store
                .list_readings(*id, TimeRange::default(), page.clone())
                .await
                .map_err(|e| format!("readings of {id} cannot be read: {e}"))?;
            for r in p.items {
                let e = held
                    .entry((*id, r.row.received_at))
                    .or_insert((r.row.data, r.row.late, 0));
                e.2 += 1;
            }
            match p.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
    }
    // The commits it holds: up to the newest whose marker's event is there (every commit
    // changes the marker's state; events, states and notifications live in `latch.db`,
    // readings may be in `archive.db` already).
    let marker = SensorId::parse(MARKER).expect("an id");
    let mut marked = std::collections::HashSet::new();
    let mut page = PageRequest {
        limit: 1000,
        after: None,
    };
    loop {
        let p = store
            .list_events(marker, TimeRange::default(), page.clone())
            .await
            .map_err(|e| format!("the marker's events cannot be read: {e}"))?;
        marked.extend(p.items.iter().map(|e| e.row.at));
        match p.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    let prefix = commits.iter().rposition(|c| marked.contains(&c.at));
    let held_commits = prefix.map_or(0, |p| p + 1);
    let acked = commits
        .iter()
        .rposition(|c| c.acked.is_some_and(|a| a <= cut))
        .map_or(0, |p| p + 1);
    if sync == Synchronous::Full && held_commits < acked {
        let lost = &commits[held_commits];
        return Err(format!(
            "{} acknowledged commits lost (the first, at {}, held {} readings)",
            acked - held_commits,
            lost.at - START,
            lost.readings.len()
        ));
    }
    let mut accounted = 0;
    for (n, c) in commits.iter().enumerate() {
        for r in &c.readings {
            let there = held.get(&(r.sensor_id, r.received_at));
            if n < held_commits {
                match there {
                    Some((_, _, count)) if *count > 1 => {
                        return Err(format!(
                            "reading {} at {} listed {count} times",
                            r.sensor_id,
                            r.ts - START
                        ));
                    }
                    Some((data, late, _)) if (*data, *late) != (r.data, r.late) => {
                        return Err(format!(
                            "reading {} at {} holds data {data} late {late}, not {} {}",
                            r.sensor_id,
                            r.ts - START,
                            r.data,
                            r.late
                        ));
                    }
                    Some(_) => accounted += 1,
                    None if may_be_pruned(r.ts) => {}
                    None => {
                        return Err(format!(
                            "reading {} at {} of commit {n} is missing, though the store holds commits up to {}{}",
                            r.sensor_id,
                            r.ts - START,
                            held_commits.saturating_sub(1),
                            if c.acked.is_some_and(|a| a <= cut) {
                                " (it was acknowledged)"
                            } else {
                                ""
                            }
                        ));
                    }
                }
            } else if there.is_some() && sync == Synchronous::Full {
                // With `normal`, the archive may have moved the readings of a commit that
                // `latch.db` then lost: they stay listed (book: settings reference).
                return Err(format!(
                    "reading {} at {} of commit {n} is there, though commit {} after it is not: not a prefix",
                    r.sensor_id,
                    r.ts - START,
                    held_commits
                ));
            }
        }
    }
    if sync == Synchronous::Normal {
        accounted += commits[held_commits..]
            .iter()
            .flat_map(|c| &c.readings)
            .filter(|r| held.contains_key(&(r.sensor_id, r.received_at)))
            .count();
    }
    if accounted != held.len() {
        return Err(format!(
            "{} readings the workload never committed are listed",
            held.len() - accounted
        ));
    }
    // States: as the held commits left them.
    let expected = match held_commits {
        0 => None,
        n => Some(commits[n - 1].states.clone()),
    };
    for (id, state) in store
        .load_runtime()
        .await
        .map_err(|e| format!("the state cannot be read: {e}"))?
    {
        let want = expected
            .as_ref()
            .and_then(|s| s.get(&id).copied())
            .unwrap_or((None, None));
        if (state.data, state.last_ts) != want {
            return Err(format!(
                "sensor {id} holds data {:?} last_ts {:?}, but its readings give {:?}",
                state.data,
                state.last_ts.map(|t| t - START),
                (want.0, want.1.map(|t| t - START))
            ));
        }
    }
    // Events and notifications: those of the held commits, none of the others.
    let mut events = std::collections::HashSet::new();
    let (mut ids, mut last) = (
        std::collections::HashSet::new(),
        std::collections::HashMap::new(),
    );
    for id in &sensors {
        let mut page = PageRequest {
            limit: 1000,
            after: None,
        };
        loop {
            let p = store
                .list_events(*id, TimeRange::default(), page.clone())
                .await
                .map_err(|e| format!("events cannot be read: {e}"))?;
            // Once each, by id and by time, in (time, id) order: a move of the events'
            // journal copies (keeping ids) and deletes in one transaction, so no cut
            // leaves an event in both tables.
            for e in &p.items {
                let key = (e.row.at, e.id);
                if last.get(id).is_some_and(|l| *l >= key) {
                    return Err(format!("the events of {id} are out of order at {key:?}"));
                }
                last.insert(*id, key);
                if !ids.insert(e.id) || !events.insert((*id, e.row.at)) {
                    return Err(format!("the event of {id} at {} is listed twice", e.row.at));
                }
            }
            match p.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
    }
    let mut notifications = std::collections::HashSet::new();
    let mut page = PageRequest {
        limit: 1000,
        after: None,
    };
    loop {
        let p = store
            .list_notifications(NotificationFilter::default(), page.clone())
            .await
            .map_err(|e| format!("notifications cannot be read: {e}"))?;
        notifications.extend(p.items.into_iter().map(|n| n.id));
        match p.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    for (n, c) in commits.iter().enumerate() {
        let held = n < held_commits;
        for id in &c.events {
            let there = events.contains(&(*id, c.at));
            if held && !there && !may_be_pruned(c.at) {
                return Err(format!("the event of {id} of commit {n} is missing"));
            }
            if !held && there {
                return Err(format!(
                    "the event of {id} of commit {n} is there, though its commit is not"
                ));
            }
        }
        let prunable = notifications_before.is_some_and(|b| c.at < b);
        for id in &c.notifications {
            let there = notifications.contains(id);
            if held && !there && !prunable {
                return Err(format!("notification {id} of commit {n} is missing"));
            }
            if !held && there {
                return Err(format!(
                    "notification {id} of commit {n} is there, though its commit is not"
                ));
            }
        }
    }
    Ok(Held {
        commits: held_commits,
        lost: acked.saturating_sub(held_commits),
    })
}
