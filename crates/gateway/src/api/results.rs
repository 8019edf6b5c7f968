//! How much a caller's `/keys` results may hold of the store: results live as long as their
//! keys (`dedup.retention`, a day by default), so a caller completing with large results at a
//! high rate would fill the gateway's memory (2,000 results of 65 KB took a memory store from 32
//! to 304 MB for a day). Each caller has a count and a byte budget of results kept; a result
//! beyond it is refused (429, with when room comes back) and the caller may complete without one.
//! What each caller keeps is written to the store as it grows (a ledger of hourly counts, flushed
//! every second, [`flush`]) and read back at start ([`load`]): a restart does not forget it, and
//! gateways on one store start from what all of them kept.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::state::MAX_LIST;
use oncegate_core::{Changed, Expect, StateStore, StoreError};

/// Results are counted in the ledger by the hour they run out in.
const HOUR_MS: u64 = 3_600_000;

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
    /// (until when, results, bytes) of the results kept, oldest first: the retention is one
    /// for all, so they also run out in this order (those read from the ledger count to the
    /// end of their hour).
    each: VecDeque<(u64, u64, u64)>,
    /// What was kept since the last flush to the ledger: results and bytes by hour.
    unflushed: BTreeMap<u64, (u64, u64)>,
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
                .map_or(0, |(until, _, _)| until.saturating_sub(now_ms)),
        })
    }

    /// Counts a result of `bytes` kept until `until_ms`. (Completions that pass `check` at
    /// once may together go past the budget by as many as run at once.)
    pub(crate) fn keep(&self, until_ms: u64, bytes: u64) {
        let mut kept = self.lock();
        kept.results += 1;
        kept.bytes = kept.bytes.saturating_add(bytes);
        kept.each.push_back((until_ms, 1, bytes));
        let hour = kept.unflushed.entry(until_ms / HOUR_MS).or_default();
        hour.0 += 1;
        hour.1 = hour.1.saturating_add(bytes);
    }

    /// Counts what the ledger says caller `name` keeps (read at start, before any result).
    pub(crate) async fn load<S: StateStore>(
        &self,
        store: &S,
        name: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let namespace = ledger(name);
        let mut after: Option<String> = None;
        let mut hours = Vec::new();
        loop {
            let page = store
                .state_list(&namespace, after.as_deref(), MAX_LIST)
                .await?;
            let full = page.len() == MAX_LIST;
            after = page.last().map(|(hour, _)| hour.clone());
            hours.extend(page.into_iter().filter_map(|(hour, kept)| {
                let (results, bytes) = counts(&kept.value);
                Some((hour.parse::<u64>().ok()?, results, bytes))
            }));
            if !full {
                break;
            }
        }
        hours.sort_unstable();
        let mut kept = self.lock();
        for (hour, results, bytes) in hours {
            let until = (hour + 1) * HOUR_MS;
            if until > now_ms && results > 0 {
                kept.results += results;
                kept.bytes = kept.bytes.saturating_add(bytes);
                kept.each.push_back((until, results, bytes));
            }
        }
        Ok(())
    }

    /// Adds what was kept since the last flush to caller `name`'s ledger (compare-and-set, so
    /// gateways sharing the store add up); what cannot be written now is tried at the next.
    pub(crate) async fn flush<S: StateStore>(
        &self,
        store: &S,
        name: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let unflushed = std::mem::take(&mut self.lock().unflushed);
        let namespace = ledger(name);
        let mut failed = None;
        for (&hour, &(results, bytes)) in &unflushed {
            let until = (hour + 1) * HOUR_MS;
            let ttl = Duration::from_millis(until.saturating_sub(now_ms).max(1));
            if let Err(error) = add(store, &namespace, hour, (results, bytes), ttl).await {
                let mut kept = self.lock();
                let again = kept.unflushed.entry(hour).or_default();
                again.0 += results;
                again.1 = again.1.saturating_add(bytes);
                failed = Some(error);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Kept {
    fn forget_until(&mut self, now_ms: u64) {
        while let Some(&(until, results, bytes)) = self.each.front() {
            if until > now_ms {
                break;
            }
            self.each.pop_front();
            self.results = self.results.saturating_sub(results);
            self.bytes = self.bytes.saturating_sub(bytes);
        }
    }
}

/// Reads every caller's ledger (at start), then writes what they keep to it every second until
/// `shutdown`, and once more then. A store that keeps no shared values (the earlier redb file)
/// keeps no ledger: the budget then counts from the start, as before.
pub(crate) async fn keep_ledgers<S: oncegate_core::Store>(
    shared: std::sync::Arc<crate::Shared<S>>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    if shared.api.callers.is_empty() {
        return;
    }
    let note = |error: StoreError| match error {
        StoreError::Invalid(_) => {}
        error => shared.summaries.note(
            "results_ledger",
            None,
            &format!("the /keys results ledger could not be written ({error}); tried again"),
        ),
    };
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            () = shutdown.cancelled() => true,
            _ = every.tick() => false,
        };
        for caller in &shared.api.callers {
            let flushed = caller
                .results
                .flush(&*shared.store, &caller.name, shared.now_ms())
                .await;
            if let Err(error) = flushed {
                note(error);
            }
        }
        if stopping {
            return;
        }
    }
}

/// The store namespace of a caller's ledger.
fn ledger(name: &str) -> String {
    format!("results:{name}")
}

fn counts(value: &[u8]) -> (u64, u64) {
    let doc: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    (
        doc["results"].as_u64().unwrap_or(0),
        doc["bytes"].as_u64().unwrap_or(0),
    )
}

/// Adds `(results, bytes)` to the ledger's `hour`.
async fn add<S: StateStore>(
    store: &S,
    namespace: &str,
    hour: u64,
    (results, bytes): (u64, u64),
    ttl: Duration,
) -> Result<(), StoreError> {
    let name = hour.to_string();
    for _ in 0..8 {
        let (expect, (had, had_bytes)) = match store.state_get(namespace, &name).await? {
            Some(kept) => (Expect::Version(kept.version), counts(&kept.value)),
            None => (Expect::Absent, (0, 0)),
        };
        let value = serde_json::json!({
            "results": had + results,
            "bytes": had_bytes.saturating_add(bytes),
        });
        let value = Bytes::from(value.to_string());
        if let Changed::Done(_) = store
            .state_put(namespace, &name, value, expect, Some(ttl))
            .await?
        {
            return Ok(());
        }
    }
    Err(StoreError::Unavailable(
        "the results ledger kept changing under eight writes in a row".into(),
    ))
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
