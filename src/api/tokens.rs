//! `/v1/tokens`: scoped API tokens, and the in-memory table the auth middleware reads.
//!
//! A token's secret is answered once, on create; the store keeps its SHA-256. Every
//! request is checked against [`Tokens`], a copy of the table in memory, so auth costs no
//! database round trip on the ingest path. A create or delete on this node changes the copy
//! once the store has it; on a shared store the copy is also reloaded every
//! [`REFRESH_EVERY`] for what other nodes did. Each change of the copy is announced
//! ([`Tokens::changes`]): a request that lasts, the live stream, is checked again then.
//!
//! A copy that cannot be reloaded (the database out of reach) may still hold a token
//! another node deleted. So on a shared store a copy not confirmed within [`CONFIRM_WITHIN`]
//! admits no token of the table ([`Lookup::Unconfirmed`]): a deletion takes effect
//! everywhere within that bound, reachable or not. The bootstrap token is not in the
//! table, and nothing deletes it, so it is not held to the bound.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody};
use super::pagination::List;
use crate::domain::client::validate_name;
use crate::domain::time;
use crate::domain::token::{self, ApiToken, Scope};
use crate::store::{self, Tokens as TokenStore};

/// How often a node on a shared store reloads the token table: the longest a token
/// created or deleted through another node stays unknown, or valid, here (an open stream
/// of a deleted token included). One small read a second per node.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// How long a node on a shared store takes the tokens of its last good reload: past it, a
/// deletion through another node might be missed, so they are refused (503) until a reload
/// succeeds. Several reload periods, so one slow read does not refuse every request.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(5);

/// What the copy says of a secret.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Known(Grant),
    Unknown,
    /// In the copy, but the copy was last confirmed longer than [`CONFIRM_WITHIN`] ago.
    Unconfirmed,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(delete_token))
}

/// What a known token may do.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub id: String,
    /// Its name, for the audit trail.
    pub name: String,
    pub scopes: Vec<Scope>,
}

/// The token table in memory, by hash of the secret. A `std::sync::RwLock`: every request
/// reads it, a create or delete writes it, and no `.await` happens while it is held.
#[derive(Clone)]
pub struct Tokens {
    by_hash: Arc<RwLock<HashMap<String, Grant>>>,
    /// Bumped at every change of the table.
    version: Arc<watch::Sender<u64>>,
    /// When the last reload that succeeded began, on a shared store ([`follow`]); `None`:
    /// the copy is the only writer's (the embedded store) and always current.
    confirmed: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

impl Default for Tokens {
    fn default() -> Self {
        Self {
            by_hash: Arc::default(),
            version: Arc::new(watch::Sender::new(0)),
            confirmed: Arc::default(),
        }
    }
}

impl Tokens {
    /// Reads the table from the store.
    pub async fn load(store: &dyn TokenStore) -> store::Result<Self> {
        let tokens = Self::default();
        tokens.refresh(store).await?;
        Ok(tokens)
    }

    /// Replaces the copy with the store's table.
    pub async fn refresh(&self, store: &dyn TokenStore) -> store::Result<()> {
        let table = store
            .list_tokens()
            .await?
            .into_iter()
            .map(|t| {
                let grant = Grant {
                    id: t.id,
                    name: t.name,
                    scopes: t.scopes,
                };
                (t.hash, grant)
            })
            .collect();
        let changed = {
            let mut current = self.write();
            let changed = *current != table;
            *current = table;
            changed
        };
        if changed {
            self.changed();
        }
        Ok(())
    }

    /// Tells whoever follows [`Tokens::changes`].
    fn changed(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Marks each change of the table from now on: a grant checked before it may have been
    /// deleted since.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Adds a token the store now holds. In memory only, so that a created token's secret,
    /// already kept, is always answered.
    fn insert(&self, t: &ApiToken) {
        let grant = Grant {
            id: t.id.clone(),
            name: t.name.clone(),
            scopes: t.scopes.clone(),
        };
        self.write().insert(t.hash.clone(), grant);
        self.changed();
    }

    /// Forgets a token the store deleted.
    fn remove(&self, id: &str) {
        self.write().retain(|_, g| g.id != id);
        self.changed();
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Grant>> {
        self.by_hash.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The grant of a secret. A lookup by hash and not a comparison of secrets: what its
    /// timing could reveal is a prefix of a SHA-256, which says nothing of any secret.
    pub fn lookup(&self, secret: &str) -> Lookup {
        let hash = token::hash(secret);
        let grant = self
            .by_hash
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&hash)
            .cloned();
        match grant {
            None => Lookup::Unknown,
            Some(_) if !self.current() => Lookup::Unconfirmed,
            Some(grant) => Lookup::Known(grant),
        }
    }

    /// Whether the copy was confirmed within [`CONFIRM_WITHIN`] (always, unshared).
    fn current(&self) -> bool {
        let confirmed = *self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        confirmed.is_none_or(|at| at.elapsed() <= CONFIRM_WITHIN)
    }

    /// Records a reload that began `at` and succeeded.
    fn confirm(&self, at: tokio::time::Instant) {
        *self.confirmed.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    /// Whether any token exists: once one does, the API requires one.
    pub fn any(&self) -> bool {
        !self
            .by_hash
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

/// Keeps `tokens` following the store's table until `stop`, for nodes sharing a store.
/// The copy counts as confirmed from the start (it was just loaded), then from each reload
/// that succeeds.
pub async fn follow(store: Arc<dyn TokenStore>, tokens: Tokens, stop: CancellationToken) {
    tokens.confirm(tokio::time::Instant::now());
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(REFRESH_EVERY) => {}
        }
        let began = tokio::time::Instant::now();
        match tokens.refresh(store.as_ref()).await {
            Ok(()) => tokens.confirm(began),
            Err(e) => tracing::warn!(error = %e,
                "Could not reload the API tokens; refusing them once unconfirmed for too long."),
        }
    }
}

/// Whether `scopes` allow `method` on `path` (a `/v1` path): `admin` everything, `ingest`
/// posting readings, `read` every `GET` but the token list.
pub fn permits(scopes: &[Scope], method: &Method, path: &str) -> bool {
    scopes.iter().any(|s| match s {
        Scope::Admin => true,
        Scope::Ingest => method == Method::POST && path == "/v1/readings",
        Scope::Read => {
            (method == Method::GET || method == Method::HEAD)
                && path != "/v1/tokens"
                && !path.starts_with("/v1/tokens/")
                && path != "/v1/audit"
        }
    })
}

/// A scope of a token.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum ScopeName {
    /// Everything, tokens included.
    Admin,
    /// `POST /v1/readings` only.
    Ingest,
    /// Every `GET` but `/v1/tokens`.
    Read,
}

impl From<ScopeName> for Scope {
    fn from(s: ScopeName) -> Self {
        match s {
            ScopeName::Admin => Scope::Admin,
            ScopeName::Ingest => Scope::Ingest,
            ScopeName::Read => Scope::Read,
        }
    }
}

impl From<Scope> for ScopeName {
    fn from(s: Scope) -> Self {
        match s {
            Scope::Admin => ScopeName::Admin,
            Scope::Ingest => ScopeName::Ingest,
            Scope::Read => ScopeName::Read,
        }
    }
}

/// A token to make.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenIn {
    /// What the token is for, to recognise it in the list.
    pub name: String,
    /// At least one; repeats are ignored.
    pub scopes: Vec<ScopeName>,
}

/// A token. `token`, the secret, is answered once, on create; lists never show it.
#[derive(Serialize, ToSchema)]
pub struct TokenOut {
    pub id: String,
    pub name: String,
    pub scopes: Vec<ScopeName>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    pub created_at: String,
}

fn token_out(t: ApiToken, secret: Option<String>) -> TokenOut {
    TokenOut {
        id: t.id,
        name: t.name,
        scopes: t.scopes.into_iter().map(ScopeName::from).collect(),
        token: secret,
        created_at: time::format(t.created_at),
    }
}

/// Make a token; its secret is in this answer and nowhere else. Needs an admin token:
/// while no `LATCH_API_TOKEN` is set and no token exists, the API is open and answers 403.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = TokenIn,
    responses((status = 201, body = TokenOut), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn create_token(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<TokenIn>,
) -> ApiResult<(StatusCode, ApiJson<TokenOut>)> {
    if !st.auth_required() {
        return Err(ApiError::forbidden(
            "the API is open (no LATCH_API_TOKEN): set LATCH_API_TOKEN to make tokens",
        ));
    }
    validate_name(&body.name).map_err(ApiError::invalid)?;
    if body.scopes.is_empty() {
        return Err(ApiError::invalid("scopes: give at least one"));
    }
    let mut scopes: Vec<Scope> = body.scopes.into_iter().map(Scope::from).collect();
    scopes.sort();
    scopes.dedup();
    let secret = token::generate_secret();
    let t = ApiToken {
        id: ulid::Ulid::new().to_string(),
        name: body.name,
        scopes,
        hash: token::hash(&secret),
        created_at: st.app.now(),
    };
    st.app.create_token(t.clone()).await?;
    st.tokens.insert(&t);
    tracing::info!(token_id = %t.id, name = %t.name, "API token created.");
    Ok((StatusCode::CREATED, ApiJson(token_out(t, Some(secret)))))
}

/// List tokens, oldest first, without their secrets.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens",
    responses((status = 200, body = List<TokenOut>)))]
async fn list_tokens(State(st): State<AppState>) -> ApiResult<ApiJson<List<TokenOut>>> {
    let items = st.app.tokens().await?;
    Ok(ApiJson(List::from_page(
        store::Page { items, next: None },
        |t| token_out(t, None),
    )))
}

/// Delete a token: it is refused from the next request on (on other nodes of a shared
/// store, within 5 s).
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_token(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    if !st.app.delete_token(id.clone()).await? {
        return Err(ApiError::not_found("token"));
    }
    st.tokens.remove(&id);
    tracing::info!(token_id = %id, "API token deleted.");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_allow_what_they_say() {
        let get = Method::GET;
        let post = Method::POST;
        let ingest = [Scope::Ingest];
        assert!(permits(&ingest, &post, "/v1/readings"));
        assert!(!permits(&ingest, &get, "/v1/sensors"));
        assert!(!permits(&ingest, &post, "/v1/sensors"));
        let read = [Scope::Read];
        assert!(permits(&read, &get, "/v1/sensors/a1"));
        assert!(permits(&read, &get, "/v1/notifications"));
        assert!(!permits(&read, &post, "/v1/readings"));
        assert!(!permits(&read, &Method::DELETE, "/v1/sensors/a1"));
        assert!(!permits(&read, &get, "/v1/tokens"));
        assert!(!permits(&read, &get, "/v1/tokens/x"));
        let both = [Scope::Ingest, Scope::Read];
        assert!(permits(&both, &post, "/v1/readings"));
        assert!(permits(&both, &get, "/v1/sensors"));
        assert!(!permits(&both, &Method::PUT, "/v1/sensors/a1"));
        let admin = [Scope::Admin];
        assert!(permits(&admin, &Method::DELETE, "/v1/tokens/x"));
        assert!(!permits(&[], &get, "/v1/sensors"));
    }
}
