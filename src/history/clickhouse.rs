//! ClickHouse over its HTTP interface, plain or TLS (the `clickhouse` crate, RowBinary): the tables, the
//! batched inserts the shipper makes, and the range reads the history endpoints make.
//!
//! The schema works on Debian's ClickHouse 18.16 as on current releases: times are `Int64`
//! milliseconds (no `DateTime64` there), tables are `ReplacingMergeTree` partitioned by
//! month and ordered by `(sensor_id, time, id)`. A batch shipped twice (latch stopped
//! between ClickHouse's acknowledgement and the spool delete) holds rows with the same
//! key and id: merges fold them, and reads say `DISTINCT` so none shows twice before that.

use std::time::Duration;

use clickhouse::{Client, Row};
use serde::{Deserialize, Serialize};

use super::Error;
use crate::domain::signals::Signals;
use crate::domain::{Event, EventKind, Millis, SensorId};
use crate::store::{HistoryBatch, ReadingRecord, Stored, TimeRange};

/// How long one insert may take before the shipment counts as failed.
const INSERT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one history read may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

/// Where ClickHouse is: `clickhouse_url` (credentials taken out of it) and the database.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub url: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub database: String,
}

impl Target {
    /// Checks `http[s]://[user[:password]@]host:port` and the database name. `https://`
    /// is TLS (rustls, certificates checked against the Web PKI roots), never plaintext.
    pub fn parse(url: &str, database: &str) -> anyhow::Result<Self> {
        check_database(database)?;
        let Some((scheme, rest)) = ["http", "https"]
            .into_iter()
            .find_map(|s| Some((s, url.strip_prefix(s)?.strip_prefix("://")?)))
        else {
            anyhow::bail!(
                "invalid setting `clickhouse_url`: must start with http:// or https:// \
                 (ClickHouse's HTTP interface, port 8123, or 8443 with TLS), got {url:?}"
            );
        };
        let (auth, host) = match rest.rsplit_once('@') {
            Some((auth, host)) => (Some(auth), host),
            None => (None, rest),
        };
        let host = host.trim_end_matches('/');
        if host.is_empty() || host.contains('/') || host.contains('?') {
            anyhow::bail!(
                "invalid setting `clickhouse_url`: expected http://host:port, got {url:?} \
                 (the database is set by `clickhouse_database`)"
            );
        }
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(a.to_string()), None),
            },
        };
        Ok(Self {
            url: format!("{scheme}://{host}"),
            user,
            password,
            database: database.to_string(),
        })
    }
}

/// A database name latch can put in DDL unquoted.
pub fn check_database(name: &str) -> anyhow::Result<()> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        anyhow::bail!(
            "invalid setting `clickhouse_database`: {name:?} must be letters, digits and _, \
             not starting with a digit"
        );
    }
    Ok(())
}

#[derive(Row, Serialize, Deserialize)]
struct ReadingRow {
    id: i64,
    sensor_id: String,
    ts: i64,
    received_at: i64,
    data: u8,
    late: u8,
    battery: Option<u8>,
    tamper: Option<u8>,
    /// As the stores keep it: `""` for a cleared fault (`Signals::fault_column`).
    fault: Option<String>,
}

#[derive(Row, Serialize, Deserialize)]
struct EventRow {
    id: i64,
    sensor_id: String,
    kind: String,
    at: i64,
    data: Option<u8>,
    previous: Option<u8>,
    last_seen_at: Option<i64>,
}

#[derive(Row, Serialize, Deserialize)]
struct AttemptRow {
    id: i64,
    notification_id: String,
    client_id: String,
    sensor_id: String,
    kind: String,
    at: i64,
    status_code: Option<u16>,
    error: Option<String>,
    duration_ms: u32,
}

#[derive(Row, Serialize, Deserialize)]
struct AuditRow {
    id: i64,
    at: i64,
    token_id: Option<String>,
    token_name: Option<String>,
    method: String,
    path: String,
    resource: String,
    before: Option<String>,
    after: Option<String>,
}

/// Columns added to a table after it was first made: `(table, column, type)`, each also in
/// [`schema`]'s `CREATE`.
const ADDED: [(&str, &str, &str); 3] = [
    ("readings", "battery", "Nullable(UInt8)"),
    ("readings", "tamper", "Nullable(UInt8)"),
    ("readings", "fault", "Nullable(String)"),
];

/// The tables, in the order they are created.
fn schema(db: &str) -> [String; 5] {
    let month = |col: &str| format!("toYYYYMM(toDateTime(intDiv({col}, 1000)))");
    [
        format!("CREATE DATABASE IF NOT EXISTS {db}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {db}.readings (\
               id Int64, sensor_id String, ts Int64, received_at Int64, data UInt8, late UInt8, \
               battery Nullable(UInt8), tamper Nullable(UInt8), fault Nullable(String)\
             ) ENGINE = ReplacingMergeTree() PARTITION BY {} ORDER BY (sensor_id, ts, id)",
            month("ts")
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {db}.events (\
               id Int64, sensor_id String, kind String, at Int64, data Nullable(UInt8), \
               previous Nullable(UInt8), last_seen_at Nullable(Int64)\
             ) ENGINE = ReplacingMergeTree() PARTITION BY {} ORDER BY (sensor_id, at, id)",
            month("at")
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {db}.notification_attempts (\
               id Int64, notification_id String, client_id String, sensor_id String, \
               kind String, at Int64, status_code Nullable(UInt16), error Nullable(String), \
               duration_ms UInt32\
             ) ENGINE = ReplacingMergeTree() PARTITION BY {} ORDER BY (sensor_id, at, id)",
            month("at")
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {db}.audit (\
               id Int64, at Int64, token_id Nullable(String), token_name Nullable(String), \
               method String, path String, resource String, before Nullable(String), \
               after Nullable(String)\
             ) ENGINE = ReplacingMergeTree() PARTITION BY {} ORDER BY (at, id)",
            month("at")
        ),
    ]
}

/// A connection to ClickHouse (HTTP, pooled keep-alive connections underneath).
#[derive(Clone)]
pub struct ClickHouse {
    /// Without a database: DDL names it, and it may not exist yet.
    admin: Client,
    /// With the database: inserts and reads.
    client: Client,
    database: String,
}

impl ClickHouse {
    pub fn new(target: &Target) -> Self {
        // Schema validation asks for RowBinaryWithNamesAndTypes, which 18.16 lacks; the row
        // types here are checked against the schema above by the integration tests instead.
        let mut client = Client::default()
            .with_url(&target.url)
            .with_validation(false);
        if let Some(u) = &target.user {
            client = client.with_user(u);
        }
        if let Some(p) = &target.password {
            client = client.with_password(p);
        }
        Self {
            admin: client.clone(),
            client: client.with_database(&target.database),
            database: target.database.clone(),
        }
    }

    /// Creates the database and tables when missing, and adds the columns a table made by
    /// an older latch lacks ([`ADDED`]; asked of `system.columns`, which every release has,
    /// rather than `ADD COLUMN IF NOT EXISTS`, which old ones lack).
    pub async fn ensure_schema(&self) -> Result<(), Error> {
        for ddl in schema(&self.database) {
            timed(self.admin.query(&ddl).execute()).await?;
        }
        for (table, column, kind) in ADDED {
            let have: Vec<String> = timed(
                self.admin
                    .query("SELECT name FROM system.columns WHERE database = ? AND table = ?")
                    .bind(self.database.as_str())
                    .bind(table)
                    .fetch_all::<String>(),
            )
            .await?;
            if !have.iter().any(|h| h == column) {
                let ddl = format!(
                    "ALTER TABLE {}.{table} ADD COLUMN {column} {kind}",
                    self.database
                );
                timed(self.admin.query(&ddl).execute()).await?;
            }
        }
        Ok(())
    }

    /// Inserts a shipment; `Ok` once ClickHouse acknowledged every row of it.
    ///
    /// Rows go in one insert per table and per [`MAX_MONTHS_PER_INSERT`] months of their
    /// time: current ClickHouse refuses an insert that touches more than 100 partitions
    /// (`max_partitions_per_insert_block`), and a backfill of years of readings would fail
    /// at every try while the spool grows. If a later insert fails, the earlier ones are
    /// shipped again with the rest; the tables fold such duplicates. Readings go last, so
    /// whoever sees a shipment's readings sees its events and attempts too (the history
    /// bench takes "every reading is in" as "the backlog has drained").
    pub async fn insert(&self, batch: &HistoryBatch) -> Result<(), Error> {
        for part in by_months(&batch.events, |e| e.row.at) {
            let mut insert = self.table_insert::<EventRow>("events").await?;
            for e in part {
                insert
                    .write(&EventRow {
                        id: e.id,
                        sensor_id: e.row.sensor_id.to_string(),
                        kind: e.row.kind.as_str().to_string(),
                        at: e.row.at,
                        data: e.row.data.map(u8::from),
                        previous: e.row.previous.map(u8::from),
                        last_seen_at: e.row.last_seen_at,
                    })
                    .await?;
            }
            insert.end().await?;
        }
        for part in by_months(&batch.attempts, |a| a.attempt.at) {
            let mut insert = self
                .table_insert::<AttemptRow>("notification_attempts")
                .await?;
            for a in part {
                insert
                    .write(&AttemptRow {
                        id: a.id,
                        notification_id: a.attempt.notification_id.clone(),
                        client_id: a.client_id.clone(),
                        sensor_id: a.sensor_id.clone(),
                        kind: a.kind.clone(),
                        at: a.attempt.at,
                        status_code: a.attempt.status_code,
                        error: a.attempt.error.clone(),
                        duration_ms: a.attempt.duration_ms,
                    })
                    .await?;
            }
            insert.end().await?;
        }
        for part in by_months(&batch.audit, |e| e.record.at) {
            let mut insert = self.table_insert::<AuditRow>("audit").await?;
            for e in part {
                let r = &e.record;
                insert
                    .write(&AuditRow {
                        id: e.id,
                        at: r.at,
                        token_id: r.token.as_ref().map(|t| t.id.clone()),
                        token_name: r.token.as_ref().map(|t| t.name.clone()),
                        method: r.method.clone(),
                        path: r.path.clone(),
                        resource: r.resource.clone(),
                        before: r.before.as_ref().map(|v| v.to_string()),
                        after: r.after.as_ref().map(|v| v.to_string()),
                    })
                    .await?;
            }
            insert.end().await?;
        }
        for part in by_months(&batch.readings, |r| r.row.ts) {
            let mut insert = self.table_insert::<ReadingRow>("readings").await?;
            for r in part {
                insert
                    .write(&ReadingRow {
                        id: r.id,
                        sensor_id: r.row.sensor_id.to_string(),
                        ts: r.row.ts,
                        received_at: r.row.received_at,
                        data: u8::from(r.row.data),
                        late: u8::from(r.row.late),
                        battery: r.row.signals.battery,
                        tamper: r.row.signals.tamper.map(u8::from),
                        fault: r.row.signals.fault_column(),
                    })
                    .await?;
            }
            insert.end().await?;
        }
        Ok(())
    }

    async fn table_insert<T: Row + Serialize>(
        &self,
        table: &str,
    ) -> Result<clickhouse::insert::Insert<T>, Error> {
        Ok(self
            .client
            .insert::<T>(table)
            .await?
            .with_timeouts(Some(INSERT_TIMEOUT), Some(INSERT_TIMEOUT)))
    }

    /// One page of a sensor's rows of `table` whose time column is `time`: in `range`,
    /// after the `(time, id)` cursor, by `(time, id)`, each row once.
    async fn page<T>(
        &self,
        table: &str,
        time: &str,
        sensor_id: SensorId,
        range: TimeRange,
        after: (Millis, i64),
        limit: u64,
    ) -> Result<Vec<T>, Error>
    where
        T: clickhouse::RowOwned + clickhouse::RowRead,
    {
        let sql = format!(
            "SELECT DISTINCT ?fields FROM {table} \
             WHERE sensor_id = ? AND {time} >= ? AND {time} < ? \
               AND ({time} > ? OR ({time} = ? AND id > ?)) \
             ORDER BY {time}, id LIMIT ?"
        );
        let query = self
            .client
            .query(&sql)
            .bind(sensor_id.to_string())
            .bind(range.from.unwrap_or(i64::MIN))
            .bind(range.to.unwrap_or(i64::MAX))
            .bind(after.0)
            .bind(after.0)
            .bind(after.1)
            .bind(limit);
        timed(query.fetch_all()).await
    }

    /// Up to `limit` readings of a sensor in `range` after the `(ts, id)` cursor.
    pub async fn readings(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        after: (Millis, i64),
        limit: u64,
    ) -> Result<Vec<Stored<ReadingRecord>>, Error> {
        let rows: Vec<ReadingRow> = self
            .page("readings", "ts", sensor_id, range, after, limit)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| Stored {
                id: r.id,
                row: ReadingRecord {
                    sensor_id,
                    data: r.data != 0,
                    ts: r.ts,
                    received_at: r.received_at,
                    late: r.late != 0,
                    signals: Signals {
                        battery: r.battery,
                        tamper: r.tamper.map(|t| t != 0),
                        fault: Signals::fault_from_column(r.fault.as_deref()),
                    },
                },
            })
            .collect())
    }

    /// Up to `limit` events of a sensor in `range` after the `(at, id)` cursor.
    pub async fn events(
        &self,
        sensor_id: SensorId,
        range: TimeRange,
        after: (Millis, i64),
        limit: u64,
    ) -> Result<Vec<Stored<Event>>, Error> {
        let rows: Vec<EventRow> = self
            .page("events", "at", sensor_id, range, after, limit)
            .await?;
        Ok(rows
            .into_iter()
            .map(|e| Stored {
                id: e.id,
                row: Event {
                    sensor_id,
                    kind: EventKind::parse(&e.kind).unwrap_or(EventKind::StateChanged),
                    at: e.at,
                    data: e.data.map(|d| d != 0),
                    previous: e.previous.map(|d| d != 0),
                    last_seen_at: e.last_seen_at,
                    // Not shipped: the reminder's and the debounce's figures stay in the
                    // notifications that carried them.
                    detail: Default::default(),
                },
            })
            .collect())
    }

    /// Deletes a sensor's history (an asynchronous mutation on ClickHouse's side).
    pub async fn delete_sensor(&self, sensor_id: SensorId) -> Result<(), Error> {
        for table in ["readings", "events", "notification_attempts"] {
            let sql = format!("ALTER TABLE {table} DELETE WHERE sensor_id = ?");
            timed(
                self.client
                    .query(&sql)
                    .bind(sensor_id.to_string())
                    .execute(),
            )
            .await?;
        }
        Ok(())
    }
}

impl ClickHouse {
    /// Drops the monthly partitions of `table` wholly before `before` (ClickHouse 18.16 has
    /// no table TTL; `ALTER TABLE … DROP PARTITION` is there since long before). The tables
    /// are partitioned by the month of their time in the server's time zone, so a month is
    /// dropped only once it ended a day before `before` in UTC, whatever that zone is.
    /// Returns the partitions dropped.
    pub async fn drop_months_before(&self, table: &str, before: Millis) -> Result<u64, Error> {
        let parts: Vec<String> = timed(
            self.admin
                .query(
                    "SELECT DISTINCT partition FROM system.parts \
                     WHERE database = ? AND table = ? AND active",
                )
                .bind(&self.database)
                .bind(table)
                .fetch_all::<String>(),
        )
        .await?;
        let mut dropped = 0;
        for part in parts {
            // `toYYYYMM`: 202601 for January 2026.
            let Ok(yyyymm) = part.trim_matches('\'').parse::<i64>() else {
                continue;
            };
            let next_month = (yyyymm / 100) * 12 + (yyyymm % 100 - 1) + 1;
            if month_start(next_month) + DAY_MS > before {
                continue;
            }
            let sql = format!("ALTER TABLE {table} DROP PARTITION {yyyymm}");
            timed(self.client.query(&sql).execute()).await?;
            tracing::info!(
                table,
                partition = yyyymm,
                "Dropped a ClickHouse partition past retention."
            );
            dropped += 1;
        }
        Ok(dropped)
    }

    /// The time of the oldest reading ClickHouse holds (`None`: none). Only the oldest
    /// month is read: the partitions' min-max index on `ts` prunes the others.
    pub async fn oldest_reading(&self) -> Result<Option<Millis>, Error> {
        let oldest: Vec<String> = timed(
            self.admin
                .query(
                    "SELECT min(partition) FROM system.parts \
                     WHERE database = ? AND table = 'readings' AND active",
                )
                .bind(&self.database)
                .fetch_all::<String>(),
        )
        .await?;
        let Some(yyyymm) = oldest
            .first()
            .and_then(|p| p.trim_matches('\'').parse::<i64>().ok())
        else {
            return Ok(None);
        };
        let month_end = month_start((yyyymm / 100) * 12 + (yyyymm % 100 - 1) + 1) + DAY_MS;
        let min: Vec<i64> = timed(
            self.client
                .query("SELECT min(ts) FROM readings WHERE ts < ? HAVING count() > 0")
                .bind(month_end)
                .fetch_all::<i64>(),
        )
        .await?;
        Ok(min.first().copied())
    }
}

const DAY_MS: Millis = 24 * 3600 * 1000;

/// The first millisecond of a month given as one number (`year * 12 + month0`), UTC.
fn month_start(month: i64) -> Millis {
    use chrono::TimeZone;
    chrono::Utc
        .with_ymd_and_hms(
            month.div_euclid(12) as i32,
            month.rem_euclid(12) as u32 + 1,
            1,
            0,
            0,
            0,
        )
        .single()
        .map_or(i64::MAX, |t| t.timestamp_millis())
}

/// Most calendar months one insert may span. The tables are partitioned by month, and
/// ClickHouse refuses an insert touching more than 100 partitions; the margin covers the
/// server's time zone, which may put a row near a month's edge into the next partition.
pub const MAX_MONTHS_PER_INSERT: usize = 90;

/// A UTC calendar month as one number (`year * 12 + month0`).
fn month(ms: Millis) -> i64 {
    use chrono::Datelike;
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(t) => i64::from(t.year()) * 12 + i64::from(t.month0()),
        // Out of chrono's range: roughly a month of 31 days, still one partition per value.
        None => ms.div_euclid(31 * 24 * 3600 * 1000),
    }
}

/// The rows in groups spanning at most [`MAX_MONTHS_PER_INSERT`] months each, by month;
/// within a month, rows keep their order.
fn by_months<T>(rows: &[T], time: impl Fn(&T) -> Millis) -> Vec<Vec<&T>> {
    let mut sorted: Vec<(i64, &T)> = rows.iter().map(|r| (month(time(r)), r)).collect();
    sorted.sort_by_key(|(m, _)| *m);
    let mut groups = Vec::new();
    let mut group: Vec<&T> = Vec::new();
    let (mut months, mut last) = (0, None);
    for (m, row) in sorted {
        if last != Some(m) {
            if months == MAX_MONTHS_PER_INSERT {
                groups.push(std::mem::take(&mut group));
                months = 0;
            }
            months += 1;
            last = Some(m);
        }
        group.push(row);
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

async fn timed<T>(f: impl Future<Output = clickhouse::error::Result<T>>) -> Result<T, Error> {
    tokio::time::timeout(QUERY_TIMEOUT, f)
        .await
        .map_err(|_| Error::ClickHouse(format!("no answer within {QUERY_TIMEOUT:?}")))?
        .map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_insert_spans_more_than_90_months() {
        // Ten years of daily rows, shuffled as a spool of late backfills might hold them.
        let day = 24 * 3600 * 1000;
        let start = crate::domain::time::parse("2016-01-01T00:00:00Z").unwrap();
        let mut rows: Vec<Millis> = (0..3653).map(|d| start + d * day).collect();
        rows.reverse();
        rows.rotate_left(1000);
        let groups = by_months(&rows, |t| *t);
        let mut seen = 0;
        for g in &groups {
            let mut months: Vec<i64> = g.iter().map(|t| month(**t)).collect();
            months.dedup();
            let distinct: std::collections::BTreeSet<i64> = months.into_iter().collect();
            assert!(
                distinct.len() <= MAX_MONTHS_PER_INSERT,
                "{}",
                distinct.len()
            );
            seen += g.len();
        }
        assert_eq!(seen, rows.len(), "every row in exactly one insert");
        assert_eq!(groups.len(), 2, "121 months: two inserts");
        assert!(by_months(&[] as &[Millis], |t| *t).is_empty());
        assert_eq!(by_months(&[5, 6, 7], |t| *t).len(), 1);
    }

    /// An `https://` URL speaks TLS from the first byte: no plaintext request is ever sent,
    /// even to a server that only speaks plaintext.
    #[tokio::test]
    async fn https_urls_speak_tls() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let first = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut b = [0u8; 1];
            sock.read_exact(&mut b).await.unwrap();
            b[0]
        });
        let target = Target::parse(&format!("https://{addr}"), "latch").unwrap();
        let ch = ClickHouse::new(&target);
        let sent = tokio::spawn(async move { ch.ensure_schema().await });
        let byte = tokio::time::timeout(Duration::from_secs(30), first)
            .await
            .expect("latch connected")
            .unwrap();
        assert_eq!(
            byte, 0x16,
            "a TLS handshake record, not a plaintext request"
        );
        sent.abort();
    }

    #[test]
    fn urls_carry_credentials_but_not_databases() {
        let t = Target::parse("http://reader:s3cret@ch.local:8123/", "latch").unwrap();
        assert_eq!(t.url, "http://ch.local:8123");
        assert_eq!(t.user.as_deref(), Some("reader"));
        assert_eq!(t.password.as_deref(), Some("s3cret"));
        let tls = Target::parse("https://u:p@ch.example:8443", "latch").unwrap();
        assert_eq!(tls.url, "https://ch.example:8443", "TLS stays TLS");
        assert_eq!(tls.user.as_deref(), Some("u"));
        assert!(Target::parse("ftp://ch:8443", "latch").is_err());
        assert!(Target::parse("httpss://ch:8443", "latch").is_err());
        assert!(Target::parse("http://ch:8123/latch", "latch").is_err());
        assert!(Target::parse("http://ch:8123", "1abc").is_err());
        assert!(Target::parse("http://ch:8123", "a; DROP").is_err());
    }
}
