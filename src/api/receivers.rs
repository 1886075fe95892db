//! A client's receiver settings as the API takes and shows them: `headers`, `auth` and
//! `tls` (DESIGN §5). What is secret in them is write-only: header values read back as
//! `"[redacted]"`, `auth` without its token, password or client secret, `tls` as the
//! certificate's subject and expiry.
//!
//! On create, absent or `null` means none. On replace, absent keeps what the client has
//! (its secrets cannot be read back to be sent again), `null` removes it; a header sent
//! back as `"[redacted]"` keeps its value, so a client read and sent back unchanged keeps
//! everything.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, ApiResult};
use crate::delivery::guard::Guard;
use crate::domain::receiver::{self, Auth, REDACTED, Receiver, Tls};
use crate::domain::{Millis, time};

/// Takes a present field as `Some`, `null` included (`Some(None)`): with
/// `#[serde(default)]`, an absent one stays `None`.
pub(super) fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// As [`present`], for a field that must be a JSON object or `null`: serde would read an
/// array as a struct's fields in order (`[null, null]` as a `tls` leaving everything out).
pub(super) fn present_object<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error as _;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(Some(None)),
        v @ serde_json::Value::Object(_) => serde_json::from_value(v)
            .map(|t| Some(Some(t)))
            .map_err(D::Error::custom),
        other => Err(D::Error::custom(format!(
            "expected an object or null, got {other}"
        ))),
    }
}

/// How latch authenticates to the receiver. Its secret (`token`, `password`,
/// `client_secret`) is write-only: on replace, left out it is kept when the receiver it goes
/// to stays the same (the same `type`, and for OAuth2 a `token_url` on the same origin), so
/// an `auth` read back and sent again keeps it.
#[derive(Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AuthIn {
    /// `Authorization: Bearer <token>` on every request.
    Bearer {
        /// Write-only; required on create.
        #[serde(default)]
        #[schema(min_length = 1)]
        token: Option<String>,
    },
    /// `Authorization: Basic …` on every request.
    Basic {
        username: String,
        /// Write-only; required on create.
        #[serde(default)]
        password: Option<String>,
    },
    /// A token from `token_url` (OAuth2 client credentials grant; the client
    /// authenticates with HTTP Basic), sent as a bearer token. It is kept until shortly
    /// before it expires and fetched again once when the receiver answers 401; a token
    /// endpoint that fails fails the attempt with the error code `auth_failed`.
    #[serde(rename = "oauth2_client_credentials")]
    Oauth2ClientCredentials {
        /// Checked by the SSRF guard like the client's URL.
        token_url: String,
        client_id: String,
        /// Write-only; required on create.
        #[serde(default)]
        #[schema(min_length = 1)]
        client_secret: Option<String>,
        #[serde(default)]
        scope: Option<String>,
        #[serde(default)]
        audience: Option<String>,
    },
}

impl AuthIn {
    /// Whether its secret is given (not left out to keep the current one).
    fn has_secret(&self) -> bool {
        match self {
            AuthIn::Bearer { token } => token.is_some(),
            AuthIn::Basic { password, .. } => password.is_some(),
            AuthIn::Oauth2ClientCredentials { client_secret, .. } => client_secret.is_some(),
        }
    }

    /// The authentication it makes, its secret taken from `current` when left out and it
    /// would go to the same receiver; otherwise a 422 naming the field.
    fn resolve(self, current: Option<&Auth>) -> ApiResult<Auth> {
        let missing = |field: &str| {
            ApiError::invalid(format!(
                "auth.{field} is required: it is write-only, so it is kept only when `auth` \
                 is left out or keeps its type (and, for oauth2_client_credentials, its \
                 token_url's origin)"
            ))
        };
        Ok(match self {
            AuthIn::Bearer { token } => Auth::Bearer {
                token: match (token, current) {
                    (Some(t), _) => t,
                    (None, Some(Auth::Bearer { token })) => token.clone(),
                    (None, _) => return Err(missing("token")),
                },
            },
            AuthIn::Basic { username, password } => Auth::Basic {
                username,
                password: match (password, current) {
                    (Some(p), _) => p,
                    (None, Some(Auth::Basic { password, .. })) => password.clone(),
                    (None, _) => return Err(missing("password")),
                },
            },
            AuthIn::Oauth2ClientCredentials {
                token_url,
                client_id,
                client_secret,
                scope,
                audience,
            } => {
                let client_secret = match (client_secret, current) {
                    (Some(s), _) => s,
                    (
                        None,
                        Some(Auth::OAuth2 {
                            token_url: was,
                            client_secret,
                            ..
                        }),
                    ) if receiver::origin(was).is_some()
                        && receiver::origin(was) == receiver::origin(&token_url) =>
                    {
                        client_secret.clone()
                    }
                    (None, _) => return Err(missing("client_secret")),
                };
                Auth::OAuth2 {
                    token_url,
                    client_id,
                    client_secret,
                    scope,
                    audience,
                }
            }
        })
    }
}

/// A client's authentication, without its secret.
#[derive(Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AuthOut {
    Bearer {},
    Basic {
        username: String,
    },
    #[serde(rename = "oauth2_client_credentials")]
    Oauth2ClientCredentials {
        token_url: String,
        client_id: String,
        scope: Option<String>,
        audience: Option<String>,
    },
}

impl From<&Auth> for AuthOut {
    fn from(a: &Auth) -> Self {
        match a {
            Auth::Bearer { .. } => AuthOut::Bearer {},
            Auth::Basic { username, .. } => AuthOut::Basic {
                username: username.clone(),
            },
            Auth::OAuth2 {
                token_url,
                client_id,
                scope,
                audience,
                ..
            } => AuthOut::Oauth2ClientCredentials {
                token_url: token_url.clone(),
                client_id: client_id.clone(),
                scope: scope.clone(),
                audience: audience.clone(),
            },
        }
    }
}

/// A client certificate for mutual TLS (PEM). Refused at once (422) when it does not
/// parse, its key is not its own, or it has expired. On replace, the key left out is kept
/// for a new certificate of the same key, and both left out keep the certificate (a
/// `ca_pem` given then replaces only the CAs), so a `tls` read back and sent again keeps it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsIn {
    /// The certificate, then any intermediates. Required on create.
    #[serde(default)]
    #[schema(min_length = 1)]
    pub client_cert_pem: Option<String>,
    /// Its private key (PKCS #8, PKCS #1 or SEC1). Write-only; required on create.
    #[serde(default)]
    #[schema(min_length = 1)]
    pub client_key_pem: Option<String>,
    /// CAs to verify the receiver's certificate with instead of the system's roots.
    #[serde(default)]
    #[schema(min_length = 1)]
    pub ca_pem: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only)]
    pub subject: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only)]
    pub expires_at: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only)]
    pub ca_subject: Option<String>,
}

impl TlsIn {
    /// The certificate it makes, what it leaves out taken from `current`.
    fn resolve(self, current: Option<&Tls>, now: Millis) -> ApiResult<Tls> {
        let (cert, key) = match (self.client_cert_pem, self.client_key_pem, current) {
            (Some(c), Some(k), _) => (c, k),
            (Some(c), None, Some(t)) => (c, t.client_key_pem.clone()),
            (None, None, Some(t)) => match self.ca_pem {
                None => return Ok(t.clone()),
                Some(_) => (t.client_cert_pem.clone(), t.client_key_pem.clone()),
            },
            (None, Some(_), _) => {
                return Err(ApiError::invalid(
                    "tls.client_cert_pem is required with tls.client_key_pem",
                ));
            }
            (_, None, None) => {
                return Err(ApiError::invalid(
                    "tls.client_cert_pem and tls.client_key_pem are required: the client has \
                     no certificate to keep",
                ));
            }
        };
        let tls = receiver::parse_tls(&cert, &key, self.ca_pem.as_deref(), now)
            .map_err(ApiError::invalid)?;
        crate::delivery::tls::check(&tls).map_err(ApiError::invalid)?;
        Ok(tls)
    }
}

/// A client certificate as shown: its subject and expiry.
#[derive(Serialize, ToSchema)]
pub struct TlsOut {
    /// RFC 4514, e.g. `CN=latch,O=Example`.
    pub subject: String,
    pub expires_at: String,
    /// The subject of the first CA of `ca_pem`; `null`: the system's roots.
    pub ca_subject: Option<String>,
}

/// What the API shows of a client's receiver settings.
pub(super) struct Shown {
    pub headers: BTreeMap<String, String>,
    pub auth: Option<AuthOut>,
    pub tls: Option<TlsOut>,
}

pub(super) fn shown(r: &Receiver) -> Shown {
    Shown {
        headers: r
            .headers
            .iter()
            .map(|(n, _)| (n.clone(), REDACTED.to_string()))
            .collect(),
        auth: r.auth.as_ref().map(AuthOut::from),
        tls: r.tls.as_ref().map(|t| TlsOut {
            subject: t.subject.clone(),
            expires_at: time::format(t.not_after),
            ca_subject: t.ca_subject.clone(),
        }),
    }
}

/// The fields of a create or replace body that make the receiver settings.
pub(super) struct Given {
    pub headers: Option<Option<BTreeMap<String, String>>>,
    pub auth: Option<Option<AuthIn>>,
    pub tls: Option<Option<TlsIn>>,
}

/// A replace that moves the client from `from` to the URL `to` on another origin must give
/// again each receiver secret it has (`headers` and `auth`; `null` removes them): kept
/// ones, a header sent back as `"[redacted]"` included, would go to a host they were never
/// given for, and `POST /v1/clients/{id}/test` sends them at once. The TLS client key is
/// kept: a handshake proves it without sending it.
pub(super) fn check_new_origin(
    given: &Given,
    current: &Receiver,
    from: &str,
    to: &str,
) -> ApiResult<()> {
    let (Some(old), Some(new)) = (receiver::origin(from), receiver::origin(to)) else {
        return Ok(());
    };
    if old == new {
        return Ok(());
    }
    let headers_kept = !current.headers.is_empty()
        && match &given.headers {
            None => true,
            Some(None) => false,
            Some(Some(map)) => map.values().any(|v| v == REDACTED),
        };
    let auth_kept = current.auth.is_some()
        && match &given.auth {
            None => true,
            Some(None) => false,
            Some(Some(a)) => !a.has_secret(),
        };
    let kept: Vec<&str> = [("headers", headers_kept), ("auth", auth_kept)]
        .into_iter()
        .filter_map(|(name, kept)| kept.then_some(name))
        .collect();
    if kept.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "url: the origin changes from {old} to {new}, so {} must be given again (or null to \
         remove): the values set for {old} are not sent to another host",
        kept.join(" and ")
    )))
}

/// The receiver settings a create (`current` is `None`) or replace leaves the client with,
/// checked: header names and values, the auth fields (and its token URL by the SSRF
/// guard), the certificate. A broker destination keeps them but does not use them (its
/// credentials are in its URL), as it keeps `batch`.
pub(super) async fn settle(
    given: Given,
    current: Option<&Receiver>,
    guard: &Guard,
    now: Millis,
) -> ApiResult<Receiver> {
    let kept = current.cloned().unwrap_or_default();
    let headers = match given.headers {
        None => kept.headers.clone(),
        Some(None) => Vec::new(),
        Some(Some(map)) => map
            .into_iter()
            .map(|(name, value)| {
                if value != REDACTED {
                    return Ok((name, value));
                }
                kept.headers
                    .iter()
                    .find(|(n, _)| *n == name)
                    .or_else(|| {
                        kept.headers
                            .iter()
                            .find(|(n, _)| n.eq_ignore_ascii_case(&name))
                    })
                    .map(|(_, v)| (name.clone(), v.clone()))
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "headers.{name}: {REDACTED:?} keeps a header's value, and the \
                             client has no header {name}"
                        ))
                    })
            })
            .collect::<ApiResult<Vec<_>>>()?,
    };
    let auth = match given.auth {
        None => kept.auth.clone(),
        Some(None) => None,
        Some(Some(a)) => Some(a.resolve(kept.auth.as_ref())?),
    };
    let tls = match given.tls {
        None => kept.tls.clone(),
        Some(None) => None,
        Some(Some(t)) => Some(t.resolve(kept.tls.as_ref(), now)?),
    };
    let r = Receiver { headers, auth, tls };
    receiver::validate_headers(&r.headers, r.auth.is_some()).map_err(ApiError::invalid)?;
    if let Some(a) = &r.auth {
        receiver::validate_auth(a).map_err(ApiError::invalid)?;
        if let Auth::OAuth2 { token_url, .. } = a {
            guard
                .vet(token_url)
                .await
                .map_err(|e| ApiError::invalid(format!("auth.token_url is not allowed: {e}")))?;
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> Receiver {
        Receiver {
            headers: vec![("X-Key".into(), "secret-1".into())],
            auth: Some(Auth::Bearer {
                token: "tok".into(),
            }),
            tls: None,
        }
    }

    fn given(
        headers: Option<Option<BTreeMap<String, String>>>,
        auth: Option<Option<AuthIn>>,
    ) -> Given {
        Given {
            headers,
            auth,
            tls: None,
        }
    }

    #[tokio::test]
    async fn absent_keeps_null_removes_redacted_keeps_a_value() {
        let g = Guard::default();
        let c = current();
        let kept = settle(given(None, None), Some(&c), &g, 0).await.unwrap();
        assert_eq!(kept, c);
        let removed = settle(given(Some(None), Some(None)), Some(&c), &g, 0)
            .await
            .unwrap();
        assert!(removed.is_empty());
        let map = BTreeMap::from([
            ("x-key".to_string(), REDACTED.to_string()),
            ("X-New".to_string(), "v".to_string()),
        ]);
        let merged = settle(given(Some(Some(map)), None), Some(&c), &g, 0)
            .await
            .unwrap();
        assert_eq!(
            merged.headers,
            vec![
                ("X-New".to_string(), "v".to_string()),
                ("x-key".to_string(), "secret-1".to_string())
            ]
        );
        let unknown = BTreeMap::from([("X-Gone".to_string(), REDACTED.to_string())]);
        assert!(
            settle(given(Some(Some(unknown)), None), Some(&c), &g, 0)
                .await
                .is_err()
        );
    }

    #[test]
    fn shown_holds_no_secret() {
        let s = shown(&current());
        assert_eq!(s.headers["X-Key"], REDACTED);
        let json = serde_json::to_string(&s.auth).unwrap();
        assert_eq!(json, r#"{"type":"bearer"}"#);
    }
}
