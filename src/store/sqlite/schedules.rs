//! Schedules on the embedded store: kept whole, as the API writes them.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use crate::domain::SensorId;
use crate::store::{Error, Page, PageRequest, Result, Schedules, StoredSchedule, limit_plus_one};

fn row(r: &rusqlite::Row) -> rusqlite::Result<(String, i64, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}

#[async_trait]
impl Schedules for SqliteStore {
    async fn create_schedule(&self, s: StoredSchedule) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&s.schedule.id));
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "INSERT INTO schedules (id, body, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (id) DO NOTHING",
                params![s.schedule.id, s.body(), s.created_at, s.updated_at],
            )?;
            if n == 0 {
                return Err(Error::Conflict(format!(
                    "schedule {} already exists",
                    s.schedule.id
                )));
            }
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn get_schedule(&self, id: String) -> Result<Option<StoredSchedule>> {
        self.read(move |c| {
            let found = c
                .prepare_cached("SELECT body, created_at, updated_at FROM schedules WHERE id = ?1")?
                .query_row([id], row)
                .optional()?;
            found
                .map(|(b, c, u)| StoredSchedule::of(&b, c, u))
                .transpose()
        })
        .await
    }

    async fn list_schedules(&self, page: PageRequest) -> Result<Page<StoredSchedule>> {
        self.read(move |c| {
            let rows = c
                .prepare_cached(
                    "SELECT body, created_at, updated_at FROM schedules WHERE id > ?1 \
                     ORDER BY id LIMIT ?2",
                )?
                .query_map(
                    params![
                        page.after.clone().unwrap_or_default(),
                        limit_plus_one(&page)
                    ],
                    row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let rows = rows
                .iter()
                .map(|(b, c, u)| StoredSchedule::of(b, *c, *u))
                .collect::<Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |s| s.schedule.id.clone()))
        })
        .await
    }

    async fn replace_schedule(&self, s: StoredSchedule) -> Result<bool> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "UPDATE schedules SET body = ?2, updated_at = ?3 WHERE id = ?1",
                params![s.schedule.id, s.body(), s.updated_at],
            )?;
            super::audit::audited(tx, n, audit.as_ref())
        })
        .await
    }

    async fn delete_schedule(&self, id: String) -> Result<bool> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute("DELETE FROM schedules WHERE id = ?1", [id])?;
            super::audit::audited(tx, n, audit.as_ref())
        })
        .await
    }

    async fn sensors_armed_by(&self, id: String, limit: u32) -> Result<Vec<SensorId>> {
        self.read(move |c| {
            let ids = c
                .prepare_cached(
                    "SELECT id FROM sensors WHERE json_extract(armed, '$.schedule_id') = ?1 \
                     ORDER BY id LIMIT ?2",
                )?
                .query_map(rusqlite::params![id, limit], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(ids.iter().filter_map(|s| SensorId::parse(s).ok()).collect())
        })
        .await
    }
}
