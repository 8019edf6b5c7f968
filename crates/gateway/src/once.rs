//! The claim protocol, written once: claim a key, run the work while renewing the lease, and
//! settle — complete with a stored result, or release for a retry. A key already done answers
//! with its stored result; a key in flight says until when, or is waited for; a key claimed for
//! another payload is a conflict. The dispatcher (whose claims come with its hand-outs, from
//! `pull_claimed`, read through `Claimed::from`) and synchronous calls use it; send-once and
//! business keys will.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use oncegate_core::{Claim, FenceCheck, Fingerprint, KeyHash, Lease, Store, StoreError};
use tokio::time::Instant;

use crate::Shared;
use crate::meters::Renewal;
use crate::sink::SinkError;

/// What claiming a key found.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// This caller holds the key now.
    Run(Lease),
    /// The key was done before; its stored result.
    Done(Option<Bytes>),
    /// Someone else holds it until then.
    InFlight {
        /// When that lease runs out.
        until_ms: u64,
    },
    /// The key was claimed for another payload.
    Conflict,
}

/// What to claim: a key in its partition, for how long, for which payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claiming<'a> {
    /// The key.
    pub(crate) key: &'a KeyHash,
    /// Its record's partition.
    pub(crate) partition: u16,
    /// The lease to take.
    pub(crate) lease: Duration,
    /// The payload's fingerprint, when a reuse with another payload must be refused.
    pub(crate) fingerprint: Option<Fingerprint>,
}

/// Claims once.
pub(crate) async fn claim<S: Store>(
    store: &S,
    claiming: Claiming<'_>,
) -> Result<Claimed, StoreError> {
    let Claiming {
        key,
        partition,
        lease,
        fingerprint,
    } = claiming;
    Ok(store
        .claim_with_fingerprint(key, partition, lease, fingerprint)
        .await?
        .into())
}

impl From<Claim> for Claimed {
    fn from(claim: Claim) -> Self {
        match claim {
            Claim::Acquired(lease) | Claim::TookOver(lease) => Claimed::Run(lease),
            Claim::Done { outcome } => Claimed::Done(outcome),
            Claim::InFlight { until_ms } => Claimed::InFlight { until_ms },
            Claim::Conflict => Claimed::Conflict,
        }
    }
}

/// The first pause between claims while another holder works; it doubles up to the last.
const FIRST_POLL: Duration = Duration::from_millis(5);
const LAST_POLL: Duration = Duration::from_millis(100);

/// Claims, and while someone else holds the key, claims again until `wait` has passed: a
/// repeat gets the first run's stored result instead of "in flight" when that run ends in
/// time, or the key itself when that run gives up. Answers `InFlight` only after `wait`.
pub(crate) async fn claim_or_wait<S: Store>(
    store: &S,
    claiming: Claiming<'_>,
    wait: Duration,
) -> Result<Claimed, StoreError> {
    let deadline = Instant::now() + wait;
    let mut pause = FIRST_POLL;
    loop {
        let claimed = claim(store, claiming).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        if !matches!(claimed, Claimed::InFlight { .. }) || left.is_zero() {
            return Ok(claimed);
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(LAST_POLL);
    }
}

/// Runs `work` under `lease`, renewing it every `renew_every` for `extend` more. A handler that
/// panics fails this attempt (transiently) instead of taking its caller with it. If a renewal is
/// refused (the lease was taken over), the work is let finish — it cannot be stopped safely
/// mid-call — and its completion will be refused by the fence.
pub(crate) async fn run<S: Store>(
    shared: &Shared<S>,
    lease: &Lease,
    renew_every: Duration,
    extend: Duration,
    work: impl Future<Output = Result<Option<Bytes>, SinkError>>,
) -> Result<Option<Bytes>, SinkError> {
    let work = std::panic::AssertUnwindSafe(work)
        .catch_unwind()
        .map(|ran| {
            ran.unwrap_or_else(|_| Err(SinkError::Transient("the handler panicked".into())))
        });
    tokio::pin!(work);
    // A sleep rather than an interval: an interval's first tick is due at once, and taking it
    // moves the timer once more per event; most work ends long before the first renewal.
    let renew = tokio::time::sleep(renew_every);
    tokio::pin!(renew);
    let mut renewing = true;
    loop {
        tokio::select! {
            result = &mut work => return result,
            _ = &mut renew, if renewing => {
                renew.as_mut().reset(Instant::now() + renew_every);
                let renewed = shared.store.renew(lease, extend).await;
                shared.meters.renewal(match renewed {
                    Ok(FenceCheck::Accepted) => Renewal::Renewed,
                    Ok(FenceCheck::Rejected) => Renewal::Lost,
                    Err(_) => Renewal::Failed,
                });
                if let Ok(FenceCheck::Rejected) = renewed {
                    let stats = &shared.stats;
                    stats.bump(&stats.leases_lost, "oncegate_leases_lost_total");
                    tracing::warn!(key = %lease.key, "lease lost while the handler runs");
                    renewing = false;
                }
            }
        }
    }
}

/// Records the result under `lease`; a refused fence (the lease was taken over) is counted.
pub(crate) async fn complete<S: Store>(
    shared: &Shared<S>,
    lease: &Lease,
    result: Option<Bytes>,
) -> Result<FenceCheck, StoreError> {
    let fence = shared
        .store
        .complete(lease, shared.timing.retention, result)
        .await?;
    if fence == FenceCheck::Rejected {
        shared
            .stats
            .bump(&shared.stats.fenced, "oncegate_fenced_total");
    }
    Ok(fence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncegate_core::DedupStore;
    use oncegate_core::key_for;
    use oncegate_memory::MemoryStore;
    use std::sync::Arc;

    const LEASE: Duration = Duration::from_secs(10);

    fn claiming<'a>(key: &'a KeyHash, payload: &[u8]) -> Claiming<'a> {
        Claiming {
            key,
            partition: 0,
            lease: LEASE,
            fingerprint: Some(Fingerprint::of(payload)),
        }
    }

    fn held(claimed: Claimed) -> Lease {
        match claimed {
            Claimed::Run(lease) => lease,
            other => panic!("expected to hold the key, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeat_waits_for_the_first_runs_result_in_many_races() {
        let store = Arc::new(MemoryStore::new());
        for round in 0..50 {
            let key = key_for("api", "app", "business", &format!("wait-{round}"));
            let lease = held(claim(&*store, claiming(&key, b"p")).await.expect("claim"));
            let repeats: Vec<_> = (0..4)
                .map(|_| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        claim_or_wait(&*store, claiming(&key, b"p"), Duration::from_secs(5)).await
                    })
                })
                .collect();
            // The first run ends after the repeats started waiting (a few rounds of polls).
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..30))).await;
            let result = Bytes::from(format!("result-{round}"));
            store
                .complete(&lease, LEASE, Some(result.clone()))
                .await
                .expect("complete");
            for repeat in repeats {
                match repeat.await.expect("joined").expect("claim") {
                    Claimed::Done(Some(stored)) => assert_eq!(stored, result),
                    other => panic!("round {round}: a repeat got {other:?}"),
                }
            }
        }
    }

    #[tokio::test]
    async fn a_repeat_takes_the_key_when_the_first_run_gives_up() {
        let store = Arc::new(MemoryStore::new());
        let key = key_for("api", "app", "business", "given-up");
        let first = held(claim(&*store, claiming(&key, b"p")).await.expect("claim"));
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move {
                claim_or_wait(&*store, claiming(&key, b"p"), Duration::from_secs(5)).await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        store.release(&first).await.expect("release");
        let second = held(waiter.await.expect("joined").expect("claim"));
        assert!(second.token > first.token);
    }

    #[tokio::test]
    async fn waiting_ends_at_the_deadline_and_conflicts_do_not_wait() {
        let store = MemoryStore::new();
        let key = key_for("api", "app", "business", "slow");
        let lease = held(claim(&store, claiming(&key, b"p")).await.expect("claim"));
        let started = Instant::now();
        let claimed = claim_or_wait(&store, claiming(&key, b"p"), Duration::from_millis(60))
            .await
            .expect("claim");
        assert!(
            matches!(claimed, Claimed::InFlight { until_ms } if until_ms == lease.until_ms),
            "{claimed:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(60));
        let claimed = claim_or_wait(&store, claiming(&key, b"other"), Duration::from_secs(60))
            .await
            .expect("claim");
        assert!(matches!(claimed, Claimed::Conflict), "{claimed:?}");
    }
}
