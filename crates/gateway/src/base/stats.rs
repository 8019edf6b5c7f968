//! Counters of every layer, kept as atomics for the admin API and mirrored to `metrics`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// What the gateway has done since it started.
        #[derive(Debug, Default)]
        pub struct Stats {
            $(#[doc = $doc] pub $name: Count,)*
        }

        /// A copy of [`Stats`] at one moment.
        #[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $(#[doc = $doc] pub $name: u64,)*
        }

        impl Stats {
            /// Reads every counter.
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.get(),)* }
            }
        }
    };
}

counters! {
    requests: "Callback requests received.",
    admitted: "Events admitted (new).",
    duplicates: "Events answered as duplicates.",
    challenges: "URL verification challenges answered.",
    replays_rejected: "Requests refused for a replayed nonce.",
    stale_timestamps: "Requests refused for a timestamp outside the allowed skew.",
    bad_requests: "Requests refused for bad input (signature, token, body, envelope, size).",
    store_unavailable: "Requests answered 503 because the store could not admit.",
    queue_full: "Requests answered 503 because the queue held dispatcher.max_queued events.",
    tenant_queue_full: "Requests answered 503 because their tenant held dispatcher.max_queued_per_tenant events.",
    delivered: "Events handed to a sink successfully.",
    retries: "Delivery attempts that failed transiently and were scheduled again.",
    dead_letters: "Events given up after a permanent failure or too many attempts.",
    stale_dropped: "Events dropped by a route's watermark as older than one already applied.",
    unrouted: "Events no route matched (acknowledged and dropped).",
    already_done: "Queue entries whose key was already completed (a crash between complete and ack).",
    fenced: "Completions refused because the lease was taken over (another worker ran it).",
    leases_lost: "Running handlers whose lease renewal was refused: someone else took over.",
    cards: "Card callbacks answered.",
    spooled: "Requests accepted into the local spool because the store could not admit them.",
    unspooled: "Spooled admissions handed to the store once it answered again.",
}

impl Stats {
    /// Adds one to a counter and to its metric.
    pub fn bump(&self, counter: &Count, metric: &'static str) {
        counter.value.fetch_add(1, Ordering::Relaxed);
        // Registered once: a lookup in the recorder per bump cost more than the count.
        counter
            .metric
            .get_or_init(|| metrics::counter!(metric))
            .increment(1);
    }
}

/// One of [`Stats`]' counters, with its metric's handle.
#[derive(Debug, Default)]
pub struct Count {
    value: AtomicU64,
    metric: OnceLock<metrics::Counter>,
}

impl Count {
    /// The count so far.
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}
