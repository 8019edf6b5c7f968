//! The state machine as pure functions over one key's record.
//!
//! Every backend applies these same functions inside its own atomic step (a lock, a write
//! transaction, a Lua script mirrors them), so the semantics are written once and tested once.
//! Each function takes the record as stored (possibly dead) and the time, and returns the answer
//! and the record to store (`None` means: leave it as it is).

use bytes::Bytes;

use crate::record::{Claim, FenceCheck, FencingToken, Lease, Record, RecordState};

/// Whether a stored record still counts as seen.
pub fn is_seen(record: Option<&Record>, now_ms: u64) -> bool {
    record.is_some_and(|r| r.is_live(now_ms))
}

/// The record `admit` writes for each key of a new event.
pub fn admitted(now_ms: u64, retention_ms: u64) -> Record {
    Record {
        state: RecordState::Pending,
        expires_at_ms: now_ms.saturating_add(retention_ms),
    }
}

/// `claim`: `token` makes the token to grant, called only if the claim succeeds.
pub fn claim(
    record: Option<&Record>,
    key: crate::KeyHash,
    partition: u16,
    now_ms: u64,
    lease_ms: u64,
    token: impl FnOnce() -> FencingToken,
) -> (Claim, Option<Record>) {
    let until_ms = now_ms.saturating_add(lease_ms);
    let grant = |expires_at_ms: u64| {
        let token = token();
        (
            Claim::Acquired(Lease {
                key,
                partition,
                token,
                until_ms,
            }),
            Some(Record {
                state: RecordState::Processing {
                    token,
                    lease_until_ms: until_ms,
                },
                expires_at_ms,
            }),
        )
    };
    match record {
        Some(live) if live.is_live(now_ms) => match &live.state {
            RecordState::Pending => grant(live.expires_at_ms),
            RecordState::Processing { lease_until_ms, .. } if now_ms < *lease_until_ms => (
                Claim::InFlight {
                    until_ms: *lease_until_ms,
                },
                None,
            ),
            // The holder's lease ran out: take over, the old token is fenced off.
            RecordState::Processing { .. } => grant(live.expires_at_ms),
            RecordState::Completed { outcome } => (
                Claim::Done {
                    outcome: outcome.clone(),
                },
                None,
            ),
        },
        // Unknown (a business key never admitted) or forgotten: the lease alone keeps it.
        _ => grant(now_ms),
    }
}

/// Whether `lease` is the holder of `record` at `now_ms`: the compare in every compare-and-set.
///
/// A matching token is accepted even after `until_ms` passed, as long as the record is live: no
/// other holder can exist while the token is still the record's, so the store, not the holder's
/// clock, decides. A record that is no longer live may be forgotten at any moment, so its token
/// counts for nothing, in every backend alike.
pub fn holds(record: Option<&Record>, lease: &Lease, now_ms: u64) -> bool {
    matches!(record, Some(current @ Record { state: RecordState::Processing { token, .. }, .. })
        if *token == lease.token && current.is_live(now_ms))
}

/// `renew`: extend the holder's lease to `now + extend`.
pub fn renew(
    record: Option<&Record>,
    lease: &Lease,
    now_ms: u64,
    extend_ms: u64,
) -> (FenceCheck, Option<Record>) {
    match record {
        Some(current) if holds(record, lease, now_ms) => (
            FenceCheck::Accepted,
            Some(Record {
                state: RecordState::Processing {
                    token: lease.token,
                    lease_until_ms: now_ms.saturating_add(extend_ms),
                },
                expires_at_ms: current.expires_at_ms,
            }),
        ),
        _ => (FenceCheck::Rejected, None),
    }
}

/// `complete`: the holder records the outcome, kept for `retention`.
pub fn complete(
    record: Option<&Record>,
    lease: &Lease,
    now_ms: u64,
    retention_ms: u64,
    outcome: Option<Bytes>,
) -> (FenceCheck, Option<Record>) {
    if !holds(record, lease, now_ms) {
        return (FenceCheck::Rejected, None);
    }
    (
        FenceCheck::Accepted,
        Some(Record {
            state: RecordState::Completed { outcome },
            expires_at_ms: now_ms.saturating_add(retention_ms),
        }),
    )
}

/// `release`: the holder gives the key back to `Pending` (a failed attempt, to be retried).
pub fn release(
    record: Option<&Record>,
    lease: &Lease,
    now_ms: u64,
) -> (FenceCheck, Option<Record>) {
    match record {
        Some(current) if holds(record, lease, now_ms) => (
            FenceCheck::Accepted,
            Some(Record {
                state: RecordState::Pending,
                expires_at_ms: current.expires_at_ms,
            }),
        ),
        _ => (FenceCheck::Rejected, None),
    }
}

/// The watermark rule: accept a value not older than the mark, and keep the larger.
pub fn watermark(current: Option<u64>, value: u64) -> (crate::WatermarkOutcome, Option<u64>) {
    match current {
        Some(mark) if value < mark => (crate::WatermarkOutcome::Stale { current: mark }, None),
        previous => (
            crate::WatermarkOutcome::Accepted { previous },
            Some(previous.map_or(value, |mark| mark.max(value))),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyHash;

    const KEY: KeyHash = KeyHash([7; 16]);

    fn lease_of(claim: &Claim) -> Lease {
        match claim {
            Claim::Acquired(lease) => *lease,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    #[test]
    fn a_taken_over_holder_can_do_nothing() {
        let (first, rec) = claim(None, KEY, 0, 0, 10, || FencingToken(1));
        let first = lease_of(&first);
        // Lease ran out; a second worker takes over.
        let (second, rec) = claim(rec.as_ref(), KEY, 0, 11, 10, || FencingToken(2));
        let second = lease_of(&second);
        assert_eq!(renew(rec.as_ref(), &first, 12, 10).0, FenceCheck::Rejected);
        assert_eq!(
            complete(rec.as_ref(), &first, 12, 100, None).0,
            FenceCheck::Rejected
        );
        assert_eq!(release(rec.as_ref(), &first, 12).0, FenceCheck::Rejected);
        assert_eq!(
            complete(rec.as_ref(), &second, 12, 100, None).0,
            FenceCheck::Accepted
        );
    }

    #[test]
    fn live_lease_blocks_and_completion_answers() {
        let rec = admitted(0, 1000);
        let (granted, rec) = claim(Some(&rec), KEY, 0, 1, 10, || FencingToken(5));
        let lease = lease_of(&granted);
        assert_eq!(lease.until_ms, 11);
        let (busy, none) = claim(rec.as_ref(), KEY, 0, 5, 10, || FencingToken(6));
        assert_eq!(busy, Claim::InFlight { until_ms: 11 });
        assert!(none.is_none());
        let (ok, rec) = complete(rec.as_ref(), &lease, 6, 50, Some(Bytes::from_static(b"r")));
        assert_eq!(ok, FenceCheck::Accepted);
        let rec = rec.expect("completed record");
        assert_eq!(rec.expires_at_ms, 56);
        let (done, _) = claim(Some(&rec), KEY, 0, 7, 10, || FencingToken(7));
        assert_eq!(
            done,
            Claim::Done {
                outcome: Some(Bytes::from_static(b"r"))
            }
        );
        // After retention the key is free again.
        assert!(matches!(
            claim(Some(&rec), KEY, 0, 56, 10, || FencingToken(8)).0,
            Claim::Acquired(_)
        ));
    }

    #[test]
    fn watermark_only_moves_up() {
        assert_eq!(
            watermark(None, 5),
            (
                crate::WatermarkOutcome::Accepted { previous: None },
                Some(5)
            )
        );
        assert_eq!(
            watermark(Some(5), 5),
            (
                crate::WatermarkOutcome::Accepted { previous: Some(5) },
                Some(5)
            )
        );
        assert_eq!(
            watermark(Some(5), 4),
            (crate::WatermarkOutcome::Stale { current: 5 }, None)
        );
    }
}
