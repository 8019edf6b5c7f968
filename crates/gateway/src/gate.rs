//! Bodies on every listener: read within `server.body_timeout` and a size bound, and on the API
//! and admin listeners only once the caller is known from the headers, so that a client that
//! trickles a body (or sends none of the body it announced) holds a connection for the timeout
//! at most, and an unauthenticated one not at all.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use oncegate_core::{Refusal, RefusalKind};

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

/// Runs `next` with the request's body read whole (or answers the refusal).
pub(crate) async fn buffered<S>(
    shared: &Shared<S>,
    request: Request,
    next: Next,
    limit: usize,
) -> Response {
    let (parts, body) = request.into_parts();
    match read_body(&parts.headers, body, limit, shared.limits.body_timeout).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(refusal) => crate::refusal::counted(shared, None, refusal),
    }
}
