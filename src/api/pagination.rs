//! Cursor pagination shared by every list: `?limit=` (default 100, at most 1000) and
//! `?cursor=`, answered as `{"items": [...], "next_cursor": "..."|null}`.
//!
//! A cursor is the store's key of the last item of the previous page (a sensor or client
//! id, a sequence number, or `time:id` in history), which clients treat as opaque. Plain
//! keys rather than an encoding of them, so the OpenAPI document can say exactly which
//! cursors are valid (`contract::cursor_pattern`): any key is a position in its list.

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

impl super::query::Params for PageParams {}

impl PageParams {
    pub fn to_request(&self) -> ApiResult<PageRequest> {
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {MAX_LIMIT}, got {limit}"
            )));
        }
        let after = self.cursor.clone().filter(|c| !c.is_empty());
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
            next_cursor: page.next,
        }
    }
}
