//! The protocol on Redis, shared by instances: the `redis_once` example runs here (two stores
//! on the test Redis, many callers each), and more racing rounds with cancellations.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{EventQueue, KeyHash};
use oncegate_once::{Once, OnceKey, Outcome};
use oncegate_redis::{RedisConfig, RedisStore};

#[path = "../examples/redis_once.rs"]
mod example;

fn url() -> String {
    std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_example_charges_each_order_once_across_two_instances() {
    let (charges, orders) = example::run(&url(), &format!("onceex{}", std::process::id()))
        .await
        .expect("the example runs");
    assert_eq!(charges, orders);
}

/// The example without a Redis (a closed loopback port): one sentence naming the URL and the
/// variable to set — not a `Debug` dump of the error. (What its binary prints on stderr before
/// exiting 1; the binary itself is not built by `cargo test --all-targets`, which compiles
/// examples as tests.)
#[tokio::test]
async fn the_example_without_a_redis_says_what_to_set() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redis://127.0.0.1:{closed}");
    let words = example::report(&url, "onceexclosed")
        .await
        .expect_err("no Redis listens there");
    assert!(
        words.contains(&format!("cannot connect to {url}")),
        "{words}"
    );
    assert!(words.contains("ONCEGATE_REDIS_URL="), "{words}");
    assert!(!words.contains("Connect {"), "a Debug dump: {words}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_on_two_instances_cancelled_at_random_never_run_a_key_twice() {
    let config = RedisConfig {
        prefix: format!("oncerace{}", std::process::id()),
        ..RedisConfig::at(&url())
    };
    let mut instances: Vec<Once<RedisStore>> = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect_async(config.clone())
            .await
            .expect("connect");
        instances.push(Once::new(Arc::new(store)).with_lease(Duration::from_secs(5)));
    }
    let partitions = instances[0].store().partitions();
    for round in 0..20 {
        let key = KeyHash::of(&["race", &round.to_string()]);
        let key = OnceKey::new(key, key.home(partitions));
        let runners = Arc::new(Mutex::new(Vec::new()));
        let mut callers = Vec::new();
        for i in 0..8 {
            let (once, runners) = (instances[i % 2].clone(), runners.clone());
            callers.push(tokio::spawn(async move {
                once.run(key, Duration::from_secs(20), |_| async move {
                    runners.lock().expect("runners").push(i);
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(5..40))).await;
                    Ok::<_, String>(Some(Bytes::from_static(b"ok")))
                })
                .await
            }));
        }
        // Some callers are cancelled mid-way (a client that hung up): whoever held the key
        // then gives it back, and another caller runs the work — still once in all.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..20))).await;
        let cancelled = fastrand::usize(0..8);
        callers[cancelled].abort();
        let mut ran = 0;
        // The abort may land after the caller finished: then it was not cancelled at all.
        let mut was_cancelled = false;
        for (i, caller) in callers.into_iter().enumerate() {
            match caller.await {
                Ok(Ok(Outcome::Ran(_))) => ran += 1,
                Ok(Ok(Outcome::Done(Some(result)))) => assert_eq!(&result[..], b"ok"),
                Err(join) if i == cancelled && join.is_cancelled() => was_cancelled = true,
                other => panic!("round {round}: caller {i}: {other:?}"),
            }
        }
        // A caller cancelled while it ran the work gave the key back: the work ran a second
        // time, by a caller that then recorded it. Nothing else runs twice. The abort can also
        // land after the cancelled caller recorded its result but before its task returned:
        // then every other caller sees it done, and no one reports `Ran`.
        let runners = runners.lock().expect("runners").clone();
        let others: Vec<_> = runners
            .iter()
            .filter(|&&i| !(was_cancelled && i == cancelled))
            .collect();
        assert_eq!(
            others.len(),
            ran,
            "round {round}: ran by {runners:?}, {cancelled} cancelled, {ran} reported Ran"
        );
        match ran {
            1 => {}
            0 => assert!(
                was_cancelled && runners.contains(&cancelled),
                "round {round}: no caller ran the work, yet all saw it done: {runners:?}"
            ),
            _ => panic!("round {round}: {ran} callers ran the work: {runners:?}"),
        }
    }
}
