//! The outage spool's second half: `drain` hands the admissions the ingress spooled
//! (`admission::to_spool`) to the store, oldest first, when it answers again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use oncegate_core::{Admission, Admit, Keys, Store, StoreError};
use oncegate_spool::Spooled;
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// Admissions handed to the store per round.
const BATCH: usize = 512;
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Hands spooled admissions to the store until `shutdown`; backs off while it cannot.
pub(crate) async fn drain<S: Store>(shared: Arc<Shared<S>>, shutdown: CancellationToken) {
    let Some(spool) = shared.ingress.spool.clone() else {
        // Nothing to drain: done when the gateway is (returning early would read as a crash).
        shutdown.cancelled().await;
        return;
    };
    let mut backoff = BACKOFF_MIN;
    while !shutdown.is_cancelled() {
        let batch = {
            let spool = spool.clone();
            tokio::task::spawn_blocking(move || spool.peek(BATCH)).await
        };
        let batch = match batch {
            Ok(Ok(batch)) => batch,
            Ok(Err(error)) => {
                tracing::error!(%error, "cannot read the spool; trying again shortly");
                pause(&shutdown, BACKOFF_MAX).await;
                continue;
            }
            Err(error) => {
                tracing::error!(%error, "spool task failed");
                pause(&shutdown, BACKOFF_MAX).await;
                continue;
            }
        };
        if batch.is_empty() {
            tokio::select! {
                _ = shared.ingress.spooled.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.cancelled() => {}
            }
            continue;
        }
        // Partitions are admitted side by side, each in spool order, so one chat's events
        // keep their order while the drain uses more than one round trip at a time. A
        // partition stops at its first refusal; what follows it waits for the next round.
        let mut by_partition: HashMap<u16, Vec<(u64, Spooled)>> = HashMap::new();
        for (seq, spooled) in batch {
            let partition = spooled.event.partition(shared.store.partitions());
            by_partition
                .entry(partition)
                .or_default()
                .push((seq, spooled));
        }
        let mut lanes = tokio::task::JoinSet::new();
        for entries in by_partition.into_values() {
            let shared = shared.clone();
            lanes.spawn(async move { hand_over(&shared, entries).await });
        }
        let mut handed = Vec::new();
        let mut stalled = false;
        while let Some(lane) = lanes.join_next().await {
            match lane {
                Ok((done, refused)) => {
                    handed.extend(done);
                    stalled |= refused;
                }
                Err(error) => {
                    tracing::error!(%error, "a spool drain task failed");
                    stalled = true;
                }
            }
        }
        if !handed.is_empty() {
            let spool = spool.clone();
            let removed = tokio::task::spawn_blocking(move || {
                let removed = spool.remove_all(&handed);
                metrics::gauge!("oncegate_spool_depth").set(spool.len() as f64);
                removed
            })
            .await;
            // Not removed: handed again later, and admission says duplicate.
            if let Ok(Err(error)) = removed {
                tracing::error!(%error, "cannot remove handed admissions from the spool");
            }
        }
        if stalled {
            pause(&shutdown, backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        } else {
            backoff = BACKOFF_MIN;
        }
    }
}

/// Admits one partition's spooled entries in order, through the one admission path; returns the positions handed over and
/// whether the store refused one (the rest then waits).
async fn hand_over<S: Store>(shared: &Shared<S>, entries: Vec<(u64, Spooled)>) -> (Vec<u64>, bool) {
    let mut handed = Vec::with_capacity(entries.len());
    for (seq, spooled) in entries {
        let retention = spooled.retention();
        let nonce = spooled.nonce;
        let Some(keys) = Keys::from_vec(spooled.keys) else {
            tracing::error!(seq, "a spooled admission has no keys; dropped");
            handed.push(seq);
            continue;
        };
        let admit = Admit {
            event: spooled.event,
            keys,
            nonce,
        };
        match crate::ingress::admission::to_store(shared, admit, retention).await {
            Ok(outcome) => {
                handed.push(seq);
                let stats = &shared.stats;
                stats.bump(&stats.unspooled, "oncegate_unspooled_total");
                // A spooled retry of an event admitted before the outage, or the same request
                // spooled twice: its nonce is known, and it is a duplicate like the other.
                if outcome == Admission::Replayed {
                    stats.bump(&stats.duplicates, "oncegate_duplicates_total");
                }
            }
            // Can never be admitted (the spool holds what this version cannot admit): said
            // loudly and set aside rather than blocking every admission after it.
            Err(StoreError::Invalid(message)) => {
                tracing::error!(%message, seq, "a spooled admission is invalid; dropped");
                handed.push(seq);
            }
            Err(error) => {
                tracing::debug!(%error, "store still refuses admissions; spool waits");
                return (handed, true);
            }
        }
    }
    (handed, false)
}

async fn pause(shutdown: &CancellationToken, how_long: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(how_long) => {}
        _ = shutdown.cancelled() => {}
    }
}
