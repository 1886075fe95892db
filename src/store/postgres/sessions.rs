//! What a broker session keeps across a stop: MQTT publishes committed and never
//! acknowledged. In the shared database, so a session moved to another node finds them.

use async_trait::async_trait;

use super::super::{Result, Sessions, Unacked};
use super::PgStore;
use super::db::Sql;

#[async_trait]
impl Sessions for PgStore {
    async fn keep_unacked(&self, session: String, unacked: Vec<Unacked>) -> Result<()> {
        let mut c = self.db.get("keep_unacked").await?;
        let tx = c.transaction().await?;
        tx.execute("DELETE FROM mqtt_unacked WHERE session = $1", &[&session])
            .await?;
        let pkids: Vec<i32> = unacked.iter().map(|u| i32::from(u.pkid)).collect();
        let topics: Vec<&[u8]> = unacked.iter().map(|u| u.topic.as_slice()).collect();
        let payloads: Vec<&[u8]> = unacked.iter().map(|u| u.payload.as_slice()).collect();
        tx.execute(
            "INSERT INTO mqtt_unacked (session, pkid, topic, payload) \
             SELECT $1, * FROM UNNEST($2::int4[], $3::bytea[], $4::bytea[])",
            &[&session, &pkids, &topics, &payloads],
        )
        .await?;
        tx.commit().await
    }

    async fn take_unacked(&self, session: String) -> Result<Vec<Unacked>> {
        let c = self.db.get("take_unacked").await?;
        let rows = c
            .query(
                "DELETE FROM mqtt_unacked WHERE session = $1 RETURNING pkid, topic, payload",
                &[&session],
            )
            .await?;
        let mut taken: Vec<Unacked> = rows
            .iter()
            .map(|r| Unacked {
                pkid: r.get::<_, i32>(0) as u16,
                topic: r.get(1),
                payload: r.get(2),
            })
            .collect();
        taken.sort_by_key(|u| u.pkid);
        Ok(taken)
    }
}
