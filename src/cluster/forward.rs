//! Readings handed to the node that serves their partition, over HTTP.
//!
//! One queue and one request in flight per destination: whatever queued while a request
//! was out goes in the next one, in order (a group forward, as the committer groups
//! commits). So batches a source enqueued one after another reach the owner, and are
//! applied there, in that order, and a flood costs few requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::domain::{Reading, Rejection, Source};
use crate::engine::{self, Forwarder, Sequence, Verdicts, VerdictsRx};
use crate::store::Keyed;
use crate::telemetry::events::{self, Emit};

/// Path of the owner's endpoint for forwarded readings.
pub const READINGS_PATH: &str = "/internal/v1/readings";
/// Header carrying `cluster_secret` on node-to-node requests.
pub const SECRET_HEADER: &str = "x-latch-cluster-secret";
/// Most readings in one forwarded request.
const MAX_READINGS: usize = 20_000;

/// Body of a forward: batches in the order they were enqueued.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardRequest {
    pub batches: Vec<ForwardBatch>,
}

/// One enqueued batch. No receive time travels with it: the owner stamps the readings with
/// its own clock when they arrive, so a request cannot set a sensor's `last_seen_at`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardBatch {
    /// The sender's [`Sequence`] the batch belongs to (a broker session's), by its id: the
    /// owner applies none of a sequence's batches behind one that did not commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// How they came in (a node of an older version sends none: HTTP).
    #[serde(default = "http")]
    pub source: Source,
    pub readings: Vec<Reading>,
    /// Of a request sent with an `Idempotency-Key`: the key, and each reading's position
    /// in that request, for the owner's commits to keep ([`crate::store::Keyed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyed: Option<KeyedOut>,
}

/// [`crate::store::Keyed`] on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeyedOut {
    pub key: String,
    pub positions: Vec<u32>,
}

fn http() -> Source {
    Source::Http
}

/// Per batch, per reading: `null` accepted, else why not.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardResponse {
    pub verdicts: Vec<Vec<Option<Rejection>>>,
}

struct Job {
    readings: Vec<Reading>,
    sequence: Option<Sequence>,
    source: Source,
    keyed: Option<Keyed>,
    reply: oneshot::Sender<Result<Verdicts, engine::Error>>,
}

/// The [`Forwarder`] of a cluster node.
pub struct HttpForwarder {
    http: reqwest::Client,
    secret: Arc<str>,
    timeout: Duration,
    queues: Mutex<HashMap<Arc<str>, mpsc::UnboundedSender<Job>>>,
}

impl HttpForwarder {
    pub fn new(secret: &str, timeout: Duration) -> Self {
        Self {
            http: reqwest::Client::builder()
                .no_proxy()
                .tcp_nodelay(true)
                .build()
                .expect("a plain HTTP client builds"),
            secret: Arc::from(secret),
            timeout,
            queues: Mutex::new(HashMap::new()),
        }
    }

    fn queue(&self, to: &Arc<str>) -> mpsc::UnboundedSender<Job> {
        let mut queues = self.queues.lock().expect("forward queues");
        if let Some(q) = queues.get(to).filter(|q| !q.is_closed()) {
            return q.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_loop(
            self.http.clone(),
            format!("{to}{READINGS_PATH}"),
            self.secret.clone(),
            self.timeout,
            rx,
        ));
        queues.insert(to.clone(), tx.clone());
        tx
    }
}

impl Forwarder for HttpForwarder {
    fn forward(
        &self,
        to: Arc<str>,
        readings: Vec<Reading>,
        sequence: Option<Sequence>,
        source: Source,
        keyed: Option<Keyed>,
    ) -> VerdictsRx {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            readings,
            sequence,
            source,
            keyed,
            reply,
        };
        if let Err(mpsc::error::SendError(job)) = self.queue(&to).send(job) {
            let _ = job.reply.send(Err(engine::Error::Closed));
        }
        rx
    }
}

/// Sends what queued for one destination, one request at a time, until every sender is
/// gone.
async fn send_loop(
    http: reqwest::Client,
    url: String,
    secret: Arc<str>,
    timeout: Duration,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    while let Some(first) = rx.recv().await {
        let mut jobs = Vec::new();
        let mut count = 0;
        let mut next = Some(first);
        while let Some(j) = next.take() {
            // A sequence cut by an earlier answer (or elsewhere): none of it goes.
            if j.sequence.as_ref().is_some_and(Sequence::is_cut) {
                let _ = j
                    .reply
                    .send(Ok(vec![Some(Sequence::refusal()); j.readings.len()]));
            } else {
                count += j.readings.len();
                jobs.push(j);
            }
            if count < MAX_READINGS {
                next = rx.try_recv().ok();
            }
        }
        if jobs.is_empty() {
            continue;
        }
        let body = ForwardRequest {
            batches: jobs
                .iter()
                .map(|j| ForwardBatch {
                    sequence: j.sequence.as_ref().map(Sequence::id),
                    source: j.source,
                    readings: j.readings.clone(),
                    keyed: j.keyed.as_ref().map(|k| KeyedOut {
                        key: k.key.to_string(),
                        positions: k.positions.clone(),
                    }),
                })
                .collect(),
        };
        let req = http
            .post(&url)
            .json(&body)
            .timeout(timeout)
            .header(SECRET_HEADER, secret.as_ref());
        let answer = async {
            let resp = req.send().await.map_err(|e| e.to_string())?;
            let status = resp.status();
            if !status.is_success() {
                let text = resp.text().await.unwrap_or_default();
                return Err(format!("{status}: {text}"));
            }
            let r: ForwardResponse = resp.json().await.map_err(|e| e.to_string())?;
            if r.verdicts.len() != jobs.len() {
                return Err("the owner answered for another number of batches".into());
            }
            Ok(r.verdicts)
        }
        .await;
        match answer {
            Ok(verdicts) => {
                for (job, v) in jobs.into_iter().zip(verdicts) {
                    if let Some(seq) = &job.sequence
                        && v.iter().flatten().any(|r| r.code.is_transient())
                    {
                        seq.cut();
                    }
                    let _ = job.reply.send(Ok(v));
                }
            }
            Err(e) => {
                events::ForwardFailed {
                    url: &url,
                    error: &e,
                }
                .emit();
                for job in jobs {
                    if let Some(seq) = &job.sequence {
                        seq.cut();
                    }
                    let _ = job.reply.send(Err(engine::Error::Commit(format!(
                        "the node serving these sensors did not take them ({e})"
                    ))));
                }
            }
        }
    }
}
