//! Where a client's notifications go: its `url` names a webhook (`http(s)://…`) or a
//! broker destination, an MQTT topic (`mqtt://[user:pass@]host[:port]/topic/…`) or an
//! AMQP exchange (`amqp://[user:pass@]host[:port][/vhost]?exchange=NAME&routing_key=…`).
//!
//! Each scheme's shape is one regular expression, and [`URL_PATTERN`], their union, is
//! what the OpenAPI document publishes: a URL matching it is accepted (unless the SSRF
//! guard refuses its address) and any other is refused, so the document states exactly
//! what the API takes. The parser below reads the parts out and names what is wrong in
//! words; a unit test holds the two to the same verdicts.
//!
//! The grammar is deliberately narrow where a looser one would make the pattern inexact:
//! percent-escapes only of printable ASCII (so decoding never fails), no escapes in topics
//! or routing keys (a decoded `+` or `#` would be an MQTT wildcard), exchange names as
//! AMQP 0-9-1 defines them. No TLS to brokers in this build: `mqtts://` and `amqps://` are
//! refused with a message saying so, never reached in plain text.

use std::fmt;

use percent_encoding::percent_decode_str;

/// Longest client URL, in characters.
pub const URL_MAX_CHARS: usize = 2048;

/// The placeholders a topic or routing key may hold, filled in per notification.
pub const PLACEHOLDERS: [&str; 2] = ["{sensor_id}", "{type}"];

macro_rules! host {
    () => {
        concat!(
            "(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?",
            "|(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))",
        )
    };
}
macro_rules! port {
    () => {
        "(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?"
    };
}
/// A percent-escape of a printable ASCII character (0x20–0x7e).
macro_rules! pct {
    () => {
        "%(?:[2-6][0-9A-Fa-f]|7[0-9A-Ea-e])"
    };
}
macro_rules! userinfo {
    () => {
        concat!(
            "(?:(?:[A-Za-z0-9._~!$&'()*+,;=-]|",
            pct!(),
            ")+(?::(?:[A-Za-z0-9._~!$&'()*+,;=:-]|",
            pct!(),
            ")*)?@)?"
        )
    };
}
macro_rules! placeholder {
    () => {
        "\\{sensor_id\\}|\\{type\\}"
    };
}
macro_rules! http_url {
    () => {
        concat!(
            "[hH][tT][tT][pP][sS]?://",
            host!(),
            port!(),
            "(?:/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*",
            "(?:\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?",
        )
    };
}
macro_rules! mqtt_url {
    () => {
        concat!(
            "[mM][qQ][tT][tT]://",
            userinfo!(),
            host!(),
            port!(),
            "/(?:[A-Za-z0-9._~!&'()*,;=:@/-]|",
            placeholder!(),
            ")(?:[A-Za-z0-9._~!$&'()*,;=:@/-]|",
            placeholder!(),
            ")*",
        )
    };
}
macro_rules! exchange {
    () => {
        "[A-Za-z0-9._:-]{1,255}"
    };
}
macro_rules! key_char {
    () => {
        concat!("(?:[A-Za-z0-9._~:*/-]|", placeholder!(), ")")
    };
}
macro_rules! amqp_url {
    () => {
        concat!(
            "[aA][mM][qQ][pP]://",
            userinfo!(),
            host!(),
            port!(),
            "(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|",
            pct!(),
            ")+)?\\?(?:exchange=",
            exchange!(),
            "(?:&routing_key=",
            key_char!(),
            "*)?|routing_key=",
            key_char!(),
            "*&exchange=",
            exchange!(),
            "|exchange=&routing_key=",
            key_char!(),
            "+|routing_key=",
            key_char!(),
            "+&exchange=)",
        )
    };
}

/// The shape of a client URL: a webhook (`http(s)://`, a DNS name — its last label
/// starting with a letter, so it is never read as a number — or a dotted IPv4 address,
/// an optional port, path and query), an MQTT topic or an AMQP exchange. Stricter than URL
/// parsers in general, so the OpenAPI document can state exactly what is accepted
/// (`api::contract` publishes this very pattern).
pub const URL_PATTERN: &str = concat!(
    "^(?:",
    http_url!(),
    "|",
    mqtt_url!(),
    "|",
    amqp_url!(),
    ")$"
);

/// A webhook URL's shape: `http(s)://`, a DNS name or IPv4 address, port, path, query.
pub const HTTP_PATTERN: &str = concat!("^", http_url!(), "$");
const BROKER_PATTERN: &str = concat!("^(?:", mqtt_url!(), "|", amqp_url!(), ")$");
const HOST_PATTERN: &str = concat!("^(?:", host!(), ")", port!(), "$");

/// Whether `s` has the shape `pattern` (one of the patterns above) describes.
fn matches(pattern: &'static str, s: &str) -> bool {
    use std::sync::LazyLock;
    static COMPILED: LazyLock<[(&str, regex::Regex); 4]> = LazyLock::new(|| {
        [URL_PATTERN, HTTP_PATTERN, BROKER_PATTERN, HOST_PATTERN]
            .map(|p| (p, regex::Regex::new(p).expect("a valid pattern")))
    });
    COMPILED
        .iter()
        .find(|(p, _)| *p == pattern)
        .is_some_and(|(_, re)| re.is_match(s))
}

/// Which broker protocol a destination speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Mqtt,
    Amqp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Mqtt => "mqtt",
            Protocol::Amqp => "amqp",
        }
    }
}

/// A broker and the login to it: latch keeps one connection per distinct one, shared by
/// every client whose URL names it. Its `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Broker {
    pub protocol: Protocol,
    /// Lower case: host names are not case-sensitive, and one broker is one connection.
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    /// AMQP: the virtual host the connection opens (`/` by default); empty for MQTT.
    pub vhost: String,
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.protocol.as_str())?;
        if let Some(u) = &self.username {
            write!(f, "{u}@")?;
        }
        write!(f, "{}:{}", self.host, self.port)?;
        if self.protocol == Protocol::Amqp {
            write!(f, " vhost {:?}", self.vhost)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Broker({self}")?;
        if self.password.is_some() {
            f.write_str(", password ***")?;
        }
        f.write_str(")")
    }
}

/// A topic or routing key with `{sensor_id}` and `{type}` to fill in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub String);

impl Template {
    pub fn fill(&self, sensor_id: &str, kind: &str) -> String {
        self.0
            .replace("{sensor_id}", sensor_id)
            .replace("{type}", kind)
    }
}

/// An MQTT destination: published at QoS 1 to the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttTarget {
    pub broker: Broker,
    pub topic: Template,
}

/// An AMQP destination: published to the exchange (`""`: the default exchange, which
/// routes to the queue the routing key names) with the routing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpTarget {
    pub broker: Broker,
    pub exchange: String,
    pub routing_key: Template,
}

/// Where a client's notifications go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A webhook: POSTed to the URL itself.
    Http,
    Mqtt(MqttTarget),
    Amqp(AmqpTarget),
}

/// Whether `url` names a broker destination (its scheme, whatever the rest).
pub fn is_broker(url: &str) -> bool {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    matches!(scheme.as_deref(), Some("mqtt" | "amqp" | "mqtts" | "amqps"))
}

/// Checks a client URL: its shape and length; the SSRF guard judges its address
/// separately.
pub fn validate_url(url: &str) -> Result<(), String> {
    parse(url).map(drop)
}

/// Reads a client URL; the error says what is wrong with it.
pub fn parse(url: &str) -> Result<Destination, String> {
    if url.chars().count() > URL_MAX_CHARS {
        return Err(format!("url must be at most {URL_MAX_CHARS} characters"));
    }
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    let dest = match scheme.as_str() {
        "http" | "https" => parse_http(url)?,
        "mqtt" | "amqp" => parse_broker(url)?,
        "mqtts" | "amqps" => {
            return Err(format!(
                "url: {scheme}:// (TLS) is not supported by this build; use {}:// on a \
                 trusted network or through a TLS tunnel",
                &scheme[..4]
            ));
        }
        _ => {
            return Err("url must be http(s)://host/…, mqtt://host/topic or \
                        amqp://host/vhost?exchange=NAME"
                .into());
        }
    };
    if !matches(URL_PATTERN, url) {
        // What the parser took but the published pattern does not: the pattern is the
        // contract. (The unit tests keep this from happening.)
        return Err("url does not have the shape the API documents (see url's pattern)".into());
    }
    Ok(dest)
}

/// Checks an `http(s)://` URL other than a client's own (an OAuth2 token URL): the shape
/// [`HTTP_PATTERN`] says, at most [`URL_MAX_CHARS`].
pub fn validate_http_url(url: &str) -> Result<(), String> {
    if url.chars().count() > URL_MAX_CHARS {
        return Err(format!("url must be at most {URL_MAX_CHARS} characters"));
    }
    parse_http(url).map(drop)
}

fn parse_http(url: &str) -> Result<Destination, String> {
    if !matches(HTTP_PATTERN, url) {
        return Err(
            "url must be http(s)://, a DNS name or IPv4 address, an optional port, path and query"
                .into(),
        );
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("url is not a valid URL: {e}"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("url must name a host".into());
    }
    Ok(Destination::Http)
}

fn parse_broker(url: &str) -> Result<Destination, String> {
    let (scheme, rest) = url.split_once("://").expect("checked by the caller");
    let protocol = if scheme.eq_ignore_ascii_case("mqtt") {
        Protocol::Mqtt
    } else {
        Protocol::Amqp
    };
    let dest = match protocol {
        Protocol::Mqtt => parse_mqtt(rest)?,
        Protocol::Amqp => parse_amqp(rest)?,
    };
    if !matches(BROKER_PATTERN, url) {
        return Err(format!(
            "url is not a valid {} destination: {}",
            protocol.as_str(),
            shape(protocol)
        ));
    }
    Ok(dest)
}

fn shape(p: Protocol) -> &'static str {
    match p {
        Protocol::Mqtt => {
            "mqtt://[user[:password]@]host[:port]/topic, where the topic may hold {sensor_id} and {type}"
        }
        Protocol::Amqp => {
            "amqp://[user[:password]@]host[:port][/vhost]?exchange=NAME[&routing_key=KEY], where the key may hold {sensor_id} and {type}"
        }
    }
}

fn parse_mqtt(rest: &str) -> Result<Destination, String> {
    if rest.contains(['?', '#']) {
        return Err(
            "an mqtt url takes no query or fragment: mqtt://[user:password@]host[:port]/topic \
                    (`#` and `+` are wildcards, which cannot be published to)"
                .into(),
        );
    }
    let Some((authority, topic)) = rest.split_once('/') else {
        return Err(format!(
            "an mqtt url names the topic to publish to: {}",
            shape(Protocol::Mqtt)
        ));
    };
    let broker = authority_of(Protocol::Mqtt, authority, String::new())?;
    if topic.is_empty() {
        return Err(format!("the topic is empty: {}", shape(Protocol::Mqtt)));
    }
    if topic.contains('+') {
        return Err(
            "the topic must not hold `+`: it is an MQTT wildcard, which cannot be published to"
                .into(),
        );
    }
    if topic.starts_with('$') {
        return Err("topics starting with `$` are the broker's own ($SYS …): pick another".into());
    }
    check_template("topic", topic, "._~!$&'()*,;=:@/-")?;
    Ok(Destination::Mqtt(MqttTarget {
        broker,
        topic: Template(topic.to_string()),
    }))
}

fn parse_amqp(rest: &str) -> Result<Destination, String> {
    if rest.contains('#') {
        return Err("an amqp url takes no fragment (`#`)".into());
    }
    let (before, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (authority, vhost) = match before.split_once('/') {
        Some((a, v)) => (a, Some(v)),
        None => (before, None),
    };
    let vhost = match vhost {
        None => "/".to_string(),
        Some("") => {
            return Err(
                "the vhost is empty: leave the path out (or write /%2f) for the default \
                        vhost `/`"
                    .into(),
            );
        }
        Some(v) => decode("vhost", v, "._~!$&'()*+,;=:@-")?,
    };
    let broker = authority_of(Protocol::Amqp, authority, vhost)?;
    let Some(query) = query else {
        return Err(format!(
            "an amqp url names the exchange: {}",
            shape(Protocol::Amqp)
        ));
    };
    let (mut exchange, mut key) = (None, None);
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "exchange" => &mut exchange,
            "routing_key" => &mut key,
            _ => {
                return Err(format!(
                    "unknown parameter {name:?} in the amqp url: it takes exchange and routing_key"
                ));
            }
        };
        if slot.replace(value).is_some() {
            return Err(format!("{name} is given twice in the amqp url"));
        }
    }
    let Some(exchange) = exchange else {
        return Err(format!(
            "an amqp url names the exchange: {}",
            shape(Protocol::Amqp)
        ));
    };
    let key = key.unwrap_or("");
    if exchange.len() > 255
        || !exchange
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
    {
        return Err("the exchange name may hold letters, digits and `._:-`, up to 255".into());
    }
    if exchange.is_empty() && key.is_empty() {
        return Err(
            "the default exchange (exchange=) routes by queue name: give the queue as \
                    routing_key"
                .into(),
        );
    }
    check_template("routing_key", key, "._~:*/-")?;
    Ok(Destination::Amqp(AmqpTarget {
        broker,
        exchange: exchange.to_string(),
        routing_key: Template(key.to_string()),
    }))
}

/// `[user[:password]@]host[:port]`, decoded.
fn authority_of(protocol: Protocol, authority: &str, vhost: String) -> Result<Broker, String> {
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if !matches(HOST_PATTERN, hostport) {
        return Err(format!(
            "the broker must be a DNS name or an IPv4 address with an optional port \
             (1-65535), got {hostport:?}"
        ));
    }
    let (host, port) = match hostport.split_once(':') {
        Some((h, p)) => (
            h,
            p.parse().map_err(|_| "port must be 1-65535".to_string())?,
        ),
        None => (
            hostport,
            match protocol {
                Protocol::Mqtt => 1883,
                Protocol::Amqp => 5672,
            },
        ),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => {
            let (user, pass) = match u.split_once(':') {
                Some((user, pass)) => (user, Some(pass)),
                None => (u, None),
            };
            if user.is_empty() {
                return Err("the user name before `:password@` is empty".into());
            }
            let user = decode("user name", user, "._~!$&'()*+,;=-")?;
            let pass = pass
                .map(|p| decode("password", p, "._~!$&'()*+,;=:-"))
                .transpose()?;
            (Some(user), pass)
        }
    };
    Ok(Broker {
        protocol,
        host: host.to_ascii_lowercase(),
        port,
        username,
        password,
        vhost,
    })
}

/// Percent-decodes `s`, whose characters must be letters, digits, `extra` or escapes of
/// printable ASCII.
fn decode(what: &str, s: &str, extra: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if !hex.is_some_and(|c| (0x20..0x7f).contains(&c)) {
                return Err(format!(
                    "the {what} holds a `%` that is not an escape of a printable ASCII \
                     character (%20 to %7E)"
                ));
            }
            i += 3;
        } else if b.is_ascii_alphanumeric() || extra.as_bytes().contains(&b) {
            i += 1;
        } else {
            // Never a character of a password in a message: errors are logged and shown.
            let found = match what {
                "password" => String::new(),
                _ => format!(", not {:?}", s[i..].chars().next().unwrap_or(' ')),
            };
            return Err(format!(
                "the {what} may hold letters, digits, `{extra}` and %-escapes{found}"
            ));
        }
    }
    Ok(percent_decode_str(s).decode_utf8_lossy().into_owned())
}

/// A topic or routing key: letters, digits, `extra`, and the placeholders.
fn check_template(what: &str, s: &str, extra: &str) -> Result<(), String> {
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if c == '{' {
            match PLACEHOLDERS.iter().find(|p| rest.starts_with(**p)) {
                Some(p) => rest = &rest[p.len()..],
                None => {
                    let name = rest.split_inclusive('}').next().unwrap_or(rest);
                    return Err(format!(
                        "unknown placeholder {name} in the {what}: it may hold {{sensor_id}} \
                         and {{type}}"
                    ));
                }
            }
        } else if c.is_ascii_alphanumeric() || extra.contains(c) {
            rest = &rest[1..];
        } else {
            return Err(format!(
                "the {what} may hold letters, digits, `{extra}`, {{sensor_id}} and {{type}}, \
                 not {c:?}"
            ));
        }
    }
    Ok(())
}

/// `url` with the password of a broker destination masked (`mqtt://user:***@host/…`), for
/// callers who may not see secrets and for logs. Other URLs are returned as they are
/// (webhook URLs take no user info).
pub fn redact(url: &str) -> String {
    if !is_broker(url) {
        return url.to_string();
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Where the user info of `url` is: `(start, colon, end)` byte offsets of `user:password`
/// in the authority, the colon's being that of the password, if there is one.
fn password_span(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://")? + 3;
    let rest = &url[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..end].rfind('@')?;
    let colon = rest[..at].find(':')?;
    Some((start + colon, start + at))
}

/// `url` without the password in its user info, and that password (`None` when it has
/// none, or an empty one): the store keeps the password sealed, apart from the URL.
/// [`join_password`] puts it back exactly.
pub fn split_password(url: &str) -> (String, Option<String>) {
    match password_span(url) {
        Some((colon, at)) if at > colon + 1 => (
            format!("{}{}", &url[..colon], &url[at..]),
            Some(url[colon + 1..at].to_string()),
        ),
        _ => (url.to_string(), None),
    }
}

/// `url` (without a password, as [`split_password`] left it) with `password` back in its
/// user info.
pub fn join_password(url: &str, password: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{}:{password}{}", &url[..start + at], &url[start + at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests;
