//! Lean hand-outs: the partition's owner hands an event out without writing a claim for its
//! key; the lease becomes a claim of its own when renewed, when its handler runs long, and
//! before the partition is handed over; a former owner cannot make one a claim, and its
//! completion still keeps the next owner from running the event again.

use std::time::{Duration, Instant};

use oncegate_contract::{block_on, event, key};
use oncegate_core::{
    Admission, Claim, DedupStore, EventQueue, FenceCheck, Lease, QueueId, RecordState, SystemClock,
};
use oncegate_redis::{RedisConfig, RedisStore};

use crate::common;

const DAY: Duration = Duration::from_secs(86_400);
const LEASE: Duration = Duration::from_secs(300);

/// A store with one partition whose ownership lapses after `ownership`.
fn store(prefix: &str, ownership: Duration) -> RedisStore {
    let config = RedisConfig {
        ownership,
        ..common::config(prefix)
    };
    RedisStore::connect_with_clock(config, SystemClock).expect("connect")
}

fn admit(store: &RedisStore, id: &str) -> QueueId {
    match block_on(store.admit(event(id, Some(id)), &[key(id)], DAY)).expect("admit") {
        Admission::Admitted { id } => id,
        other => panic!("{other:?}"),
    }
}

fn state(store: &RedisStore, id: &str) -> Option<RecordState> {
    block_on(store.record(&key(id), 0))
        .expect("record")
        .map(|record| record.state)
}

fn granted(claim: &Result<Claim, oncegate_core::StoreError>) -> Lease {
    match claim {
        Ok(Claim::Acquired(lease)) => *lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn a_hand_out_writes_no_claim_and_its_completion_marks_the_key_done() {
    let prefix = format!("lean{}", std::process::id());
    let store = store(&prefix, Duration::from_secs(10));
    let id = admit(&store, "l1");
    let out = block_on(store.pull_claimed(0, 10, LEASE)).expect("pull");
    assert_eq!(out.len(), 1);
    let lease = granted(&out[0].1);
    assert_eq!(out[0].0.id, id);
    assert_eq!(
        state(&store, "l1"),
        Some(RecordState::Pending),
        "the hand-out wrote no claim"
    );
    assert_eq!(
        block_on(store.complete_and_ack(&lease, DAY, None, id)).expect("complete"),
        FenceCheck::Accepted
    );
    assert!(matches!(
        state(&store, "l1"),
        Some(RecordState::Completed { outcome: None })
    ));
    assert!(block_on(store.pull(0, 10)).expect("pull").is_empty());
    assert_eq!(
        block_on(store.queued()).expect("queued"),
        0,
        "acked and removed"
    );
    // A second completion of the same lease meets a done key.
    assert_eq!(
        block_on(store.complete(&lease, DAY, None)).expect("complete"),
        FenceCheck::Rejected
    );
}

#[test]
fn a_lean_lease_becomes_a_claim_when_renewed_or_when_its_handler_runs_long() {
    let prefix = format!("leanlong{}", std::process::id());
    // Ownership 400 ms: a lease still out after 200 ms becomes a claim at the next round
    // (rounds come every 40 ms, on pulls).
    let store = store(&prefix, Duration::from_millis(400));
    let first = admit(&store, "r1");
    let second = admit(&store, "r2");
    let out = block_on(store.pull_claimed(0, 10, LEASE)).expect("pull");
    assert_eq!(out.len(), 2);
    let (renewed, running) = (granted(&out[0].1), granted(&out[1].1));
    assert_eq!(
        block_on(store.renew(&renewed, LEASE)).expect("renew"),
        FenceCheck::Accepted
    );
    assert!(
        matches!(state(&store, "r1"), Some(RecordState::Processing { token, .. }) if token == renewed.token),
        "{:?}",
        state(&store, "r1")
    );
    assert_eq!(state(&store, "r2"), Some(RecordState::Pending));
    let started = Instant::now();
    while state(&store, "r2") == Some(RecordState::Pending) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the running handler's lease never became a claim"
        );
        block_on(store.pull(0, 0)).expect("pull");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "became a claim after {:?}, before it ran long",
        started.elapsed()
    );
    assert!(matches!(
        state(&store, "r2"),
        Some(RecordState::Processing { token, lease_until_ms }) if token == running.token && lease_until_ms > running.until_ms - 1000
    ));
    // Both complete as claims now, and a renewal of a claim extends it as before.
    assert_eq!(
        block_on(store.renew(&running, LEASE)).expect("renew"),
        FenceCheck::Accepted
    );
    for (lease, id) in [(renewed, first), (running, second)] {
        assert_eq!(
            block_on(store.complete_and_ack(&lease, DAY, None, id)).expect("complete"),
            FenceCheck::Accepted
        );
    }
    assert!(matches!(
        state(&store, "r2"),
        Some(RecordState::Completed { .. })
    ));
}

#[test]
fn a_former_owner_cannot_renew_and_its_late_completion_keeps_the_event_from_running_again() {
    let prefix = format!("leanlost{}", std::process::id());
    let ownership = Duration::from_millis(300);
    let a = store(&prefix, ownership);
    let id = admit(&a, "x1");
    let out = block_on(a.pull_claimed(0, 10, LEASE)).expect("pull");
    let lease = granted(&out[0].1);
    // a goes silent (no pulls: no heartbeat) while its handler runs; b takes the partition
    // once a's ownership ran out, and holds a's entries back meanwhile.
    std::thread::sleep(ownership + Duration::from_millis(100));
    let b = store(&prefix, ownership);
    assert!(
        block_on(b.pull_claimed(0, 10, LEASE))
            .expect("pull")
            .is_empty()
    );
    assert_eq!(
        block_on(a.renew(&lease, LEASE)).expect("renew"),
        FenceCheck::Rejected,
        "a does not own the partition anymore"
    );
    assert_eq!(state(&a, "x1"), Some(RecordState::Pending));
    // a's handler ends: the key is marked done (nobody else ran it), the entry stays for b.
    assert_eq!(
        block_on(a.complete_and_ack(&lease, DAY, None, id)).expect("complete"),
        FenceCheck::Accepted
    );
    let started = Instant::now();
    let seen = loop {
        let out = block_on(b.pull_claimed(0, 10, LEASE)).expect("pull");
        if !out.is_empty() {
            break out;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "b never handed x1 out"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0.id, id);
    assert!(
        matches!(seen[0].1, Ok(Claim::Done { .. })),
        "{:?}",
        seen[0].1
    );
    assert!(block_on(b.ack(id)).expect("ack"));
    assert_eq!(block_on(b.queued()).expect("queued"), 0);
}
