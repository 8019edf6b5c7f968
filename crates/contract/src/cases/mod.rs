//! The contract cases. Each builds its own store from the factory.

mod admit;
mod claim;
mod fair;
mod fingerprint;
mod operators;
mod queue;
mod races;
mod rates;
mod state;

pub use admit::*;
pub use claim::*;
pub use fair::*;
pub use fingerprint::*;
pub use operators::*;
pub use queue::*;
pub use races::*;
pub use rates::*;
pub use state::*;

use std::collections::{HashMap, HashSet};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{
    Admission, Claim, FenceCheck, Lease, ManualClock, QueuedState, RecordState, Store, StoreError,
    WatermarkOutcome, key_for,
};

use crate::{START_MS, block_on, clock, event, key};

const DAY: Duration = Duration::from_secs(24 * 3600);
const LEASE: Duration = Duration::from_secs(30);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The partition of a key admitted with an event without an order key (the event's own key
/// decides it), or of a business key.
fn home<S: Store>(store: &S, k: &oncegate_core::KeyHash) -> u16 {
    k.home(store.partitions())
}

#[track_caller]
fn lease_of(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        other => panic!("expected the claim to be granted, got {other:?}"),
    }
}

/// The lease of a claim that took the key over from a holder whose lease ran out.
#[track_caller]
fn took_over(claim: Claim) -> Lease {
    match claim {
        Claim::TookOver(lease) => lease,
        other => panic!("expected a takeover of an expired lease, got {other:?}"),
    }
}

#[track_caller]
fn admitted(admission: Admission) -> oncegate_core::QueueId {
    match admission {
        Admission::Admitted { id } => id,
        other => panic!("expected the event to be admitted, got {other:?}"),
    }
}

/// Admits events until `n` of them share one partition, each made by `make(position, chat)`
/// (its position among those kept, and a fresh chat number) as its id and event; the others,
/// in other partitions, are handed out and acked out of the way. The kept ones' queue ids, ids
/// and events, in admission order.
async fn in_one_partition<S: Store>(
    store: &S,
    n: usize,
    make: impl Fn(usize, usize) -> (String, oncegate_core::Event),
) -> Vec<(oncegate_core::QueueId, String, oncegate_core::Event)> {
    let mut kept: Vec<(oncegate_core::QueueId, String, oncegate_core::Event)> = Vec::new();
    let mut chat = 0;
    while kept.len() < n {
        let (id, event) = make(kept.len(), chat);
        chat += 1;
        let queued = admitted(
            store
                .admit(event.clone(), &[key(&id)], DAY)
                .await
                .expect("admit"),
        );
        if kept
            .first()
            .is_none_or(|(first, _, _)| first.partition == queued.partition)
        {
            kept.push((queued, id, event));
        } else {
            let mut out = store.pull(queued.partition, 100).await.expect("pull");
            out.retain(|d| d.id == queued);
            assert_eq!(out.len(), 1, "{queued:?} was not handed out");
            assert!(store.ack(queued).await.expect("ack"));
        }
    }
    kept
}

/// Run `f` on `threads` OS threads at once, each with its own runtime, after a common start.
fn race<S: Store, T: Send>(store: &S, threads: usize, f: impl Fn(&S, usize) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let (barrier, f) = (&barrier, &f);
                scope.spawn(move || {
                    barrier.wait();
                    f(store, thread)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("racer panicked"))
            .collect()
    })
}

/// Admits one event per id, in order, and returns their queue positions.
async fn admit_in_order<S: Store>(
    store: &S,
    ids: &[&str],
    chat: Option<&str>,
) -> Vec<oncegate_core::QueueId> {
    let mut out = Vec::new();
    for id in ids {
        out.push(admitted(
            store
                .admit(event(id, chat), &[key(id)], DAY)
                .await
                .expect("admit"),
        ));
    }
    out
}
