//! Layered settings: embedded defaults (`config.default.toml`), then a TOML file, then
//! `LATCH_*` environment variables; validated once at start, then shared as `Arc<Config>`.
//! The URLs of sources and sinks are checked by the adapters that use them
//! ([`crate::load_config`]), so this layer depends on nothing above it.
//!
//! Every layer is checked for unknown keys, so a typo (`LATCH_RETRY_BSE`) is an error at
//! start rather than a silently ignored setting.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Deserializer};

/// The embedded defaults, fully commented: `latch config` prints them.
pub const DEFAULTS: &str = include_str!("config.default.toml");

/// Variables with the `LATCH_` prefix that are not settings.
const NOT_SETTINGS: &[&str] = &["LATCH_CONFIG"];

/// Retry policies of the delivery schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RetryPolicyKind {
    Log,
    Exponential,
    Fixed,
}

/// Every setting of latch. See `config.default.toml` for what each one means.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub sqlite_synchronous: Synchronous,
    #[serde(default, deserialize_with = "non_empty")]
    pub database_url: Option<String>,
    /// Bound on every PostgreSQL call: waiting for a pooled connection, connecting, and
    /// each store operation. A database that stops answering costs a 503, never a hang.
    #[serde(deserialize_with = "duration")]
    pub database_timeout: Duration,
    #[serde(default, deserialize_with = "non_empty")]
    pub amqp_url: Option<String>,
    pub amqp_queue: String,
    #[serde(default, deserialize_with = "non_empty")]
    pub mqtt_url: Option<String>,
    pub mqtt_topic: String,
    #[serde(default, deserialize_with = "non_empty")]
    pub clickhouse_url: Option<String>,
    pub clickhouse_database: String,
    #[serde(deserialize_with = "duration")]
    pub clickhouse_flush: Duration,
    #[serde(deserialize_with = "duration")]
    pub heartbeat_timeout: Duration,
    pub retry_policy: RetryPolicyKind,
    #[serde(deserialize_with = "duration")]
    pub retry_base: Duration,
    #[serde(deserialize_with = "duration")]
    pub retry_max_delay: Duration,
    #[serde(deserialize_with = "number")]
    pub retry_max_attempts: u32,
    #[serde(deserialize_with = "durations")]
    pub retry_fixed: Vec<Duration>,
    #[serde(deserialize_with = "duration")]
    pub delivery_timeout: Duration,
    #[serde(deserialize_with = "number")]
    pub delivery_concurrency: u32,
    #[serde(deserialize_with = "number")]
    pub delivery_client_concurrency: u32,
    #[serde(default, deserialize_with = "non_empty")]
    pub api_token: Option<String>,
    #[serde(deserialize_with = "number")]
    pub engine_shards: u32,
    #[serde(deserialize_with = "number")]
    pub engine_batch_max: u32,
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    pub log: String,
    /// Networks webhooks may go to although they are not globally routable (loopback,
    /// private, link-local, …): the SSRF guard refuses those by default.
    #[serde(deserialize_with = "nets")]
    pub delivery_allow_nets: Vec<ipnet::IpNet>,
    /// Refuse `http://` webhook URLs.
    #[serde(deserialize_with = "flag")]
    pub delivery_https_only: bool,
    /// How long a rotated-out secret keeps signing beside the new one, so receivers can
    /// switch keys without rejecting a request.
    #[serde(deserialize_with = "duration")]
    pub secret_rotation_grace: Duration,
    /// A client whose every attempt failed for this long is disabled.
    #[serde(deserialize_with = "duration")]
    pub endpoint_disable_after: Duration,
    /// Requests each token (or, without one, each peer address) may make to `/v1`, on
    /// this node. `None`: no limit.
    #[serde(default, deserialize_with = "rate_limit")]
    pub rate_limit: Option<RateLimit>,
    /// Cluster mode (PostgreSQL only): the URL other nodes reach this node at. Unset:
    /// `http://` + `listen` when that is not a wildcard address.
    #[serde(default, deserialize_with = "non_empty")]
    pub node_advertise: Option<String>,
    /// Authenticates node-to-node requests (forwarded readings, registry pokes).
    #[serde(default, deserialize_with = "non_empty")]
    pub cluster_secret: Option<String>,
    /// How long a partition lease lasts without renewal; a dead node's partitions move
    /// after it. Unset: 10 s.
    #[serde(default, deserialize_with = "opt_duration")]
    pub cluster_lease: Option<Duration>,
    /// Partitions of the fleet, fixed when the database is first used. Unset: 128.
    #[serde(default, deserialize_with = "opt_number")]
    pub cluster_partitions: Option<u32>,
}

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

fn rate_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RateLimit>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) if !s.trim().is_empty() => RateLimit::parse(&s)
            .map(Some)
            .map_err(serde::de::Error::custom),
        _ => Ok(None),
    }
}

/// How hard SQLite syncs to disk at each commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// fsync at every commit: survives power loss. The default.
    Full,
    /// fsync at checkpoints only: survives a crash of latch, not of the machine.
    Normal,
}

impl Config {
    /// Loads the defaults, the file (`path`, or `./latch.toml` when present) and the
    /// process environment.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        Self::load_from(path, &env)
    }

    /// As [`Config::load`], with the environment given (for tests).
    pub fn load_from(path: Option<&Path>, env: &[(String, String)]) -> anyhow::Result<Self> {
        let mut table = parse_table(DEFAULTS, "embedded defaults")?;
        let known: Vec<String> = known_keys();
        let file = match path {
            Some(p) => Some(p.to_path_buf()),
            None => Some(PathBuf::from("latch.toml")).filter(|p| p.exists()),
        };
        if let Some(file) = file {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read config file {}", file.display()))?;
            let layer = parse_table(&text, &file.display().to_string())?;
            for (k, v) in layer {
                if !known.contains(&k) {
                    bail!("{}: unknown key `{k}`", file.display());
                }
                table.insert(k, v);
            }
        }
        for (name, value) in env {
            let Some(key) = name.strip_prefix("LATCH_") else {
                continue;
            };
            if NOT_SETTINGS.contains(&name.as_str()) {
                continue;
            }
            let key = key.to_ascii_lowercase();
            if !known.contains(&key) {
                bail!("environment: unknown setting {name}");
            }
            table.insert(key, toml::Value::String(value.clone()));
        }
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table.into_iter().collect()))
                .map_err(|e| anyhow::anyhow!("invalid setting `{}`: {}", e.path(), e.inner()))?;
        // A validation message may quote a URL with its password.
        config
            .validate()
            .map_err(|e| anyhow::anyhow!(config.redact(&format!("{e:#}"))))?;
        Ok(config)
    }

    /// Defaults only, with the data folder moved (tests and benchmarks).
    pub fn for_data_dir(dir: &Path) -> Self {
        let mut c = Self::load_from(None, &[]).expect("embedded defaults are valid");
        c.data_dir = dir.to_path_buf();
        c
    }

    fn validate(&self) -> anyhow::Result<()> {
        let positive = [
            ("heartbeat_timeout", self.heartbeat_timeout),
            ("retry_base", self.retry_base),
            ("retry_max_delay", self.retry_max_delay),
            ("delivery_timeout", self.delivery_timeout),
            ("clickhouse_flush", self.clickhouse_flush),
            ("database_timeout", self.database_timeout),
            ("endpoint_disable_after", self.endpoint_disable_after),
        ];
        for (key, d) in positive {
            if d.is_zero() {
                bail!("invalid setting `{key}`: must be longer than zero");
            }
        }
        let counts = [
            ("retry_max_attempts", self.retry_max_attempts, 1, 1000),
            (
                "delivery_concurrency",
                self.delivery_concurrency,
                1,
                100_000,
            ),
            (
                "delivery_client_concurrency",
                self.delivery_client_concurrency,
                1,
                100_000,
            ),
            ("engine_shards", self.engine_shards, 1, 256),
            ("engine_batch_max", self.engine_batch_max, 1, 1_000_000),
        ];
        for (key, v, lo, hi) in counts {
            if !(lo..=hi).contains(&v) {
                bail!("invalid setting `{key}`: {v} is not between {lo} and {hi}");
            }
        }
        if self.retry_policy == RetryPolicyKind::Fixed && self.retry_fixed.is_empty() {
            bail!("invalid setting `retry_fixed`: the fixed policy needs at least one delay");
        }
        if self.amqp_queue.trim().is_empty() {
            bail!("invalid setting `amqp_queue`: must not be empty");
        }
        if self.mqtt_topic.trim().is_empty() {
            bail!("invalid setting `mqtt_topic`: must not be empty");
        }
        self.validate_cluster()
    }

    /// Cluster settings need PostgreSQL: the embedded SQLite store is one node.
    fn validate_cluster(&self) -> anyhow::Result<()> {
        let set: Vec<&str> = [
            ("node_advertise", self.node_advertise.is_some()),
            ("cluster_secret", self.cluster_secret.is_some()),
            ("cluster_lease", self.cluster_lease.is_some()),
            ("cluster_partitions", self.cluster_partitions.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, on)| on.then_some(k))
        .collect();
        if self.database_url.is_none() && !set.is_empty() {
            bail!(
                "invalid setting `{}`: cluster mode needs database_url = postgres://…; the \
                 embedded SQLite store is one node",
                set.join("`, `")
            );
        }
        if let Some(p) = self.cluster_partitions {
            let max = crate::domain::partition::MAX_PARTITIONS;
            if !(1..=max).contains(&p) {
                bail!("invalid setting `cluster_partitions`: {p} is not between 1 and {max}");
            }
        }
        if let Some(l) = self.cluster_lease
            && l < Duration::from_secs(1)
        {
            bail!("invalid setting `cluster_lease`: must be at least 1s");
        }
        if let Some(a) = &self.node_advertise {
            let ok = reqwest::Url::parse(a)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
            if !ok {
                bail!(
                    "invalid setting `node_advertise`: {a:?} is not a URL like \
                     \"http://10.0.0.5:8080\""
                );
            }
        }
        Ok(())
    }

    /// Partitions wanted when the database is first used.
    pub fn partitions(&self) -> u32 {
        self.cluster_partitions
            .unwrap_or(crate::domain::partition::DEFAULT_PARTITIONS)
    }

    /// How long a partition lease lasts.
    pub fn lease(&self) -> Duration {
        self.cluster_lease.unwrap_or(Duration::from_secs(10))
    }

    /// The URL other nodes reach this node at, given the address it listens on.
    pub fn advertise(&self, bound: SocketAddr) -> Option<String> {
        if let Some(a) = &self.node_advertise {
            return Some(a.trim_end_matches('/').to_string());
        }
        (!bound.ip().is_unspecified()).then(|| format!("http://{bound}"))
    }
}

fn known_keys() -> Vec<String> {
    // The commented-out lines of the defaults name the optional keys.
    let mut keys: Vec<String> = DEFAULTS
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("# ").trim();
            let (k, _) = l.split_once(" = ")?;
            k.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_')
                .then(|| k.to_string())
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn parse_table(text: &str, origin: &str) -> anyhow::Result<BTreeMap<String, toml::Value>> {
    let t: toml::Table =
        toml::from_str(text).with_context(|| format!("{origin}: not valid TOML"))?;
    Ok(t.into_iter().collect())
}

/// Parses "30s", "1h 30m", "500ms".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like \"30s\" or \"1h\" ({e})"))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

fn durations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
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
    items
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_duration(s).map_err(serde::de::Error::custom))
        .collect()
}

/// A whole number given as a TOML integer or, from the environment, as text.
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(i64),
        Text(String),
    }
    let n = match Raw::deserialize(d)? {
        Raw::Int(i) => i,
        Raw::Text(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a whole number")))?,
    };
    u32::try_from(n).map_err(|_| serde::de::Error::custom(format!("{n} is out of range")))
}

/// A list of CIDR networks, given as a TOML array or as comma-separated text.
fn nets<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
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
    items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
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
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
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

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) if !s.trim().is_empty() => parse_duration(&s)
            .map(Some)
            .map_err(serde::de::Error::custom),
        _ => Ok(None),
    }
}

fn opt_number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(i64),
        Text(String),
    }
    let n = match Option::<Raw>::deserialize(d)? {
        None => return Ok(None),
        Some(Raw::Int(i)) => i,
        Some(Raw::Text(s)) if s.trim().is_empty() => return Ok(None),
        Some(Raw::Text(s)) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a whole number")))?,
    };
    u32::try_from(n)
        .map(Some)
        .map_err(|_| serde::de::Error::custom(format!("{n} is out of range")))
}

fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.filter(|s| !s.trim().is_empty()))
}

impl Config {
    /// `text` with every secret of these settings masked: the password of each configured
    /// URL, the API token, and the password part of any other `scheme://user:pass@` in it.
    /// For messages that may quote a URL, such as a failed start.
    pub fn redact(&self, text: &str) -> String {
        let mut out = redact_userinfo(text);
        let urls = [
            &self.database_url,
            &self.amqp_url,
            &self.mqtt_url,
            &self.clickhouse_url,
        ];
        let passwords = urls
            .into_iter()
            .flatten()
            .filter_map(|u| reqwest::Url::parse(u).ok())
            .filter_map(|u| u.password().map(str::to_string))
            .flat_map(|p| {
                let decoded = percent_encoding::percent_decode_str(&p)
                    .decode_utf8_lossy()
                    .into_owned();
                [p, decoded]
            });
        for secret in passwords
            .chain(self.api_token.clone())
            .chain(self.cluster_secret.clone())
        {
            // Short secrets would mask ordinary words; they are not worth the noise.
            if secret.len() >= 4 {
                out = out.replace(&secret, "***");
            }
        }
        out
    }
}

/// Masks the password in every `scheme://user:password@host` of `text`.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::load_from(None, &[]).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.data_dir, PathBuf::from("./latch-data"));
        assert_eq!(c.amqp_queue, "latch.readings");
        assert_eq!(c.mqtt_topic, "sensors/+/state");
        assert_eq!(c.heartbeat_timeout, Duration::from_secs(3600));
        assert_eq!(c.retry_base, Duration::from_secs(30));
        assert_eq!(c.retry_max_delay, Duration::from_secs(3600));
        assert_eq!(c.retry_max_attempts, 10);
        assert_eq!(c.delivery_timeout, Duration::from_secs(10));
        assert_eq!(c.secret_rotation_grace, Duration::from_secs(24 * 3600));
        assert_eq!(c.endpoint_disable_after, Duration::from_secs(5 * 24 * 3600));
        assert_eq!(c.database_url, None);
        assert_eq!(c.api_token, None);
    }

    #[test]
    fn database_timeout_is_a_positive_duration() {
        let c = Config::load_from(None, &[]).unwrap();
        assert_eq!(c.database_timeout, Duration::from_secs(5));
        let c = Config::load_from(None, &env(&[("LATCH_DATABASE_TIMEOUT", "750ms")])).unwrap();
        assert_eq!(c.database_timeout, Duration::from_millis(750));
        let e = Config::load_from(None, &env(&[("LATCH_DATABASE_TIMEOUT", "0s")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("database_timeout"), "{e}");
    }

    #[test]
    fn environment_overrides_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("latch.toml");
        std::fs::write(
            &file,
            "retry_base = \"5s\"\nretry_max_attempts = 3\nlisten = \"127.0.0.1:9000\"\n",
        )
        .unwrap();
        let c = Config::load_from(
            Some(&file),
            &env(&[
                ("LATCH_RETRY_MAX_ATTEMPTS", "7"),
                ("LATCH_API_TOKEN", "12345"),
                ("LATCH_CONFIG", "ignored"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(c.retry_base, Duration::from_secs(5));
        assert_eq!(c.retry_max_attempts, 7);
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.api_token.as_deref(), Some("12345"));
    }

    #[test]
    fn errors_name_the_bad_key() {
        let err = |pairs: &[(&str, &str)]| {
            Config::load_from(None, &env(pairs))
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[("LATCH_RETRY_BASE", "soon")]).contains("retry_base"));
        assert!(err(&[("LATCH_LISTEN", "nowhere")]).contains("listen"));
        assert!(err(&[("LATCH_RETRY_MAX_ATTEMPTS", "ten")]).contains("retry_max_attempts"));
        assert!(err(&[("LATCH_RETRY_MAX_ATTEMPTS", "0")]).contains("retry_max_attempts"));
        assert!(err(&[("LATCH_RETRY_BSE", "1s")]).contains("LATCH_RETRY_BSE"));
        assert!(err(&[("LATCH_RETRY_POLICY", "random")]).contains("retry_policy"));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("latch.toml");
        std::fs::write(&file, "lisen = \"x\"\n").unwrap();
        let e = Config::load_from(Some(&file), &[]).unwrap_err().to_string();
        assert!(e.contains("unknown key `lisen`"), "{e}");
    }

    #[test]
    fn fixed_delays_parse_from_text() {
        let c = Config::load_from(None, &env(&[("LATCH_RETRY_FIXED", "1s, 2s,500ms")])).unwrap();
        assert_eq!(
            c.retry_fixed,
            vec![
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_millis(500)
            ]
        );
    }

    #[test]
    fn empty_optional_values_mean_unset() {
        let c = Config::load_from(None, &env(&[("LATCH_API_TOKEN", "")])).unwrap();
        assert_eq!(c.api_token, None);
    }

    #[test]
    fn cluster_settings_need_postgresql_and_sane_values() {
        let load = |pairs: &[(&str, &str)]| Config::load_from(None, &env(pairs));
        for key in [
            "LATCH_CLUSTER_LEASE",
            "LATCH_CLUSTER_PARTITIONS",
            "LATCH_CLUSTER_SECRET",
            "LATCH_NODE_ADVERTISE",
        ] {
            let value = match key {
                "LATCH_CLUSTER_LEASE" => "5s",
                "LATCH_CLUSTER_PARTITIONS" => "64",
                "LATCH_NODE_ADVERTISE" => "http://10.0.0.5:8080",
                _ => "s3cret-value",
            };
            let e = load(&[(key, value)]).unwrap_err().to_string();
            assert!(e.contains(&key[6..].to_lowercase()), "{e}");
            assert!(e.contains("one node"), "{e}");
        }
        let pg = ("LATCH_DATABASE_URL", "postgres://u@127.0.0.1/db");
        let c = load(&[pg]).unwrap();
        assert_eq!((c.partitions(), c.lease()), (128, Duration::from_secs(10)));
        let c = load(&[
            pg,
            ("LATCH_CLUSTER_LEASE", "3s"),
            ("LATCH_CLUSTER_PARTITIONS", "16"),
        ])
        .unwrap();
        assert_eq!((c.partitions(), c.lease()), (16, Duration::from_secs(3)));
        for (k, v) in [
            ("LATCH_CLUSTER_PARTITIONS", "0"),
            ("LATCH_CLUSTER_PARTITIONS", "5000"),
            ("LATCH_CLUSTER_LEASE", "200ms"),
            ("LATCH_NODE_ADVERTISE", "10.0.0.5:8080"),
        ] {
            let e = load(&[pg, (k, v)]).unwrap_err().to_string();
            assert!(e.contains(&k[6..].to_lowercase()), "{k}={v}: {e}");
        }
        let c = load(&[pg, ("LATCH_CLUSTER_SECRET", "s3cret-value")]).unwrap();
        assert_eq!(c.redact("key s3cret-value"), "key ***");
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let one: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(c.advertise(any), None, "a wildcard is no address");
        assert_eq!(c.advertise(one).as_deref(), Some("http://127.0.0.1:8080"));
    }

    #[test]
    fn rate_limits_parse_with_and_without_burst() {
        let c = Config::load_from(None, &[]).unwrap();
        assert_eq!(c.rate_limit, None);
        let c = Config::load_from(None, &env(&[("LATCH_RATE_LIMIT", "200/s burst 400")])).unwrap();
        assert_eq!(
            c.rate_limit,
            Some(RateLimit {
                per_second: 200.0,
                burst: 400
            })
        );
        assert_eq!(RateLimit::parse("5/s").unwrap().burst, 5);
        let slow = RateLimit::parse("30/m").unwrap();
        assert_eq!((slow.per_second, slow.burst), (0.5, 1));
        let c = Config::load_from(None, &env(&[("LATCH_RATE_LIMIT", "")])).unwrap();
        assert_eq!(c.rate_limit, None);
        for bad in [
            "fast",
            "0/s",
            "10/h",
            "10/s burst",
            "10/s burst 0",
            "10/s bust 5",
        ] {
            let e = Config::load_from(None, &env(&[("LATCH_RATE_LIMIT", bad)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("rate_limit"), "{bad}: {e}");
        }
    }

    #[test]
    fn redact_masks_url_passwords_and_the_token() {
        let mut c = Config::for_data_dir(Path::new("/tmp"));
        c.database_url = Some("postgres://latch:pg%2Fsecret@db:5432/latch".into());
        c.amqp_url = Some("amqps://guest:rabbitpass@mq/%2f".into());
        c.api_token = Some("tok-123456".into());
        let text = "cannot connect to postgres://latch:pg%2Fsecret@db:5432/latch (pg/secret); \
                    amqps://guest:rabbitpass@mq/%2f refused; token tok-123456; \
                    http://u:p@ch:8123?x=1 and http://plain:8123/";
        let r = c.redact(text);
        for secret in [
            "pg%2Fsecret",
            "pg/secret",
            "rabbitpass",
            "tok-123456",
            "u:p@",
        ] {
            assert!(!r.contains(secret), "{secret} leaked in {r}");
        }
        assert!(r.contains("postgres://latch:***@db:5432/latch"), "{r}");
        assert!(r.contains("http://u:***@ch:8123?x=1"), "{r}");
        assert!(r.contains("http://plain:8123/"), "{r}");
    }

    #[test]
    fn the_ssrf_guard_settings_parse() {
        let c = Config::load_from(None, &[]).unwrap();
        assert!(c.delivery_allow_nets.is_empty());
        assert!(!c.delivery_https_only);
        let c = Config::load_from(
            None,
            &env(&[
                (
                    "LATCH_DELIVERY_ALLOW_NETS",
                    "127.0.0.0/8, 10.0.0.0/8,fd00::/8",
                ),
                ("LATCH_DELIVERY_HTTPS_ONLY", "true"),
            ]),
        )
        .unwrap();
        let nets: Vec<String> = c
            .delivery_allow_nets
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(nets, ["127.0.0.0/8", "10.0.0.0/8", "fd00::/8"]);
        assert!(c.delivery_https_only);
        let e = Config::load_from(None, &env(&[("LATCH_DELIVERY_ALLOW_NETS", "10.0.0.0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("delivery_allow_nets"), "{e}");
        let e = Config::load_from(None, &env(&[("LATCH_DELIVERY_HTTPS_ONLY", "yes")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("delivery_https_only"), "{e}");
    }
}
