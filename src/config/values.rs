//! The values settings take: durations, whole numbers, flags, networks, rates, each given
//! as a TOML value or, from the environment, as text.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A request rate with a burst: a token bucket of `burst` requests refilled at
/// `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

impl RateLimit {
    /// Parses `"200/s"`, `"200/s burst 400"` or `"30/m burst 10"`. Without a burst, one
    /// second's worth (at least 1).
    pub fn parse(text: &str) -> Result<RateLimit, String> {
        let bad =
            || format!("{text:?} is not a rate like \"200/s\", \"200/s burst 400\" or \"30/m\"");
        let words: Vec<&str> = text.split_whitespace().collect();
        let (rate, burst) = match words.as_slice() {
            [rate] => (*rate, None),
            [rate, kw, burst] if kw.eq_ignore_ascii_case("burst") => (*rate, Some(*burst)),
            _ => return Err(bad()),
        };
        let (n, unit) = rate.split_once('/').ok_or_else(bad)?;
        let n: u32 = n.parse().map_err(|_| bad())?;
        let per_second = match unit {
            "s" => n as f64,
            "m" => n as f64 / 60.0,
            _ => return Err(bad()),
        };
        let burst = match burst {
            Some(b) => b.parse::<u32>().map_err(|_| bad())?,
            None => (per_second.ceil() as u32).max(1),
        };
        if n == 0 || burst == 0 {
            return Err(format!(
                "{text:?}: the rate and the burst must be above zero"
            ));
        }
        Ok(RateLimit { per_second, burst })
    }
}

pub(super) fn rate_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RateLimit>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) if !s.trim().is_empty() => RateLimit::parse(&s)
            .map(Some)
            .map_err(serde::de::Error::custom),
        _ => Ok(None),
    }
}

/// An address to listen on, `host:port` with an IP address; the message repeats what was
/// given, which the standard parser's ("invalid socket address syntax") does not.
pub(super) fn address<'de, D: Deserializer<'de>>(d: D) -> Result<std::net::SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.trim().parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{s:?} is not an address like \"127.0.0.1:8080\" or \"[::]:8080\" (an IP address and a port)"
        ))
    })
}

/// Parses "30s", "1h 30m", "500ms".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like \"30s\" or \"1h\" ({e})"))
}

pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

/// The items of a list given as a TOML array or as comma-separated text (the
/// environment's form), trimmed, blank ones left out.
fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
    }
    let items = match Raw::deserialize(d)? {
        Raw::One(s) => s.split(',').map(str::to_string).collect(),
        Raw::Many(v) => v,
    };
    Ok(items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}

pub(super) fn durations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    list(d)?
        .iter()
        .map(|s| parse_duration(s).map_err(serde::de::Error::custom))
        .collect()
}

/// A number with a fraction (`0.5`) given as a TOML number or, from the environment, as
/// text.
pub(super) fn fraction<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Fraction {
        Float(f64),
        Int(i64),
        Text(String),
    }
    match Fraction::deserialize(d)? {
        Fraction::Float(f) => Ok(f),
        Fraction::Int(i) => Ok(i as f64),
        Fraction::Text(s) => s
            .trim()
            .parse::<f64>()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a number"))),
    }
}

/// A whole number given as a TOML integer or, from the environment, as text.
pub(super) fn number<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    WholeNumber::deserialize(d)?
        .value()
        .map_err(serde::de::Error::custom)
}

/// A whole number as TOML or environment text gives it.
#[derive(Deserialize)]
#[serde(untagged)]
enum WholeNumber {
    Int(i64),
    Text(String),
}

impl WholeNumber {
    fn value(self) -> Result<u32, String> {
        let n = match self {
            WholeNumber::Int(i) => i,
            WholeNumber::Text(s) => s
                .trim()
                .parse::<i64>()
                .map_err(|_| format!("{s:?} is not a whole number"))?,
        };
        u32::try_from(n).map_err(|_| format!("{n} is out of range"))
    }
}

/// A list of CIDR networks, given as a TOML array or as comma-separated text.
pub(super) fn nets<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    list(d)?
        .iter()
        .map(|s| {
            s.parse().map_err(|_| {
                serde::de::Error::custom(format!(
                    "{s:?} is not a network like \"10.0.0.0/8\" or \"fd00::/8\""
                ))
            })
        })
        .collect()
}

/// A TOML boolean or, from the environment, `true`/`false` (also `1`/`0`).
pub(super) fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bool(bool),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Bool(b) => Ok(b),
        Raw::Text(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(serde::de::Error::custom(format!(
                "{s:?} is neither true nor false"
            ))),
        },
    }
}

pub(super) fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) if !s.trim().is_empty() => parse_duration(&s)
            .map(Some)
            .map_err(serde::de::Error::custom),
        _ => Ok(None),
    }
}

/// As [`number`], optional: absent or empty text is `None`.
pub(super) fn opt_number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<WholeNumber>::deserialize(d)? {
        None => Ok(None),
        Some(WholeNumber::Text(s)) if s.trim().is_empty() => Ok(None),
        Some(n) => n.value().map(Some).map_err(serde::de::Error::custom),
    }
}

/// A path; empty text: unset.
pub(super) fn opt_path<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::path::PathBuf>, D::Error> {
    Ok(non_empty(d)?.map(std::path::PathBuf::from))
}

pub(super) fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.filter(|s| !s.trim().is_empty()))
}

/// `secret_key`: base64 keys, comma-separated ([`crate::secrets::SecretKeys::parse`]); empty
/// or unset: none. A secret setting ([`super::declared::secret`]): the message never quotes
/// the value.
pub(super) fn secret_keys<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::secrets::SecretKeys>, D::Error> {
    super::declared::secret_with(d, crate::secrets::SecretKeys::parse)
}
