//! `/send/<source>`: a message sent once whatever the caller retries — the caller's
//! `Idempotency-Key` and body, read and answered over HTTP; the sending itself is
//! `outbox::send`, which Rust callers use too.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncegate_core::{RefusalKind, Store, key_for};
use serde_json::{Value, json};

use crate::Shared;
use crate::api::budget::Lane;
use crate::api::callers::caller;
use crate::api::outbox::{self, NotSent, Sending};
use crate::refusal::Refused;

pub(crate) use crate::api::outbox::Sender;

/// Each sending source's counters at 0, so that a dashboard and an alert see "no sends yet"
/// rather than no series.
pub(crate) fn register<'a>(sources: impl Iterator<Item = &'a String>) {
    for source in sources {
        for outcome in ["sent", "refused", "transient"] {
            metrics::counter!("oncegate_sends_total", "source" => source.clone(), "outcome" => outcome)
                .increment(0);
        }
        metrics::counter!("oncegate_send_api_calls_total", "source" => source.clone()).increment(0);
        metrics::counter!("oncegate_send_rate_waits_total", "source" => source.clone())
            .increment(0);
    }
}

fn retry_after(after: Duration, message: String) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(
            header::RETRY_AFTER,
            after.as_secs_f64().ceil().max(1.0).to_string(),
        )],
        axum::Json(json!({"error": message})),
    )
        .into_response()
}

/// The header naming the tenant a send goes out as (or `/send/<source>/<tenant>`).
const TENANT_HEADER: &str = "oncegate-tenant";

pub(crate) async fn send<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let tenant = match headers.get(TENANT_HEADER).map(|value| value.to_str()) {
        None => None,
        Some(Ok(tenant)) => Some(tenant.to_owned()),
        Some(Err(_)) => {
            return Refused::new(
                RefusalKind::BadInput,
                "bad_request",
                "the Oncegate-Tenant header is not visible ASCII",
            )
            .into_response();
        }
    };
    match send_once(&shared, &source, tenant.as_deref(), &headers, &body).await {
        Ok(response) => response,
        Err(refused) => refused.into_response(),
    }
}

/// `/send/<source>/<tenant>`: a send as one tenant of a source that serves many.
pub(crate) async fn send_for_tenant<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path((source, tenant)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let named = headers
        .get(TENANT_HEADER)
        .is_some_and(|value| value.as_bytes() != tenant.as_bytes());
    if named {
        return Refused::new(
            RefusalKind::BadInput,
            "bad_request",
            "the path and the Oncegate-Tenant header name different tenants",
        )
        .into_response();
    }
    match send_once(&shared, &source, Some(&tenant), &headers, &body).await {
        Ok(response) => response,
        Err(refused) => refused.into_response(),
    }
}

async fn send_once<S: Store>(
    shared: &Shared<S>,
    source: &str,
    tenant: Option<&str>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, Refused> {
    let caller = caller(shared, headers)?;
    if let Some(per_second) = caller.sends_per_second {
        let bucket = key_for("api", "caller", &caller.name, "sends");
        let rate = oncegate_core::Rate::per_second(per_second.max(1));
        match shared.store.take_rate(&bucket, rate).await {
            Ok(oncegate_core::RateVerdict::Granted) => {}
            Ok(oncegate_core::RateVerdict::Wait(after)) => {
                metrics::counter!("oncegate_sends_total", "source" => source.to_owned(), "outcome" => "caller_over_budget")
                    .increment(1);
                return Ok(retry_after(
                    after,
                    format!(
                        "caller {:?} is over its budget of {per_second} sends per second (api.caller.sends_per_second)",
                        caller.name
                    ),
                ));
            }
            Err(error) => {
                return Err(Refused::new(
                    RefusalKind::Unavailable,
                    "unavailable",
                    format!("the store cannot answer: {error}; nothing was sent, retry"),
                ));
            }
        }
    }
    // Its bounds are the outbox's, for every caller alike.
    let key = headers
        .get("idempotency-key")
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .ok_or_else(|| {
            Refused::new(
                RefusalKind::BadInput,
                "bad_request",
                "send an Idempotency-Key header (UTF-8), the same for every retry",
            )
        })?;
    let mut request: Value = serde_json::from_slice(body).map_err(|error| {
        Refused::new(
            RefusalKind::BadInput,
            "bad_request",
            format!("the body is not JSON: {error}"),
        )
    })?;
    let fields = request.as_object_mut();
    let (wait_ms, priority) = match fields {
        Some(fields) => (fields.remove("wait_ms"), fields.remove("priority")),
        None => (None, None),
    };
    // `"priority": "high"` for mentions; replies go first unless the caller says otherwise.
    let lane = match priority.as_ref().and_then(Value::as_str) {
        Some("high") => Some(Lane::High),
        Some("bulk") => Some(Lane::Bulk),
        None => None,
        Some(other) => {
            return Err(Refused::new(
                RefusalKind::BadInput,
                "bad_request",
                format!("priority {other:?}: \"high\" (replies, mentions) or \"bulk\""),
            ));
        }
    };
    let sending = Sending {
        source,
        tenant,
        namespace: &caller.namespace,
        key,
        request,
        wait: wait_ms
            .and_then(|wait| wait.as_u64())
            .map(Duration::from_millis),
        lane,
    };
    match outbox::send(shared, sending).await {
        Ok(sent) => {
            let status = StatusCode::from_u16(sent.status).unwrap_or(StatusCode::OK);
            let mut response = (status, axum::Json(sent.body)).into_response();
            if sent.replayed {
                response.headers_mut().insert(
                    "idempotent-replayed",
                    axum::http::HeaderValue::from_static("true"),
                );
            }
            Ok(response)
        }
        Err(not_sent) => Ok(answer(not_sent)),
    }
}

/// A 409 with its `state` (`in_flight` or `conflict`) beside the refusal's words; the status
/// from the one mapping of refusals.
fn conflict(state: &str, message: &str) -> Response {
    (
        crate::refusal::status(RefusalKind::Conflict),
        axum::Json(json!({"error": message, "state": state})),
    )
        .into_response()
}

/// Why nothing was sent, as `/send` answers it.
fn answer(not_sent: NotSent) -> Response {
    let message = not_sent.to_string();
    let refused = |kind, label| Refused::new(kind, label, message.clone()).into_response();
    match not_sent {
        NotSent::NoSuchSource | NotSent::NoSuchTenant(_) => {
            refused(RefusalKind::NotFound, "not_found")
        }
        NotSent::BadRequest(_) => refused(RefusalKind::BadInput, "bad_request"),
        // Named as the caller knows the key, and with a `state` as `/keys` answers: a client
        // retries one and not the other without reading the words.
        NotSent::InFlight => conflict(
            "in_flight",
            "a send with this Idempotency-Key is still in flight; retry with the same key",
        ),
        NotSent::Conflict => conflict(
            "conflict",
            "this Idempotency-Key was used for another message",
        ),
        NotSent::Later { after, reason } => retry_after(after, reason),
        NotSent::Crowded(_) | NotSent::Store(_) => refused(RefusalKind::Unavailable, "unavailable"),
        NotSent::NotHere { after, reason } => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(
                header::RETRY_AFTER,
                after.as_secs_f64().ceil().max(1.0).to_string(),
            )],
            axum::Json(json!({"error": format!("{reason}; retry with the same Idempotency-Key")})),
        )
            .into_response(),
        NotSent::Unknown(_) => refused(RefusalKind::HandlerTimeout, "upstream_timeout"),
        NotSent::Transient(_) => refused(RefusalKind::Handler, "upstream_failed"),
    }
}
