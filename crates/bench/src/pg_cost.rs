//! What a phase of a bench costs PostgreSQL: the CPU time of latch's backends and the rows
//! it wrote. latch's own CPU a webhook says little about scale-out, where one PostgreSQL
//! serves every node: what bounds a cluster is what each webhook costs the database.
//!
//! latch's connections carry the bench schema's name as `application_name`
//! ([`super::store_config`]), so its backends are told apart from any other client of the
//! same server; their CPU is read from `/proc` (the server must run on this machine). Rows
//! come from `pg_stat_user_tables` of the schema, which backends report at most once a
//! second while busy and within 10 s when idle (PostgreSQL 15's statistics), so the rows
//! are read after that wait.

use std::time::Duration;

use latch_testkit::PgSchema;

/// Connected to the server that holds the bench schema.
pub struct PgCost {
    client: tokio_postgres::Client,
    schema: String,
}

/// One reading: the backends' CPU seconds (by pid) and the rows written so far.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    cpu: Vec<(i32, f64)>,
    /// Each table's rows inserted, updated and deleted.
    tables: Vec<(String, [i64; 3])>,
}

/// What a phase cost, between two samples.
#[derive(Debug, Clone)]
pub struct Cost {
    /// CPU seconds of latch's backends (those that lived through the phase or began in it).
    pub cpu: f64,
    /// Each table's rows inserted, updated and deleted, the tables written to only.
    pub tables: Vec<(String, [i64; 3])>,
}

/// How long a backend may hold its table statistics before PostgreSQL has them.
pub const STATS_SETTLE: Duration = Duration::from_secs(11);

impl PgCost {
    pub async fn connect(pg: &PgSchema) -> anyhow::Result<Self> {
        let (client, conn) = tokio_postgres::connect(pg.base(), tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        Ok(Self {
            client,
            schema: pg.schema().to_string(),
        })
    }

    /// The backends' CPU now; rows as PostgreSQL has them now (see [`STATS_SETTLE`]).
    pub async fn sample(&self) -> anyhow::Result<Sample> {
        let pids = self
            .client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                &[&self.schema],
            )
            .await?;
        let cpu = pids
            .iter()
            .filter_map(|r| {
                let pid: i32 = r.get(0);
                Some((pid, process_cpu(pid)?))
            })
            .collect();
        let tables = self
            .client
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables \
                 WHERE schemaname = $1",
                &[&self.schema],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), [r.get(1), r.get(2), r.get(3)]))
            .collect();
        Ok(Sample { cpu, tables })
    }
}

impl Cost {
    /// From `a` to `b`: the CPU from `cpu_end`'s backends, the rows from `rows_end`, read
    /// later so that the backends have reported them.
    pub fn between(a: &Sample, cpu_end: &Sample, rows_end: &Sample) -> Self {
        let cpu = cpu_end
            .cpu
            .iter()
            .map(|(pid, t)| {
                let before = a.cpu.iter().find(|(p, _)| p == pid).map_or(0.0, |x| x.1);
                t - before
            })
            .sum();
        let tables = rows_end
            .tables
            .iter()
            .map(|(name, end)| {
                let start = a
                    .tables
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or([0; 3], |x| x.1);
                (name.clone(), [0, 1, 2].map(|i| end[i] - start[i]))
            })
            .filter(|(_, d)| d.iter().any(|&n| n != 0))
            .collect();
        Self { cpu, tables }
    }

    /// Rows inserted, updated and deleted, over every table.
    pub fn rows(&self) -> [i64; 3] {
        self.tables
            .iter()
            .fold([0; 3], |acc, (_, d)| [0, 1, 2].map(|i| acc[i] + d[i]))
    }
}

/// A process's CPU seconds (user + system) from `/proc/<pid>/stat`, if it is on this machine.
fn process_cpu(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces), from the state (field 3) on.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (f64, f64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks)
}
