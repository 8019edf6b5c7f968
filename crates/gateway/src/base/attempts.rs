//! The delivery history of events that did not go through at once: each attempt's time,
//! latency, outcome and error, and when the next one is due — for `/admin/record`, `oncegate
//! inspect` and an operator asking "why is this one late". Kept by each gateway for the attempts
//! it made, bounded in keys and in attempts per key; an event delivered at its first attempt
//! costs one load of a bit here (its record says "completed").

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use oncegate_core::KeyHash;
use serde::Serialize;

/// Events whose attempts are kept; the oldest is forgotten first.
const KEYS: usize = 10_000;
/// Attempts kept per event: the first and the latest ones.
const PER_KEY: usize = 16;
/// The longest error kept.
const ERROR_CHARS: usize = 300;

/// One delivery attempt.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Attempt {
    /// When it started (unix ms).
    pub(crate) at_ms: u64,
    /// Its number, from 0.
    pub(crate) attempt: u32,
    /// How long the sink took.
    pub(crate) latency_ms: u64,
    /// `delivered`, `retry` or `dead_letter`.
    pub(crate) outcome: &'static str,
    /// What the sink answered, for a failure.
    pub(crate) error: Option<String>,
    /// When the next attempt is due, for a retry (`Retry-After` included).
    pub(crate) next_at_ms: Option<u64>,
}

/// Which event a key's attempts were of: for the list of failing deliveries.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Of {
    pub(crate) platform: std::sync::Arc<str>,
    pub(crate) app: std::sync::Arc<str>,
    pub(crate) event_id: std::sync::Arc<str>,
    pub(crate) event_type: std::sync::Arc<str>,
}

impl Of {
    pub(crate) fn event(event: &oncegate_core::Event) -> Self {
        Self {
            platform: event.platform.clone(),
            app: event.app.clone(),
            event_id: event.event_id.clone(),
            event_type: event.event_type.clone(),
        }
    }
}

/// One event's kept attempts.
struct Entry {
    of: Of,
    attempts: VecDeque<Attempt>,
}

/// An event that failed at least once, as the status page lists it.
#[derive(Debug, Serialize)]
pub(crate) struct Failing {
    #[serde(flatten)]
    pub(crate) of: Of,
    /// Attempts made (as far as this gateway saw them).
    pub(crate) attempts: u32,
    /// The latest attempt.
    pub(crate) last: Attempt,
    /// Every attempt kept (the first and the latest ones), oldest first.
    pub(crate) history: Vec<Attempt>,
}

#[derive(Default)]
struct Kept {
    by_key: HashMap<KeyHash, Entry>,
    order: VecDeque<KeyHash>,
}

/// Bits of the filter that tells a delivery whether its key may have failed before (2^20 bits:
/// about 1 % false positives at [`KEYS`] keys), so that the deliveries of a healthy downstream
/// never take the lock, even after other events failed.
const FILTER_WORDS: usize = (1 << 20) / 64;

/// This gateway's attempts of events that failed at least once.
pub(crate) struct Attempts {
    /// A bit per key hash that failed (never cleared: a stale bit costs one lookup).
    filter: Box<[AtomicU64]>,
    kept: Mutex<Kept>,
}

impl Default for Attempts {
    fn default() -> Self {
        Self {
            filter: (0..FILTER_WORDS).map(|_| AtomicU64::new(0)).collect(),
            kept: Mutex::default(),
        }
    }
}

/// The filter's word and bit of `key`.
fn slot(key: &KeyHash) -> (usize, u64) {
    let bits = key.low64() as usize % (FILTER_WORDS * 64);
    (bits / 64, 1 << (bits % 64))
}

impl Attempts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes a failed attempt of `key`, an attempt of `of`.
    pub(crate) fn failed(&self, key: KeyHash, of: &oncegate_core::Event, mut attempt: Attempt) {
        if let Some(error) = &mut attempt.error
            && error.chars().count() > ERROR_CHARS
        {
            *error = error.chars().take(ERROR_CHARS).collect::<String>() + "…";
        }
        let mut kept = self.lock();
        if !kept.by_key.contains_key(&key) {
            if kept.order.len() >= KEYS
                && let Some(oldest) = kept.order.pop_front()
            {
                kept.by_key.remove(&oldest);
            }
            kept.order.push_back(key);
        }
        let entry = kept.by_key.entry(key).or_insert_with(|| Entry {
            of: Of::event(of),
            attempts: VecDeque::new(),
        });
        push(&mut entry.attempts, attempt);
        let (word, bit) = slot(&key);
        self.filter[word].fetch_or(bit, Ordering::Relaxed);
    }

    /// Notes the delivery of `key`, if it failed before (otherwise nothing is kept).
    pub(crate) fn delivered(&self, key: KeyHash, attempt: Attempt) {
        let (word, bit) = slot(&key);
        if self.filter[word].load(Ordering::Relaxed) & bit == 0 {
            return;
        }
        if let Some(entry) = self.lock().by_key.get_mut(&key) {
            push(&mut entry.attempts, attempt);
        }
    }

    /// When `key`'s first attempt started, if this gateway made it and failed (the first
    /// attempt is always kept).
    pub(crate) fn first_at(&self, key: &KeyHash) -> Option<u64> {
        let (word, bit) = slot(key);
        if self.filter[word].load(Ordering::Relaxed) & bit == 0 {
            return None;
        }
        self.lock()
            .by_key
            .get(key)
            .and_then(|entry| entry.attempts.front())
            .filter(|first| first.attempt == 0)
            .map(|first| first.at_ms)
    }

    /// The attempts kept of `key`, oldest first.
    pub(crate) fn of(&self, key: &KeyHash) -> Vec<Attempt> {
        self.lock()
            .by_key
            .get(key)
            .map(|entry| entry.attempts.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The `limit` events whose latest attempt came last, that one first.
    pub(crate) fn latest(&self, limit: usize) -> Vec<Failing> {
        let kept = self.lock();
        let last_at = |entry: &&Entry| entry.attempts.back().map_or(0, |last| last.at_ms);
        let mut latest: Vec<&Entry> = kept
            .by_key
            .values()
            .filter(|entry| !entry.attempts.is_empty())
            .collect();
        // The dispatcher takes this lock on every failure: pick the few in linear time and
        // order only them, rather than sorting up to `KEYS` entries per page per second.
        if latest.len() > limit && limit > 0 {
            latest.select_nth_unstable_by_key(limit - 1, |entry| std::cmp::Reverse(last_at(entry)));
            latest.truncate(limit);
        }
        latest.sort_unstable_by_key(|entry| std::cmp::Reverse(last_at(entry)));
        latest
            .into_iter()
            .take(limit)
            .filter_map(|entry| {
                let last = entry.attempts.back()?.clone();
                Some(Failing {
                    of: entry.of.clone(),
                    attempts: last.attempt.saturating_add(1),
                    last,
                    history: entry.attempts.iter().cloned().collect(),
                })
            })
            .collect()
    }
}

/// Appends, keeping the first attempt and the latest ones.
fn push(attempts: &mut VecDeque<Attempt>, attempt: Attempt) {
    if attempts.len() >= PER_KEY {
        attempts.remove(1);
    }
    attempts.push_back(attempt);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32, outcome: &'static str) -> Attempt {
        Attempt {
            at_ms: u64::from(n),
            attempt: n,
            latency_ms: 1,
            outcome,
            error: Some("x".repeat(1_000)),
            next_at_ms: None,
        }
    }

    fn event(id: &str) -> oncegate_core::Event {
        oncegate_core::Event {
            platform: "feishu".into(),
            app: "cli_a".into(),
            tenant: None,
            event_id: id.into(),
            event_type: "im.message.receive_v1".into(),
            created_at_ms: 0,
            order_key: None,
            payload: bytes::Bytes::new(),
        }
    }

    #[test]
    fn the_latest_failing_events_come_first_with_their_last_attempt() {
        let attempts = Attempts::default();
        for (n, id) in ["a", "b", "c"].iter().enumerate() {
            let n = u32::try_from(n).expect("small");
            attempts.failed(KeyHash::of(&[id]), &event(id), attempt(n * 10, "retry"));
        }
        // `a` fails again, later than the others.
        attempts.failed(KeyHash::of(&["a"]), &event("a"), attempt(30, "dead_letter"));
        let latest = attempts.latest(2);
        let shown: Vec<(&str, u32, &str)> = latest
            .iter()
            .map(|f| (&*f.of.event_id, f.attempts, f.last.outcome))
            .collect();
        assert_eq!(shown, [("a", 31, "dead_letter"), ("c", 21, "retry")]);
        let history: Vec<u32> = latest[0].history.iter().map(|a| a.attempt).collect();
        assert_eq!(history, [0, 30], "a's attempts, oldest first");
    }

    #[test]
    fn only_events_that_failed_are_kept_within_the_bounds() {
        let attempts = Attempts::default();
        let key = KeyHash::of(&["k"]);
        let event = event("k");
        attempts.delivered(key, attempt(0, "delivered"));
        assert!(
            attempts.of(&key).is_empty(),
            "a first-time delivery costs nothing"
        );
        for n in 0..40 {
            attempts.failed(key, &event, attempt(n, "retry"));
        }
        attempts.delivered(key, attempt(40, "delivered"));
        let kept = attempts.of(&key);
        assert_eq!(kept.len(), PER_KEY);
        assert_eq!(
            (kept[0].attempt, kept[PER_KEY - 1].attempt),
            (0, 40),
            "first and latest"
        );
        assert_eq!(attempts.first_at(&key), Some(0), "the first attempt's time");
        assert_eq!(attempts.first_at(&KeyHash::of(&["other"])), None);
        assert!(
            kept[0]
                .error
                .as_ref()
                .is_some_and(|e| e.chars().count() <= ERROR_CHARS + 1)
        );
        for n in 0..(KEYS + 5) {
            attempts.failed(KeyHash::of(&[&n.to_string()]), &event, attempt(0, "retry"));
        }
        assert!(attempts.of(&key).is_empty(), "the oldest key was forgotten");
        assert_eq!(attempts.lock().by_key.len(), KEYS);
    }
}
