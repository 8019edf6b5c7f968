//! The protocol's entry: claim a key (or wait for its holder), and run work under it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Claim, DedupStore, FenceCheck, Lease, StoreError};
use tokio::time::Instant;

use crate::held::{Held, Panicked};
use crate::key::OnceKey;
use crate::observe::{Observer, Quiet};

/// What claiming a key found.
pub enum Claimed<S: DedupStore> {
    /// This caller holds the key now: run the work and settle the guard.
    Run(Held<S>),
    /// The key was done before; its stored result.
    Done(Option<Bytes>),
    /// Someone else holds it until then (ms on the store's clock).
    InFlight {
        /// When that lease runs out unless renewed.
        until_ms: u64,
    },
    /// The key was claimed for another payload.
    Conflict,
}

impl<S: DedupStore> std::fmt::Debug for Claimed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claimed::Run(held) => f.debug_tuple("Run").field(held).finish(),
            Claimed::Done(result) => f.debug_tuple("Done").field(result).finish(),
            Claimed::InFlight { until_ms } => f
                .debug_struct("InFlight")
                .field("until_ms", until_ms)
                .finish(),
            Claimed::Conflict => f.write_str("Conflict"),
        }
    }
}

/// What [`Once::run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This call ran the work and recorded its result.
    Ran(Option<Bytes>),
    /// The work ran before (here or on another instance); its recorded result.
    Done(Option<Bytes>),
    /// Another caller runs it now; its lease runs out then unless renewed.
    InFlight {
        /// When that lease runs out (ms on the store's clock).
        until_ms: u64,
    },
    /// The key was claimed for another payload: not run.
    Conflict,
}

/// Why [`Once::run`] has no [`Outcome`]. The work's own error and a panic release the key
/// (a retry may run it); the last two mean the work ran but is not recorded as done.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E> {
    /// The store could not claim the key: nothing ran.
    #[error("nothing ran: {0}")]
    Store(StoreError),
    /// The work failed; the key was released for a retry.
    #[error("the work failed; its key was released for a retry: {0}")]
    Failed(E),
    /// The work panicked; the key was released for a retry.
    #[error("the work panicked; its key was released for a retry")]
    Panicked,
    /// The work ran, but its lease was taken over meanwhile (it ran out while the store could
    /// not be reached): the new holder may run the work too.
    #[error("the work ran but its lease had been taken over: another holder may run it too")]
    Fenced {
        /// The work's result.
        result: Option<Bytes>,
    },
    /// The work ran, but the store did not record it within the lease: a later claim may run
    /// it again.
    #[error("the work ran but the store did not record it: {error}")]
    NotRecorded {
        /// The work's result.
        result: Option<Bytes>,
        /// The store's last answer.
        error: StoreError,
    },
}

/// The first pause between claims while another holder works; it doubles up to the last.
const FIRST_POLL: Duration = Duration::from_millis(5);
const LAST_POLL: Duration = Duration::from_millis(100);

/// The claim protocol over a store: claim → run while renewing → settle once.
///
/// Cheap to clone (the store is shared). See the crate's documentation for an example.
pub struct Once<S> {
    store: Arc<S>,
    observer: Arc<dyn Observer>,
    lease: Duration,
    retention: Duration,
}

impl<S> Clone for Once<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            observer: self.observer.clone(),
            lease: self.lease,
            retention: self.retention,
        }
    }
}

impl<S: DedupStore> Once<S> {
    /// The protocol over `store`: leases of 30 s unless a key says otherwise, results kept for
    /// a day.
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store,
            observer: Arc::new(Quiet),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
        }
    }

    /// Leases of `lease` for keys that name none.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Keeps a done key (and its result) for `retention`: a repeat within it gets the result,
    /// one after it runs the work again.
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Tells `observer` about renewals, lost leases, refused completions and abandoned guards.
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// How long a done key is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Claims `key` once.
    pub async fn claim(&self, key: OnceKey) -> Result<Claimed<S>, StoreError> {
        let lease_for = key.lease.unwrap_or(self.lease);
        let claim = self
            .store
            .claim_with_fingerprint(&key.key, key.partition, lease_for, key.fingerprint)
            .await?;
        Ok(self.claimed(claim, key))
    }

    /// Claims, and while someone else holds the key, claims again until `wait` has passed: a
    /// repeat gets the first run's result instead of "in flight" when that run ends in time,
    /// or the key itself when that run gives up. Answers `InFlight` only after `wait`.
    pub async fn claim_or_wait(
        &self,
        key: OnceKey,
        wait: Duration,
    ) -> Result<Claimed<S>, StoreError> {
        let deadline = Instant::now() + wait;
        let mut pause = FIRST_POLL;
        loop {
            let claimed = self.claim(key).await?;
            let left = deadline.saturating_duration_since(Instant::now());
            if !matches!(claimed, Claimed::InFlight { .. }) || left.is_zero() {
                return Ok(claimed);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(LAST_POLL);
        }
    }

    /// What a claim made elsewhere found (a queue's hand-out that claimed its event's key),
    /// as [`claim`](Self::claim) would answer it: `key` says how the lease renews.
    pub fn claimed(&self, claim: Claim, key: OnceKey) -> Claimed<S> {
        match claim {
            Claim::Acquired(lease) | Claim::TookOver(lease) => Claimed::Run(self.adopt(lease, key)),
            Claim::Done { outcome } => Claimed::Done(outcome),
            Claim::InFlight { until_ms } => Claimed::InFlight { until_ms },
            Claim::Conflict => Claimed::Conflict,
        }
    }

    /// A guard for `lease`, granted elsewhere with its key's claim (a queue's hand-out):
    /// settled, renewed and released on drop like a claim's. A lease a client presents again
    /// is settled with [`complete_lease`](Self::complete_lease) instead, which releases nothing
    /// if the call is dropped.
    pub fn adopt(&self, lease: Lease, key: OnceKey) -> Held<S> {
        let lease_for = key.lease.unwrap_or(self.lease);
        Held {
            store: self.store.clone(),
            observer: self.observer.clone(),
            lease,
            lease_for,
            renew_every: key.renew_every.unwrap_or(lease_for / 3),
            retention: self.retention,
            settled: AtomicBool::new(false),
        }
    }

    /// Extends `lease` — handed on with [`Held::into_lease`] and presented again by its
    /// holder — by `extend` from now.
    pub async fn renew_lease(
        &self,
        lease: &Lease,
        extend: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.store.renew(lease, extend).await
    }

    /// Completes a lease handed on with [`Held::into_lease`], presented again by its holder.
    /// No guard: a holder that goes away mid-call leaves its lease to run out (or to be
    /// settled by its retry), never released behind its back.
    pub async fn complete_lease(
        &self,
        lease: &Lease,
        result: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        let fence = self.store.complete(lease, self.retention, result).await?;
        if fence == FenceCheck::Rejected {
            self.observer.fenced(lease);
        }
        Ok(fence)
    }

    /// Releases a lease handed on with [`Held::into_lease`], presented again by its holder.
    pub async fn release_lease(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.store.release(lease).await
    }

    /// Runs `work` once for `key`: claims it (waiting up to `wait` for another holder),
    /// runs `work` with the lease while renewing it, and records its result — or answers the
    /// result recorded before. The work's error or panic releases the key for a retry.
    /// Recording is retried within the lease while the store is away.
    pub async fn run<F, Fut, E>(
        &self,
        key: OnceKey,
        wait: Duration,
        work: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<Option<Bytes>, E>>,
    {
        let held = match self
            .claim_or_wait(key, wait)
            .await
            .map_err(RunError::Store)?
        {
            Claimed::Run(held) => held,
            Claimed::Done(result) => return Ok(Outcome::Done(result)),
            Claimed::InFlight { until_ms } => return Ok(Outcome::InFlight { until_ms }),
            Claimed::Conflict => return Ok(Outcome::Conflict),
        };
        let result = match held.run(work(*held.lease())).await {
            Ok(Ok(result)) => result,
            Ok(Err(error)) => {
                let _ = held.release().await;
                return Err(RunError::Failed(error));
            }
            Err(Panicked) => {
                let _ = held.release().await;
                return Err(RunError::Panicked);
            }
        };
        let deadline = Instant::now() + held.lease_for();
        let mut pause = Duration::from_millis(20);
        loop {
            match held.complete(result.clone()).await {
                Ok(FenceCheck::Accepted) => return Ok(Outcome::Ran(result)),
                Ok(FenceCheck::Rejected) => return Err(RunError::Fenced { result }),
                Err(error) if Instant::now() + pause >= deadline => {
                    // The lease runs out anyway: nothing to release.
                    let _ = held.into_lease();
                    return Err(RunError::NotRecorded { result, error });
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}
