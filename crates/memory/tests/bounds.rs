//! Memory-specific promises: the size bound, early-eviction counting, and expiry that frees.

use std::time::Duration;

use oncegate_contract::{START_MS, block_on, event, key};
use oncegate_core::{Admission, Claim, DedupStore, EventQueue, ManualClock, StoreError};
use oncegate_memory::{MemoryConfig, MemoryStore};

fn small(clock: ManualClock, max_records: u64) -> MemoryStore<ManualClock> {
    MemoryStore::with_clock(
        MemoryConfig {
            shards: 1,
            max_records,
            partitions: 1,
        },
        clock,
    )
}

#[test]
fn the_bound_holds_and_every_early_eviction_is_counted() {
    let store = small(ManualClock::new(START_MS), 100);
    block_on(async {
        for i in 0..250 {
            let id = format!("e{i}");
            let admission = store
                .admit(event(&id, None), &[key(&id)], Duration::from_secs(3600))
                .await
                .expect("admit");
            assert!(matches!(admission, Admission::Admitted { .. }));
            assert!(store.held_records() <= 100);
        }
        let stats = store.stats().await.expect("stats");
        assert_eq!(stats.evicted_early, 150);
        assert_eq!(stats.pending, 100);
        // The oldest went first: the newest are still known.
        assert!(
            store
                .record(&key("e249"), key("e249").home(store.partitions()))
                .await
                .expect("record")
                .is_some()
        );
        assert!(
            store
                .record(&key("e0"), key("e0").home(store.partitions()))
                .await
                .expect("record")
                .is_none()
        );
    });
}

#[test]
fn records_under_a_live_lease_are_never_evicted() {
    let store = small(ManualClock::new(START_MS), 10);
    block_on(async {
        let mut leases = Vec::new();
        for i in 0..10 {
            let id = format!("held{i}");
            store
                .admit(event(&id, None), &[key(&id)], Duration::from_secs(60))
                .await
                .expect("admit");
            match store
                .claim(
                    &key(&id),
                    key(&id).home(store.partitions()),
                    Duration::from_secs(600),
                )
                .await
                .expect("claim")
            {
                Claim::Acquired(lease) => leases.push(lease),
                other => panic!("{other:?}"),
            }
        }
        // Full of live leases: admission says so rather than dropping a lease.
        let refused = store
            .admit(event("new", None), &[key("new")], Duration::from_secs(60))
            .await;
        assert!(
            matches!(refused, Err(StoreError::Full { limit: 10 })),
            "{refused:?}"
        );
        for lease in &leases {
            assert!(
                store
                    .record(&lease.key, lease.partition)
                    .await
                    .expect("record")
                    .is_some()
            );
        }
        assert_eq!(store.stats().await.expect("stats").evicted_early, 0);
    });
}

#[test]
fn expiry_frees_records_without_a_full_scan() {
    let clock = ManualClock::new(START_MS);
    let store = small(clock.clone(), 1_000_000);
    block_on(async {
        for i in 0..5_000 {
            let id = format!("x{i}");
            store
                .admit(event(&id, None), &[key(&id)], Duration::from_secs(30))
                .await
                .expect("admit");
        }
        for i in 0..50 {
            let id = format!("long{i}");
            store
                .admit(event(&id, None), &[key(&id)], Duration::from_secs(3600))
                .await
                .expect("admit");
        }
        assert_eq!(store.held_records(), 5_050);
        clock.advance_ms(90_000);
        store.sweep_all();
        assert_eq!(store.held_records(), 50);
        // Operations sweep too, bit by bit.
        clock.advance_ms(3_600_000 * 3);
        for _ in 0..4 {
            let _ = store
                .record(&key("long0"), key("long0").home(store.partitions()))
                .await
                .expect("record");
        }
        assert_eq!(store.held_records(), 0);
        assert_eq!(store.stats().await.expect("stats").evicted_early, 0);
    });
}

/// A record whose forget time moves later (completed after its admission's deadline would have
/// passed, or claimed under a lease longer than its retention) is kept until the later time,
/// and freed once that passes.
#[test]
fn a_forget_time_moved_later_is_kept_then_freed() {
    let clock = ManualClock::new(START_MS);
    let store = small(clock.clone(), 1_000_000);
    let minute = Duration::from_secs(60);
    block_on(async {
        for i in 0..600 {
            let id = format!("m{i}");
            store
                .admit(event(&id, None), &[key(&id)], minute)
                .await
                .expect("admit");
        }
        clock.advance_ms(30_000);
        for i in 0..600 {
            let id = format!("m{i}");
            // Half complete now (kept until 30 s + 60 s), half stay under a 5-minute lease.
            let lease = if i % 2 == 0 { minute } else { 5 * minute };
            let Claim::Acquired(lease) = store.claim(&key(&id), 0, lease).await.expect("claim")
            else {
                panic!("{id} not acquired");
            };
            if i % 2 == 0 {
                store
                    .complete(&lease, minute, None)
                    .await
                    .expect("complete");
            }
        }
        clock.advance_ms(35_000);
        store.sweep_all();
        assert_eq!(
            store.held_records(),
            600,
            "forgotten at the admission's deadline"
        );
        clock.advance_ms(30_000);
        store.sweep_all();
        assert_eq!(
            store.held_records(),
            300,
            "completions kept past their retention"
        );
        for i in (1..600).step_by(2) {
            let id = format!("m{i}");
            let record = store.record(&key(&id), 0).await.expect("record");
            assert!(record.is_some(), "{id}'s leased record forgotten");
        }
        clock.advance_ms(5 * 60_000);
        store.sweep_all();
        assert_eq!(store.held_records(), 0, "records kept past their lease");
        assert_eq!(store.stats().await.expect("stats").evicted_early, 0);
    });
}

/// The records counted as they change (what `stats` answers, without reading a record) against
/// a census of every record: after walks of every transition from eight threads, on a store
/// small enough to evict early, as the clock passes retention and lease ends.
#[test]
fn the_counts_equal_a_census_through_walks_evictions_and_time() {
    let clock = ManualClock::new(START_MS + 17_345);
    let store = std::sync::Arc::new(MemoryStore::with_clock(
        MemoryConfig {
            shards: 4,
            max_records: 48,
            partitions: 3,
        },
        clock.clone(),
    ));
    let ids: Vec<String> = (0..80).map(|i| format!("w{i}")).collect();
    let minute_start = |now: u64| now - now % 60_000;
    let counted =
        |stats: oncegate_core::StoreStats| (stats.pending, stats.processing, stats.completed);
    let mut expired = false;
    for round in 0..12u64 {
        std::thread::scope(|scope| {
            for thread in 0..8 {
                let (store, ids) = (store.clone(), &ids);
                scope.spawn(move || {
                    oncegate_contract::walk::walk(&*store, round * 8 + thread, 200, ids);
                });
            }
        });
        let now = oncegate_core::Clock::now_ms(&clock);
        let before = counted(block_on(store.stats()).expect("stats"));
        // Counted until the minute their life ends in is over: a census from its start.
        assert_eq!(
            before,
            counted(store.census(minute_start(now) - 1)),
            "round {round}"
        );
        clock.advance_ms(fastrand::u64(0..=180_000));
        let now = oncegate_core::Clock::now_ms(&clock);
        let after = counted(block_on(store.stats()).expect("stats"));
        assert_eq!(
            after,
            counted(store.census(minute_start(now) - 1)),
            "round {round}, later"
        );
        expired |= after.0 + after.1 + after.2 < before.0 + before.1 + before.2;
    }
    assert!(expired, "some records' time ran out between rounds");
    assert!(
        block_on(store.stats()).expect("stats").evicted_early > 0,
        "the bound evicted records early"
    );
}
