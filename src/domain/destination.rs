//! What the domain knows of a client's URL: a webhook's shape (`http(s)://…`), which the
//! API also checks other URLs by (an OAuth2 token URL), the grammar every destination's URL
//! shares (host, port, user info, percent-escapes), and the password a broker URL may hold,
//! masked for display and kept apart in the store. Each broker destination's own shape
//! (an MQTT topic, an AMQP exchange) is its sink's, in `delivery::broker`, which also
//! publishes the union of them all as the API's URL pattern.
//!
//! The grammar is deliberately narrow where a looser one would make the published pattern
//! inexact: percent-escapes only of printable ASCII (so decoding never fails), a DNS name
//! or a dotted IPv4 address as the host.

use std::sync::LazyLock;

use percent_encoding::percent_decode_str;

/// Longest client URL, in characters.
pub const URL_MAX_CHARS: usize = 2048;

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
            $crate::domain::destination::pct!(),
            ")+(?::(?:[A-Za-z0-9._~!$&'()*+,;=:-]|",
            $crate::domain::destination::pct!(),
            ")*)?@)?"
        )
    };
}
macro_rules! http_url {
    () => {
        concat!(
            "[hH][tT][tT][pP][sS]?://",
            $crate::domain::destination::host!(),
            $crate::domain::destination::port!(),
            "(?:/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*",
            "(?:\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?",
        )
    };
}
// For the sinks' own shapes, which are built of the same parts.
pub(crate) use {host, http_url, pct, port, userinfo};

/// A webhook URL's shape: `http(s)://`, a DNS name or IPv4 address, port, path, query.
pub const HTTP_PATTERN: &str = concat!("^", http_url!(), "$");
const HOST_PATTERN: &str = concat!("^(?:", host!(), ")", port!(), "$");

/// A URL's shape, its pattern compiled on first use.
pub(crate) struct Shape(LazyLock<regex::Regex>);

impl Shape {
    pub(crate) const fn new(compile: fn() -> regex::Regex) -> Self {
        Self(LazyLock::new(compile))
    }

    pub(crate) fn matches(&self, s: &str) -> bool {
        self.0.is_match(s)
    }
}

static HTTP: Shape = Shape::new(|| regex::Regex::new(HTTP_PATTERN).expect("a valid pattern"));
/// A broker's `host[:port]`.
pub(crate) static HOST: Shape =
    Shape::new(|| regex::Regex::new(HOST_PATTERN).expect("a valid pattern"));

/// Whether `url` names a broker destination rather than a webhook: any scheme but
/// `http(s)`, as every URL the API takes is one or the other.
pub fn is_broker(url: &str) -> bool {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    scheme.is_some_and(|s| s != "http" && s != "https")
}

/// Checks an `http(s)://` URL (a client's webhook, an OAuth2 token URL): the shape
/// [`HTTP_PATTERN`] says, at most [`URL_MAX_CHARS`].
pub fn validate_http_url(url: &str) -> Result<(), String> {
    check_length(url)?;
    check_http(url)
}

/// A URL's length against the API's limit.
pub fn check_length(url: &str) -> Result<(), String> {
    if url.chars().count() > URL_MAX_CHARS {
        return Err(format!("url must be at most {URL_MAX_CHARS} characters"));
    }
    Ok(())
}

fn check_http(url: &str) -> Result<(), String> {
    if !HTTP.matches(url) {
        return Err(
            "url must be http(s)://, a DNS name or IPv4 address, an optional port, path and query"
                .into(),
        );
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("url is not a valid URL: {e}"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("url must name a host".into());
    }
    Ok(())
}

/// Percent-decodes `s`, whose characters must be letters, digits, `extra` or escapes of
/// printable ASCII.
pub(crate) fn decode(what: &str, s: &str, extra: &str) -> Result<String, String> {
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
