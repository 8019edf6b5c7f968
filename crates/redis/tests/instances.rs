//! Several stores on one Redis: one owner per partition, and a takeover that hands out again
//! what the old owner had not acked.

use std::time::Duration;

use oncegate_contract::{block_on, event, key};
use oncegate_core::{
    Admission, Claim, DedupStore, EventQueue, FenceCheck, Nonce, SystemClock, key_for,
};
use oncegate_redis::{RedisConfig, RedisStore};

mod common;
use common::plain;

/// A store's configuration on the test Redis: one partition, ownership that lapses quickly.
fn config(prefix: &str) -> RedisConfig {
    RedisConfig {
        ownership: Duration::from_millis(300),
        ..common::config(prefix)
    }
}

/// The consumers of a partition stream's group: (name, pending entries).
fn consumers(redis: &mut redis::Connection, stream: &str) -> Vec<(String, u64)> {
    let info: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg("oncegate")
        .query(redis)
        .expect("xinfo");
    info.iter()
        .map(|c| {
            let name: String = redis::from_redis_value_ref(&c["name"]).expect("consumer name");
            let pending: u64 =
                redis::from_redis_value_ref(&c["pending"]).expect("consumer pending");
            (name, pending)
        })
        .collect()
}

#[test]
fn one_owner_per_partition_and_a_takeover_after_silence() {
    let prefix = format!("own{}", std::process::id());
    let a = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect a");
    let b = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect b");
    block_on(async {
        for id in ["o1", "o2"] {
            let admitted = a
                .admit(event(id, Some(id)), &[key(id)], Duration::from_secs(60))
                .await
                .expect("admit");
            assert!(matches!(admitted, Admission::Admitted { .. }));
        }
        // Admitted through a, handed out by whoever owns the partition: a pulls first.
        let from_a = a.pull(0, 10).await.expect("pull a");
        assert_eq!(from_a.len(), 2);
        assert!(
            b.pull(0, 10).await.expect("pull b").is_empty(),
            "b does not own the partition"
        );
        let Claim::Acquired(lease) = a
            .claim(
                &from_a[0].key,
                from_a[0].id.partition,
                Duration::from_secs(60),
            )
            .await
            .expect("claim")
        else {
            panic!("claim")
        };
        a.complete(&lease, Duration::from_secs(60), None)
            .await
            .expect("complete");
        assert!(a.ack(from_a[0].id).await.expect("ack"));
        // a goes quiet; after the ownership runs out b takes over, and hands out what a had
        // handed out but not acked once a's lean hand-outs can no longer be running: the
        // ownership time after a's ran out.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            b.pull(0, 10).await.expect("pull b").is_empty(),
            "a's entries wait while a may still run them"
        );
        let waited = std::time::Instant::now();
        let from_b = loop {
            let out = b.pull(0, 10).await.expect("pull b");
            if !out.is_empty() || waited.elapsed() > Duration::from_secs(2) {
                break out;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            waited.elapsed() >= Duration::from_millis(100),
            "{:?}",
            waited.elapsed()
        );
        assert_eq!(
            from_b
                .iter()
                .map(|d| &*d.event.event_id)
                .collect::<Vec<_>>(),
            vec!["o2"]
        );
        assert!(
            a.pull(0, 10).await.expect("pull a").is_empty(),
            "a lost the partition"
        );
        assert!(
            !a.ack(from_a[1].id).await.expect("ack"),
            "a forgot what it had handed out"
        );
        // In the consumer group: b now holds the one unacked entry; a, holding nothing, is
        // gone from the group.
        let mut redis = plain();
        let stream = format!("{{{prefix}:0}}:q");
        let held = consumers(&mut redis, &stream);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].1, 1, "{held:?}");
        assert!(b.ack(from_b[0].id).await.expect("ack"));
        let pending: (u64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
            .arg(&stream)
            .arg("oncegate")
            .query(&mut redis)
            .expect("xpending");
        assert_eq!(pending.0, 0, "acked entries leave the group's pending list");
        let length: u64 = redis::cmd("XLEN")
            .arg(&stream)
            .query(&mut redis)
            .expect("xlen");
        assert_eq!(length, 0, "acked entries are trimmed from the stream");
    });
}

#[test]
fn a_nonce_handled_by_one_gateway_is_a_replay_at_another() {
    let prefix = format!("nonce{}", std::process::id());
    let a = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect a");
    let b = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect b");
    // Event `id` (all in one chat) sent with nonce `n`, remembered for `window_ms`. Nonces are
    // kept per signed second, as long as the window of the last one kept: the short windows
    // get a second of their own, as a gateway's window is the same for every request.
    let send = |store: &RedisStore, id: &str, n: &str, window_ms: u64| {
        let nonce = Nonce {
            key: key_for("feishu", "cli_nonce", "nonce", n),
            window_ms,
            timestamp_secs: 1_764_000_000 + u64::from(window_ms < 1_000),
        };
        block_on(store.admit_with_nonce(
            event(id, Some("c")),
            &[key(id)],
            Duration::from_secs(86_400),
            Some(nonce),
        ))
        .expect("admit")
    };
    let first = send(&a, "n1", "x", 60_000);
    assert!(matches!(first, Admission::Admitted { .. }), "{first:?}");
    // The same request again, at the other gateway.
    assert_eq!(send(&b, "n1", "x", 60_000), Admission::Replayed);
    // A platform retry (new nonce) is a duplicate, and its nonce is remembered too.
    assert_eq!(
        send(&b, "n1", "y", 300),
        Admission::Duplicate { key_index: 0 }
    );
    assert_eq!(send(&a, "n1", "y", 300), Admission::Replayed);
    // After its window the nonce is forgotten; the event is still a duplicate.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        send(&a, "n1", "y", 300),
        Admission::Duplicate { key_index: 0 }
    );
    // A refused replay remembered nothing: a new event under a replayed nonce is refused,
    // and the event stays unseen.
    assert_eq!(send(&a, "n2", "x", 60_000), Admission::Replayed);
    let fresh = block_on(a.admit(
        event("n2", Some("c")),
        &[key("n2")],
        Duration::from_secs(86_400),
    ))
    .expect("admit");
    assert!(matches!(fresh, Admission::Admitted { .. }), "{fresh:?}");
    // An admission that fails remembers no nonce: the request's repeat (how WeCom retries) is
    // admitted once the store can admit it, not refused as a replay.
    let mut redis = plain();
    let record = format!("{{{prefix}:0}}:r:{}", key("n3"));
    let _: () = redis::cmd("SET")
        .arg(&record)
        .arg("not a record")
        .query(&mut redis)
        .expect("set");
    let failed = block_on(a.admit_with_nonce(
        event("n3", Some("c")),
        &[key("n3")],
        Duration::from_secs(86_400),
        Some(Nonce {
            key: key_for("feishu", "cli_nonce", "nonce", "z"),
            window_ms: 60_000,
            timestamp_secs: 1_764_000_000,
        }),
    ));
    assert!(
        failed.is_err(),
        "a corrupt record fails the admit: {failed:?}"
    );
    let _: () = redis::cmd("DEL")
        .arg(&record)
        .query(&mut redis)
        .expect("del");
    let repeated = send(&b, "n3", "z", 60_000);
    assert!(
        matches!(repeated, Admission::Admitted { .. }),
        "the repeat of a failed admission is admitted: {repeated:?}"
    );
    assert_eq!(send(&a, "n3", "z", 60_000), Admission::Replayed);
}

#[test]
fn tokens_keep_growing_when_the_counter_is_lost() {
    // What a failover that lost the last writes, or a restart without persistence, does to a
    // token counter: it is gone or behind. Tokens must still never repeat or go back.
    let prefix = format!("tokens{}", std::process::id());
    let store = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect");
    let mut redis = plain();
    let counter = format!("{{{prefix}:0}}:token");
    let lease = |name: &str| {
        let k = key_for("feishu", "cli_tokens", "business", name);
        match block_on(store.claim(&k, 0, Duration::from_secs(60))).expect("claim") {
            Claim::Acquired(lease) => lease.token,
            other => panic!("{other:?}"),
        }
    };
    let mut last = lease("t0");
    for round in 1..20 {
        if round % 2 == 0 {
            let _: () = redis::cmd("DEL")
                .arg(&counter)
                .query(&mut redis)
                .expect("del");
        } else {
            // Behind: as if the last increments never reached the new primary.
            let _: () = redis::cmd("SET")
                .arg(&counter)
                .arg(last.0 / 2)
                .query(&mut redis)
                .expect("set");
        }
        let token = lease(&format!("t{round}"));
        assert!(token > last, "round {round}: {token:?} after {last:?}");
        last = token;
    }
}

#[test]
fn a_lazy_store_starts_without_redis_and_checks_partitions_on_first_contact() {
    // Nothing listens on this port: an eager store refuses to start, a lazy one starts and
    // answers every call with "unavailable" until Redis is there.
    let dead = RedisConfig {
        lazy: true,
        ..RedisConfig::at("redis://127.0.0.1:1")
    };
    assert!(
        RedisStore::connect(RedisConfig {
            lazy: false,
            ..dead.clone()
        })
        .is_err()
    );
    let store = RedisStore::connect(dead).expect("a lazy store starts without redis");
    let ping = block_on(store.ping());
    assert!(
        matches!(ping, Err(oncegate_core::StoreError::Unavailable(_))),
        "{ping:?}"
    );
    // A prefix made with one partition, then a lazy gateway configured with two: nothing is
    // admitted, and the error says what to set.
    let prefix = format!("lazy{}", std::process::id());
    let _first = RedisStore::connect(config(&prefix)).expect("connect");
    let lazy = RedisStore::connect(RedisConfig {
        lazy: true,
        partitions: 2,
        ..config(&prefix)
    })
    .expect("lazy connect");
    let refused = block_on(lazy.admit(event("l1", None), &[key("l1")], Duration::from_secs(60)));
    match refused {
        Err(oncegate_core::StoreError::Unavailable(message)) => {
            assert!(message.contains("set partitions = 1"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_entry_read_for_the_owner_whose_answer_was_lost_is_still_handed_out() {
    // A group read that Redis applied but whose answer never arrived leaves entries in the
    // owner's pending list that the owner does not know. Here the read is made for the owner
    // from outside, which is exactly that; the owner must still hand the entry out.
    let prefix = format!("lost{}", std::process::id());
    let store = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect");
    let mut redis = plain();
    let stream = format!("{{{prefix}:0}}:q");
    block_on(async {
        let day = Duration::from_secs(86_400);
        store
            .admit(event("l1", Some("a")), &[key("l1")], day)
            .await
            .expect("admit");
        let first = store.pull(0, 10).await.expect("pull");
        assert_eq!(first.len(), 1);
        // The owner's consumer name, as the group knows it.
        let owner = consumers(&mut redis, &stream)[0].0.clone();
        store
            .admit(event("l2", Some("b")), &[key("l2")], day)
            .await
            .expect("admit");
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("oncegate")
            .arg(&owner)
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query(&mut redis)
            .expect("the read whose answer is lost");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut found = Vec::new();
        while found.is_empty() && std::time::Instant::now() < deadline {
            found = store.pull(0, 10).await.expect("pull");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            found.iter().map(|d| &*d.event.event_id).collect::<Vec<_>>(),
            ["l2"],
            "the entry in the owner's pending list comes out"
        );
    });
}

/// Three stores on one Redis (three gateways) take from one WeCom member's budget at once:
/// together they get the budget once, not once each.
#[test]
fn stores_on_one_redis_share_rate_budgets() {
    use oncegate_core::{Rate, RateStore, RateVerdict};
    let prefix = format!("rate{}", std::process::id());
    let stores: Vec<RedisStore> = (0..3)
        .map(|_| RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect"))
        .collect();
    let rate = Rate::per_minute(30, 10);
    for round in 0..10 {
        let bucket = key_for("wecom", "ww_rates", "member", &format!("m{round}"));
        let granted: usize = std::thread::scope(|scope| {
            let takers: Vec<_> = stores
                .iter()
                .map(|store| {
                    scope.spawn(move || {
                        block_on(async {
                            let mut granted = 0;
                            for _ in 0..8 {
                                match store.take_rate(&bucket, rate).await.expect("take") {
                                    RateVerdict::Granted => granted += 1,
                                    RateVerdict::Wait(wait) => {
                                        // About one emission interval (2 s), less what passed.
                                        assert!(wait <= Duration::from_secs(2), "{wait:?}");
                                    }
                                }
                            }
                            granted
                        })
                    })
                })
                .collect();
            takers.into_iter().map(|t| t.join().expect("taker")).sum()
        });
        // The burst, plus at most one more if the round straddled an emission interval.
        assert!(
            (10..=11).contains(&granted),
            "round {round}: {granted} granted"
        );
    }
}

/// An owner keeps the payloads its group reads brought until it hands them out, within a bound:
/// with far more payload queued than the bound (6 MB against 4 MiB), every event still goes out
/// once, with its own payload, and an event given back for a retry goes out again with its
/// attempt counted (it is read again, not served from what was kept).
#[test]
fn kept_payloads_are_bounded_and_never_stale() {
    let prefix = format!("kept{}", std::process::id());
    let store = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect");
    const EVENTS: usize = 600;
    let padding = "x".repeat(10_000);
    block_on(async {
        for n in 0..EVENTS {
            let id = format!("kept-{n}");
            let mut event = event(&id, Some(&format!("chat-{}", n % 7)));
            event.payload =
                bytes::Bytes::from(format!("{{\"id\":\"{id}\",\"pad\":\"{padding}\"}}"));
            let admitted = store
                .admit(event, &[key(&id)], Duration::from_secs(60))
                .await
                .expect("admit");
            assert!(matches!(admitted, Admission::Admitted { .. }), "{id}");
        }
        let mut seen = std::collections::HashMap::new();
        let mut retried = std::collections::HashSet::new();
        let mut rounds = 0;
        while seen.len() < EVENTS {
            rounds += 1;
            assert!(
                rounds < 10_000,
                "only {} of {EVENTS} events came out",
                seen.len()
            );
            let pulled = store.pull(0, 50).await.expect("pull");
            for delivery in pulled {
                let id = delivery.event.event_id.clone();
                let payload = std::str::from_utf8(&delivery.event.payload).expect("utf-8");
                assert!(
                    payload.starts_with(&format!("{{\"id\":\"{id}\",")) && payload.len() > 10_000,
                    "{id} came out with another payload"
                );
                // Every fifth event is given back once: it must come out again, counted.
                let n: usize = id["kept-".len()..].parse().expect("number");
                if n.is_multiple_of(5) && retried.insert(id.clone()) {
                    assert_eq!(delivery.attempt, 0, "{id}");
                    assert!(store.retry(delivery.id, 0).await.expect("retry"));
                    continue;
                }
                assert_eq!(
                    delivery.attempt,
                    u32::from(n.is_multiple_of(5)),
                    "{id}: the attempts it was given back"
                );
                assert!(
                    seen.insert(id.clone(), delivery.id).is_none(),
                    "{id} came out twice"
                );
                assert!(store.ack(delivery.id).await.expect("ack"), "{id}");
            }
        }
        assert!(store.pull(0, 50).await.expect("pull").is_empty());
    });
}

/// A store on its caller's runtime (`connect_on`, what `oncegate serve` uses) works as one on its
/// own: admit, hand out, claim, complete and ack, from tasks of that runtime.
#[test]
fn a_store_on_the_callers_runtime_runs_the_whole_path() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let prefix = format!("on{}", std::process::id());
    let store = std::sync::Arc::new(
        RedisStore::connect_on(config(&prefix), SystemClock, runtime.handle().clone())
            .expect("connect on the runtime"),
    );
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let store = store.clone();
            runtime.spawn(async move {
                let id = format!("rt{n}");
                let admitted = store
                    .admit(event(&id, Some(&id)), &[key(&id)], Duration::from_secs(60))
                    .await
                    .expect("admit");
                assert!(
                    matches!(admitted, Admission::Admitted { .. }),
                    "{admitted:?}"
                );
            })
        })
        .collect();
    runtime.block_on(async {
        for task in tasks {
            task.await.expect("admit task");
        }
        let mut done = 0;
        while done < 8 {
            let deliveries = store.pull(0, 16).await.expect("pull");
            assert!(
                !deliveries.is_empty(),
                "8 admitted, {done} done, none handed out"
            );
            for delivery in deliveries {
                let Claim::Acquired(lease) = store
                    .claim(
                        &delivery.key,
                        delivery.id.partition,
                        Duration::from_secs(60),
                    )
                    .await
                    .expect("claim")
                else {
                    panic!("claim of a fresh event")
                };
                let fence = store
                    .complete_and_ack(&lease, Duration::from_secs(60), None, delivery.id)
                    .await
                    .expect("complete and ack");
                assert_eq!(fence, oncegate_core::FenceCheck::Accepted);
                done += 1;
            }
        }
        assert_eq!(store.queued().await.expect("queued"), 0);
    });
}

#[test]
fn the_scripts_come_back_after_redis_forgets_them() {
    // What a restart without persistence or a failover to a fresh replica does to the script
    // cache: every hot script must be sent again, whole, and answer as before.
    let prefix = format!("flush{}", std::process::id());
    let store = RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect");
    let mut redis = plain();
    let forget = |redis: &mut redis::Connection| {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(redis)
            .expect("script flush");
    };
    block_on(async {
        for round in 0..2 {
            forget(&mut redis);
            let id = format!("f{round}");
            let admitted = store
                .admit(event(&id, Some("c")), &[key(&id)], Duration::from_secs(60))
                .await
                .expect("admit");
            assert!(
                matches!(admitted, Admission::Admitted { .. }),
                "{admitted:?}"
            );
            forget(&mut redis);
            let pulled = store
                .pull_claimed(0, 10, Duration::from_secs(30))
                .await
                .expect("pull and claim");
            assert_eq!(pulled.len(), 1, "{pulled:?}");
            let (delivery, claim) = pulled.into_iter().next().expect("one");
            let Ok(Claim::Acquired(lease)) = claim else {
                panic!("{claim:?}");
            };
            forget(&mut redis);
            let fence = store
                .complete_and_ack(&lease, Duration::from_secs(60), None, delivery.id)
                .await
                .expect("complete");
            assert_eq!(fence, FenceCheck::Accepted);
            let again = store
                .admit(event(&id, Some("c")), &[key(&id)], Duration::from_secs(60))
                .await
                .expect("admit again");
            assert_eq!(again, Admission::Duplicate { key_index: 0 });
        }
    });
}
