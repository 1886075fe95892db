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
//!
//! Where the server loads `pg_stat_statements`, each statement's time (planning and
//! execution) is read too, diffed by statement between the samples: which statement a
//! webhook's cost goes to. It counts every client of the database, so the figure is
//! latch's only while nothing else runs statements there.

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
    /// Each statement's calls and milliseconds so far, by `queryid`; `None` without
    /// `pg_stat_statements`.
    statements: Option<Vec<(i64, Statement)>>,
}

/// A statement's share of a phase: its calls and milliseconds, and its text's beginning.
#[derive(Debug, Clone, Default)]
pub struct Statement {
    pub calls: i64,
    pub ms: f64,
    pub text: String,
}

/// What a phase cost, between two samples.
#[derive(Debug, Clone)]
pub struct Cost {
    /// CPU seconds of latch's backends (those that lived through the phase or began in it).
    pub cpu: f64,
    /// Each table's rows inserted, updated and deleted, the tables written to only.
    pub tables: Vec<(String, [i64; 3])>,
    /// The statements run in the phase, most time first; `None` without
    /// `pg_stat_statements`.
    pub statements: Option<Vec<Statement>>,
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
        let statements = self.statements().await;
        Ok(Sample {
            cpu,
            tables,
            statements,
        })
    }

    /// Every statement's totals in this database; `None` where the extension is not
    /// installed here or the server does not load it (the view then refuses to answer).
    async fn statements(&self) -> Option<Vec<(i64, Statement)>> {
        let schema: String = self
            .client
            .query_opt(
                "SELECT n.nspname::text FROM pg_extension e \
                 JOIN pg_namespace n ON n.oid = e.extnamespace \
                 WHERE e.extname = 'pg_stat_statements'",
                &[],
            )
            .await
            .ok()??
            .get(0);
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT queryid, calls, total_plan_time + total_exec_time, \
                     left(regexp_replace(query, '\\s+', ' ', 'g'), 72) \
                     FROM \"{schema}\".pg_stat_statements \
                     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                     AND queryid IS NOT NULL"
                ),
                &[],
            )
            .await
            .ok()?;
        Some(
            rows.iter()
                .map(|r| {
                    let s = Statement {
                        calls: r.get(1),
                        ms: r.get(2),
                        text: r.get(3),
                    };
                    (r.get(0), s)
                })
                .collect(),
        )
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
        Self {
            cpu,
            tables,
            statements: statements_between(a, cpu_end),
        }
    }

    /// Rows inserted, updated and deleted, over every table.
    pub fn rows(&self) -> [i64; 3] {
        self.tables
            .iter()
            .fold([0; 3], |acc, (_, d)| [0, 1, 2].map(|i| acc[i] + d[i]))
    }
}

/// The statements run between `a` and `b` (a statement new in `b` ran entirely between
/// them), most time first.
fn statements_between(a: &Sample, b: &Sample) -> Option<Vec<Statement>> {
    let (before, after) = (a.statements.as_ref()?, b.statements.as_ref()?);
    let mut ran: Vec<Statement> = after
        .iter()
        .map(|(id, s)| {
            let was = before.iter().find(|(i, _)| i == id).map(|(_, s)| s);
            Statement {
                calls: s.calls - was.map_or(0, |w| w.calls),
                ms: s.ms - was.map_or(0.0, |w| w.ms),
                text: s.text.clone(),
            }
        })
        .filter(|s| s.calls > 0)
        .collect();
    ran.sort_by(|x, y| y.ms.total_cmp(&x.ms));
    Some(ran)
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
