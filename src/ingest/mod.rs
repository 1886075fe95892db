//! Readings in, acknowledgements out. Every source (HTTP here; AMQP and MQTT beside it)
//! turns its messages into validated readings or rejections and submits them through
//! [`Ingest::submit`], which answers only once the accepted ones are durable and counts
//! each one in `latch_readings_accepted_total` / `latch_readings_rejected_total`.

use crate::domain::{Reading, Rejection, time::now_ms};
use crate::engine::{self, Engine};

/// Errors of ingest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Engine(#[from] engine::Error),
}

/// What became of a submitted batch.
#[derive(Debug, Default)]
pub struct Report {
    pub accepted: usize,
    /// Input index and reason of every rejected reading.
    pub rejected: Vec<(usize, Rejection)>,
}

/// The shared entry point of all sources.
#[derive(Clone)]
pub struct Ingest {
    engine: Engine,
}

impl Ingest {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    /// Submits already-parsed items; `Err` items are rejections found by the source.
    /// `source` labels the metrics (`http`, `amqp`, `mqtt`).
    pub async fn submit(
        &self,
        source: &'static str,
        items: Vec<Result<Reading, Rejection>>,
    ) -> Result<Report, Error> {
        let received_at = now_ms();
        let mut report = Report::default();
        let mut valid = Vec::with_capacity(items.len());
        let mut valid_index = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            match item {
                Ok(r) => {
                    valid.push(r);
                    valid_index.push(i);
                }
                Err(rej) => report.rejected.push((i, rej)),
            }
        }
        if !valid.is_empty() {
            let verdicts = self.engine.submit(valid, received_at).await?;
            for (i, v) in valid_index.into_iter().zip(verdicts) {
                match v {
                    None => report.accepted += 1,
                    Some(rej) => report.rejected.push((i, rej)),
                }
            }
            report.rejected.sort_by_key(|(i, _)| *i);
        }
        metrics::counter!("latch_readings_accepted_total", "source" => source)
            .increment(report.accepted as u64);
        for (_, rej) in &report.rejected {
            metrics::counter!("latch_readings_rejected_total", "source" => source, "reason" => rej.code.as_str())
                .increment(1);
        }
        Ok(report)
    }
}
