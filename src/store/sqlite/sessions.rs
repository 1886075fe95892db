//! What a broker session keeps across a stop: MQTT publishes committed and never
//! acknowledged.

use async_trait::async_trait;
use rusqlite::params;

use super::super::{Result, Sessions, Unacked};
use super::SqliteStore;

#[async_trait]
impl Sessions for SqliteStore {
    async fn keep_unacked(&self, session: String, unacked: Vec<Unacked>) -> Result<()> {
        self.write(move |c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM mqtt_unacked WHERE session = ?1", [&session])?;
            {
                let mut insert = tx.prepare(
                    "INSERT INTO mqtt_unacked (session, pkid, topic, payload) \
                     VALUES (?1, ?2, ?3, ?4)",
                )?;
                for u in &unacked {
                    insert.execute(params![session, u.pkid, u.topic, u.payload])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn take_unacked(&self, session: String) -> Result<Vec<Unacked>> {
        self.write(move |c| {
            let tx = c.transaction()?;
            let taken = tx
                .prepare(
                    "SELECT pkid, topic, payload FROM mqtt_unacked WHERE session = ?1 \
                     ORDER BY pkid",
                )?
                .query_map([&session], |r| {
                    Ok(Unacked {
                        pkid: r.get(0)?,
                        topic: r.get(1)?,
                        payload: r.get(2)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            tx.execute("DELETE FROM mqtt_unacked WHERE session = ?1", [&session])?;
            tx.commit()?;
            Ok(taken)
        })
        .await
    }
}
