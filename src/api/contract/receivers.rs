//! The receiver settings of a client in the document (`headers`, `auth`, `tls`): every
//! pattern and bound the checks of `domain::receiver` apply, from the same constants.

use serde_json::{Value, json};

use super::merge;
use crate::domain::client::URL_MAX_CHARS;
use crate::domain::destination::HTTP_PATTERN;
use crate::domain::receiver::{
    AUTH_NAME_MAX, AUTH_SECRET_MAX, AUTH_URL_MAX, HEADER_NAME_MAX, HEADER_VALUE_MAX, HEADERS_MAX,
    PEM_MAX, RESERVED_HEADERS, RESERVED_PREFIX,
};

/// A header name (`domain::receiver::validate_headers`): an HTTP token.
const HEADER_NAME_PATTERN: &str = "^[A-Za-z0-9!#$%&'*+.^_`|~-]+$";
/// A header value: printable ASCII, spaces and tabs only between words.
const HEADER_VALUE_PATTERN: &str = "^(?:[!-~]+(?:[ \\t]+[!-~]+)*)?$";
/// Text without control characters (Rust's `char::is_control`: Unicode's Cc).
const NO_CONTROL: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";

/// `name` matched whatever its letters' case: `[Hh][Oo][Ss][Tt]`.
fn any_case(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphabetic() {
                format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase())
            } else if c.is_ascii_alphanumeric() {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        })
        .collect()
}

/// The header names latch sets itself, in any case, and the `webhook-` ones.
fn reserved_headers_pattern() -> String {
    let names: Vec<String> = RESERVED_HEADERS.iter().map(|n| any_case(n)).collect();
    format!("^(?:{}|{}.*)$", names.join("|"), any_case(RESERVED_PREFIX))
}

/// A client's receiver settings: header names and values, each kind of `auth` with its
/// fields' bounds and no other field, the PEM texts' sizes; and `authorization` among
/// the headers only without `auth`.
pub(super) fn constrain(doc: &mut Value) {
    let s = "/components/schemas";
    merge(
        doc,
        &format!("{s}/ClientIn/properties/headers"),
        json!({
            "maxProperties": HEADERS_MAX,
            "propertyNames": {
                "type": "string",
                "minLength": 1,
                "maxLength": HEADER_NAME_MAX,
                "pattern": HEADER_NAME_PATTERN,
                "not": {"pattern": reserved_headers_pattern()}
            },
            "additionalProperties": {
                "type": "string",
                "maxLength": HEADER_VALUE_MAX,
                "pattern": HEADER_VALUE_PATTERN
            }
        }),
    );
    merge(
        doc,
        &format!("{s}/ClientIn"),
        json!({
            "if": {"required": ["auth"], "properties": {"auth": {"type": "object"}}},
            "then": {"properties": {"headers": {"propertyNames": {
                "not": {"pattern": format!("^{}$", any_case("authorization"))}
            }}}}
        }),
    );
    let text =
        |min: usize, max: usize| json!({"minLength": min, "maxLength": max, "pattern": NO_CONTROL});
    let fields = [
        (
            "token",
            json!({"minLength": 1, "maxLength": HEADER_VALUE_MAX, "pattern": "^[!-~]+$"}),
        ),
        (
            "username",
            json!({"minLength": 1, "maxLength": AUTH_NAME_MAX,
                "pattern": "^[^:\\u0000-\\u001F\\u007F-\\u009F]*$"}),
        ),
        ("password", text(0, AUTH_SECRET_MAX)),
        (
            "token_url",
            json!({"maxLength": URL_MAX_CHARS, "pattern": HTTP_PATTERN}),
        ),
        ("client_id", text(1, AUTH_NAME_MAX)),
        ("client_secret", text(1, AUTH_SECRET_MAX)),
        ("scope", text(1, AUTH_NAME_MAX)),
        ("audience", text(1, AUTH_URL_MAX)),
    ];
    for i in 0..3 {
        let kind = format!("{s}/AuthIn/oneOf/{i}");
        merge(doc, &kind, json!({"additionalProperties": false}));
        for (field, patch) in &fields {
            let at = format!("{kind}/properties/{field}");
            if doc.pointer(&at).is_some() {
                merge(doc, &at, patch.clone());
            }
        }
    }
    for field in ["client_cert_pem", "client_key_pem", "ca_pem"] {
        merge(
            doc,
            &format!("{s}/TlsIn/properties/{field}"),
            json!({"maxLength": PEM_MAX}),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, text: &str) -> bool {
        regex::Regex::new(pattern).unwrap().is_match(text)
    }

    #[test]
    fn header_patterns_are_what_the_code_accepts() {
        use crate::domain::receiver::validate_headers;
        let reserved = reserved_headers_pattern();
        for name in [
            "X-Api-Key",
            "Authorization",
            "a",
            "HOST",
            "Host",
            "content-Type",
            "Webhook-Id",
            "webhook-",
            "TE",
            "te2",
            "user-agent",
            "x y",
            "",
            "é",
            "X:Y",
            "Keep-Alive",
        ] {
            let by_pattern = matches(HEADER_NAME_PATTERN, name)
                && name.len() <= HEADER_NAME_MAX
                && !matches(&reserved, name);
            let by_code = validate_headers(&[(name.to_string(), "v".to_string())], false).is_ok();
            assert_eq!(by_pattern, by_code, "{name:?}");
        }
        for value in [
            "", "a", "a b", "a\tb", " a", "a ", "a\nb", "ä", "~!", "a  b",
        ] {
            let by_code = validate_headers(&[("X".into(), value.to_string())], false).is_ok();
            assert_eq!(matches(HEADER_VALUE_PATTERN, value), by_code, "{value:?}");
        }
        let auth = format!("^{}$", any_case("authorization"));
        assert!(matches(&auth, "AUTHORIZATION") && !matches(&auth, "authorizations"));
    }

    #[test]
    fn auth_patterns_are_what_the_code_accepts() {
        use crate::domain::receiver::{Auth, validate_auth};
        for (username, ok) in [
            ("u", true),
            ("a:b", false),
            ("tab\there", false),
            ("é", true),
        ] {
            let a = Auth::Basic {
                username: username.into(),
                password: String::new(),
            };
            let pattern = "^[^:\\u0000-\\u001F\\u007F-\\u009F]*$";
            assert_eq!(validate_auth(&a).is_ok(), ok, "{username:?}");
            assert_eq!(matches(pattern, username), ok, "{username:?}");
        }
        for (secret, ok) in [("s", true), ("new\nline", false), ("\u{85}", false)] {
            assert_eq!(matches(NO_CONTROL, secret), ok, "{secret:?}");
        }
        for (url, ok) in [
            ("https://idp.example/oauth/token", true),
            ("http://127.0.0.1:9/t?x=1", true),
            ("https://u:p@idp/t", false),
            ("ftp://idp/t", false),
        ] {
            let a = Auth::OAuth2 {
                token_url: url.into(),
                client_id: "c".into(),
                client_secret: "s".into(),
                scope: None,
                audience: None,
            };
            assert_eq!(validate_auth(&a).is_ok(), ok, "{url}");
            assert_eq!(matches(HTTP_PATTERN, url), ok, "{url}");
        }
    }
}
