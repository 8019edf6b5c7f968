//! Watermarks, and the look-ups and counts operators read.

use super::*;

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

/// Each partition's summary and listing show what is queued: depth, bytes, the oldest event,
/// who is handed out or delayed, in queue order from any seq; an unknown partition is refused.
pub fn queue_summaries_and_listings_show_each_partition<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        for partition in 0..store.partitions() {
            let empty = store.queue_summary(partition).await.expect("summary");
            assert_eq!(
                (empty.partition, empty.events, empty.handed_out, empty.bytes),
                (partition, 0, 0, 0)
            );
            assert_eq!(empty.oldest_created_ms, None);
        }
        let names = ["q1", "q2", "q3"];
        let mut ids = Vec::new();
        for (age, name) in names.iter().enumerate() {
            let mut queued = event(name, Some("chat-q"));
            queued.created_at_ms = START_MS - 1000 * (3 - age as u64);
            ids.push(admitted(
                store.admit(queued, &[key(name)], DAY).await.expect("admit"),
            ));
        }
        let partition = ids[0].partition;
        let payloads: u64 = names
            .iter()
            .map(|name| event(name, None).payload.len() as u64)
            .sum();
        let summary = store.queue_summary(partition).await.expect("summary");
        assert_eq!((summary.events, summary.handed_out), (3, 0));
        assert!(summary.bytes >= payloads, "{} bytes", summary.bytes);
        assert_eq!(summary.oldest_created_ms, Some(START_MS - 3000));
        for other in (0..store.partitions()).filter(|p| *p != partition) {
            assert_eq!(store.queue_summary(other).await.expect("summary").events, 0);
        }

        let out = store.pull(partition, 10).await.expect("pull");
        assert_eq!(out.len(), 1);
        let summary = store.queue_summary(partition).await.expect("summary");
        assert_eq!((summary.events, summary.handed_out), (3, 1));
        let listed = store
            .queued_events(partition, None, 10)
            .await
            .expect("list");
        assert_eq!(
            listed
                .iter()
                .map(|q| (q.id, &*q.event.event_id, q.state))
                .collect::<Vec<_>>(),
            vec![
                (ids[0], "q1", QueuedState::HandedOut),
                (ids[1], "q2", QueuedState::Waiting),
                (ids[2], "q3", QueuedState::Waiting),
            ]
        );
        assert_eq!(listed[0].key, key("q1"));
        let later = START_MS + 60_000;
        assert!(store.retry(ids[0], later).await.expect("retry"));
        let listed = store.queued_events(partition, None, 1).await.expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].state, QueuedState::Delayed { until_ms: later });
        assert_eq!(listed[0].attempt, 1);
        let rest = store
            .queued_events(partition, Some(ids[0].seq), 10)
            .await
            .expect("list after");
        assert_eq!(
            rest.iter().map(|q| q.id).collect::<Vec<_>>(),
            vec![ids[1], ids[2]]
        );
        assert!(
            store
                .queued_events(partition, Some(ids[2].seq), 10)
                .await
                .expect("list past the end")
                .is_empty()
        );

        clock.advance_ms(61_000);
        let out = store.pull(partition, 10).await.expect("pull");
        assert_eq!(out.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[0]]);
        assert!(store.ack(ids[0]).await.expect("ack"));
        let summary = store.queue_summary(partition).await.expect("summary");
        assert_eq!((summary.events, summary.handed_out), (2, 0));
        assert_eq!(summary.oldest_created_ms, Some(START_MS - 2000));

        let beyond = store.partitions();
        assert!(matches!(
            store.queue_summary(beyond).await,
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            store.queued_events(beyond, None, 10).await,
            Err(StoreError::Invalid(_))
        ));
    });
}
