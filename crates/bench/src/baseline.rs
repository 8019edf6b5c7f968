//! The seed design, reproduced as the baseline: one global lock around a hash map of full
//! records keyed by the event id string, a global queue, and a periodic cleanup that scans every
//! record under that lock (the .NET SDK's `FeishuEventDeduplicator`, with its 5-minute timer).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use oncegate_core::passthrough::BuildPassThrough;
use oncegate_core::{Event, KeyHash};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Processing,
    Completed,
}

#[derive(Debug)]
pub(crate) struct EventCacheEntry {
    pub(crate) processed_at_ms: u64,
    #[allow(dead_code)]
    pub(crate) event_id: String,
    pub(crate) status: Status,
}

/// A global-lock deduplicator with full records.
#[derive(Debug, Default)]
pub(crate) struct SeedDeduplicator {
    cache: Mutex<HashMap<String, EventCacheEntry>>,
    queue: Mutex<VecDeque<Event>>,
}

impl SeedDeduplicator {
    /// Seen-check, insert and enqueue (the seed marks and enqueues in two steps; we give it the
    /// benefit of doing both under its one lock).
    pub(crate) fn admit(&self, event: Event, now_ms: u64) -> bool {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.contains_key(&*event.event_id) {
            return false;
        }
        // The seed's own copies of the id: a map key and a field of the entry.
        cache.insert(
            event.event_id.to_string(),
            EventCacheEntry {
                processed_at_ms: now_ms,
                event_id: event.event_id.to_string(),
                status: Status::Processing,
            },
        );
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(event);
        true
    }

    /// `TryMarkAsProcessing`: true when the caller may process.
    pub(crate) fn try_mark_processing(&self, event_id: &str, now_ms: u64, timeout_ms: u64) -> bool {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = cache.get(event_id) {
            if entry.status == Status::Completed {
                return false;
            }
            if now_ms.saturating_sub(entry.processed_at_ms) <= timeout_ms {
                return false;
            }
            cache.remove(event_id);
        }
        cache.insert(
            event_id.to_owned(),
            EventCacheEntry {
                processed_at_ms: now_ms,
                event_id: event_id.to_owned(),
                status: Status::Processing,
            },
        );
        true
    }

    /// `MarkAsCompleted`.
    pub(crate) fn mark_completed(&self, event_id: &str, now_ms: u64) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = cache.get_mut(event_id) {
            entry.status = Status::Completed;
            entry.processed_at_ms = now_ms;
        }
    }

    /// The periodic cleanup: a full scan under the global lock.
    pub(crate) fn cleanup(&self, now_ms: u64, retention_ms: u64) -> usize {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let before = cache.len();
        cache.retain(|_, entry| now_ms.saturating_sub(entry.processed_at_ms) < retention_ms);
        before - cache.len()
    }
}

/// The least a store with sharded dedup and a partitioned queue must do per admit, kept as a
/// second floor for the memory store: a lock on one of 64 shards around a hash set of 128-bit
/// keys, then a lock on one of 16 partitions around a `Vec` the event is pushed onto. No
/// expiry, no per-chat order, no eviction, no journal: what the memory store adds to this is
/// what its features cost.
#[derive(Debug)]
pub(crate) struct MinimalStore {
    shards: Vec<Mutex<std::collections::HashSet<KeyHash, BuildPassThrough>>>,
    partitions: Vec<Mutex<Vec<Event>>>,
}

impl MinimalStore {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..64).map(|_| Mutex::default()).collect(),
            partitions: (0..16).map(|_| Mutex::default()).collect(),
        }
    }

    /// Marks `key` and queues `event` in its chat's partition, unless `key` was marked before.
    pub(crate) fn admit(&self, event: Event, key: KeyHash) -> bool {
        let shard = &self.shards[key.high64() as usize % self.shards.len()];
        if !shard.lock().unwrap_or_else(|p| p.into_inner()).insert(key) {
            return false;
        }
        let partition = event.order_hash() as usize % self.partitions.len();
        self.partitions[partition]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
        true
    }
}
