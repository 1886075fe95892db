//! Issue #49: PostgreSQL as the book sets it up and restores it, run from the book's own
//! blocks (`readme.rs` finds them in the README or any page of `docs/`) against the local
//! PostgreSQL, on a role and a database of the test's own, dropped at the end: the role and
//! database the cluster chapter makes serve latch, a second node starts without
//! PostgreSQL's notices in its log, and the restore of Backup and restore exits 0 and
//! brings back the dump (a whole database, and a schema of a shared one). Issue #69: the
//! cluster chapter's three nodes, started as its example starts them, form a cluster that
//! shares one key.

use std::process::{Command, Output};

use serde_json::json;

use crate::readme::{block, docs_text};
use crate::utils::{Process, eventually, service_missing, unique};

/// The superuser's URL of the test database, split as the book's URLs need it.
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

/// `block` with each `(from, to)` replaced; every `from` must be there (a page that
/// changed its example fails here rather than testing something else).
fn substituted(block: &str, pairs: &[(&str, &str)]) -> String {
    let mut out = block.to_string();
    for (from, to) in pairs {
        assert!(out.contains(from), "no `{from}` in the block:\n{block}");
        out = out.replace(from, to);
    }
    out
}

/// Runs a marked block in bash in `dir`; its output, after asserting it exited 0 and
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

/// The role and database the cluster chapter's setup block makes, under a name of the
/// test's own: the URL latch reaches it at, and what drops both at the end.
fn book_database<'a>(pg: &'a Pg, docs: &str, work: &std::path::Path) -> (String, Cleanup<'a>) {
    let name = unique("latch_rt_").to_lowercase();
    let (role, db) = (name.clone(), name);
    let setup = substituted(
        &block(docs, "postgres setup"),
        &[
            ("sudo -u postgres psql", &format!("psql {}", pg.base)),
            ("ROLE latch ", &format!("ROLE {role} ")),
            (
                "DATABASE latch OWNER latch",
                &format!("DATABASE {db} OWNER {role}"),
            ),
        ],
    );
    run(work, &setup);
    let cleanup = Cleanup {
        pg,
        sql: vec![
            format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
            format!("DROP ROLE IF EXISTS {role}"),
        ],
    };
    (
        format!("postgres://{role}:change-me@{}/{db}", pg.at),
        cleanup,
    )
}

/// The role of a `postgres://role:password@…` URL.
fn url_role(url: &str) -> String {
    let url = reqwest::Url::parse(url).expect("a URL");
    url.username().to_string()
}

#[tokio::test]
async fn the_books_database_serves_a_cluster_and_its_restore_exits_0() {
    let Some(pg) = Pg::here() else {
        return;
    };
    let docs = docs_text();
    let work = tempfile::tempdir().unwrap();
    let (url, cleanup) = book_database(&pg, &docs, work.path());
    let role = url_role(&url);
    let http = reqwest::Client::new();

    // Two nodes on it, as the cluster chapter runs them; the second finds every table made already and
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
        &block(&docs, "postgres restore"),
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
async fn the_books_schema_restore_exits_0() {
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
        &block(&docs_text(), "postgres schema restore"),
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

/// Issue #69: the cluster chapter's example, run as written (its database and ports the test's own):
/// three nodes, each with its own data folder and the one key file the example makes, form
/// one cluster, and a client's secrets made through one node open on the others. Before,
/// the first node made `secret.key` in its folder and the others refused to start.
#[tokio::test]
async fn the_books_cluster_example_starts_three_nodes_sharing_one_key() {
    let Some(pg) = Pg::here() else {
        return;
    };
    let docs = docs_text();
    let work = tempfile::tempdir().unwrap();
    let (url, cleanup) = book_database(&pg, &docs, work.path());
    let ports = free_ports();
    let example = substituted(
        &block(&docs, "cluster"),
        &[
            ("postgres://latch:change-me@127.0.0.1/latch", &url),
            ("127.0.0.1:808", &format!("127.0.0.1:{ports}")),
        ],
    );
    // The nodes' part, then what the reader runs once they are up.
    let (start, then) = example
        .split_once("\ndone\n")
        .expect("the nodes start in a loop");
    let steps = crate::readme::steps(then);
    assert_eq!(
        steps.len(),
        1,
        "one command after the nodes start: {steps:?}"
    );
    let curl = steps[0].command.clone();
    // Then bash waits for each node and exits with the first failure.
    let wait = "for p in $(jobs -p); do wait \"$p\"; done\n";
    let nodes = Nodes::start(work.path(), &format!("{start}\ndone\n{wait}"));

    let addresses: Vec<String> = (1..=3)
        .map(|i| format!("http://127.0.0.1:{ports}{i}"))
        .collect();
    let cluster = eventually(
        60,
        "the example's three nodes share the partitions",
        || async {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let out = Command::new("bash")
                .arg("-c")
                .arg(&curl)
                .current_dir(work.path())
                .output()
                .ok()?;
            let answer: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let mut shares: Vec<u64> = answer["nodes"]
                .as_array()?
                .iter()
                .filter_map(|n| n["partitions"].as_u64())
                .collect();
            shares.sort_unstable();
            (shares == [42, 43, 43]).then_some(answer)
        },
    )
    .await;
    assert_eq!(cluster["partitions"], 128, "{cluster}");
    assert_eq!(cluster["partitioning"], "exchange", "{cluster}");
    let mut seen: Vec<String> = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["address"].as_str().unwrap_or_default().to_string())
        .collect();
    seen.sort();
    assert_eq!(seen, addresses, "{cluster}");
    assert!(
        !work.path().join("node1/secret.key").exists(),
        "no node made a key of its own"
    );

    // One key: what one node sealed, every node opens.
    let http = reqwest::Client::new();
    let made: serde_json::Value = http
        .post(format!("{}/v1/clients", addresses[0]))
        .json(
            &json!({"name": "shared", "url": "https://hooks.example/latch",
            "headers": {"X-Api-Key": "header-secret"}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = made["id"].as_str().expect("a client id");
    for node in &addresses[1..] {
        let r = http
            .get(format!("{node}/v1/clients/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{node}");
        let read: serde_json::Value = r.json().await.unwrap();
        assert_eq!(read["secret"], made["secret"], "{node}: {read}");
    }
    let log = nodes.log.clone();
    let stopped = nodes.stop();
    let said = std::fs::read_to_string(log).unwrap_or_default();
    assert!(stopped, "the nodes stop cleanly:\n{said}");
    drop(cleanup);
}

/// A 4-digit prefix `p` whose ports `p1`, `p2`, `p3` are free, below the ephemeral range,
/// so the example's `808$i` keeps its shape.
fn free_ports() -> String {
    loop {
        use std::hash::{BuildHasher, Hasher};
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let prefix = 1000 + (random % 2000) as u16;
        let free =
            (1..=3).all(|i| std::net::TcpListener::bind(("127.0.0.1", prefix * 10 + i)).is_ok());
        if free {
            return prefix.to_string();
        }
    }
}

/// The example's nodes: one bash running its loop in a process group of its own, which the
/// test signals as a whole (the nodes are bash's background jobs).
struct Nodes {
    bash: std::process::Child,
    log: std::path::PathBuf,
}

impl Nodes {
    fn start(dir: &std::path::Path, script: &str) -> Self {
        use std::os::unix::process::CommandExt;
        let bin = std::path::Path::new(env!("CARGO_BIN_EXE_latch"))
            .parent()
            .unwrap()
            .to_path_buf();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let log = dir.join("nodes.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(format!("set -euo pipefail\n{script}"))
            .current_dir(dir)
            .env("PATH", path)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("LATCH_")) {
            cmd.env_remove(k);
        }
        Self {
            bash: cmd.spawn().expect("bash runs"),
            log,
        }
    }

    /// SIGTERM to every node (bash's children); `true` when bash saw them all exit with
    /// success.
    fn stop(mut self) -> bool {
        let _ = Command::new("pkill")
            .args(["-TERM", "-P", &self.bash.id().to_string()])
            .status();
        self.bash.wait().is_ok_and(|s| s.success())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        if matches!(self.bash.try_wait(), Ok(None)) {
            eprintln!("{}", self.log());
        }
        // The whole group, bash's own: a test that failed midway leaves no node behind.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.bash.id())])
            .status();
        let _ = self.bash.wait();
    }
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
