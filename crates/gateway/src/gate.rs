//! Bodies on every listener: read within `server.body_timeout` and a size bound, and on the API
//! and admin listeners only once the caller is known from the headers, so that a client that
//! trickles a body (or sends none of the body it announced) holds a connection for the timeout
//! at most, and an unauthenticated one not at all.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use oncegate_core::{Refusal, RefusalKind, Store};

use crate::Shared;

/// The body within `limit` bytes and `timeout`; a declared length over the limit is refused
/// before any of the body is read.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, Refusal> {
    let too_large = || {
        Refusal::new(
            RefusalKind::TooLarge,
            "too_large",
            format!("body larger than {limit} bytes (server.body_limit)"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(_)) => Err(too_large()),
        Err(_) => Err(Refusal::new(
            RefusalKind::Timeout,
            "slow_body",
            format!("the body did not arrive within {timeout:?} (server.body_timeout)"),
        )),
    }
}

/// The API's gate: every call names an `[[api.caller]]` (401 before the body is read), and its
/// body arrives within `server.body_timeout`.
pub(crate) async fn api<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(denied) = crate::keys_api::caller(&shared, request.headers()) {
        return denied.into_response();
    }
    buffered(&shared, request, next, crate::keys_api::BODY_LIMIT).await
}

/// The admin listener's gate: a POST is authorized (401 before the body is read), and every
/// body arrives within `server.body_timeout`.
pub(crate) async fn admin<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::POST
        && let Err(denied) = crate::admin::authorized(&shared, request.headers())
    {
        return denied;
    }
    buffered(&shared, request, next, shared.body_limit).await
}

/// Runs `next` with the request's body read whole (or answers the refusal).
async fn buffered<S>(shared: &Shared<S>, request: Request, next: Next, limit: usize) -> Response {
    let (parts, body) = request.into_parts();
    match read_body(&parts.headers, body, limit, shared.limits.body_timeout).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(refusal) => crate::ingress::refused(shared, None, refusal),
    }
}
