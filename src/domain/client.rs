//! Clients: who gets notified, where, and with which signing secret.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;

use super::time::Millis;

/// Prefix of Standard Webhooks secrets.
pub const SECRET_PREFIX: &str = "whsec_";

/// Longest client name, in characters (as JSON Schema's `maxLength` counts).
pub const NAME_MAX_CHARS: usize = 256;
/// Longest webhook URL, in characters.
pub const URL_MAX_CHARS: usize = 2048;

/// A registered client.
#[derive(Debug, Clone, PartialEq)]
pub struct Client {
    /// Generated ULID: sortable by creation time, safe in URLs.
    pub id: String,
    pub name: String,
    pub url: String,
    /// `whsec_<base64 key>`, the key being what HMAC-SHA256 signs with.
    pub secret: String,
    pub created_at: Millis,
}

/// A new client id.
pub fn new_client_id() -> String {
    ulid::Ulid::new().to_string()
}

/// A fresh secret with a 24-byte random key, as Standard Webhooks suggests.
pub fn generate_secret() -> String {
    let mut key = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The HMAC key inside a `whsec_` secret.
pub fn secret_key(secret: &str) -> Result<Vec<u8>, String> {
    let b64 = secret
        .strip_prefix(SECRET_PREFIX)
        .ok_or_else(|| format!("secret must start with {SECRET_PREFIX:?}"))?;
    let key = STANDARD
        .decode(b64)
        .map_err(|_| "secret must be \"whsec_\" followed by base64".to_string())?;
    if !(16..=64).contains(&key.len()) {
        return Err(format!(
            "secret key must be 16 to 64 bytes long, got {}",
            key.len()
        ));
    }
    Ok(key)
}

/// Checks a client's display name.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("name must not be empty".into());
    }
    if name.chars().count() > NAME_MAX_CHARS {
        return Err(format!("name must be at most {NAME_MAX_CHARS} characters"));
    }
    Ok(())
}

/// The shape of a webhook URL: `http(s)://`, a DNS name (its last label starting with a
/// letter, so it is never read as a number) or a dotted IPv4 address, an optional port,
/// path and query. Stricter than URL parsers in general, so the OpenAPI document can state
/// exactly what is accepted (`api::contract` publishes this very pattern).
pub const URL_PATTERN: &str = concat!(
    "^[hH][tT][tT][pP][sS]?://",
    "(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?",
    "|(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))",
    "(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?",
    "(?:/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*",
    "(?:\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?$",
);

/// Checks a webhook URL against [`URL_PATTERN`] and its length.
pub fn validate_url(url: &str) -> Result<(), String> {
    static SHAPE: std::sync::LazyLock<regex::Regex> =
        std::sync::LazyLock::new(|| regex::Regex::new(URL_PATTERN).expect("a valid pattern"));
    if !SHAPE.is_match(url) {
        return Err(
            "url must be http(s)://, a DNS name or IPv4 address, an optional port, path and query"
                .into(),
        );
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("url is not a valid URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "url must use http or https, not {:?}",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("url must name a host".into());
    }
    if url.chars().count() > URL_MAX_CHARS {
        return Err(format!("url must be at most {URL_MAX_CHARS} characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_decode() {
        let s = generate_secret();
        assert!(s.starts_with("whsec_"));
        assert_eq!(secret_key(&s).unwrap().len(), 24);
        assert_ne!(generate_secret(), s);
    }

    #[test]
    fn bad_secrets_are_explained() {
        assert!(secret_key("abc").unwrap_err().contains("whsec_"));
        assert!(secret_key("whsec_!!!").unwrap_err().contains("base64"));
        assert!(secret_key("whsec_AAAA").unwrap_err().contains("16 to 64"));
    }

    #[test]
    fn urls() {
        assert!(validate_url("http://127.0.0.1:9000/hook").is_ok());
        assert!(validate_url("https://example.com/a?b=c").is_ok());
        assert!(validate_url("ftp://example.com/").is_err());
        assert!(validate_url("example.com/hook").is_err());
        assert!(validate_url("").is_err());
    }
}
