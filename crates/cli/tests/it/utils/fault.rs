//! Real commit failures, made from outside the service: a trigger on the test server's own
//! `readings` table (its SQLite file, or its PostgreSQL schema) that raises an error, so
//! every group commit writing a matching reading fails in the store itself, the way a
//! full disk or a lost database would make it fail. Dropping the trigger heals it.

use std::path::{Path, PathBuf};

use super::{TestServer, database_url};

const TRIGGER: &str = "latch_test_fail";

/// Commit failures for one test server's store.
pub struct CommitFault {
    dir: PathBuf,
}

impl CommitFault {
    /// For the server whose data folder is `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// From now on, every commit with a reading of a sensor whose id starts with `prefix`
    /// (`""`: any) fails.
    pub async fn fail(&self, prefix: &str) {
        assert!(prefix.chars().all(|c| c.is_ascii_alphanumeric()));
        match database_url(&self.dir).await {
            None => self.sqlite(&format!(
                "CREATE TRIGGER {TRIGGER} BEFORE INSERT ON readings \
                 WHEN NEW.sensor_id LIKE '{prefix}%' \
                 BEGIN SELECT RAISE(ABORT, 'test: commit refused'); END;"
            )),
            Some(url) => {
                self.postgres(
                    &url,
                    &format!(
                        "CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql \
                         AS $$ BEGIN RAISE EXCEPTION 'test: commit refused'; END $$; \
                         CREATE TRIGGER {TRIGGER} BEFORE INSERT ON readings FOR EACH ROW \
                         WHEN (NEW.sensor_id LIKE '{prefix}%') EXECUTE FUNCTION {TRIGGER}();"
                    ),
                )
                .await
            }
        }
    }

    /// Commits work again.
    pub async fn heal(&self) {
        match database_url(&self.dir).await {
            None => self.sqlite(&format!("DROP TRIGGER IF EXISTS {TRIGGER};")),
            Some(url) => {
                self.postgres(
                    &url,
                    &format!("DROP TRIGGER IF EXISTS {TRIGGER} ON readings;"),
                )
                .await
            }
        }
    }

    fn sqlite(&self, sql: &str) {
        let conn = rusqlite::Connection::open(self.dir.join("latch.db")).unwrap();
        // The service writes meanwhile; wait for its lock instead of failing.
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .unwrap();
        conn.execute_batch(sql).unwrap();
    }

    async fn postgres(&self, url: &str, sql: &str) {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap();
    }
}

/// The sum of a counter's samples whose line starts with `series` (name and labels).
/// Metrics are process-wide, so concurrent tests add to them too: compare before and after.
pub async fn counter(s: &TestServer, series: &str) -> f64 {
    let (_, metrics) = s.get("/metrics").await;
    metrics
        .as_str()
        .unwrap_or("")
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
