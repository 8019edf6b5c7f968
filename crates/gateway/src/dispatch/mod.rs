//! The dispatcher: pulls each partition, claims, runs the route's sink while renewing the lease,
//! then completes and acks, or releases and retries with backoff, or dead-letters.
//!
//! Per-chat order comes from the queue: it hands out only the first waiting event of each order
//! key, so everything pulled at once belongs to different chats and can run concurrently.

mod act;
mod decide;
mod partition;
pub(crate) mod retries;
pub(crate) mod routes;
mod slots;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncegate_core::{Delivery, KeyHash, QueueId, Store, StoreError, WatermarkOutcome, key_for};
use oncegate_once::{Claimed, Held, Panicked};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::base::meters::ClaimOutcome;
use crate::base::traces::{self, EventTrace};
use crate::route::Route;
use crate::sink::{Outgoing, SinkError};
use act::act;
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

/// Runs one handed-out event whose key the hand-out claimed (`claim`): each point of its way
/// decided by `decide.rs` and done by `act.rs`. Events name no payload: a redelivery of one
/// event id is the same event.
async fn handle<S: Store>(
    shared: &Shared<S>,
    delivery: Delivery,
    claim: Result<Claimed<S>, StoreError>,
    held: &Running<S>,
) {
    let handed = shared.traces.on().then(std::time::SystemTime::now);
    let (key, claim) = match claim {
        Ok(Claimed::Run(key)) => (Some(key), decide::Claim::Run),
        Ok(Claimed::Done(_)) => (None, decide::Claim::Done),
        Ok(Claimed::InFlight { until_ms }) => (None, decide::Claim::InFlight { until_ms }),
        // A claim naming no payload meets no conflict; were it to, retrying is safe.
        Ok(Claimed::Conflict) => (None, decide::Claim::Conflict),
        Err(error) => (None, decide::Claim::Failed(error.to_string())),
    };
    shared.meters.claim(claim_outcome(&claim));
    if let decide::Claim::Done | decide::Claim::InFlight { .. } = claim {
        let outcome = if claim == decide::Claim::Done {
            "done"
        } else {
            "in_flight"
        };
        claim_span(shared, &delivery, handed, outcome);
    }
    let Some(key) = key else {
        let step = decide::claimed(claim, shared.now_ms());
        return act(shared, &delivery, None, step, None, None).await;
    };
    let (redacted, route, step) = prepare(shared, &delivery).await;
    let (Some(route), decide::Step::Run) = (&route, &step) else {
        return act(shared, &delivery, Some(&key), step, route.as_deref(), None).await;
    };
    let event = redacted.as_ref().unwrap_or(&delivery.event);
    let key = Arc::new(key);
    lock(held).insert(delivery.id, key.clone());
    let ran = run_handler(shared, &delivery, event, route, &key, handed).await;
    lock(held).remove(&delivery.id);
    let attempt = |outcome: &'static str, error: Option<String>, next_at_ms: Option<u64>| {
        crate::base::attempts::Attempt {
            at_ms: ran.started_ms,
            attempt: delivery.attempt,
            latency_ms: u64::try_from(ran.took.as_millis()).unwrap_or(u64::MAX),
            outcome,
            error,
            next_at_ms,
        }
    };
    let attempt: act::AttemptOf<'_> = &attempt;
    let (result, started_ms) = (&ran.result, ran.started_ms);
    let result = result.as_ref().map(|_| ()).map_err(|error| {
        let failed = retries::Failed {
            attempt: delivery.attempt,
            error,
            ordered: event.order_key.is_some(),
            first_at_ms: shared.attempts.first_at(&delivery.key),
            started_ms,
            now_ms: shared.now_ms(),
        };
        (
            error,
            route.retries.next(&shared.timing.dispatcher, &failed),
        )
    });
    let step = decide::after_run(result, delivery.attempt);
    act(
        shared,
        &delivery,
        Some(&*key),
        step,
        Some(&**route),
        Some(attempt),
    )
    .await;
}

/// One run of an event's handler.
struct Ran {
    result: Result<Option<bytes::Bytes>, SinkError>,
    started_ms: u64,
    took: Duration,
}

/// Runs `route`'s handler on `event` while `key` is held (renewed as it runs), with its
/// attempt's spans when the event is traced.
async fn run_handler<S: Store>(
    shared: &Shared<S>,
    delivery: &Delivery,
    event: &oncegate_core::Event,
    route: &Route,
    key: &Held<S>,
    handed: Option<std::time::SystemTime>,
) -> Ran {
    shared.meters.lag(event.created_at_ms, shared.now_ms());
    let id = delivery.key.delivery_id();
    // This attempt's span, named to the downstream before it is recorded.
    let traced = Some(EventTrace::of(&delivery.key))
        .filter(|trace| shared.traces.keeps(trace))
        .map(|trace| {
            let span = traces::span_id();
            let header = trace.traceparent(span);
            (trace, span, header, std::time::SystemTime::now())
        });
    let outgoing = Outgoing {
        id: id.as_str(),
        event,
        attempt: delivery.attempt,
        wants_answer: false,
        updates: None,
        traceparent: traced.as_ref().map(|(_, _, header, _)| header.as_str()),
        owner: crate::registry::owner::of(event),
    };
    let (started, started_ms) = (std::time::Instant::now(), shared.now_ms());
    let result = key
        .run(route.sink.deliver(outgoing))
        .await
        .unwrap_or_else(|Panicked| Err(SinkError::Transient("the handler panicked".into())));
    let took = started.elapsed();
    shared.meters.handler(took);
    if let Some((trace, span, _, began)) = &traced {
        claim_span(shared, delivery, handed, "acquired");
        record_attempt(shared, delivery, trace, *span, *began, &result);
    }
    Ran {
        result,
        started_ms,
        took,
    }
}

/// The claim's answer as the meters count it.
fn claim_outcome(claim: &decide::Claim) -> ClaimOutcome {
    match claim {
        decide::Claim::Run => ClaimOutcome::Acquired,
        decide::Claim::Done => ClaimOutcome::Done,
        decide::Claim::InFlight { .. } => ClaimOutcome::InFlight,
        decide::Claim::Conflict => ClaimOutcome::Conflict,
        decide::Claim::Failed(_) => ClaimOutcome::Failed,
    }
}

/// What is known before a held event's handler runs, asked in order until an answer decides
/// (`decide::before_run` says what each means): the event to deliver (a tenancy push's with
/// its credentials redacted), its route, and the step.
async fn prepare<S: Store>(
    shared: &Shared<S>,
    delivery: &Delivery,
) -> (
    Option<oncegate_core::Event>,
    Option<Arc<Route>>,
    decide::Step,
) {
    use decide::{Before, Check};
    let mut known = Before {
        tenancy: Ok(()),
        routed: false,
        stale: Check::Unasked,
        superseded: Check::Unasked,
        gone: None,
    };
    // A multi-tenant source's push (a ticket, a tenant leaving) changes the store first; the
    // event then goes to its route as any other, any credential in it redacted.
    let redacted = match crate::ingress::tenants::apply(shared, &delivery.event).await {
        Ok(redacted) => redacted.map(|payload| oncegate_core::Event {
            payload,
            ..delivery.event.clone()
        }),
        Err(error) => {
            known.tenancy = Err(error.to_string());
            return (None, None, decide::before_run(known));
        }
    };
    let event = redacted.as_ref().unwrap_or(&delivery.event);
    let route = shared.route_for(&event.event_type, crate::registry::owner::of(event));
    known.routed = route.is_some();
    if let Some(route) = &route {
        if route.stale == crate::StaleEvents::Drop
            && let Some(order) = &event.order_key
        {
            known.stale = stale(shared, event, order).await;
            if known.stale == Check::Passed {
                known.superseded = match superseded(shared, event, order).await {
                    Ok(true) => Check::Hit,
                    Ok(false) => Check::Passed,
                    Err(error) => Check::Failed(error.to_string()),
                };
            }
        }
        known.gone = route
            .gone()
            .map(|gone| crate::dispatch::routes::dead_letter_reason(&gone));
    }
    let step = decide::before_run(known);
    (redacted, route, step)
}

/// Whether `event` is older than its chat's watermark (which it moves up when not).
async fn stale<S: Store>(
    shared: &Shared<S>,
    event: &oncegate_core::Event,
    order: &str,
) -> decide::Check {
    let scope: KeyHash = key_for(&event.platform, &event.app, "watermark", order);
    match shared
        .store
        .advance_watermark(&scope, event.created_at_ms, shared.timing.retention)
        .await
    {
        Ok(WatermarkOutcome::Stale { .. }) => decide::Check::Hit,
        Ok(WatermarkOutcome::Accepted { .. }) => decide::Check::Passed,
        Err(error) => decide::Check::Failed(error.to_string()),
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
