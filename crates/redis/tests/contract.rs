//! The shared store contract, run against a real `redis-server` (`scripts/test` starts one and
//! sets ONCEGATE_TEST_REDIS_URL).

use oncegate_redis::{RedisConfig, RedisStore};

fn url() -> String {
    std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "ONCEGATE_TEST_REDIS_URL is not set: run the tests with scripts/test, which installs \
             and starts redis-server, or start one and set ONCEGATE_TEST_REDIS_URL=redis://127.0.0.1:6379"
        )
    })
}

oncegate_contract::contract_suite!(|clock| {
    // Each store gets keys of its own, so that cases never see each other's records.
    let config = RedisConfig {
        prefix: format!("test{:016x}", fastrand_u64()),
        partitions: 4,
        ..RedisConfig::at(&url())
    };
    RedisStore::connect_with_clock(config, clock).expect("connect to the test redis")
});

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

mod state {
    use super::*;

    oncegate_contract::state_suite!(|clock| {
        let config = RedisConfig {
            prefix: format!("state{:016x}", fastrand_u64()),
            partitions: 4,
            ..RedisConfig::at(&url())
        };
        RedisStore::connect_with_clock(config, clock).expect("connect to the test redis")
    });
}
