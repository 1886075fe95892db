//! Issue #70: what the README and the book tell an operator is what latch does. Line
//! references to the README's Quick start point at the line that does what they say, and
//! the bounds the pages give for a setting or a field are the ones the code takes.

use std::process::Command;

use serde_json::json;

use crate::readme::docs_text;
use crate::utils::{TestServer, unique};

/// The lines of Quick start's first code block.
fn quick_start(text: &str) -> Vec<String> {
    let at = text.find("## Quick start").expect("a Quick start");
    text[at..]
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(str::to_string)
        .collect()
}

#[test]
fn quick_start_line_references_name_the_line_that_lets_loopback_through() {
    let text = docs_text();
    let lines = quick_start(&text);
    let ordinals = ["first", "second", "third", "fourth", "fifth"];
    let re = regex::Regex::new(r"as in the (\w+)\s+line").unwrap();
    let mut seen = 0;
    for m in re.captures_iter(&text) {
        let n = ordinals
            .iter()
            .position(|o| *o == &m[1])
            .unwrap_or_else(|| panic!("{:?}", &m[0]));
        assert!(
            lines[n].contains("LATCH_DELIVERY_ALLOW_NETS=127.0.0.0/8"),
            "{:?} is: {}",
            &m[0],
            lines[n]
        );
        seen += 1;
    }
    assert!(seen >= 2, "the references were read");
}

#[tokio::test]
async fn the_heartbeat_timeout_bounds_the_pages_give_are_the_api_s() {
    let text = docs_text();
    let re = regex::Regex::new(r"`heartbeat_timeout_s` is (\d+) to (\d+)").unwrap();
    let given: Vec<(u64, u64)> = re
        .captures_iter(&text)
        .map(|m| (m[1].parse().unwrap(), m[2].parse().unwrap()))
        .collect();
    let (lo, hi) = *given
        .first()
        .expect("the pages give heartbeat_timeout_s's bounds");
    assert!(
        given.iter().all(|g| *g == (lo, hi)),
        "the pages give heartbeat_timeout_s's bounds one way: {given:?}"
    );
    let s = TestServer::start().await;
    for (t, taken) in [(lo, true), (hi, true), (lo - 1, false), (hi + 1, false)] {
        let body = json!({"id": unique("hb"), "address": "x", "heartbeat_timeout_s": t});
        let (st, answer) = s.post("/v1/sensors", body).await;
        assert_eq!(st.is_success(), taken, "{t}: {answer}");
    }
}

/// The sites page says "`site_grace` is `LO` to `HI`; `0s`: …": both bounds are taken,
/// past the upper one is refused, and what the lower one means is said.
#[test]
fn the_site_grace_bounds_the_pages_give_are_the_settings() {
    let text = docs_text();
    let re = regex::Regex::new(r"`site_grace` is `(\w+)` to `(\w+)`([^\n]*)").unwrap();
    let found: Vec<_> = re.captures_iter(&text).collect();
    assert_eq!(found.len(), 1, "the pages give site_grace's bounds once");
    let m = &found[0];
    let dir = tempfile::tempdir().unwrap();
    let check = |grace: &str| {
        Command::new(env!("CARGO_BIN_EXE_latch"))
            .current_dir(dir.path())
            .args(["config", "--check"])
            .env_clear()
            .env("LATCH_SITE_GRACE", grace)
            .output()
            .unwrap()
    };
    for grace in [&m[1], &m[2]] {
        let out = check(grace);
        assert!(out.status.success(), "{grace}: {out:?}");
    }
    let out = check("1h 1s");
    assert!(!out.status.success(), "past the bound: {out:?}");
    assert!(
        m[3].contains("`0s`:") || m[1] != *"0s",
        "what 0s means is said: {}",
        &m[0]
    );
}
