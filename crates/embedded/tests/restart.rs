//! What a restart of the embedded store changes: leases of the previous run are over at once,
//! tokens keep growing, and nothing admitted is forgotten.

use std::time::Duration;

use oncegate_contract::{block_on, event, key};
use oncegate_core::{Admission, Claim, DedupStore, EventQueue, FenceCheck};
use oncegate_embedded::{EmbeddedConfig, EmbeddedStore};

#[test]
fn a_restart_ends_the_previous_runs_leases_and_keeps_tokens_growing() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("s.redb");
    let (old_lease, done_lease) = block_on(async {
        let store = EmbeddedStore::open(EmbeddedConfig::at(&path)).expect("open");
        for id in ["held", "done"] {
            // Two chats, so that both can be handed out at once.
            let admitted = store
                .admit(event(id, Some(id)), &[key(id)], Duration::from_secs(3600))
                .await
                .expect("admit");
            assert!(matches!(admitted, Admission::Admitted { .. }));
        }
        let Claim::Acquired(held) = store
            .claim(
                &key("held"),
                event("held", Some("held")).partition(store.partitions()),
                Duration::from_secs(3600),
            )
            .await
            .expect("claim")
        else {
            panic!("claim")
        };
        let Claim::Acquired(done) = store
            .claim(
                &key("done"),
                event("done", Some("done")).partition(store.partitions()),
                Duration::from_secs(3600),
            )
            .await
            .expect("claim")
        else {
            panic!("claim")
        };
        assert_eq!(
            store
                .complete(&done, Duration::from_secs(3600), None)
                .await
                .expect("complete"),
            FenceCheck::Accepted
        );
        (held, done)
    });
    block_on(async {
        let store = EmbeddedStore::open(EmbeddedConfig::at(&path)).expect("reopen");
        // The hour-long lease of the dead run does not block the key: it is taken over.
        let Claim::TookOver(new) = store
            .claim(
                &key("held"),
                event("held", Some("held")).partition(store.partitions()),
                Duration::from_secs(60),
            )
            .await
            .expect("claim")
        else {
            panic!("the previous run's lease should be over");
        };
        assert!(new.token > old_lease.token);
        assert_eq!(new.token.run(), old_lease.token.run() + 1);
        // The dead holder is fenced off.
        assert_eq!(
            store
                .complete(&old_lease, Duration::from_secs(60), None)
                .await
                .expect("complete"),
            FenceCheck::Rejected
        );
        // Completed stays completed; both events are still queued (none was acked).
        assert_eq!(
            store
                .claim(
                    &key("done"),
                    event("done", Some("done")).partition(store.partitions()),
                    Duration::from_secs(60)
                )
                .await
                .expect("claim"),
            Claim::Done { outcome: None }
        );
        assert!(done_lease.token < new.token);
        let mut queued = 0;
        for partition in 0..store.partitions() {
            queued += store.pull(partition, 10).await.expect("pull").len();
        }
        assert_eq!(queued, 2);
    });
}
