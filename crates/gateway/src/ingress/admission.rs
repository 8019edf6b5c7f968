//! The one admission path: every transport hands an [`Admit`] here and gets an outcome back,
//! never an HTTP response. It applies the queue bound, falls back to the spool when the store
//! is down, keeps chats in order behind a draining spool, counts, and wakes the dispatcher.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use oncegate_core::store::millis;
use oncegate_core::{Accepted, Admission, Admit, Refusal, RefusalKind, Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// How often the queue depth is read from the store when `dispatcher.max_queued` bounds it,
/// and when it only feeds the gauge.
const QUEUE_SAMPLE: Duration = Duration::from_millis(250);
const QUEUE_GAUGE_SAMPLE: Duration = Duration::from_secs(5);

/// Whether an admission keeps to `dispatcher.max_queued`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// Refused (503) when the queue is full: the platform sends it again.
    Keep,
    /// Admitted over the bound, counted: the platform never sends it again (a WeCom AI bot's
    /// callback over its long connection), so a refusal would lose it.
    Exceed,
}

/// Admits `admit` once: `Ok` says how it was accepted, `Err` why not (nothing was recorded).
async fn admit<S: Store>(
    shared: &Shared<S>,
    mut admit: Admit,
    bound: Bound,
) -> Result<Accepted, Refusal> {
    let stats = &shared.stats;
    let full = if queue_full(shared) {
        let depth = shared.queued.load(Ordering::Relaxed);
        Some((
            "queue_full",
            (&stats.queue_full, "oncegate_queue_full_total"),
            format!("the queue holds {depth} events (dispatcher.max_queued)"),
        ))
    } else {
        super::tenant_bound::tenant_full(shared, &admit.event)
            .await
            .map(|depth| {
                (
                    "tenant_queue_full",
                    (&stats.tenant_queue_full, "oncegate_tenant_queue_full_total"),
                    format!(
                        "this tenant has {depth} events queued (dispatcher.max_queued_per_tenant)"
                    ),
                )
            })
    };
    if let Some((label, (count, metric), why)) = full {
        if bound == Bound::Exceed {
            metrics::counter!("oncegate_admitted_over_bound_total").increment(1);
        } else if known(shared, &admit).await {
            // The platform's retry of an event admitted before the queue filled: its success
            // answer, or it would send it again until the queue drains.
            stats.bump(&stats.duplicates, "oncegate_duplicates_total");
            return Ok(Accepted::Duplicate);
        } else {
            stats.bump(count, metric);
            if label == "tenant_queue_full" {
                shared
                    .admin
                    .tenants
                    .refused(admit.event.group_hash(), &admit.event);
            }
            return Err(Refusal::new(
                RefusalKind::Unavailable,
                label,
                format!("{why}: nothing was recorded, retry later"),
            ));
        }
    }
    clamp_creation_time(shared, &mut admit.event);
    if !shared.ingress.secondary_keys {
        admit.keys = admit.keys.primary_only();
    }
    // With a spool, a copy is kept for it in case the store cannot admit; and while earlier
    // admissions still wait there, this one queues behind them so that chats keep their order.
    let fallback = match &shared.ingress.spool {
        Some(spool) if !spool.is_empty() => return to_spool(shared, spool, admit).await,
        Some(spool) => Some((spool, admit.clone())),
        None => None,
    };
    match to_store(shared, admit, shared.timing.retention).await {
        Ok(Admission::Replayed) => Err(replayed()),
        Ok(Admission::Admitted { .. }) => Ok(Accepted::Admitted),
        Ok(Admission::Duplicate { .. }) => Ok(Accepted::Duplicate),
        Err(error @ StoreError::Unavailable(_)) => match fallback {
            Some((spool, admit)) => to_spool(shared, spool, admit).await,
            None => Err(unavailable(shared, "admit_failed", &error)),
        },
        Err(error) => Err(unavailable(shared, "admit_failed", &error)),
    }
}

/// [`admit`], with its spans when traces are on: `received` is when its transport got the
/// event (its decoding and checks lie between that and the admission). Every transport admits
/// through here, so that every event's trace has its root.
pub(crate) async fn admit_traced<S: Store>(
    shared: &Shared<S>,
    admit: Admit,
    received: Option<std::time::SystemTime>,
    bound: Bound,
) -> Result<Accepted, Refusal> {
    // Only an event that is traced (its share, by its key) pays for its copy.
    let traced = received.and_then(|received| {
        let key = admit.keys.as_slice().first().copied()?;
        let decoded = std::time::SystemTime::now();
        shared
            .traces
            .keeps(&crate::EventTrace::of(&key))
            .then(|| (key, admit.event.clone(), received, decoded))
    });
    let admitted = self::admit(shared, admit, bound).await;
    if let Some((key, event, received, decoded)) = traced {
        shared
            .traces
            .ingress(&key, &event, received, decoded, admitted.as_ref());
    }
    admitted
}

/// Hands one admission to the store and counts what it says: every path that admits (ingress,
/// the spool drain, later the WebSocket client) ends here.
pub(crate) async fn to_store<S: Store>(
    shared: &Shared<S>,
    admit: Admit,
    retention: Duration,
) -> Result<Admission, StoreError> {
    let partition = admit.event.partition(shared.store.partitions());
    let Admit { event, keys, nonce } = admit;
    let (platform, app) = (event.platform.clone(), event.app.clone());
    let bounded = shared.timing.dispatcher.max_queued_per_tenant.is_some();
    let group = bounded.then(|| event.group_hash());
    if let Some(group) = group {
        shared.admin.tenants.note(group, &event);
    }
    // ONCEGATE_LOG=debug: a line per event admitted or dropped as a repeat (its copy of the
    // id is made only then).
    let said = tracing::enabled!(tracing::Level::DEBUG).then(|| {
        let key = keys.as_slice().first().map(ToString::to_string);
        (event.event_id.clone(), event.event_type.clone(), key)
    });
    let started = std::time::Instant::now();
    let admission = shared
        .store
        .admit_with_nonce(event, keys.as_slice(), retention, nonce)
        .await?;
    if let Some((event_id, event_type, key)) = said {
        let what = match &admission {
            Admission::Admitted { .. } => "admitted",
            Admission::Duplicate { .. } => "dropped as a repeat",
            _ => "not admitted",
        };
        tracing::debug!(key = key.as_deref().unwrap_or("-"), %platform, %app, %event_id, %event_type, partition, "{what}");
    }
    shared.meters.admit(started.elapsed());
    let stats = &shared.stats;
    match admission {
        Admission::Admitted { .. } => {
            stats.bump(&stats.admitted, "oncegate_admitted_total");
            shared.meters.admitted(&platform, &app);
            shared.queued.fetch_add(1, Ordering::Relaxed);
            if let Some(group) = group {
                shared.ingress.tenant_depths.admitted(group);
            }
            shared.wake(partition);
        }
        Admission::Duplicate { key_index } => {
            stats.bump(&stats.duplicates, "oncegate_duplicates_total");
            shared.meters.duplicate(&platform, &app, key_index);
        }
        // Refused by the caller, who knows what a replay means there.
        Admission::Replayed => {}
    }
    Ok(admission)
}

/// Whether `admit`'s event was admitted before (its first key has a live record): one read,
/// made only for a request a queue bound would refuse.
async fn known<S: Store>(shared: &Shared<S>, admit: &Admit) -> bool {
    let Some(key) = admit.keys.as_slice().first() else {
        return false;
    };
    let partition = admit.event.partition(shared.store.partitions());
    matches!(shared.store.record(key, partition).await, Ok(Some(_)))
}

/// The refusal of a replayed request.
pub(crate) fn replayed() -> Refusal {
    Refusal::new(
        RefusalKind::Replayed,
        "replayed",
        "replayed request: this nonce was already handled within the replay window",
    )
}

/// Nothing was recorded and the platform retries; counted.
fn unavailable<S>(
    shared: &Shared<S>,
    label: &'static str,
    error: &dyn std::fmt::Display,
) -> Refusal {
    let stats = &shared.stats;
    stats.bump(&stats.store_unavailable, "oncegate_store_unavailable_total");
    Refusal::new(RefusalKind::Unavailable, label, error.to_string())
}

/// Accepts an admission into the spool once it is on disk; refused (the platform retries) if
/// the spool is full or cannot be written.
async fn to_spool<S: Store>(
    shared: &Shared<S>,
    spool: &Arc<oncegate_spool::Spool>,
    admit: Admit,
) -> Result<Accepted, Refusal> {
    let stats = &shared.stats;
    let keys = admit.keys.as_slice().to_vec();
    let retention = millis(shared.timing.retention);
    // Sealed before the spool's file, as the store would; admitted from it as it is.
    let event = match &shared.at_rest {
        Some(at_rest) => at_rest
            .seal_event(admit.event)
            .map_err(|error| unavailable(shared, "spool_failed", &error))?,
        None => admit.event,
    };
    match put(spool, event, keys, retention, admit.nonce).await {
        Ok(()) => {
            stats.bump(&stats.spooled, "oncegate_spooled_total");
            shared.ingress.spooled.notify_one();
            Ok(Accepted::Spooled)
        }
        Err(error) => Err(unavailable(shared, "spool_failed", &error)),
    }
}

/// A creation time further ahead than the allowed skew is a forgery or a broken clock: taken
/// as is it would lift the chat's watermark so far that every later event looks stale. It is
/// taken as the skew's edge — the latest time still believed: not as now, which would put it
/// behind an earlier event that came within the skew (and drop it as stale); a chat's mark is
/// thus lifted at most `max_skew` ahead of the clock.
fn clamp_creation_time<S: Store>(shared: &Shared<S>, event: &mut oncegate_core::Event) {
    // With the replay guard off, the default skew still bounds it.
    let ahead = shared
        .ingress
        .replay
        .map_or(Duration::from_secs(300), |limits| limits.max_skew);
    let now_ms = shared.now_ms();
    let edge = now_ms.saturating_add(millis(ahead));
    if event.created_at_ms > edge {
        metrics::counter!("oncegate_future_creation_times_total").increment(1);
        shared.summaries.note(
            "future_creation_time",
            None,
            &format!(
                "event {:?} was created {} ms in the future; taken as the skew's edge",
                event.event_id,
                event.created_at_ms.saturating_sub(now_ms)
            ),
        );
        event.created_at_ms = edge;
    }
}

/// Samples the store's queue depth for the `dispatcher.max_queued` bound, `/readyz` and the
/// `oncegate_queue_depth` gauge.
pub(crate) async fn watch_queue<S: Store>(shared: Arc<Shared<S>>, shutdown: CancellationToken) {
    loop {
        // The bound can come or go with a reload: the period follows it.
        let period = if max_queued(&shared).is_some() {
            QUEUE_SAMPLE
        } else {
            QUEUE_GAUGE_SAMPLE
        };
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.cancelled() => return,
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

/// `dispatcher.max_queued` as in force now.
pub(crate) fn max_queued<S>(shared: &Shared<S>) -> Option<u64> {
    Some(shared.max_queued.load(Ordering::Relaxed)).filter(|max| *max != u64::MAX)
}

/// An event left the queue (acked or dead-lettered): the depth between two samples counts it
/// out, as every admit counts one in, so that the bound and the tile do not overcount by a
/// sample period of traffic.
pub(crate) fn left_queue<S>(shared: &Shared<S>) {
    let _ = shared
        .queued
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |depth| {
            Some(depth.saturating_sub(1))
        });
}

/// Whether the queue holds as many events as `dispatcher.max_queued` allows.
pub(crate) fn queue_full<S>(shared: &Shared<S>) -> bool {
    max_queued(shared).is_some_and(|max| shared.queued.load(Ordering::Relaxed) >= max)
}

/// Writes one admission to the spool (durably, off the async threads).
pub(crate) async fn put(
    spool: &Arc<oncegate_spool::Spool>,
    event: oncegate_core::Event,
    keys: Vec<oncegate_core::KeyHash>,
    retention_ms: u64,
    nonce: Option<oncegate_core::Nonce>,
) -> Result<(), oncegate_spool::SpoolError> {
    let spooled = oncegate_spool::Spooled {
        event,
        keys,
        retention_ms,
        nonce,
    };
    let writer = spool.clone();
    let result = tokio::task::spawn_blocking(move || {
        let pushed = writer.push(&spooled);
        metrics::gauge!("oncegate_spool_depth").set(writer.len() as f64);
        pushed
    })
    .await;
    result.unwrap_or_else(|error| {
        Err(oncegate_spool::SpoolError::Io {
            path: spool.path().to_path_buf(),
            message: format!("spool task failed: {error}"),
        })
    })
}
