//! Synchronous calls (Feishu card buttons): never re-delivered, answered within the platform's
//! deadline with the handler's result, and a repeat gets the stored result instead of a second
//! call.

use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Admit, Refusal, RefusalKind, Store};

use crate::Shared;
use crate::once::{self, Claimed};
use crate::sink::Outgoing;

/// Feishu waits 3 s for a card answer; leave room for the way back.
const DEADLINE: Duration = Duration::from_millis(2_500);

/// Claims the call's primary key, asks the route's sink, stores its answer and returns it.
pub(crate) async fn call<S: Store>(
    shared: &Shared<S>,
    admit: Admit,
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
    let lease = match once::claim(&shared.store, &key, partition, DEADLINE * 2).await {
        Ok(Claimed::Run(lease)) => lease,
        Ok(Claimed::Done(result)) => return Ok(result),
        Ok(Claimed::InFlight { .. }) => {
            return Err(Refusal::new(
                RefusalKind::InFlight,
                "in_flight",
                "this card action is being answered already",
            ));
        }
        Err(error) => return Err(unavailable(&error)),
    };
    let id = format!("msg_{key}");
    let outgoing = Outgoing {
        id: &id,
        event: &admit.event,
        attempt: 0,
        wants_answer: true,
    };
    let ran = once::run(
        shared,
        &lease,
        DEADLINE,
        DEADLINE * 2,
        route.sink.deliver(outgoing),
    );
    match tokio::time::timeout(DEADLINE, ran).await {
        Ok(Ok(outcome)) => {
            let outcome = outcome.unwrap_or_else(|| Bytes::from_static(b"{}"));
            let _ = once::complete(shared, &lease, Some(outcome.clone())).await;
            stats.bump(&stats.delivered, "oncegate_delivered_total");
            Ok(Some(outcome))
        }
        Ok(Err(error)) => {
            let _ = shared.store.release(&lease).await;
            Err(Refusal::new(
                RefusalKind::Handler,
                "sync_failed",
                format!("card handler failed: {error}"),
            ))
        }
        Err(_) => {
            let _ = shared.store.release(&lease).await;
            Err(Refusal::new(
                RefusalKind::HandlerTimeout,
                "sync_timeout",
                "card handler did not answer within 2.5 s",
            ))
        }
    }
}
