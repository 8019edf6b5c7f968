//! The dispatcher: pulls each partition, claims, runs the route's sink while renewing the lease,
//! then completes and acks, or releases and retries with backoff, or dead-letters.
//!
//! Per-chat order comes from the queue: it hands out only the first waiting event of each order
//! key, so everything pulled at once belongs to different chats and can run concurrently.

mod partition;
pub(crate) mod retries;
pub(crate) mod routes;
mod slots;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncegate_core::{
    Delivery, FenceCheck, KeyHash, QueueId, Store, StoreError, WatermarkOutcome, key_for,
};
use oncegate_once::{Claimed, Held, Panicked};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::base::meters::ClaimOutcome;
use crate::base::traces::{self, EventTrace};
use crate::sink::{Outgoing, SinkError};
use partition::partition_loop;
use slots::Slots;

/// The keys of handlers running now, by their queue entry: what shutdown gives back.
type Running<S> = Arc<Mutex<HashMap<QueueId, Arc<Held<S>>>>>;

/// Runs every partition until shutdown; a partition loop that panics stops the gateway (the
/// reason is returned) instead of leaving its chats undelivered behind a ready gateway.
pub(crate) async fn run<S: Store>(
    shared: Arc<Shared<S>>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let slots = Slots::new(
        shared.timing.dispatcher.concurrency,
        shared.timing.dispatcher.tenant_concurrency,
    );
    let _ = shared.admin.loads.set(slots.clone());
    // Messages to the bot go before their tenant's backlog, as each route says.
    let rule = crate::registry::FirstByRoute::new(shared.routes.clone(), shared.at_rest.clone());
    match shared.store.put_first(Arc::new(rule)).await {
        Ok(()) => {}
        // Set by an earlier run of this dispatcher on the same store: it holds.
        Err(oncegate_core::StoreError::Invalid(_)) => {}
        Err(error) => tracing::warn!(
            %error,
            "the queue could not rank what it holds by the routes' priority; events queued \
             from now on are"
        ),
    }
    let held: Running<S> = Arc::default();
    let mut partitions = JoinSet::new();
    for partition in 0..shared.store.partitions() {
        partitions.spawn(partition_loop(
            shared.clone(),
            partition,
            slots.clone(),
            held.clone(),
            shutdown.clone(),
        ));
    }
    let mut failed = None;
    while let Some(ended) = partitions.join_next().await {
        if ended.is_err() || !shutdown.is_cancelled() {
            failed.get_or_insert_with(|| "a partition loop panicked".to_owned());
            shutdown.cancel();
        }
    }
    // Leases of handlers that did not finish within the grace: give them back so that another
    // worker (or this one after a restart) can take them at once.
    let left: Vec<(QueueId, Arc<Held<S>>)> = lock(&held).drain().collect();
    for (id, key) in left {
        let _ = key.release().await;
        let _ = shared.store.retry(id, 0).await;
    }
    // Then the partitions: on a shared store the other gateways take them over now, not when
    // this one's ownership runs out.
    if let Err(error) = shared.store.leave().await {
        tracing::warn!(%error, "could not give the partitions up; the other gateways take them over when the ownership runs out");
    }
    failed.map_or(Ok(()), Err)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Repeats a store call that must happen (the queue entry stays handed out until it does)
/// until the store answers, backing off; the dispatcher pauses here while the store is down.
async fn insist<T, Fut>(
    summaries: &crate::Summaries,
    what: &'static str,
    mut call: impl FnMut() -> Fut,
) -> T
where
    Fut: std::future::Future<Output = Result<T, oncegate_core::StoreError>>,
{
    let mut delay = Duration::from_millis(50);
    loop {
        match call().await {
            Ok(value) => return value,
            Err(error) => {
                summaries.note(what, None, &format!("{what} failed, trying again: {error}"));
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Gives the key back and the event to the queue for a second later: the store did not answer.
async fn release_and_retry<S: Store>(shared: &Shared<S>, delivery: &Delivery, key: &Held<S>) {
    let store = &shared.store;
    insist(&shared.summaries, "release", || key.release()).await;
    insist(&shared.summaries, "retry", || {
        store.retry(delivery.id, shared.now_ms() + 1000)
    })
    .await;
}

/// Whether `event` was superseded in its chat's version chain: an event whose successor (the
/// one that changed the version it made) was applied already is older, even within one second
/// of creation time. Marks, with the watermark store: `superseded/<chat>/<v>` = 1 once an event
/// changing `v` is applied; checking writes 0 where nothing was, which is never stale.
async fn superseded<S: Store>(
    shared: &Shared<S>,
    event: &oncegate_core::Event,
    order: &str,
) -> Result<bool, StoreError> {
    let Some(versions) = shared
        .platform_source(&event.platform)
        .and_then(|source| source.versions(event))
    else {
        return Ok(false);
    };
    let mark =
        |version: &str| KeyHash::of(&[&event.platform, &event.app, "superseded", order, version]);
    let retention = shared.timing.retention;
    let store = &shared.store;
    if let WatermarkOutcome::Stale { .. } = store
        .advance_watermark(&mark(&versions.after), 0, retention)
        .await?
    {
        return Ok(true);
    }
    store
        .advance_watermark(&mark(&versions.before), 1, retention)
        .await?;
    Ok(false)
}

/// Runs one handed-out event whose key the hand-out claimed (`claim`). Events name no
/// payload: a redelivery of one event id is the same event.
async fn handle<S: Store>(
    shared: &Shared<S>,
    delivery: Delivery,
    claim: Result<Claimed<S>, StoreError>,
    held: &Running<S>,
) {
    let stats = &shared.stats;
    let store = &shared.store;
    let timing = &shared.timing;
    let summaries = &shared.summaries;
    let handed = shared.traces.on().then(std::time::SystemTime::now);
    let key = match claim {
        Ok(Claimed::Run(key)) => {
            shared.meters.claim(ClaimOutcome::Acquired);
            key
        }
        Ok(Claimed::Done(_)) => {
            shared.meters.claim(ClaimOutcome::Done);
            claim_span(shared, &delivery, handed, "done");
            // Completed before a crash that came before the ack.
            stats.bump(&stats.already_done, "oncegate_already_done_total");
            insist(&shared.summaries, "ack", || store.ack(delivery.id)).await;
            crate::ingress::admission::left_queue(shared);
            return;
        }
        Ok(Claimed::InFlight { until_ms }) => {
            shared.meters.claim(ClaimOutcome::InFlight);
            claim_span(shared, &delivery, handed, "in_flight");
            insist(&shared.summaries, "retry", || {
                store.retry(delivery.id, until_ms)
            })
            .await;
            return;
        }
        // A claim naming no payload meets no conflict; were it to, retrying is safe.
        Ok(Claimed::Conflict) => {
            shared.meters.claim(ClaimOutcome::Conflict);
            summaries.note(
                "claim_conflict",
                None,
                "the event's key is held for a payload",
            );
            insist(&shared.summaries, "retry", || {
                store.retry(delivery.id, shared.now_ms() + 1000)
            })
            .await;
            return;
        }
        Err(error) => {
            shared.meters.claim(ClaimOutcome::Failed);
            summaries.note("claim_failed", None, &error.to_string());
            insist(&shared.summaries, "retry", || {
                store.retry(delivery.id, shared.now_ms() + 1000)
            })
            .await;
            return;
        }
    };
    // A multi-tenant source's push (a ticket, a tenant leaving) changes the store first; the
    // event then goes to its route as any other, any credential in it redacted.
    let redacted = match crate::ingress::tenants::apply(shared, &delivery.event).await {
        Ok(redacted) => redacted.map(|payload| oncegate_core::Event {
            payload,
            ..delivery.event.clone()
        }),
        Err(error) => {
            summaries.note("tenancy_failed", None, &error.to_string());
            return release_and_retry(shared, &delivery, &key).await;
        }
    };
    let event = redacted.as_ref().unwrap_or(&delivery.event);
    let owner = crate::owner::of(event);
    let Some(route) = shared.route_for(&event.event_type, owner) else {
        stats.bump(&stats.unrouted, "oncegate_unrouted_total");
        finish(shared, &delivery, &key).await;
        return;
    };
    if route.stale == crate::StaleEvents::Drop
        && let Some(order) = &event.order_key
    {
        let scope: KeyHash = key_for(&event.platform, &event.app, "watermark", order);
        match store
            .advance_watermark(&scope, event.created_at_ms, timing.retention)
            .await
        {
            Ok(WatermarkOutcome::Stale { current }) => {
                tracing::info!(key = %delivery.key, platform = %event.platform, app = %event.app, tenant = event.tenant.as_deref().unwrap_or("-"), event_id = %event.event_id, current, created = event.created_at_ms, "stale event dropped");
                stats.bump(&stats.stale_dropped, "oncegate_stale_dropped_total");
                shared
                    .meters
                    .dropped(crate::base::meters::Layer::StaleWatermark);
                finish(shared, &delivery, &key).await;
                return;
            }
            Ok(WatermarkOutcome::Accepted { .. }) => {}
            Err(error) => {
                summaries.note("watermark_failed", None, &error.to_string());
                return release_and_retry(shared, &delivery, &key).await;
            }
        }
        match superseded(shared, event, order).await {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(key = %delivery.key, platform = %event.platform, app = %event.app, tenant = event.tenant.as_deref().unwrap_or("-"), event_id = %event.event_id, "superseded event dropped");
                stats.bump(&stats.stale_dropped, "oncegate_stale_dropped_total");
                shared
                    .meters
                    .dropped(crate::base::meters::Layer::StaleWatermark);
                finish(shared, &delivery, &key).await;
                return;
            }
            Err(error) => {
                summaries.note("watermark_failed", None, &error.to_string());
                return release_and_retry(shared, &delivery, &key).await;
            }
        }
    }
    if let Some(gone) = route.gone() {
        // The endpoint said it is gone: nothing more goes to it until an operator resumes it.
        insist(&shared.summaries, "release", || key.release()).await;
        let reason = crate::dispatch::routes::dead_letter_reason(&gone);
        stats.bump(&stats.dead_letters, "oncegate_dead_letters_total");
        insist(&shared.summaries, "dead letter", || {
            store.dead_letter(delivery.id, &reason)
        })
        .await;
        crate::ingress::admission::left_queue(shared);
        return;
    }
    let key = Arc::new(key);
    lock(held).insert(delivery.id, key.clone());
    shared.meters.lag(event.created_at_ms, shared.now_ms());
    let id = delivery.key.delivery_id();
    // This attempt's span, named to the downstream before it is recorded.
    let traced = Some(EventTrace::of(&delivery.key))
        .filter(|trace| shared.traces.keeps(trace))
        .map(|trace| {
            let span = traces::span_id();
            (
                trace,
                span,
                trace.traceparent(span),
                std::time::SystemTime::now(),
            )
        });
    let outgoing = Outgoing {
        id: id.as_str(),
        event,
        attempt: delivery.attempt,
        wants_answer: false,
        updates: None,
        traceparent: traced.as_ref().map(|(_, _, header, _)| header.as_str()),
        owner,
    };
    let started = std::time::Instant::now();
    let started_ms = shared.now_ms();
    let result = key
        .run(route.sink.deliver(outgoing))
        .await
        .unwrap_or_else(|Panicked| Err(SinkError::Transient("the handler panicked".into())));
    let took = started.elapsed();
    shared.meters.handler(took);
    // The attempt as the history keeps it, once its outcome is known.
    let attempt = |outcome: &'static str, error: Option<String>, next_at_ms: Option<u64>| {
        crate::base::attempts::Attempt {
            at_ms: started_ms,
            attempt: delivery.attempt,
            latency_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            outcome,
            error,
            next_at_ms,
        }
    };
    lock(held).remove(&delivery.id);
    if let Some((trace, span, _, began)) = &traced {
        claim_span(shared, &delivery, handed, "acquired");
        record_attempt(shared, &delivery, trace, *span, *began, &result);
    }
    match result {
        Ok(_) => {
            // Nobody reads an event's answer: keeping it would only hold memory for the whole
            // retention.
            stats.bump(&stats.delivered, "oncegate_delivered_total");
            shared
                .attempts
                .delivered(delivery.key, attempt("delivered", None, None));
            finish(shared, &delivery, &key).await;
        }
        Err(error) => {
            let failed = retries::Failed {
                attempt: delivery.attempt,
                error: &error,
                ordered: event.order_key.is_some(),
                first_at_ms: shared.attempts.first_at(&delivery.key),
                started_ms,
                now_ms: shared.now_ms(),
            };
            let next = route.retries.next(&timing.dispatcher, &failed);
            insist(&shared.summaries, "release", || key.release()).await;
            let reason = match (next, error) {
                (retries::Next::Retry(delay), error) => {
                    let reason = error.to_string();
                    retry(shared, &delivery, delay, reason, &attempt).await;
                    return;
                }
                (retries::Next::SetAside(held), error) => {
                    metrics::counter!("oncegate_set_aside_total").increment(1);
                    format!(
                        "set aside after holding its chat's later events for {} (the route's \
                         hold_chat): they went on without it; replay it once the endpoint \
                         takes it. Last attempt ({}): {error}",
                        humantime::format_duration(Duration::from_secs(held.as_secs())),
                        delivery.attempt + 1
                    )
                }
                (
                    retries::Next::GiveUp,
                    SinkError::Transient(reason) | SinkError::RetryAfter { reason, .. },
                ) => {
                    format!("gave up after {} attempts: {reason}", delivery.attempt + 1)
                }
                (retries::Next::GiveUp, SinkError::Permanent(reason)) => reason,
                (retries::Next::GiveUp, SinkError::Gone(reason)) => {
                    crate::dispatch::routes::mark_gone(shared, &route, &reason);
                    reason
                }
            };
            tracing::warn!(key = %delivery.key, platform = %event.platform, app = %event.app, tenant = event.tenant.as_deref().unwrap_or("-"), event_id = %event.event_id, %reason, "dead-lettered");
            shared.attempts.failed(
                delivery.key,
                event,
                attempt("dead_letter", Some(reason.clone()), None),
            );
            stats.bump(&stats.dead_letters, "oncegate_dead_letters_total");
            insist(&shared.summaries, "dead letter", || {
                store.dead_letter(delivery.id, &reason)
            })
            .await;
            crate::ingress::admission::left_queue(shared);
        }
    }
}

/// The span of a hand-out's claim of the event's key (made in the pull's own round trip), from
/// the hand-out to what it decided: run it, it was done already, or someone holds it.
fn claim_span<S: Store>(
    shared: &Shared<S>,
    delivery: &Delivery,
    handed: Option<std::time::SystemTime>,
    outcome: &'static str,
) {
    if let Some(handed) = handed {
        let trace = EventTrace::of(&delivery.key);
        shared.traces.child(
            &trace,
            traces::Finished::new("oncegate.claim", handed, std::time::SystemTime::now())
                .with("oncegate.claim", outcome)
                .with("oncegate.attempt", i64::from(delivery.attempt)),
        );
    }
}

/// The spans of one delivery attempt: its wait in the queue (the first attempt's, from the
/// event's creation) and the attempt itself, in the event's trace.
fn record_attempt<S: Store>(
    shared: &Shared<S>,
    delivery: &Delivery,
    trace: &EventTrace,
    span: opentelemetry::trace::SpanId,
    began: std::time::SystemTime,
    result: &Result<Option<bytes::Bytes>, SinkError>,
) {
    let event = &delivery.event;
    if delivery.attempt == 0 {
        let created = std::time::UNIX_EPOCH + Duration::from_millis(event.created_at_ms);
        shared.traces.child(
            trace,
            traces::Finished::new("oncegate.queue", created.min(began), began)
                .with("oncegate.partition", i64::from(delivery.id.partition)),
        );
    }
    let error = result.as_ref().err().map(ToString::to_string);
    shared.traces.child(
        trace,
        traces::Finished::new("oncegate.deliver", began, std::time::SystemTime::now())
            .kind(opentelemetry::trace::SpanKind::Client)
            .id(span)
            .with("oncegate.attempt", i64::from(delivery.attempt))
            .with("oncegate.event_type", event.event_type.clone())
            .with(
                "oncegate.outcome",
                if error.is_none() {
                    "delivered"
                } else {
                    "failed"
                },
            )
            .failed(error),
    );
}

/// Puts a failed event back for `delay`, its attempt in the history with when the next is due.
async fn retry<S: Store>(
    shared: &Shared<S>,
    delivery: &Delivery,
    delay: Duration,
    reason: String,
    attempt: &impl Fn(&'static str, Option<String>, Option<u64>) -> crate::base::attempts::Attempt,
) {
    let event = &delivery.event;
    let delay_ms = oncegate_core::store::millis(delay);
    // One summary per interval, not a line per attempt: a downstream that is down fails every
    // event on every attempt.
    tracing::debug!(key = %delivery.key, platform = %event.platform, app = %event.app, tenant = event.tenant.as_deref().unwrap_or("-"), event_id = %event.event_id, attempt = delivery.attempt, %reason, ?delay, "delivery failed; retrying");
    shared.summaries.note(
        "delivery_retried",
        None,
        &format!(
            "event {} (attempt {}), retried in {delay:?}: {reason}",
            event.event_id,
            delivery.attempt + 1
        ),
    );
    shared
        .stats
        .bump(&shared.stats.retries, "oncegate_retries_total");
    let next_at_ms = shared.now_ms().saturating_add(delay_ms);
    shared.attempts.failed(
        delivery.key,
        event,
        attempt("retry", Some(reason), Some(next_at_ms)),
    );
    insist(&shared.summaries, "retry", || {
        shared
            .store
            .retry(delivery.id, shared.now_ms().saturating_add(delay_ms))
    })
    .await;
}

/// Complete (the holder's compare-and-set) and ack.
async fn finish<S: Store>(shared: &Shared<S>, delivery: &Delivery, key: &Held<S>) {
    // The handler has run: insist on recording it (the store may be restarting). Giving up here
    // would run the event again; if the lease is taken over meanwhile, the fence refuses it
    // (counted by the protocol's observer).
    let fence = insist(&shared.summaries, "complete", || {
        key.complete_and_ack(None, delivery.id)
    })
    .await;
    crate::ingress::admission::left_queue(shared);
    if fence == FenceCheck::Rejected {
        tracing::warn!(key = %delivery.key, platform = %delivery.event.platform, app = %delivery.event.app, tenant = delivery.event.tenant.as_deref().unwrap_or("-"), event_id = %delivery.event.event_id, "completion refused: the lease was taken over");
    }
}
