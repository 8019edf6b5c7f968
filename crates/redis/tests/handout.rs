//! A pull hands out the chats whose next event it holds already without reading the stream
//! first; what arrived meanwhile comes with a later pull, and a chat's events still go out one
//! at a time, in order.

use std::time::Duration;

use oncegate_contract::{block_on, event, key};
use oncegate_core::{Admission, Claim, DedupStore, EventQueue, FenceCheck, SystemClock};
use oncegate_redis::RedisStore;

use crate::common;

const DAY: Duration = Duration::from_secs(86_400);

#[test]
fn held_chats_go_out_in_order_and_nothing_is_left_behind() {
    let prefix = format!("handout{}", std::process::id());
    let store =
        RedisStore::connect_with_clock(common::config(&prefix), SystemClock).expect("connect");
    block_on(async {
        let admit = |id: &'static str, chat: &'static str| {
            let store = &store;
            async move {
                let admitted = store
                    .admit(event(id, Some(chat)), &[key(id)], DAY)
                    .await
                    .expect("admit");
                assert!(
                    matches!(admitted, Admission::Admitted { .. }),
                    "{admitted:?}"
                );
            }
        };
        admit("a1", "a").await;
        admit("a2", "a").await;
        admit("b1", "b").await;
        let first = store.pull(0, 10).await.expect("pull");
        let ids = |pulled: &[oncegate_core::Delivery]| -> Vec<String> {
            pulled
                .iter()
                .map(|d| d.event.event_id.to_string())
                .collect()
        };
        assert_eq!(ids(&first), ["a1", "b1"], "a2 waits behind a1");
        assert!(
            store.pull(0, 10).await.expect("pull").is_empty(),
            "a1 is out"
        );
        let a1 = &first[0];
        let Claim::Acquired(lease) = store.claim(&a1.key, 0, DAY).await.expect("claim") else {
            panic!("a1 was not granted");
        };
        let fence = store
            .complete_and_ack(&lease, DAY, None, a1.id)
            .await
            .expect("complete");
        assert_eq!(fence, FenceCheck::Accepted);
        admit("c1", "c").await;
        // a2 is held here: it goes out now; c1 with this pull or the next.
        let mut handed = ids(&store.pull(0, 10).await.expect("pull"));
        assert_eq!(handed.first().map(String::as_str), Some("a2"), "{handed:?}");
        handed.extend(ids(&store.pull(0, 10).await.expect("pull")));
        handed.sort();
        assert_eq!(handed, ["a2", "c1"], "each once, nothing left behind");
        assert!(store.pull(0, 10).await.expect("pull").is_empty());
    });
}
