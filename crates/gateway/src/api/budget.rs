//! Waiting for a send's rate budgets: replies and mentions go before bulk notifications to the
//! same receiver, and the sends that wait are bounded, so that a burst is told "later" instead
//! of piling up.

use std::collections::HashMap;
use std::sync::Mutex;
#[cfg(feature = "send")]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use oncegate_core::{KeyHash, Rate, RateVerdict, Store, StoreError};
use tokio::time::Instant;

use crate::Shared;

/// How often a bulk send looks again while replies wait for its receiver.
const YIELD: Duration = Duration::from_millis(20);

/// The bucket of budget `name` (a receiver's, a conversation's, the app's) within `scope`, the
/// app a send or a reply goes out as: one naming for `/send` and a long connection's replies, so
/// that they spend one budget.
#[cfg(any(feature = "send", feature = "long-connection"))]
pub(crate) fn bucket(scope: &str, name: &str) -> KeyHash {
    oncegate_core::key_for("send", scope, name, "")
}

/// Which lane a send waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Replies and mentions: a person waits for them.
    High,
    /// Notifications: they wait while a reply waits for the same receiver.
    Bulk,
}

/// The sends waiting for budgets in this gateway.
#[derive(Default)]
pub(crate) struct Waiting {
    /// Sends waiting now, against `max`.
    #[cfg(feature = "send")]
    count: AtomicUsize,
    /// High-lane sends waiting, by bucket.
    high: Mutex<HashMap<KeyHash, usize>>,
}

/// Why a send got no budget.
pub(crate) enum NoBudget {
    /// It would wait past its deadline: retry after this long.
    Later(Duration),
    /// As many sends wait as `api.max_waiting_sends` allows.
    #[cfg(feature = "send")]
    Crowded(usize),
    /// The store cannot answer.
    Store(StoreError),
}

/// Holds a place among the waiting sends until dropped.
#[cfg(feature = "send")]
pub(crate) struct Counted<'a>(&'a AtomicUsize);

#[cfg(feature = "send")]
impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Waiting {
    /// A place among the sends that wait, unless `max` already do.
    #[cfg(feature = "send")]
    pub(crate) fn enter(&self, max: usize) -> Result<Counted<'_>, NoBudget> {
        if self.count.fetch_add(1, Ordering::Relaxed) >= max {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return Err(NoBudget::Crowded(max));
        }
        Ok(Counted(&self.count))
    }
}

/// Holds a place in the high lane's counts until dropped.
struct Place<'a> {
    waiting: &'a Waiting,
    high: Vec<KeyHash>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut high = lock(&self.waiting.high);
        for bucket in &self.high {
            if let Some(n) = high.get_mut(bucket) {
                *n -= 1;
                if *n == 0 {
                    high.remove(bucket);
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes one call from every budget, waiting until `deadline` at most (a send counts itself
/// among the waiting with [`Waiting::enter`] first).
pub(crate) async fn take<S: Store>(
    shared: &Shared<S>,
    source: &str,
    budgets: &[(KeyHash, Rate)],
    lane: Lane,
    deadline: Instant,
) -> Result<(), NoBudget> {
    let waiting = &shared.api.sends_waiting;
    let mut place = Place {
        waiting,
        high: Vec::new(),
    };
    if lane == Lane::High {
        let mut high = lock(&waiting.high);
        for (bucket, _) in budgets {
            *high.entry(*bucket).or_default() += 1;
            place.high.push(*bucket);
        }
    }
    for (bucket, rate) in budgets {
        loop {
            let yields = lane == Lane::Bulk && lock(&waiting.high).contains_key(bucket);
            if yields {
                if Instant::now() + YIELD > deadline {
                    return Err(NoBudget::Later(YIELD));
                }
                tokio::time::sleep(YIELD).await;
                continue;
            }
            match shared.store.take_rate(bucket, *rate).await {
                Ok(RateVerdict::Granted) => break,
                Ok(RateVerdict::Wait(pause)) if Instant::now() + pause <= deadline => {
                    metrics::counter!("oncegate_send_rate_waits_total", "source" => source.to_owned())
                        .increment(1);
                    tokio::time::sleep(pause).await;
                }
                Ok(RateVerdict::Wait(pause)) => return Err(NoBudget::Later(pause)),
                Err(error) => return Err(NoBudget::Store(error)),
            }
        }
    }
    drop(place);
    Ok(())
}
