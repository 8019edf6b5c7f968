//! Synchronous calls (Feishu card buttons, WeCom and WeChat passive replies): answered within
//! the platform's deadline with the handler's result, and a repeat gets the stored result
//! instead of a second call — a repeat that comes while the first is answered waits for it.

use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Admit, Fingerprint, Refusal, RefusalKind, Store};

use crate::Shared;
use crate::once::{self, Claimed};
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

/// Claims the call's primary key, asks the route's sink, stores its answer and returns it,
/// all within `deadline`.
pub(crate) async fn call<S: Store>(
    shared: &Shared<S>,
    admit: Admit,
    deadline: Duration,
) -> Result<Option<Bytes>, Refusal> {
    let stats = &shared.stats;
    stats.bump(&stats.cards, "oncegate_cards_total");
    let Some(route) = shared.route_for(&admit.event.event_type) else {
        stats.bump(&stats.unrouted, "oncegate_unrouted_total");
        return Ok(None);
    };
    let key = admit.keys.primary();
    let partition = admit.event.partition(shared.store.partitions());
    let unavailable = |error: &dyn std::fmt::Display| {
        Refusal::new(RefusalKind::Unavailable, "claim_failed", error.to_string())
    };
    let started = tokio::time::Instant::now();
    let claiming = once::Claiming {
        key: &key,
        partition,
        lease: deadline * 2,
        fingerprint: Some(Fingerprint::of(&admit.event.payload)),
    };
    let lease = match once::claim_or_wait(&shared.store, claiming, deadline).await {
        Ok(Claimed::Run(lease)) => lease,
        Ok(Claimed::Done(result)) => {
            // A permanent failure is kept like an answer, so that the platform's retries of it
            // do not call the handler again.
            return match result.as_deref().and_then(|r| r.strip_prefix(FAILED)) {
                Some(reason) => Err(failed(&String::from_utf8_lossy(reason), true)),
                None => Ok(result),
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
    let id = key.delivery_id();
    let outgoing = Outgoing {
        id: id.as_str(),
        event: &admit.event,
        attempt: 0,
        wants_answer: true,
    };
    let ran = once::run(
        shared,
        &lease,
        deadline,
        deadline * 2,
        route.sink.deliver(outgoing),
    );
    // A repeat that waited for a first run which then gave up has only what is left.
    match tokio::time::timeout(deadline.saturating_sub(started.elapsed()), ran).await {
        Ok(Ok(outcome)) => {
            // No answer stays no answer: each platform says what that is (Feishu `{}`, WeCom
            // the empty 200, WeChat `success`), for the first call and its repeats alike.
            let _ = once::complete(shared, &lease, outcome.clone()).await;
            stats.bump(&stats.delivered, "oncegate_delivered_total");
            Ok(outcome)
        }
        Ok(Err(SinkError::Permanent(reason))) => {
            let mut kept = FAILED.to_vec();
            kept.extend_from_slice(reason.as_bytes());
            let _ = once::complete(shared, &lease, Some(Bytes::from(kept))).await;
            Err(failed(&reason, false))
        }
        Ok(Err(error)) => {
            let _ = shared.store.release(&lease).await;
            Err(failed(&error.to_string(), false))
        }
        Err(_) => {
            let _ = shared.store.release(&lease).await;
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
