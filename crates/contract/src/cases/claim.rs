//! The lease state machine: claims, fencing, partitions, renewals, completion.

use super::*;

/// Pending → Processing → (release) Pending → Processing → Completed, with the answers of each.
pub fn claim_walks_the_state_machine<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        admitted(
            store
                .admit(event("e1", None), &[key("e1")], DAY)
                .await
                .expect("admit"),
        );
        let first = lease_of(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
        );
        assert_eq!(first.key, key("e1"));
        assert_eq!(first.until_ms, crate::START_MS + 30_000);
        assert_eq!(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
            Claim::InFlight {
                until_ms: first.until_ms
            }
        );
        assert_eq!(
            store.release(&first).await.expect("release"),
            FenceCheck::Accepted
        );
        let record = store
            .record(&key("e1"), home(&store, &key("e1")))
            .await
            .expect("record")
            .expect("still seen");
        assert_eq!(record.state, RecordState::Pending);
        // A released key still counts as seen for admission.
        assert_eq!(
            store
                .admit(event("e1", None), &[key("e1")], DAY)
                .await
                .expect("admit"),
            Admission::Duplicate { key_index: 0 }
        );
        let second = lease_of(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
        );
        assert!(second.token > first.token);
        let outcome = Bytes::from_static(b"{\"reply\":\"om_2\"}");
        assert_eq!(
            store
                .complete(&second, DAY, Some(outcome.clone()))
                .await
                .expect("complete"),
            FenceCheck::Accepted
        );
        assert_eq!(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
            Claim::Done {
                outcome: Some(outcome.clone())
            }
        );
        // Completing twice, or releasing after completion, changes nothing.
        assert_eq!(
            store.complete(&second, DAY, None).await.expect("complete"),
            FenceCheck::Rejected
        );
        assert_eq!(
            store.release(&second).await.expect("release"),
            FenceCheck::Rejected
        );
        let record = store
            .record(&key("e1"), home(&store, &key("e1")))
            .await
            .expect("record")
            .expect("completed");
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Some(outcome)
            }
        );
        assert_eq!(record.expires_at_ms, crate::START_MS + 24 * 3600 * 1000);
    });
}

/// A key that was never admitted can be claimed (business keys); its record lives as long as
/// its lease unless completed.
pub fn claim_of_an_unknown_key_is_a_business_key<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    let business = key_for(
        "feishu",
        "cli_contract",
        "business",
        "im.message.receive_v1:om_1",
    );
    block_on(async {
        let lease = lease_of(
            store
                .claim(&business, home(&store, &business), LEASE)
                .await
                .expect("claim"),
        );
        assert_eq!(
            store.release(&lease).await.expect("release"),
            FenceCheck::Accepted
        );
        // Released before any retention was given: nothing keeps it.
        assert!(
            store
                .record(&business, home(&store, &business))
                .await
                .expect("record")
                .is_none()
        );
        let lease = lease_of(
            store
                .claim(&business, home(&store, &business), LEASE)
                .await
                .expect("claim"),
        );
        assert_eq!(
            store
                .complete(&lease, secs(3600), None)
                .await
                .expect("complete"),
            FenceCheck::Accepted
        );
        assert_eq!(
            store
                .claim(&business, home(&store, &business), LEASE)
                .await
                .expect("claim"),
            Claim::Done { outcome: None }
        );
        clock.advance_ms(3_600_000);
        lease_of(
            store
                .claim(&business, home(&store, &business), LEASE)
                .await
                .expect("claim"),
        );
    });
}

/// The fencing regression: worker A's lease runs out, B takes over; A's late renew, complete and
/// release must all be refused and leave B's record as it was.
pub fn stale_holder_cannot_touch_the_new_holders_record<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        admitted(
            store
                .admit(event("e1", None), &[key("e1")], DAY)
                .await
                .expect("admit"),
        );
        let a = lease_of(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
        );
        clock.advance_ms(30_000);
        // a's lease ran out: b takes the key over, and the store says it was a takeover.
        let b = took_over(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
        );
        assert!(b.token > a.token);
        let held_by_b = store
            .record(&key("e1"), home(&store, &key("e1")))
            .await
            .expect("record");
        assert_eq!(
            store.renew(&a, LEASE).await.expect("renew"),
            FenceCheck::Rejected
        );
        assert_eq!(
            store
                .complete(&a, DAY, Some(Bytes::from_static(b"a")))
                .await
                .expect("complete"),
            FenceCheck::Rejected
        );
        assert_eq!(
            store.release(&a).await.expect("release"),
            FenceCheck::Rejected
        );
        assert_eq!(
            store
                .record(&key("e1"), home(&store, &key("e1")))
                .await
                .expect("record"),
            held_by_b
        );
        assert_eq!(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
            Claim::InFlight {
                until_ms: b.until_ms
            }
        );
        assert_eq!(
            store
                .complete(&b, DAY, Some(Bytes::from_static(b"b")))
                .await
                .expect("complete"),
            FenceCheck::Accepted
        );
        assert_eq!(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
            Claim::Done {
                outcome: Some(Bytes::from_static(b"b"))
            }
        );
        // And after B completed, A is still refused.
        assert_eq!(
            store.complete(&a, DAY, None).await.expect("complete"),
            FenceCheck::Rejected
        );
    });
}

/// Records live in their event's partition: the same key in another partition is another
/// record, and a partition the store does not have is refused.
pub fn records_live_in_their_events_partition<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    let partitions = store.partitions();
    assert!(
        partitions >= 2,
        "the contract suite needs at least two partitions"
    );
    let home_chat = "chat-home";
    let home = event("p1", Some(home_chat)).partition(partitions);
    let other_chat = (0..1000)
        .map(|i| format!("chat-{i}"))
        .find(|chat| event("p1", Some(chat)).partition(partitions) != home)
        .expect("a chat in another partition");
    let other = event("p1", Some(&other_chat)).partition(partitions);
    block_on(async {
        let id = admitted(
            store
                .admit(event("p1", Some(home_chat)), &[key("p1")], DAY)
                .await
                .expect("admit"),
        );
        assert_eq!(id.partition, home);
        let record = store.record(&key("p1"), home).await.expect("record");
        assert_eq!(record.map(|r| r.state), Some(RecordState::Pending));
        assert_eq!(store.record(&key("p1"), other).await.expect("record"), None);
        let lease = lease_of(store.claim(&key("p1"), home, LEASE).await.expect("claim"));
        assert_eq!((lease.key, lease.partition), (key("p1"), home));
        // Elsewhere the key is unknown: a grant of its own, which fences nothing here.
        let elsewhere = lease_of(store.claim(&key("p1"), other, LEASE).await.expect("claim"));
        assert_eq!(elsewhere.partition, other);
        assert_eq!(
            store
                .complete(&elsewhere, DAY, None)
                .await
                .expect("complete"),
            FenceCheck::Accepted
        );
        assert_eq!(
            store.complete(&lease, DAY, None).await.expect("complete"),
            FenceCheck::Accepted
        );
        // And the same event id admitted in another partition is new there.
        admitted(
            store
                .admit(event("p2", Some(home_chat)), &[key("p2")], DAY)
                .await
                .expect("admit"),
        );
        let moved = store
            .admit(event("p2", Some(&other_chat)), &[key("p2")], DAY)
            .await
            .expect("admit");
        assert!(matches!(moved, Admission::Admitted { id } if id.partition == other));
        for refused in [
            store.claim(&key("p1"), partitions, LEASE).await.map(|_| ()),
            store.record(&key("p1"), partitions).await.map(|_| ()),
        ] {
            assert!(
                matches!(&refused, Err(oncegate_core::StoreError::Invalid(m)) if m.contains("no partition")),
                "{refused:?}"
            );
        }
    });
}

/// Renewal moves the lease end; a renewed lease keeps others out past its first end.
pub fn renew_extends_only_the_current_lease<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        admitted(
            store
                .admit(event("e1", None), &[key("e1")], DAY)
                .await
                .expect("admit"),
        );
        let lease = lease_of(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
        );
        clock.advance_ms(20_000);
        assert_eq!(
            store.renew(&lease, LEASE).await.expect("renew"),
            FenceCheck::Accepted
        );
        clock.advance_ms(20_000);
        // Past the first end, inside the renewed one.
        assert_eq!(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
            Claim::InFlight {
                until_ms: crate::START_MS + 50_000
            }
        );
        clock.advance_ms(10_000);
        took_over(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
        );
    });
}

/// Every grant of a key carries a larger token than every earlier grant of that key, and two
/// live grants never share a token. (Across partitions tokens need not be ordered: in a Redis
/// Cluster each partition's clock is on its own node.)
pub fn tokens_increase_with_every_grant<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        let mut last: HashMap<usize, oncegate_core::FencingToken> = HashMap::new();
        let mut seen = HashSet::new();
        for i in 0..50 {
            let k = key(&format!("t{}", i % 7));
            let lease = lease_of(
                store
                    .claim(&k, home(&store, &k), Duration::ZERO)
                    .await
                    .expect("claim"),
            );
            if let Some(previous) = last.insert(i % 7, lease.token) {
                assert!(
                    lease.token > previous,
                    "{:?} after {:?}",
                    lease.token,
                    previous
                );
            }
            assert!(seen.insert(lease.token), "token {:?} repeated", lease.token);
        }
    });
}

/// A completed record is kept for the completion's retention, then the key is free.
pub fn completed_records_expire_after_retention<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        admitted(
            store
                .admit(event("e1", None), &[key("e1")], secs(10))
                .await
                .expect("admit"),
        );
        let lease = lease_of(
            store
                .claim(&key("e1"), home(&store, &key("e1")), LEASE)
                .await
                .expect("claim"),
        );
        assert_eq!(
            store
                .complete(&lease, secs(120), None)
                .await
                .expect("complete"),
            FenceCheck::Accepted
        );
        clock.advance_ms(119_000);
        assert_eq!(
            store
                .admit(event("e1", None), &[key("e1")], secs(10))
                .await
                .expect("admit"),
            Admission::Duplicate { key_index: 0 }
        );
        clock.advance_ms(1_000);
        assert!(
            store
                .record(&key("e1"), home(&store, &key("e1")))
                .await
                .expect("record")
                .is_none()
        );
        admitted(
            store
                .admit(event("e1", None), &[key("e1")], secs(10))
                .await
                .expect("admit"),
        );
    });
}

/// `complete_and_ack` records the outcome and takes the event out of the queue; with a stale
/// lease it changes no record but still removes the caller's handed-out entry.
pub fn complete_and_ack_is_one_step<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        let ids = admit_in_order(&store, &["ca1", "ca2"], Some("chat-ca")).await;
        let partition = ids[0].partition;
        let out = store.pull(partition, 10).await.expect("pull");
        assert_eq!(out.len(), 1);
        let lease = lease_of(
            store
                .claim(&out[0].key, out[0].id.partition, LEASE)
                .await
                .expect("claim"),
        );
        let outcome = Some(Bytes::from_static(b"done"));
        assert_eq!(
            store
                .complete_and_ack(&lease, DAY, outcome.clone(), out[0].id)
                .await
                .expect("complete and ack"),
            FenceCheck::Accepted
        );
        assert_eq!(
            store
                .claim(&key("ca1"), partition, LEASE)
                .await
                .expect("claim"),
            Claim::Done { outcome }
        );
        assert!(!store.ack(ids[0]).await.expect("ack"), "already acked");
        // The next event of the chat is free now.
        let next = store.pull(partition, 10).await.expect("pull");
        assert_eq!(next[0].id, ids[1]);
        let first = lease_of(
            store
                .claim(&next[0].key, next[0].id.partition, LEASE)
                .await
                .expect("claim"),
        );
        clock.advance_ms(30_000);
        let _second = took_over(
            store
                .claim(&next[0].key, next[0].id.partition, LEASE)
                .await
                .expect("claim"),
        );
        assert_eq!(
            store
                .complete_and_ack(&first, DAY, None, next[0].id)
                .await
                .expect("complete and ack"),
            FenceCheck::Rejected
        );
        assert_eq!(store.stats().await.expect("stats").queued, 0);
    });
}
