//! One partition's loop: what it would hand out next ranks it for a free handler; it pulls
//! only what it has handlers for, and runs each event on its own handler.

use std::sync::Arc;
use std::time::Duration;

use oncegate_core::{Claim, Delivery, Loads, Store, StoreError};
use oncegate_once::{Claimed, OnceKey};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::slots::{Slot, Slots};
use super::{Running, handle};
use crate::Shared;

/// How long an idle partition waits before looking again (retries become due without a wake).
const IDLE_POLL: Duration = Duration::from_millis(100);
/// The most events one pull hands out.
const MAX_PULL: usize = 64;
/// How long to back off when the store cannot answer.
const STORE_BACKOFF: Duration = Duration::from_millis(500);

/// Tenants a partition loop remembers having named, at most.
const NAMED_HERE: usize = 4096;

pub(super) async fn partition_loop<S: Store>(
    shared: Arc<Shared<S>>,
    partition: u16,
    slots: Arc<Slots>,
    held: Running<S>,
    shutdown: CancellationToken,
) {
    let mut running = JoinSet::new();
    let loads: Loads = slots.clone();
    // The tenants this loop has named for the tenants view: the shared names' lock is taken
    // once per tenant, not once per event.
    let mut named: std::collections::HashSet<u64> = std::collections::HashSet::new();
    // One timer and one cancellation waiter for the loop's life: made anew at each idle wait
    // (after nearly every event), they cost a timer-wheel insert and removal and a waiter-list
    // lock each time.
    let mut idle = tokio::time::interval(IDLE_POLL);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    idle.reset();
    let cancelled = shutdown.cancelled();
    tokio::pin!(cancelled);
    let wake = shared.wake.get(usize::from(partition));
    let woken = || async {
        match wake {
            Some(wake) => wake.notified().await,
            None => std::future::pending().await,
        }
    };
    'partition: loop {
        if shutdown.is_cancelled() {
            break;
        }
        // What the partition would hand out next decides its rank for a handler: nothing is
        // pulled before a handler is free for it, so a quieter tenant's event that arrives
        // meanwhile is not stuck behind one pulled already.
        let next = match shared.store.next_group(partition, &loads).await {
            Ok(next) => next,
            Err(error) => {
                pull_failed(&shared, &error);
                tokio::select! {
                    _ = tokio::time::sleep(STORE_BACKOFF) => {}
                    _ = &mut cancelled => break,
                }
                continue;
            }
        };
        let Some(next) = next else {
            tokio::select! {
                _ = woken() => {}
                _ = idle.tick() => {}
                _ = slots.released(), if slots.capped_groups() => {}
                _ = &mut cancelled => break,
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
            continue;
        };
        let mut request = slots.request(next);
        let first = loop {
            tokio::select! {
                slot = request.granted() => break slot,
                // A new event (or a chat's next): the partition may rank otherwise now.
                _ = woken() => match shared.store.next_group(partition, &loads).await {
                    Ok(Some(next)) => request.regroup(next),
                    Ok(None) => continue 'partition,
                    Err(_) => {}
                },
                _ = &mut cancelled => break 'partition,
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        };
        drop(request);
        let Some(first) = first else { break };
        // Handlers nobody else waits for go to this partition's next events too.
        let mut taken = vec![first];
        while taken.len() < MAX_PULL
            && let Some(slot) = slots.try_take()
        {
            taken.push(slot);
        }
        let pulled = match shared
            .store
            .pull_claimed_ranked(partition, taken.len(), shared.timing.lease, &loads)
            .await
        {
            Ok(pulled) => pulled,
            Err(error) => {
                drop(taken);
                pull_failed(&shared, &error);
                tokio::select! {
                    _ = tokio::time::sleep(STORE_BACKOFF) => {}
                    _ = &mut cancelled => break,
                }
                continue;
            }
        };
        // Handlers beyond what was pulled are free again at once.
        taken.truncate(pulled.len());
        for ((delivery, claim), mut slot) in pulled.into_iter().zip(taken) {
            let claim = claim.map(|claim| claimed(&shared, &delivery, claim));
            let group = delivery.event.group_hash();
            if named.insert(group) {
                shared.admin.tenants.note(group, &delivery.event);
                if named.len() > NAMED_HERE {
                    named.clear();
                }
            }
            if !slot.assign(group) {
                // Its tenant reached its cap meanwhile: not started, so hand it back, and
                // its key, for a handler when one of the tenant's ends.
                if let Ok(Claimed::Run(key)) = &claim {
                    let _ = key.release().await;
                }
                let _ = shared.store.retry(delivery.id, 0).await;
                continue;
            }
            let (shared, held) = (shared.clone(), held.clone());
            running.spawn(async move {
                handle(&shared, delivery, claim, &held).await;
                shared.wake(partition);
                drop::<Slot>(slot);
            });
        }
        while running.try_join_next().is_some() {}
    }
    // Let running handlers finish within the grace; what is left is released by `run`.
    let grace = shared.timing.dispatcher.shutdown_grace;
    let _ = tokio::time::timeout(grace, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    running.abort_all();
    while running.join_next().await.is_some() {}
}

fn pull_failed<S: Store>(shared: &Shared<S>, error: &StoreError) {
    shared
        .summaries
        .note("pull_failed", None, &error.to_string());
}

/// The claim a hand-out made for `delivery`'s key, as the protocol holds it: renewed every
/// `lease.renew_every` by the lease's length while the handler runs.
fn claimed<S: Store>(shared: &Shared<S>, delivery: &Delivery, claim: Claim) -> Claimed<S> {
    let key = OnceKey::new(delivery.key, delivery.id.partition)
        .lease(shared.timing.lease)
        .renew_every(shared.timing.renew_every);
    shared.once.claimed(claim, key)
}
