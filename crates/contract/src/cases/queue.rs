//! The queue: order per key, retries, dead letters, unknown ids.

use super::*;

/// Events come out in queue order; an event waits while an earlier one of its order key is out.
pub fn queue_hands_out_in_order_per_key<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        // Everything in one partition: the same chat.
        let ids: Vec<_> = admit_in_order(&store, &["a1", "a2", "a3"], Some("chat-a")).await;
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
        assert_eq!(&*third[0].event.event_id, "a3");
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

/// A retried event is not handed out before its time, comes back with the next attempt number,
/// and holds back later events of its order key meanwhile.
pub fn queue_retry_waits_and_counts_attempts<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        let ids = admit_in_order(&store, &["r1", "r2"], Some("chat-r")).await;
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
        let ids = admit_in_order(&store, &["d1", "d2"], Some("chat-d")).await;
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
        assert_eq!(&*dead[0].event.event_id, "d1");
        assert_eq!(dead[0].attempts, 2);
        assert_eq!(dead[0].reason, "downstream answered 422: bad payload");
        assert_eq!(store.dead_letter_count().await.expect("count"), 1);
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

/// A dead letter replayed goes back to the end of its queue once, with its key and event and
/// attempts from 0, and its record can be claimed again; a purged one is gone for good.
pub fn dead_letters_replay_once_and_purge<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        let ids = admit_in_order(&store, &["r1", "r2"], Some("chat-r")).await;
        let partition = ids[0].partition;
        let out = store.pull(partition, 10).await.expect("pull");
        assert_eq!(out.len(), 1);
        let lease = lease_of(
            store
                .claim(&out[0].key, partition, LEASE)
                .await
                .expect("claim"),
        );
        assert_eq!(
            store.release(&lease).await.expect("release"),
            FenceCheck::Accepted
        );
        assert!(store.dead_letter(ids[0], "gave up").await.expect("dead"));
        let replayed = store
            .replay_dead_letter(ids[0])
            .await
            .expect("replay")
            .expect("a dead letter to replay");
        assert_eq!(replayed.partition, partition);
        assert_ne!(replayed, ids[0], "a new place at the end of the queue");
        assert_eq!(
            store
                .replay_dead_letter(ids[0])
                .await
                .expect("replay twice"),
            None,
            "replayed once"
        );
        assert!(!store.purge_dead_letter(ids[0]).await.expect("purge"));
        assert!(store.dead_letters(10).await.expect("list").is_empty());
        assert_eq!(store.dead_letter_count().await.expect("count"), 0);
        // r2 was queued before the replayed r1: the chat's order is the queue's.
        let next = store.pull(partition, 10).await.expect("pull");
        assert_eq!(next.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[1]]);
        assert!(store.ack(ids[1]).await.expect("ack"));
        let again = store.pull(partition, 10).await.expect("pull");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].id, replayed);
        assert_eq!(&*again[0].event.event_id, "r1");
        assert_eq!(again[0].key, out[0].key, "the same key");
        assert_eq!(again[0].attempt, 0, "attempts start again");
        let _lease = lease_of(
            store
                .claim(&again[0].key, partition, LEASE)
                .await
                .expect("claim"),
        );
        assert!(
            store
                .dead_letter(replayed, "still broken")
                .await
                .expect("dead")
        );
        let dead = store.dead_letters(10).await.expect("list");
        assert_eq!(dead.len(), 1);
        assert_eq!((dead[0].id, dead[0].attempts), (replayed, 1));
        assert_eq!(store.dead_letter_count().await.expect("count"), 1);
        assert!(store.purge_dead_letter(replayed).await.expect("purge"));
        assert_eq!(store.dead_letter_count().await.expect("count"), 0);
        assert!(
            !store
                .purge_dead_letter(replayed)
                .await
                .expect("purge twice")
        );
        assert_eq!(
            store.replay_dead_letter(replayed).await.expect("replay"),
            None
        );
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.dead_letters, stats.queued), (0, 0));
        // An id that names another partition is no dead letter.
        let elsewhere = oncegate_core::QueueId {
            partition: partition.wrapping_add(1) % store.partitions(),
            seq: replayed.seq,
        };
        if elsewhere != replayed {
            assert_eq!(
                store.replay_dead_letter(elsewhere).await.expect("replay"),
                None
            );
        }
    });
}

/// A hand-out with claims: each event comes with its key's claim, as `claim` would answer it —
/// granted for a free key, in flight for a held one, done for a completed one.
pub fn pull_claimed_claims_every_hand_out<S: Store>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        // Three chats of one partition.
        let ids: Vec<(oncegate_core::QueueId, String)> = in_one_partition(&store, 3, |_, chat| {
            let id = format!("pc{chat}");
            let event = event(&id, Some(&format!("chat-{chat}")));
            (id, event)
        })
        .await
        .into_iter()
        .map(|(queued, id, _)| (queued, id))
        .collect();
        let partition = ids[0].0.partition;
        let held = lease_of(
            store
                .claim(&key(&ids[1].1), partition, LEASE)
                .await
                .expect("claim"),
        );
        let done = lease_of(
            store
                .claim(&key(&ids[2].1), partition, LEASE)
                .await
                .expect("claim"),
        );
        assert_eq!(
            store.complete(&done, DAY, None).await.expect("complete"),
            FenceCheck::Accepted
        );
        let pulled = store
            .pull_claimed(partition, 10, LEASE)
            .await
            .expect("pull claimed");
        assert_eq!(
            pulled.iter().map(|(d, _)| d.id).collect::<Vec<_>>(),
            ids.iter().map(|(id, _)| *id).collect::<Vec<_>>()
        );
        let mut claims = pulled
            .into_iter()
            .map(|(d, claim)| (d, claim.expect("a claim")));
        let (first, claim) = claims.next().expect("the first");
        let lease = lease_of(claim);
        assert_eq!((lease.key, lease.partition), (first.key, partition));
        assert_eq!(lease.until_ms, START_MS + LEASE.as_millis() as u64);
        assert!(matches!(
            claims.next(),
            Some((_, Claim::InFlight { until_ms })) if until_ms == held.until_ms
        ));
        assert!(matches!(
            claims.next(),
            Some((_, Claim::Done { outcome: None }))
        ));
        assert_eq!(
            store
                .complete_and_ack(&lease, DAY, None, first.id)
                .await
                .expect("complete and ack"),
            FenceCheck::Accepted
        );
        assert!(
            store
                .pull_claimed(partition, 10, LEASE)
                .await
                .expect("pull claimed")
                .is_empty(),
            "the other two are still out"
        );
    });
}
