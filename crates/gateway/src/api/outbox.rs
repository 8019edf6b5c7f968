//! Sending once, for `/send` and for Rust callers alike: the caller's key claims through the
//! claim protocol (a repeat gets the stored answer, one that comes while the first is in flight
//! waits for it, another message under the same key is a conflict); the send waits for the
//! receiver's and the app's rate budgets (shared by every gateway of a shared store) and
//! carries the platform's own key derived from the caller's, so that even a retry after an
//! unknown outcome sends once.

use std::time::Duration;

use oncegate_core::{KeyHash, Rate, Store, key_for};
use oncegate_once::{Claimed, OnceKey};
use oncegate_send::{Api, Limit, SendError, platform_key};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::Shared;
use crate::api::budget::{Lane, NoBudget};
use crate::api::pace::TooLate;

/// The longest key a send may name.
const KEY_LIMIT: usize = 255;

/// A configured app that can send.
pub(crate) struct Sender {
    pub(crate) api: Api,
    /// What its rate buckets are named by: the app (and corp) it is.
    pub(crate) scope: String,
    /// The budgets it shares with the other tenants of its source, around its own (a WeCom
    /// suite's, all its corps' calls from one egress address), each with its name.
    pub(crate) shared: Vec<(String, KeyHash, Rate)>,
}

impl Sender {
    /// The sender of an app's API, its budgets named by the app (`Api::scope`); `None` for an
    /// AI bot, whose budgets are named by its bot where its connection is configured.
    pub(crate) fn of(api: Api) -> Option<Self> {
        let scope = api.scope()?;
        Some(Self {
            api,
            scope,
            shared: Vec::new(),
        })
    }
}

/// One send, as a caller asks for it.
pub(crate) struct Sending<'a> {
    /// The source that sends (`/send/<source>`).
    pub(crate) source: &'a str,
    /// The tenant it sends as, for a source that serves many (`/send/<source>/<tenant>`).
    pub(crate) tenant: Option<&'a str>,
    /// Whose keys: callers of one namespace share them.
    pub(crate) namespace: &'a str,
    /// The caller's idempotency key.
    pub(crate) key: &'a str,
    /// The platform's send, as `/send` takes it.
    pub(crate) request: Value,
    /// How long the send may wait for budgets, the platform's limits and a first run.
    pub(crate) wait: Option<Duration>,
    /// Its lane; `None`: replies (a `reply_to`) high, the rest bulk.
    pub(crate) lane: Option<Lane>,
}

/// The platform's answer to a send, this time or the first time.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    /// 200 when the platform took it, 422 when it refused it for good.
    pub status: u16,
    /// What the platform answered (or `{"superseded": true, …}` for an edit a later one
    /// replaced before it went out).
    pub body: Value,
    /// Whether this is the first send's stored answer (a repeat of the key).
    pub replayed: bool,
}

/// Why nothing was sent. Every case but `Conflict` and `BadRequest` may be retried with the
/// same key: it sends at most once.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotSent {
    /// No source of that name can send.
    #[error(
        "no such source that can send: a Feishu or Lark [[source]] with app_secret, a WeCom one with secret and agent_id, a WeCom suite with suite_secret, or a WeCom AI bot"
    )]
    NoSuchSource,
    /// The source serves no such tenant (or cannot send as it).
    #[error("{0}")]
    NoSuchTenant(String),
    /// The request is not a send of this platform.
    #[error("{0}")]
    BadRequest(String),
    /// A send with this key is still in flight.
    #[error("a send with this key is still in flight; retry with the same key")]
    InFlight,
    /// The key was used for another message.
    #[error("this key was used for another message")]
    Conflict,
    /// Over a rate budget (or the platform's limit) for longer than the send may wait.
    #[error("{reason}; retry after {after:?}")]
    Later {
        /// When to retry.
        after: Duration,
        /// Which budget.
        reason: String,
    },
    /// As many sends wait for budgets as `api.max_waiting_sends` allows.
    #[error(
        "{0} sends already wait for their rate budgets (api.max_waiting_sends): nothing was sent, retry later"
    )]
    Crowded(usize),
    /// This gateway cannot send it now (an AI bot's socket is held elsewhere).
    #[error("{reason}; retry with the same key")]
    NotHere {
        /// When to retry.
        after: Duration,
        /// Why.
        reason: String,
    },
    /// The platform may or may not have it: a retry with the same key sends it at most once.
    #[error("{0}")]
    Unknown(String),
    /// The platform failed for now.
    #[error("{0}")]
    Transient(String),
    /// The store cannot answer; nothing was sent.
    #[error("the store cannot answer: {0}; nothing was sent, retry")]
    Store(String),
}

fn count(source: &str, outcome: &'static str) {
    metrics::counter!("oncegate_sends_total", "source" => source.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// A stored answer: the status and body every repeat gets.
fn stored(status: u16, body: &Value) -> bytes::Bytes {
    bytes::Bytes::from(json!({"status": status, "body": body}).to_string())
}

fn replayed(result: Option<bytes::Bytes>) -> Sent {
    let doc: Value = result
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null);
    let status = doc["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(200);
    Sent {
        status,
        body: doc["body"].clone(),
        replayed: true,
    }
}

/// The sender of `tenant` of a source that serves many (a WeCom suite's corp); `None` for a
/// source of one tenant, which names none.
async fn tenant_sender<S: Store>(
    shared: &Shared<S>,
    source: &str,
    tenant: Option<&str>,
) -> Result<Option<std::sync::Arc<Sender>>, NotSent> {
    let serves_many = shared.ingress.sources.load().serves_many(source);
    let Some(tenant) = tenant else {
        if serves_many {
            return Err(NotSent::BadRequest(format!(
                "source {source:?} serves many tenants: name the one to send as                  (/send/{source}/<tenant>, or the Oncegate-Tenant header)"
            )));
        }
        return Ok(None);
    };
    if !serves_many {
        return Err(NotSent::BadRequest(format!(
            "source {source:?} serves one tenant: send to /send/{source} without one"
        )));
    }
    // The registry itself, not this gateway's copy of it (read again every 250 ms): a tenant
    // that left another gateway a moment ago is refused here at once, and nothing is sent.
    let kept = shared
        .store
        .state_get(&crate::ingress::tenants::namespace(source), tenant)
        .await
        .map_err(|error| {
            NotSent::Transient(format!("the tenant registry cannot answer: {error}"))
        })?;
    match kept {
        None => {
            return Err(NotSent::NoSuchTenant(format!(
                "source {source:?} has no tenant {tenant:?} (oncegate tenants list {source})"
            )));
        }
        Some(kept) if !crate::ingress::tenants::enabled(&kept.value) => {
            return Err(NotSent::NoSuchTenant(format!(
                "tenant {tenant:?} of source {source:?} is disabled (oncegate tenants enable \
                 {source} <tenant>)"
            )));
        }
        Some(_) => {}
    }
    // A build without the platforms that keep tenants' credentials has no keeper to ask.
    #[cfg(any(feature = "feishu", feature = "wecom"))]
    {
        let keeper = shared.api.keepers.load().get(source).cloned();
        if let Some(keeper) = keeper {
            return match keeper.sender(tenant).await {
                Ok(sender) => Ok(Some(sender)),
                Err(SendError::Permanent { message, .. }) => Err(NotSent::NoSuchTenant(message)),
                Err(other) => Err(NotSent::Transient(other.to_string())),
            };
        }
    }
    Err(NotSent::NoSuchTenant(format!(
        "source {source:?} cannot send (a WeCom suite sends with its suite_secret, a Feishu \
         store app with its app_secret)"
    )))
}

/// Sends once.
pub(crate) async fn send<S: Store>(
    shared: &Shared<S>,
    sending: Sending<'_>,
) -> Result<Sent, NotSent> {
    let started = Instant::now();
    let Sending {
        source,
        tenant,
        namespace,
        key,
        request,
        wait,
        lane,
    } = sending;
    // UTF-8, not only ASCII: callers name sends by order numbers, user names, titles. The key
    // is hashed, never echoed into a header or a URL.
    let key = key.trim();
    if key.is_empty() || key.len() > KEY_LIMIT {
        return Err(NotSent::BadRequest(format!(
            "a send's key (Idempotency-Key) is 1 to {KEY_LIMIT} bytes, the same for every retry"
        )));
    }
    let sender: std::sync::Arc<Sender> = match tenant_sender(shared, source, tenant).await? {
        Some(sender) => sender,
        None => shared
            .api
            .senders
            .load()
            .get(source)
            .cloned()
            .ok_or(NotSent::NoSuchSource)?,
    };
    // Replies go first unless the caller says otherwise.
    let replying = request.get("reply_to").is_some_and(|to| !to.is_null());
    let lane = lane.unwrap_or(if replying { Lane::High } else { Lane::Bulk });
    let wait = wait
        .unwrap_or(Duration::from_secs(10))
        .min(shared.api.key_limits.max_wait);
    let prepared = sender
        .api
        .prepare(request, platform_key(namespace, key))
        .map_err(NotSent::BadRequest)?;
    // The payload that a reuse of the key must match: the send itself, not how long it waits.
    let payload = &prepared.payload;
    // A tenant's keys are its own: the same key for two corps is two sends.
    let scope = match tenant {
        Some(tenant) => format!("{source}\n{tenant}"),
        None => source.to_owned(),
    };
    let hash = key_for("send", namespace, &scope, key);
    let claiming = OnceKey::new(hash, hash.home(shared.store.partitions()))
        .lease(shared.api.send_timeout * 3 + wait)
        .payload(payload.to_string().as_bytes());
    let held = match shared.once.claim_or_wait(claiming, wait).await {
        Ok(Claimed::Run(held)) => held,
        Ok(Claimed::Done(result)) => {
            count(source, "repeat");
            return Ok(replayed(result));
        }
        Ok(Claimed::InFlight { .. }) => {
            count(source, "in_flight");
            return Err(NotSent::InFlight);
        }
        Ok(Claimed::Conflict) => {
            count(source, "conflict");
            return Err(NotSent::Conflict);
        }
        Err(error) => return Err(NotSent::Store(error.to_string())),
    };
    // An edit waits for the edits of its message before it; a newer one makes it moot.
    let message_key = prepared.edit_of.as_ref().map(|id| format!("{source}/{id}"));
    let _turn = match &message_key {
        Some(message) => match shared.api.edits.turn(message).await {
            Some(turn) => Some(turn),
            None => {
                count(source, "superseded");
                let answer = json!({"superseded": true, "note": "a later edit of this message replaced this one before it was sent"});
                let _ = held.complete(Some(stored(200, &answer))).await;
                return Ok(Sent {
                    status: 200,
                    body: answer,
                    replayed: false,
                });
            }
        },
        None => None,
    };
    // Its own budgets, the narrowest first, then those it shares with the other tenants.
    let named: Vec<(String, KeyHash, Rate)> = prepared
        .budgets
        .iter()
        .map(|(name, rate)| {
            let bucket = crate::api::budget::bucket(&sender.scope, name);
            (name.clone(), bucket, *rate)
        })
        .chain(sender.shared.iter().cloned())
        .collect();
    let budgets: Vec<_> = named
        .iter()
        .map(|(_, bucket, rate)| (*bucket, *rate))
        .collect();
    let deadline = started + wait;
    // Nothing sent: the key is given back at once, for the caller's retry here or elsewhere.
    let give_back = async |why: NotSent, outcome: &'static str| {
        let _ = held.release().await;
        count(source, outcome);
        why
    };
    let no_budget = async |why: NoBudget| match why {
        NoBudget::Later(pause) => {
            let reason = format!(
                "over the rate budget for {} ms more than the send may wait (wait_ms)",
                pause.as_millis()
            );
            give_back(
                NotSent::Later {
                    after: pause,
                    reason,
                },
                "rate_limited",
            )
            .await
        }
        NoBudget::Crowded(max) => give_back(NotSent::Crowded(max), "crowded").await,
        NoBudget::Store(error) => give_back(NotSent::Store(error.to_string()), "unavailable").await,
    };
    // Counted among the waiting sends from here until its first call to the platform.
    let mut waiting = match shared.api.sends_waiting.enter(shared.api.max_waiting_sends) {
        Ok(waiting) => Some(waiting),
        Err(why) => return Err(no_budget(why).await),
    };
    // A paced receiver's sends from this gateway go one at a time, replies first.
    let turn = match &prepared.pace {
        Some((name, spacing)) => {
            let receiver = crate::api::budget::bucket(&sender.scope, name);
            match shared
                .api
                .pacer
                .turn(receiver, *spacing, lane, deadline)
                .await
            {
                Ok(turn) => Some(turn),
                Err(TooLate(after)) => return Err(no_budget(NoBudget::Later(after)).await),
            }
        }
        None => None,
    };
    loop {
        if let Some(turn) = &turn
            && let Err(TooLate(after)) = turn.ready(deadline).await
        {
            return Err(no_budget(NoBudget::Later(after)).await);
        }
        // The sender's calls in flight, where the platform capped them (45033).
        let Some(in_flight) = shared.api.learned.enter(&sender.scope, deadline).await else {
            return Err(no_budget(NoBudget::Later(crate::api::adapt::CAP_STEP)).await);
        };
        // Every attempt spends the budgets, a retry after the platform's 429 too: a retry
        // outside them would crowd the receiver further.
        if let Err(why) = crate::api::budget::take(shared, source, &budgets, lane, deadline).await {
            return Err(no_budget(why).await);
        }
        drop(waiting.take());
        // Every call counts against a tenant's quota, whatever it answers.
        metrics::counter!("oncegate_send_api_calls_total", "source" => source.to_owned())
            .increment(1);
        let sent = sender.api.send(&prepared).await;
        if let Some(turn) = &turn {
            turn.answered();
        }
        if let Err(error @ SendError::RetryAfter { limit, after, .. }) = &sent {
            let pause = (*after, error.longer_pause());
            learn(shared, source, &sender, &named, *limit, pause).await;
        }
        drop(in_flight);
        let (status, answer) = match sent {
            Ok(answer) => (200, answer),
            // The platform's own limit: back off as it says, within the send's wait.
            Err(SendError::RetryAfter { after, limit, .. })
                if Instant::now() + after <= deadline =>
            {
                metrics::counter!("oncegate_send_rate_waits_total", "source" => source.to_owned())
                    .increment(1);
                // Calls refused together for too many in flight would all come back together
                // and be refused together again: each waits between half and one and a half
                // of the pause. (A rate's pause is held in the store: that one is exact.)
                let pause = match limit {
                    Limit::Concurrency => after.mul_f64(0.5 + fastrand::f64()),
                    Limit::Receiver | Limit::App => after,
                };
                tokio::time::sleep(pause).await;
                continue;
            }
            Err(SendError::RetryAfter { after, code, .. }) => {
                let reason = format!("the platform's rate limit (code {code})");
                return Err(give_back(NotSent::Later { after, reason }, "rate_limited").await);
            }
            Err(SendError::Permanent { code, message }) => (
                422,
                json!({"error": format!("refused by the platform: {message}"), "code": code}),
            ),
            Err(error @ SendError::Unknown(_)) if prepared.repeat_safe => {
                return Err(
                    give_back(NotSent::Unknown(error.to_string()), "unknown_outcome").await,
                );
            }
            // The platform keeps no key that would drop a second copy: the key is settled as
            // unknown, and a retry sends nothing and gets this answer.
            Err(SendError::Unknown(why)) => (
                504,
                json!({
                    "error": format!(
                        "outcome unknown: {why}; the message may be out, and this platform \
                         drops no second copy, so this key never sends it again"
                    ),
                    "outcome": "unknown",
                }),
            ),
            // This gateway cannot send it now (an AI bot's socket is held elsewhere or being
            // dialled): within the send's wait, try again; then "not here", nothing sent, the
            // key free for a retry here or on the gateway that can.
            Err(SendError::NotHere { after, .. }) if Instant::now() + after <= deadline => {
                tokio::time::sleep(after).await;
                continue;
            }
            Err(SendError::NotHere { reason, after }) => {
                return Err(give_back(NotSent::NotHere { after, reason }, "not_here").await);
            }
            Err(error @ SendError::Transient(_)) => {
                return Err(give_back(NotSent::Transient(error.to_string()), "transient").await);
            }
        };
        // The answer is the key's from now on: a repeat gets it instead of a second send.
        if let Err(error) = held.complete(Some(stored(status, &answer))).await {
            tracing::warn!(source, "send answered but not stored: {error}");
        }
        count(
            source,
            match status {
                200 => "sent",
                504 => "unknown_outcome",
                _ => "refused",
            },
        );
        return Ok(Sent {
            status,
            body: answer,
            replayed: false,
        });
    }
}

/// What a platform's rate answer to `sender`'s call teaches: the budget it speaks of (of
/// `named`, the send's) is lowered in this gateway and held on the shared store for the pause
/// the platform named, or the sender's calls in flight are capped.
async fn learn<S: Store>(
    shared: &Shared<S>,
    source: &str,
    sender: &Sender,
    named: &[(String, KeyHash, Rate)],
    limit: Limit,
    (after, longer): (Duration, Option<Duration>),
) {
    let now = Instant::now();
    let label = match limit {
        Limit::Concurrency => {
            let cap = shared.api.learned.lower_in_flight(&sender.scope, now);
            tracing::warn!(
                source,
                scope = sender.scope,
                cap,
                "the platform answered too many calls in flight: capped"
            );
            "concurrency"
        }
        Limit::Receiver | Limit::App => {
            let spoken = match limit {
                Limit::App => named.iter().find(|(name, ..)| name == oncegate_send::APP),
                _ => None,
            };
            let Some((name, bucket, rate)) = spoken.or(named.first()) else {
                return;
            };
            let label = format!("{} {name}", sender.scope);
            let learned = &shared.api.learned;
            let (factor, held) = learned.lower(bucket, &label, now, (after, longer));
            // Within a pause held already, the hold stands (a burst's answers are one).
            let after = held.unwrap_or(after);
            if held.is_some() {
                let hold = oncegate_core::RateAdjust::Hold(*rate, after);
                if let Err(error) = shared.store.adjust_rate(bucket, hold).await {
                    tracing::warn!(source, "a platform's block not kept on the store: {error}");
                }
            }
            tracing::warn!(
                source,
                budget = label,
                factor,
                pause_ms = after.as_millis() as u64,
                "the platform answered over its rate: lowered and held"
            );
            if limit == Limit::App {
                "app"
            } else {
                "receiver"
            }
        }
    };
    metrics::counter!("oncegate_send_budget_lowered_total", "source" => source.to_owned(), "limit" => label)
        .increment(1);
}
