//! `GET /admin/tenants`: the busiest tenants, as the queue view last sampled them (every
//! second; a poll costs the store nothing), each with its events queued, its handlers running
//! in this gateway, and the requests its queue bound refused here.

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
