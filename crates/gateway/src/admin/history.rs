//! The last hour at a glance: every [`STEP`] the gateway keeps one point — rates, latency
//! p99s, the queue — in memory, so that the status page draws an hour of charts from its
//! first view (`/admin/history`), with no store call and no external service.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use oncegate_core::Store;
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::admin::auth::authorized;
use crate::base::recorder::SECONDS_BUCKETS;
use crate::base::stats::StatsSnapshot;

/// How often a point is kept.
pub(crate) const STEP: Duration = Duration::from_secs(10);
/// An hour of points.
const POINTS: usize = 360;

/// One step of the gateway's life.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Point {
    /// The step's end, unix ms.
    pub(crate) at_ms: u64,
    /// Per second over the step: webhook requests, events admitted, delivered, requests
    /// refused (bad input, replays, stale timestamps), retries scheduled, dead-lettered.
    pub(crate) requests: f64,
    pub(crate) admitted: f64,
    pub(crate) delivered: f64,
    pub(crate) refused: f64,
    pub(crate) retries: f64,
    pub(crate) dead_lettered: f64,
    /// The step's 99th percentile of a webhook request's answer and of a handler's run, in
    /// milliseconds, interpolated in the metrics' buckets; `None` for a step without any.
    pub(crate) ingress_p99_ms: Option<f64>,
    pub(crate) handler_p99_ms: Option<f64>,
    /// Events queued at the step's end, and the oldest one's age (from the last queue sample).
    pub(crate) queued: u64,
    pub(crate) oldest_age_seconds: f64,
}

/// The kept points, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    points: Mutex<VecDeque<Point>>,
}

impl History {
    fn push(&self, point: Point) {
        let mut points = self.points.lock().unwrap_or_else(|p| p.into_inner());
        if points.len() == POINTS {
            points.pop_front();
        }
        points.push_back(point);
    }

    fn points(&self) -> Vec<Point> {
        let points = self.points.lock().unwrap_or_else(|p| p.into_inner());
        points.iter().copied().collect()
    }
}

type Counts = [u64; SECONDS_BUCKETS.len() + 1];

/// The `q` quantile, in milliseconds, of the samples counted between `before` and `now`:
/// linear inside the bucket it falls in, as Prometheus's `histogram_quantile` reads it (the
/// last bucket, above every bound, answers the highest bound).
fn quantile_ms(before: &Counts, now: &Counts, q: f64) -> Option<f64> {
    let counts: Vec<u64> = now
        .iter()
        .zip(before)
        .map(|(n, b)| n.saturating_sub(*b))
        .collect();
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (at, count) in counts.iter().enumerate() {
        if *count > 0 && (below + count) as f64 >= rank {
            let Some(upper) = SECONDS_BUCKETS.get(at) else {
                break;
            };
            let lower = if at == 0 {
                0.0
            } else {
                SECONDS_BUCKETS[at - 1]
            };
            let within = ((rank - below as f64) / *count as f64).clamp(0.0, 1.0);
            return Some((lower + (upper - lower) * within) * 1000.0);
        }
        below += count;
    }
    SECONDS_BUCKETS.last().map(|s| s * 1000.0)
}

/// What one step's point is made of.
struct Reading {
    at_ms: u64,
    stats: StatsSnapshot,
    ingress: Counts,
    handler: Counts,
}

fn read<S: Store>(shared: &Shared<S>) -> Reading {
    Reading {
        at_ms: shared.now_ms(),
        stats: shared.stats.snapshot(),
        ingress: shared.meters.ingress_here.counts(),
        handler: shared.meters.handler_here.counts(),
    }
}

fn point(before: &Reading, now: &Reading, queued: u64, oldest_age_seconds: f64) -> Point {
    let seconds = (now.at_ms.saturating_sub(before.at_ms) as f64 / 1000.0).max(0.001);
    let rate = |pick: fn(&StatsSnapshot) -> u64| {
        pick(&now.stats).saturating_sub(pick(&before.stats)) as f64 / seconds
    };
    Point {
        at_ms: now.at_ms,
        requests: rate(|s| s.requests),
        admitted: rate(|s| s.admitted),
        delivered: rate(|s| s.delivered),
        refused: rate(|s| s.bad_requests + s.replays_rejected + s.stale_timestamps),
        retries: rate(|s| s.retries),
        dead_lettered: rate(|s| s.dead_letters),
        ingress_p99_ms: quantile_ms(&before.ingress, &now.ingress, 0.99),
        handler_p99_ms: quantile_ms(&before.handler, &now.handler, 0.99),
        queued,
        oldest_age_seconds,
    }
}

/// Keeps a point every [`STEP`] until `shutdown`.
pub(crate) async fn watch<S: Store>(shared: Arc<Shared<S>>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(STEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut before = read(&shared);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let now = read(&shared);
        let queued = shared.queued.load(Ordering::Relaxed);
        let oldest = crate::admin::queue_view::oldest_age_seconds_now(&shared);
        shared
            .admin
            .history
            .push(point(&before, &now, queued, oldest));
        before = now;
    }
}

/// `/admin/history`: the last hour's points, oldest first.
pub(crate) async fn serve<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    axum::Json(json!({
        "step_seconds": STEP.as_secs(),
        "points": shared.admin.history.points(),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(at: &[(usize, u64)]) -> Counts {
        let mut counts = Counts::default();
        for (bucket, count) in at {
            counts[*bucket] = *count;
        }
        counts
    }

    #[test]
    fn the_p99_falls_in_the_bucket_that_holds_it() {
        // 99 samples at or below 1 ms (bucket 3), one at or below 10 ms (bucket 6).
        let now = counts(&[(3, 99), (6, 1)]);
        let p99 = quantile_ms(&Counts::default(), &now, 0.99).expect("samples");
        assert!((0.5..=1.0).contains(&p99), "{p99}");
        // One in ten slow: the p99 is among the slow ones.
        let now = counts(&[(3, 90), (6, 10)]);
        let p99 = quantile_ms(&Counts::default(), &now, 0.99).expect("samples");
        assert!((5.0..=10.0).contains(&p99), "{p99}");
        // Only the step counts: what came before is subtracted.
        let before = counts(&[(6, 50)]);
        let now = counts(&[(3, 100), (6, 50)]);
        let p99 = quantile_ms(&before, &now, 0.99).expect("samples");
        assert!(p99 <= 1.0, "{p99}");
        assert_eq!(quantile_ms(&now, &now, 0.99), None, "no samples");
        // Above every bound: the highest bound.
        let now = counts(&[(SECONDS_BUCKETS.len(), 3)]);
        assert_eq!(
            quantile_ms(&Counts::default(), &now, 0.99),
            Some(3_600_000.0)
        );
    }

    #[test]
    fn an_hour_of_points_is_kept_and_no_more() {
        let history = History::default();
        let at = |at_ms| Point {
            at_ms,
            requests: 0.0,
            admitted: 0.0,
            delivered: 0.0,
            refused: 0.0,
            retries: 0.0,
            dead_lettered: 0.0,
            ingress_p99_ms: None,
            handler_p99_ms: None,
            queued: 0,
            oldest_age_seconds: 0.0,
        };
        for i in 0..(POINTS as u64 + 5) {
            history.push(at(i));
        }
        let points = history.points();
        assert_eq!(points.len(), POINTS);
        assert_eq!(points[0].at_ms, 5, "the oldest went first");
        assert_eq!(points[POINTS - 1].at_ms, POINTS as u64 + 4);
    }
}
