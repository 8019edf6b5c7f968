//! `/keys`: the claim protocol over HTTP, so that a handler in any language makes its own side
//! effects once ("create order 42"). Claim a key (acquired with a lease, in flight until, or
//! done with the stored result), renew, complete with a result, release — each fenced by the
//! lease's token. Every caller authenticates with its own token; callers of one namespace
//! share keys.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncegate_core::{FenceCheck, FencingToken, Fingerprint, KeyHash, Lease, Store, key_for};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Shared;
use crate::api::callers::{Caller, caller, count};
use crate::refusal::Refused;
use oncegate_core::RefusalKind;
use oncegate_once::{Claimed, OnceKey};

/// The largest key, in bytes.
const KEY_LIMIT: usize = 512;
/// The largest stored result, in bytes.
const RESULT_LIMIT: usize = 64 * 1024;
/// A claim's lease when the caller names none.
const DEFAULT_LEASE: Duration = Duration::from_secs(60);

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// The request's fields, or a 400 that says which is wrong.
fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Refused> {
    serde_json::from_slice(body).map_err(|error| {
        Refused::new(
            RefusalKind::BadInput,
            "bad_request",
            format!("the body is not the JSON this call takes: {error}"),
        )
    })
}

/// A key within its bounds.
fn check_key(key: &str) -> Result<(), Refused> {
    if key.is_empty() || key.len() > KEY_LIMIT {
        return Err(Refused::new(
            RefusalKind::BadInput,
            "bad_request",
            format!("key must be 1 to {KEY_LIMIT} bytes"),
        ));
    }
    Ok(())
}

/// Reads a `/keys/<op>` body as the API does, without a store: what the fuzz harness drives.
/// `Ok` means every check a call makes before the store passed.
pub fn read_body(op: &str, body: &[u8]) -> Result<(), String> {
    let body = Bytes::copy_from_slice(body);
    let checked = match op {
        "claim" => parse::<ClaimRequest>(&body).and_then(|request| check_key(&request.key)),
        _ => parse::<LeaseRequest>(&body).and_then(|request| {
            check_key(&request.key)?;
            lease_token(&request.lease.text())?;
            result_bytes(request.result).map(|_| ())
        }),
    };
    checked.map_err(|Refused(refusal)| refusal.message)
}

/// The key's hash in the caller's namespace, and its partition.
fn key_of<S: Store>(
    shared: &Shared<S>,
    caller: &Caller,
    key: &str,
) -> Result<(KeyHash, u16), Refused> {
    check_key(key)?;
    let hash = key_for("api", &caller.namespace, "business_key", key);
    Ok((hash, hash.home(shared.store.partitions())))
}

fn unavailable(caller: &Caller, error: &dyn std::fmt::Display) -> Response {
    count(&caller.name, "store", "unavailable");
    Refused::new(
        RefusalKind::Unavailable,
        "unavailable",
        format!("the store cannot answer: {error}; nothing changed, retry"),
    )
    .into_response()
}

/// The lease as a caller hands it back: the string the claim answered (JavaScript numbers lose
/// its bits), or the same digits as a JSON number from a client that converted it.
#[derive(Deserialize)]
#[serde(untagged)]
enum LeaseText {
    Text(String),
    Number(u64),
}

impl LeaseText {
    fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Text(text) => text.as_str().into(),
            Self::Number(number) => number.to_string().into(),
        }
    }
}

/// The lease a caller hands back: its token (a string: JavaScript numbers lose its bits).
fn lease_of(text: &str, key: KeyHash, partition: u16) -> Result<Lease, Refused> {
    Ok(Lease {
        key,
        partition,
        token: FencingToken(lease_token(text)?),
        until_ms: 0,
    })
}

fn lease_token(text: &str) -> Result<u64, Refused> {
    text.trim().parse::<u64>().map_err(|_| {
        Refused::new(
            RefusalKind::BadInput,
            "bad_request",
            "lease must be the string a claim answered with",
        )
    })
}

/// A result as it is stored: its JSON, within the bound.
fn result_bytes(result: Option<Value>) -> Result<Option<Vec<u8>>, Refused> {
    let result = result.map(|value| value.to_string().into_bytes());
    if result.as_ref().is_some_and(|r| r.len() > RESULT_LIMIT) {
        return Err(Refused::new(
            RefusalKind::TooLarge,
            "too_large",
            format!("result larger than {RESULT_LIMIT} bytes: store a reference to it instead"),
        ));
    }
    Ok(result)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimRequest {
    key: String,
    lease_ms: Option<u64>,
    wait_ms: Option<u64>,
    /// Anything that identifies the request's payload — its body as JSON (any value), or a
    /// digest of it as a string: a later claim with another one is a conflict.
    payload: Option<Value>,
}

/// The fingerprint of a claim's payload: a string's bytes, any other JSON value's canonical
/// text (object keys sorted: serde_json's map is ordered by key), so that the same body sent
/// with its keys in another order is the same payload.
fn fingerprint_of(payload: &Value) -> Fingerprint {
    match payload {
        Value::String(text) => Fingerprint::of(text.as_bytes()),
        other => Fingerprint::of(other.to_string().as_bytes()),
    }
}

/// A lease length the caller asked for, within `[100 ms, api.max_lease]`; longer is refused
/// rather than cut without a word.
fn lease_within(asked: Option<u64>, max: Duration) -> Result<Duration, Refused> {
    let lease = asked.map_or(DEFAULT_LEASE, Duration::from_millis);
    if lease > max {
        return Err(Refused::new(
            RefusalKind::BadInput,
            "bad_request",
            format!(
                "lease_ms {} is longer than api.max_lease ({} ms): ask for less, or renew while \
                 the work runs",
                lease.as_millis(),
                max.as_millis()
            ),
        ));
    }
    Ok(lease.max(Duration::from_millis(100)))
}

pub(crate) async fn claim<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = match caller(&shared, &headers) {
        Ok(caller) => caller,
        Err(denied) => return denied.into_response(),
    };
    let request: ClaimRequest = match parse(&body) {
        Ok(request) => request,
        Err(bad) => return bad.into_response(),
    };
    let (key, partition) = match key_of(&shared, caller, &request.key) {
        Ok(key) => key,
        Err(bad) => return bad.into_response(),
    };
    let limits = shared.api.key_limits;
    let lease = match lease_within(request.lease_ms, limits.max_lease) {
        Ok(lease) => lease,
        Err(bad) => return bad.into_response(),
    };
    let wait = request
        .wait_ms
        .map_or(Duration::ZERO, Duration::from_millis)
        .min(limits.max_wait);
    let mut claiming = OnceKey::new(key, partition).lease(lease);
    if let Some(payload) = &request.payload {
        claiming = claiming.fingerprint(fingerprint_of(payload));
    }
    match shared.once.claim_or_wait(claiming, wait).await {
        Ok(Claimed::Run(held)) => {
            count(&caller.name, "claim", "acquired");
            // The caller settles it with the lease's token, in later calls.
            let lease = held.into_lease();
            answer(
                StatusCode::OK,
                json!({"state": "acquired", "lease": lease.token.0.to_string(), "until_ms": lease.until_ms}),
            )
        }
        Ok(Claimed::Done(result)) => {
            count(&caller.name, "claim", "done");
            shared
                .meters
                .dropped(crate::base::meters::Layer::BusinessKey);
            let result = result
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
                .unwrap_or(Value::Null);
            answer(StatusCode::OK, json!({"state": "done", "result": result}))
        }
        Ok(Claimed::InFlight { until_ms }) => {
            count(&caller.name, "claim", "in_flight");
            let retry_secs = until_ms
                .saturating_sub(shared.now_ms())
                .div_ceil(1000)
                .max(1);
            (
                StatusCode::CONFLICT,
                [(header::RETRY_AFTER, retry_secs.to_string())],
                axum::Json(json!({"state": "in_flight", "until_ms": until_ms})),
            )
                .into_response()
        }
        Ok(Claimed::Conflict) => {
            count(&caller.name, "claim", "conflict");
            answer(
                StatusCode::CONFLICT,
                json!({"state": "conflict", "error": "this key was claimed for another payload"}),
            )
        }
        Err(error) => unavailable(caller, &error),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseRequest {
    key: String,
    lease: LeaseText,
    lease_ms: Option<u64>,
    result: Option<Value>,
}

/// What a fenced call answers.
fn fenced(caller: &Caller, op: &'static str, check: FenceCheck, done: Value) -> Response {
    match check {
        FenceCheck::Accepted => {
            count(&caller.name, op, "accepted");
            answer(StatusCode::OK, done)
        }
        FenceCheck::Rejected => {
            count(&caller.name, op, "fenced");
            answer(
                StatusCode::CONFLICT,
                json!({"state": "fenced", "error": "this lease is not the key's current one (it ran out and was taken, or the key is settled): do not apply the side effect's result"}),
            )
        }
    }
}

/// Parses a call on a held lease: the caller, the request and the lease.
fn held<'a, S: Store>(
    shared: &'a Shared<S>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(&'a Caller, LeaseRequest, Lease), Refused> {
    let caller = caller(shared, headers)?;
    let request: LeaseRequest = parse(body)?;
    let (key, partition) = key_of(shared, caller, &request.key)?;
    let lease = lease_of(&request.lease.text(), key, partition)?;
    Ok((caller, request, lease))
}

pub(crate) async fn renew<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (caller, request, lease) = match held(&shared, &headers, &body) {
        Ok(held) => held,
        Err(bad) => return bad.into_response(),
    };
    let extend = match lease_within(request.lease_ms, shared.api.key_limits.max_lease) {
        Ok(extend) => extend,
        Err(bad) => return bad.into_response(),
    };
    match shared.once.renew_lease(&lease, extend).await {
        Ok(check) => {
            let until_ms = shared.now_ms() + oncegate_core::store::millis(extend);
            fenced(
                caller,
                "renew",
                check,
                json!({"state": "renewed", "until_ms": until_ms}),
            )
        }
        Err(error) => unavailable(caller, &error),
    }
}

pub(crate) async fn complete<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (caller, request, lease) = match held(&shared, &headers, &body) {
        Ok(held) => held,
        Err(bad) => return bad.into_response(),
    };
    let result = match result_bytes(request.result) {
        Ok(result) => result,
        Err(too_large) => return too_large.into_response(),
    };
    let size = result.as_ref().map_or(0, |r| r.len() as u64);
    let now_ms = shared.now_ms();
    if result.is_some()
        && let Err(spent) = caller.results.check(now_ms, size)
    {
        return result_budget_spent(caller, &spent);
    }
    match shared
        .once
        .complete_lease(&lease, result.map(bytes::Bytes::from))
        .await
    {
        Ok(check) => {
            if check == FenceCheck::Accepted && size > 0 {
                let until =
                    now_ms.saturating_add(oncegate_core::store::millis(shared.timing.retention));
                caller.results.keep(until, size);
            }
            fenced(caller, "complete", check, json!({"state": "done"}))
        }
        Err(error) => unavailable(caller, &error),
    }
}

/// 429 for a result beyond the caller's budget: what it keeps, its limits, when room comes
/// back, and that completing without a result goes through.
fn result_budget_spent(caller: &Caller, spent: &crate::api::results::Spent) -> Response {
    count(&caller.name, "complete", "result_budget");
    let (results, bytes) = caller.results.limits();
    let retry_secs = spent.room_in_ms.div_ceil(1000).max(1);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, retry_secs.to_string())],
        axum::Json(json!({
            "state": "result_budget_spent",
            "error": format!(
                "caller {:?} keeps {} results of {} bytes now, its budget is {results} results and {bytes} bytes (results are kept for dedup.retention): complete without a result, try again in {retry_secs} s, or raise results_max / result_bytes_max of its [[api.caller]]",
                caller.name, spent.results, spent.bytes
            ),
        })),
    )
        .into_response()
}

pub(crate) async fn release<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (caller, _, lease) = match held(&shared, &headers, &body) {
        Ok(held) => held,
        Err(bad) => return bad.into_response(),
    };
    match shared.once.release_lease(&lease).await {
        Ok(check) => fenced(caller, "release", check, json!({"state": "released"})),
        Err(error) => unavailable(caller, &error),
    }
}
