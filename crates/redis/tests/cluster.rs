//! The shared store contract, run against a real three-primary Redis Cluster (`scripts/test`
//! starts one and sets ONCEGATE_TEST_REDIS_CLUSTER_URL): every script touches one slot.

use oncegate_redis::{RedisConfig, RedisStore};

fn urls() -> String {
    std::env::var("ONCEGATE_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        panic!(
            "ONCEGATE_TEST_REDIS_CLUSTER_URL is not set: run the tests with scripts/test, which \
             starts a three-node redis cluster, or start one and set \
             ONCEGATE_TEST_REDIS_CLUSTER_URL=redis://127.0.0.1:7000,redis://127.0.0.1:7001"
        )
    })
}

oncegate_contract::contract_suite!(|clock| {
    let config = RedisConfig {
        prefix: format!("test{:016x}", fastrand_u64()),
        partitions: 4,
        cluster: true,
        ..RedisConfig::at(&urls())
    };
    RedisStore::connect_with_clock(config, clock).expect("connect to the test redis cluster")
});

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// On a cluster, what spans partitions (the queue's depth, the owners) reads keys of many
/// slots: each on its own, never as one cross-slot pipeline. Two stores split the partitions.
#[test]
fn depth_and_owners_span_the_slots_and_two_stores_split_the_partitions() {
    use std::time::{Duration, Instant};

    use oncegate_contract::{block_on, event, key};
    use oncegate_core::{DedupStore, EventQueue, SystemClock};

    let prefix = format!("span{:016x}", fastrand_u64());
    let connect = || {
        let config = RedisConfig {
            prefix: prefix.clone(),
            partitions: 12,
            cluster: true,
            ownership: Duration::from_millis(500),
            ..RedisConfig::at(&urls())
        };
        RedisStore::connect_with_clock(config, SystemClock).expect("connect to the cluster")
    };
    let (a, b) = (connect(), connect());
    for n in 0..40 {
        let id = format!("span-{n}");
        block_on(a.admit(event(&id, Some(&id)), &[key(&id)], Duration::from_secs(60)))
            .expect("admit");
    }
    assert_eq!(block_on(a.queued()).expect("queued"), 40);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for store in [&a, &b] {
            for partition in 0..12 {
                block_on(store.pull(partition, 0)).expect("pull");
            }
        }
        let owners = block_on(b.owners()).expect("owners");
        assert_eq!(owners.len(), 12);
        let here = owners.iter().filter(|o| o.here).count();
        if owners.iter().all(|o| o.gateway.is_some()) && here == 6 {
            break;
        }
        assert!(Instant::now() < deadline, "no even split: {owners:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `replicas` durability on a cluster waits on the primary of the event's slot: with no replica
/// there (this test cluster has none) an admission is refused naming the count, and asking for
/// none passes; the refused event is admitted once by the retry.
#[test]
fn replicas_wait_on_the_slots_primary() {
    use std::time::Duration;

    use oncegate_contract::{block_on, event, key};
    use oncegate_core::{Admission, DedupStore, StoreError};
    use oncegate_redis::RedisDurability;

    let prefix = format!("wait{:016x}", fastrand_u64());
    let store = |min| {
        RedisStore::connect(RedisConfig {
            prefix: prefix.clone(),
            partitions: 4,
            cluster: true,
            durability: RedisDurability::Replicas {
                min,
                wait: Duration::from_millis(50),
            },
            ..RedisConfig::at(&urls())
        })
        .expect("connect to the test redis cluster")
    };
    let waiting = store(1);
    let refused = block_on(waiting.admit(event("w1", None), &[key("w1")], Duration::from_secs(60)));
    match refused {
        Err(StoreError::Unavailable(why)) => assert!(why.contains("only 0 of 1"), "{why}"),
        other => panic!("expected a refusal for want of a replica, got {other:?}"),
    }
    let none = store(0);
    let retried = block_on(none.admit(event("w1", None), &[key("w1")], Duration::from_secs(60)))
        .expect("admitted");
    assert!(
        matches!(retried, Admission::Duplicate { .. }),
        "the refused admission's write landed: the retry is its duplicate, {retried:?}"
    );
    let fresh = block_on(none.admit(event("w2", None), &[key("w2")], Duration::from_secs(60)))
        .expect("admitted");
    assert!(matches!(fresh, Admission::Admitted { .. }), "{fresh:?}");
}
