//! `GET /admin/tenants`: the busiest tenants, as the queue view last sampled them (every
//! second; a poll costs the store nothing), each with its events queued, its handlers running
//! in this gateway, and the requests its queue bound refused here. The same tenants are in
//! `/metrics`, at most [`METRIC_TENANTS`] of them: a series per tenant only while it is among
//! the busiest, so that the label set stays bounded however many tenants come and go.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use oncegate_core::Store;
use serde_json::json;

use crate::Shared;
use crate::admin::auth::authorized;
use crate::admin::queue_view::lock_sampled;

/// `GET /admin/tenants`: `tenants` (the busiest first: `tenant`, `group`, `queued`,
/// `in_flight`, `refused`), `sampled_ms_ago`, and `counted` (false when the store cannot count
/// a tenant's events).
pub(crate) async fn list<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    let Some((rows, at)) = busiest(&shared, usize::MAX) else {
        return Json(json!({"counted": false, "tenants": [], "sampled_ms_ago": null}))
            .into_response();
    };
    let tenants: Vec<_> = rows
        .iter()
        .map(|row| {
            json!({
                "tenant": row.name,
                "group": format!("{:016x}", row.group),
                "queued": row.queued,
                "in_flight": row.in_flight,
                "refused": row.refused,
            })
        })
        .collect();
    Json(json!({
        "counted": true,
        "tenants": tenants,
        "sampled_ms_ago": u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX),
    }))
    .into_response()
}

/// One of the busiest tenants as the view and the metrics show it.
struct Row {
    group: u64,
    /// Its name as this gateway saw it (`platform app tenant`), if it did.
    name: Option<Arc<str>>,
    queued: u64,
    /// Its handlers running in this gateway (`None` before the dispatcher runs).
    in_flight: Option<u32>,
    /// Its requests the queue bound refused here.
    refused: u64,
}

/// The `max` busiest tenants as last sampled, and when; `None` before the first sample.
fn busiest<S>(shared: &Shared<S>, max: usize) -> Option<(Vec<Row>, std::time::Instant)> {
    let (busiest, at) = lock_sampled(shared).tenants.clone()?;
    let loads = shared.admin.loads.get();
    let rows = busiest
        .iter()
        .take(max)
        .map(|&(group, queued)| {
            let seen = shared.admin.tenants.get(group);
            Row {
                group,
                name: seen.as_ref().map(|seen| seen.name.clone()),
                queued,
                // A tenant at its cap reads as no load (nothing more for it): it runs the cap.
                in_flight: loads
                    .map(|loads| loads.load(group).or_else(|| loads.cap()).unwrap_or(0)),
                refused: seen.map_or(0, |seen| seen.refused),
            }
        })
        .collect();
    Some((rows, at))
}

/// One per-tenant gauge: its name, its help and its value for a row.
type Gauge = (&'static str, &'static str, fn(&Row) -> u64);

/// The busiest tenants `/metrics` names, at most.
pub(crate) const METRIC_TENANTS: usize = 10;

/// The per-tenant gauges in Prometheus's text format: for each of the [`METRIC_TENANTS`]
/// busiest tenants last sampled, its events queued, its handlers running here and the
/// requests its queue bound refused here; nothing before the first sample.
pub(crate) fn exposition<S>(shared: &Shared<S>) -> String {
    use std::fmt::Write;
    let Some((rows, _)) = busiest(shared, METRIC_TENANTS) else {
        return String::new();
    };
    let names: Vec<String> = rows
        .iter()
        .map(|row| {
            row.name
                .as_deref()
                .map_or_else(|| format!("{:016x}", row.group), label)
        })
        .collect();
    let mut out = String::new();
    let metrics: [Gauge; 3] = [
        (
            "oncegate_tenant_queued",
            "Events queued of each of the busiest tenants.",
            |row| row.queued,
        ),
        (
            "oncegate_tenant_in_flight",
            "Handlers running here for each of the busiest tenants.",
            |row| u64::from(row.in_flight.unwrap_or(0)),
        ),
        (
            "oncegate_tenant_refused",
            "Requests of each of the busiest tenants its queue bound refused here.",
            |row| row.refused,
        ),
    ];
    for (metric, help, value) in metrics {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for (row, tenant) in rows.iter().zip(&names) {
            let _ = writeln!(out, "{metric}{{tenant=\"{tenant}\"}} {}", value(row));
        }
    }
    out
}

/// A tenant's name as a Prometheus label value: escaped, and cut to 64 characters (it comes
/// from the platform).
fn label(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars().take(64) {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn a_tenants_name_is_a_safe_label_value() {
        assert_eq!(label("ww1234"), "ww1234");
        assert_eq!(label("a\"b\\c\nd\re"), "a\\\"b\\\\c\\nde");
        assert_eq!(label(&"x".repeat(100)).len(), 64);
    }
}
