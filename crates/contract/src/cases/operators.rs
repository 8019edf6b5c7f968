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
