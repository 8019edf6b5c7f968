//! `POST /admin/reload`: the configuration file read again and its dynamic part put in force,
//! or nothing changed and why (`oncegate reload`, and SIGHUP, do the same).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use oncegate_core::{RefusalKind, Store};

use crate::Shared;
use crate::refusal::refused;
use crate::reload::ReloadRefused;

/// Reloads; answers what changed, or 400 with why nothing did (404 for a gateway with no file).
/// Authorized by the admin listener's gate, as every request that changes something.
pub(crate) async fn reload<S: Store>(State(shared): State<Arc<Shared<S>>>) -> Response {
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
