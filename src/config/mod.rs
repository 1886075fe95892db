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
use serde::Deserialize;

mod bounds;
mod declared;
mod described;
mod show;
mod values;
pub use bounds::{BOUNDS, Bound, bound_of};
pub use described::{Described, described};
pub use show::show;
pub use values::{RateLimit, parse_duration};
use values::{
    duration, durations, flag, fraction, nets, non_empty, number, opt_duration, opt_number,
    rate_limit,
};

/// The embedded defaults, fully commented: `latch config` prints them.
pub const DEFAULTS: &str = include_str!("../config.default.toml");

/// Longest debounce window, service-wide or a sensor's own: a day.
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(86_400);

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
    #[serde(deserialize_with = "values::address")]
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
    /// Cluster ingest: the consistent-hash exchange producers publish to (routing key =
    /// sensor id), over one queue per partition. Empty: no exchange, the plain queue only.
    pub amqp_exchange: String,
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
    /// While a sensor stays lost, a `sensor.still_lost` reminder every this long. `None`:
    /// no reminders.
    #[serde(default, deserialize_with = "opt_duration")]
    pub lost_reminder: Option<Duration>,
    /// The debounce window of sensors without their own `debounce_s`: a new state is
    /// notified once it has held this long. Zero: notified at once.
    #[serde(deserialize_with = "duration")]
    pub debounce: Duration,
    /// How long a site's first lost sensor waits to see whether the site goes down.
    #[serde(deserialize_with = "duration")]
    pub site_grace: Duration,
    /// A site is down when this share of its sensors is lost (and at least
    /// `site_min_sensors`), or its gateway sensor is.
    #[serde(deserialize_with = "fraction")]
    pub site_down_ratio: f64,
    #[serde(deserialize_with = "number")]
    pub site_min_sensors: u32,
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
    #[serde(default, deserialize_with = "declared::secret")]
    pub api_token: Option<String>,
    #[serde(deserialize_with = "number")]
    pub engine_shards: u32,
    #[serde(deserialize_with = "number")]
    pub engine_batch_max: u32,
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    pub log: String,
    /// How log lines are written: for a person (`text`) or for a log shipper (`json`).
    pub log_format: LogFormat,
    /// OpenTelemetry traces over OTLP/HTTP to this collector URL. `None`: no traces, and
    /// the spans are never built (see `telemetry`).
    #[serde(default, deserialize_with = "non_empty")]
    pub otlp_endpoint: Option<String>,
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
    /// Failed authentications one peer address may make (to `/v1`, and to `/internal` with
    /// a wrong cluster secret) before every request from it is 429 for a while: a token
    /// cannot be guessed at the speed of the network. `None` (set empty): no limit.
    #[serde(default, deserialize_with = "rate_limit")]
    pub auth_failure_limit: Option<RateLimit>,
    /// Cluster mode (PostgreSQL only): the URL other nodes reach this node at. Unset:
    /// `http://` + `listen` when that is not a wildcard address.
    #[serde(default, deserialize_with = "non_empty")]
    pub node_advertise: Option<String>,
    /// Authenticates node-to-node requests (forwarded readings, registry pokes).
    #[serde(default, deserialize_with = "declared::secret")]
    pub cluster_secret: Option<String>,
    /// How long a partition lease lasts without renewal; a dead node's partitions move
    /// after it. Unset: 10 s.
    #[serde(default, deserialize_with = "opt_duration")]
    pub cluster_lease: Option<Duration>,
    /// Partitions of the fleet, fixed when the database is first used. Unset: 128.
    #[serde(default, deserialize_with = "opt_number")]
    pub cluster_partitions: Option<u32>,
    /// Readings and sensor events older than this are deleted. Zero: kept forever.
    #[serde(deserialize_with = "duration")]
    pub retention_readings: Duration,
    /// Finished notifications (not pending) and their attempts older than this are
    /// deleted. Zero: kept forever.
    #[serde(deserialize_with = "duration")]
    pub retention_notifications: Duration,
    /// An HTTP CONNECT proxy for webhooks (`http://` or `https://` to the proxy).
    #[serde(default, deserialize_with = "non_empty")]
    pub delivery_proxy: Option<String>,
    /// Hosts that bypass `delivery_proxy` (reqwest's `NO_PROXY` syntax).
    #[serde(default, deserialize_with = "non_empty")]
    pub delivery_no_proxy: Option<String>,
    /// The keys that seal clients' secrets at rest; `None`: the data folder's key file.
    #[serde(default, deserialize_with = "values::secret_keys")]
    pub secret_key: Option<crate::secrets::SecretKeys>,
    /// A file holding those keys (systemd's `LoadCredential`, a mounted secret): read by
    /// the keyring at start and again when a value names a key it does not hold.
    #[serde(default, deserialize_with = "values::opt_path")]
    pub secret_key_file: Option<PathBuf>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line a record for a person; colours only when stdout is a terminal.
    Text,
    /// One JSON object a line, with the span fields, for log shippers.
    Json,
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
        Layers::read(path, env)?.config()
    }

    /// Defaults only, with the data folder moved (tests and benchmarks).
    pub fn for_data_dir(dir: &Path) -> Self {
        let mut c = Self::load_from(None, &[]).expect("embedded defaults are valid");
        c.data_dir = dir.to_path_buf();
        c
    }

    fn validate(&self) -> anyhow::Result<()> {
        self.check_bounds().map_err(anyhow::Error::msg)?;
        if self.retry_policy == RetryPolicyKind::Fixed && self.retry_fixed.is_empty() {
            bail!("invalid setting `retry_fixed`: the fixed policy needs at least one delay");
        }
        if self.amqp_queue.trim().is_empty() {
            bail!("invalid setting `amqp_queue`: must not be empty");
        }
        check_exchange_name(&self.amqp_exchange)?;
        if self.mqtt_topic.trim().is_empty() {
            bail!("invalid setting `mqtt_topic`: must not be empty");
        }
        self.validate_proxy()?;
        self.check_secret_key()?;
        self.validate_cluster()
    }

    /// The key that seals clients' secrets comes from one place; a shared store's comes from
    /// outside the data folder. A node's own `secret.key` would seal the store under a key
    /// the other nodes lack (they then refuse to start), and a node in a container without
    /// a persistent volume would take the key, and every client's secret, with it when
    /// replaced. Also checked where a shared store is opened, for configurations built in
    /// code.
    pub fn check_secret_key(&self) -> anyhow::Result<()> {
        if let Some(path) = &self.secret_key_file {
            if self.secret_key.is_some() {
                bail!(
                    "invalid setting `secret_key_file`: secret_key is set too; give the keys \
                     in one of them"
                );
            }
            crate::secrets::read_given_file(path)
                .map_err(|e| anyhow::anyhow!("invalid setting `secret_key_file`: {e}"))?;
        }
        if self.database_url.is_none()
            || self.secret_key.is_some()
            || self.secret_key_file.is_some()
        {
            return Ok(());
        }
        let mut message = "invalid setting `secret_key`: a shared store (database_url) needs \
             the key that seals clients' secrets from outside the data folder, the same on \
             every node. Make one with `(umask 077; openssl rand -base64 32 > \
             /etc/latch/secret.key)` and set LATCH_SECRET_KEY_FILE=/etc/latch/secret.key (or \
             LATCH_SECRET_KEY to what the file holds)"
            .to_string();
        let old = self.data_dir.join(crate::secrets::KEY_FILE);
        if old.exists() {
            message.push_str(&format!(
                ". {} was made by an earlier start: if the store's secrets are sealed under \
                 it, move it out of the data folder and name it in LATCH_SECRET_KEY_FILE \
                 instead of making a new key",
                old.display()
            ));
        }
        bail!(message)
    }

    /// `delivery_proxy` is a URL latch can send through; `delivery_no_proxy` needs it.
    fn validate_proxy(&self) -> anyhow::Result<()> {
        match &self.delivery_proxy {
            Some(p) => {
                let ok = reqwest::Url::parse(p).is_ok_and(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.host().is_some()
                        && matches!(u.path(), "" | "/")
                        && u.query().is_none()
                });
                if !ok {
                    bail!(
                        "invalid setting `delivery_proxy`: {p:?} is not a proxy URL like \
                         http://proxy.internal:3128"
                    );
                }
            }
            None if self.delivery_no_proxy.is_some() => {
                bail!("invalid setting `delivery_no_proxy`: it needs delivery_proxy")
            }
            None => {}
        }
        Ok(())
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

/// The exchange's queues are `{exchange}.{partition}` and AMQP names are at most 255
/// bytes of `[A-Za-z0-9._:-]`: a name that cannot be declared is refused at start.
fn check_exchange_name(name: &str) -> anyhow::Result<()> {
    let room = 255 - ".4095".len();
    if name.len() > room {
        bail!("invalid setting `amqp_exchange`: at most {room} characters");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        bail!("invalid setting `amqp_exchange`: {c:?} is not one of A-Z a-z 0-9 . _ : -");
    }
    if name.starts_with("amq.") {
        bail!("invalid setting `amqp_exchange`: names starting with amq. are RabbitMQ's own");
    }
    Ok(())
}

/// The settings as the layers give them, before they are checked: each key's value, and
/// where the ones not left at their default came from.
pub(crate) struct Layers {
    table: BTreeMap<String, toml::Value>,
    /// The file or variable that set a key; absent: the embedded default.
    origin: BTreeMap<String, String>,
}

impl Layers {
    /// The defaults, the file (`path`, or `./latch.toml` when present) and `env`, each
    /// checked for unknown keys.
    pub(crate) fn read(path: Option<&Path>, env: &[(String, String)]) -> anyhow::Result<Self> {
        let mut table = parse_table(DEFAULTS, "embedded defaults")?;
        let mut origin = BTreeMap::new();
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
                origin.insert(k.clone(), file.display().to_string());
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
            origin.insert(key.clone(), name.clone());
            table.insert(key, toml::Value::String(value.clone()));
        }
        Ok(Self { table, origin })
    }

    /// The settings, checked.
    pub(crate) fn config(&self) -> anyhow::Result<Config> {
        self.refuse_masks()?;
        let table = toml::Value::Table(self.table.clone().into_iter().collect());
        // The message of the value's own error: its `Display` names the key again.
        let config: Config = serde_path_to_error::deserialize(table).map_err(|e| {
            anyhow::anyhow!("invalid setting `{}`: {}", e.path(), e.inner().message())
        })?;
        // A validation message may quote a URL with its password.
        config
            .validate()
            .map_err(|e| anyhow::anyhow!(config.redact(&format!("{e:#}"))))?;
        Ok(config)
    }
}

impl Layers {
    /// `latch config` prints a secret as `***` and a URL's password as `user:***@`; its
    /// output is a valid settings file, so a value copied from it would run with the mask
    /// as the secret (a token nobody holds, a password the database refuses at once).
    fn refuse_masks(&self) -> anyhow::Result<()> {
        let secrets = declared::secret_settings();
        for (key, value) in &self.origin {
            let Some(toml::Value::String(text)) = self.table.get(key) else {
                continue;
            };
            let masked =
                (secrets.contains(&key.as_str()) && text.trim() == "***") || text.contains(":***@");
            if masked {
                bail!(
                    "invalid setting `{key}` (from {value}): *** is the mask `latch config` \
                     prints in place of a secret; give the secret itself"
                );
            }
        }
        Ok(())
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

impl Config {
    /// `text` with every secret of these settings masked: the password of each configured
    /// URL, the API token, and the password part of any other `scheme://user:pass@` in it.
    /// For messages that may quote a URL, such as a failed start.
    pub fn redact(&self, text: &str) -> String {
        let mut out = redact_userinfo(text);
        let urls = [
            &self.delivery_proxy,
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
mod tests;
