//! `stats` answers from counts the scripts keep as records change (`lua/counts.lua`), not by
//! reading records: after every kind of transition, from many threads at once, and as the
//! clock passes retention and lease ends, the counts equal a census of the records
//! (`crates/cli/tests/gateway.rs` counts what the call costs over a million keys).

use std::sync::Arc;
use std::time::Duration;

use oncegate_contract::block_on;
use oncegate_contract::walk::walk;
use oncegate_core::{DedupStore, ManualClock, StoreStats};
use oncegate_redis::{RedisConfig, RedisStore};

use crate::common;
use common::plain;

const MINUTE_MS: u64 = 60_000;
const PARTITIONS: u16 = 3;

fn store(prefix: &str, clock: ManualClock) -> RedisStore<ManualClock> {
    let config = RedisConfig {
        prefix: prefix.to_owned(),
        partitions: PARTITIONS,
        // The test's clock jumps by minutes: ownership must outlive every jump.
        ownership: Duration::from_secs(86_400),
        ..RedisConfig::at(&common::url())
    };
    RedisStore::connect_with_clock(config, clock).expect("connect")
}

fn prefix(test: &str) -> String {
    format!("cnt{test}{}", std::process::id())
}

/// (pending, processing, completed) by reading every record key of `prefix`, each counted
/// while its life (its retention end; a held one's lease end if later) ends at or after the
/// start of the current minute: the counts' stated rule.
fn census(prefix: &str, now_ms: u64) -> (u64, u64, u64) {
    let mut redis = plain();
    let pattern = format!("{{{prefix}:*}}:r:*");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query(&mut redis)
        .expect("keys");
    let since = now_ms - now_ms % MINUTE_MS;
    let mut counts = (0, 0, 0);
    for name in keys {
        let Some(raw): Option<Vec<u8>> = redis::cmd("GET").arg(&name).query(&mut redis).ok() else {
            continue;
        };
        let text = String::from_utf8_lossy(&raw);
        let mut fields = text[1..].splitn(4, ',');
        let number = |field: Option<&str>| field.and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        let retained = number(fields.next());
        let _token = fields.next();
        let lease = number(fields.next());
        let end = if raw[0] == b'r' {
            retained.max(lease)
        } else {
            retained
        };
        if end >= since {
            match raw[0] {
                b'p' => counts.0 += 1,
                b'r' => counts.1 += 1,
                b'c' => counts.2 += 1,
                other => panic!("a record of state {other}"),
            }
        }
    }
    counts
}

fn counted(stats: &StoreStats) -> (u64, u64, u64) {
    (stats.pending, stats.processing, stats.completed)
}

/// Eight threads walk over shared keys; between rounds the clock moves by up to three minutes
/// (ending retentions and leases), and the counts equal the census every time.
#[test]
fn the_counts_follow_every_transition_from_many_threads_as_time_passes() {
    let prefix = prefix("walk");
    let clock = ManualClock::new(oncegate_contract::START_MS + 17_345);
    let store = Arc::new(store(&prefix, clock.clone()));
    let ids: Vec<String> = (0..40).map(|i| format!("w{i}")).collect();
    let ids = Arc::new(ids);
    let mut seen_expired = false;
    for round in 0..12u64 {
        std::thread::scope(|scope| {
            for thread in 0..8 {
                let (store, ids) = (store.clone(), ids.clone());
                scope.spawn(move || walk(&*store, round * 8 + thread, 150, &ids));
            }
        });
        let stats = block_on(store.stats()).expect("stats");
        let now = oncegate_core::Clock::now_ms(&clock);
        assert_eq!(
            counted(&stats),
            census(&prefix, now),
            "round {round} at {now}"
        );
        let before = counted(&stats);
        clock.advance_ms(fastrand::u64(0..=180_000));
        let after = counted(&block_on(store.stats()).expect("stats"));
        let now = oncegate_core::Clock::now_ms(&clock);
        assert_eq!(
            after,
            census(&prefix, now),
            "round {round}, later, at {now}"
        );
        seen_expired |= after.0 + after.1 + after.2 < before.0 + before.1 + before.2;
    }
    assert!(seen_expired, "some records' time ran out between rounds");
}

/// Admissions are counted by the gateway that made them and written about once a second: a
/// second gateway sees them within seconds without the first being asked, and a record taken
/// out before its admission was written (claimed at once) is counted once, not twice.
#[test]
fn what_one_gateway_admits_reaches_another_gateways_counts_within_seconds() {
    let prefix = prefix("two");
    let clock = ManualClock::new(oncegate_contract::START_MS + 5_000);
    let (one, two) = (store(&prefix, clock.clone()), store(&prefix, clock.clone()));
    let ids: Vec<String> = (0..30).map(|i| format!("t{i}")).collect();
    block_on(async {
        for id in &ids {
            let admitted = one
                .admit(
                    oncegate_contract::event(id, Some(id)),
                    &[oncegate_contract::key(id)],
                    Duration::from_secs(3600),
                )
                .await
                .expect("admit");
            assert!(matches!(
                admitted,
                oncegate_core::Admission::Admitted { .. }
            ));
        }
        // One of them claimed and done at once, by the other gateway.
        let k = oncegate_contract::key(&ids[0]);
        let partition = oncegate_core::event::partition_of(
            oncegate_contract::event(&ids[0], Some(&ids[0])).order_hash(),
            PARTITIONS,
        );
        let oncegate_core::Claim::Acquired(lease) = two
            .claim(&k, partition, Duration::from_secs(30))
            .await
            .expect("claim")
        else {
            panic!("claimable")
        };
        two.complete(&lease, Duration::from_secs(3600), None)
            .await
            .expect("complete");
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = counted(&block_on(two.stats()).expect("stats"));
        if seen == (29, 0, 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the second gateway still counts {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let now = oncegate_core::Clock::now_ms(&clock);
    assert_eq!(
        counted(&block_on(one.stats()).expect("stats")),
        census(&prefix, now)
    );
}
