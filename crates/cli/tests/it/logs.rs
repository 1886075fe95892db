//! What `latch serve` writes to stdout: a line a record, as a person or a log shipper
//! reads it.

use crate::utils::Process;

/// Starts a `latch serve` with `format`, waits until it serves, stops it, and returns its
/// log.
async fn log_of(format: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = Process::start_env(
        dir.path(),
        None,
        &[
            ("LATCH_LOG", "info".to_string()),
            ("LATCH_LOG_FORMAT", format.to_string()),
        ],
    );
    p.ready(&reqwest::Client::new()).await;
    let clean = p.terminate().await;
    let log = std::fs::read_to_string(dir.path().join("latch.log")).unwrap();
    assert!(clean, "latch stops cleanly on SIGTERM:\n{log}");
    log
}

#[tokio::test]
async fn json_logs_are_one_object_a_line() {
    let log = log_of("json").await;
    let records: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        records
            .iter()
            .any(|r| r["message"] == "latch is serving." && r["level"] == "INFO"),
        "the start is logged as an object with its message and level:\n{log}"
    );
    assert!(
        records.iter().any(|r| r["message"] == "latch stopped."),
        "{log}"
    );
}

#[tokio::test]
async fn text_logs_to_a_file_carry_no_colour_codes() {
    let log = log_of("text").await;
    assert!(log.contains("latch is serving."), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "no terminal escapes in a file:\n{log:?}"
    );
}
