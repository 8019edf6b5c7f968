//! `POST /admin/reload`: the configuration file read again and its dynamic part put in force,
//! or nothing changed and why (`oncegate reload`, and SIGHUP, do the same).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use oncegate_core::{RefusalKind, Store};

use crate::Shared;
use crate::admin::auth::authorized;
use crate::refusal::refused;
use crate::reload::ReloadRefused;

/// Reloads; answers what changed, or 400 with why nothing did (404 for a gateway with no file).
pub(crate) async fn reload<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    match crate::reload::reload(&shared).await {
        Ok(reloaded) => axum::Json(serde_json::json!({"reloaded": reloaded})).into_response(),
        Err(ReloadRefused::NoFile) => refused(
            RefusalKind::NotFound,
            "no_file",
            ReloadRefused::NoFile.to_string(),
        ),
        Err(refusal) => refused(
            RefusalKind::BadInput,
            "reload_refused",
            format!("{refusal}; the running configuration stays"),
        ),
    }
}
