//! A client's URL: a webhook (`http(s)://…`) or a destination of one of the broker sinks
//! ([`super::broker`]). [`URL_PATTERN`], the union of their shapes, is what the OpenAPI
//! document publishes: a URL matching it is accepted (unless the SSRF guard refuses its
//! address) and any other is refused, so the document states exactly what the API takes.
//! [`validate_url`] reads the parts and names what is wrong in words; unit tests hold the
//! two to the same verdicts.

use std::sync::LazyLock;

use super::broker;
use crate::domain::destination::{Shape, check_length, http_url, validate_http_url};

/// The shape of a client URL: a webhook (`http(s)://`, a DNS name — its last label
/// starting with a letter, so it is never read as a number — or a dotted IPv4 address,
/// an optional port, path and query) or one of the sinks' (an MQTT topic, an AMQP
/// exchange). Stricter than URL parsers in general, so the OpenAPI document can state
/// exactly what is accepted (`api::contract` publishes this very pattern).
pub static URL_PATTERN: LazyLock<String> = LazyLock::new(|| {
    let sinks: Vec<&str> = broker::url_alternatives().collect();
    format!("^(?:{}|{})$", http_url!(), sinks.join("|"))
});

static URL: Shape = Shape::new(|| regex::Regex::new(&URL_PATTERN).expect("a valid pattern"));

/// Checks a client URL: its shape and length; the SSRF guard judges its address
/// separately.
pub fn validate_url(url: &str) -> Result<(), String> {
    check_length(url)?;
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") {
        validate_http_url(url)?;
    } else if let Some(verdict) = broker::check_url(scheme, url) {
        verdict?;
    } else {
        let sinks: Vec<&str> = broker::examples().collect();
        return Err(format!("url must be http(s)://host/…, {}", or_list(&sinks)));
    }
    if !URL.matches(url) {
        // What the parser took but the published pattern does not: the pattern is the
        // contract. (The unit tests keep this from happening.)
        return Err("url does not have the shape the API documents (see url's pattern)".into());
    }
    Ok(())
}

/// `a, b or c`.
fn or_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests;
