//! The admin listener: health, readiness, metrics, counters, records and dead letters.

pub(crate) mod auth;
mod budgets;
pub(crate) mod dlq;
pub(crate) mod history;
pub(crate) mod queue_view;
mod reload;
mod routes;
mod tenant_load;
mod tenants;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use oncegate_core::{KeyHash, RecordState, Store};
use serde::Deserialize;
use serde_json::json;

use crate::Shared;
use crate::admin::auth::{authorized, authorized_query};

/// The admin wing's state.
#[derive(Default)]
pub(crate) struct AdminState {
    /// The bearer token of the admin listener, if set.
    pub(crate) token: Option<String>,
    /// Renders `/metrics`, when a recorder is installed.
    pub(crate) metrics_render: Option<Box<dyn Fn() -> String + Send + Sync>>,
    /// The queue as last sampled from the store (`queue_view::watch`), for the status page.
    pub(crate) sampled: std::sync::Mutex<queue_view::Sampled>,
    /// The tenants seen, for `/admin/tenants`.
    pub(crate) tenants: crate::base::tenant_names::TenantNames,
    /// Each tenant's handlers running in this gateway's dispatcher, once it runs.
    pub(crate) loads: std::sync::OnceLock<oncegate_core::Loads>,
    /// The last hour, a point every 10 s, for the status page's charts.
    pub(crate) history: history::History,
}

pub(crate) fn router<S: Store>(shared: Arc<Shared<S>>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        // The process answers: a liveness probe that never depends on the store.
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<S>))
        .route("/metrics", get(metrics::<S>))
        .route("/admin/stats", get(stats::<S>))
        .route("/admin/live", get(live::<S>))
        .route("/admin/history", get(crate::admin::history::serve::<S>))
        .route("/status", get(status_page))
        // The admin listener's front door is the status page.
        .route(
            "/",
            get(|| async { axum::response::Redirect::temporary("/status") }),
        )
        .route("/admin/openapi.json", get(openapi))
        .route("/admin/record", get(record::<S>))
        .route("/admin/queue", get(crate::admin::queue_view::list::<S>))
        .route("/admin/dead-letters", get(crate::admin::dlq::list::<S>))
        .route(
            "/admin/dead-letters/replay",
            post(crate::admin::dlq::replay::<S>),
        )
        .route(
            "/admin/dead-letters/purge",
            post(crate::admin::dlq::purge::<S>),
        )
        .route("/admin/routes", get(crate::admin::routes::list::<S>))
        .route("/admin/send-budgets", get(crate::admin::budgets::list::<S>))
        .route("/admin/reload", post(crate::admin::reload::reload::<S>))
        .route(
            "/admin/routes/{index}/resume",
            post(crate::admin::routes::resume::<S>),
        )
        .route("/admin/tenants", get(crate::admin::tenant_load::list::<S>))
        .route(
            "/admin/tenants/{source}",
            get(crate::admin::tenants::list::<S>),
        )
        .route(
            "/admin/tenants/{source}/{tenant}",
            put(crate::admin::tenants::put::<S>),
        )
        .route(
            "/admin/tenants/{source}/{tenant}",
            delete(crate::admin::tenants::remove::<S>),
        )
        .route(
            "/admin/tenants/{source}/{tenant}/disable",
            post(crate::admin::tenants::disable::<S>),
        )
        .route(
            "/admin/tenants/{source}/{tenant}/enable",
            post(crate::admin::tenants::enable::<S>),
        )
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            crate::admin::auth::gate::<S>,
        ))
        .with_state(shared)
}

/// Whether a long connection that is down takes the gateway out of its load balancer (for
/// `/readyz` and the status page alike): only when the gateway takes no webhooks — those still
/// come in, and the balancer routes nothing else.
fn long_connections_gate<S>(shared: &Shared<S>) -> bool {
    shared.ingress.sources.load().by_name.is_empty()
}

/// Every readiness check with its verdict: 200 when all pass, else 503, with what failed.
async fn readyz<S: Store>(State(shared): State<Arc<Shared<S>>>, headers: HeaderMap) -> Response {
    // Probes call /readyz without the admin token: they learn what fails, not why (a store's
    // path and OS error, Redis's settings, a platform's refusal are the token holder's).
    let privy = authorized(&shared, &headers).is_ok();
    let mut checks = Vec::new();
    let mut check = |name: String, ok: bool, detail: String| {
        let detail = if ok || privy {
            detail
        } else {
            WHY_WITH_TOKEN.to_owned()
        };
        checks.push(json!({"check": name, "ok": ok, "detail": detail}));
        ok
    };
    let mut ready = check(
        "background".into(),
        shared.failure.get().is_none(),
        shared
            .failure
            .get()
            .cloned()
            .unwrap_or_else(|| "dispatcher and background tasks running".into()),
    );
    let webhooks = !long_connections_gate(&shared);
    let mut degraded = Vec::new();
    for link in crate::ingress::links(&shared) {
        let failed = link.not_ready;
        let name = format!("long_connection {}", link.name);
        let ok = check(
            name.clone(),
            failed.is_none(),
            failed.unwrap_or_else(|| format!("{} ({} open)", link.role, link.open)),
        );
        match (ok, webhooks) {
            (true, _) => {}
            (false, true) => degraded.push(name),
            (false, false) => ready = false,
        }
    }
    degraded.extend(crate::dispatch::routes::degraded(&shared));
    let full = crate::ingress::admission::queue_full(&shared);
    ready &= check(
        "queue".into(),
        !full,
        if full {
            "the queue is full (dispatcher.max_queued)".into()
        } else {
            "taking events".into()
        },
    );
    let store = match (shared.store.ping().await, &shared.ingress.spool) {
        (Ok(()), _) => (true, "answering".to_owned()),
        // Requests are still taken (into the spool), so stay in the load balancer.
        (Err(error), Some(spool)) if spool.has_room() => (
            true,
            if privy {
                format!("spooling: store: {error}")
            } else {
                "spooling: the store does not answer".to_owned()
            },
        ),
        (Err(error), _) => (false, format!("store: {error}")),
    };
    ready &= check("store".into(), store.0, store.1);
    // What an acknowledged event survives: not ready while the promise does not hold (every
    // admission is refused then); ready but saying what can be lost when the mode allows it.
    let durability = shared.store.durability();
    ready &= durability.holds;
    checks.push(json!({
        "check": "durability",
        "ok": durability.holds,
        "mode": durability.mode,
        "detail": if privy { durability.detail.clone() } else { WHY_WITH_TOKEN.to_owned() },
        "at_risk": durability.at_risk,
    }));
    // What the configuration can lose beyond the store's promise: said, the gateway ready.
    // To probes the count only, since a finding names what is open to whom (a source taking
    // unsigned events, a broker's host).
    let risks = shared.at_risk.load_full();
    if privy {
        for risk in risks.iter() {
            checks.push(
                json!({"check": "configuration", "ok": true, "detail": "in force", "at_risk": risk}),
            );
        }
    } else if !risks.is_empty() {
        checks.push(json!({
            "check": "configuration",
            "ok": true,
            "detail": "in force",
            "at_risk": format!(
                "{} settings can lose or expose what they carry: send the admin token \
                 (oncegate status) or run oncegate check-config to see which",
                risks.len()
            ),
        }));
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({"ready": ready, "degraded": degraded, "checks": checks})),
    )
        .into_response()
}

/// What `/readyz` says instead of a detail to a caller without the admin token.
const WHY_WITH_TOKEN: &str =
    "details for the admin token's holder: send it (oncegate status), or read the gateway's log";

async fn metrics<S: Store>(State(shared): State<Arc<Shared<S>>>) -> Response {
    match &shared.admin.metrics_render {
        Some(render) => (render() + &tenant_load::exposition(&shared)).into_response(),
        None => (StatusCode::NOT_FOUND, "no metrics recorder installed").into_response(),
    }
}

/// Each long-connection source's state, for the stats and the status page.
fn long_connections<S>(shared: &Shared<S>) -> Vec<serde_json::Value> {
    crate::ingress::links(shared)
        .into_iter()
        .map(|link| {
            // The last frame as a wall-clock time and as an age; both null before any frame.
            let last = Some(link.last_frame_ms).filter(|&at| at > 0);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64);
            json!({
                "source": link.name,
                "role": link.role,
                "open": link.open,
                "reconnects": link.reconnects,
                "last_frame_ms": last,
                "last_frame_age_ms": last.map(|at| now.saturating_sub(at)),
                "fatal": link.fatal,
            })
        })
        .collect()
}

async fn stats<S: Store>(State(shared): State<Arc<Shared<S>>>, headers: HeaderMap) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    let store = shared.store.stats().await.ok();
    let long_connections = long_connections(&shared);
    axum::Json(json!({
        "gateway": shared.stats.snapshot(),
        "store": store,
        "long_connections": long_connections,
        "sources": crate::ingress::answers::sources_json(&shared),
    }))
    .into_response()
}

/// A record by its key hash, or by the platform's id (platform, app, kind, id).
/// The admin API's OpenAPI document (its routes are checked against this router in a test).
pub(crate) const OPENAPI: &str = include_str!("admin_openapi.json");

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

/// The status page: one HTML file with its script, no external assets.
async fn status_page() -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "no-store"),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (
                axum::http::header::CONTENT_SECURITY_POLICY,
                STATUS_CSP.as_str(),
            ),
        ],
        STATUS_PAGE,
    )
        .into_response()
}

const STATUS_PAGE: &str = include_str!("status.html");

/// The status page runs its own inline script and style and nothing else: each allowed by its
/// hash, every other source (a script an injected string would bring, a frame, a form post)
/// refused; it talks to its own listener only.
static STATUS_CSP: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| content_security_policy(STATUS_PAGE));

fn content_security_policy(html: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let hashes = |tag: &str| -> String {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        let mut hashes = Vec::new();
        let mut rest = html;
        while let Some(start) = rest.find(&open) {
            let body = &rest[start + open.len()..];
            let Some(end) = body.find(&close) else { break };
            let digest = sha2::Sha256::digest(&body.as_bytes()[..end]);
            hashes.push(format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            ));
            rest = &body[end..];
        }
        if hashes.is_empty() {
            "'none'".to_owned()
        } else {
            hashes.join(" ")
        }
    };
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes("script"),
        hashes("style")
    )
}

/// Failing deliveries the status page lists.
const FAILING_SHOWN: usize = 20;

/// What the status page polls every second: counters and states this gateway holds in
/// memory, without a call to the store (many open pages must cost nothing).
async fn live<S: Store>(State(shared): State<Arc<Shared<S>>>, headers: HeaderMap) -> Response {
    if let Err(denied) = authorized(&shared, &headers) {
        return denied;
    }
    let mut not_ready: Vec<String> = shared.failure.get().cloned().into_iter().collect();
    let down = crate::ingress::links(&shared)
        .into_iter()
        .filter_map(|link| link.not_ready);
    let mut degraded = Vec::new();
    match long_connections_gate(&shared) {
        true => not_ready.extend(down),
        false => degraded.extend(down),
    }
    degraded.extend(crate::dispatch::routes::degraded(&shared));
    if crate::ingress::admission::queue_full(&shared) {
        not_ready.push("the queue is full (dispatcher.max_queued)".into());
    }
    let drops: serde_json::Map<String, serde_json::Value> = shared
        .meters
        .drops()
        .into_iter()
        .map(|(layer, n)| (layer.to_owned(), json!(n)))
        .collect();
    let long_connections = long_connections(&shared);
    // What can be lost, as /readyz says it (the store's promise is read from memory).
    let at_risk: Vec<String> = shared
        .store
        .durability()
        .at_risk
        .map(|risk| format!("durability: {risk}"))
        .into_iter()
        .chain(shared.at_risk.load().iter().cloned())
        .collect();
    axum::Json(json!({
        "at_ms": shared.now_ms(),
        "ready": not_ready.is_empty(),
        "not_ready": not_ready,
        "degraded": degraded,
        "at_risk": at_risk,
        "gateway": shared.stats.snapshot(),
        "queued": shared.queued.load(std::sync::atomic::Ordering::Relaxed),
        "queue": crate::admin::queue_view::live_json(&shared),
        "drops": drops,
        "long_connections": long_connections,
        "sources": crate::ingress::answers::sources_json(&shared),
        // The deliveries that failed lately, for the status page: which, how often, why, and
        // when the next attempt is due.
        "failing": shared.attempts.latest(FAILING_SHOWN),
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordQuery {
    key: Option<String>,
    /// The platform: feishu, lark, wecom, wechat.
    platform: Option<String>,
    app: Option<String>,
    /// `event_id` (the default), `message_id`, or a business key's kind; `msg_id` with `from`.
    kind: Option<String>,
    id: Option<String>,
    /// The sender, for ids that repeat across senders (WeCom's and WeChat's `MsgId`, an AI
    /// bot's `msgid`): `kind` is then `msg_id` unless named.
    from: Option<String>,
    /// Where to look; every partition when absent.
    partition: Option<u16>,
}

impl RecordQuery {
    fn key(&self) -> Option<KeyHash> {
        match (&self.key, &self.platform, &self.app, &self.id) {
            (Some(hex), None, None, None) => KeyHash::from_hex(hex),
            (None, Some(platform), Some(app), Some(id)) => Some(match &self.from {
                Some(from) => oncegate_core::sender_key(
                    platform,
                    app,
                    self.kind.as_deref().unwrap_or("msg_id"),
                    id,
                    from,
                ),
                None => oncegate_core::key_for(
                    platform,
                    app,
                    self.kind.as_deref().unwrap_or("event_id"),
                    id,
                ),
            }),
            _ => None,
        }
    }
}

const RECORD_USAGE: &str = "use ?key=<32 hex characters>, ?platform=feishu&app=<app id>&id=<event id>[&kind=event_id], or for WeCom and WeChat messages ?platform=wecom&app=<corp id, app id or bot id>&id=<MsgId or msgid>&from=<sender>, and optionally &partition=N";

async fn record<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let query: RecordQuery = match authorized_query(&shared, &headers, &uri, RECORD_USAGE) {
        Ok(query) => query,
        Err(refusal) => return refusal,
    };
    let Some(key) = query.key() else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": RECORD_USAGE})),
        )
            .into_response();
    };
    let partitions = match query.partition {
        Some(partition) if partition < shared.store.partitions() => partition..partition + 1,
        Some(partition) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": format!(
                    "no partition {partition}: the store has {}", shared.store.partitions()
                )})),
            )
                .into_response();
        }
        None => 0..shared.store.partitions(),
    };
    let mut found = Ok(None);
    for partition in partitions {
        found = shared
            .store
            .record(&key, partition)
            .await
            .map(|record| record.map(|record| (partition, record)));
        if !matches!(found, Ok(None)) {
            break;
        }
    }
    match found {
        Ok(Some((partition, record))) => {
            let pending = matches!(record.state, RecordState::Pending);
            let state = match record.state {
                RecordState::Pending => json!({"state": "pending"}),
                RecordState::Processing {
                    token,
                    lease_until_ms,
                } => {
                    json!({"state": "processing", "token": token.0, "lease_until_ms": lease_until_ms})
                }
                RecordState::Completed { outcome } => {
                    json!({"state": "completed", "outcome_bytes": outcome.map(|o| o.len())})
                }
            };
            // Why it is not done, if it died: the dead letter keeps the reason and attempts.
            let dead_letter = match shared.store.dead_letters(crate::admin::dlq::SCAN).await {
                Ok(letters) => letters
                    .iter()
                    .find(|l| l.key == key)
                    .map(crate::admin::dlq::letter_json),
                Err(_) => None,
            };
            // This gateway's attempts of it, when it did not go through at once.
            let attempts = shared.attempts.of(&key);
            let mut found = json!({"key": key.to_string(), "partition": partition, "record": state, "expires_at_ms": record.expires_at_ms,
                       "fingerprint": record.fingerprint.map(|f| f.to_string()), "dead_letter": dead_letter,
                       "attempts": attempts});
            // A WeCom or WeChat XML message's MsgId key is its second key: it tells that the
            // message was admitted, not how far it got. Said, rather than shown as "pending".
            if query.from.is_some() && pending {
                found["note"] = json!(
                    "found by the message's id and sender: this record says it was admitted. \
                     For a WeCom or WeChat callback that is its second key, which keeps no \
                     delivery state: the delivery's Idempotency-Key (msg_<key>) names the \
                     primary record. An AI bot's msgid is its primary key: pending is its state."
                );
            }
            axum::Json(found).into_response()
        }
        Ok(None) => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": "not seen"})),
        )
            .into_response(),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": error.to_string()})),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The policy names the page's one script and one style by their hashes, and nothing else.
    #[test]
    fn the_status_pages_policy_allows_its_own_script_and_style_only() {
        use base64::Engine;
        use sha2::Digest;
        let policy = super::content_security_policy(super::STATUS_PAGE);
        let script = super::STATUS_PAGE
            .split_once("<script>")
            .and_then(|(_, rest)| rest.split_once("</script>"))
            .expect("the page's script")
            .0;
        let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(script));
        assert!(
            policy.contains(&format!("script-src 'sha256-{hash}';")),
            "{policy}"
        );
        assert!(policy.starts_with("default-src 'none';"), "{policy}");
        assert_eq!(policy.matches("'sha256-").count(), 2, "{policy}");
        assert!(!policy.contains("unsafe"), "{policy}");
        let none = super::content_security_policy("<p>no script</p>");
        assert!(none.contains("script-src 'none';"), "{none}");
    }

    /// The routes this file gives the router, as (method, path), read from its own source.
    fn routed() -> BTreeSet<(String, String)> {
        let source = include_str!("mod.rs");
        let mut routes = BTreeSet::new();
        let mut rest = source;
        while let Some(at) = rest.find(".route(") {
            rest = &rest[at + ".route(".len()..];
            let Some(path) = rest
                .trim_start()
                .strip_prefix('"')
                .and_then(|r| r.split('"').next())
            else {
                continue;
            };
            let after = &rest[rest.find(',').unwrap_or(0) + 1..];
            let method = after.trim_start().split('(').next().unwrap_or("").trim();
            if path.starts_with('/') {
                routes.insert((method.to_owned(), path.to_owned()));
            }
        }
        routes
    }

    #[test]
    fn the_openapi_document_describes_exactly_the_routes() {
        let doc: serde_json::Value = serde_json::from_str(super::OPENAPI).expect("JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        let mut documented = BTreeSet::new();
        for (path, methods) in doc["paths"].as_object().expect("paths") {
            for (method, operation) in methods.as_object().expect("methods") {
                assert!(
                    operation["summary"].as_str().is_some_and(|s| !s.is_empty()),
                    "{method} {path} has a summary"
                );
                let responses = operation["responses"].as_object().expect("responses");
                assert!(
                    responses.contains_key("200") || responses.contains_key("307"),
                    "{method} {path} says its answer"
                );
                if path.starts_with("/admin/") && path != "/admin/openapi.json" {
                    assert!(responses.contains_key("401"), "{method} {path} says 401");
                    assert!(
                        operation["security"].is_array(),
                        "{method} {path} is secured"
                    );
                }
                documented.insert((method.clone(), path.clone()));
            }
        }
        let routed = routed();
        assert!(routed.len() >= 10, "{routed:?}");
        assert_eq!(
            documented, routed,
            "the document and the router name the same routes"
        );
    }
}
