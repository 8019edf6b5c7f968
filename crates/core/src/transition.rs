//! The state machine as pure functions over one key's record.
//!
//! Every backend applies these same functions inside its own atomic step (a lock, a write
//! transaction, a Lua script mirrors them), so the semantics are written once and tested once.
//! Each function takes the record as stored (possibly dead) and the time, and returns the answer
//! and the record to store (`None` means: leave it as it is).

use bytes::Bytes;

use crate::record::{Claim, FenceCheck, FencingToken, Fingerprint, Lease, Record, RecordState};

/// Whether a stored record still counts as seen.
pub fn is_seen(record: Option<&Record>, now_ms: u64) -> bool {
    record.is_some_and(|r| r.is_live(now_ms))
}

/// The record `admit` writes for each key of a new event.
pub fn admitted(now_ms: u64, retention_ms: u64) -> Record {
    Record {
        state: RecordState::Pending,
        expires_at_ms: now_ms.saturating_add(retention_ms),
        fingerprint: None,
    }
}

/// Whether a claim for `fingerprint` must be refused: the live record was claimed for another
/// payload. A record or a claimer without a fingerprint conflicts with nothing.
pub fn conflicts(record: &Record, fingerprint: Option<Fingerprint>) -> bool {
    matches!((record.fingerprint, fingerprint), (Some(kept), Some(given)) if kept != given)
}

/// `claim`: `token` makes the token to grant, called only if the claim succeeds. A live record
/// keeps the fingerprint it has; one without gets the claimer's.
pub fn claim(
    record: Option<&Record>,
    key: crate::KeyHash,
    partition: u16,
    now_ms: u64,
    lease_ms: u64,
    fingerprint: Option<Fingerprint>,
    token: impl FnOnce() -> FencingToken,
) -> (Claim, Option<Record>) {
    let until_ms = now_ms.saturating_add(lease_ms);
    let grant = |expires_at_ms: u64, kept: Option<Fingerprint>| {
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
                fingerprint: kept.or(fingerprint),
            }),
        )
    };
    match record {
        Some(live) if live.is_live(now_ms) && conflicts(live, fingerprint) => {
            (Claim::Conflict, None)
        }
        Some(live) if live.is_live(now_ms) => match &live.state {
            RecordState::Pending => grant(live.expires_at_ms, live.fingerprint),
            RecordState::Processing { lease_until_ms, .. } if now_ms < *lease_until_ms => (
                Claim::InFlight {
                    until_ms: *lease_until_ms,
                },
                None,
            ),
            // The holder's lease ran out: take over, the old token is fenced off.
            RecordState::Processing { .. } => {
                let (granted, record) = grant(live.expires_at_ms, live.fingerprint);
                let taken = match granted {
                    Claim::Acquired(lease) => Claim::TookOver(lease),
                    other => other,
                };
                (taken, record)
            }
            RecordState::Completed { outcome } => (
                Claim::Done {
                    outcome: outcome.clone(),
                },
                None,
            ),
        },
        // Unknown (a business key never admitted) or forgotten: the lease alone keeps it.
        _ => grant(now_ms, None),
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
                fingerprint: current.fingerprint,
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
    match record {
        Some(current) if holds(record, lease, now_ms) => (
            FenceCheck::Accepted,
            Some(Record {
                state: RecordState::Completed { outcome },
                expires_at_ms: now_ms.saturating_add(retention_ms),
                fingerprint: current.fingerprint,
            }),
        ),
        _ => (FenceCheck::Rejected, None),
    }
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
                fingerprint: current.fingerprint,
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
        match claim.lease() {
            Some(lease) => *lease,
            None => panic!("expected a lease, got {claim:?}"),
        }
    }

    #[test]
    fn a_taken_over_holder_can_do_nothing() {
        let (first, rec) = claim(Some(&admitted(0, 1000)), KEY, 0, 0, 10, None, || {
            FencingToken(1)
        });
        let first = lease_of(&first);
        // Lease ran out; a second worker takes over, and says so.
        let (second, rec) = claim(rec.as_ref(), KEY, 0, 11, 10, None, || FencingToken(2));
        assert!(matches!(second, Claim::TookOver(_)), "{second:?}");
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

    /// A key no event brought in lives only while its lease does: once that ran out the record
    /// is forgotten (a backend may have swept it), so the next claim is a fresh grant.
    #[test]
    fn a_forgotten_business_key_is_granted_afresh() {
        let (first, rec) = claim(None, KEY, 0, 0, 10, None, || FencingToken(1));
        assert!(matches!(first, Claim::Acquired(_)));
        let (again, _) = claim(rec.as_ref(), KEY, 0, 11, 10, None, || FencingToken(2));
        assert!(matches!(again, Claim::Acquired(_)), "{again:?}");
    }

    #[test]
    fn live_lease_blocks_and_completion_answers() {
        let rec = admitted(0, 1000);
        let (granted, rec) = claim(Some(&rec), KEY, 0, 1, 10, None, || FencingToken(5));
        let lease = lease_of(&granted);
        assert_eq!(lease.until_ms, 11);
        let (busy, none) = claim(rec.as_ref(), KEY, 0, 5, 10, None, || FencingToken(6));
        assert_eq!(busy, Claim::InFlight { until_ms: 11 });
        assert!(none.is_none());
        let (ok, rec) = complete(rec.as_ref(), &lease, 6, 50, Some(Bytes::from_static(b"r")));
        assert_eq!(ok, FenceCheck::Accepted);
        let rec = rec.expect("completed record");
        assert_eq!(rec.expires_at_ms, 56);
        let (done, _) = claim(Some(&rec), KEY, 0, 7, 10, None, || FencingToken(7));
        assert_eq!(
            done,
            Claim::Done {
                outcome: Some(Bytes::from_static(b"r"))
            }
        );
        // After retention the key is free again.
        assert!(matches!(
            claim(Some(&rec), KEY, 0, 56, 10, None, || FencingToken(8)).0,
            Claim::Acquired(_)
        ));
    }

    #[test]
    fn a_key_keeps_the_payload_it_was_claimed_for() {
        let first = Fingerprint::of(b"send hello");
        let other = Fingerprint::of(b"send goodbye");
        // An admitted key (retention 1000) takes the first claimer's fingerprint.
        let admitted = admitted(0, 1000);
        assert!(!conflicts(&admitted, Some(first)));
        let (granted, rec) = claim(Some(&admitted), KEY, 0, 0, 10, Some(first), || {
            FencingToken(1)
        });
        let lease = lease_of(&granted);
        let held = rec.expect("claimed record");
        assert_eq!(held.fingerprint, Some(first));
        // In flight: another payload conflicts, the same one or none waits.
        assert_eq!(
            claim(Some(&held), KEY, 0, 1, 10, Some(other), || FencingToken(2)).0,
            Claim::Conflict
        );
        assert_eq!(
            claim(Some(&held), KEY, 0, 1, 10, Some(first), || FencingToken(2)).0,
            Claim::InFlight { until_ms: 10 }
        );
        // Released and completed records keep it.
        let (_, released) = release(Some(&held), &lease, 2);
        let released = released.expect("released record");
        assert_eq!(released.fingerprint, Some(first));
        assert_eq!(
            claim(
                Some(&released),
                KEY,
                0,
                3,
                10,
                Some(other),
                || FencingToken(3)
            )
            .0,
            Claim::Conflict
        );
        let (again, held) = claim(Some(&released), KEY, 0, 3, 10, None, || FencingToken(3));
        let lease = lease_of(&again);
        let held = held.expect("claimed again");
        assert_eq!(
            held.fingerprint,
            Some(first),
            "a claim without a fingerprint keeps the record's"
        );
        let (_, done) = complete(Some(&held), &lease, 4, 100, Some(Bytes::from_static(b"m1")));
        let done = done.expect("completed record");
        assert_eq!(
            claim(Some(&done), KEY, 0, 5, 10, Some(other), || FencingToken(4)).0,
            Claim::Conflict
        );
        assert_eq!(
            claim(Some(&done), KEY, 0, 5, 10, Some(first), || FencingToken(4)).0,
            Claim::Done {
                outcome: Some(Bytes::from_static(b"m1"))
            }
        );
        // Forgotten after retention: the key is free for any payload.
        let (fresh, rec) = claim(Some(&done), KEY, 0, 104, 10, Some(other), || {
            FencingToken(5)
        });
        assert!(matches!(fresh, Claim::Acquired(_)));
        assert_eq!(rec.map(|r| r.fingerprint), Some(Some(other)));
    }

    #[test]
    fn a_released_business_key_is_free_for_another_payload() {
        // A business key no event admitted lives by its lease alone: released, it is forgotten.
        let first = Fingerprint::of(b"a");
        let (granted, rec) = claim(None, KEY, 0, 0, 10, Some(first), || FencingToken(1));
        let (_, rec) = release(rec.as_ref(), &lease_of(&granted), 1);
        let other = Fingerprint::of(b"b");
        assert!(matches!(
            claim(rec.as_ref(), KEY, 0, 2, 10, Some(other), || FencingToken(2)).0,
            Claim::Acquired(_)
        ));
    }

    #[test]
    fn fingerprints_are_the_truncated_sha256() {
        // SHA-256("abc") = ba7816bf 8f01cfea 414140de 5dae2223 b00361a3 96177a9c b410ff61 f20015ad
        assert_eq!(
            Fingerprint::of(b"abc").to_string(),
            "ba7816bf8f01cfea414140de5dae2223"
        );
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
