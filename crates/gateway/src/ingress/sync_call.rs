//! Synchronous calls (Feishu card buttons, WeCom and WeChat passive replies): answered within
//! the platform's deadline with the handler's result, and a repeat gets the stored result
//! instead of a second call — a repeat that comes while the first is answered waits for it.

use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{
    Admit, Deliver, KeyHash, Rate, Refusal, RefusalKind, Replied, Sent, Store, Updates,
};
use oncegate_once::{Claimed, OnceKey, Panicked};

use crate::Shared;
use crate::sink::{Outgoing, SinkError};

/// Marks a stored outcome as a permanent failure, not an answer: a leading NUL byte, which no
/// JSON, XML or text answer of a handler starts with.
const FAILED: &[u8] = b"\0oncegate: failed: ";

/// The refusal of a call whose handler failed (`earlier`: on a call before this one).
fn failed(reason: &str, earlier: bool) -> Refusal {
    let when = if earlier {
        "failed permanently on an earlier call of this event (not called again)"
    } else {
        "failed"
    };
    Refusal::new(
        RefusalKind::Handler,
        "sync_failed",
        format!("the synchronous handler {when}: {reason}"),
    )
}

/// The refusal of a reply the conversation's budget did not let through in time.
fn over_budget(no: crate::api::budget::NoBudget) -> Refusal {
    use crate::api::budget::NoBudget;
    match no {
        NoBudget::Store(error) => Refusal::new(
            RefusalKind::Unavailable,
            "budget_unavailable",
            format!("the conversation's budget could not be read: {error}"),
        ),
        NoBudget::Later(after) => Refusal::new(
            RefusalKind::Unavailable,
            "over_budget",
            format!(
                "the conversation is over the platform's reply limit; the next reply fits in \
                 {} ms: the handler was not run",
                after.as_millis()
            ),
        ),
        #[cfg(feature = "send")]
        NoBudget::Crowded(max) => Refusal::new(
            RefusalKind::Unavailable,
            "over_budget",
            format!("{max} replies wait for budgets already: the handler was not run"),
        ),
    }
}

/// Claims the call's primary key, asks the route's sink, stores its answer and returns it,
/// all within `deadline`. A repeat waits for the first run's answer and gets it.
pub(crate) async fn call<S: Store>(
    shared: &Shared<S>,
    admit: Admit,
    deadline: Duration,
) -> Result<Option<Bytes>, Refusal> {
    let how = How {
        repeats: Repeats::Wait,
        updates: None,
        budgets: &[],
        deliver: None,
    };
    match run_call(shared, admit, deadline, how).await? {
        Replied::Answer(answer) => Ok(answer),
        Replied::Repeat => Ok(None),
    }
}

/// Runs a replying event's handler once over a long connection (an AI bot's reply): a repeat
/// starts nothing, since the answer went out over the socket once; the reply is counted in the
/// conversation's `budgets` before the handler runs; a streamed answer's pieces go to
/// `updates` as they come, and its whole answer to `deliver` before the event is settled: an
/// answer that never reached the platform leaves the event retryable.
#[cfg(feature = "long-connection")]
pub(crate) async fn reply<S: Store>(
    shared: &Shared<S>,
    admit: Admit,
    deadline: Duration,
    budgets: &[(KeyHash, Rate)],
    updates: &Updates,
    deliver: Deliver,
) -> Result<Replied, Refusal> {
    let how = How {
        repeats: Repeats::Skip,
        updates: Some(updates),
        budgets,
        deliver: Some(deliver),
    };
    run_call(shared, admit, deadline, how).await
}

/// What a repeat of a call gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repeats {
    /// The first run's answer, waited for: it goes in the repeat's own response (cards,
    /// passive replies).
    Wait,
    /// Nothing: the answer went out once, over a connection (an AI bot's reply).
    Skip,
}

/// How a call runs.
struct How<'a> {
    repeats: Repeats,
    updates: Option<&'a Updates>,
    budgets: &'a [(KeyHash, Rate)],
    /// Where the answer goes before the claim is settled (a connection's reply); without it,
    /// the answer is the call's response.
    deliver: Option<Deliver>,
}

async fn run_call<S: Store>(
    shared: &Shared<S>,
    admit: Admit,
    deadline: Duration,
    how: How<'_>,
) -> Result<Replied, Refusal> {
    let stats = &shared.stats;
    stats.bump(&stats.cards, "oncegate_cards_total");
    let owner = crate::registry::owner::of(&admit.event);
    let Some(route) = shared.route_for(&admit.event.event_type, owner) else {
        stats.bump(&stats.unrouted, "oncegate_unrouted_total");
        return Ok(Replied::Answer(None));
    };
    // The endpoint said it is gone (410): nothing goes to it until an operator resumes it.
    if let Some(gone) = route.gone() {
        return Err(failed(
            &crate::dispatch::routes::dead_letter_reason(&gone),
            false,
        ));
    }
    let key = admit.keys.primary();
    let partition = admit.event.partition(shared.store.partitions());
    let unavailable = |error: &dyn std::fmt::Display| {
        Refusal::new(RefusalKind::Unavailable, "claim_failed", error.to_string())
    };
    let started = tokio::time::Instant::now();
    let claiming = OnceKey::new(key, partition)
        .lease(deadline * 2)
        .renew_every(deadline)
        .payload(&admit.event.payload);
    let claimed = match how.repeats {
        Repeats::Wait => shared.once.claim_or_wait(claiming, deadline).await,
        Repeats::Skip => shared.once.claim(claiming).await,
    };
    let held = match claimed {
        Ok(Claimed::Run(held)) => held,
        Ok(Claimed::Done(_) | Claimed::InFlight { .. }) if how.repeats == Repeats::Skip => {
            stats.bump(&stats.duplicates, "oncegate_duplicates_total");
            return Ok(Replied::Repeat);
        }
        Ok(Claimed::Done(result)) => {
            // A permanent failure is kept like an answer, so that the platform's retries of it
            // do not call the handler again.
            return match result.as_deref().and_then(|r| r.strip_prefix(FAILED)) {
                Some(reason) => Err(failed(&String::from_utf8_lossy(reason), true)),
                None => Ok(Replied::Answer(result)),
            };
        }
        Ok(Claimed::InFlight { .. }) => {
            return Err(Refusal::new(
                RefusalKind::InFlight,
                "in_flight",
                format!(
                    "this call is still being answered; its answer did not come in {} ms",
                    deadline.as_millis()
                ),
            ));
        }
        Ok(Claimed::Conflict) => {
            return Err(Refusal::new(
                RefusalKind::Conflict,
                "key_conflict",
                "this call's key was answered before for another payload",
            ));
        }
        Err(error) => return Err(unavailable(&error)),
    };
    if !how.budgets.is_empty() {
        let until = started + deadline;
        let taken = crate::api::budget::take(
            shared,
            &admit.event.app,
            how.budgets,
            crate::api::budget::Lane::High,
            until,
        )
        .await;
        if let Err(no) = taken {
            let _ = held.release().await;
            return Err(over_budget(no));
        }
    }
    let id = key.delivery_id();
    let outgoing = Outgoing {
        id: id.as_str(),
        event: &admit.event,
        attempt: 0,
        wants_answer: true,
        updates: how.updates,
        traceparent: None,
        owner,
    };
    let ran = async {
        held.run(route.sink.deliver(outgoing))
            .await
            .unwrap_or_else(|Panicked| Err(SinkError::Transient("the handler panicked".into())))
    };
    // A repeat that waited for a first run which then gave up has only what is left.
    match tokio::time::timeout(deadline.saturating_sub(started.elapsed()), ran).await {
        Ok(Ok(outcome)) => {
            if let Some(deliver) = how.deliver {
                // Settled by whether the answer reached the platform (the lease renewed while
                // a connection is waited for): completed before it went out, an answer lost
                // on a dead connection would never be sent again.
                let sent = held.run(deliver(outcome.clone())).await.unwrap_or(Sent::No);
                if sent == Sent::No {
                    let _ = held.release().await;
                    return Err(Refusal::new(
                        RefusalKind::Unavailable,
                        "reply_not_sent",
                        "the answer did not reach the platform; the event stays retryable",
                    ));
                }
            }
            // No answer stays no answer: each platform says what that is (Feishu `{}`, WeCom
            // the empty 200, WeChat `success`), for the first call and its repeats alike.
            let _ = held.complete(outcome.clone()).await;
            stats.bump(&stats.delivered, "oncegate_delivered_total");
            Ok(Replied::Answer(outcome))
        }
        Ok(Err(error @ (SinkError::Permanent(_) | SinkError::Gone(_)))) => {
            // Kept as this event's answer, so that the platform's retries do not call the
            // handler again; a 410 stops the route too, as the dispatcher does.
            let reason = match error {
                SinkError::Gone(reason) => {
                    crate::dispatch::routes::mark_gone(shared, &route, &reason);
                    reason
                }
                SinkError::Permanent(reason) => reason,
                other => other.to_string(),
            };
            let mut kept = FAILED.to_vec();
            kept.extend_from_slice(reason.as_bytes());
            let _ = held.complete(Some(Bytes::from(kept))).await;
            Err(failed(&reason, false))
        }
        Ok(Err(error)) => {
            let _ = held.release().await;
            Err(failed(&error.to_string(), false))
        }
        Err(_) => {
            let _ = held.release().await;
            Err(Refusal::new(
                RefusalKind::HandlerTimeout,
                "sync_timeout",
                format!(
                    "the synchronous handler did not answer within {} ms",
                    deadline.as_millis()
                ),
            ))
        }
    }
}
