//! `/admin/send-budgets`: the send budgets and senders the platforms' rate answers lowered in
//! this gateway, the most lowered first, as they stand now.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use oncegate_core::Store;
use serde_json::json;

use crate::Shared;
use crate::admin::auth::authorized;

/// `GET /admin/send-budgets`: `lowered` (budgets, `now` the share of their rate they have) and
/// `capped` (senders, `now` the calls in flight they may have).
pub(crate) async fn list<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    let (lowered, capped) = shared.api.learned.shown(tokio::time::Instant::now());
    Json(json!({"lowered": lowered, "capped": capped})).into_response()
}
