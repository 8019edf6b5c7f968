//! The claim protocol, written once: claim a key, run the work while renewing the lease, and
//! settle — complete with a stored result, or release for a retry. A key already done answers
//! with its stored result; a key in flight says until when. The dispatcher and synchronous
//! calls use it; send-once and business keys will.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use oncegate_core::{Claim, FenceCheck, KeyHash, Lease, Store, StoreError};

use crate::Shared;
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
}

/// Claims `key` in `partition` for `lease`.
pub(crate) async fn claim<S: Store>(
    store: &S,
    key: &KeyHash,
    partition: u16,
    lease: Duration,
) -> Result<Claimed, StoreError> {
    Ok(match store.claim(key, partition, lease).await? {
        Claim::Acquired(lease) => Claimed::Run(lease),
        Claim::Done { outcome } => Claimed::Done(outcome),
        Claim::InFlight { until_ms } => Claimed::InFlight { until_ms },
    })
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
    let mut renew = tokio::time::interval(renew_every);
    renew.tick().await;
    let mut renewing = true;
    loop {
        tokio::select! {
            result = &mut work => return result,
            _ = renew.tick(), if renewing => {
                if let Ok(FenceCheck::Rejected) = shared.store.renew(lease, extend).await {
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
