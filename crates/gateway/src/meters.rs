//! The gateway's per-event metrics, each handle registered once: a labelled metric looked up by
//! its labels on every event costs more than the count itself. Labels are bounded (layers,
//! configured apps), never event, chat or user ids.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram};

/// Where a repeat was caught, from the outside in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layer {
    /// The replay guard: a nonce handled before.
    Nonce,
    /// The replay guard: a timestamp outside the allowed skew.
    StaleTimestamp,
    /// The event id.
    EventKey,
    /// A secondary key (Feishu's message id): the same message under another event id.
    MessageKey,
    /// A business key already done (`/keys/claim`).
    BusinessKey,
    /// A route's watermark: older than an event already applied.
    StaleWatermark,
}

impl Layer {
    const ALL: [Layer; 6] = [
        Layer::Nonce,
        Layer::StaleTimestamp,
        Layer::EventKey,
        Layer::MessageKey,
        Layer::BusinessKey,
        Layer::StaleWatermark,
    ];

    fn label(self) -> &'static str {
        match self {
            Layer::Nonce => "nonce",
            Layer::StaleTimestamp => "stale_timestamp",
            Layer::EventKey => "event_key",
            Layer::MessageKey => "message_key",
            Layer::BusinessKey => "business_key",
            Layer::StaleWatermark => "stale_watermark",
        }
    }
}

/// What the dispatcher's claim of an event's key answered.
pub(crate) const CLAIM_OUTCOMES: [&str; 5] =
    ["acquired", "done", "in_flight", "conflict", "failed"];
/// What a running handler's lease renewal answered.
pub(crate) const RENEWAL_OUTCOMES: [&str; 3] = ["renewed", "lost", "failed"];

/// Apps counted apart; beyond, the rest share `app="other"` (sources are configured, so this
/// only bounds a misconfiguration).
const MOST_APPS: usize = 256;

/// A platform and an app on it.
type AppName = (Arc<str>, Arc<str>);

/// One app's admission counters.
struct AppMeters {
    admitted: Counter,
    duplicate: Counter,
}

/// Every per-event metric of one gateway.
#[derive(Default)]
pub(crate) struct Meters {
    drops: [OnceLock<Counter>; Layer::ALL.len()],
    /// The same counts, for the status page.
    drop_counts: [AtomicU64; Layer::ALL.len()],
    ingress: OnceLock<Histogram>,
    admit: OnceLock<Histogram>,
    handler: OnceLock<Histogram>,
    lag: OnceLock<Histogram>,
    claims: [OnceLock<Counter>; CLAIM_OUTCOMES.len()],
    renewals: [OnceLock<Counter>; RENEWAL_OUTCOMES.len()],
    apps: Mutex<HashMap<AppName, Arc<AppMeters>>>,
}

/// Counters that alerts and dashboards read, shown at 0 from the start: a series that appears
/// only with its first event cannot tell "none yet" from "not scraped".
const FROM_THE_START: [&str; 17] = [
    "oncegate_requests_total",
    "oncegate_admitted_total",
    "oncegate_duplicates_total",
    "oncegate_bad_requests_total",
    "oncegate_guard_refused_total",
    "oncegate_delivered_total",
    "oncegate_retries_total",
    "oncegate_dead_letters_total",
    "oncegate_dead_letters_replayed_total",
    "oncegate_stale_dropped_total",
    "oncegate_fenced_total",
    "oncegate_leases_lost_total",
    "oncegate_store_unavailable_total",
    "oncegate_queue_full_total",
    "oncegate_spooled_total",
    "oncegate_unrouted_total",
    "oncegate_already_done_total",
];

/// The buckets of every `_seconds` histogram: 100 µs to an hour (a backlog's age, too).
pub const SECONDS_BUCKETS: [f64; 20] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

impl Meters {
    /// A repeat (or refused replay) caught at `layer`.
    pub(crate) fn dropped(&self, layer: Layer) {
        let slot = Layer::ALL.iter().position(|l| *l == layer).unwrap_or(0);
        self.drop_counts[slot].fetch_add(1, Ordering::Relaxed);
        self.drops[slot]
            .get_or_init(|| metrics::counter!("oncegate_drops_total", "layer" => layer.label()))
            .increment(1);
    }

    /// Registers the counters read by alerts at 0, and every layer's drops.
    pub(crate) fn register(&self) {
        for name in FROM_THE_START {
            metrics::counter!(name).increment(0);
        }
        for (slot, layer) in Layer::ALL.iter().enumerate() {
            self.drops[slot]
                .get_or_init(|| metrics::counter!("oncegate_drops_total", "layer" => layer.label()))
                .increment(0);
        }
        metrics::gauge!("oncegate_queue_depth").increment(0.0);
        for slot in 0..CLAIM_OUTCOMES.len() {
            self.claim_counter(slot).increment(0);
        }
        for outcome in RENEWAL_OUTCOMES {
            self.renewal_zero(outcome);
        }
    }

    /// A dispatcher claim answered `outcome` (one of [`CLAIM_OUTCOMES`]).
    pub(crate) fn claim(&self, outcome: &'static str) {
        let slot = CLAIM_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(CLAIM_OUTCOMES.len() - 1);
        self.claim_counter(slot).increment(1);
    }

    fn claim_counter(&self, slot: usize) -> &Counter {
        self.claims[slot].get_or_init(
            || metrics::counter!("oncegate_claims_total", "outcome" => CLAIM_OUTCOMES[slot]),
        )
    }

    fn renewal_zero(&self, outcome: &'static str) {
        self.renewal_by(outcome, 0);
    }

    /// A lease renewal answered `outcome` (one of [`RENEWAL_OUTCOMES`]).
    pub(crate) fn renewal(&self, outcome: &'static str) {
        self.renewal_by(outcome, 1);
    }

    fn renewal_by(&self, outcome: &'static str, by: u64) {
        let slot = RENEWAL_OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(RENEWAL_OUTCOMES.len() - 1);
        self.renewals[slot]
            .get_or_init(|| {
                metrics::counter!("oncegate_lease_renewals_total", "outcome" => RENEWAL_OUTCOMES[slot])
            })
            .increment(by);
    }

    /// Repeats caught so far, by layer.
    pub(crate) fn drops(&self) -> Vec<(&'static str, u64)> {
        Layer::ALL
            .iter()
            .zip(&self.drop_counts)
            .map(|(layer, count)| (layer.label(), count.load(Ordering::Relaxed)))
            .collect()
    }

    fn app(&self, platform: &Arc<str>, app: &Arc<str>) -> Arc<AppMeters> {
        let mut apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(meters) = apps.get(&(platform.clone(), app.clone())) {
            return meters.clone();
        }
        let app: Arc<str> = if apps.len() < MOST_APPS {
            app.clone()
        } else {
            Arc::from("other")
        };
        let register = |outcome: &'static str| metrics::counter!("oncegate_events_total", "platform" => platform.to_string(), "app" => app.to_string(), "outcome" => outcome);
        let meters = Arc::new(AppMeters {
            admitted: register("admitted"),
            duplicate: register("duplicate"),
        });
        apps.insert((platform.clone(), app), meters.clone());
        meters
    }

    /// An event of `platform`'s `app` admitted (new).
    pub(crate) fn admitted(&self, platform: &Arc<str>, app: &Arc<str>) {
        self.app(platform, app).admitted.increment(1);
    }

    /// An event of `platform`'s `app` answered as a repeat, caught by key number `key_index`
    /// (0: its event id; later ones: its secondary keys).
    pub(crate) fn duplicate(&self, platform: &Arc<str>, app: &Arc<str>, key_index: usize) {
        self.app(platform, app).duplicate.increment(1);
        self.dropped(if key_index == 0 {
            Layer::EventKey
        } else {
            Layer::MessageKey
        });
    }

    /// A callback request answered, from its first byte read.
    pub(crate) fn ingress(&self, took: Duration) {
        self.ingress
            .get_or_init(|| metrics::histogram!("oncegate_ingress_seconds"))
            .record(took.as_secs_f64());
    }

    /// The store's answer to one admission.
    pub(crate) fn admit(&self, took: Duration) {
        self.admit
            .get_or_init(|| metrics::histogram!("oncegate_admit_seconds"))
            .record(took.as_secs_f64());
    }

    /// How long after the platform created it an event was handed to its sink: the backlog's
    /// age as the dispatcher meets it (platform retries and clock skew included).
    pub(crate) fn lag(&self, created_at_ms: u64, now_ms: u64) {
        let lag = now_ms.saturating_sub(created_at_ms) as f64 / 1000.0;
        self.lag
            .get_or_init(|| metrics::histogram!("oncegate_dispatch_lag_seconds"))
            .record(lag);
    }

    /// One delivery to a route's sink (its handler), whatever it answered.
    pub(crate) fn handler(&self, took: Duration) {
        self.handler
            .get_or_init(|| metrics::histogram!("oncegate_handler_seconds"))
            .record(took.as_secs_f64());
    }
}
