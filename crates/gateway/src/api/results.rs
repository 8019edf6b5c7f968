//! How much a caller's `/keys` results may hold of the store: results live as long as their
//! keys (`dedup.retention`, a day by default), so a caller completing with large results at a
//! high rate would fill the gateway's memory (2,000 results of 65 KB took a memory store from 32
//! to 304 MB for a day). Each caller has a count and a byte budget of results kept; a result
//! beyond it is refused (429, with when room comes back) and the caller may complete without one.
//! Kept per gateway process: a restart forgets what the store still holds.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Results a caller may have kept at once, unless its `[[api.caller]]` says otherwise.
pub(crate) const DEFAULT_RESULTS: u64 = 100_000;
/// Bytes of results a caller may have kept at once, unless its `[[api.caller]]` says otherwise.
pub(crate) const DEFAULT_RESULT_BYTES: u64 = 64 * 1024 * 1024;

/// One caller's budget and what it holds now.
#[derive(Debug)]
pub(crate) struct ResultBudget {
    max_results: u64,
    max_bytes: u64,
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    results: u64,
    bytes: u64,
    /// (until when, bytes) of each result kept, oldest first: the retention is one for all,
    /// so they also run out in this order.
    each: VecDeque<(u64, u64)>,
}

/// A refused result: what the caller keeps, and when the oldest of it runs out.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) results: u64,
    pub(crate) bytes: u64,
    pub(crate) room_in_ms: u64,
}

impl ResultBudget {
    pub(crate) fn new(max_results: u64, max_bytes: u64) -> Self {
        Self {
            max_results,
            max_bytes,
            kept: Mutex::default(),
        }
    }

    /// The limits, for messages.
    pub(crate) fn limits(&self) -> (u64, u64) {
        (self.max_results, self.max_bytes)
    }

    /// Whether one more result of `bytes` fits at `now_ms`.
    pub(crate) fn check(&self, now_ms: u64, bytes: u64) -> Result<(), Spent> {
        let mut kept = self.lock();
        kept.forget_until(now_ms);
        if kept.results < self.max_results && kept.bytes.saturating_add(bytes) <= self.max_bytes {
            return Ok(());
        }
        Err(Spent {
            results: kept.results,
            bytes: kept.bytes,
            room_in_ms: kept
                .each
                .front()
                .map_or(0, |(until, _)| until.saturating_sub(now_ms)),
        })
    }

    /// Counts a result of `bytes` kept until `until_ms`. (Completions that pass `check` at
    /// once may together go past the budget by as many as run at once.)
    pub(crate) fn keep(&self, until_ms: u64, bytes: u64) {
        let mut kept = self.lock();
        kept.results += 1;
        kept.bytes = kept.bytes.saturating_add(bytes);
        kept.each.push_back((until_ms, bytes));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Kept {
    fn forget_until(&mut self, now_ms: u64) {
        while let Some(&(until, bytes)) = self.each.front() {
            if until > now_ms {
                break;
            }
            self.each.pop_front();
            self.results -= 1;
            self.bytes -= bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_comes_back_as_results_run_out() {
        let budget = ResultBudget::new(2, 100);
        assert_eq!(budget.check(0, 60), Ok(()));
        budget.keep(1_000, 60);
        // Bytes: 60 + 50 > 100.
        assert_eq!(
            budget.check(10, 50),
            Err(Spent {
                results: 1,
                bytes: 60,
                room_in_ms: 990
            })
        );
        assert_eq!(budget.check(10, 40), Ok(()));
        budget.keep(1_010, 40);
        // Count: two kept.
        assert!(budget.check(20, 0).is_err());
        // The first runs out: room for one again.
        assert_eq!(budget.check(1_000, 60), Ok(()));
        assert!(budget.check(1_000, 61).is_err());
        assert_eq!(budget.check(1_010, 100), Ok(()));
    }
}
