//! `POST /webhook/<source>`: guard, decode, admit, answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use oncegate_core::replay::ReplayVerdict;
use oncegate_core::store::millis;
use oncegate_core::{Admission, Claim, FenceCheck, Nonce, Store, StoreError, key_for};
use oncegate_feishu::{Inbound, SignedHeaders, Verified};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::sink::Outgoing;
use crate::spooling;
use crate::{Shared, Source};

/// Feishu waits 3 s for a card answer; leave room for the way back.
const CARD_DEADLINE: Duration = Duration::from_millis(2_500);
/// How often the queue depth is read from the store when `dispatcher.max_queued` bounds it,
/// and when it only feeds the gauge.
const QUEUE_SAMPLE: Duration = Duration::from_millis(250);
const QUEUE_GAUGE_SAMPLE: Duration = Duration::from_secs(5);

pub(crate) fn router<S: Store>(shared: Arc<Shared<S>>) -> Router {
    Router::new()
        .route("/webhook/{source}", post(webhook::<S>))
        .fallback(not_found)
        .with_state(shared)
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    answer(status, json!({ "error": message.into() }))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A refused request: counted, summarized in the log (never one line per request), answered.
fn refused<S>(
    shared: &Shared<S>,
    peer: Option<SocketAddr>,
    kind: &'static str,
    status: StatusCode,
    message: String,
) -> Response {
    let stats = &shared.stats;
    stats.bump(&stats.bad_requests, "oncegate_bad_requests_total");
    metrics::counter!("oncegate_refused_total", "reason" => kind).increment(1);
    shared.summaries.note(kind, peer, &message);
    refuse(status, message)
}

async fn webhook<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let peer = crate::server::peer(&parts.extensions);
    let headers = parts.headers;
    let stats = &shared.stats;
    stats.bump(&stats.requests, "oncegate_requests_total");
    let Some(source) = shared.sources.get(&name) else {
        // The configured names are not told: they are part of what an attacker looks for.
        return refused(
            &shared,
            peer,
            "unknown_source",
            StatusCode::NOT_FOUND,
            "no such source: check the URL against the [[source]] names of the configuration"
                .into(),
        );
    };
    let too_large = || {
        format!(
            "body larger than {} bytes (server.body_limit)",
            shared.body_limit
        )
    };
    // A declared length over the limit is answered at once, before any of the body is read.
    let declared = header(&headers, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > shared.body_limit as u64) {
        return refused(
            &shared,
            peer,
            "too_large",
            StatusCode::PAYLOAD_TOO_LARGE,
            too_large(),
        );
    }
    let body = tokio::time::timeout(
        shared.limits.body_timeout,
        axum::body::to_bytes(body, shared.body_limit),
    )
    .await;
    let body: Bytes = match body {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return refused(
                &shared,
                peer,
                "too_large",
                StatusCode::PAYLOAD_TOO_LARGE,
                too_large(),
            );
        }
        Err(_) => {
            return refused(
                &shared,
                peer,
                "slow_body",
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {:?} (server.body_timeout)",
                    shared.limits.body_timeout
                ),
            );
        }
    };
    let signed = SignedHeaders {
        timestamp: header(&headers, oncegate_feishu::HEADER_TIMESTAMP),
        nonce: header(&headers, oncegate_feishu::HEADER_NONCE),
        signature: header(&headers, oncegate_feishu::HEADER_SIGNATURE),
    };
    let inbound = match source.app.open(signed, &body) {
        Ok(inbound) => inbound,
        Err(error) => {
            let status = StatusCode::from_u16(error.status()).unwrap_or(StatusCode::BAD_REQUEST);
            return refused(&shared, peer, error.label(), status, error.to_string());
        }
    };
    if let Inbound::Challenge { challenge } = inbound {
        stats.bump(&stats.challenges, "oncegate_challenges_total");
        return answer(StatusCode::OK, json!({ "challenge": challenge }));
    }
    // The replay guard runs after the signature: unauthenticated requests never take nonce
    // memory. A nonce is remembered only once its event is admitted (or known), so a nonce can
    // never make the gateway drop an event it has not admitted.
    let now_secs = shared.now_ms() / 1000;
    let nonce = match check_replay(source, &signed, now_secs) {
        Ok(nonce) => nonce,
        Err((kind, status, message)) => {
            let counter = match kind {
                "replayed" => &stats.replays_rejected,
                "stale_timestamp" => &stats.stale_timestamps,
                _ => &stats.bad_requests,
            };
            stats.bump(counter, "oncegate_guard_refused_total");
            metrics::counter!("oncegate_refused_total", "reason" => kind).increment(1);
            shared.summaries.note(kind, peer, &message);
            return refuse(status, message);
        }
    };
    let response = match inbound {
        Inbound::Event(mut verified) => {
            clamp_creation_time(&shared, &mut verified.event);
            // The nonce goes to the store too: a store shared by several gateways refuses a
            // replay that reaches another gateway.
            let nonce = nonce.map(|nonce| Nonce {
                key: key_for(&verified.event.source, &verified.event.app, "nonce", nonce),
                window_ms: millis(source.nonce_window),
            });
            admit(&shared, verified, nonce, peer).await
        }
        Inbound::Card(verified) => card(&shared, verified).await,
        Inbound::Challenge { .. } => refuse(StatusCode::INTERNAL_SERVER_ERROR, "unreachable"),
    };
    if response.status().is_success()
        && let (Some(nonce), Some(guard)) = (nonce, &source.replay)
    {
        lock(guard).remember(nonce, now_secs);
    }
    response
}

/// A creation time further ahead than the allowed skew is a forgery or a broken clock: taken
/// as is it would lift the chat's watermark so far that every later event looks stale.
fn clamp_creation_time<S: Store>(shared: &Shared<S>, event: &mut oncegate_core::Event) {
    let now_ms = shared.now_ms();
    if event.created_at_ms > now_ms.saturating_add(millis(shared.max_future)) {
        metrics::counter!("oncegate_future_creation_times_total").increment(1);
        shared.summaries.note(
            "future_creation_time",
            None,
            &format!(
                "event {:?} was created {} ms in the future; taken as now",
                event.event_id,
                event.created_at_ms.saturating_sub(now_ms)
            ),
        );
        event.created_at_ms = now_ms;
    }
}

/// Samples the store's queue depth for the `dispatcher.max_queued` bound, `/readyz` and the
/// `oncegate_queue_depth` gauge.
pub(crate) async fn watch_queue<S: Store>(shared: Arc<Shared<S>>, shutdown: CancellationToken) {
    let period = if shared.max_queued.is_some() {
        QUEUE_SAMPLE
    } else {
        QUEUE_GAUGE_SAMPLE
    };
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        match shared.store.queued().await {
            Ok(depth) => {
                shared.queued.store(depth, Ordering::Relaxed);
                metrics::gauge!("oncegate_queue_depth").set(depth as f64);
            }
            Err(error) => shared
                .summaries
                .note("queue_depth_failed", None, &error.to_string()),
        }
    }
}

/// Whether the queue holds as many events as `dispatcher.max_queued` allows.
pub(crate) fn queue_full<S>(shared: &Shared<S>) -> bool {
    shared
        .max_queued
        .is_some_and(|max| shared.queued.load(Ordering::Relaxed) >= max)
}

async fn not_found() -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "callbacks are posted to /webhook/<source name>",
    )
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Says once a minute, not once a request, that the nonce memory is full.
fn warn_saturated(now_secs: u64) {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let last = LAST.load(std::sync::atomic::Ordering::Relaxed);
    if now_secs >= last + 60
        && LAST
            .compare_exchange(
                last,
                now_secs,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    {
        tracing::warn!(
            "replay guard full (replay.max_nonces): nonces are not remembered for now; \
             duplicates are still dropped at admission, replays get 200 instead of 409"
        );
    }
}

/// Checks timestamp and nonce; returns the nonce to remember after admission.
fn check_replay<'a>(
    source: &Source,
    signed: &SignedHeaders<'a>,
    now_secs: u64,
) -> Result<Option<&'a str>, (&'static str, StatusCode, String)> {
    let Some(guard) = &source.replay else {
        return Ok(None);
    };
    let (timestamp, nonce) = match signed.stamp() {
        Ok(Some(stamp)) => stamp,
        Ok(None) => return Ok(None),
        Err(error) => return Err((error.label(), StatusCode::BAD_REQUEST, error.to_string())),
    };
    match lock(guard).check(timestamp, nonce, now_secs) {
        ReplayVerdict::Fresh => Ok(Some(nonce)),
        ReplayVerdict::Stale { skew_secs } => Err((
            "stale_timestamp",
            StatusCode::UNAUTHORIZED,
            format!(
                "request timestamp is {skew_secs} s from now, outside the allowed skew (replay.max_skew)"
            ),
        )),
        ReplayVerdict::Replayed => Err((
            "replayed",
            StatusCode::CONFLICT,
            "replayed request: this nonce was already handled within the replay window".into(),
        )),
        // The nonce memory is full: let the request through unremembered rather than refuse
        // the platform. A replay of an admitted event is still a duplicate at admission; only
        // its 409 is lost. Counted, so that replay.max_nonces can be raised.
        ReplayVerdict::Saturated => {
            metrics::counter!("oncegate_replay_guard_saturated_total").increment(1);
            warn_saturated(now_secs);
            Ok(None)
        }
    }
}

async fn admit<S: Store>(
    shared: &Shared<S>,
    verified: Verified,
    nonce: Option<Nonce>,
    peer: Option<SocketAddr>,
) -> Response {
    let stats = &shared.stats;
    if queue_full(shared) {
        stats.bump(&stats.store_unavailable, "oncegate_queue_full_total");
        let message = format!(
            "the queue holds {} events (dispatcher.max_queued): nothing was recorded, retry later",
            shared.queued.load(Ordering::Relaxed)
        );
        shared.summaries.note("queue_full", peer, &message);
        return refuse(StatusCode::SERVICE_UNAVAILABLE, message);
    }
    let partition = verified.event.partition(shared.store.partitions());
    // With a spool, a copy is kept for it in case the store cannot admit; and while earlier
    // admissions still wait there, this one queues behind them so that chats keep their order.
    let fallback = match &shared.spool {
        Some(spool) if !spool.is_empty() => {
            return to_spool(shared, spool, verified.event, verified.keys, nonce).await;
        }
        Some(spool) => Some((spool, verified.event.clone(), verified.keys.clone())),
        None => None,
    };
    match shared
        .store
        .admit_with_nonce(
            verified.event,
            &verified.keys,
            shared.timing.retention,
            nonce,
        )
        .await
    {
        Ok(Admission::Replayed) => {
            stats.bump(&stats.replays_rejected, "oncegate_guard_refused_total");
            refuse(
                StatusCode::CONFLICT,
                "replayed request: this nonce was already handled within the replay window",
            )
        }
        Ok(Admission::Admitted { .. }) => {
            stats.bump(&stats.admitted, "oncegate_admitted_total");
            shared.queued.fetch_add(1, Ordering::Relaxed);
            shared.wake(partition);
            answer(StatusCode::OK, json!({ "msg": "success" }))
        }
        Ok(Admission::Duplicate { .. }) => {
            stats.bump(&stats.duplicates, "oncegate_duplicates_total");
            answer(
                StatusCode::OK,
                json!({ "msg": "success", "duplicate": true }),
            )
        }
        Err(StoreError::Unavailable(_)) if fallback.is_some() => {
            let Some((spool, event, keys)) = fallback else {
                return refuse(StatusCode::INTERNAL_SERVER_ERROR, "unreachable");
            };
            to_spool(shared, spool, event, keys, nonce).await
        }
        Err(error) => unavailable(shared, "admit_failed", peer, &error),
    }
}

/// 503: nothing was recorded and the platform retries; counted and summarized.
fn unavailable<S>(
    shared: &Shared<S>,
    kind: &'static str,
    peer: Option<SocketAddr>,
    error: &dyn std::fmt::Display,
) -> Response {
    let stats = &shared.stats;
    stats.bump(&stats.store_unavailable, "oncegate_store_unavailable_total");
    let message = error.to_string();
    shared.summaries.note(
        kind,
        peer,
        &format!("{kind}, answered 503 so that the platform retries: {message}"),
    );
    refuse(StatusCode::SERVICE_UNAVAILABLE, message)
}

/// Accepts an admission into the spool: 200 once it is on disk, 503 if the spool is full or
/// cannot be written (the platform retries).
async fn to_spool<S: Store>(
    shared: &Shared<S>,
    spool: &std::sync::Arc<oncegate_spool::Spool>,
    event: oncegate_core::Event,
    keys: Vec<oncegate_core::KeyHash>,
    nonce: Option<Nonce>,
) -> Response {
    let stats = &shared.stats;
    match spooling::put(spool, event, keys, millis(shared.timing.retention), nonce).await {
        Ok(()) => {
            stats.bump(&stats.spooled, "oncegate_spooled_total");
            shared.spooled.notify_one();
            answer(StatusCode::OK, json!({ "msg": "success", "spooled": true }))
        }
        Err(error) => unavailable(shared, "spool_failed", None, &error),
    }
}

/// Card callbacks are synchronous and never re-delivered: claim the event id, ask the route's
/// sink, store its answer, and return it. A repeated click with the same event id gets the
/// stored answer, not a second call.
async fn card<S: Store>(shared: &Shared<S>, verified: Verified) -> Response {
    let stats = &shared.stats;
    stats.bump(&stats.cards, "oncegate_cards_total");
    let Some(route) = shared.route_for(&verified.event.event_type) else {
        stats.bump(&stats.unrouted, "oncegate_unrouted_total");
        return answer(StatusCode::OK, json!({}));
    };
    let key = verified.keys[0];
    let partition = verified.event.partition(shared.store.partitions());
    let claim = match shared.store.claim(&key, partition, CARD_DEADLINE * 2).await {
        Ok(claim) => claim,
        Err(error) => return refuse(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    };
    let lease = match claim {
        Claim::Acquired(lease) => lease,
        Claim::Done { outcome } => return stored_answer(outcome),
        Claim::InFlight { .. } => {
            return refuse(
                StatusCode::CONFLICT,
                "this card action is being answered already",
            );
        }
    };
    let id = format!("msg_{key}");
    let outgoing = Outgoing {
        id: &id,
        event: &verified.event,
        attempt: 0,
        wants_answer: true,
    };
    let result = tokio::time::timeout(CARD_DEADLINE, route.sink.deliver(outgoing)).await;
    match result {
        Ok(Ok(outcome)) => {
            let outcome = outcome.unwrap_or_else(|| Bytes::from_static(b"{}"));
            if let Ok(FenceCheck::Rejected) = shared
                .store
                .complete(&lease, shared.timing.retention, Some(outcome.clone()))
                .await
            {
                stats.bump(&stats.fenced, "oncegate_fenced_total");
            }
            stats.bump(&stats.delivered, "oncegate_delivered_total");
            stored_answer(Some(outcome))
        }
        Ok(Err(error)) => {
            let _ = shared.store.release(&lease).await;
            refuse(
                StatusCode::BAD_GATEWAY,
                format!("card handler failed: {error}"),
            )
        }
        Err(_) => {
            let _ = shared.store.release(&lease).await;
            refuse(
                StatusCode::GATEWAY_TIMEOUT,
                "card handler did not answer within 2.5 s",
            )
        }
    }
}

fn stored_answer(outcome: Option<Bytes>) -> Response {
    let body = outcome.unwrap_or_else(|| Bytes::from_static(b"{}"));
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}
