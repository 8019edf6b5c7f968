//! Who may use the admin listener: its bearer token, checked before a body or query is read.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;
use oncegate_core::{RefusalKind, Store};
use subtle::ConstantTimeEq;

use crate::Shared;
use crate::refusal::refused;

#[allow(clippy::result_large_err)]
pub(crate) fn authorized<S>(shared: &Shared<S>, headers: &HeaderMap) -> Result<(), Response> {
    let Some(token) = &shared.admin.token else {
        return Ok(());
    };
    // RFC 9110: the scheme is case-insensitive; the token is compared in constant time.
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, given)| given.trim());
    let matches = given.is_some_and(|given| {
        given.len() == token.len() && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
    });
    if matches {
        Ok(())
    } else {
        Err(refused(
            RefusalKind::Unauthenticated,
            "unauthorized",
            "send Authorization: Bearer <server.admin_token>",
        ))
    }
}

/// An authorized caller's query: 401 without the token (before the query is even read, so an
/// unauthenticated caller learns nothing of how queries parse), 400 naming `usage` when it does
/// not parse.
#[allow(clippy::result_large_err)]
pub(crate) fn authorized_query<S, Q: serde::de::DeserializeOwned>(
    shared: &Shared<S>,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    usage: &str,
) -> Result<Q, Response> {
    authorized(shared, headers)?;
    Query::<Q>::try_from_uri(uri)
        .map(|Query(query)| query)
        .map_err(|error| {
            refused(
                RefusalKind::BadInput,
                "bad_query",
                format!("{error}; {usage}"),
            )
        })
}

/// The admin listener's gate: every request that changes something (POST, PUT, DELETE) is
/// authorized (401 before the body is read), and every body arrives within
/// `server.body_timeout`.
pub(crate) async fn gate<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::GET
        && request.method() != Method::HEAD
        && let Err(denied) = authorized(&shared, request.headers())
    {
        return denied;
    }
    crate::gate::buffered(&shared, request, next, shared.ingress.body_limit).await
}
