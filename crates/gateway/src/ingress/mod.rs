//! `/webhook/<source>`: read the callback within its bounds, let the source decode it, check
//! the replay stamp, admit, answer. Every refusal is mapped to HTTP here and nowhere else.

pub(crate) mod admission;
pub(crate) mod answers;
#[cfg(feature = "long-connection")]
pub(crate) mod longconn;
pub(crate) mod sources;
pub(crate) mod spooling;
pub(crate) mod sync_call;
pub(crate) mod tenant_bound;
pub(crate) mod tenants;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use oncegate_core::replay::ReplayVerdict;
use oncegate_core::store::millis;
use oncegate_core::{
    Callback, Decoded, Headers, Method, Nonce, Refusal, RefusalKind, Reply, Stamp, Store, key_for,
};
use serde_json::json;

use crate::base::meters::Layer;
use crate::{Shared, Source};

/// The ingress wing's state.
pub(crate) struct IngressState {
    /// The sources in force (`/webhook/<name>`): a reload swaps them whole.
    pub(crate) sources: arc_swap::ArcSwap<Sources>,
    /// The replay guard's limits, if it is on; they also bound how far ahead a creation time
    /// may be.
    pub(crate) replay: Option<crate::ReplayLimits>,
    /// Whether events' secondary keys (Feishu's message id) are deduplicated too.
    pub(crate) secondary_keys: bool,
    /// Where accepted admissions wait while the store is down, if configured.
    pub(crate) spool: Option<Arc<oncegate_spool::Spool>>,
    /// Woken when the spool gets an admission.
    pub(crate) spooled: tokio::sync::Notify,
    /// Sources whose events come over a long connection.
    #[cfg(feature = "long-connection")]
    pub(crate) long_sources: Vec<longconn::LongSource>,
    /// The largest callback body.
    pub(crate) body_limit: usize,
    /// Each tenant's sampled queue depth, for `dispatcher.max_queued_per_tenant`.
    pub(crate) tenant_depths: tenant_bound::TenantDepths,
}

/// The sources in force, by name.
#[derive(Default)]
pub(crate) struct Sources {
    pub(crate) by_name: std::collections::HashMap<String, Arc<Source>>,
    /// The sources that serve many tenants (a registry each), by name.
    pub(crate) multi_tenant: Vec<String>,
}

impl Sources {
    /// The sources `by_name`.
    pub(crate) fn of(by_name: std::collections::HashMap<String, Arc<Source>>) -> Self {
        let mut multi_tenant: Vec<String> = by_name
            .iter()
            .filter(|(_, source)| source.decoder.tenants().is_some())
            .map(|(name, _)| name.clone())
            .collect();
        multi_tenant.sort();
        Self {
            by_name,
            multi_tenant,
        }
    }

    /// Whether `name` serves many tenants.
    #[cfg(feature = "send")]
    pub(crate) fn serves_many(&self, name: &str) -> bool {
        self.multi_tenant.iter().any(|n| n == name)
    }
}

pub(crate) fn router<S: Store>(shared: Arc<Shared<S>>) -> Router {
    Router::new()
        .route("/webhook/{source}", any(webhook::<S>))
        .route("/webhook/{source}/{tenant}", any(tenant_webhook::<S>))
        .fallback(not_found)
        .with_state(shared)
}

/// A source's own answer (a challenge, a passive reply).
fn reply(reply: Reply) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type(reply.content_type)),
            // An echoed string (a URL verification's echostr) is never read as anything else.
            (
                header::X_CONTENT_TYPE_OPTIONS,
                header::HeaderValue::from_static("nosniff"),
            ),
        ],
        reply.body,
    )
        .into_response()
}

/// A source's content type as a header, borrowed rather than copied on every answer; one that
/// is no header value (a source's mistake) becomes `application/octet-stream`, not a panic.
fn content_type(text: &'static str) -> header::HeaderValue {
    if text
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        header::HeaderValue::from_static(text)
    } else {
        header::HeaderValue::from_static("application/octet-stream")
    }
}

/// The request headers as a source reads them.
struct HttpHeaders<'a>(&'a HeaderMap);

impl Headers for HttpHeaders<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn webhook<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    receive(shared, name, None, request).await
}

/// `/webhook/<source>/<tenant>`: a callback to a source that serves many tenants, at the URL of
/// one of them (a WeCom template's corp, a suite's `$CORPID$`). Other sources have no such
/// URLs.
async fn tenant_webhook<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    Path((name, tenant)): Path<(String, String)>,
    request: Request,
) -> Response {
    receive(shared, name, Some(tenant), request).await
}

async fn receive<S: Store>(
    shared: Arc<Shared<S>>,
    name: String,
    tenant: Option<String>,
    request: Request,
) -> Response {
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let peer = crate::server::peer();
    let stats = &shared.stats;
    stats.bump(&stats.requests, "oncegate_requests_total");
    let found = shared.ingress.sources.load().by_name.get(&name).cloned();
    // A tenant's URL exists for sources that serve many: for any other it is no URL at all.
    let found = found.filter(|source| tenant.is_none() || source.decoder.tenants().is_some());
    let Some(source) = found else {
        // The configured names are not told: they are part of what an attacker looks for.
        let refusal = Refusal::new(
            RefusalKind::NotFound,
            "unknown_source",
            "no such source: check the URL against the [[source]] names of the configuration",
        );
        return crate::refusal::counted(&shared, peer, refusal);
    };
    let response = callback(
        &shared,
        (&name, &source),
        peer,
        tenant.as_deref(),
        (parts, body),
    )
    .await;
    source
        .answers
        .count(&name, source.decoder.platform(), response.status());
    shared.meters.ingress(started.elapsed());
    response
}

/// One callback to a known source, answered.
async fn callback<S: Store>(
    shared: &Arc<Shared<S>>,
    (name, source): (&str, &Source),
    peer: Option<SocketAddr>,
    tenant: Option<&str>,
    (parts, body): (axum::http::request::Parts, axum::body::Body),
) -> Response {
    let stats = &shared.stats;
    let received = shared.traces.on().then(std::time::SystemTime::now);
    let method = match parts.method {
        axum::http::Method::GET => Method::Get,
        axum::http::Method::POST => Method::Post,
        _ => {
            let refusal = Refusal::new(RefusalKind::Method, "method", "use GET or POST");
            return crate::refusal::counted(shared, peer, refusal);
        }
    };
    let body = match crate::gate::read_body(
        &parts.headers,
        body,
        shared.ingress.body_limit,
        shared.limits.body_timeout,
    )
    .await
    {
        Ok(body) => body,
        Err(refusal) => return crate::refusal::counted(shared, peer, refusal),
    };
    let callback = Callback {
        method,
        query: parts.uri.query(),
        headers: &HttpHeaders(&parts.headers),
        body: &body,
        tenant,
    };
    // What decoded the request answers it too: a reply sealed with the secret it came with.
    let (decoder, decoded) = match decode((name, source), &callback, shared.now_ms()) {
        Ok(decoded) => decoded,
        Err(refusal) => return crate::refusal::counted(shared, peer, refusal),
    };
    let (mut admit, stamp, sync) = match decoded {
        Decoded::Challenge(answer) => {
            stats.bump(&stats.challenges, "oncegate_challenges_total");
            return reply(answer);
        }
        // Only the timestamp matters: a platform repeats its verification as it likes, and
        // nothing is admitted by it.
        Decoded::SignedChallenge {
            answer,
            timestamp_secs,
        } => {
            let stamp = Stamp {
                timestamp_secs,
                nonce: String::new(),
                request: None,
            };
            if let Err(refusal) = check_replay(source, Some(stamp), shared.now_ms() / 1000)
                && refusal.kind == RefusalKind::Stale
            {
                return crate::refusal::counted(shared, peer, refusal);
            }
            stats.bump(&stats.challenges, "oncegate_challenges_total");
            return reply(answer);
        }
        // An event whose route answers it (a passive reply) is a synchronous call too.
        Decoded::Admit { admit, stamp } => {
            let routes = shared.routes.load();
            // A push that changes the source's tenancy is queued whatever its route: the
            // dispatcher applies it before any route sees it.
            let replying = routes.replying
                && decoder.tenancy(&admit.event).is_none()
                && routes
                    .route_for(
                        &admit.event.event_type,
                        crate::registry::owner::of(&admit.event),
                    )
                    .is_some_and(|route| route.reply);
            (admit, stamp, replying)
        }
        Decoded::Sync { admit, stamp } => (admit, stamp, true),
    };
    let event_type = admit.event.event_type.clone();
    let app = admit.event.app.clone();
    // The replay guard runs after the signature: unauthenticated requests never take nonce
    // memory. A nonce is remembered only once its event is admitted (or known), so a nonce can
    // never make the gateway drop an event it has not admitted.
    let now_secs = shared.now_ms() / 1000;
    // Only a synchronous reply quotes the request's stamp.
    let request = if sync { stamp.clone() } else { None };
    let stamp = match check_replay(source, stamp, now_secs) {
        Ok(stamp) => stamp,
        // A platform retrying a synchronous call by repeating it gets the stored answer: the
        // claim protocol, not the nonce, keeps it from running twice.
        Err(refusal)
            if sync
                && refusal.kind == RefusalKind::Replayed
                && decoder.retries_repeat_the_request() =>
        {
            None
        }
        Err(refusal) => return refused_by(shared, decoder, &event_type, peer, refusal),
    };
    let answered = if sync {
        crate::ingress::sync_call::call(shared, admit, decoder.sync_deadline())
            .await
            .map(|result| decoder.sync_reply_for(result, request.as_ref(), &app))
    } else {
        // The nonce goes to the store too: a store shared by several gateways refuses a
        // replay that reaches another gateway.
        admit.nonce = stamp
            .as_ref()
            .zip(shared.ingress.replay.filter(|limits| limits.shared_nonces))
            .map(|(stamp, limits)| Nonce {
                key: key_for(
                    &admit.event.platform,
                    &admit.event.app,
                    "nonce",
                    &stamp.replay_id(),
                ),
                window_ms: millis(limits.nonce_window()),
                timestamp_secs: stamp.timestamp_secs,
            });
        crate::ingress::admission::admit_traced(
            shared,
            admit,
            received,
            crate::ingress::admission::Bound::Keep,
        )
        .await
        .map(|how| decoder.accepted_as(how, &event_type))
    };
    match answered {
        Ok(answer) => {
            if let (Some(stamp), Some(guard)) = (stamp, &source.replay) {
                lock(guard).remember(&stamp.replay_id(), now_secs);
            }
            reply(answer)
        }
        Err(refusal) => refused_by(shared, decoder, &event_type, peer, refusal),
    }
}

/// A refusal of `source`'s request; a replay of a platform whose retries repeat the request
/// is answered as the duplicate it is (and still counted as a replay).
fn refused_by<S>(
    shared: &Shared<S>,
    decoder: &crate::SharedSource,
    event_type: &str,
    peer: Option<SocketAddr>,
    refusal: Refusal,
) -> Response {
    if refusal.kind == RefusalKind::Replayed && decoder.retries_repeat_the_request() {
        let stats = &shared.stats;
        stats.bump(&stats.replays_rejected, "oncegate_guard_refused_total");
        shared.meters.dropped(Layer::Nonce);
        return reply(decoder.accepted_as(oncegate_core::Accepted::Duplicate, event_type));
    }
    crate::refusal::counted(shared, peer, refusal)
}

/// Decodes `callback` with the source's decoder, or with the one a reload replaced while its
/// overlap lasts (counted by source): the decoder that took it, and what it decoded.
fn decode<'s>(
    (name, source): (&str, &'s Source),
    callback: &Callback<'_>,
    now_ms: u64,
) -> Result<(&'s crate::SharedSource, Decoded), Refusal> {
    let refusal = match source.decoder.decode(callback) {
        Ok(decoded) => return Ok((&source.decoder, decoded)),
        Err(refusal) => refusal,
    };
    let retry = matches!(
        refusal.kind,
        RefusalKind::Unauthenticated | RefusalKind::BadInput
    );
    match &source.previous {
        Some((previous, until_ms)) if retry && now_ms < *until_ms => {
            match previous.decode(callback) {
                Ok(decoded) => {
                    metrics::counter!("oncegate_previous_secret_accepted_total", "source" => name.to_owned())
                        .increment(1);
                    Ok((previous, decoded))
                }
                Err(_) => Err(refusal),
            }
        }
        _ => Err(refusal),
    }
}

async fn not_found() -> Response {
    let body = json!({ "error": "callbacks go to /webhook/<source name>" });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Says once a minute, not once a request, that the nonce memory is full.
fn warn_saturated(now_secs: u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let last = LAST.load(Ordering::Relaxed);
    if now_secs >= last + 60
        && LAST
            .compare_exchange(last, now_secs, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            "replay guard full (replay.max_nonces): nonces are not remembered for now; \
             duplicates are still dropped at admission, replays get 200 instead of 409"
        );
    }
}

/// Checks the stamp's timestamp and nonce; returns the stamp to remember after admission.
fn check_replay(
    source: &Source,
    stamp: Option<Stamp>,
    now_secs: u64,
) -> Result<Option<Stamp>, Refusal> {
    let (Some(guard), Some(stamp)) = (&source.replay, stamp) else {
        return Ok(None);
    };
    match lock(guard).check(stamp.timestamp_secs, &stamp.replay_id(), now_secs) {
        ReplayVerdict::Fresh => Ok(Some(stamp)),
        ReplayVerdict::Stale { skew_secs } => Err(Refusal::new(
            RefusalKind::Stale,
            "stale_timestamp",
            format!(
                "request timestamp is {skew_secs} s from now, outside the allowed skew (replay.max_skew)"
            ),
        )),
        ReplayVerdict::Replayed => Err(crate::ingress::admission::replayed()),
        // The nonce memory is full: let the request through unremembered rather than refuse
        // the platform. A replay of an admitted event is still a duplicate at admission; only
        // its 409 is lost. Counted, so that replay.max_nonces can be raised.
        ReplayVerdict::Saturated => {
            metrics::counter!("oncegate_replay_guard_saturated_total").increment(1);
            warn_saturated(now_secs);
            Ok(None)
        }
    }
}

/// One long connection as the admin listener shows it.
pub(crate) struct LinkView {
    pub(crate) name: String,
    /// Why it takes no events now, if it does not.
    pub(crate) not_ready: Option<String>,
    /// `leading`, `standby`, …
    pub(crate) role: &'static str,
    pub(crate) open: usize,
    pub(crate) reconnects: u64,
    /// The last frame's time, 0 before any.
    pub(crate) last_frame_ms: u64,
    pub(crate) fatal: Option<String>,
}

/// Every long connection this gateway holds or stands by for (none in a build without them).
pub(crate) fn links<S>(shared: &Shared<S>) -> Vec<LinkView> {
    #[cfg(feature = "long-connection")]
    let links = shared
        .ingress
        .long_sources
        .iter()
        .map(|source| LinkView {
            name: source.name.clone(),
            not_ready: source.not_ready(),
            role: source.role(),
            open: source.status.open(),
            reconnects: source.status.reconnects(),
            last_frame_ms: source.status.last_frame_ms(),
            fatal: source.status.fatal(),
        })
        .collect();
    #[cfg(not(feature = "long-connection"))]
    let links = {
        let _ = shared;
        Vec::new()
    };
    links
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_are_the_sources_or_a_safe_one() {
        for text in [
            "application/json",
            "text/plain; charset=utf-8",
            "application/xml",
        ] {
            assert_eq!(content_type(text), text);
        }
        assert_eq!(
            content_type("text/plain\r\nx: y"),
            "application/octet-stream"
        );
        assert_eq!(content_type("caf\u{e9}"), "application/octet-stream");
    }
}
