//! The queue per partition: gauges sampled from the store, and the listing operators ask for.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use metrics::Gauge;
use oncegate_core::{PartitionOwner, QueueSummary, QueuedEvent, QueuedState, Store};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::admin::auth::authorized_query;
use crate::admin::dlq::id_text;
use crate::refusal::refused;
use oncegate_core::RefusalKind;

/// How often the per-partition gauges are sampled: a few store calls per partition each time.
const SAMPLE: Duration = Duration::from_secs(5);
/// The busiest tenants sampled for `/admin/tenants` and the status page, every
/// `TENANTS_SAMPLE`.
pub(crate) const BUSIEST: usize = 20;
const TENANTS_SAMPLE: Duration = Duration::from_secs(1);
/// The most events one listing returns.
const MOST_LISTED: usize = 1000;

/// What the last sampling rounds read from the store: for the status page, which must not
/// call the store itself.
#[derive(Debug, Default)]
pub(crate) struct Sampled {
    /// Every partition's summary (empty before the first complete round).
    summaries: Vec<QueueSummary>,
    /// Who owned each partition (empty for a store of one gateway).
    owners: Vec<PartitionOwner>,
    /// The dead letters the store keeps (not only this run's); `None` before the first read.
    dead_letters: Option<u64>,
    /// The busiest tenants (group, events) and when they were read; `None` before the first
    /// read, or when the store cannot count them.
    pub(crate) tenants: Option<(Vec<(u64, u64)>, std::time::Instant)>,
}

pub(crate) fn lock_sampled<S>(shared: &Shared<S>) -> std::sync::MutexGuard<'_, Sampled> {
    shared
        .admin
        .sampled
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// One partition's gauges, registered once.
struct PartitionGauges {
    events: Gauge,
    handed_out: Gauge,
    bytes: Gauge,
    oldest_age: Gauge,
}

impl PartitionGauges {
    fn new(partition: u16) -> Self {
        let label = partition.to_string();
        Self {
            events: metrics::gauge!("oncegate_queue_events", "partition" => label.clone()),
            handed_out: metrics::gauge!("oncegate_queue_handed_out", "partition" => label.clone()),
            bytes: metrics::gauge!("oncegate_queue_bytes", "partition" => label.clone()),
            oldest_age: metrics::gauge!("oncegate_queue_oldest_age_seconds", "partition" => label),
        }
    }

    fn set(&self, summary: &QueueSummary, now_ms: u64) {
        self.events.set(summary.events as f64);
        self.handed_out.set(summary.handed_out as f64);
        self.bytes.set(summary.bytes as f64);
        self.oldest_age.set(oldest_age_seconds(summary, now_ms));
    }
}

/// How old the partition's oldest event is (0 when it is empty).
fn oldest_age_seconds(summary: &QueueSummary, now_ms: u64) -> f64 {
    summary.oldest_created_ms.map_or(0.0, |created| {
        now_ms.saturating_sub(created) as f64 / 1000.0
    })
}

/// Samples every partition's summary into its gauges and `Shared::sampled`, with the owners
/// and the dead letters kept, until `shutdown`.
/// Reads the busiest tenants for `/admin/tenants`: its cost grows with the tenants that have
/// events queued, not with the events.
async fn sample_tenants<S: Store>(shared: &Shared<S>) {
    match shared.store.busiest_groups(BUSIEST).await {
        Ok(busiest) => {
            lock_sampled(shared).tenants =
                busiest.map(|busiest| (busiest, std::time::Instant::now()));
        }
        Err(error) => shared
            .summaries
            .note("busiest_tenants_failed", None, &error.to_string()),
    }
}

pub(crate) async fn watch<S: Store>(shared: Arc<Shared<S>>, shutdown: CancellationToken) {
    let gauges: Vec<PartitionGauges> = (0..shared.store.partitions())
        .map(PartitionGauges::new)
        .collect();
    let dead_gauge = metrics::gauge!("oncegate_dead_letters_kept");
    let mut tick = tokio::time::interval(SAMPLE);
    let mut tenants_tick = tokio::time::interval(TENANTS_SAMPLE);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tenants_tick.tick() => {
                sample_tenants(&shared).await;
                continue;
            }
            _ = shutdown.cancelled() => return,
        }
        let mut summaries = Vec::with_capacity(gauges.len());
        for (partition, gauges) in (0..).zip(&gauges) {
            match shared.store.queue_summary(partition).await {
                Ok(summary) => {
                    gauges.set(&summary, shared.now_ms());
                    summaries.push(summary);
                }
                Err(error) => {
                    shared
                        .summaries
                        .note("queue_summary_failed", None, &error.to_string());
                    break;
                }
            }
        }
        if summaries.len() == gauges.len() {
            lock_sampled(&shared).summaries = summaries;
        }
        match shared.store.owners().await {
            Ok(owners) => lock_sampled(&shared).owners = owners,
            Err(error) => shared
                .summaries
                .note("owners_failed", None, &error.to_string()),
        }
        match shared.store.dead_letter_count().await {
            Ok(count) => {
                dead_gauge.set(count as f64);
                lock_sampled(&shared).dead_letters = Some(count);
            }
            Err(error) => {
                shared
                    .summaries
                    .note("dead_letter_count_failed", None, &error.to_string())
            }
        }
    }
}

/// Partitions by owner: how many this gateway owns, how many each live gateway owns (by name),
/// and how many nobody owns right now; `null` for a store of one gateway.
fn owners_json(owners: &[PartitionOwner]) -> Value {
    if owners.is_empty() {
        return Value::Null;
    }
    let mut gateways = serde_json::Map::new();
    let mut here = None;
    for owner in owners {
        if let Some(gateway) = &owner.gateway {
            let count = gateways.entry(gateway.clone()).or_insert(json!(0));
            *count = json!(count.as_u64().unwrap_or(0) + 1);
            if owner.here {
                here = Some(gateway.clone());
            }
        }
    }
    json!({
        "here": owners.iter().filter(|o| o.here).count(),
        "handing_over": owners.iter().filter(|o| o.handing_over).count(),
        "unowned": owners.iter().filter(|o| o.gateway.is_none()).count(),
        "this_gateway": here,
        "gateways": gateways,
    })
}

fn owner_json(owner: Option<&PartitionOwner>) -> Value {
    owner.map_or(Value::Null, |owner| {
        json!({
            "gateway": owner.gateway,
            "epoch": owner.epoch,
            "here": owner.here,
            "handing_over": owner.handing_over,
        })
    })
}

/// The oldest queued event's age at the last sample, in seconds (0 when nothing waits).
pub(crate) fn oldest_age_seconds_now<S: Store>(shared: &Shared<S>) -> f64 {
    let now_ms = shared.now_ms();
    lock_sampled(shared)
        .summaries
        .iter()
        .map(|s| oldest_age_seconds(s, now_ms))
        .fold(0.0, f64::max)
}

/// The last sampled summaries, for the status page: the deepest partition and the oldest event.
pub(crate) fn live_json<S: Store>(shared: &Shared<S>) -> Value {
    // Before the lock: it takes the lock itself.
    let oldest = oldest_age_seconds_now(shared);
    let sampled = lock_sampled(shared);
    let summaries = &sampled.summaries;
    json!({
        "sampled": !summaries.is_empty(),
        "events": summaries.iter().map(|s| s.events).sum::<u64>(),
        "handed_out": summaries.iter().map(|s| s.handed_out).sum::<u64>(),
        "bytes": summaries.iter().map(|s| s.bytes).sum::<u64>(),
        "deepest": summaries.iter().map(|s| s.events).max().unwrap_or(0),
        "oldest_age_seconds": oldest,
        "queued_now": shared.queued.load(Ordering::Relaxed),
        "owners": owners_json(&sampled.owners),
        "dead_letters": sampled.dead_letters,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueQuery {
    /// The partition to list; every partition's summary when absent.
    partition: Option<u16>,
    /// List from the first event whose seq is above this.
    after: Option<u64>,
    /// The most events listed.
    limit: Option<usize>,
}

const USAGE: &str = "use /admin/queue for every partition's summary, or \
                     ?partition=N[&after=<seq>][&limit=<1..1000>] for one partition's events";

fn summary_json(summary: &QueueSummary, owner: Option<&PartitionOwner>, now_ms: u64) -> Value {
    json!({
        "partition": summary.partition,
        "owner": owner_json(owner),
        "events": summary.events,
        "handed_out": summary.handed_out,
        "bytes": summary.bytes,
        "oldest_created_ms": summary.oldest_created_ms,
        "oldest_age_seconds": oldest_age_seconds(summary, now_ms),
    })
}

fn queued_json(queued: &QueuedEvent) -> Value {
    let event = &queued.event;
    let mut state = json!({"state": "waiting"});
    match queued.state {
        QueuedState::Waiting => {}
        QueuedState::Delayed { until_ms } => {
            state = json!({"state": "delayed", "until_ms": until_ms})
        }
        QueuedState::HandedOut => state = json!({"state": "handed_out"}),
    }
    json!({
        "id": id_text(queued.id),
        "seq": queued.id.seq,
        "key": queued.key.to_string(),
        "platform": &*event.platform,
        "app": &*event.app,
        "event_id": event.event_id,
        "event_type": &*event.event_type,
        "order_key": event.order_key,
        "created_at_ms": event.created_at_ms,
        "payload_bytes": event.payload.len(),
        "attempt": queued.attempt,
        "state": state,
    })
}

/// `/admin/queue`: every partition's summary, or one partition's events in queue order.
pub(crate) async fn list<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let query: QueueQuery = match authorized_query(&shared, &headers, &uri, USAGE) {
        Ok(query) => query,
        Err(refusal) => return refusal,
    };
    let partitions = shared.store.partitions();
    let now_ms = shared.now_ms();
    let unavailable = |error: oncegate_core::StoreError| {
        refused(
            RefusalKind::Unavailable,
            "unavailable",
            format!("the store cannot answer: {error}; retry"),
        )
    };
    let Some(partition) = query.partition else {
        if query.after.is_some() || query.limit.is_some() {
            return refused(RefusalKind::BadInput, "bad_request", USAGE);
        }
        let owners = match shared.store.owners().await {
            Ok(owners) => owners,
            Err(error) => return unavailable(error),
        };
        let mut all = Vec::with_capacity(usize::from(partitions));
        for partition in 0..partitions {
            let owner = owners.iter().find(|o| o.partition == partition);
            match shared.store.queue_summary(partition).await {
                Ok(summary) => all.push(summary_json(&summary, owner, now_ms)),
                Err(error) => return unavailable(error),
            }
        }
        return axum::Json(json!({"partitions": all, "owners": owners_json(&owners)}))
            .into_response();
    };
    if partition >= partitions {
        return refused(
            RefusalKind::BadInput,
            "bad_request",
            format!(
                "no partition {partition}: the store has {partitions} (0 to {})",
                partitions.saturating_sub(1)
            ),
        );
    }
    let limit = query.limit.unwrap_or(100);
    if !(1..=MOST_LISTED).contains(&limit) {
        return refused(
            RefusalKind::BadInput,
            "bad_request",
            format!("limit {limit} is out of range; {USAGE}"),
        );
    }
    let summary = match shared.store.queue_summary(partition).await {
        Ok(summary) => summary,
        Err(error) => return unavailable(error),
    };
    let owners = match shared.store.owners().await {
        Ok(owners) => owners,
        Err(error) => return unavailable(error),
    };
    let owner = owners.iter().find(|o| o.partition == partition);
    match shared
        .store
        .queued_events(partition, query.after, limit)
        .await
    {
        Ok(events) => {
            let next_after = (events.len() == limit)
                .then(|| events.last().map(|e| e.id.seq))
                .flatten();
            axum::Json(json!({
                "summary": summary_json(&summary, owner, now_ms),
                "events": events.iter().map(queued_json).collect::<Vec<_>>(),
                "next_after": next_after,
            }))
            .into_response()
        }
        Err(error) => unavailable(error),
    }
}
