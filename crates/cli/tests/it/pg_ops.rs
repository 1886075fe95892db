//! Issue #49: PostgreSQL as the README sets it up and restores it, run from the README's
//! own blocks (`readme.rs`) against the local PostgreSQL, on a role and a database of the
//! test's own, dropped at the end: the role and database Cluster makes serve latch, a
//! second node starts without PostgreSQL's notices in its log, and the restore of Operations
//! exits 0 and brings back the dump (a whole database, and a schema of a shared one).

use std::process::{Command, Output};

use serde_json::json;

use crate::readme::{block, readme};
use crate::utils::{Process, service_missing, unique};

/// The superuser's URL of the test database, split as the README's URLs need it.
struct Pg {
    /// `postgres://user@host:port/db` of the test database (a superuser).
    base: String,
    /// `host:port`.
    at: String,
}

impl Pg {
    /// `None` (outside CI) without PostgreSQL or its client programs.
    fn here() -> Option<Self> {
        let base = std::env::var("TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let url = reqwest::Url::parse(&base).expect("TEST_DATABASE_URL is a URL");
        let at = format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or(5432)
        );
        for tool in ["psql", "pg_dump", "pg_restore"] {
            let found = Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !found && service_missing(tool, "not installed") {
                return None;
            }
        }
        let pg = Self { base, at };
        let up = pg.psql(&pg.base, "SELECT 1");
        if !up.status.success() && service_missing("PostgreSQL", text(&up.stderr)) {
            return None;
        }
        Some(pg)
    }

    fn psql(&self, url: &str, sql: &str) -> Output {
        Command::new("psql")
            .args([url, "-v", "ON_ERROR_STOP=1", "-qc", sql])
            .output()
            .expect("psql runs")
    }
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// `block` with each `(from, to)` replaced; every `from` must be there (a README that
/// changed its example fails here rather than testing something else).
fn substituted(block: &str, pairs: &[(&str, &str)]) -> String {
    let mut out = block.to_string();
    for (from, to) in pairs {
        assert!(
            out.contains(from),
            "no `{from}` in the README block:\n{block}"
        );
        out = out.replace(from, to);
    }
    out
}

/// Runs a README block in bash in `dir`; its output, after asserting it exited 0 and
/// printed no error.
fn run(dir: &std::path::Path, script: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .current_dir(dir)
        .output()
        .expect("bash runs");
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "exit {:?}:\n{script}\n{said}",
        out.status
    );
    assert!(!said.contains("error"), "{script}\n{said}");
    said
}

async fn post(http: &reqwest::Client, base: &str, path: &str, body: serde_json::Value) -> u16 {
    http.post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn status(http: &reqwest::Client, url: String) -> u16 {
    http.get(url).send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn the_readmes_database_serves_a_cluster_and_its_restore_exits_0() {
    let Some(pg) = Pg::here() else {
        return;
    };
    let name = unique("latch_rt_").to_lowercase();
    let (role, db) = (name.clone(), name.clone());
    let readme = readme();
    let setup = substituted(
        &block(&readme, "postgres setup"),
        &[
            ("sudo -u postgres psql", &format!("psql {}", pg.base)),
            ("ROLE latch ", &format!("ROLE {role} ")),
            (
                "DATABASE latch OWNER latch",
                &format!("DATABASE {db} OWNER {role}"),
            ),
        ],
    );
    let work = tempfile::tempdir().unwrap();
    run(work.path(), &setup);
    let cleanup = Cleanup {
        pg: &pg,
        sql: vec![
            format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
            format!("DROP ROLE IF EXISTS {role}"),
        ],
    };
    let url = format!("postgres://{role}:change-me@{}/{db}", pg.at);
    let http = reqwest::Client::new();

    // Two nodes on it, as Cluster runs them; the second finds every table made already and
    // says nothing of it (PostgreSQL's "already exists, skipping" notices were logged).
    let first = Process::start(&work.path().join("node1"), Some(url.clone()));
    first.ready(&http).await;
    let log = [("LATCH_LOG", "info".to_string())];
    let second = Process::start_env(&work.path().join("node2"), Some(url.clone()), &log);
    second.ready(&http).await;
    assert!(second.terminate().await, "the second node stops cleanly");
    let said = std::fs::read_to_string(work.path().join("node2/latch.log")).unwrap();
    assert!(said.contains("INFO"), "the log at info: {said}");
    assert!(
        !said.contains("NOTICE"),
        "PostgreSQL's notices logged:\n{said}"
    );

    let sensor = |id: &str| json!({"id": id, "address": "Svobody st. 23"});
    assert_eq!(
        post(&http, &first.base, "/v1/sensors", sensor("kept")).await,
        201
    );
    let reading = json!({"sensor_id": "kept", "data": 1});
    assert_eq!(post(&http, &first.base, "/v1/readings", reading).await, 202);

    let restore = substituted(
        &block(&readme, "postgres restore"),
        &[
            ("postgres://latch:change-me@127.0.0.1/latch", &url),
            (
                "postgres://latch:change-me@127.0.0.1/postgres",
                &format!("postgres://{role}:change-me@{}/postgres", pg.at),
            ),
        ],
    );
    let (dump, restore) = restore
        .split_once("\n#")
        .expect("the dump, then the restore");
    run(work.path(), dump);
    // Made after the dump: the restore takes it away.
    assert_eq!(
        post(&http, &first.base, "/v1/sensors", sensor("later")).await,
        201
    );
    assert!(first.terminate().await, "the node stops cleanly");
    run(work.path(), &format!("#{restore}"));

    let back = Process::start(&work.path().join("node1"), Some(url.clone()));
    back.ready(&http).await;
    assert_eq!(
        status(&http, format!("{}/v1/sensors/kept", back.base)).await,
        200
    );
    assert_eq!(
        status(&http, format!("{}/v1/sensors/later", back.base)).await,
        404
    );
    let readings: serde_json::Value = http
        .get(format!("{}/v1/sensors/kept/readings", back.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        readings["items"].as_array().map(Vec::len),
        Some(1),
        "{readings}"
    );
    assert!(back.terminate().await);
    drop(cleanup);
}

#[tokio::test]
async fn the_readmes_schema_restore_exits_0() {
    let Some(pg) = Pg::here() else {
        return;
    };
    let schema = unique("latch_rs_").to_lowercase();
    let made = pg.psql(&pg.base, &format!("CREATE SCHEMA {schema}"));
    assert!(made.status.success(), "{}", text(&made.stderr));
    let cleanup = Cleanup {
        pg: &pg,
        sql: vec![format!("DROP SCHEMA IF EXISTS {schema} CASCADE")],
    };
    let url = latch_testkit::schema_url(&pg.base, &schema);
    let work = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let node = Process::start(&work.path().join("node"), Some(url.clone()));
    node.ready(&http).await;
    let sensor = |id: &str| json!({"id": id, "address": "Svobody st. 23"});
    assert_eq!(
        post(&http, &node.base, "/v1/sensors", sensor("kept")).await,
        201
    );

    let shared = "postgres://latch:change-me@127.0.0.1/shared";
    let script = substituted(
        &block(&readme(), "postgres schema restore"),
        &[
            (shared, &pg.base),
            ("-n latch ", &format!("-n {schema} ")),
            (
                "SCHEMA IF EXISTS latch ",
                &format!("SCHEMA IF EXISTS {schema} "),
            ),
        ],
    );
    let mut lines = script.lines();
    let dump = lines.next().expect("the dump");
    run(work.path(), dump);
    assert_eq!(
        post(&http, &node.base, "/v1/sensors", sensor("later")).await,
        201
    );
    assert!(node.terminate().await, "the node stops cleanly");
    run(work.path(), &lines.collect::<Vec<_>>().join("\n"));

    let back = Process::start(&work.path().join("node"), Some(url));
    back.ready(&http).await;
    assert_eq!(
        status(&http, format!("{}/v1/sensors/kept", back.base)).await,
        200
    );
    assert_eq!(
        status(&http, format!("{}/v1/sensors/later", back.base)).await,
        404
    );
    assert!(back.terminate().await);
    drop(cleanup);
}

/// Drops what a test made in PostgreSQL, also when it fails midway.
struct Cleanup<'a> {
    pg: &'a Pg,
    sql: Vec<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for sql in &self.sql {
            let out = self.pg.psql(&self.pg.base, sql);
            if !out.status.success() {
                eprintln!("cleanup `{sql}`: {}", text(&out.stderr));
            }
        }
    }
}
