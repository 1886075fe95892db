//! Issue #49: the `latch` command tells a newcomer how to set it up. `latch serve --help`
//! names the main settings; `latch config` prints the settings a `serve` would run with
//! (the file and the environment applied, secrets masked); `latch config --check` checks
//! them exactly as `serve` does, and fails as `serve` fails.

use std::path::Path;
use std::process::{Command, Output};

/// `latch` with `args`, in `dir` (so no ./latch.toml of the caller's is read), with only
/// the `LATCH_*` variables given.
fn latch(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_latch"));
    cmd.current_dir(dir)
        .args(args)
        .env_clear()
        .env("RUST_BACKTRACE", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("latch runs")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn serve_help_names_the_main_settings() {
    let dir = tempfile::tempdir().unwrap();
    let out = latch(dir.path(), &["serve", "--help"], &[]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for name in [
        "LATCH_LISTEN",
        "127.0.0.1:8080",
        "LATCH_DATA_DIR",
        "./latch-data",
        "LATCH_DATABASE_URL",
        "--config",
        "LATCH_CONFIG",
        "latch config",
        "latch config --check",
    ] {
        assert!(help.contains(name), "no {name} in:\n{help}");
    }
}

#[test]
fn config_prints_the_effective_settings_with_secrets_masked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("my.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:9000\"\nretry_max_attempts = 3\n",
    )
    .unwrap();
    let out = latch(
        dir.path(),
        &["config", "--config", "my.toml"],
        &[
            ("LATCH_DATA_DIR", "/srv/latch"),
            ("LATCH_API_TOKEN", "a-secret-token"),
            ("LATCH_CLICKHOUSE_URL", "http://ch:hunter22@127.0.0.1:8123"),
            // Issue #69: the key that seals every client's secret was printed in clear.
            (
                "LATCH_SECRET_KEY",
                "c2VjcmV0LWtleS1vZi10aGlydHktdHdvLWJ5dGVzLiE=",
            ),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    for line in [
        "listen = \"127.0.0.1:9000\"  # from my.toml",
        "retry_max_attempts = 3  # from my.toml",
        "data_dir = \"/srv/latch\"  # from LATCH_DATA_DIR",
        "api_token = \"***\"  # from LATCH_API_TOKEN",
        "secret_key = \"***\"  # from LATCH_SECRET_KEY",
        "clickhouse_url = \"http://ch:***@127.0.0.1:8123\"  # from LATCH_CLICKHOUSE_URL",
        "retry_base = \"30s\"",
    ] {
        assert!(shown.lines().any(|l| l == line), "no `{line}` in:\n{shown}");
    }
    for secret in ["a-secret-token", "hunter22", "c2VjcmV0LWtleS1vZi10aGlydHk"] {
        assert!(!shown.contains(secret), "{secret} in:\n{shown}");
    }

    // LATCH_CONFIG names the file as --config does; `--defaults` ignores both.
    let out = latch(dir.path(), &["config"], &[("LATCH_CONFIG", "my.toml")]);
    assert!(text(&out.stdout).contains("listen = \"127.0.0.1:9000\"  # from my.toml"));
    let out = latch(
        dir.path(),
        &["config", "--defaults"],
        &[("LATCH_CONFIG", "my.toml")],
    );
    let defaults = text(&out.stdout);
    assert!(
        defaults.contains("\nlisten = \"127.0.0.1:8080\"\n"),
        "{defaults}"
    );
}

/// Arguments before the command, `LATCH_*` variables, and what the error says.
type Case = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[test]
fn config_check_fails_where_serve_fails_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("typo.toml"), "retry_bse = \"5s\"\n").unwrap();
    std::fs::write(dir.path().join("good.toml"), "retry_base = \"5s\"\n").unwrap();
    const KEY: (&str, &str) = (
        "LATCH_SECRET_KEY",
        "c2VjcmV0LWtleS1vZi10aGlydHktdHdvLWJ5dGVzLiE=",
    );
    let cases: [Case; 9] = [
        (&["--config", "typo.toml"], &[], "unknown key `retry_bse`"),
        (
            &[],
            &[("LATCH_RETRY_BSE", "5s")],
            "unknown setting LATCH_RETRY_BSE",
        ),
        (
            &[],
            &[("LATCH_HEARTBEAT_TIMEOUT", "soon")],
            "invalid setting `heartbeat_timeout`",
        ),
        // Refused by the AMQP source's own check, which `serve` makes before it starts.
        (
            &[],
            &[("LATCH_AMQP_URL", "amqps://127.0.0.1:5671/%2f")],
            "amqp",
        ),
        // Issue #70: database settings `serve` refused once it came to connect.
        (
            &[],
            &[
                (
                    "LATCH_DATABASE_URL",
                    "postgres://latch@127.0.0.1:5432/test?sslmode=require",
                ),
                KEY,
            ],
            "sslmode=require",
        ),
        (
            &[],
            &[
                (
                    "LATCH_DATABASE_URL",
                    "postgres://latch@db/latch?sslmode=verify-full",
                ),
                KEY,
            ],
            "sslmode=verify-full",
        ),
        (
            &[],
            &[("LATCH_DATABASE_URL", "mysql://latch@db/latch"), KEY],
            "invalid setting `database_url`",
        ),
        // A value copied from `latch config`, which masks secrets as ***.
        (
            &[],
            &[("LATCH_API_TOKEN", "***")],
            "invalid setting `api_token`",
        ),
        (
            &[],
            &[("LATCH_DATABASE_URL", "postgres://latch:***@db/latch"), KEY],
            "invalid setting `database_url`",
        ),
    ];
    for (args, env, says) in cases {
        let check: Vec<&str> = args.iter().copied().chain(["config", "--check"]).collect();
        let checked = latch(dir.path(), &check, env);
        // Before `serve` runs: one that took these settings would not stop.
        assert!(
            !checked.status.success(),
            "{args:?} {env:?} passed the check"
        );
        let serve: Vec<&str> = args.iter().copied().chain(["serve"]).collect();
        let served = latch(dir.path(), &serve, env);
        let (checked_err, served_err) = (text(&checked.stderr), text(&served.stderr));
        assert!(!served.status.success(), "{args:?} {env:?} started");
        assert!(checked_err.contains(says), "{checked_err}");
        assert_eq!(checked_err, served_err, "the check says what serve says");
        if says.contains('`') {
            let key = says.split('`').nth(1).unwrap();
            assert_eq!(checked_err.matches(key).count(), 1, "{checked_err}");
        }
    }
    // The file given to --check itself.
    let out = latch(dir.path(), &["config", "--check", "typo.toml"], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown key `retry_bse`"));
    let out = latch(dir.path(), &["config", "--check", "good.toml"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("settings ok"));
    // A missing file is an error, not the defaults.
    let out = latch(dir.path(), &["config", "--check", "nowhere.toml"], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("nowhere.toml"));
}

/// Issue #70: a refused setting is one plain message that repeats the value given, even
/// where the shell sets RUST_BACKTRACE=1 (it added a stack backtrace to every error).
#[test]
fn a_refused_setting_is_one_line_that_repeats_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("LATCH_LISTEN", "notanaddress"), ("RUST_BACKTRACE", "1")];
    for command in [&["config", "--check"][..], &["serve"], &["config"]] {
        let out = latch(dir.path(), command, &env);
        assert!(!out.status.success(), "{command:?}");
        let err = text(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{command:?}:\n{err}");
        assert!(!err.to_lowercase().contains("backtrace"), "{err}");
        assert!(
            err.contains("`listen`") && err.contains("notanaddress"),
            "{err}"
        );
    }
}

/// Issue #70: `latch config`'s first line said "the defaults" above values that came from
/// a file and variables.
#[test]
fn config_says_where_its_values_come_from() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("my.toml"), "retry_max_attempts = 3\n").unwrap();
    let first = |args: &[&str], env: &[(&str, &str)]| {
        let out = latch(dir.path(), args, env);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let line = first(
        &["config", "--config", "my.toml"],
        &[("LATCH_DATA_DIR", "/srv/latch")],
    );
    assert!(line.starts_with("# "), "{line}");
    assert!(
        line.contains("my.toml") && line.contains("LATCH_DATA_DIR"),
        "{line}"
    );
    assert!(
        !line.ends_with("the defaults, embedded in the binary."),
        "{line}"
    );
    let line = first(&["config"], &[]);
    assert!(line.contains("the defaults"), "nothing set: {line}");
}

/// Issue #46: mimalloc's arenas backed by transparent huge pages kept the memory it freed
/// resident (RSS grew by a fifth over a million deliveries while the heap in use stayed
/// flat), so `latch` turns them off for its own process.
#[tokio::test]
async fn serve_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let p = crate::utils::Process::start(&dir.path().join("data"), None);
    p.alive(&reqwest::Client::new()).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid())).unwrap();
    // Linux 5.0 and later say it there; an older kernel says nothing to check.
    if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
        assert_eq!(line.split_whitespace().nth(1), Some("0"), "{status}");
    }
}
