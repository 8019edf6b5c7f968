//! The API for callers in other languages: business keys (`/keys`) and sends (`/send`), with
//! their budgets, pacing and edits.

pub(crate) mod budget;
pub(crate) mod callers;
#[cfg(feature = "send")]
pub(crate) mod edits;
pub(crate) mod keys;
#[cfg(feature = "send")]
pub(crate) mod outbox;
#[cfg(feature = "send")]
pub(crate) mod pace;
pub(crate) mod results;
#[cfg(feature = "send")]
pub(crate) mod send;

pub use keys::read_body;

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use oncegate_core::{RefusalKind, Store};

use crate::Shared;
use crate::refusal::Refused;

pub(crate) fn router<S: Store>(shared: Arc<Shared<S>>) -> Router {
    let router = Router::new();
    #[cfg(feature = "send")]
    let router = router.route("/send/{source}", post(crate::api::send::send::<S>));
    router
        .route("/keys/claim", post(crate::api::keys::claim::<S>))
        .route("/keys/renew", post(crate::api::keys::renew::<S>))
        .route("/keys/complete", post(crate::api::keys::complete::<S>))
        .route("/keys/release", post(crate::api::keys::release::<S>))
        .route("/openapi.json", get(openapi))
        .fallback(|| async {
            Refused::new(RefusalKind::NotFound, "not_found",
                "POST /keys/claim, /keys/renew, /keys/complete, /keys/release or /send/<source>; GET /openapi.json describes them",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(crate::api::callers::BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            crate::api::callers::gate::<S>,
        ))
        .with_state(shared)
}

/// The API's OpenAPI document (its routes are checked against this router in a test).
pub(crate) const OPENAPI: &str = include_str!("api_openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// Each caller's claims at 0, so that a dashboard and an alert see "no claims yet" rather than
/// no series.
pub(crate) fn register<'a>(callers: impl Iterator<Item = &'a str>) {
    for caller in callers {
        for outcome in ["acquired", "done", "in_flight", "conflict"] {
            metrics::counter!("oncegate_keys_total", "caller" => caller.to_owned(), "op" => "claim", "outcome" => outcome)
                .increment(0);
        }
    }
}
