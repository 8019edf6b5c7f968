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

/// Events queued before a restart are ranked by the rule set after it: in one partition, a
/// backlog and then a mention, reopened, hand the mention out first.
#[test]
fn a_rule_set_after_a_restart_ranks_what_was_queued_before() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("s.redb");
    let config = || EmbeddedConfig {
        partitions: 1,
        ..EmbeddedConfig::at(&path)
    };
    block_on(async {
        let store = EmbeddedStore::open(config()).expect("open");
        for id in ["backlog-1", "backlog-2", "mention-1"] {
            let admitted = store
                .admit(event(id, Some(id)), &[key(id)], Duration::from_secs(3600))
                .await
                .expect("admit");
            assert!(matches!(admitted, Admission::Admitted { .. }));
        }
    });
    block_on(async {
        let store = EmbeddedStore::open(config()).expect("reopen");
        let rule = |event: &oncegate_core::Event| event.event_id.starts_with("mention");
        store
            .put_first(std::sync::Arc::new(rule))
            .await
            .expect("rule");
        let pulled = store.pull(0, 3).await.expect("pull");
        let ids: Vec<&str> = pulled.iter().map(|d| &*d.event.event_id).collect();
        assert_eq!(ids, ["mention-1", "backlog-1", "backlog-2"]);
    });
}

/// A file that cannot be created (under a file) is refused with the path and the OS error,
/// said once even where the causes are printed too.
#[test]
fn a_file_under_a_file_is_refused_with_its_os_error_said_once() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("a-file"), "not a folder").expect("write");
    let Err(error) = EmbeddedStore::open(EmbeddedConfig::at(dir.path().join("a-file/s/s.redb")))
    else {
        panic!("a file under a file opened");
    };
    let said = oncegate_contract::printed(&error);
    assert!(said.contains("a-file"), "{said}");
    assert_eq!(said.matches("(os error").count(), 1, "{said}");
}
