//! A call waiting for its partition's next script keeps its own deadline, however many
//! scripts are queued before it. (A file of its own: it pauses the test Redis for every client.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncegate_contract::key;
use oncegate_core::{DedupStore, StoreError, SystemClock};
use oncegate_redis::{RedisConfig, RedisStore};

mod common;
use common::plain;

#[test]
fn calls_behind_a_stuck_script_give_up_within_their_own_deadline() {
    const CALLS: usize = 400;
    let prefix = format!("deadline{}", std::process::id());
    let config = RedisConfig {
        timeout: Duration::from_millis(200),
        ..common::config(&prefix)
    };
    let store = Arc::new(RedisStore::connect_with_clock(config, SystemClock).expect("connect"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Scripts (writes) wait while Redis is paused: the first claim script is stuck on its way
    // and the other claims queue behind it, more than one script holds.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("WRITE")
        .query(&mut plain())
        .expect("client pause");
    let started = Instant::now();
    let answers = runtime.block_on(async {
        let tasks: Vec<_> = (0..CALLS)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let answer = store
                        .claim(&key(&format!("d{i}")), 0, Duration::from_secs(30))
                        .await;
                    (answer, started.elapsed())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("task"));
        }
        answers
    });
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut plain())
        .expect("client unpause");
    for (answer, after) in answers {
        assert!(
            matches!(answer, Err(StoreError::Unavailable(_))),
            "{answer:?}"
        );
        // Twice the call timeout, and slack for a loaded machine: not one queued script's
        // timeout after another.
        assert!(
            after < Duration::from_millis(1000),
            "a call answered after {after:?}, beyond its deadline"
        );
    }
}
