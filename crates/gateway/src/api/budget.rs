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
/// among the waiting with [`Waiting::enter`] first). All or none: when a budget says wait, the
/// calls taken from those before it are given back and the send waits before taking any — a
/// call counted long before it goes out would let its first budgets' calls bunch up. Each
/// budget's rate is as the platform's answers have left it (`adapt`).
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
    'round: loop {
        let yields = lane == Lane::Bulk && {
            let high = lock(&waiting.high);
            budgets.iter().any(|(bucket, _)| high.contains_key(bucket))
        };
        if yields {
            if Instant::now() + YIELD > deadline {
                return Err(NoBudget::Later(YIELD));
            }
            tokio::time::sleep(YIELD).await;
            continue;
        }
        let mut taken: Vec<(KeyHash, Rate)> = Vec::with_capacity(budgets.len());
        for (bucket, rate) in budgets {
            let rate = shared.api.learned.rate(bucket, *rate, Instant::now());
            match shared.store.take_rate(bucket, rate).await {
                Ok(RateVerdict::Granted) => taken.push((*bucket, rate)),
                Ok(RateVerdict::Wait(pause)) => {
                    give_back(shared, &taken).await;
                    if Instant::now() + pause > deadline {
                        return Err(NoBudget::Later(pause));
                    }
                    metrics::counter!("oncegate_send_rate_waits_total", "source" => source.to_owned())
                        .increment(1);
                    tokio::time::sleep(pause).await;
                    continue 'round;
                }
                Err(error) => {
                    give_back(shared, &taken).await;
                    return Err(NoBudget::Store(error));
                }
            }
        }
        break;
    }
    drop(place);
    Ok(())
}

/// Gives back the calls of a send that does not go out now.
async fn give_back<S: Store>(shared: &Shared<S>, taken: &[(KeyHash, Rate)]) {
    for (bucket, rate) in taken {
        // Not given back, the call stays counted: the budget is spent sooner, never exceeded.
        let _ = shared
            .store
            .adjust_rate(bucket, oncegate_core::RateAdjust::GiveBack(*rate))
            .await;
    }
}
