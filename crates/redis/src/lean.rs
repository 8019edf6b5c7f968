//! Lean hand-outs: an event the partition's owner hands out goes with a lease that wrote
//! nothing, unless its key's record says someone else holds it, it is done, or a holder's lease
//! ran out (then a claim, as before). The lease becomes a claim of its own when it must outlive
//! the partition's ownership: a handler that runs long, a renewal, a hand-over.

use std::time::Duration;

use oncegate_core::ClaimedDelivery;

use super::dedup::ClaimCall;
use super::gather::Batch;
use super::*;

/// What a hand-out's record read decided for one event.
enum Decided {
    Answer(Result<Claim, StoreError>),
    Lean,
    Claim,
}

/// Each of `pulled` (handed out under `epoch`) with its key's claim, in one round trip for the
/// records (`MGET`: an event's key lives in its partition's slot) and, only when a holder's lease
/// ran out, one claim script.
pub(super) async fn claims<C: Clock>(
    inner: &Inner<C>,
    conn: &mut Conn,
    partition: u16,
    epoch: u64,
    pulled: Vec<Delivery>,
    lease_ms: u64,
) -> Vec<ClaimedDelivery> {
    let now = inner.clock.now_ms();
    let keys: Vec<String> = pulled
        .iter()
        .map(|delivery| inner.record_key(&delivery.key, partition))
        .collect();
    let read: Result<Vec<Value>, StoreError> = redis::cmd("MGET")
        .arg(&keys)
        .query_async(conn)
        .await
        .map_err(from_redis);
    let records = match read {
        Ok(records) if records.len() == pulled.len() => records,
        Ok(_) => return failed(pulled, StoreError::Corrupt("a short MGET reply".into())),
        // Handed out all the same: each event's claim failed.
        Err(error) => return failed(pulled, error),
    };
    let mut decided: Vec<Decided> = records.iter().map(|raw| decide(raw, now)).collect();
    let to_claim: Vec<usize> = (0..decided.len())
        .filter(|&i| matches!(decided[i], Decided::Claim))
        .collect();
    if !to_claim.is_empty() {
        let calls: Vec<ClaimCall> = to_claim
            .iter()
            .map(|&i| ClaimCall::new(pulled[i].key, lease_ms))
            .collect();
        match ClaimCall::run(inner, conn, partition, &calls).await {
            Ok(claims) => {
                for (&i, claim) in to_claim.iter().zip(claims) {
                    decided[i] = Decided::Answer(claim);
                }
            }
            Err(error) => {
                for &i in &to_claim {
                    decided[i] = Decided::Answer(Err(error.clone()));
                }
            }
        }
    }
    let token = FencingToken(LEAN | epoch);
    let at = std::time::Instant::now();
    let mut queue = inner.queues[usize::from(partition)].lock().await;
    pulled
        .into_iter()
        .zip(decided)
        .map(|(delivery, decided)| {
            let claim = match decided {
                Decided::Answer(claim) => claim,
                // Answered by the claim script above.
                Decided::Claim => Err(StoreError::Corrupt("a claim without an answer".into())),
                Decided::Lean => {
                    let lease = Lease {
                        key: delivery.key,
                        partition,
                        token,
                        until_ms: now.saturating_add(lease_ms),
                    };
                    if queue.epoch == epoch && queue.order.is_in_flight(delivery.id.seq) {
                        queue.lean.insert(
                            delivery.id.seq,
                            LeanOut {
                                lease,
                                lease_ms,
                                at,
                            },
                        );
                    }
                    Ok(Claim::Acquired(lease))
                }
            };
            (delivery, claim)
        })
        .collect()
}

/// What a key's record (as `MGET` read it) means for a hand-out at `now`: held by someone else
/// (in flight), done, a holder's lease that ran out (claimed, fencing that holder), or free.
fn decide(raw: &Value, now: u64) -> Decided {
    let record = match record_of(raw) {
        Ok(record) => record,
        Err(error) => return Decided::Answer(Err(error)),
    };
    match record.filter(|record| record.is_live(now)).map(|r| r.state) {
        None | Some(RecordState::Pending) => Decided::Lean,
        Some(RecordState::Processing { lease_until_ms, .. }) if now < lease_until_ms => {
            Decided::Answer(Ok(Claim::InFlight {
                until_ms: lease_until_ms,
            }))
        }
        Some(RecordState::Processing { .. }) => Decided::Claim,
        Some(RecordState::Completed { outcome }) => Decided::Answer(Ok(Claim::Done { outcome })),
    }
}

fn failed(pulled: Vec<Delivery>, error: StoreError) -> Vec<ClaimedDelivery> {
    pulled
        .into_iter()
        .map(|delivery| (delivery, Err(error.clone())))
        .collect()
}

impl<C: Clock> Inner<C> {
    /// Makes the partition's lean leases claims of their own: those handed out at least
    /// `older_than` ago (every one for `None`) and still out. A refused one was taken by
    /// someone else: its handler's completion will be refused too.
    pub(super) async fn claim_lean(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
        older_than: Option<Duration>,
    ) -> Result<(), StoreError> {
        let Partition { lean, order, .. } = queue;
        lean.retain(|seq, _| order.is_in_flight(*seq));
        let due: Vec<u64> = lean
            .iter()
            .filter(|(_, out)| older_than.is_none_or(|age| out.at.elapsed() >= age))
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            let Some(out) = queue.lean.get(&seq) else {
                continue;
            };
            let fence = self
                .fence_on(conn, "renew", &out.lease, out.lease_ms, None)
                .await?;
            if fence == FenceCheck::Rejected {
                tracing::warn!(
                    partition,
                    seq,
                    key = %out.lease.key,
                    "a running handler's event was claimed by another holder before its lease became a claim"
                );
            }
            queue.lean.remove(&seq);
        }
        Ok(())
    }
}
