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
