//! What the operations tests share: the tools they need (SKIPPED locally when missing, a
//! failure in CI), a `latch serve` child process, and the README's walk-through.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

pub use latch_testkit::{Receiver, eventually};

/// The repository's root, where `deploy/` and `scripts/` are.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `latch` binary cargo built for these tests.
pub fn latch_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_latch"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The path of `name` on `PATH` (or in the sbin folders). Missing: panics in CI, where
/// `.ci/run` installs every tool these tests use; elsewhere says SKIPPED and gives `None`.
pub fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        skip(&format!(
            "{name} is not installed (Debian package {package})"
        ));
    }
    found
}

/// Skips a test for want of `what`: never in CI.
pub fn skip(what: &str) {
    assert!(!in_ci(), "{what}: required in CI");
    eprintln!("SKIPPED: {what}; CI runs this test.");
}

/// The PostgreSQL the tests use (`TEST_DATABASE_URL`, or the local one), if it answers.
pub async fn postgres() -> Option<latch_testkit::PgSchema> {
    let base = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    match latch_testkit::PgSchema::create(&base, "latch_t_ops").await {
        Ok(schema) => Some(schema),
        Err(e) => {
            skip(&format!("PostgreSQL is not reachable ({e})"));
            None
        }
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a port-0 listener")
        .local_addr()
        .expect("its address")
        .port()
}

/// Runs `cmd`, panicking with its output unless it succeeds; gives its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// A child process killed when dropped, so a failing test leaves none behind.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr to `log`.
    pub fn spawn(cmd: &mut Command, log: PathBuf) -> Self {
        let out = std::fs::File::create(&log).expect("a log file");
        let err = out.try_clone().expect("the log file again");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Self { child, log }
    }

    /// SIGTERM, then waits: whether it exited with success.
    pub fn terminate(mut self) -> bool {
        // SAFETY: a signal to our own child, whose pid is ours to use until it is waited on.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        self.child.wait().is_ok_and(|s| s.success())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what the process said.
        if std::thread::panicking() {
            let said = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- {}:\n{said}", self.log.display());
        }
    }
}

/// A `latch serve` on a free port of loopback with its data (and log) in `dir`, and `env`
/// on top (webhooks to loopback allowed: the tests' receivers are there).
pub struct Latch {
    pub proc: Proc,
    pub base: String,
}

impl Latch {
    pub fn start(binary: &Path, dir: &Path, env: &[(&str, String)]) -> Self {
        let port = free_port();
        let mut cmd = Command::new(binary);
        cmd.arg("serve")
            .env("LATCH_LISTEN", format!("127.0.0.1:{port}"))
            .env("LATCH_DATA_DIR", dir)
            .env("LATCH_DELIVERY_ALLOW_NETS", "127.0.0.0/8")
            .env("LATCH_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)));
        std::fs::create_dir_all(dir).expect("the test's folder");
        Self {
            proc: Proc::spawn(&mut cmd, dir.join("latch.log")),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Waits until `/readyz` answers 200.
    pub async fn ready(&self, http: &reqwest::Client) {
        let url = format!("{}/readyz", self.base);
        let log = &self.proc.log;
        eventually(
            60,
            &format!("latch ready at {url} (log: {})", log.display()),
            || async {
                let ok = http.get(&url).send().await.ok()?.status().is_success();
                ok.then_some(())
            },
        )
        .await;
    }
}

/// What the walk-through made.
pub struct Walk {
    pub sensor: String,
    pub client: String,
    pub secret: String,
}

/// The README's walk-through against `base`: a sensor, a client whose webhooks go to
/// `hook`, the link, two readings (1, then 0); then the state, history and notifications
/// read back. Checks each answer as the README shows it.
pub async fn walk_through(http: &reqwest::Client, base: &str, hook: &str) -> Walk {
    let sensor = format!("ops{}", &ulid::Ulid::new().to_string()[16..]);
    let address = "Moscow, Russia, Svobody st. 23 fl 1 room 16";
    let resp = post(
        http,
        &format!("{base}/v1/sensors"),
        json!({"id": sensor, "address": address}),
    )
    .await;
    assert_eq!(resp.0, 201, "create the sensor: {}", resp.1);
    let (status, client) = post(
        http,
        &format!("{base}/v1/clients"),
        json!({"name": "acme", "url": hook}),
    )
    .await;
    assert_eq!(status, 201, "create the client: {client}");
    let id = client["id"].as_str().expect("the client's id").to_string();
    let secret = client["secret"].as_str().expect("its secret").to_string();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let link = http
        .put(format!("{base}/v1/clients/{id}/sensors/{sensor}"))
        .send()
        .await
        .expect("link");
    assert_eq!(link.status(), 204, "link");
    let (status, answer) = post(
        http,
        &format!("{base}/v1/readings"),
        json!([{"sensor_id": sensor, "data": 1}, {"sensor_id": sensor, "data": 0}]),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer, json!({"accepted": 2, "rejected": []}));

    let state = get(http, &format!("{base}/v1/sensors/{sensor}")).await;
    assert_eq!(state["address"], address);
    assert_eq!(state["status"]["data"], 0, "{state}");
    let readings = get(
        http,
        &format!("{base}/v1/sensors/{sensor}/readings?from=2000-01-01T00:00:00Z"),
    )
    .await;
    let data: Vec<&Value> = readings["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|r| &r["data"])
        .collect();
    assert_eq!(data, [&json!(1), &json!(0)], "{readings}");
    let events = get(http, &format!("{base}/v1/sensors/{sensor}/events")).await;
    let kinds: Vec<&Value> = events["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| &e["type"])
        .collect();
    assert_eq!(
        kinds,
        [
            &json!("sensor.state_changed"),
            &json!("sensor.state_changed")
        ],
        "{events}"
    );
    Walk {
        sensor,
        client: id,
        secret,
    }
}

/// Waits for the walk-through's last webhook (`data` 0 after 1: the first may have been
/// superseded), checks its Standard Webhooks signature, and that latch lists it delivered.
/// Gives its `webhook-id`.
pub async fn delivered(http: &reqwest::Client, base: &str, walk: &Walk, hook: &Receiver) -> String {
    let last = eventually(60, "the webhook of the change to 0", || async {
        hook.received()
            .into_iter()
            .find(|r| r.body["data"] == 0 && r.body["previous"] == 1)
    })
    .await;
    assert_eq!(last.body["type"], "sensor.state_changed");
    assert_eq!(last.body["sensor"]["id"], walk.sensor.as_str());
    let header = |name: &str| {
        last.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("a {name} header"))
            .to_string()
    };
    let (id, ts) = (header("webhook-id"), header("webhook-timestamp"));
    assert_eq!(last.body["id"], id.as_str());
    let key = STANDARD
        .decode(walk.secret.trim_start_matches("whsec_"))
        .expect("a base64 key");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&last.raw);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    assert!(
        header("webhook-signature")
            .split(' ')
            .any(|s| s == expected),
        "signature"
    );

    let url = format!("{base}/v1/notifications/{id}");
    eventually(30, "the notification listed as delivered", || async {
        let n = get(http, &url).await;
        (n["status"] == "delivered").then_some(())
    })
    .await;
    id
}

pub async fn post(http: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let resp = http
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("POST answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub async fn get(http: &reqwest::Client, url: &str) -> Value {
    let resp = http.get(url).send().await.expect("GET answers");
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.json().await.expect("JSON")
}
