//! Cursor pagination shared by every list: `?limit=` (default 100, at most 1000) and
//! `?cursor=`, answered as `{"items": [...], "next_cursor": "..."|null}`.
//!
//! Cursors are the store's raw keys in URL-safe base64, so clients treat them as opaque.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult};
use crate::store::{Page, PageRequest};

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;

/// `?limit=&cursor=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page: 1 to 1000, default 100.
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn to_request(&self) -> ApiResult<PageRequest> {
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_LIMIT}, got {limit}"
            )));
        }
        let after = match &self.cursor {
            None => None,
            Some(c) if c.is_empty() => None,
            Some(c) => Some(
                URL_SAFE_NO_PAD
                    .decode(c)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| {
                        ApiError::new(
                            axum::http::StatusCode::BAD_REQUEST,
                            "invalid_cursor",
                            "cursor is not one this API returned",
                        )
                    })?,
            ),
        };
        Ok(PageRequest { limit, after })
    }
}

/// A page of a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct List<T> {
    pub items: Vec<T>,
    /// Pass as `?cursor=` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl<T> List<T> {
    pub fn from_page<S>(page: Page<S>, f: impl FnMut(S) -> T) -> Self {
        List {
            items: page.items.into_iter().map(f).collect(),
            next_cursor: page.next.map(|n| URL_SAFE_NO_PAD.encode(n)),
        }
    }
}
