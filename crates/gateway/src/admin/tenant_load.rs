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
    let sampled = lock_sampled(&shared).tenants.clone();
    let Some((busiest, at)) = sampled else {
        return Json(json!({"counted": false, "tenants": [], "sampled_ms_ago": null}))
            .into_response();
    };
    let loads = shared.admin.loads.get();
    let tenants: Vec<_> = busiest
        .iter()
        .map(|(group, queued)| {
            let seen = shared.admin.tenants.get(*group);
            // A tenant at its cap reads as no load (nothing more for it): it runs the cap.
            let in_flight =
                loads.map(|loads| loads.load(*group).or_else(|| loads.cap()).unwrap_or(0));
            json!({
                "tenant": seen.as_ref().map(|seen| seen.name.as_ref()),
                "group": format!("{group:016x}"),
                "queued": queued,
                "in_flight": in_flight,
                "refused": seen.map_or(0, |seen| seen.refused),
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

/// The busiest tenants `/metrics` names, at most.
pub(crate) const METRIC_TENANTS: usize = 10;

/// The per-tenant gauges in Prometheus's text format: for each of the [`METRIC_TENANTS`]
/// busiest tenants last sampled, its events queued, its handlers running here and the
/// requests its queue bound refused here; nothing before the first sample.
pub(crate) fn exposition<S>(shared: &Shared<S>) -> String {
    use std::fmt::Write;
    let sampled = lock_sampled(shared).tenants.clone();
    let Some((busiest, _)) = sampled else {
        return String::new();
    };
    let loads = shared.admin.loads.get();
    let mut rows: [Vec<(String, u64)>; 3] = Default::default();
    for (group, queued) in busiest.iter().take(METRIC_TENANTS) {
        let seen = shared.admin.tenants.get(*group);
        let name = seen
            .as_ref()
            .map_or_else(|| format!("{group:016x}"), |seen| label(&seen.name));
        let in_flight = loads.map_or(0, |loads| {
            loads.load(*group).or_else(|| loads.cap()).unwrap_or(0)
        });
        rows[0].push((name.clone(), *queued));
        rows[1].push((name.clone(), u64::from(in_flight)));
        rows[2].push((name, seen.map_or(0, |seen| seen.refused)));
    }
    let mut out = String::new();
    for ((metric, help), rows) in [
        (
            "oncegate_tenant_queued",
            "Events queued of each of the busiest tenants.",
        ),
        (
            "oncegate_tenant_in_flight",
            "Handlers running here for each of the busiest tenants.",
        ),
        (
            "oncegate_tenant_refused",
            "Requests of each of the busiest tenants its queue bound refused here.",
        ),
    ]
    .into_iter()
    .zip(rows)
    {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} gauge");
        for (tenant, value) in rows {
            let _ = writeln!(out, "{metric}{{tenant=\"{tenant}\"}} {value}");
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
