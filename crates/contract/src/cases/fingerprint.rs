//! Payload fingerprints: a key claimed for one payload is a conflict for another.

use oncegate_core::{Fingerprint, KeyHash};

use super::*;

fn business_key(name: &str) -> KeyHash {
    key_for("api", "cli_contract", "business", name)
}

fn payload(text: &str) -> Option<Fingerprint> {
    Some(Fingerprint::of(text.as_bytes()))
}

/// The fingerprint of the live record of `k` in `partition`.
async fn kept<S: Store>(store: &S, k: &KeyHash, partition: u16) -> Option<Fingerprint> {
    store
        .record(k, partition)
        .await
        .expect("record")
        .expect("a live record")
        .fingerprint
}

/// A business key claimed for one payload: another payload conflicts while it is in flight and
/// after it is done; the same payload waits, then reads the stored result; the record shows the
/// fingerprint; after retention the key is free for any payload.
pub fn a_key_claimed_for_one_payload_conflicts_with_another<S: Store>(
    make: impl Fn(ManualClock) -> S,
) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        let k = business_key("order-1");
        let p = home(&store, &k);
        let lease = lease_of(
            store
                .claim_with_fingerprint(&k, p, LEASE, payload("create order 1"))
                .await
                .expect("claim"),
        );
        for (given, expected) in [
            (payload("create order 2"), Claim::Conflict),
            (
                payload("create order 1"),
                Claim::InFlight {
                    until_ms: lease.until_ms,
                },
            ),
            (
                None,
                Claim::InFlight {
                    until_ms: lease.until_ms,
                },
            ),
        ] {
            let got = store
                .claim_with_fingerprint(&k, p, LEASE, given)
                .await
                .expect("claim");
            assert_eq!(got, expected, "in flight, claimed for {given:?}");
        }
        assert_eq!(kept(&store, &k, p).await, payload("create order 1"));

        let result = Bytes::from_static(b"{\"order\":\"o-1\"}");
        assert_eq!(
            store
                .complete(&lease, secs(60), Some(result.clone()))
                .await
                .expect("complete"),
            FenceCheck::Accepted
        );
        assert_eq!(
            store
                .claim_with_fingerprint(&k, p, LEASE, payload("create order 2"))
                .await
                .expect("claim"),
            Claim::Conflict,
            "done for another payload"
        );
        for given in [payload("create order 1"), None] {
            assert_eq!(
                store
                    .claim_with_fingerprint(&k, p, LEASE, given)
                    .await
                    .expect("claim"),
                Claim::Done {
                    outcome: Some(result.clone())
                }
            );
        }
        assert_eq!(
            kept(&store, &k, p).await,
            payload("create order 1"),
            "kept when done"
        );

        clock.advance_ms(60_000);
        let fresh = lease_of(
            store
                .claim_with_fingerprint(&k, p, LEASE, payload("create order 2"))
                .await
                .expect("claim"),
        );
        assert!(fresh.token > lease.token);
        assert_eq!(kept(&store, &k, p).await, payload("create order 2"));
    });
}

/// An admitted key has no fingerprint; its first claimer's sticks through a release, so a
/// retry for another payload conflicts and one for the same payload runs again.
pub fn an_admitted_key_keeps_its_first_claimers_fingerprint<S: Store>(
    make: impl Fn(ManualClock) -> S,
) {
    let store = make(clock());
    block_on(async {
        let e = event("fp-admitted", Some("chat-fp"));
        let partition = e.partition(store.partitions());
        let k = key("fp-admitted");
        admitted(store.admit(e, &[k], DAY).await.expect("admit"));
        assert_eq!(kept(&store, &k, partition).await, None);

        let first = lease_of(
            store
                .claim_with_fingerprint(&k, partition, LEASE, payload("a"))
                .await
                .expect("claim"),
        );
        assert_eq!(
            store.release(&first).await.expect("release"),
            FenceCheck::Accepted
        );
        assert_eq!(
            store
                .claim_with_fingerprint(&k, partition, LEASE, payload("b"))
                .await
                .expect("claim"),
            Claim::Conflict
        );
        let again = lease_of(
            store
                .claim_with_fingerprint(&k, partition, LEASE, None)
                .await
                .expect("a claim naming no payload conflicts with none"),
        );
        assert_eq!(
            kept(&store, &k, partition).await,
            payload("a"),
            "kept by a claim naming none"
        );
        assert_eq!(
            store.renew(&again, LEASE).await.expect("renew"),
            FenceCheck::Accepted
        );
        assert_eq!(
            kept(&store, &k, partition).await,
            payload("a"),
            "kept by a renewal"
        );
    });
}

/// A key forgotten after its retention and admitted again starts without a fingerprint: the
/// old payload's claim must not follow a new event.
pub fn a_readmitted_key_forgets_the_old_fingerprint<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        let e = event("fp-again", None);
        let partition = e.partition(store.partitions());
        let k = key("fp-again");
        admitted(store.admit(e.clone(), &[k], secs(10)).await.expect("admit"));
        let lease = lease_of(
            store
                .claim_with_fingerprint(&k, partition, LEASE, payload("old"))
                .await
                .expect("claim"),
        );
        store
            .complete(&lease, secs(10), None)
            .await
            .expect("complete");
        clock.advance_ms(10_000);
        admitted(store.admit(e, &[k], DAY).await.expect("admit again"));
        assert_eq!(kept(&store, &k, partition).await, None);
        assert!(matches!(
            store
                .claim_with_fingerprint(&k, partition, LEASE, payload("new"))
                .await
                .expect("claim"),
            Claim::Acquired(_)
        ));
    });
}

/// Threads claim the same business keys for two payloads at once, in many rounds: per key one
/// payload wins, the other only ever sees conflicts, and the winner's repeats see its lease or
/// its stored result, never a result stored for the other payload.
pub fn racing_payloads_one_wins_each_key<S: Store>(make: impl Fn(ManualClock) -> S) {
    const ROUNDS: usize = 20;
    const THREADS: usize = 8;
    const KEYS: usize = 24;
    let store = make(clock());
    for round in 0..ROUNDS {
        let keys: Vec<KeyHash> = (0..KEYS)
            .map(|i| business_key(&format!("race-{round}-{i}")))
            .collect();
        let seen = race(&store, THREADS, |store, thread| {
            let side = (thread % 2) as u8;
            let given = payload(&format!("payload-{side}"));
            block_on(async {
                let mut seen = Vec::new();
                for n in 0..KEYS {
                    // Each thread walks the keys from another start, so claims interleave.
                    let k = keys[(n + thread * 5) % KEYS];
                    let p = home(store, &k);
                    let got = store
                        .claim_with_fingerprint(&k, p, LEASE, given)
                        .await
                        .expect("claim");
                    if let Claim::Acquired(lease) = &got {
                        let result = Bytes::from(vec![side]);
                        assert_eq!(
                            store
                                .complete(lease, DAY, Some(result))
                                .await
                                .expect("complete"),
                            FenceCheck::Accepted
                        );
                    }
                    seen.push((k, side, got));
                }
                seen
            })
        });
        let mut winners: HashMap<KeyHash, u8> = HashMap::new();
        for (k, side, got) in seen.iter().flatten() {
            if let Claim::Acquired(_) = got {
                let previous = winners.insert(*k, *side);
                assert_eq!(previous, None, "round {round}: a key was granted twice");
            }
        }
        assert_eq!(
            winners.len(),
            KEYS,
            "round {round}: every key has one winner"
        );
        for (k, side, got) in seen.iter().flatten() {
            let winner = winners[k];
            match got {
                Claim::Acquired(_) => {}
                Claim::TookOver(_) => panic!("round {round}: no lease ran out: {got:?}"),
                Claim::Conflict => assert_ne!(*side, winner, "round {round}: winner refused"),
                Claim::InFlight { .. } => {
                    assert_eq!(*side, winner, "round {round}: the loser saw the lease")
                }
                Claim::Done { outcome } => {
                    assert_eq!(*side, winner, "round {round}: the loser read a result");
                    assert_eq!(outcome.as_deref(), Some(&[winner][..]));
                }
            }
        }
        for k in &keys {
            assert_eq!(
                block_on(kept(&store, k, home(&store, k))),
                payload(&format!("payload-{}", winners[k]))
            );
        }
    }
}
