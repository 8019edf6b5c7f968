//! What the Redis test files share: the test server's configuration and a plain connection.
//! Each test file compiles its own copy and uses a part of it.
#![allow(dead_code)]

use oncegate_redis::RedisConfig;

/// The test Redis (`scripts/test` starts one and sets ONCEGATE_TEST_REDIS_URL).
pub(crate) fn url() -> String {
    std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    })
}

/// A store's configuration under `prefix`, with one partition.
pub(crate) fn config(prefix: &str) -> RedisConfig {
    RedisConfig {
        prefix: prefix.to_owned(),
        partitions: 1,
        ..RedisConfig::at(&url())
    }
}

/// A plain connection to the test Redis, to look at or plant what a store reads.
pub(crate) fn plain() -> redis::Connection {
    redis::Client::open(url())
        .and_then(|c| c.get_connection())
        .expect("a plain redis connection")
}
