//! Every body latch sends, held to its schema in the event catalog
//! ([`latch::delivery::catalog`]): the test receiver checks each request and the tests'
//! broker subscribers each message, so a field added to a body without its schema fails
//! the test that saw it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;

use latch::delivery::catalog::catalog;

/// Each type's schema, compiled once, with `format` checked (`date-time`).
static VALIDATORS: LazyLock<HashMap<&'static str, jsonschema::Validator>> = LazyLock::new(|| {
    catalog()
        .iter()
        .map(|t| {
            let v = jsonschema::draft202012::options()
                .should_validate_formats(true)
                .build(&t.schema)
                .unwrap_or_else(|e| panic!("the schema of {} does not compile: {e}", t.kind));
            (t.kind, v)
        })
        .collect()
});

/// Checks one body as latch sent it: `Err` says what is wrong, naming its type.
pub fn check_body(raw: &[u8]) -> Result<(), String> {
    let body: Value = serde_json::from_slice(raw).map_err(|e| {
        format!(
            "a body that is not JSON ({e}): {}",
            String::from_utf8_lossy(raw)
        )
    })?;
    let kind = body["type"].as_str().unwrap_or_default();
    let errors = errors(kind, &body)?;
    if errors.is_empty() {
        return Ok(());
    }
    // A batch's `oneOf` says only that an event matched no type: name the event and what
    // its own type's schema finds.
    let mut found = Vec::new();
    if let Some(events) = body["events"].as_array().filter(|_| kind == "batch") {
        for (i, e) in events.iter().enumerate() {
            let k = e["type"].as_str().unwrap_or_default();
            match self::errors(k, e) {
                Ok(es) if es.is_empty() => {}
                Ok(es) => found.push(format!("events[{i}] ({k}): {}", es.join("; "))),
                Err(e) => found.push(format!("events[{i}]: {e}")),
            }
        }
    }
    if found.is_empty() {
        found = errors;
    }
    Err(format!(
        "a {kind:?} body breaks its schema in the event catalog: {}\nbody: {body}",
        found.join("; ")
    ))
}

fn errors(kind: &str, body: &Value) -> Result<Vec<String>, String> {
    let v = VALIDATORS
        .get(kind)
        .ok_or_else(|| format!("a body of type {kind:?}, which the event catalog lacks: {body}"))?;
    Ok(v.iter_errors(body)
        .map(|e| match e.instance_path().to_string() {
            p if p.is_empty() => format!("{e}"),
            p => format!("{e} (at {p})"),
        })
        .collect())
}

/// Panics unless the body is valid under its type's schema ([`check_body`]).
pub fn assert_body(raw: &[u8]) {
    if let Err(e) = check_body(raw) {
        panic!("{e}");
    }
}

/// What a server task found wrong in the bodies it got. A panic there would end only
/// its own request, so it keeps them for the test: [`Violations::assert_none`] when the
/// test reads what was received, and a [`Watch`] when the test lets go of the receiver.
#[derive(Clone, Default)]
pub struct Violations(Arc<Mutex<Vec<String>>>);

impl Violations {
    /// Checks a body, keeping what is wrong with it.
    pub fn check(&self, raw: &[u8]) {
        if let Err(e) = check_body(raw) {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        }
    }

    /// Panics with every violation found so far.
    pub fn assert_none(&self) {
        let found = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert!(
            found.is_empty(),
            "{} body(ies) latch sent broke the event catalog:\n{}",
            found.len(),
            found.join("\n")
        );
    }
}

/// Held by the test's handles of a receiver, never by its server: when the last is
/// dropped (the test ends), any violation fails the test, unless it fails already.
pub struct Watch(pub Violations);

impl Drop for Watch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.0.assert_none();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_a_field_no_schema_lists_is_named_by_type() {
        let example = |kind: &str| {
            catalog()
                .iter()
                .find(|t| t.kind == kind)
                .unwrap()
                .example
                .clone()
        };
        for t in catalog() {
            check_body(t.example.to_string().as_bytes()).unwrap();
        }
        let mut lost = example("sensor.connection_lost");
        lost["colour"] = "closed".into();
        let e = check_body(lost.to_string().as_bytes()).unwrap_err();
        assert!(
            e.contains("sensor.connection_lost") && e.contains("colour"),
            "{e}"
        );

        let mut batch = example("batch");
        batch["events"][1]["colour"] = "closed".into();
        let e = check_body(batch.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("events[1] (sensor.connection_lost)"), "{e}");
        assert!(check_body(br#"{"type": "sensor.exploded"}"#).is_err());
        assert!(check_body(b"not json").is_err());

        let found = Violations::default();
        found.check(lost.to_string().as_bytes());
        let kept = found.clone();
        let watched = std::panic::catch_unwind(move || drop(Watch(kept)));
        assert!(watched.is_err(), "a watch let a violation go");
    }
}
