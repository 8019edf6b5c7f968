//! `/send/<source>`: a message sent once whatever the caller retries. The caller's
//! `Idempotency-Key` claims through the claim protocol (a repeat gets the stored answer, one
//! that comes while the first is in flight waits for it, another body under the same key is a
//! conflict); the send waits for the receiver's and the app's rate budgets (shared by every
//! gateway of a shared store) and carries the platform's own key derived from the caller's,
//! so that even a retry after an unknown outcome sends once.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncegate_core::{Store, key_for};
use oncegate_once::{Claimed, OnceKey};
use oncegate_send::{Api, SendError, platform_key};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::Shared;
use crate::api::budget::{Lane, NoBudget};
use crate::api::callers::caller;
use crate::api::pace::TooLate;
use crate::refusal::Refused;
use oncegate_core::RefusalKind;

/// The longest `Idempotency-Key`.
const KEY_LIMIT: usize = 255;

/// A configured app that can send.
pub(crate) struct Sender {
    pub(crate) api: Api,
    /// What its rate buckets are named by: the app (and corp) it is.
    pub(crate) scope: String,
}

fn count(source: &str, outcome: &'static str) {
    metrics::counter!("oncegate_sends_total", "source" => source.to_owned(), "outcome" => outcome)
        .increment(1);
}

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

/// A stored answer: the status and body every repeat gets.
fn stored(status: StatusCode, body: &Value) -> bytes::Bytes {
    bytes::Bytes::from(json!({"status": status.as_u16(), "body": body}).to_string())
}

fn replayed(result: Option<bytes::Bytes>) -> Response {
    let doc: Value = result
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null);
    let status = doc["status"]
        .as_u64()
        .and_then(|s| StatusCode::from_u16(s as u16).ok())
        .unwrap_or(StatusCode::OK);
    (
        status,
        [("idempotent-replayed", "true")],
        axum::Json(doc["body"].clone()),
    )
        .into_response()
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

pub(crate) async fn send<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match send_once(&shared, &source, &headers, &body).await {
        Ok(response) => response,
        Err(refused) => refused.into_response(),
    }
}

async fn send_once<S: Store>(
    shared: &Shared<S>,
    source: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, Refused> {
    let started = Instant::now();
    let caller = caller(shared, headers)?;
    if let Some(per_second) = caller.sends_per_second {
        let bucket = key_for("api", "caller", &caller.name, "sends");
        let rate = oncegate_core::Rate::per_second(per_second.max(1));
        match shared.store.take_rate(&bucket, rate).await {
            Ok(oncegate_core::RateVerdict::Granted) => {}
            Ok(oncegate_core::RateVerdict::Wait(after)) => {
                count(source, "caller_over_budget");
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
    let sender = shared.senders.get(source).ok_or_else(|| {
        Refused::new(RefusalKind::NotFound, "not_found",
            "no such source that can send: a Feishu or Lark [[source]] with app_secret, a WeCom one with secret and agent_id, or a WeCom AI bot",
        )
    })?;
    // UTF-8, not only ASCII: callers name sends by order numbers, user names, titles. The
    // key is hashed, never echoed into a header or a URL.
    let key = headers
        .get("idempotency-key")
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= KEY_LIMIT)
        .ok_or_else(|| {
            Refused::new(RefusalKind::BadInput, "bad_request",
                format!("send an Idempotency-Key header of 1 to {KEY_LIMIT} characters, the same for every retry"),
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
    let wait_ms = wait_ms.and_then(|wait| wait.as_u64());
    // Replies go first unless the caller says otherwise; `"priority": "high"` for mentions.
    let replying = request.get("reply_to").is_some_and(|to| !to.is_null());
    let lane = match priority.as_ref().and_then(Value::as_str) {
        Some("high") => Lane::High,
        Some("bulk") => Lane::Bulk,
        None if replying => Lane::High,
        None => Lane::Bulk,
        Some(other) => {
            return Err(Refused::new(
                RefusalKind::BadInput,
                "bad_request",
                format!("priority {other:?}: \"high\" (replies, mentions) or \"bulk\""),
            ));
        }
    };
    let wait = wait_ms
        .map_or(Duration::from_secs(10), Duration::from_millis)
        .min(shared.key_limits.max_wait);
    let prepared = sender
        .api
        .prepare(request, platform_key(&caller.namespace, key))
        .map_err(|error| Refused::new(RefusalKind::BadInput, "bad_request", error))?;
    // The payload that a reuse of the key must match: the send itself, not how long it waits.
    let payload = &prepared.payload;
    let hash = key_for("send", &caller.namespace, source, key);
    let claiming = OnceKey::new(hash, hash.home(shared.store.partitions()))
        .lease(shared.send_timeout * 3 + wait)
        .payload(payload.to_string().as_bytes());
    let unavailable = |error: &dyn std::fmt::Display| {
        Refused::new(
            RefusalKind::Unavailable,
            "unavailable",
            format!("the store cannot answer: {error}; nothing was sent, retry"),
        )
    };
    let held = match shared.once.claim_or_wait(claiming, wait).await {
        Ok(Claimed::Run(held)) => held,
        Ok(Claimed::Done(result)) => {
            count(source, "repeat");
            return Ok(replayed(result));
        }
        Ok(Claimed::InFlight { .. }) => {
            count(source, "in_flight");
            return Err(Refused::new(
                RefusalKind::Conflict,
                "conflict",
                "a send with this Idempotency-Key is still in flight; retry with the same key",
            ));
        }
        Ok(Claimed::Conflict) => {
            count(source, "conflict");
            return Err(Refused::new(
                RefusalKind::Conflict,
                "conflict",
                "this Idempotency-Key was used for another message",
            ));
        }
        Err(error) => return Err(unavailable(&error)),
    };
    // An edit waits for the edits of its message before it; a newer one makes it moot.
    let message_key = prepared.edit_of.as_ref().map(|id| format!("{source}/{id}"));
    let _turn = match &message_key {
        Some(message) => match shared.edits.turn(message).await {
            Some(turn) => Some(turn),
            None => {
                count(source, "superseded");
                let answer = json!({"superseded": true, "note": "a later edit of this message replaced this one before it was sent"});
                let _ = held.complete(Some(stored(StatusCode::OK, &answer))).await;
                return Ok((StatusCode::OK, axum::Json(answer)).into_response());
            }
        },
        None => None,
    };
    let budgets: Vec<_> = prepared
        .budgets
        .iter()
        .map(|(name, rate)| (crate::api::budget::bucket(&sender.scope, name), *rate))
        .collect();
    let deadline = started + wait;
    let give_up = async |after: Duration, why: String| {
        let _ = held.release().await;
        count(source, "rate_limited");
        retry_after(after, why)
    };
    let no_budget = async |why: NoBudget| match why {
        NoBudget::Later(pause) => Ok(give_up(
            pause,
            format!(
                "over the rate budget for {} ms more than the send may wait (wait_ms)",
                pause.as_millis()
            ),
        )
        .await),
        NoBudget::Crowded(max) => {
            let _ = held.release().await;
            count(source, "crowded");
            Err(Refused::new(
                RefusalKind::Unavailable,
                "unavailable",
                format!(
                    "{max} sends already wait for their rate budgets (api.max_waiting_sends): nothing was sent, retry later"
                ),
            ))
        }
        NoBudget::Store(error) => {
            let _ = held.release().await;
            Err(unavailable(&error))
        }
    };
    // Counted among the waiting sends from here until its first call to the platform.
    let mut waiting = match shared.sends_waiting.enter(shared.max_waiting_sends) {
        Ok(waiting) => Some(waiting),
        Err(why) => return no_budget(why).await,
    };
    // A paced receiver's sends from this gateway go one at a time, replies first.
    let turn = match &prepared.pace {
        Some((name, spacing)) => {
            let receiver = crate::api::budget::bucket(&sender.scope, name);
            match shared.pacer.turn(receiver, *spacing, lane, deadline).await {
                Ok(turn) => Some(turn),
                Err(TooLate(after)) => return no_budget(NoBudget::Later(after)).await,
            }
        }
        None => None,
    };
    loop {
        if let Some(turn) = &turn
            && let Err(TooLate(after)) = turn.ready(deadline).await
        {
            return no_budget(NoBudget::Later(after)).await;
        }
        // Every attempt spends the budgets, a retry after the platform's 429 too: a retry
        // outside them would crowd the receiver further.
        if let Err(why) = crate::api::budget::take(shared, source, &budgets, lane, deadline).await {
            return no_budget(why).await;
        }
        drop(waiting.take());
        // Every call counts against a tenant's quota, whatever it answers.
        metrics::counter!("oncegate_send_api_calls_total", "source" => source.to_owned())
            .increment(1);
        let sent = sender.api.send(&prepared).await;
        if let Some(turn) = &turn {
            turn.answered();
        }
        let (status, answer) = match sent {
            Ok(answer) => (StatusCode::OK, answer),
            // The platform's own limit: back off as it says, within the send's wait.
            Err(SendError::RetryAfter { after, .. }) if Instant::now() + after <= deadline => {
                metrics::counter!("oncegate_send_rate_waits_total", "source" => source.to_owned())
                    .increment(1);
                tokio::time::sleep(after).await;
                continue;
            }
            Err(SendError::RetryAfter { after, code }) => {
                return Ok(
                    give_up(after, format!("the platform's rate limit (code {code})")).await,
                );
            }
            Err(SendError::Permanent { code, message }) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"error": format!("refused by the platform: {message}"), "code": code}),
            ),
            Err(error @ SendError::Unknown(_)) => {
                let _ = held.release().await;
                count(source, "unknown_outcome");
                return Err(Refused::new(
                    RefusalKind::HandlerTimeout,
                    "upstream_timeout",
                    error.to_string(),
                ));
            }
            // This gateway cannot send it now (an AI bot's socket is held elsewhere or being
            // dialled): within the send's wait, try again; then 503 with Retry-After, nothing
            // sent, the key free for a retry here or on the gateway that can.
            Err(SendError::NotHere { after, .. }) if Instant::now() + after <= deadline => {
                tokio::time::sleep(after).await;
                continue;
            }
            Err(SendError::NotHere { reason, after }) => {
                let _ = held.release().await;
                count(source, "not_here");
                return Ok((
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(
                        header::RETRY_AFTER,
                        after.as_secs_f64().ceil().max(1.0).to_string(),
                    )],
                    axum::Json(
                        json!({"error": format!("{reason}; retry with the same Idempotency-Key")}),
                    ),
                )
                    .into_response());
            }
            Err(error @ SendError::Transient(_)) => {
                let _ = held.release().await;
                count(source, "transient");
                return Err(Refused::new(
                    RefusalKind::Handler,
                    "upstream_failed",
                    error.to_string(),
                ));
            }
        };
        // The answer is the key's from now on: a repeat gets it instead of a second send.
        match held.complete(Some(stored(status, &answer))).await {
            Ok(_) => {}
            Err(error) => tracing::warn!(source, "send answered but not stored: {error}"),
        }
        count(
            source,
            if status == StatusCode::OK {
                "sent"
            } else {
                "refused"
            },
        );
        return Ok((status, axum::Json(answer)).into_response());
    }
}
