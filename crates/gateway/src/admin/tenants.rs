//! `/admin/tenants/<source>`: the tenant registry of a source that serves many (a WeCom suite's
//! corps), kept in the store and read by every gateway on it within a poll.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use oncegate_core::state::{MAX_LIST, MAX_NAME, MAX_VALUE};
use oncegate_core::{Changed, Expect, RefusalKind, Store, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Shared;
use crate::admin::auth::authorized;
use crate::ingress::tenants::namespace;
use crate::refusal::{Refused, refused};

/// The source, if it keeps a tenant registry; else the refusal to answer.
fn registry<S: Store>(shared: &Shared<S>, source: &str) -> Result<String, Refused> {
    match shared.ingress.sources.load().by_name.get(source) {
        Some(found) if found.decoder.tenants().is_some() => Ok(namespace(source)),
        Some(_) => Err(Refused::new(
            RefusalKind::BadInput,
            "no_registry",
            format!(
                "source {source:?} serves one tenant; a tenant registry belongs to a source that \
                 serves many (platform = \"wecom-suite\", a WeCom template, or a Feishu \
                 store_app)"
            ),
        )),
        None => Err(Refused::new(
            RefusalKind::NotFound,
            "no_source",
            format!("no source {source:?} in this gateway's configuration"),
        )),
    }
}

/// After a change made here, this gateway's set follows at once (the others within a poll).
async fn refresh<S: Store>(shared: &Shared<S>, source: &str, namespace: &str) {
    let Some(set) = shared
        .ingress
        .sources
        .load()
        .by_name
        .get(source)
        .and_then(|found| found.decoder.tenants())
    else {
        return;
    };
    let _ = crate::ingress::tenants::load(&*shared.store, namespace, &*set).await;
}

/// A tenant id as given: opaque and case-sensitive, so never trimmed or folded — one that
/// would need it is refused instead.
fn checked(tenant: &str) -> Result<(), Refused> {
    let bad = tenant.is_empty()
        || tenant.len() > MAX_NAME
        || tenant.trim() != tenant
        || tenant.chars().any(|c| c.is_control() || c == '/');
    if bad {
        return Err(Refused::new(
            RefusalKind::BadInput,
            "bad_tenant",
            format!(
                "a tenant id is 1 to {MAX_NAME} bytes without slashes, control characters or \
                 surrounding spaces, exactly as the platform sends it (corp ids are case-sensitive)"
            ),
        ));
    }
    Ok(())
}

/// The tenant's kept settings; a 404 or 503 answer when there are none to read.
async fn current<S: Store>(
    shared: &Shared<S>,
    namespace: &str,
    source: &str,
    tenant: &str,
) -> Result<oncegate_core::Versioned, Response> {
    match shared.store.state_get(namespace, tenant).await {
        Ok(Some(current)) => Ok(current),
        Ok(None) => Err(refused(
            RefusalKind::NotFound,
            "no_tenant",
            format!("source {source:?} has no tenant {tenant:?}"),
        )),
        Err(error) => Err(unavailable(error)),
    }
}

fn unavailable(error: StoreError) -> Response {
    let kind = match error {
        StoreError::Invalid(_) => RefusalKind::BadInput,
        _ => RefusalKind::Unavailable,
    };
    refused(kind, "store", error.to_string())
}

/// A stored value as JSON (a tenant's settings are a JSON object).
fn shown(value: &[u8]) -> Value {
    serde_json::from_slice(value)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(value).into_owned()))
}

/// Settings that are secrets (a template's corp's callback secrets, an API secret): never in
/// an answer, shown as `"redacted"`.
const SECRET_SETTINGS: [&str; 5] = [
    "token",
    "encoding_aes_key",
    "secret",
    "app_secret",
    "permanent_code",
];

/// A tenant's settings as an answer shows them: every secret among them redacted.
fn listed(value: &[u8]) -> Value {
    let mut shown = shown(value);
    if let Value::Object(settings) = &mut shown {
        for name in SECRET_SETTINGS {
            if let Some(secret) = settings.get_mut(name) {
                *secret = Value::String("redacted".into());
            }
        }
    }
    shown
}

#[derive(Deserialize)]
pub(crate) struct Page {
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /admin/tenants/<source>`: a page of its tenants in id order.
pub(crate) async fn list<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    Path(source): Path<String>,
    Query(page): Query<Page>,
) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    let namespace = match registry(&shared, &source) {
        Ok(namespace) => namespace,
        Err(refusal) => return refusal.into_response(),
    };
    let limit = page.limit.unwrap_or(100).clamp(1, MAX_LIST);
    match shared
        .store
        .state_list(&namespace, page.after.as_deref(), limit)
        .await
    {
        Ok(tenants) => {
            let next = (tenants.len() == limit)
                .then(|| tenants.last().map(|(name, _)| name.clone()))
                .flatten();
            let tenants: Vec<Value> = tenants
                .iter()
                .map(|(tenant, value)| {
                    json!({"tenant": tenant, "version": value.version, "settings": listed(&value.value)})
                })
                .collect();
            axum::Json(json!({"source": source, "tenants": tenants, "next_after": next}))
                .into_response()
        }
        Err(error) => unavailable(error),
    }
}

/// `PUT /admin/tenants/<source>/<tenant>`: adds the tenant (or replaces its settings, a JSON
/// object in the body); every gateway on the store takes its callbacks within a second.
pub(crate) async fn put<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path((source, tenant)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let namespace = match registry(&shared, &source) {
        Ok(namespace) => namespace,
        Err(refusal) => return refusal.into_response(),
    };
    if let Err(refusal) = checked(&tenant) {
        return refusal.into_response();
    }
    let set = shared
        .ingress
        .sources
        .load()
        .by_name
        .get(&source)
        .and_then(|found| found.decoder.tenants());
    let settings = if body.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"{}")
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(_)) if body.len() <= MAX_VALUE => body,
            _ => {
                return refused(
                    RefusalKind::BadInput,
                    "bad_settings",
                    format!(
                        "a tenant's settings are a JSON object of at most {MAX_VALUE} bytes (or \
                         no body)"
                    ),
                );
            }
        }
    };
    // What the source cannot serve the tenant with (a template's corp without its secrets) is
    // refused here, where whoever adds it reads why.
    if let Some(Err(why)) = set.map(|set| set.check_settings(&settings)) {
        return refused(RefusalKind::BadInput, "bad_settings", why);
    }
    match shared
        .store
        .state_put(&namespace, &tenant, settings, Expect::Any, None)
        .await
    {
        Ok(Changed::Done(version)) => {
            refresh(&shared, &source, &namespace).await;
            tracing::info!(source = %source, tenant = %tenant, version, "tenant added or updated");
            axum::Json(json!({"source": source, "tenant": tenant, "version": version}))
                .into_response()
        }
        Ok(Changed::Stale(_)) => unavailable(StoreError::Unavailable(
            "the registry changed meanwhile".into(),
        )),
        Err(error) => unavailable(error),
    }
}

/// `DELETE /admin/tenants/<source>/<tenant>`: the tenant's callbacks are refused from then on
/// (what was admitted is still delivered).
pub(crate) async fn remove<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path((source, tenant)): Path<(String, String)>,
) -> Response {
    let namespace = match registry(&shared, &source) {
        Ok(namespace) => namespace,
        Err(refusal) => return refusal.into_response(),
    };
    if let Err(refusal) = checked(&tenant) {
        return refusal.into_response();
    }
    let current = match current(&shared, &namespace, &source, &tenant).await {
        Ok(current) => current,
        Err(answer) => return answer,
    };
    match shared
        .store
        .state_remove(&namespace, &tenant, Expect::Version(current.version))
        .await
    {
        Ok(Changed::Done(version)) => {
            refresh(&shared, &source, &namespace).await;
            tracing::info!(source = %source, tenant = %tenant, version, "tenant removed");
            axum::Json(json!({"source": source, "tenant": tenant, "removed": true})).into_response()
        }
        Ok(Changed::Stale(_)) => unavailable(StoreError::Unavailable(
            "the tenant changed meanwhile: try again".into(),
        )),
        Err(error) => unavailable(error),
    }
}

/// `POST /admin/tenants/<source>/<tenant>/disable` (`disabled`: true) and `…/enable`: a disabled
/// tenant stays in the registry with its settings and credentials, but its sends are refused and
/// a suite's corp's callbacks too (503, the platform retries; a store app takes every tenant's
/// events), on every gateway within a second; enabled again, it is served as before.
pub(crate) async fn set_disabled<S: Store>(
    shared: &Shared<S>,
    source: &str,
    tenant: &str,
    disabled: bool,
) -> Response {
    let namespace = match registry(shared, source) {
        Ok(namespace) => namespace,
        Err(refusal) => return refusal.into_response(),
    };
    if let Err(refusal) = checked(tenant) {
        return refusal.into_response();
    }
    let current = match current(shared, &namespace, source, tenant).await {
        Ok(current) => current,
        Err(answer) => return answer,
    };
    let mut settings = match shown(&current.value) {
        Value::Object(settings) => settings,
        _ => serde_json::Map::new(),
    };
    if disabled {
        settings.insert("disabled".into(), Value::Bool(true));
    } else {
        settings.remove("disabled");
    }
    let value = Bytes::from(Value::Object(settings).to_string());
    match shared
        .store
        .state_put(
            &namespace,
            tenant,
            value,
            Expect::Version(current.version),
            None,
        )
        .await
    {
        Ok(Changed::Done(version)) => {
            refresh(shared, source, &namespace).await;
            tracing::info!(source = %source, tenant = %tenant, version, disabled, "tenant disabled or enabled");
            axum::Json(json!({"source": source, "tenant": tenant, "disabled": disabled}))
                .into_response()
        }
        Ok(Changed::Stale(_)) => unavailable(StoreError::Unavailable(
            "the tenant changed meanwhile: try again".into(),
        )),
        Err(error) => unavailable(error),
    }
}

/// `POST /admin/tenants/<source>/<tenant>/disable`.
pub(crate) async fn disable<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path((source, tenant)): Path<(String, String)>,
) -> Response {
    set_disabled(&shared, &source, &tenant, true).await
}

/// `POST /admin/tenants/<source>/<tenant>/enable`.
pub(crate) async fn enable<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path((source, tenant)): Path<(String, String)>,
) -> Response {
    set_disabled(&shared, &source, &tenant, false).await
}
