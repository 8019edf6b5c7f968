//! Doing what `decide.rs` decided: the store calls, counters, summaries, logs and history
//! entries of each step, in one place.

use std::time::Duration;

use oncegate_core::{Delivery, FenceCheck, Store};
use oncegate_once::Held;

use super::decide::{Letter, Skip, Step};
use super::insist;
use crate::Shared;
use crate::base::attempts::Attempt;
use crate::route::Route;

/// The attempt as the history keeps it, once its outcome is known (outcome, error, next due).
pub(crate) type AttemptOf<'a> =
    &'a (dyn Fn(&'static str, Option<String>, Option<u64>) -> Attempt + Sync);

/// Does `step` for `delivery`, whose key this dispatcher holds as `key` when the claim granted
/// it; `route` is the event's route once known, `attempt` its history entry once it ran.
pub(crate) async fn act<S: Store>(
    shared: &Shared<S>,
    delivery: &Delivery,
    key: Option<&Held<S>>,
    step: Step,
    route: Option<&Route>,
    attempt: Option<AttemptOf<'_>>,
) {
    let stats = &shared.stats;
    let store = &shared.store;
    let event = &delivery.event;
    match (step, key) {
        (Step::Run, _) => {}
        (Step::Ack, _) => {
            // Completed before a crash that came before the ack.
            stats.bump(&stats.already_done, "oncegate_already_done_total");
            insist(&shared.summaries, "ack", || store.ack(delivery.id)).await;
            crate::ingress::admission::left_queue(shared);
        }
        (Step::Retry { at_ms, note }, _) => {
            if let Some(note) = note {
                shared.summaries.note(note.what, None, &note.detail);
            }
            insist(&shared.summaries, "retry", || {
                store.retry(delivery.id, at_ms)
            })
            .await;
        }
        (Step::ReleaseAndRetry(note), key) => {
            shared.summaries.note(note.what, None, &note.detail);
            if let Some(key) = key {
                insist(&shared.summaries, "release", || key.release()).await;
            }
            insist(&shared.summaries, "retry", || {
                store.retry(delivery.id, shared.now_ms() + 1000)
            })
            .await;
        }
        (Step::Skip(skip), key) => {
            match skip {
                Skip::Unrouted => stats.bump(&stats.unrouted, "oncegate_unrouted_total"),
                Skip::Stale | Skip::Superseded => {
                    let why = if skip == Skip::Stale {
                        "stale event dropped"
                    } else {
                        "superseded event dropped"
                    };
                    tracing::info!(key = %delivery.key, platform = %event.platform, app = %event.app, tenant = event.tenant.as_deref().unwrap_or("-"), event_id = %event.event_id, created = event.created_at_ms, "{why}");
                    stats.bump(&stats.stale_dropped, "oncegate_stale_dropped_total");
                    shared
                        .meters
                        .dropped(crate::base::meters::Layer::StaleWatermark);
                }
            }
            if let Some(key) = key {
                finish(shared, delivery, key).await;
            }
        }
        (Step::Delivered, key) => {
            tracing::debug!(key = %delivery.key, platform = %event.platform, app = %event.app, tenant = event.tenant.as_deref().unwrap_or("-"), event_id = %event.event_id, attempt = delivery.attempt, "delivered");
            stats.bump(&stats.delivered, "oncegate_delivered_total");
            if let Some(attempt) = attempt {
                shared
                    .attempts
                    .delivered(delivery.key, attempt("delivered", None, None));
            }
            if let Some(key) = key {
                finish(shared, delivery, key).await;
            }
        }
        (Step::RetryAfter { delay, reason }, key) => {
            if let Some(key) = key {
                insist(&shared.summaries, "release", || key.release()).await;
            }
            retry(shared, delivery, delay, reason, attempt).await;
        }
        (Step::DeadLetter { reason, why }, key) => {
            if let Some(key) = key {
                insist(&shared.summaries, "release", || key.release()).await;
            }
            match (why, route) {
                (Letter::Gone, Some(route)) => super::routes::mark_gone(shared, route, &reason),
                (Letter::SetAside, _) => {
                    metrics::counter!("oncegate_set_aside_total").increment(1);
                }
                _ => {}
            }
            // A handler that ran and failed is said and kept in the history; an event held
            // back from a route that is gone never ran.
            if let Some(attempt) = attempt {
                // Summarised as the retries are (300 dead letters were 300 WARN lines); each
                // one's fields at debug, and all of them in `oncegate dlq list`.
                tracing::debug!(key = %delivery.key, platform = %event.platform, app = %event.app, tenant = event.tenant.as_deref().unwrap_or("-"), event_id = %event.event_id, %reason, "dead-lettered");
                shared.summaries.note(
                    "dead_lettered",
                    None,
                    &format!(
                        "`oncegate dlq list` shows them; the last: event {} ({} {}): {reason}",
                        event.event_id, event.platform, event.app
                    ),
                );
                shared.attempts.failed(
                    delivery.key,
                    event,
                    attempt("dead_letter", Some(reason.clone()), None),
                );
            }
            stats.bump(&stats.dead_letters, "oncegate_dead_letters_total");
            insist(&shared.summaries, "dead letter", || {
                store.dead_letter(delivery.id, &reason)
            })
            .await;
            crate::ingress::admission::left_queue(shared);
        }
    }
}

/// Puts a failed event back for `delay`, its attempt in the history with when the next is due.
async fn retry<S: Store>(
    shared: &Shared<S>,
    delivery: &Delivery,
    delay: Duration,
    reason: String,
    attempt: Option<AttemptOf<'_>>,
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
    if let Some(attempt) = attempt {
        shared.attempts.failed(
            delivery.key,
            event,
            attempt("retry", Some(reason), Some(next_at_ms)),
        );
    }
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
