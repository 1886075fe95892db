//! `Idempotency-Key`: what a store keeps of a keyed request — a fingerprint of it, who holds
//! the key now, its answer once given — and which of its readings the group commits
//! applied ([`super::Keyed`], written in the same transaction as those readings).

use async_trait::async_trait;

use super::Result;
use crate::domain::Millis;

/// How long a key and its answer are kept: a repeat later than this is a new request.
pub const KEY_TTL_MS: Millis = 24 * 60 * 60 * 1000;

/// A holder that took its key this long ago without answering is taken to have stopped
/// (its process died) and a repeat takes the key over; before that a repeat is
/// [`Taken::Busy`]. Longer than a request takes to commit.
pub const HOLD_MS: Millis = 60_000;

/// A key as [`Idempotency::take_key`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The key is this request's now: new, or released by an earlier one that could not
    /// answer (or held by one that stopped answering). `applied` lists the positions of the
    /// request's readings that commits under the key applied already, ascending.
    Fresh { applied: Vec<u32> },
    /// The first request with this key was answered: this is its answer.
    Answered { status: u16, body: String },
    /// Another request with this key is still running.
    Busy,
    /// The key was used for another request (method, path or body).
    Mismatch,
}

/// Idempotency keys and their answers.
#[async_trait]
pub trait Idempotency: Send + Sync {
    /// Takes `key` for the request whose fingerprint is `fingerprint`, at `now`. A holder
    /// that took it before `stale_before` and never answered is taken to have stopped.
    async fn take_key(
        &self,
        key: String,
        fingerprint: String,
        now: Millis,
        stale_before: Millis,
    ) -> Result<Taken>;
    /// Keeps the request's answer for its repeats; `None` releases the key unanswered (the
    /// request did not finish: a repeat completes it).
    async fn answer_key(&self, key: String, answer: Option<(u16, String)>) -> Result<()>;
    /// Forgets keys, and what commits applied under them, taken before `before`.
    async fn forget_keys(&self, before: Millis) -> Result<u64>;
}

/// Takes `key` at `now`, a holder quiet for [`HOLD_MS`] taken to have stopped: what every
/// caller of [`Idempotency::take_key`] asks.
pub async fn take(
    keys: &dyn Idempotency,
    key: &str,
    fingerprint: String,
    now: Millis,
) -> Result<Taken> {
    keys.take_key(key.to_string(), fingerprint, now, now - HOLD_MS)
        .await
}

/// [`Idempotency::answer_key`], a failure only logged: it costs little, as a repeat takes
/// the key over once the hold passed (and for readings the commits' own record still
/// applies nothing twice).
pub async fn settle(keys: &dyn Idempotency, key: &str, answer: Option<(u16, String)>) {
    if let Err(e) = keys.answer_key(key.to_string(), answer).await {
        tracing::warn!(error = %e, "Could not keep the answer of a request with an Idempotency-Key.");
    }
}

/// A key's row as a backend reads it, locked, once it made sure one exists (inserted
/// released, `taken_at` 0, when the key was new).
#[derive(Debug, Clone)]
pub struct KeyRow {
    pub fingerprint: String,
    pub taken_at: Millis,
    pub answer: Option<(u16, String)>,
}

/// The rule of [`Idempotency::take_key`], for every backend: `None` when the request takes
/// the key (the backend then sets `taken_at` and reads what was applied under it).
pub fn take_step(row: &KeyRow, fingerprint: &str, stale_before: Millis) -> Option<Taken> {
    if row.fingerprint != fingerprint {
        return Some(Taken::Mismatch);
    }
    if let Some((status, body)) = &row.answer {
        return Some(Taken::Answered {
            status: *status,
            body: body.clone(),
        });
    }
    (row.taken_at != 0 && row.taken_at >= stale_before).then_some(Taken::Busy)
}

/// The positions a commit applied, as a backend keeps them (`1,4,5`).
pub fn positions_text(positions: &[u32]) -> String {
    let mut s = String::with_capacity(positions.len() * 4);
    for (i, p) in positions.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&p.to_string());
    }
    s
}

/// Every position the kept texts name, ascending, once each. A text that is not a list of
/// positions is a broken row: the error says so rather than skipping it.
pub fn applied_positions<'a>(
    texts: impl IntoIterator<Item = &'a str>,
) -> std::result::Result<Vec<u32>, String> {
    let mut all = Vec::new();
    for t in texts {
        for p in t.split(',').filter(|p| !p.is_empty()) {
            all.push(
                p.parse::<u32>()
                    .map_err(|_| format!("idempotency_applied holds {t:?}, not positions"))?,
            );
        }
    }
    all.sort_unstable();
    all.dedup();
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fp: &str, taken_at: Millis, answer: Option<(u16, &str)>) -> KeyRow {
        KeyRow {
            fingerprint: fp.into(),
            taken_at,
            answer: answer.map(|(s, b)| (s, b.to_string())),
        }
    }

    #[test]
    fn a_key_is_taken_when_released_or_its_holder_went_quiet() {
        assert_eq!(take_step(&row("a", 0, None), "a", 100), None);
        assert_eq!(take_step(&row("a", 99, None), "a", 100), None);
        assert_eq!(take_step(&row("a", 100, None), "a", 100), Some(Taken::Busy));
    }

    #[test]
    fn an_answered_key_gives_its_answer_and_another_request_is_refused() {
        assert_eq!(
            take_step(&row("a", 0, Some((202, "{}"))), "a", 100),
            Some(Taken::Answered {
                status: 202,
                body: "{}".into()
            })
        );
        assert_eq!(
            take_step(&row("a", 0, Some((202, "{}"))), "b", 100),
            Some(Taken::Mismatch)
        );
        assert_eq!(
            take_step(&row("a", 0, None), "b", 100),
            Some(Taken::Mismatch)
        );
    }

    #[test]
    fn positions_round_trip_and_merge() {
        assert_eq!(positions_text(&[1, 4, 5]), "1,4,5");
        assert_eq!(
            applied_positions(["4,5", "1,4", ""]).unwrap(),
            vec![1, 4, 5]
        );
        assert!(applied_positions(["x"]).is_err());
    }
}
