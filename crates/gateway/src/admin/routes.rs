//! `/admin/routes`: each route's events and whether its endpoint is gone; resuming one.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use oncegate_core::{RefusalKind, Store};
use serde_json::json;

use crate::Shared;
use crate::admin::auth::authorized;
use crate::refusal::refused;

/// `GET /admin/routes`: each route's events, kind and state.
pub(crate) async fn list<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    let routes: Vec<_> = shared
        .routes
        .load()
        .list
        .iter()
        .enumerate()
        .map(|(index, route)| {
            let gone = route
                .gone()
                .map(|gone| json!({"since_ms": gone.since_ms, "reason": gone.reason}));
            json!({
                "index": index,
                "events": route.patterns,
                "reply": route.reply,
                "priority": route.priority,
                "gone": gone,
                "public_key": route.sink.public_key(),
            })
        })
        .collect();
    axum::Json(json!({"routes": routes})).into_response()
}

/// `POST /admin/routes/<index>/resume`: the route delivers again.
pub(crate) async fn resume<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    Path(index): Path<usize>,
) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    let routes = shared.routes.load();
    let Some(route) = routes.list.get(index) else {
        return refused(
            RefusalKind::NotFound,
            "no_route",
            format!(
                "no route {index}: the configuration has {} (GET /admin/routes lists them)",
                routes.list.len()
            ),
        );
    };
    let resumed = crate::dispatch::routes::resume(route, index);
    axum::Json(json!({"index": index, "resumed": resumed})).into_response()
}
