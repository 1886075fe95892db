//! Query strings: an operation takes the parameters it declares, and a name it does not
//! declare is refused (400 `unknown_parameter`) rather than ignored. Ignored, a misspelt
//! filter (`?stat=failed`) answers the whole list, and the caller takes it for the
//! filtered one.
//!
//! What an operation takes is read from the `IntoParams` declarations that also write its
//! parameters into the OpenAPI document, so the check and the document cannot disagree. A
//! handler takes all of its query structs in one [`ApiQuery`] (a tuple when there are
//! several), because each alone would refuse the others' names.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Request};
use axum::http::Method;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use utoipa::IntoParams;
use utoipa::openapi::path::ParameterIn;

use super::error::ApiError;

/// A struct of query parameters, as one operation's `params(...)` declares it.
pub trait Params: DeserializeOwned + IntoParams {}

/// What one [`ApiQuery`] reads: one [`Params`] struct or a tuple of them.
pub trait QueryParams: Sized {
    /// Adds the names these structs declare to `names`.
    fn names(names: &mut Vec<String>);
    fn parse(query: &str) -> Result<Self, ApiError>;
}

impl<T: Params> QueryParams for T {
    fn names(names: &mut Vec<String>) {
        names.extend(
            T::into_params(|| Some(ParameterIn::Query))
                .into_iter()
                .map(|p| p.name),
        );
    }

    fn parse(query: &str) -> Result<Self, ApiError> {
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
    }
}

macro_rules! tuple_params {
    ($($t:ident),+) => {
        impl<$($t: Params),+> QueryParams for ($($t,)+) {
            fn names(names: &mut Vec<String>) {
                $(<$t as QueryParams>::names(names);)+
            }

            fn parse(query: &str) -> Result<Self, ApiError> {
                Ok(($(<$t as QueryParams>::parse(query)?,)+))
            }
        }
    };
}

tuple_params!(A, B);
tuple_params!(A, B, C);

/// The query of a request, every name in it one the operation takes; its rejections are
/// contract errors.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: QueryParams> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let mut known = Vec::new();
        T::names(&mut known);
        let unknown = form_urlencoded::parse(query.as_bytes())
            .map(|(name, _)| name)
            .find(|name| !known.iter().any(|k| k == name));
        if let Some(name) = unknown {
            return Err(ApiError::unknown_parameter(&name, &known));
        }
        T::parse(query).map(ApiQuery)
    }
}

/// The operations that declare no query parameter, by method and path as routed: they
/// take no [`ApiQuery`], so a query string given to one is refused by [`refuse_query`].
#[derive(Default)]
pub struct Bare(HashSet<(Method, String)>);

impl Bare {
    /// Read from the document the routes derive, which lists each operation's parameters.
    pub fn from_document(doc: &utoipa::openapi::OpenApi) -> Self {
        let mut bare = HashSet::new();
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                (Method::GET, &item.get),
                (Method::PUT, &item.put),
                (Method::POST, &item.post),
                (Method::DELETE, &item.delete),
                (Method::PATCH, &item.patch),
            ] {
                let Some(op) = op else { continue };
                let takes_query = op
                    .parameters
                    .iter()
                    .flatten()
                    .any(|p| matches!(p.parameter_in, ParameterIn::Query));
                if !takes_query {
                    bare.insert((method, path.clone()));
                }
            }
        }
        Self(bare)
    }
}

/// Middleware: a query string on an operation that takes none is refused, as [`ApiQuery`]
/// refuses a name its operation does not take (`GET /v1/sensors/N1?cursor=…` would
/// otherwise answer as if the cursor were used).
pub async fn refuse_query(
    axum::extract::State(bare): axum::extract::State<Arc<Bare>>,
    req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let method = match req.method() {
        &Method::HEAD => Method::GET,
        m => m.clone(),
    };
    if let (Some(route), Some(query)) = (route, req.uri().query())
        && bare.0.contains(&(method, route.to_string()))
        && let Some((name, _)) = form_urlencoded::parse(query.as_bytes()).next()
    {
        return ApiError::unknown_parameter(&name, &[]).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::pagination::PageParams;
    use crate::api::readings::RangeParams;

    #[test]
    fn a_tuple_takes_the_names_of_each_struct() {
        let mut names = Vec::new();
        <(RangeParams, PageParams)>::names(&mut names);
        assert_eq!(names, ["from", "to", "limit", "cursor"]);
        let (range, page) = <(RangeParams, PageParams)>::parse("limit=5&to=x").unwrap();
        assert_eq!((range.to.as_deref(), page.limit), (Some("x"), Some(5)));
        let Err(e) = <(RangeParams, PageParams)>::parse("limit=five") else {
            panic!("five is not a limit");
        };
        assert!(e.message.contains("limit"), "{}", e.message);
    }
}
