//! The event catalog (issue #75): for every body latch sends — each [`EventKind`],
//! `client.test` and the `batch` envelope — a JSON Schema (draft 2020-12) and an example.
//! `GET /v1/event-types` serves it, the OpenAPI document repeats it under `webhooks`, and
//! the integration tests hold every body a receiver gets to it.
//!
//! The examples are built by [`super::attempt`]'s own body builders (and the site decision's)
//! from sample notifications, so they cannot drift from what is sent; every object in a
//! schema has `additionalProperties: false`, so a field added to a body fails the tests
//! until its schema lists it.
//!
//! No schema uses `$ref`: the OpenAPI document embeds them, and there a `#/$defs/…`
//! reference would resolve against the document's root, not the schema's. Parts shared by
//! several types are functions here instead, inlined into each.

use std::sync::LazyLock;

use serde_json::{Map, Value, json};

use super::attempt::{body, envelope, test_payload};
use crate::domain::alarm::{Alarm, AlarmKind, AlarmState, ack_body};
use crate::domain::notification::{BATCH, CLIENT_TEST};
use crate::domain::sensor::{Labels, MAX_ID_LEN};
use crate::domain::signals::Fault;
use crate::domain::site::Site;
use crate::domain::site::decide::{Linked, Member, site_loss, site_return};
use crate::domain::{Connection, Detail, EventKind, Millis, Notification, SensorId, Status};

/// One type of body.
#[derive(Debug, Clone)]
pub struct BodyType {
    /// Its `type`.
    pub kind: &'static str,
    /// What it tells, in one line.
    pub description: &'static str,
    /// Its JSON Schema, whole in itself.
    pub schema: Value,
    /// One, as latch builds it.
    pub example: Value,
}

/// Every type of body, the sensors' and sites' first (in [`EventKind::ALL`]'s order).
pub fn catalog() -> &'static [BodyType] {
    static CATALOG: LazyLock<Vec<BodyType>> = LazyLock::new(|| {
        let mut all: Vec<BodyType> = EventKind::ALL
            .iter()
            .map(|&k| entry(k.as_str(), k.description(), event_schema(k), example(k)))
            .collect();
        all.push(entry(
            CLIENT_TEST,
            "A test sent on request (POST /v1/clients/{id}/test), whatever the client's events; about no sensor.",
            client_test_schema(),
            client_test_example(),
        ));
        all.push(entry(
            BATCH,
            "Several notifications in one request, to a client with batch set: each event exactly the body it would have had alone.",
            batch_schema(),
            batch_example(),
        ));
        all
    });
    &CATALOG
}

/// The schema of the body whose `type` is `kind`.
pub fn schema_of(kind: &str) -> Option<&'static Value> {
    catalog().iter().find(|t| t.kind == kind).map(|t| &t.schema)
}

fn entry(kind: &'static str, description: &'static str, schema: Value, example: Value) -> BodyType {
    let mut root = Map::new();
    root.insert(
        "$schema".into(),
        json!("https://json-schema.org/draft/2020-12/schema"),
    );
    root.insert("title".into(), json!(kind));
    if let Value::Object(s) = schema {
        root.extend(s);
    }
    BodyType {
        kind,
        description,
        schema: Value::Object(root),
        example,
    }
}

/// An object that has exactly `properties`, `required` of them always.
fn object(description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "description": description,
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// A notification id, or a batch's: a ULID.
fn ulid(description: &str) -> Value {
    json!({"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$", "description": description})
}

fn time(description: &str) -> Value {
    json!({"type": "string", "format": "date-time", "description": description})
}

fn time_or_null(description: &str) -> Value {
    json!({"type": ["string", "null"], "format": "date-time", "description": description})
}

fn sensor_id() -> Value {
    json!({"type": "string", "pattern": format!("^[A-Za-z0-9]{{1,{MAX_ID_LEN}}}$")})
}

/// A sensor's state: 0 or 1, `null` when it has none.
fn state(description: &str) -> Value {
    json!({"enum": [0, 1, null], "description": description})
}

fn kind_const(kind: &str) -> Value {
    json!({"const": kind})
}

/// The body of a notification of `kind`, without `$schema` (a batch's events embed it).
fn event_schema(kind: EventKind) -> Value {
    match kind {
        EventKind::SiteConnectionLost | EventKind::SiteConnectionRestored => site_schema(kind),
        EventKind::AlarmAcknowledged => ack_schema(),
        EventKind::AlarmEscalated => escalated_schema(),
        _ => sensor_schema(kind),
    }
}

/// The id of the alarm a notification opens, reminds of or clears.
fn alarm_id() -> Value {
    ulid(
        "The alarm it opens, reminds of or clears (GET /v1/alarms/{id}); absent when it belongs to none.",
    )
}

/// The alarm an acknowledgement or an escalation is about.
fn alarm_object(description: &str) -> Value {
    let kinds: Vec<&str> = AlarmKind::ALL.iter().map(|k| k.as_str()).collect();
    object(
        description,
        json!({"id": ulid("The alarm's id."), "kind": {"enum": kinds},
               "sensor_id": sensor_id(), "site_id": {"type": "string"},
               "opened_at": time("When it opened.")}),
        &["id", "kind", "opened_at"],
    )
}

/// `alarm.escalated` (`domain::escalation::escalated_body`).
fn escalated_schema() -> Value {
    object(
        EventKind::AlarmEscalated.description(),
        json!({
            "id": ulid("The notification's id, also its webhook-id."),
            "type": kind_const(EventKind::AlarmEscalated.as_str()),
            "occurred_at": time("When it escalated."),
            "alarm": alarm_object("The alarm nobody took."),
            "level": {"type": "integer", "minimum": 1, "maximum": crate::domain::escalation::MAX_LEVELS,
                      "description": "1 for the first step of the chain, then each step after."},
            "from": {"type": "string", "description": "The client it was sent to before (its id)."},
        }),
        &["id", "type", "occurred_at", "alarm", "level", "from"],
    )
}

/// `alarm.acknowledged` (`domain::alarm::ack_body`).
fn ack_schema() -> Value {
    let alarm = alarm_object("The alarm acknowledged.");
    object(
        EventKind::AlarmAcknowledged.description(),
        json!({
            "id": ulid("The notification's id, also its webhook-id."),
            "type": kind_const(EventKind::AlarmAcknowledged.as_str()),
            "occurred_at": time("When it was acknowledged."),
            "alarm": alarm,
            "by": {"type": "string", "description": "Who acknowledged it."},
            "note": {"type": ["string", "null"], "description": "Their note."},
        }),
        &["id", "type", "occurred_at", "alarm", "by", "note"],
    )
}

/// A sensor's own notification (`attempt::Payload`).
fn sensor_schema(kind: EventKind) -> Value {
    let mut p = Map::new();
    p.insert(
        "id".into(),
        ulid("The notification's id, also its webhook-id: the same on every attempt."),
    );
    p.insert("type".into(), kind_const(kind.as_str()));
    p.insert("occurred_at".into(), time("When it happened."));
    // A state change names the `out_of_schedule` alarm it resolves.
    p.insert("alarm_id".into(), alarm_id());
    p.insert(
        "sensor".into(),
        object(
            "The sensor.",
            json!({"id": sensor_id(), "address": {"type": "string"}}),
            &["id", "address"],
        ),
    );
    let label = |what: &str| {
        json!({"type": "string", "maxLength": crate::domain::sensor::LABEL_MAX_CHARS,
               "description": format!("The sensor's label of {what} (only when its labels name it).")})
    };
    if kind.is_signal() {
        let mut required = vec!["id", "type", "occurred_at", "sensor"];
        let percent = |description: &str| json!({"type": "integer", "minimum": 0, "maximum": 100, "description": description});
        match kind {
            EventKind::BatteryLow => {
                p.insert(
                    "battery".into(),
                    percent("The battery reported, in percent."),
                );
                p.insert(
                    "threshold".into(),
                    percent("The sensor's battery_low_pct it fell to or below."),
                );
                required.extend(["battery", "threshold"]);
            }
            EventKind::BatteryOk => {
                p.insert(
                    "battery".into(),
                    percent("The battery reported, in percent."),
                );
                required.push("battery");
            }
            EventKind::Fault => {
                p.insert(
                    "fault".into(),
                    json!({"type": "string", "pattern": "^[a-z0-9_]{1,32}$",
                           "description": "The fault code reported."}),
                );
                required.push("fault");
            }
            _ => {}
        }
        return object(kind.description(), Value::Object(p), &required);
    }
    p.insert("label".into(), label("data"));
    let mut required = vec!["id", "type", "occurred_at", "sensor", "data", "previous"];
    match kind {
        EventKind::StateChanged => {
            p.insert("data".into(), state("The new state."));
            p.insert(
                "previous".into(),
                state("The state before; null for the sensor's first."),
            );
            p.insert("previous_label".into(), label("previous"));
            p.insert(
                "flips_suppressed".into(),
                json!({"type": "integer", "minimum": 0,
                       "description": "Readings a debounce window held back whose value differed from the one before (0 without debounce)."}),
            );
            required.push("flips_suppressed");
        }
        EventKind::StateHeld => {
            p.insert("data".into(), state("The state held."));
            p.insert(
                "previous".into(),
                json!({"type": "null", "description": "Always null: not a change of state."}),
            );
            p.insert(
                "since".into(),
                time("When the state began to hold, by latch's clock."),
            );
            p.insert("held_s".into(), held_s());
            p.insert(
                "reminder".into(),
                json!({"type": "integer", "minimum": 1,
                       "description": "Absent on the first; on a reminder, the reminder intervals passed since the first."}),
            );
            required.extend(["since", "held_s"]);
        }
        EventKind::Flapping => {
            p.insert("data".into(), state("The state when it began to flap."));
            p.insert(
                "previous".into(),
                json!({"type": "null", "description": "Always null: not a change of state."}),
            );
            p.insert(
                "changes".into(),
                json!({"type": "integer", "minimum": 2, "maximum": 100,
                       "description": "The sensor's flap.changes: this many changes within window_s are flapping."}),
            );
            p.insert(
                "window_s".into(),
                json!({"type": "integer", "minimum": 10, "maximum": 3600,
                       "description": "The sensor's flap.window_s, in seconds."}),
            );
            required.extend(["changes", "window_s"]);
        }
        EventKind::FlappingStopped => {
            p.insert("data".into(), state("The state now."));
            p.insert(
                "previous".into(),
                state("The state last told: the flapping's."),
            );
            p.insert("previous_label".into(), label("previous"));
        }
        EventKind::StateOutOfSchedule => {
            p.insert(
                "data".into(),
                state("The state it became: the sensor's armed.data."),
            );
            p.insert(
                "previous".into(),
                state("The state before; null for the sensor's first."),
            );
            p.insert("previous_label".into(), label("previous"));
            p.insert(
                "schedule".into(),
                object(
                    "The schedule of the sensor's armed, as it was named then.",
                    json!({"id": {"type": "string"}, "name": {"type": "string"}}),
                    &["id", "name"],
                ),
            );
            required.push("schedule");
        }
        EventKind::StateHeldCleared => {
            p.insert("data".into(), state("The state now."));
            p.insert("previous".into(), state("The state that was held."));
            p.insert("previous_label".into(), label("previous"));
            p.insert("held_s".into(), held_s());
            required.push("held_s");
        }
        _ => {
            p.insert("data".into(), state("The sensor's last known state."));
            p.insert(
                "previous".into(),
                json!({"type": "null", "description": "Always null: not a change of state."}),
            );
            p.insert(
                "last_seen_at".into(),
                time("When latch last heard from the sensor (absent when it never did)."),
            );
        }
    }
    if kind == EventKind::StillLost {
        p.insert(
            "lost_since".into(),
            time("When the sensor was declared lost."),
        );
        p.insert(
            "reminder".into(),
            json!({"type": "integer", "minimum": 1,
                   "description": "1 for the first reminder, then the reminder intervals the sensor has been lost."}),
        );
        required.extend(["lost_since", "reminder"]);
    }
    object(kind.description(), Value::Object(p), &required)
}

/// Seconds a state held, in a hold's bodies.
fn held_s() -> Value {
    json!({"type": "integer", "minimum": 0,
           "description": "Seconds the state held, by latch's clock."})
}

/// A site's notification (`decide::site_loss`, `decide::site_return`).
fn site_schema(kind: EventKind) -> Value {
    let nullable = json!({"type": ["string", "null"]});
    let site = object(
        "The site.",
        json!({"id": {"type": "string"}, "name": nullable, "address": nullable}),
        &["id", "name", "address"],
    );
    let mut p = Map::new();
    p.insert(
        "id".into(),
        ulid("The notification's id, also its webhook-id."),
    );
    p.insert("type".into(), kind_const(kind.as_str()));
    p.insert(
        "occurred_at".into(),
        time("When the site's decision was made."),
    );
    p.insert("site".into(), site);
    p.insert("alarm_id".into(), alarm_id());
    let required: &[&str] = if kind == EventKind::SiteConnectionLost {
        let lost = object(
            "One of the receiver's sensors of the site, lost.",
            json!({"id": sensor_id(), "address": {"type": "string"},
                   "data": state("Its last known state."),
                   "last_seen_at": time_or_null("When latch last heard from it.")}),
            &["id", "address", "data", "last_seen_at"],
        );
        p.insert(
            "sensors".into(),
            json!({"type": "array", "items": lost, "minItems": 1,
                   "description": "The receiver's lost sensors of the site."}),
        );
        p.insert(
            "sensors_total".into(),
            json!({"type": "integer", "minimum": 1,
                   "description": "How many of the receiver's sensors the site has."}),
        );
        &[
            "id",
            "type",
            "occurred_at",
            "site",
            "sensors",
            "sensors_total",
        ]
    } else {
        let back = object(
            "A sensor back.",
            json!({"id": sensor_id(), "data": state("Its state now.")}),
            &["id", "data"],
        );
        let still = object(
            "A sensor still lost.",
            json!({"id": sensor_id(), "last_seen_at": time_or_null("When latch last heard from it.")}),
            &["id", "last_seen_at"],
        );
        p.insert(
            "restored".into(),
            json!({"type": "array", "items": back,
                   "description": "The receiver's sensors the site's loss named that are back."}),
        );
        p.insert(
            "still_lost".into(),
            json!({"type": "array", "items": still,
                   "description": "Those still lost."}),
        );
        &[
            "id",
            "type",
            "occurred_at",
            "site",
            "restored",
            "still_lost",
        ]
    };
    object(kind.description(), Value::Object(p), required)
}

fn client_test_schema() -> Value {
    object(
        "A test notification.",
        json!({
            "id": ulid("A new id for each test."),
            "type": kind_const(CLIENT_TEST),
            "occurred_at": time("When it was sent."),
            "client": object(
                "The client it was sent to.",
                json!({"id": {"type": "string"}, "name": {"type": "string"}}),
                &["id", "name"],
            ),
        }),
        &["id", "type", "occurred_at", "client"],
    )
}

fn batch_schema() -> Value {
    let events: Vec<Value> = EventKind::ALL.iter().map(|&k| event_schema(k)).collect();
    object(
        "A batch of notifications.",
        json!({
            "id": ulid("The batch's id, its webhook-id: a retry of the batch carries the same."),
            "type": kind_const(BATCH),
            "events": {
                "type": "array",
                "minItems": 1,
                "items": {"oneOf": events},
                "description": "The notifications, each with its own id and type, in order per sensor.",
            },
        }),
        &["id", "type", "events"],
    )
}

// The examples: sample notifications through the builders that make the bodies sent.

const AT: Millis = 1_795_860_000_123; // 2026-11-28T10:00:00.123Z
const MINUTE: Millis = 60_000;
const ADDRESS: &str = "Moscow, Russia, Svobody st. 23 fl 1 room 16";

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).expect("a sample sensor id")
}

fn sample(id: &str, kind: EventKind, data: Option<bool>, previous: Option<bool>) -> Notification {
    Notification {
        id: id.into(),
        seq: 1,
        client_id: "01JD0Y2ZCLIENT0000000000AA".into(),
        sensor_id: sid("xa7v9Dfadr7H"),
        kind,
        data,
        previous,
        occurred_at: AT,
        last_seen_at: None,
        detail: Detail::default(),
        status: Status::Pending,
        attempts: 0,
        next_attempt_at: None,
        created_at: AT,
        updated_at: AT,
        batch_id: None,
        body: None,
        alarm_id: None,
    }
}

fn parsed(bytes: Vec<u8>) -> Value {
    serde_json::from_slice(&bytes).expect("a body is JSON")
}

/// A notification of `kind`, as built to be sent.
fn example_notification(kind: EventKind) -> Notification {
    let id = "01JD0Y3Q6T3S8W0KZ9X7M2V4QH";
    let heard = Some(AT - 90 * MINUTE);
    match kind {
        EventKind::StateChanged => sample(id, kind, Some(true), Some(false)),
        EventKind::ConnectionLost | EventKind::ConnectionRestored => Notification {
            last_seen_at: heard,
            ..sample(id, kind, Some(true), None)
        },
        EventKind::StillLost => Notification {
            last_seen_at: heard,
            detail: Detail {
                lost_since: Some(AT - 30 * MINUTE),
                reminder: Some(2),
                ..Detail::default()
            },
            ..sample(id, kind, Some(true), None)
        },
        EventKind::SiteConnectionLost | EventKind::SiteConnectionRestored => site_example(kind),
        EventKind::BatteryLow | EventKind::BatteryOk | EventKind::Fault => Notification {
            detail: Detail {
                battery: (kind != EventKind::Fault).then_some(match kind {
                    EventKind::BatteryLow => 18,
                    _ => 95,
                }),
                threshold: (kind == EventKind::BatteryLow).then_some(20),
                fault: (kind == EventKind::Fault)
                    .then(|| Fault::parse("lock_jam").expect("a sample fault code")),
                ..Detail::default()
            },
            ..sample(id, kind, None, None)
        },
        EventKind::Tamper | EventKind::TamperCleared | EventKind::FaultCleared => {
            sample(id, kind, None, None)
        }
        // Open since 15 minutes, held past 5, reminded every 5: the second reminder.
        EventKind::StateHeld => Notification {
            detail: Detail {
                lost_since: Some(AT - 15 * MINUTE),
                reminder: Some(2),
                ..Detail::default()
            },
            ..sample(id, kind, Some(true), None)
        },
        EventKind::StateHeldCleared => Notification {
            detail: Detail {
                lost_since: Some(AT - 20 * MINUTE),
                ..Detail::default()
            },
            ..sample(id, kind, Some(false), Some(true))
        },
        EventKind::Flapping => Notification {
            detail: Detail {
                threshold: Some(6),
                window_s: Some(60),
                ..Detail::default()
            },
            ..sample(id, kind, Some(true), None)
        },
        EventKind::FlappingStopped => sample(id, kind, Some(false), Some(true)),
        // The front door opened at 02:10, out of office hours.
        EventKind::StateOutOfSchedule => Notification {
            body: Some(r#"{"id":"office","name":"Office hours"}"#.into()),
            alarm_id: Some(EXAMPLE_ALARM.into()),
            ..sample(id, kind, Some(true), Some(false))
        },
        EventKind::AlarmEscalated => {
            let alarm = Alarm {
                id: EXAMPLE_ALARM.into(),
                kind: AlarmKind::OutOfSchedule,
                sensor_id: Some(sid("xa7v9Dfadr7H")),
                site_id: None,
                state: AlarmState::Open,
                opened_at: AT - 10 * MINUTE,
                acknowledged_at: None,
                acknowledged_by: None,
                note: None,
                resolved_at: None,
            };
            Notification {
                body: Some(crate::domain::escalation::escalated_body(
                    &alarm,
                    1,
                    "01JD0Y2ZCLIENT0000000000AA",
                )),
                alarm_id: Some(alarm.id),
                ..sample(id, kind, None, None)
            }
        }
        EventKind::AlarmAcknowledged => {
            let alarm = Alarm {
                id: EXAMPLE_ALARM.into(),
                kind: AlarmKind::StateHeld,
                sensor_id: Some(sid("xa7v9Dfadr7H")),
                site_id: None,
                state: AlarmState::Acknowledged,
                opened_at: AT - 10 * MINUTE,
                acknowledged_at: Some(AT),
                acknowledged_by: Some("night desk: Anna".into()),
                note: Some("guard sent to check the door".into()),
                resolved_at: None,
            };
            Notification {
                body: Some(ack_body(&alarm)),
                alarm_id: Some(alarm.id),
                ..sample(id, kind, None, None)
            }
        }
    }
}

/// The alarm of the examples that belong to one.
const EXAMPLE_ALARM: &str = "01JD0Y3Q6T3S8W0KZ9X7M2V4AA";

/// The labels of the examples' sensor.
fn labels() -> Labels {
    Labels {
        zero: Some("closed".into()),
        one: Some("open".into()),
    }
}

fn example(kind: EventKind) -> Value {
    let mut n = example_notification(kind);
    if kind != EventKind::StateChanged && n.alarm_id.is_none() && !kind.is_site() {
        n.alarm_id = Some(EXAMPLE_ALARM.into());
    }
    parsed(body(&n, ADDRESS, &labels()))
}

/// A site down with two of a client's three sensors lost, or back with one of them.
fn site_example(kind: EventKind) -> Notification {
    let site = Site {
        id: "bldg-7".into(),
        name: Some("Svobody 23".into()),
        address: Some("Moscow, Russia, Svobody st. 23".into()),
        gateway_sensor_id: None,
        created_at: 0,
        updated_at: 0,
    };
    let member = |id: &str, room: u32, connection| Member {
        id: sid(id),
        address: format!("Moscow, Russia, Svobody st. 23 fl 1 room {room}"),
        connection,
        data: Some(true),
        last_seen_at: Some(AT - 90 * MINUTE),
    };
    let lost = kind == EventKind::SiteConnectionLost;
    let first = match lost {
        true => Connection::Lost,
        false => Connection::Online,
    };
    let members = [
        member("xa7v9Dfadr7H", 16, first),
        member("b3TqL0w2ZkP1", 17, Connection::Lost),
        member("Qm8sE4rVn6Yc", 18, Connection::Online),
    ];
    let client = Linked {
        client_id: "01JD0Y2ZCLIENT0000000000AA".into(),
        events: None,
        sensors: members.iter().map(|m| m.id).collect(),
    };
    let named = [members[0].id, members[1].id];
    let made = match lost {
        true => site_loss(&site, &members, &client, &named, AT),
        false => site_return(&site, &members, &client, &named, AT),
    };
    Notification {
        sensor_id: made.event.sensor_id,
        body: made.body,
        ..sample("01JD0Y3Q6T3S8W0KZ9X7M2V4QJ", kind, None, None)
    }
}

fn client_test_example() -> Value {
    parsed(test_payload(
        "01JD0Y3Q6T3S8W0KZ9X7M2V4QK",
        "01JD0Y2ZCLIENT0000000000AA",
        "Front desk",
        AT,
    ))
}

fn batch_example() -> Value {
    let changed = example_notification(EventKind::StateChanged);
    let lost = Notification {
        id: "01JD0Y3Q6T3S8W0KZ9X7M2V4QM".into(),
        occurred_at: AT + MINUTE,
        ..example_notification(EventKind::ConnectionLost)
    };
    let events = [changed, lost].map(|n| body(&n, ADDRESS, &labels()));
    parsed(envelope(
        "01JD0Y3Q6T3S8W0KZ9X7M2V4QN",
        events.len(),
        events.into_iter(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validator(schema: &Value) -> jsonschema::Validator {
        jsonschema::draft202012::meta::validate(schema)
            .unwrap_or_else(|e| panic!("not a draft 2020-12 schema: {e}"));
        jsonschema::draft202012::options()
            .should_validate_formats(true)
            .build(schema)
            .expect("a schema compiles")
    }

    fn errors(schema: &Value, body: &Value) -> Vec<String> {
        validator(schema)
            .iter_errors(body)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect()
    }

    #[test]
    fn every_type_is_listed_once_each_example_of_its_own_type() {
        let kinds: Vec<&str> = catalog().iter().map(|t| t.kind).collect();
        let mut expected: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        expected.extend([CLIENT_TEST, BATCH]);
        assert_eq!(kinds, expected);
        for t in catalog() {
            assert_eq!(t.example["type"], t.kind, "{}", t.example);
            assert!(!t.description.is_empty() && !t.description.contains('\n'));
        }
    }

    #[test]
    fn each_example_is_valid_under_its_own_schema() {
        for t in catalog() {
            let errors = errors(&t.schema, &t.example);
            assert!(errors.is_empty(), "{}: {errors:?}\n{}", t.kind, t.example);
        }
    }

    /// The schemas can fail: a field no schema lists, one missing, a wrong value, and a
    /// batch with a bad event are each refused.
    #[test]
    fn a_body_unlike_its_schema_is_refused() {
        let changed = schema_of("sensor.state_changed").unwrap();
        let good = example(EventKind::StateChanged);
        let mut extra = good.clone();
        extra["colour"] = json!("open");
        assert!(
            !errors(changed, &extra).is_empty(),
            "an unlisted field passed"
        );
        let mut nested = good.clone();
        nested["sensor"]["site_id"] = json!("bldg-7");
        assert!(
            !errors(changed, &nested).is_empty(),
            "an unlisted nested field passed"
        );
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove("flips_suppressed");
        assert!(
            !errors(changed, &missing).is_empty(),
            "a missing field passed"
        );
        let mut wrong = good.clone();
        wrong["data"] = json!(2);
        assert!(!errors(changed, &wrong).is_empty(), "data 2 passed");
        let mut late = good.clone();
        late["occurred_at"] = json!("yesterday");
        assert!(
            !errors(changed, &late).is_empty(),
            "a time that is none passed"
        );

        let batch = schema_of(BATCH).unwrap();
        let mut bad = batch_example();
        bad["events"][1]["extra"] = json!(1);
        assert!(
            !errors(batch, &bad).is_empty(),
            "a batch with a bad event passed"
        );
        let mut empty = batch_example();
        empty["events"] = json!([]);
        assert!(!errors(batch, &empty).is_empty(), "an empty batch passed");
    }

    /// A state change a silence's end made carries the sensor's `last_seen_at` in the
    /// outbox; its body, like any state change's, does not.
    #[test]
    fn a_state_change_body_never_carries_last_seen_at() {
        let n = Notification {
            last_seen_at: Some(AT - MINUTE),
            ..example_notification(EventKind::StateChanged)
        };
        let sent = parsed(body(&n, ADDRESS, &Labels::default()));
        assert!(sent.get("last_seen_at").is_none(), "{sent}");
        assert!(errors(schema_of("sensor.state_changed").unwrap(), &sent).is_empty());
    }

    #[test]
    fn labels_follow_data_and_previous_and_signals_carry_no_state() {
        let changed = example(EventKind::StateChanged);
        assert_eq!(
            (&changed["label"], &changed["previous_label"]),
            (&json!("open"), &json!("closed"))
        );
        let lost = example(EventKind::ConnectionLost);
        assert_eq!(lost["label"], "open");
        assert!(lost.get("previous_label").is_none(), "{lost}");
        let low = example(EventKind::BatteryLow);
        assert_eq!(
            (&low["battery"], &low["threshold"]),
            (&json!(18), &json!(20))
        );
        for k in [EventKind::BatteryLow, EventKind::Tamper, EventKind::Fault] {
            let b = example(k);
            assert!(b.get("data").is_none() && b.get("label").is_none(), "{b}");
        }
        // Without labels, none.
        let n = example_notification(EventKind::StateChanged);
        let plain = parsed(body(&n, ADDRESS, &Labels::default()));
        assert!(plain.get("label").is_none(), "{plain}");
        assert!(errors(schema_of("sensor.state_changed").unwrap(), &plain).is_empty());
    }

    #[test]
    fn the_site_examples_name_what_the_site_decision_names() {
        let lost = example(EventKind::SiteConnectionLost);
        assert_eq!(lost["sensors"].as_array().unwrap().len(), 2, "{lost}");
        assert_eq!(lost["sensors_total"], 3);
        let back = example(EventKind::SiteConnectionRestored);
        assert_eq!(back["restored"][0]["id"], "xa7v9Dfadr7H", "{back}");
        assert_eq!(back["still_lost"][0]["id"], "b3TqL0w2ZkP1", "{back}");
    }
}
