//! The gateway's per-event metrics, each handle registered once: a labelled metric looked up by
//! its labels on every event costs more than the count itself. Labels are bounded (layers,
//! outcomes, configured apps), never event, chat or user ids.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, HistogramFn};
use oncegate_core::Lease;
use oncegate_once::{Observer, Renewal};

use crate::base::recorder::Buckets;

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

/// The layers' labels, in the enum's order.
const LAYERS: [&str; 6] = [
    "nonce",
    "stale_timestamp",
    "event_key",
    "message_key",
    "business_key",
    "stale_watermark",
];

/// What the dispatcher's claim of an event's key answered.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ClaimOutcome {
    Acquired,
    Done,
    InFlight,
    Conflict,
    Failed,
}

const CLAIM_OUTCOMES: [&str; 5] = ["acquired", "done", "in_flight", "conflict", "failed"];

const RENEWALS: [&str; 3] = ["renewed", "lost", "failed"];

/// One counter told apart by one label's values, each handle registered on first use.
pub(crate) struct ByLabel<const N: usize> {
    name: &'static str,
    label: &'static str,
    values: [&'static str; N],
    handles: [OnceLock<Counter>; N],
}

impl<const N: usize> ByLabel<N> {
    pub(crate) const fn new(
        name: &'static str,
        label: &'static str,
        values: [&'static str; N],
    ) -> Self {
        Self {
            name,
            label,
            values,
            handles: [const { OnceLock::new() }; N],
        }
    }

    pub(crate) fn add(&self, slot: usize, by: u64) {
        self.handles[slot]
            .get_or_init(|| metrics::counter!(self.name, self.label => self.values[slot]))
            .increment(by);
    }

    /// Every value shown at 0.
    pub(crate) fn register(&self) {
        for slot in 0..N {
            self.add(slot, 0);
        }
    }
}

/// Apps counted apart; beyond, the rest share `app="other"` (sources are configured, so this
/// only bounds a misconfiguration).
const MOST_APPS: usize = 256;

/// One app's admission counters.
struct AppMeters {
    admitted: Counter,
    duplicate: Counter,
}

/// One platform's apps.
type AppsOf = HashMap<Box<str>, AppMeters>;

/// Every per-event metric of one gateway.
pub(crate) struct Meters {
    drops: ByLabel<6>,
    /// The same counts, for the status page.
    drop_counts: [AtomicU64; 6],
    claims: ByLabel<5>,
    renewals: ByLabel<3>,
    ingress: OnceLock<Histogram>,
    admit: OnceLock<Histogram>,
    handler: OnceLock<Histogram>,
    lag: OnceLock<Histogram>,
    /// Ingress and handler latencies kept here too, for the status page's last hour (the
    /// exporter's histograms exist only with a recorder installed).
    pub(crate) ingress_here: Buckets,
    pub(crate) handler_here: Buckets,
    /// By platform, then app: looked up by `&str`, nothing cloned on the way.
    apps: Mutex<HashMap<Box<str>, AppsOf>>,
}

impl Default for Meters {
    fn default() -> Self {
        Self {
            drops: ByLabel::new("oncegate_drops_total", "layer", LAYERS),
            drop_counts: Default::default(),
            claims: ByLabel::new("oncegate_claims_total", "outcome", CLAIM_OUTCOMES),
            renewals: ByLabel::new("oncegate_lease_renewals_total", "outcome", RENEWALS),
            ingress: OnceLock::new(),
            admit: OnceLock::new(),
            handler: OnceLock::new(),
            lag: OnceLock::new(),
            ingress_here: Buckets::default(),
            handler_here: Buckets::default(),
            apps: Mutex::default(),
        }
    }
}

/// Counters that alerts and dashboards read, shown at 0 from the start: a series that appears
/// only with its first event cannot tell "none yet" from "not scraped".
const FROM_THE_START: [&str; 21] = [
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
    "oncegate_admitted_over_bound_total",
    "oncegate_spooled_total",
    "oncegate_unrouted_total",
    "oncegate_already_done_total",
    "oncegate_future_creation_times_total",
    "oncegate_set_aside_total",
    "oncegate_tenant_queue_full_total",
];

impl Meters {
    /// A repeat (or refused replay) caught at `layer`.
    pub(crate) fn dropped(&self, layer: Layer) {
        self.drop_counts[layer as usize].fetch_add(1, Ordering::Relaxed);
        self.drops.add(layer as usize, 1);
    }

    /// A dispatcher claim's answer.
    pub(crate) fn claim(&self, outcome: ClaimOutcome) {
        self.claims.add(outcome as usize, 1);
    }

    /// A lease renewal's answer.
    pub(crate) fn renewal(&self, outcome: Renewal) {
        let index = match outcome {
            Renewal::Renewed => 0,
            Renewal::Lost => 1,
            Renewal::Failed => 2,
        };
        self.renewals.add(index, 1);
    }

    /// Registers the counters read by alerts at 0.
    pub(crate) fn register(&self) {
        for name in FROM_THE_START {
            metrics::counter!(name).increment(0);
        }
        self.drops.register();
        self.claims.register();
        self.renewals.register();
        metrics::gauge!("oncegate_queue_depth").increment(0.0);
        for outcome in ["applied", "refused"] {
            metrics::counter!("oncegate_reloads_total", "outcome" => outcome).increment(0);
        }
        for listener in ["webhooks", "admin", "api"] {
            metrics::counter!("oncegate_connections_refused_total", "listener" => listener)
                .increment(0);
        }
    }

    /// Repeats caught so far, by layer.
    pub(crate) fn drops(&self) -> Vec<(&'static str, u64)> {
        LAYERS
            .iter()
            .zip(&self.drop_counts)
            .map(|(layer, count)| (*layer, count.load(Ordering::Relaxed)))
            .collect()
    }

    /// Counts on `platform`'s `app` the counter `pick` chooses.
    fn count_app(&self, platform: &str, app: &str, pick: impl Fn(&AppMeters) -> &Counter) {
        let mut apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(meters) = apps.get(platform).and_then(|apps| apps.get(app)) {
            pick(meters).increment(1);
            return;
        }
        let known: usize = apps.values().map(HashMap::len).sum();
        let app = if known < MOST_APPS { app } else { "other" };
        let register = |outcome: &'static str| metrics::counter!("oncegate_events_total", "platform" => platform.to_owned(), "app" => app.to_owned(), "outcome" => outcome);
        let meters = apps
            .entry(platform.into())
            .or_default()
            .entry(app.into())
            .or_insert_with(|| AppMeters {
                admitted: register("admitted"),
                duplicate: register("duplicate"),
            });
        pick(meters).increment(1);
    }

    /// An event of `platform`'s `app` admitted (new).
    pub(crate) fn admitted(&self, platform: &str, app: &str) {
        self.count_app(platform, app, |m| &m.admitted);
    }

    /// An event of `platform`'s `app` answered as a repeat, caught by key number `key_index`
    /// (0: its event id; later ones: its secondary keys).
    pub(crate) fn duplicate(&self, platform: &str, app: &str, key_index: usize) {
        self.count_app(platform, app, |m| &m.duplicate);
        self.dropped(if key_index == 0 {
            Layer::EventKey
        } else {
            Layer::MessageKey
        });
    }

    /// A callback request answered, from its first byte read.
    pub(crate) fn ingress(&self, took: Duration) {
        self.ingress_here.record(took.as_secs_f64());
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
        self.handler_here.record(took.as_secs_f64());
        self.handler
            .get_or_init(|| metrics::histogram!("oncegate_handler_seconds"))
            .record(took.as_secs_f64());
    }
}

/// Tells the claim protocol's events (`oncegate_once`) to the gateway's counters and log.
pub(crate) struct Counting {
    pub(crate) stats: Arc<crate::Stats>,
    pub(crate) meters: Arc<Meters>,
}

impl Observer for Counting {
    fn renewal(&self, lease: &Lease, renewal: Renewal) {
        self.meters.renewal(renewal);
        if renewal == Renewal::Lost {
            let stats = &self.stats;
            stats.bump(&stats.leases_lost, "oncegate_leases_lost_total");
            tracing::warn!(key = %lease.key, "lease lost while its work runs");
        }
    }

    fn fenced(&self, _: &Lease) {
        let stats = &self.stats;
        stats.bump(&stats.fenced, "oncegate_fenced_total");
    }

    fn abandoned(&self, lease: &Lease) {
        tracing::debug!(key = %lease.key, "a held key was dropped unsettled: released");
    }
}
