//! The one refusal type and its one mapping to HTTP, for webhooks, the API and admin alike:
//! a [`Refusal`] (its kind, a fixed label, a message that says what was wrong and what to do)
//! answered with its kind's status and `{"error": message}`.

use std::net::SocketAddr;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use oncegate_core::{Refusal, RefusalKind};
use serde_json::json;

use crate::Shared;
use crate::base::meters::Layer;

/// A refusal's status: the one mapping.
pub(crate) fn status(kind: RefusalKind) -> StatusCode {
    match kind {
        RefusalKind::Unauthenticated | RefusalKind::Stale => StatusCode::UNAUTHORIZED,
        RefusalKind::BadInput => StatusCode::BAD_REQUEST,
        RefusalKind::NotFound => StatusCode::NOT_FOUND,
        RefusalKind::Method => StatusCode::METHOD_NOT_ALLOWED,
        RefusalKind::Timeout => StatusCode::REQUEST_TIMEOUT,
        RefusalKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        RefusalKind::Replayed | RefusalKind::InFlight | RefusalKind::Conflict => {
            StatusCode::CONFLICT
        }
        RefusalKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        RefusalKind::Handler => StatusCode::BAD_GATEWAY,
        RefusalKind::HandlerTimeout => StatusCode::GATEWAY_TIMEOUT,
    }
}

/// A refusal as an axum answer.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) Refusal);

impl Refused {
    /// A refusal of `kind`, labelled `label` (for counters), saying `message`.
    pub(crate) fn new(kind: RefusalKind, label: &'static str, message: impl Into<String>) -> Self {
        Self(Refusal::new(kind, label, message))
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let Self(refusal) = self;
        (
            status(refusal.kind),
            axum::Json(json!({ "error": refusal.message })),
        )
            .into_response()
    }
}

/// [`Refused::new`], answered.
pub(crate) fn refused(
    kind: RefusalKind,
    label: &'static str,
    message: impl Into<String>,
) -> Response {
    Refused::new(kind, label, message).into_response()
}

/// A refused request on the webhook listener (or a body that did not arrive on any listener):
/// counted by its kind, summarized in the log (never one line per request), answered.
pub(crate) fn counted<S>(
    shared: &Shared<S>,
    peer: Option<SocketAddr>,
    refusal: Refusal,
) -> Response {
    let stats = &shared.stats;
    match refusal.kind {
        RefusalKind::Replayed => {
            stats.bump(&stats.replays_rejected, "oncegate_guard_refused_total");
            shared.meters.dropped(Layer::Nonce);
        }
        RefusalKind::Stale => {
            stats.bump(&stats.stale_timestamps, "oncegate_guard_refused_total");
            shared.meters.dropped(Layer::StaleTimestamp);
        }
        // Not bad input: counted where they happen (store, queue bound, handler), or by
        // their label alone (a double click).
        RefusalKind::Unavailable
        | RefusalKind::Handler
        | RefusalKind::HandlerTimeout
        | RefusalKind::InFlight
        | RefusalKind::Conflict => {}
        _ => stats.bump(&stats.bad_requests, "oncegate_bad_requests_total"),
    }
    metrics::counter!("oncegate_refused_total", "reason" => refusal.label).increment(1);
    shared.summaries.note(refusal.label, peer, &refusal.message);
    Refused(refusal).into_response()
}
