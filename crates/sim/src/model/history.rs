//! History: readings and events listed, the spool shipped to a sink: `history.rs` of both
//! backends. Readings are kept by id as they are committed (as PostgreSQL indexes them):
//! there is no journal to move into an archive (it implements no `Journal`), and
//! the spool is every reading and event still held (each goes once it shipped) and the
//! attempts after the ship mark.

use async_trait::async_trait;

use latch::domain::{Event, Millis, SensorId};
use latch::store::{
    AttemptRecord, Error, HistoryBatch, HistorySink, HistoryStore, Page, PageRequest,
    ReadingRecord, Result, Stored, TimeRange,
};

use super::faults::{Call, Fault};
use super::node::{NodeStore, refusal};
use super::tables::Tables;

/// A history cursor, `"{ms}:{id}"`.
fn split_cursor(c: &str) -> Result<(i64, i64)> {
    let (a, b) = c.split_once(':').ok_or(Error::BadCursor)?;
    Ok((
        a.parse().map_err(|_| Error::BadCursor)?,
        b.parse().map_err(|_| Error::BadCursor)?,
    ))
}

/// One page of a sensor's rows `(time, id, row)` in time order, after the cursor.
fn page_by_time<T>(
    mut rows: Vec<(Millis, i64, T)>,
    range: TimeRange,
    page: &PageRequest,
) -> Result<Page<Stored<T>>> {
    let cursor = match &page.after {
        Some(c) => split_cursor(c)?,
        None => (i64::MIN, i64::MIN),
    };
    rows.retain(|(at, id, _)| {
        range.from.is_none_or(|f| *at >= f)
            && range.to.is_none_or(|t| *at < t)
            && (*at, *id) > cursor
    });
    rows.sort_by_key(|(at, id, _)| (*at, *id));
    let rows: Vec<(Millis, i64, T)> = rows.into_iter().take(page.limit as usize + 1).collect();
    let page = Page::from_rows(rows, page.limit, |(at, id, _)| format!("{at}:{id}"));
    Ok(Page {
        items: page
            .items
            .into_iter()
            .map(|(_, id, row)| Stored { id, row })
            .collect(),
        next: page.next,
    })
}

impl Tables {
    fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: &PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        let rows = self
            .readings
            .iter()
            .filter(|(_, r)| r.sensor_id == sensor_id)
            .map(|(&id, r)| (r.ts, id, *r))
            .collect();
        page_by_time(rows, range, page)
    }

    fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: &PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        let rows = self
            .events
            .iter()
            .filter(|(_, e)| e.sensor_id == sensor_id)
            .map(|(&id, e)| (e.at, id, e.clone()))
            .collect();
        page_by_time(rows, range, page)
    }

    /// The oldest `limit` unshipped rows of each kind.
    fn spooled(&self, limit: usize) -> HistoryBatch {
        let readings = self
            .readings
            .iter()
            .take(limit)
            .map(|(&id, r)| Stored { id, row: *r })
            .collect();
        let events = self
            .events
            .iter()
            .take(limit)
            .map(|(&id, e)| Stored { id, row: e.clone() })
            .collect();
        let attempts = self
            .attempts
            .range(self.attempts_shipped + 1..)
            .take(limit)
            .map(|(&id, a)| {
                // With what it was about, from its notification (`''` once it is gone).
                let n = self.notification(&a.attempt.notification_id);
                let n = n.map(|r| &r.notification);
                AttemptRecord {
                    id,
                    client_id: n.map(|n| n.client_id.clone()).unwrap_or_default(),
                    sensor_id: n.map(|n| n.sensor_id.to_string()).unwrap_or_default(),
                    kind: n.map(|n| n.kind.as_str().to_string()).unwrap_or_default(),
                    attempt: a.attempt.clone(),
                }
            })
            .collect();
        let audit = self
            .trail
            .iter()
            .filter(|e| e.id > self.next.audit_shipped)
            .take(limit)
            .cloned()
            .collect();
        HistoryBatch {
            readings,
            events,
            attempts,
            audit,
        }
    }

    /// Lets go of what shipped: every reading and event up to the batch's last (ids grow
    /// in commit order), and the attempts' mark moves on.
    fn shipped(&mut self, batch: &HistoryBatch) -> usize {
        let last = |ids: &mut dyn Iterator<Item = i64>| ids.max().unwrap_or(0);
        let reading = last(&mut batch.readings.iter().map(|r| r.id));
        let event = last(&mut batch.events.iter().map(|e| e.id));
        self.readings.retain(|&id, _| id > reading);
        self.events.retain(|&id, _| id > event);
        if let Some(a) = batch.attempts.iter().map(|a| a.id).max() {
            self.attempts_shipped = self.attempts_shipped.max(a);
        }
        if let Some(a) = batch.audit.iter().map(|e| e.id).max() {
            self.next.audit_shipped = self.next.audit_shipped.max(a);
        }
        batch.len()
    }

    fn spool_depth(&self) -> u64 {
        let attempts = self.attempts.range(self.attempts_shipped + 1..).count();
        let audit = self
            .trail
            .iter()
            .filter(|e| e.id > self.next.audit_shipped)
            .count();
        (self.readings.len() + self.events.len() + attempts + audit) as u64
    }
}

impl NodeStore {
    /// Takes the batch, hands it to the sink (no lock held while the sink works), and
    /// lets go of it once the sink has it, as the backends do in two transactions.
    async fn ship(&self, call: &Call, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        let batch = self.model().apply(call, |t, _| Ok(t.spooled(limit)))?;
        if batch.is_empty() {
            return Ok(0);
        }
        sink.insert(&batch).await.map_err(Error::Sink)?;
        self.model().apply(call, |t, _| Ok(t.shipped(&batch)))
    }
}

#[async_trait]
impl HistoryStore for NodeStore {
    async fn list_readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<ReadingRecord>>> {
        self.run("list_readings", false, |t, _| {
            t.list_readings(sensor_id, range, &page)
        })
        .await
    }

    async fn list_events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Page<Stored<Event>>> {
        self.run("list_events", false, |t, _| {
            t.list_events(sensor_id, range, &page)
        })
        .await
    }

    async fn ship_history(&self, limit: usize, sink: &dyn HistorySink) -> Result<usize> {
        let (call, fault) = self.begin_call("ship_history", true).await;
        let result = match refusal(&call, fault) {
            None => self.ship(&call, limit, sink).await,
            Some(e) => {
                if fault == (Fault::InDoubt { applied: true }) {
                    let _ = self.ship(&call, limit, sink).await;
                }
                Err(e)
            }
        };
        self.end_call(&call).await;
        result
    }

    async fn spool_depth(&self) -> Result<u64> {
        self.run("spool_depth", false, |t, _| Ok(t.spool_depth()))
            .await
    }

    async fn history_from(&self) -> Result<Option<Millis>> {
        self.run("history_from", false, |t, _| {
            Ok(t.readings.values().map(|r| r.ts).min())
        })
        .await
    }
}
