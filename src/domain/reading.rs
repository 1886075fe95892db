//! A reading as it arrives from a sensor, and the reasons one can be rejected.
//!
//! Every source (HTTP, AMQP, MQTT) parses through [`parse_value`], so a bad reading gets the
//! same reason, metric label and message whichever way it came in.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sensor::SensorId;
use super::signals::{Fault, Signals};
use super::time::{self, Millis};

/// How far a device clock may run ahead of ours before a reading is refused. A reading
/// stamped far in the future would otherwise make every later real reading look "late"
/// and freeze the sensor's state.
pub const MAX_FUTURE_SKEW_MS: Millis = 5 * 60 * 1000;

/// The earliest `ts` a reading may carry: 0000-01-01T00:00:00Z, the first instant RFC 3339
/// can write. Readings parsed from text never fall below it; a reading that arrives as a
/// number (forwarded between cluster nodes) is held to the same range.
pub const MIN_TS: Millis = -62_167_219_200_000;

/// A validated reading (serialized only between cluster nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reading {
    pub sensor_id: SensorId,
    pub data: bool,
    /// The device's own time, when it sent one.
    pub ts: Option<Millis>,
    /// Its battery, tamper flag and fault, where it reported them.
    #[serde(default, skip_serializing_if = "Signals::is_empty")]
    pub signals: Signals,
}

/// Why a reading was not applied. The label names the metric series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub code: RejectCode,
    pub message: String,
}

/// Machine-readable rejection reasons; also the `reason` label of
/// `latch_readings_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectCode {
    MalformedJson,
    NotAnObject,
    InvalidSensorId,
    InvalidData,
    InvalidTs,
    TsInFuture,
    /// `battery` is not an integer 0–100.
    InvalidBattery,
    /// `tamper` is not a boolean.
    InvalidTamper,
    /// `fault` is neither `null` nor a code of up to 32 of `a-z0-9_`.
    InvalidFault,
    /// A field a reading does not have (`sensor_id`, `data`, `ts`): a typo would otherwise
    /// be dropped unseen, and padding would be stored nowhere but still cost the parse.
    UnknownField,
    UnknownSensor,
    /// Valid, but its shard's commit failed: nothing of it is durable. Unlike the others this
    /// is not a verdict on the reading — the sender should send it again (a broker source
    /// leaves it unacknowledged, never dead-letters it).
    StoreUnavailable,
    /// Valid, but the store's disk is full: nothing of it is durable. Transient like
    /// `store_unavailable` (send it again once space is freed), named apart so a sender
    /// and an operator see the cause.
    StorageFull,
}

impl RejectCode {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectCode::MalformedJson => "malformed_json",
            RejectCode::NotAnObject => "not_an_object",
            RejectCode::InvalidSensorId => "invalid_sensor_id",
            RejectCode::InvalidData => "invalid_data",
            RejectCode::InvalidTs => "invalid_ts",
            RejectCode::TsInFuture => "ts_in_future",
            RejectCode::InvalidBattery => "invalid_battery",
            RejectCode::InvalidTamper => "invalid_tamper",
            RejectCode::InvalidFault => "invalid_fault",
            RejectCode::UnknownField => "unknown_field",
            RejectCode::UnknownSensor => "unknown_sensor",
            RejectCode::StoreUnavailable => "store_unavailable",
            RejectCode::StorageFull => "storage_full",
        }
    }

    /// Whether the reading itself is fine and only its commit failed, so sending it again
    /// can succeed.
    pub fn is_transient(self) -> bool {
        matches!(self, RejectCode::StoreUnavailable | RejectCode::StorageFull)
    }
}

impl Rejection {
    pub fn new(code: RejectCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn unknown_sensor(id: SensorId) -> Self {
        Self::new(
            RejectCode::UnknownSensor,
            format!("sensor \"{id}\" is not registered"),
        )
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// The fields a reading has; any other is refused ([`RejectCode::UnknownField`]).
pub const FIELDS: [&str; 6] = ["sensor_id", "data", "ts", "battery", "tamper", "fault"];

/// Validates one reading given as JSON: `{"sensor_id": "...", "data": 0|1, "ts": "..."?,
/// "battery": 0..=100?, "tamper": bool?, "fault": "code"|null?}`.
/// `now` bounds how far in the future `ts` may be.
pub fn parse_value(v: &Value, now: Millis) -> Result<Reading, Rejection> {
    let obj = v.as_object().ok_or_else(|| {
        Rejection::new(RejectCode::NotAnObject, "a reading must be a JSON object")
    })?;
    unknown_fields(obj.keys())?;
    let sensor_id = match obj.get("sensor_id") {
        Some(Value::String(s)) => SensorId::parse(s)
            .map_err(|e| Rejection::new(RejectCode::InvalidSensorId, e.to_string()))?,
        Some(_) => {
            return Err(Rejection::new(
                RejectCode::InvalidSensorId,
                "sensor_id must be a string",
            ));
        }
        None => {
            return Err(Rejection::new(
                RejectCode::InvalidSensorId,
                "sensor_id is missing",
            ));
        }
    };
    let data = match obj.get("data") {
        Some(Value::Number(n)) if n.as_u64() == Some(0) => false,
        Some(Value::Number(n)) if n.as_u64() == Some(1) => true,
        Some(other) => {
            return Err(Rejection::new(
                RejectCode::InvalidData,
                format!("data must be 0 or 1, got {other}"),
            ));
        }
        None => return Err(Rejection::new(RejectCode::InvalidData, "data is missing")),
    };
    let ts = match obj.get("ts") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(time::parse(s).ok_or_else(|| {
            Rejection::new(
                RejectCode::InvalidTs,
                format!("ts must be an RFC 3339 time, got {s:?}"),
            )
        })?),
        Some(other) => {
            return Err(Rejection::new(
                RejectCode::InvalidTs,
                format!("ts must be an RFC 3339 string, got {other}"),
            ));
        }
    };
    let signals = parse_signals(obj)?;
    check(
        Reading {
            sensor_id,
            data,
            ts,
            signals,
        },
        now,
    )
}

/// A reading's `battery`, `tamper` and `fault`, each checked on its own.
fn parse_signals(obj: &serde_json::Map<String, Value>) -> Result<Signals, Rejection> {
    let battery = match obj.get("battery") {
        None => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|b| b <= 100) => {
            n.as_u64().map(|b| b as u8)
        }
        Some(other) => {
            return Err(Rejection::new(
                RejectCode::InvalidBattery,
                format!("battery must be an integer from 0 to 100, got {other}"),
            ));
        }
    };
    let tamper = match obj.get("tamper") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(Rejection::new(
                RejectCode::InvalidTamper,
                format!("tamper must be true or false, got {other}"),
            ));
        }
    };
    let fault = match obj.get("fault") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::String(s)) => Some(Some(
            Fault::parse(s).map_err(|e| Rejection::new(RejectCode::InvalidFault, e))?,
        )),
        Some(other) => {
            return Err(Rejection::new(
                RejectCode::InvalidFault,
                format!("fault must be a code string or null, got {other}"),
            ));
        }
    };
    Ok(Signals {
        battery,
        tamper,
        fault,
    })
}

/// Refuses a reading with fields beyond [`FIELDS`], naming them (the first few, each cut
/// short: a key may be megabytes) and the fields a reading has, as the API's other bodies
/// word it.
fn unknown_fields<'k>(keys: impl Iterator<Item = &'k String>) -> Result<(), Rejection> {
    const NAMED: usize = 5;
    const KEY_CHARS: usize = 64;
    let unknown: Vec<&String> = keys.filter(|k| !FIELDS.contains(&k.as_str())).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut named: Vec<String> = unknown
        .iter()
        .take(NAMED)
        .map(|k| match k.char_indices().nth(KEY_CHARS) {
            Some((cut, _)) => format!("`{}…`", &k[..cut]),
            None => format!("`{k}`"),
        })
        .collect();
    if unknown.len() > NAMED {
        named.push(format!("and {} more", unknown.len() - NAMED));
    }
    let known: Vec<String> = FIELDS.iter().map(|f| format!("`{f}`")).collect();
    Err(Rejection::new(
        RejectCode::UnknownField,
        format!(
            "unknown field{} {}, expected one of {}",
            if unknown.len() == 1 { "" } else { "s" },
            named.join(", "),
            known.join(", ")
        ),
    ))
}

/// Holds a reading's `ts` to what latch accepts at `now` (its own clock): RFC 3339's range
/// and at most [`MAX_FUTURE_SKEW_MS`] ahead. Every way in ends here, the readings another
/// cluster node forwards included, so none can carry a time the public API refuses.
pub fn check(reading: Reading, now: Millis) -> Result<Reading, Rejection> {
    match reading.ts {
        Some(ts) if ts < MIN_TS => Err(Rejection::new(
            RejectCode::InvalidTs,
            format!("ts {ts} ms is before the year 0000"),
        )),
        Some(ts) if ts > now.saturating_add(MAX_FUTURE_SKEW_MS) => Err(Rejection::new(
            RejectCode::TsInFuture,
            format!(
                "ts {} is more than 5 minutes ahead of the server clock",
                time::format(ts)
            ),
        )),
        _ => Ok(reading),
    }
}

/// Why a body of readings could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("malformed JSON: {0}")]
    Malformed(serde_json::Error),
    /// More elements than allowed; parsing stopped at the first one too many.
    #[error("at most {max} readings per request")]
    TooMany { max: usize },
    /// Valid JSON, but neither one reading (an object) nor an array of them.
    #[error("the body must be a reading object or an array of readings")]
    NotReadings,
}

/// Parses a request body holding one reading or an array of at most `max`, each judged on
/// its own. `Err` when the body is not JSON at all, or holds more than `max` readings —
/// found at element `max + 1`, so an oversize array is never parsed whole.
///
/// The common case, a well-formed reading, is read straight into borrowed fields; only an
/// element that fails that goes through a full `Value`, for the exact rejection reason.
pub fn parse_many(
    body: &[u8],
    now: Millis,
    max: usize,
) -> Result<Vec<Result<Reading, Rejection>>, BodyError> {
    use serde::Deserializer as _;
    use serde_json::value::RawValue;

    /// Judges elements as the parser reaches them and stops one past `max`.
    struct Capped<'c> {
        now: Millis,
        max: usize,
        too_many: &'c std::cell::Cell<bool>,
    }
    impl<'de> serde::de::Visitor<'de> for Capped<'_> {
        type Value = Vec<Result<Reading, Rejection>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of readings")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(raw) = seq.next_element::<&'de RawValue>()? {
                if out.len() == self.max {
                    self.too_many.set(true);
                    return Err(serde::de::Error::custom("too many readings"));
                }
                out.push(parse_raw(raw.get(), self.now));
            }
            Ok(out)
        }
    }

    let first = body.trim_ascii_start().first().copied();
    if first == Some(b'[') {
        let too_many = std::cell::Cell::new(false);
        let mut de = serde_json::Deserializer::from_slice(body);
        let items = de
            .deserialize_seq(Capped {
                now,
                max,
                too_many: &too_many,
            })
            .and_then(|items| de.end().map(|()| items));
        items.map_err(|e| match too_many.get() {
            true => BodyError::TooMany { max },
            false => BodyError::Malformed(e),
        })
    } else {
        let raw: &RawValue = serde_json::from_slice(body).map_err(BodyError::Malformed)?;
        if first != Some(b'{') {
            return Err(BodyError::NotReadings);
        }
        Ok(vec![parse_raw(raw.get(), now)])
    }
}

/// One element of [`parse_many`]: valid JSON text.
fn parse_raw(json: &str, now: Millis) -> Result<Reading, Rejection> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Fast<'a> {
        #[serde(borrow)]
        sensor_id: &'a str,
        data: u8,
        #[serde(default, borrow)]
        ts: Option<&'a str>,
    }
    if let Ok(f) = serde_json::from_str::<Fast>(json)
        && f.data <= 1
        && let Ok(sensor_id) = SensorId::parse(f.sensor_id)
    {
        let ts = match f.ts {
            None => Some(None),
            Some(t) => time::parse(t).map(Some),
        };
        if let Some(ts) = ts
            && let Ok(r) = check(
                Reading {
                    sensor_id,
                    data: f.data == 1,
                    ts,
                    signals: Signals::default(),
                },
                now,
            )
        {
            return Ok(r);
        }
    }
    match serde_json::from_str::<Value>(json) {
        Ok(v) => parse_value(&v, now),
        Err(e) => Err(Rejection::new(
            RejectCode::MalformedJson,
            format!("malformed JSON: {e}"),
        )),
    }
}

/// Validates one reading given as raw JSON bytes (a broker message body).
pub fn parse_bytes(body: &[u8], now: Millis) -> Result<Reading, Rejection> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Rejection::new(RejectCode::MalformedJson, format!("malformed JSON: {e}")))?;
    parse_value(&v, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: Millis = 1_800_000_000_000;

    #[test]
    fn accepts_the_contract_shape() {
        let r = parse_value(
            &json!({"sensor_id": "xa7v9Dfadr7H", "data": 1, "ts": "2026-11-22T10:00:00Z"}),
            NOW,
        )
        .unwrap();
        assert!(r.data);
        assert_eq!(r.ts, time::parse("2026-11-22T10:00:00Z"));
        let r = parse_value(&json!({"sensor_id": "0xA", "data": 0}), NOW).unwrap();
        assert!(!r.data);
        assert_eq!(r.ts, None);
    }

    #[test]
    fn the_fast_path_agrees_with_the_full_one() {
        let cases = [
            r#"{"sensor_id": "xa7v9Dfadr7H", "data": 1, "ts": "2026-11-22T10:00:00Z"}"#,
            r#"{"sensor_id": "a", "data": 0, "ts": null, "extra": [1, 2]}"#,
            r#"{"sensor_id": "\u0061b", "data": 1}"#,
            r#"{"sensor_id": "a", "data": 2}"#,
            r#"{"sensor_id": "a", "data": 1.0}"#,
            r#"{"sensor_id": "a", "data": true}"#,
            r#"{"sensor_id": "a b", "data": 1}"#,
            r#"{"sensor_id": "a", "data": 1, "ts": "yesterday"}"#,
            r#"{"sensor_id": "a", "data": 1, "ts": "2099-01-01T00:00:00Z"}"#,
            r#"{"sensor_id": "a", "data": 1, "data": 0}"#,
            r#"{"data": 1}"#,
            r#"[1]"#,
            r#""a""#,
        ];
        for c in cases {
            let v: Value = serde_json::from_str(c).unwrap();
            assert_eq!(parse_raw(c, NOW), parse_value(&v, NOW), "{c}");
        }
        let many =
            parse_many(br#" [{"sensor_id": "a", "data": 1}, {"data": 7}]"#, NOW, 10).unwrap();
        assert!(many[0].is_ok() && many[1].is_err());
        assert_eq!(
            parse_many(br#"{"sensor_id": "a", "data": 0}"#, NOW, 10)
                .unwrap()
                .len(),
            1
        );
        assert!(matches!(
            parse_many(b"[1,", NOW, 10),
            Err(BodyError::Malformed(_))
        ));
        assert!(matches!(
            parse_many(b"[1] x", NOW, 10),
            Err(BodyError::Malformed(_))
        ));
        assert!(matches!(
            parse_many(b" 5", NOW, 10),
            Err(BodyError::NotReadings)
        ));
        assert!(matches!(
            parse_many(br#""a""#, NOW, 10),
            Err(BodyError::NotReadings)
        ));
    }

    #[test]
    fn parse_many_stops_one_past_the_cap() {
        let r = r#"{"sensor_id": "a", "data": 1}"#;
        let three = format!("[{r},{r},{r}]");
        assert_eq!(parse_many(three.as_bytes(), NOW, 3).unwrap().len(), 3);
        assert!(matches!(
            parse_many(three.as_bytes(), NOW, 2),
            Err(BodyError::TooMany { max: 2 })
        ));
        // Past the cap nothing more is read: what follows may be anything.
        let cut = format!("[{r},{r},{r}, this is never parsed");
        assert!(matches!(
            parse_many(cut.as_bytes(), NOW, 2),
            Err(BodyError::TooMany { max: 2 })
        ));
    }

    #[test]
    fn rejects_with_reasons() {
        let code = |v: Value| parse_value(&v, NOW).unwrap_err().code;
        assert_eq!(code(json!([1])), RejectCode::NotAnObject);
        assert_eq!(code(json!({"data": 1})), RejectCode::InvalidSensorId);
        assert_eq!(
            code(json!({"sensor_id": "a b", "data": 1})),
            RejectCode::InvalidSensorId
        );
        assert_eq!(
            code(json!({"sensor_id": 7, "data": 1})),
            RejectCode::InvalidSensorId
        );
        assert_eq!(
            code(json!({"sensor_id": "a", "data": 2})),
            RejectCode::InvalidData
        );
        assert_eq!(
            code(json!({"sensor_id": "a", "data": "1"})),
            RejectCode::InvalidData
        );
        assert_eq!(
            code(json!({"sensor_id": "a", "data": true})),
            RejectCode::InvalidData
        );
        assert_eq!(
            code(json!({"sensor_id": "a", "data": 1.0})),
            RejectCode::InvalidData
        );
        assert_eq!(code(json!({"sensor_id": "a"})), RejectCode::InvalidData);
        assert_eq!(
            code(json!({"sensor_id": "a", "data": 1, "ts": "noon"})),
            RejectCode::InvalidTs
        );
        assert_eq!(
            code(json!({"sensor_id": "a", "data": 1, "ts": 5})),
            RejectCode::InvalidTs
        );
        assert_eq!(
            code(json!({"sensor_id": "a", "data": 1, "ts": "2099-01-01T00:00:00Z"})),
            RejectCode::TsInFuture
        );
        assert_eq!(
            parse_bytes(b"{nope", NOW).unwrap_err().code,
            RejectCode::MalformedJson
        );
    }

    #[test]
    fn unknown_fields_are_refused_naming_the_known_ones() {
        let refuse = |v: Value| parse_value(&v, NOW).unwrap_err();
        let r = refuse(json!({"sensor_id": "a", "data": 1, "pad": "x"}));
        assert_eq!(r.code, RejectCode::UnknownField);
        assert_eq!(
            r.message,
            "unknown field `pad`, expected one of `sensor_id`, `data`, `ts`, `battery`, `tamper`, `fault`"
        );
        // Before any other check: the shape is what is wrong.
        let r = refuse(json!({"sensor_id": "a b", "data": 9, "Data": 1, "ts": null}));
        assert_eq!(r.code, RejectCode::UnknownField);
        let long = "k".repeat(1 << 20);
        let mut many = serde_json::Map::new();
        many.insert("sensor_id".into(), json!("a"));
        many.insert("data".into(), json!(1));
        many.insert(long, json!(1));
        for i in 0..10 {
            many.insert(format!("f{i}"), json!(i));
        }
        let r = refuse(Value::Object(many));
        assert!(r.message.len() < 1000, "{}", r.message);
        assert!(
            r.message.starts_with("unknown fields `f0`"),
            "{}",
            r.message
        );
        assert!(r.message.contains("and 6 more"), "{}", r.message);
        // The fast path of a request body agrees.
        let body = br#"[{"sensor_id": "a", "data": 1, "extra": 1}, {"sensor_id": "a", "data": 1}]"#;
        let items = parse_many(body, NOW, 10).unwrap();
        assert_eq!(
            items[0].as_ref().unwrap_err().code,
            RejectCode::UnknownField
        );
        assert!(items[1].is_ok());
        assert_eq!(
            parse_bytes(br#"{"sensor_id": "a", "data": 1, "x": 0}"#, NOW)
                .unwrap_err()
                .code,
            RejectCode::UnknownField
        );
    }

    #[test]
    fn check_holds_numeric_times_to_the_text_range() {
        let at = |ts| {
            check(
                Reading {
                    sensor_id: SensorId::parse("a").unwrap(),
                    data: true,
                    ts: Some(ts),
                    signals: Signals::default(),
                },
                NOW,
            )
            .map_err(|r| r.code)
        };
        let year_9999 = time::parse("9999-12-31T23:59:59Z").unwrap();
        assert_eq!(at(year_9999), Err(RejectCode::TsInFuture));
        assert_eq!(at(i64::MAX), Err(RejectCode::TsInFuture));
        assert_eq!(at(i64::MIN), Err(RejectCode::InvalidTs));
        assert_eq!(at(MIN_TS - 1), Err(RejectCode::InvalidTs));
        assert_eq!(time::parse("0000-01-01T00:00:00Z"), Some(MIN_TS));
        assert!(at(MIN_TS).is_ok() && at(NOW + MAX_FUTURE_SKEW_MS).is_ok());
        assert_eq!(
            at(NOW + MAX_FUTURE_SKEW_MS + 1),
            Err(RejectCode::TsInFuture)
        );
    }

    #[test]
    fn battery_tamper_and_fault_are_read_and_checked() {
        let r = parse_value(
            &json!({"sensor_id": "a", "data": 1, "battery": 15, "tamper": true, "fault": "lock_jam"}),
            NOW,
        )
        .unwrap();
        assert_eq!(r.signals.battery, Some(15));
        assert_eq!(r.signals.tamper, Some(true));
        assert_eq!(
            r.signals.fault,
            Some(Some(Fault::parse("lock_jam").unwrap()))
        );
        let cleared = parse_value(&json!({"sensor_id": "a", "data": 1, "fault": null}), NOW);
        assert_eq!(cleared.unwrap().signals.fault, Some(None));
        let plain = parse_value(&json!({"sensor_id": "a", "data": 1}), NOW).unwrap();
        assert!(plain.signals.is_empty());
        let code = |v: Value| parse_value(&v, NOW).unwrap_err().code;
        for bad in [json!(101), json!(-1), json!(5.5), json!("50"), json!(null)] {
            assert_eq!(
                code(json!({"sensor_id": "a", "data": 1, "battery": bad})),
                RejectCode::InvalidBattery
            );
        }
        for bad in [json!(1), json!("true"), json!(null)] {
            assert_eq!(
                code(json!({"sensor_id": "a", "data": 1, "tamper": bad})),
                RejectCode::InvalidTamper
            );
        }
        for bad in [json!(""), json!("Jam"), json!("x".repeat(33)), json!(7)] {
            assert_eq!(
                code(json!({"sensor_id": "a", "data": 1, "fault": bad})),
                RejectCode::InvalidFault
            );
        }
        // A request body's elements take the same way.
        let body = br#"[{"sensor_id": "a", "data": 1, "battery": 9}, {"sensor_id": "a", "data": 1, "battery": 900}]"#;
        let items = parse_many(body, NOW, 10).unwrap();
        assert_eq!(items[0].as_ref().unwrap().signals.battery, Some(9));
        assert_eq!(
            items[1].as_ref().unwrap_err().code,
            RejectCode::InvalidBattery
        );
    }

    #[test]
    fn unknown_sensor_message_names_the_id() {
        let r = Rejection::unknown_sensor(SensorId::parse("abc").unwrap());
        assert_eq!(r.message, "sensor \"abc\" is not registered");
    }
}
