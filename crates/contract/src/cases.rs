//! The contract cases. Each builds its own store from the factory.

use std::collections::{HashMap, HashSet};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{
    Admission, Claim, FenceCheck, Lease, ManualClock, RecordState, Store, WatermarkOutcome, key_for,
};

use crate::{block_on, clock, event, key};

const DAY: Duration = Duration::from_secs(24 * 3600);
const LEASE: Duration = Duration::from_secs(30);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The partition of a key admitted with an event without an order key (the event's own key
/// decides it), or of a business key.
fn home<S: Store>(store: &S, k: &oncegate_core::KeyHash) -> u16 {
    k.home(store.partitions())
}

#[track_caller]
fn lease_of(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        other => panic!("expected the claim to be granted, got {other:?}"),
    }
}

#[track_caller]
fn admitted(admission: Admission) -> oncegate_core::QueueId {
    match admission {
        Admission::Admitted { id } => id,
        other => panic!("expected the event to be admitted, got {other:?}"),
    }
}

/// A new key is admitted and queued; the same key again is a duplicate and queues nothing.
pub fn admit_marks_and_queues_once<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        let id = admitted(
            store
                .admit(event("e1", Some("c1")), &[key("e1")], DAY)
                .await
                .expect("admit"),
        );
        assert_eq!(
            store
                .admit(event("e1", Some("c1")), &[key("e1")], DAY)
                .await
                .expect("admit"),
            Admission::Duplicate { key_index: 0 }
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.pending, stats.queued), (1, 1));
        let pulled = store.pull(id.partition, 10).await.expect("pull");
        assert_eq!(pulled.len(), 1);
        assert_eq!(pulled[0].id, id);
        assert_eq!(pulled[0].key, key("e1"));
        assert_eq!(pulled[0].event, event("e1", Some("c1")));
        assert_eq!(pulled[0].attempt, 0);
    });
}

/// An event with several keys is a duplicate if any key was seen, and then marks none of them.
pub fn admit_with_several_keys_is_all_or_nothing<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    let message = key_for("feishu", "cli_contract", "message_id", "om_1");
    // A message and its events share a chat, so a partition.
    let chat = Some("oc_1");
    block_on(async {
        let id = admitted(
            store
                .admit(event("e1", chat), &[key("e1"), message], DAY)
                .await
                .expect("admit"),
        );
        // Same message, a different event id: the message id catches it.
        assert_eq!(
            store
                .admit(event("e2", chat), &[key("e2"), message], DAY)
                .await
                .expect("admit"),
            Admission::Duplicate { key_index: 1 }
        );
        // The duplicate marked nothing: e2 alone is still new.
        assert!(
            store
                .record(&key("e2"), id.partition)
                .await
                .expect("record")
                .is_none()
        );
        admitted(
            store
                .admit(event("e2", chat), &[key("e2")], DAY)
                .await
                .expect("admit"),
        );
        assert_eq!(store.stats().await.expect("stats").queued, 2);
    });
}

/// Admitting with no key is refused, not silently accepted.
pub fn admit_needs_a_key<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        let refused = store.admit(event("e1", None), &[], DAY).await;
        assert!(
            matches!(refused, Err(oncegate_core::StoreError::Invalid(_))),
            "{refused:?}"
        );
        assert_eq!(store.stats().await.expect("stats").queued, 0);
    });
}

/// Seen-marks last exactly their retention.
pub fn admitted_keys_expire_after_retention<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        admitted(
            store
                .admit(event("e1", None), &[key("e1")], secs(60))
                .await
                .expect("admit"),
        );
        clock.advance_ms(59_999);
        assert_eq!(
            store
                .admit(event("e1", None), &[key("e1")], secs(60))
                .await
                .expect("admit"),
            Admission::Duplicate { key_index: 0 }
        );
        clock.advance_ms(1);
        assert!(
            store
                .record(&key("e1"), home(&store, &key("e1")))
                .await
                .expect("record")
                .is_none()
        );
        admitted(
            store
                .admit(event("e1", None), &[key("e1")], secs(60))
                .await
                .expect("admit"),
        );
    });
}

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
        let b = lease_of(
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
        lease_of(
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
        let ids = futures_in_order(&store, &["ca1", "ca2"], Some("chat-ca")).await;
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
        let _second = lease_of(
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

/// Events come out in queue order; an event waits while an earlier one of its order key is out.
pub fn queue_hands_out_in_order_per_key<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        // Everything in one partition: the same chat.
        let ids: Vec<_> = futures_in_order(&store, &["a1", "a2", "a3"], Some("chat-a")).await;
        let partition = ids[0].partition;
        let first = store.pull(partition, 10).await.expect("pull");
        assert_eq!(first.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[0]]);
        assert!(
            store.pull(partition, 10).await.expect("pull").is_empty(),
            "a2 must wait for a1"
        );
        assert!(store.ack(ids[0]).await.expect("ack"));
        assert!(!store.ack(ids[0]).await.expect("ack twice"));
        let second = store.pull(partition, 10).await.expect("pull");
        assert_eq!(
            second.iter().map(|d| d.id).collect::<Vec<_>>(),
            vec![ids[1]]
        );
        assert!(store.ack(ids[1]).await.expect("ack"));
        let third = store.pull(partition, 10).await.expect("pull");
        assert_eq!(third[0].event.event_id, "a3");
        assert!(store.ack(ids[2]).await.expect("ack"));
        assert_eq!(store.stats().await.expect("stats").queued, 0);

        // Different chats in one partition do not wait for each other.
        let partitions = store.partitions();
        let mut by_partition: HashMap<u16, Vec<String>> = HashMap::new();
        for chat in 0..(partitions as usize * 4) {
            let chat = format!("chat-{chat}");
            let id = admitted(
                store
                    .admit(
                        event(&format!("x-{chat}"), Some(&chat)),
                        &[key(&format!("x-{chat}"))],
                        DAY,
                    )
                    .await
                    .expect("admit"),
            );
            by_partition.entry(id.partition).or_default().push(chat);
        }
        let (partition, chats) = by_partition
            .into_iter()
            .max_by_key(|(_, c)| c.len())
            .expect("some partition");
        assert!(chats.len() >= 2, "expected two chats to share a partition");
        let pulled = store.pull(partition, 100).await.expect("pull");
        assert_eq!(pulled.len(), chats.len());
        let pulled_ids: Vec<_> = pulled.iter().map(|d| d.id.seq).collect();
        let mut sorted = pulled_ids.clone();
        sorted.sort_unstable();
        assert_eq!(pulled_ids, sorted, "handed out in queue order");
    });
}

async fn futures_in_order<S: Store>(
    store: &S,
    ids: &[&str],
    chat: Option<&str>,
) -> Vec<oncegate_core::QueueId> {
    let mut out = Vec::new();
    for id in ids {
        out.push(admitted(
            store
                .admit(event(id, chat), &[key(id)], DAY)
                .await
                .expect("admit"),
        ));
    }
    out
}

/// A retried event is not handed out before its time, comes back with the next attempt number,
/// and holds back later events of its order key meanwhile.
pub fn queue_retry_waits_and_counts_attempts<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        let ids = futures_in_order(&store, &["r1", "r2"], Some("chat-r")).await;
        let partition = ids[0].partition;
        let out = store.pull(partition, 10).await.expect("pull");
        assert_eq!(out.len(), 1);
        assert!(
            store
                .retry(ids[0], crate::START_MS + 5_000)
                .await
                .expect("retry")
        );
        assert!(
            !store
                .retry(ids[0], crate::START_MS + 5_000)
                .await
                .expect("retry twice"),
            "not handed out any more"
        );
        assert!(
            store.pull(partition, 10).await.expect("pull").is_empty(),
            "r1 waits, r2 waits behind it"
        );
        clock.advance_ms(5_000);
        let again = store.pull(partition, 10).await.expect("pull");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].id, ids[0]);
        assert_eq!(again[0].attempt, 1);
        assert!(store.ack(ids[0]).await.expect("ack"));
        assert_eq!(store.pull(partition, 10).await.expect("pull")[0].id, ids[1]);
    });
}

/// Dead-lettering takes the event out of the queue and keeps it with the reason and attempts.
pub fn queue_dead_letters_keep_the_reason<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        let ids = futures_in_order(&store, &["d1", "d2"], Some("chat-d")).await;
        let partition = ids[0].partition;
        store.pull(partition, 10).await.expect("pull");
        assert!(store.retry(ids[0], 0).await.expect("retry"));
        store.pull(partition, 10).await.expect("pull");
        assert!(
            store
                .dead_letter(ids[0], "downstream answered 422: bad payload")
                .await
                .expect("dead letter")
        );
        assert!(
            !store
                .dead_letter(ids[0], "again")
                .await
                .expect("dead letter twice")
        );
        let dead = store.dead_letters(10).await.expect("dead letters");
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].id, ids[0]);
        assert_eq!(dead[0].event.event_id, "d1");
        assert_eq!(dead[0].attempts, 2);
        assert_eq!(dead[0].reason, "downstream answered 422: bad payload");
        // The next event of the chat is free now.
        assert_eq!(store.pull(partition, 10).await.expect("pull")[0].id, ids[1]);
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (stats.dead_letters, stats.queued, stats.in_flight),
            (1, 1, 1)
        );
    });
}

/// Ids that were never handed out, or do not exist, are answered `false`.
pub fn queue_unknown_ids_are_refused<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        let id = admitted(
            store
                .admit(event("u1", None), &[key("u1")], DAY)
                .await
                .expect("admit"),
        );
        assert!(!store.ack(id).await.expect("ack before pull"));
        assert!(!store.retry(id, 0).await.expect("retry before pull"));
        assert!(
            !store
                .dead_letter(id, "x")
                .await
                .expect("dead letter before pull")
        );
        let missing = oncegate_core::QueueId {
            partition: id.partition,
            seq: id.seq + 1000,
        };
        assert!(!store.ack(missing).await.expect("ack"));
        let bad_partition = oncegate_core::QueueId {
            partition: u16::MAX,
            seq: 0,
        };
        assert!(!store.ack(bad_partition).await.expect("ack"));
        assert!(store.pull(u16::MAX, 1).await.is_err());
        assert_eq!(store.pull(id.partition, 1).await.expect("pull").len(), 1);
    });
}

/// Watermarks accept equal or newer values, refuse older ones, and are forgotten after their
/// retention (a backend may keep them up to twice as long, never shorter).
pub fn watermarks_only_move_up_and_expire<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    let chat = key_for("feishu", "cli_contract", "watermark", "chat-1");
    let other = key_for("feishu", "cli_contract", "watermark", "chat-2");
    block_on(async {
        let hour = secs(3600);
        assert_eq!(
            store
                .advance_watermark(&chat, 100, hour)
                .await
                .expect("mark"),
            WatermarkOutcome::Accepted { previous: None }
        );
        assert_eq!(
            store
                .advance_watermark(&chat, 100, hour)
                .await
                .expect("mark"),
            WatermarkOutcome::Accepted {
                previous: Some(100)
            }
        );
        assert_eq!(
            store
                .advance_watermark(&chat, 150, hour)
                .await
                .expect("mark"),
            WatermarkOutcome::Accepted {
                previous: Some(100)
            }
        );
        assert_eq!(
            store
                .advance_watermark(&chat, 120, hour)
                .await
                .expect("mark"),
            WatermarkOutcome::Stale { current: 150 }
        );
        assert_eq!(
            store
                .advance_watermark(&other, 1, hour)
                .await
                .expect("mark"),
            WatermarkOutcome::Accepted { previous: None }
        );
        clock.advance_ms(3_599_000);
        assert_eq!(
            store
                .advance_watermark(&chat, 149, hour)
                .await
                .expect("mark"),
            WatermarkOutcome::Stale { current: 150 }
        );
        clock.advance_ms(2 * 3_600_000);
        assert_eq!(
            store.advance_watermark(&chat, 1, hour).await.expect("mark"),
            WatermarkOutcome::Accepted { previous: None }
        );
    });
}

/// One key's record and the counts by state, as an operator reads them.
pub fn lookups_and_stats_for_operators<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        for id in ["s1", "s2", "s3", "s4"] {
            admitted(
                store
                    .admit(event(id, None), &[key(id)], DAY)
                    .await
                    .expect("admit"),
            );
        }
        let done = lease_of(
            store
                .claim(&key("s1"), home(&store, &key("s1")), LEASE)
                .await
                .expect("claim"),
        );
        store.complete(&done, DAY, None).await.expect("complete");
        let busy = lease_of(
            store
                .claim(&key("s2"), home(&store, &key("s2")), LEASE)
                .await
                .expect("claim"),
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!(
            (
                stats.pending,
                stats.processing,
                stats.completed,
                stats.queued
            ),
            (2, 1, 1, 4)
        );
        let record = store
            .record(&key("s2"), home(&store, &key("s2")))
            .await
            .expect("record")
            .expect("exists");
        assert_eq!(
            record.state,
            RecordState::Processing {
                token: busy.token,
                lease_until_ms: busy.until_ms
            }
        );
        assert!(
            store
                .record(&key("nope"), home(&store, &key("nope")))
                .await
                .expect("record")
                .is_none()
        );
    });
}

/// Run `f` on `threads` OS threads at once, each with its own runtime, after a common start.
fn race<S: Store, T: Send>(store: &S, threads: usize, f: impl Fn(&S, usize) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let (barrier, f) = (&barrier, &f);
                scope.spawn(move || {
                    barrier.wait();
                    f(store, thread)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("racer panicked"))
            .collect()
    })
}

/// Many threads admit the same keys (with overlapping key sets) in many rounds: every key is
/// admitted exactly once and the queue holds exactly the admitted events.
pub fn racing_admits_admit_once<S: Store>(make: impl Fn(ManualClock) -> S) {
    const ROUNDS: usize = 30;
    const THREADS: usize = 8;
    const KEYS: usize = 40;
    for round in 0..ROUNDS {
        let store = make(clock());
        let message = |i: usize| {
            key_for(
                "feishu",
                "cli_contract",
                "message_id",
                &format!("m{round}-{}", i / 2),
            )
        };
        let results = race(&store, THREADS, |store, thread| {
            block_on(async {
                let mut admitted = Vec::new();
                for n in 0..KEYS {
                    // Each thread walks the keys from a different start.
                    let i = (n + thread * 7) % KEYS;
                    let id = format!("r{round}-{i}");
                    // Pairs of events share a message id (and so its chat): only one of each
                    // pair may be admitted.
                    let keys = [key(&id), message(i)];
                    if let Admission::Admitted { .. } = store
                        .admit(event(&id, Some(&format!("c{}", (i / 2) % 5))), &keys, DAY)
                        .await
                        .expect("admit")
                    {
                        admitted.push(i / 2);
                    }
                }
                admitted
            })
        });
        let mut all: Vec<usize> = results.into_iter().flatten().collect();
        all.sort_unstable();
        let expected: Vec<usize> = (0..KEYS / 2).collect();
        assert_eq!(
            all, expected,
            "round {round}: each message admitted exactly once"
        );
        let stats = block_on(store.stats()).expect("stats");
        assert_eq!(
            stats.queued as usize,
            KEYS / 2,
            "round {round}: one queued event per admit"
        );
    }
}

/// Many threads claim the same keys with short leases and complete what they get: at any time
/// at most one live lease per key, each key completed exactly once, and every stale completion
/// refused.
pub fn racing_claims_grant_one_live_lease<S: Store>(make: impl Fn(ManualClock) -> S) {
    const ROUNDS: usize = 30;
    const THREADS: usize = 8;
    const KEYS: usize = 10;
    for round in 0..ROUNDS {
        let clock = clock();
        let store = make(clock.clone());
        let holders: Mutex<HashMap<usize, u64>> = Mutex::new(HashMap::new());
        let completions = race(&store, THREADS, |store, thread| {
            block_on(async {
                let mut completed = Vec::new();
                for n in 0..KEYS * 3 {
                    let i = (n + thread) % KEYS;
                    let k = key(&format!("k{round}-{i}"));
                    match store
                        .claim(&k, home(store, &k), LEASE)
                        .await
                        .expect("claim")
                    {
                        Claim::Acquired(lease) => {
                            {
                                let mut holders = holders.lock().expect("holders");
                                let previous = holders.insert(i, lease.token.0);
                                assert!(
                                    previous.is_none(),
                                    "round {round}: two live leases on key {i}"
                                );
                            }
                            // Every third key is given back instead of completed.
                            if (n + thread) % 3 == 0 {
                                holders.lock().expect("holders").remove(&i);
                                assert_eq!(
                                    store.release(&lease).await.expect("release"),
                                    FenceCheck::Accepted
                                );
                            } else {
                                holders.lock().expect("holders").remove(&i);
                                assert_eq!(
                                    store.complete(&lease, DAY, None).await.expect("complete"),
                                    FenceCheck::Accepted
                                );
                                completed.push(i);
                            }
                        }
                        Claim::InFlight { .. } | Claim::Done { .. } => {}
                    }
                }
                completed
            })
        });
        let mut all: Vec<usize> = completions.into_iter().flatten().collect();
        all.sort_unstable();
        let unique: HashSet<usize> = all.iter().copied().collect();
        assert_eq!(
            all.len(),
            unique.len(),
            "round {round}: a key completed twice: {all:?}"
        );
        // Finish what was released and never picked up again; then every key is done once.
        block_on(async {
            for i in 0..KEYS {
                let k = key(&format!("k{round}-{i}"));
                if let Claim::Acquired(lease) = store
                    .claim(&k, home(&store, &k), LEASE)
                    .await
                    .expect("claim")
                {
                    assert!(!unique.contains(&i));
                    store.complete(&lease, DAY, None).await.expect("complete");
                }
                assert_eq!(
                    store
                        .claim(&k, home(&store, &k), LEASE)
                        .await
                        .expect("claim"),
                    Claim::Done { outcome: None }
                );
            }
        });
    }
    // Takeovers under a race: leases run out while others hold them; each takeover fences the
    // previous holder, so exactly one completion per key succeeds.
    for round in 0..ROUNDS {
        let clock = clock();
        let store = make(clock.clone());
        let k = key(&format!("takeover-{round}"));
        let first = lease_of(
            block_on(store.claim(&k, home(&store, &k), Duration::from_millis(10))).expect("claim"),
        );
        clock.advance_ms(10);
        let grants = race(&store, THREADS, |store, _| {
            block_on(store.claim(&k, home(store, &k), LEASE)).expect("claim")
        });
        let leases: Vec<Lease> = grants
            .into_iter()
            .filter_map(|g| match g {
                Claim::Acquired(l) => Some(l),
                _ => None,
            })
            .collect();
        assert_eq!(
            leases.len(),
            1,
            "round {round}: one takeover, got {leases:?}"
        );
        let mut all = [first, leases[0]];
        all.reverse();
        let results = race(&store, 2, |store, i| {
            block_on(store.complete(&all[i], DAY, None)).expect("complete")
        });
        assert_eq!(
            results,
            vec![FenceCheck::Accepted, FenceCheck::Rejected],
            "round {round}"
        );
    }
}

/// Many threads pull the same partitions while acking: no event is handed out twice, none is
/// lost, and per chat the hand-outs follow queue order.
pub fn racing_pullers_never_share_an_event<S: Store>(make: impl Fn(ManualClock) -> S) {
    const ROUNDS: usize = 10;
    const THREADS: usize = 6;
    const EVENTS: usize = 120;
    for round in 0..ROUNDS {
        let store = make(clock());
        let mut expected: HashMap<String, Vec<u64>> = HashMap::new();
        block_on(async {
            for i in 0..EVENTS {
                let id = format!("p{round}-{i}");
                let chat = format!("chat-{}", i % 9);
                let qid = admitted(
                    store
                        .admit(event(&id, Some(&chat)), &[key(&id)], DAY)
                        .await
                        .expect("admit"),
                );
                expected.entry(chat).or_default().push(qid.seq);
            }
        });
        let log: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());
        let partitions = store.partitions();
        let handled = race(&store, THREADS, |store, thread| {
            block_on(async {
                let mut mine = 0;
                let mut idle = 0;
                while idle < 50 {
                    let mut got = false;
                    for p in 0..partitions {
                        let partition = (p + thread as u16) % partitions;
                        for delivery in store.pull(partition, 3).await.expect("pull") {
                            got = true;
                            log.lock().expect("log").push((
                                delivery.event.order_key.clone().unwrap_or_default(),
                                delivery.id.seq,
                            ));
                            assert!(
                                store.ack(delivery.id).await.expect("ack"),
                                "acked by someone else"
                            );
                            mine += 1;
                        }
                    }
                    if got {
                        idle = 0
                    } else {
                        idle += 1;
                        std::thread::yield_now();
                    }
                }
                mine
            })
        });
        assert_eq!(
            handled.iter().sum::<usize>(),
            EVENTS,
            "round {round}: every event handled once"
        );
        let log = log.into_inner().expect("log");
        let mut per_chat: HashMap<String, Vec<u64>> = HashMap::new();
        for (chat, seq) in log {
            per_chat.entry(chat).or_default().push(seq);
        }
        assert_eq!(per_chat, expected, "round {round}: per-chat order");
        assert_eq!(block_on(store.stats()).expect("stats").queued, 0);
    }
}

/// Random sequences of operations against the reference model in [`crate::model`].
pub fn random_operations_match_the_model<S: Store>(make: impl Fn(ManualClock) -> S) {
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&crate::model::operations(), |ops| {
        let clock = clock();
        let store = make(clock.clone());
        crate::model::check(&store, &clock, &ops);
        Ok(())
    });
    if let Err(failure) = result {
        panic!("the store disagrees with the model: {failure}");
    }
}
