//! A held key: the guard that renews its lease while work runs and is settled exactly once —
//! completed with a result, released for a retry, or handed on — on every path. One dropped
//! unsettled (an early return, a panic, a cancelled task) releases its key in the background.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use oncegate_core::{DedupStore, EventQueue, FenceCheck, Lease, QueueId, StoreError};
use tokio::time::Instant;

use crate::observe::{Observer, Renewal};

/// The work panicked. Its key stays held until it is settled (or the guard dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the work panicked")]
pub struct Panicked;

/// Why [`Held::keep`] stopped renewing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseEnded {
    /// Another holder has the key now.
    #[error("the lease was taken over")]
    TakenOver,
    /// The store could not say that this holder still has it.
    #[error("the lease could not be renewed: {0}")]
    NotRenewed(StoreError),
}

/// A key this caller holds. Settle it with [`complete`](Self::complete),
/// [`release`](Self::release) or [`into_lease`](Self::into_lease); the settling calls take
/// `&self` so that they can be retried while the store is away, and a guard settles once: a
/// settling call after the first changes nothing and answers `FenceCheck::Rejected`, as the
/// store answers a lease that no longer holds its key.
pub struct Held<S: DedupStore> {
    pub(crate) store: Arc<S>,
    pub(crate) observer: Arc<dyn Observer>,
    pub(crate) lease: Lease,
    pub(crate) lease_for: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) retention: Duration,
    pub(crate) settled: AtomicBool,
}

impl<S: DedupStore> std::fmt::Debug for Held<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("lease", &self.lease)
            .field("settled", &self.is_settled())
            .finish_non_exhaustive()
    }
}

impl<S: DedupStore> Held<S> {
    /// The lease: its fencing token is what a downstream that checks fences compares.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// How long each renewal extends the lease.
    pub fn lease_for(&self) -> Duration {
        self.lease_for
    }

    /// Whether the key was settled (completed, released or handed on).
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Extends the lease by [`lease_for`](Self::lease_for) from now.
    pub async fn renew(&self) -> Result<FenceCheck, StoreError> {
        self.store.renew(&self.lease, self.lease_for).await
    }

    /// Runs `work`, renewing the lease while it runs. A renewal refused (the lease ran out and
    /// was taken over) stops the renewals but lets the work finish — it cannot be stopped
    /// safely mid-call — and its completion will be refused by the fence. A panicking `work`
    /// answers [`Panicked`] instead of taking the caller with it.
    pub async fn run<T>(&self, work: impl Future<Output = T>) -> Result<T, Panicked> {
        let work = std::panic::AssertUnwindSafe(work)
            .catch_unwind()
            .map(|ran| ran.map_err(|_| Panicked));
        tokio::pin!(work);
        // A sleep rather than an interval: an interval's first tick is due at once, and most
        // work ends long before the first renewal.
        let renew = tokio::time::sleep(self.renew_every);
        tokio::pin!(renew);
        let mut renewing = true;
        loop {
            tokio::select! {
                result = &mut work => return result,
                _ = &mut renew, if renewing => {
                    renew.as_mut().reset(Instant::now() + self.renew_every);
                    let renewal = match self.renew().await {
                        Ok(FenceCheck::Accepted) => Renewal::Renewed,
                        Ok(FenceCheck::Rejected) => Renewal::Lost,
                        Err(_) => Renewal::Failed,
                    };
                    self.observer.renewal(&self.lease, renewal);
                    renewing = renewal != Renewal::Lost;
                }
            }
        }
    }

    /// Renews the lease every period for as long as it can; answers when a renewal is refused
    /// or fails — for holders whose work has no end (a leader holding connections), which
    /// stop when this answers.
    pub async fn keep(&self) -> LeaseEnded {
        loop {
            tokio::time::sleep(self.renew_every).await;
            let ended = match self.renew().await {
                Ok(FenceCheck::Accepted) => {
                    self.observer.renewal(&self.lease, Renewal::Renewed);
                    continue;
                }
                Ok(FenceCheck::Rejected) => {
                    self.observer.renewal(&self.lease, Renewal::Lost);
                    LeaseEnded::TakenOver
                }
                Err(error) => {
                    self.observer.renewal(&self.lease, Renewal::Failed);
                    LeaseEnded::NotRenewed(error)
                }
            };
            return ended;
        }
    }

    /// Marks the key done with `result`, kept for the retention: a later claim answers
    /// `Done(result)`. Settles the guard unless the store did not answer (then it may be
    /// called again). A refused fence (the lease was taken over) is told to the observer.
    pub async fn complete(&self, result: Option<Bytes>) -> Result<FenceCheck, StoreError> {
        self.settle(self.store.complete(&self.lease, self.retention, result))
            .await
    }

    /// [`complete`](Self::complete), and ack the queue entry `id` the key was handed out with,
    /// in one step where the store can (see `DedupStore::complete_and_ack`).
    pub async fn complete_and_ack(
        &self,
        result: Option<Bytes>,
        id: QueueId,
    ) -> Result<FenceCheck, StoreError>
    where
        S: EventQueue,
    {
        self.settle(
            self.store
                .complete_and_ack(&self.lease, self.retention, result, id),
        )
        .await
    }

    /// Gives the key back, so that a later claim takes it at once instead of when the lease
    /// runs out. Settles the guard unless the store did not answer.
    pub async fn release(&self) -> Result<FenceCheck, StoreError> {
        self.settle(self.store.release(&self.lease)).await
    }

    /// Hands the lease on to a caller who settles it elsewhere (a client of an HTTP API that
    /// presents its token later): the guard no longer releases it.
    pub fn into_lease(self) -> Lease {
        self.settled.store(true, Ordering::Release);
        self.lease
    }

    async fn settle(
        &self,
        call: impl Future<Output = Result<FenceCheck, StoreError>>,
    ) -> Result<FenceCheck, StoreError> {
        if self.is_settled() {
            return Ok(FenceCheck::Rejected);
        }
        let fence = call.await?;
        self.settled.store(true, Ordering::Release);
        if fence == FenceCheck::Rejected {
            self.observer.fenced(&self.lease);
        }
        Ok(fence)
    }
}

impl<S: DedupStore> Drop for Held<S> {
    fn drop(&mut self) {
        if self.is_settled() {
            return;
        }
        self.observer.abandoned(&self.lease);
        // Without a runtime (a guard dropped as the process ends) the lease runs out instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, lease) = (self.store.clone(), self.lease);
            runtime.spawn(async move {
                let _ = store.release(&lease).await;
            });
        }
    }
}
