//! Who may call the API: each `[[api.caller]]` with its token (kept as a digest), its
//! namespace and budgets; the gate that knows the caller before a body is read.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use oncegate_core::{RefusalKind, Store};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::Shared;
use crate::refusal::Refused;

/// The largest request: a key, a lease and a result.
pub(crate) const BODY_LIMIT: usize = 256 * 1024;
/// One caller of the API, its token kept as a digest (compared in constant time, no length
/// told).
pub(crate) struct Caller {
    pub(crate) name: String,
    pub(crate) namespace: String,
    digest: [u8; 32],
    /// Sends per second this caller may make, if bounded.
    pub(crate) sends_per_second: Option<u32>,
    /// How much of its results the store may keep at once.
    pub(crate) results: crate::api::results::ResultBudget,
}

impl Caller {
    /// A caller named `name` with `token`.
    pub(crate) fn new(name: &str, namespace: &str, token: &str) -> Self {
        Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            digest: Sha256::digest(token.as_bytes()).into(),
            sends_per_second: None,
            results: crate::api::results::ResultBudget::new(
                crate::api::results::DEFAULT_RESULTS,
                crate::api::results::DEFAULT_RESULT_BYTES,
            ),
        }
    }
}

/// The API's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyLimits {
    pub(crate) max_lease: Duration,
    pub(crate) max_wait: Duration,
}

impl Default for KeyLimits {
    fn default() -> Self {
        let config = oncegate_config::ApiConfig::default();
        Self {
            max_lease: config.max_lease,
            max_wait: config.max_wait,
        }
    }
}

/// The caller the bearer token names.
pub(crate) fn caller<'a, S>(
    shared: &'a Shared<S>,
    headers: &HeaderMap,
) -> Result<&'a Caller, Refused> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| Sha256::digest(token.trim().as_bytes()));
    let found = given.and_then(|given| {
        shared
            .api
            .callers
            .iter()
            .find(|caller| bool::from(caller.digest.as_slice().ct_eq(given.as_slice())))
    });
    found.ok_or_else(|| {
        count("unknown", "auth", "refused");
        Refused::new(
            RefusalKind::Unauthenticated,
            "unauthorized",
            "send Authorization: Bearer <token> of an [[api.caller]]",
        )
    })
}

/// The API's gate: every call names an `[[api.caller]]` (401 before the body is read), and its
/// body arrives within `server.body_timeout`.
pub(crate) async fn gate<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(denied) = caller(&shared, request.headers()) {
        return denied.into_response();
    }
    crate::gate::buffered(&shared, request, next, BODY_LIMIT).await
}

/// `oncegate_keys_total{caller,op,outcome}`: callers are configured, so the labels are bounded.
pub(crate) fn count(caller: &str, op: &'static str, outcome: &'static str) {
    metrics::counter!("oncegate_keys_total", "caller" => caller.to_owned(), "op" => op, "outcome" => outcome)
        .increment(1);
}
