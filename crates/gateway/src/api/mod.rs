//! The API for callers in other languages: business keys (`/keys`) and sends (`/send`), with
//! their budgets, pacing and edits.

pub(crate) mod adapt;
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

/// The API wing's state: who may call, its limits, and what sends need.
pub(crate) struct ApiState {
    /// Who may call `/keys` and `/send`.
    pub(crate) callers: Vec<callers::Caller>,
    pub(crate) key_limits: callers::KeyLimits,
    /// The apps `/send/<source>` can send as, by source name: a reload swaps them whole.
    #[cfg(feature = "send")]
    pub(crate) senders: arc_swap::ArcSwap<Senders>,
    /// The multi-tenant sources (WeCom suites, Feishu store apps) `/send/<source>/<tenant>`
    /// sends as each tenant of, by source name: a reload swaps them whole.
    #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
    pub(crate) keepers: arc_swap::ArcSwap<Keepers>,
    /// One platform API call's deadline.
    #[cfg(feature = "send")]
    pub(crate) send_timeout: std::time::Duration,
    /// Sends (and replies) waiting for their rate budgets.
    pub(crate) sends_waiting: budget::Waiting,
    /// The budgets and senders the platforms' rate answers lowered.
    pub(crate) learned: adapt::Learned,
    /// How many sends may wait.
    #[cfg(feature = "send")]
    pub(crate) max_waiting_sends: usize,
    /// Edits of one message, one at a time, the latest winning.
    #[cfg(feature = "send")]
    pub(crate) edits: edits::Edits,
    /// Each receiver's sends one at a time, spaced from the previous answer.
    #[cfg(feature = "send")]
    pub(crate) pacer: Arc<pace::Pacer>,
}

/// The senders in force, by source name.
#[cfg(feature = "send")]
pub(crate) type Senders = std::collections::HashMap<String, Arc<outbox::Sender>>;

/// The keepers in force, by source name.
#[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
pub(crate) type Keepers = std::collections::HashMap<String, crate::credentials::Keeper>;

#[cfg(feature = "send")]
impl ApiState {
    /// Adds `sender` as `name`'s, for a gateway being built.
    pub(crate) fn add_sender(&self, name: String, sender: outbox::Sender) {
        let mut senders = Senders::clone(&self.senders.load());
        senders.insert(name, Arc::new(sender));
        self.senders.store(Arc::new(senders));
    }
}

// Derivable only without `send`, whose defaults are not zero.
#[cfg_attr(not(feature = "send"), allow(clippy::derivable_impls))]
impl Default for ApiState {
    fn default() -> Self {
        Self {
            callers: Vec::new(),
            key_limits: callers::KeyLimits::default(),
            #[cfg(feature = "send")]
            senders: arc_swap::ArcSwap::default(),
            #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
            keepers: arc_swap::ArcSwap::default(),
            #[cfg(feature = "send")]
            send_timeout: std::time::Duration::from_secs(10),
            sends_waiting: budget::Waiting::default(),
            learned: adapt::Learned::default(),
            #[cfg(feature = "send")]
            max_waiting_sends: 1000,
            #[cfg(feature = "send")]
            edits: edits::Edits::default(),
            #[cfg(feature = "send")]
            pacer: Arc::default(),
        }
    }
}

pub(crate) fn router<S: Store>(shared: Arc<Shared<S>>) -> Router {
    let router = Router::new();
    #[cfg(feature = "send")]
    let router = router
        .route("/send/{source}", post(crate::api::send::send::<S>))
        .route(
            "/send/{source}/{tenant}",
            post(crate::api::send::send_for_tenant::<S>),
        );
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
        // Inside the gate: a caller that is not authenticated puts no span in anyone's trace.
        .layer(axum::middleware::from_fn_with_state(shared.clone(), traced::<S>))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            crate::api::callers::gate::<S>,
        ))
        .with_state(shared)
}

/// A span for each API call, in the caller's trace when it sends a W3C `traceparent`: a
/// service's "send this reply" or "claim this key" shows inside the trace of what made it.
async fn traced<S: Store>(
    axum::extract::State(shared): axum::extract::State<Arc<Shared<S>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !shared.traces.on() {
        return next.run(request).await;
    }
    let parent = request
        .headers()
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .and_then(crate::base::traces::parse_traceparent);
    // The path itself: its only variable part is a configured source's name, so span names
    // stay few. (axum's matched-path feature would put the route in every request's
    // extensions, the webhooks' too.)
    let route = request.uri().path().to_owned();
    let method = request.method().to_string();
    let started = std::time::SystemTime::now();
    let response = next.run(request).await;
    let status = response.status();
    let span = crate::base::traces::Finished::new(
        format!("{method} {route}"),
        started,
        std::time::SystemTime::now(),
    )
    .kind(opentelemetry::trace::SpanKind::Server)
    .with("http.request.method", method)
    .with("http.route", route)
    .with("http.response.status_code", i64::from(status.as_u16()))
    .failed(status.is_server_error().then(|| status.to_string()));
    shared.traces.under(parent, span);
    response
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
