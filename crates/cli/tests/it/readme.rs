//! Issue #49: the shell examples of the README and of the book (`docs/`), run as a reader
//! runs them and compared with what the page says they print. A block marked
//! `<!-- test: NAME -->` is taken from the page itself, so an example that stops being true
//! fails here; a marker names one block in the README and the book together.
//!
//! In a block, each command (a line, continued by a trailing `\`) may be followed by its
//! answer, `# → …` and lines `#    …` continuing it: JSON, cut down to the fields that
//! matter (an object shown holds some of the answer's fields; an array, as many items as
//! the answer's), where a string with `…` stands for any string that starts and ends as
//! shown; after the JSON, an HTTP status the command printed. A command shown without an
//! answer prints nothing. `NAME=…` is a value the reader copies from the answer before it
//! (its `"id"`, or a list's first item's).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::utils::{Process, database_url, eventually, service_missing};

/// The README at the root of the repository, then every page of the book under
/// `docs/src/` (sorted by path; the generated `docs/src/reference/` left out): the text
/// the marked blocks and the facts are looked for in.
pub fn docs_text() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pages = vec![root.join("README.md")];
    let src = root.join("docs/src");
    let mut book = Vec::new();
    book_pages(&src, &src.join("reference"), &mut book);
    book.sort();
    assert!(!book.is_empty(), "no pages under {}", src.display());
    pages.extend(book);
    let mut text = String::new();
    for path in pages {
        let page =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.push_str(&page);
        text.push('\n');
    }
    text
}

/// The `.md` files under `dir`, but those under `skip`.
fn book_pages(dir: &Path, skip: &Path, out: &mut Vec<std::path::PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path == skip {
            continue;
        }
        if path.is_dir() {
            book_pages(&path, skip, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The names of the marked blocks (a marker on a line of its own), in the order they
/// appear.
pub fn markers(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"(?m)^\s*<!-- test: (.+?) -->\s*$").unwrap();
    re.captures_iter(text).map(|m| m[1].to_string()).collect()
}

/// The fenced block after `<!-- test: NAME -->`, its lines as a reader copies them (a
/// block in a list item is indented; the indent is not part of it).
pub fn block(text: &str, name: &str) -> String {
    let marker = format!("<!-- test: {name} -->");
    let at = text
        .find(&marker)
        .unwrap_or_else(|| panic!("no `{marker}` in the README or the book"));
    assert_eq!(
        text.matches(&marker).count(),
        1,
        "`{marker}` marks more than one block"
    );
    let mut lines = text[at + marker.len()..]
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("```"));
    let fence = lines.next().expect("a fenced block after the marker");
    let indent = fence.len() - fence.trim_start().len();
    let mut out = String::new();
    for line in lines.by_ref() {
        if line.trim_start().starts_with("```") {
            return out;
        }
        out.push_str(line.get(indent..).unwrap_or(line.trim_start()));
        out.push('\n');
    }
    panic!("`{marker}`: the block is not closed");
}

/// One command of a block and what the page says it prints.
#[derive(Debug)]
pub struct Step {
    pub command: String,
    pub expect: Option<String>,
}

/// The commands of a block, each with its answer when one is shown.
pub fn steps(block: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = block.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(answer) = line.strip_prefix("# → ") {
            let mut text = answer.to_string();
            while let Some(more) = lines.peek().and_then(|l| l.strip_prefix("#   ")) {
                text.push(' ');
                text.push_str(more.trim());
                lines.next();
            }
            let last = steps.last_mut().expect("an answer follows a command");
            assert!(last.expect.is_none(), "two answers to {}", last.command);
            last.expect = Some(text);
        } else if line.trim().is_empty() || line.starts_with('#') {
            continue;
        } else {
            let mut command = line.to_string();
            while command.ends_with('\\') {
                command.pop();
                command.push_str(lines.next().expect("a continued line").trim_start());
            }
            steps.push(Step {
                command,
                expect: None,
            });
        }
    }
    steps
}

/// Whether `actual` is what `expected` shows (see the module docs); `Err` says where not.
pub fn matches(expected: &Value, actual: &Value, at: &str) -> Result<(), String> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                let got = a
                    .get(k)
                    .ok_or_else(|| format!("{at}.{k}: missing in {actual}"))?;
                matches(v, got, &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => e
            .iter()
            .zip(a)
            .enumerate()
            .try_for_each(|(i, (e, a))| matches(e, a, &format!("{at}[{i}]"))),
        (Value::String(e), Value::String(a)) if e.contains('…') => {
            let (head, tail) = e.split_once('…').expect("contains …");
            (a.starts_with(head) && a.ends_with(tail) && a.len() >= head.len() + tail.len())
                .then_some(())
                .ok_or_else(|| format!("{at}: {a:?} is not {e:?}"))
        }
        (e, a) if e == a => Ok(()),
        (e, a) => Err(format!("{at}: {a} where the page shows {e}")),
    }
}

/// JSON, and the HTTP status written after it if any.
fn answer(text: &str) -> Result<(Value, Option<u16>), String> {
    let text = text.trim();
    if let Ok(v) = serde_json::from_str(text) {
        return Ok((v, None));
    }
    let (json, status) = text
        .rsplit_once(char::is_whitespace)
        .ok_or_else(|| format!("not JSON: {text}"))?;
    let v = serde_json::from_str(json).map_err(|e| format!("not JSON ({e}): {json}"))?;
    let status = status
        .parse()
        .map_err(|_| format!("not a status: {status}"))?;
    Ok((v, Some(status)))
}

/// Whether bash and curl are here (outside CI a test may skip without them).
pub fn shell_ready() -> bool {
    for tool in ["bash", "curl"] {
        let found = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found && service_missing(tool, "not installed") {
            return false;
        }
    }
    true
}

/// Runs `steps` in bash one by one, as a reader pastes them, comparing each answer.
pub fn run_steps(steps: &[Step]) -> HashMap<String, String> {
    let mut vars: HashMap<String, String> = HashMap::new();
    let mut last: Option<Value> = None;
    for step in steps {
        if let Some((name, value)) = assignment(&step.command) {
            let value = if value.contains('…') {
                // The reader copies it from the answer before.
                let id = last
                    .as_ref()
                    .and_then(|a| a["id"].as_str().or(a["items"][0]["id"].as_str()));
                id.unwrap_or_else(|| panic!("{name}: no \"id\" in the answer before"))
                    .to_string()
            } else {
                value.to_string()
            };
            vars.insert(name.to_string(), value);
            continue;
        }
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -o pipefail; {}", step.command))
            .envs(&vars)
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "`{}` failed: {}{}",
            step.command,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        match &step.expect {
            None => {
                assert!(
                    stdout.trim().is_empty(),
                    "`{}` printed {stdout:?}; the page shows nothing",
                    step.command
                );
                last = None;
            }
            Some(expect) => {
                let (want, want_status) =
                    answer(expect).unwrap_or_else(|e| panic!("the page's answer: {e}"));
                let (got, got_status) =
                    answer(&stdout).unwrap_or_else(|e| panic!("`{}` printed {e}", step.command));
                if let Err(e) = matches(&want, &got, "answer") {
                    panic!("`{}`: {e}\nprinted: {stdout}", step.command);
                }
                assert_eq!(got_status, want_status, "`{}`: {stdout}", step.command);
                last = Some(got);
            }
        }
    }
    vars
}

/// `NAME=value` (a shell variable set on a line of its own), without a trailing comment.
fn assignment(command: &str) -> Option<(&str, &str)> {
    let (name, rest) = command.split_once('=')?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return None;
    }
    let value = rest.split("  #").next().unwrap_or(rest).trim();
    Some((name, value))
}

/// A request a [`Hooks`] receiver got.
#[derive(Debug, Clone)]
struct Hook {
    method: String,
    path: String,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
}

/// A webhook receiver on loopback taking any path, answering 204.
struct Hooks {
    addr: String,
    got: Arc<Mutex<Vec<Hook>>>,
}

impl Hooks {
    async fn start() -> Self {
        let got: Arc<Mutex<Vec<Hook>>> = Arc::default();
        let keep = got.clone();
        let app = axum::Router::new().fallback(
            move |method: axum::http::Method,
                  uri: axum::http::Uri,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let keep = keep.clone();
                async move {
                    keep.lock().unwrap().push(Hook {
                        method: method.to_string(),
                        path: uri.path().to_string(),
                        headers,
                        body,
                    });
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, got }
    }

    /// What it got; panics if a body breaks its schema in the event catalog.
    fn got(&self) -> Vec<Hook> {
        let got = self.got.lock().unwrap().clone();
        for h in &got {
            latch_testkit::assert_body(&h.body);
        }
        got
    }
}

/// The webhook as the README shows it: request line, headers, body.
struct ShownHook {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

fn shown_hook(block: &str) -> ShownHook {
    let (head, body) = block
        .split_once("\n\n")
        .expect("headers, a blank line, a body");
    let mut lines = head.lines();
    let (method, path) = lines
        .next()
        .and_then(|l| l.split_once(' '))
        .expect("a request line");
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(": ").expect("a header line");
            (k.to_string(), v.to_string())
        })
        .collect();
    ShownHook {
        method: method.to_string(),
        path: path.to_string(),
        headers,
        body: serde_json::from_str(body).expect("the README's webhook body is JSON"),
    }
}

/// Checks a webhook against the README's: the same request line and body (its `id` and
/// `occurred_at` aside, which are the notification's own), every header shown, and a
/// Standard Webhooks signature made with the client's secret.
fn check_hook(shown: &ShownHook, got: &Hook, secret: &str) -> Result<(), String> {
    if (got.method.as_str(), got.path.as_str()) != (shown.method.as_str(), shown.path.as_str()) {
        return Err(format!("{} {}", got.method, got.path));
    }
    let header = |name: &str| {
        got.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| format!("no {name} header"))
    };
    for (name, value) in &shown.headers {
        let v = header(name)?;
        if name == "content-type" && &v != value {
            return Err(format!("content-type {v}"));
        }
    }
    let body: Value = serde_json::from_slice(&got.body).map_err(|e| e.to_string())?;
    let mut expected = shown.body.clone();
    let own = expected.as_object_mut().expect("an object");
    own.remove("id");
    own.remove("occurred_at");
    matches(&expected, &body, "webhook")?;
    let id = header("webhook-id")?;
    if body["id"] != id.as_str() {
        return Err(format!("body id {} is not webhook-id {id}", body["id"]));
    }
    let at = body["occurred_at"].as_str().unwrap_or("");
    latch::domain::time::parse(at).ok_or_else(|| format!("occurred_at {at:?}"))?;
    let ts = header("webhook-timestamp")?;
    ts.parse::<i64>()
        .map_err(|_| format!("webhook-timestamp {ts}"))?;
    let key = STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .map_err(|e| e.to_string())?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&got.body);
    let signed = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    let signature = header("webhook-signature")?;
    if !signature.split(' ').any(|s| s == signed) {
        return Err(format!("signature {signature}"));
    }
    Ok(())
}

/// The README's five minutes with latch, against a fresh `latch serve` started as Quick
/// start says (loopback webhooks let through) and a receiver in the README's place on port
/// 9000: a sensor, a client, a change and its webhook; then a lost sensor and a dark
/// building; then the book's maintenance window on the same latch.
#[tokio::test]
async fn the_walk_through_prints_what_the_readme_shows_and_sends_its_webhook() {
    if !shell_ready() {
        return;
    }
    let hooks = Hooks::start().await;
    let dir = tempfile::tempdir().unwrap();
    let latch = Process::start(dir.path(), database_url(dir.path()).await);
    latch.ready(&reqwest::Client::new()).await;
    let text = docs_text();
    let listen = latch.base.trim_start_matches("http://");
    let walk = block(&text, "walk-through")
        .replace("127.0.0.1:8080", listen)
        .replace("127.0.0.1:9000", &hooks.addr);
    let steps = steps(&walk);
    assert!(steps.len() >= 10, "the walk-through's commands: {steps:?}");
    let walk_steps = steps;
    let vars = tokio::task::spawn_blocking(move || run_steps(&walk_steps))
        .await
        .unwrap();
    let client = &vars["CLIENT"];

    // The client's secret, to check the signature with (admins read it back).
    let http = reqwest::Client::new();
    let answer: Value = http
        .get(format!("{}/v1/clients/{client}", latch.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let secret = answer["secret"].as_str().expect("the secret").to_string();
    let shown = shown_hook(&block(&text, "walk-through webhook"));
    let last = eventually(30, "the webhook the README shows", || async {
        hooks
            .got()
            .into_iter()
            .find(|h| serde_json::from_slice::<Value>(&h.body).is_ok_and(|b| b["data"] == 0))
    })
    .await;
    if let Err(e) = check_hook(&shown, &last, &secret) {
        panic!("the webhook is not the README's: {e}\n{last:?}");
    }
    // Besides it, at most the change to 1 (superseded otherwise), and nothing else.
    for hook in hooks.got() {
        let body: Value = serde_json::from_slice(&hook.body).unwrap();
        assert!(
            body["data"] == 0 || (body["data"] == 1 && body["previous"].is_null()),
            "{body}"
        );
    }

    // Then a lost sensor and a dark building, on the same latch, with the walk's `B` and
    // `CLIENT` as the reader has them.
    let carried = [("B", latch.base.clone()), ("CLIENT", client.clone())];
    let dark = continued(&text, "walk-through dark", listen, &carried);
    assert!(dark.len() >= 10, "the dark building's commands: {dark:?}");
    tokio::task::spawn_blocking(move || run_steps(&dark))
        .await
        .unwrap();
    let site_lost = eventually(10, "the site's loss at the receiver", || async {
        hooks.got().into_iter().find_map(|h| {
            let body: Value = serde_json::from_slice(&h.body).ok()?;
            (body["type"] == "site.connection_lost").then_some(body)
        })
    })
    .await;
    assert_eq!(site_lost["site"]["id"], "bldg-7", "{site_lost}");

    // Then the book's maintenance window, on that building.
    let window = continued(&text, "maintenance window", listen, &carried);
    assert!(
        window.len() >= 8,
        "the maintenance window's commands: {window:?}"
    );
    tokio::task::spawn_blocking(move || run_steps(&window))
        .await
        .unwrap();

    // Then a door opened at night, escalated and acknowledged.
    let night = continued(&text, "walk-through night", listen, &carried);
    let night = night
        .into_iter()
        .map(|mut s| {
            s.command = s.command.replace("127.0.0.1:9000", &hooks.addr);
            s
        })
        .collect::<Vec<_>>();
    assert!(night.len() >= 10, "the night's commands: {night:?}");
    tokio::task::spawn_blocking(move || run_steps(&night))
        .await
        .unwrap();
    let bodies = |path: &'static str, kind: &'static str| {
        hooks
            .got()
            .into_iter()
            .filter(|h| h.path.ends_with(path))
            .filter_map(|h| serde_json::from_slice::<Value>(&h.body).ok())
            .filter(|b| b["type"] == kind)
            .collect::<Vec<_>>()
    };
    let out = eventually(10, "acme's state_out_of_schedule", || async {
        bodies("/hooks/latch", "sensor.state_out_of_schedule")
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(out["schedule"]["id"], "office", "{out}");
    let up = eventually(10, "the manager's alarm.escalated", || async {
        bodies("/hooks/manager", "alarm.escalated")
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(up["alarm"]["id"], out["alarm_id"], "{up}");
    assert_eq!(
        (&up["level"], &up["from"]),
        (&serde_json::json!(1), &serde_json::json!(client))
    );
    for path in ["/hooks/latch", "/hooks/manager"] {
        let ack = eventually(10, "alarm.acknowledged", || async {
            bodies(path, "alarm.acknowledged").into_iter().next()
        })
        .await;
        assert_eq!(ack["by"], "night manager: Omar", "{path}: {ack}");
    }
}

/// The steps of the block `name`, which goes on from the walk-through: its address made
/// `listen`, and the variables it uses from the walk (`carried`) set first.
fn continued(text: &str, name: &str, listen: &str, carried: &[(&str, String)]) -> Vec<Step> {
    let block = block(text, name).replace("127.0.0.1:8080", listen);
    let mut steps: Vec<Step> = carried
        .iter()
        .map(|(k, v)| Step {
            command: format!("{k}={v}"),
            expect: None,
        })
        .collect();
    steps.extend(self::steps(&block));
    steps
}

/// Every marked block is one a test runs: the walk's here, PostgreSQL's in `pg_ops.rs`.
#[test]
fn every_marked_block_is_run_by_a_test() {
    let run = [
        "walk-through",
        "walk-through webhook",
        "walk-through dark",
        "maintenance window",
        "walk-through night",
        "postgres setup",
        "cluster",
        "postgres restore",
        "postgres schema restore",
    ];
    let text = docs_text();
    let mut found = markers(&text);
    for name in &found {
        block(&text, name);
    }
    found.sort();
    let mut run: Vec<String> = run.iter().map(|s| s.to_string()).collect();
    run.sort();
    assert_eq!(found, run, "the marked blocks of the README and the book");
}

#[test]
fn the_harness_reads_answers_as_the_module_says() {
    let s = steps(
        "B=x\n# a comment\ncurl a \\\n  b\n# → {\"a\": 1,\n#    \"b\": \"x…z\"} 422\ncurl c\n",
    );
    assert_eq!(s.len(), 3);
    assert_eq!(s[1].command, "curl a b");
    assert_eq!(
        s[1].expect.as_deref(),
        Some("{\"a\": 1, \"b\": \"x…z\"} 422")
    );
    assert!(s[2].expect.is_none());
    let (want, status) = answer(s[1].expect.as_deref().unwrap()).unwrap();
    assert_eq!(status, Some(422));
    let ok = serde_json::json!({"a": 1, "b": "xyz", "c": 3});
    assert!(matches(&want, &ok, "t").is_ok());
    let wrong = serde_json::json!({"a": 1, "b": "xy"});
    assert!(matches(&want, &wrong, "t").is_err());
    assert!(matches(&serde_json::json!([1]), &serde_json::json!([1, 2]), "t").is_err());
}
