//! Schedules on PostgreSQL: kept whole, as the API writes them.

use async_trait::async_trait;

use super::PgStore;
use super::db::Sql;
use crate::domain::SensorId;
use crate::store::{Error, Page, PageRequest, Result, Schedules, StoredSchedule, limit_plus_one};

fn stored(r: &tokio_postgres::Row) -> Result<StoredSchedule> {
    StoredSchedule::of(&r.get::<_, String>(0), r.get(1), r.get(2))
}

#[async_trait]
impl Schedules for PgStore {
    async fn create_schedule(&self, s: StoredSchedule) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&s.schedule.id));
        let mut c = self.db.get("create_schedule").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                "INSERT INTO schedules (id, body, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING",
                &[&s.schedule.id, &s.body(), &s.created_at, &s.updated_at],
            )
            .await?;
        if n == 0 {
            return Err(Error::Conflict(format!(
                "schedule {} already exists",
                s.schedule.id
            )));
        }
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await
    }

    async fn get_schedule(&self, id: String) -> Result<Option<StoredSchedule>> {
        let c = self.db.get("get_schedule").await?;
        c.query_opt(
            "SELECT body, created_at, updated_at FROM schedules WHERE id = $1",
            &[&id],
        )
        .await?
        .as_ref()
        .map(stored)
        .transpose()
    }

    async fn list_schedules(&self, page: PageRequest) -> Result<Page<StoredSchedule>> {
        let c = self.db.get("list_schedules").await?;
        let rows = c
            .query(
                "SELECT body, created_at, updated_at FROM schedules WHERE id > $1 \
                 ORDER BY id LIMIT $2",
                &[
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                ],
            )
            .await?
            .iter()
            .map(stored)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |s| s.schedule.id.clone()))
    }

    async fn replace_schedule(&self, s: StoredSchedule) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("replace_schedule").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                "UPDATE schedules SET body = $2, updated_at = $3 WHERE id = $1",
                &[&s.schedule.id, &s.body(), &s.updated_at],
            )
            .await?;
        super::audit::audited(tx, n, audit.as_ref()).await
    }

    async fn delete_schedule(&self, id: String) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("delete_schedule").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute("DELETE FROM schedules WHERE id = $1", &[&id])
            .await?;
        super::audit::audited(tx, n, audit.as_ref()).await
    }

    async fn sensors_armed_by(&self, id: String, limit: u32) -> Result<Vec<SensorId>> {
        let c = self.db.get("sensors_armed_by").await?;
        let rows = c
            .query(
                "SELECT id FROM sensors WHERE (armed::jsonb ->> 'schedule_id') = $1 \
                 ORDER BY id COLLATE \"C\" LIMIT $2",
                &[&id, &i64::from(limit)],
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| SensorId::parse(r.get(0)).ok())
            .collect())
    }
}
