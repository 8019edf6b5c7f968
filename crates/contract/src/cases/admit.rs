//! Admission: marks, duplicates, several keys, retention.

use super::*;

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
        // A key named twice is one key: admitted once, then a duplicate.
        admitted(
            store
                .admit(event("e3", chat), &[key("e3"), key("e3")], DAY)
                .await
                .expect("admit"),
        );
        assert_eq!(
            store
                .admit(event("e3", chat), &[key("e3"), key("e3")], DAY)
                .await
                .expect("admit"),
            Admission::Duplicate { key_index: 0 }
        );
        assert_eq!(store.stats().await.expect("stats").queued, 3);
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
