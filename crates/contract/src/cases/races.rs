//! Races between threads, and random runs against the model.

use super::*;

/// Many threads admit the same keys (with overlapping key sets) in many rounds: every key is
/// admitted exactly once and the queue holds exactly the admitted events.
pub fn racing_admits_admit_once<S: Store>(make: impl Fn(ManualClock) -> S) {
    const ROUNDS: usize = 30;
    const THREADS: usize = 8;
    const KEYS: usize = 40;
    for round in 0..ROUNDS {
        let store = make(clock());
        let message = |i: usize| {
            key_for(
                "feishu",
                "cli_contract",
                "message_id",
                &format!("m{round}-{}", i / 2),
            )
        };
        let results = race(&store, THREADS, |store, thread| {
            block_on(async {
                let mut admitted = Vec::new();
                for n in 0..KEYS {
                    // Each thread walks the keys from a different start.
                    let i = (n + thread * 7) % KEYS;
                    let id = format!("r{round}-{i}");
                    // Pairs of events share a message id (and so its chat): only one of each
                    // pair may be admitted.
                    let keys = [key(&id), message(i)];
                    if let Admission::Admitted { .. } = store
                        .admit(event(&id, Some(&format!("c{}", (i / 2) % 5))), &keys, DAY)
                        .await
                        .expect("admit")
                    {
                        admitted.push(i / 2);
                    }
                }
                admitted
            })
        });
        let mut all: Vec<usize> = results.into_iter().flatten().collect();
        all.sort_unstable();
        let expected: Vec<usize> = (0..KEYS / 2).collect();
        assert_eq!(
            all, expected,
            "round {round}: each message admitted exactly once"
        );
        let stats = block_on(store.stats()).expect("stats");
        assert_eq!(
            stats.queued as usize,
            KEYS / 2,
            "round {round}: one queued event per admit"
        );
    }
}

/// Many threads claim the same keys with short leases and complete what they get: at any time
/// at most one live lease per key, each key completed exactly once, and every stale completion
/// refused.
pub fn racing_claims_grant_one_live_lease<S: Store>(make: impl Fn(ManualClock) -> S) {
    const ROUNDS: usize = 30;
    const THREADS: usize = 8;
    const KEYS: usize = 10;
    for round in 0..ROUNDS {
        let clock = clock();
        let store = make(clock.clone());
        let holders: Mutex<HashMap<usize, u64>> = Mutex::new(HashMap::new());
        let completions = race(&store, THREADS, |store, thread| {
            block_on(async {
                let mut completed = Vec::new();
                for n in 0..KEYS * 3 {
                    let i = (n + thread) % KEYS;
                    let k = key(&format!("k{round}-{i}"));
                    match store
                        .claim(&k, home(store, &k), LEASE)
                        .await
                        .expect("claim")
                    {
                        Claim::TookOver(lease) => {
                            panic!("round {round}: no lease ran out, yet {lease:?} took over")
                        }
                        Claim::Acquired(lease) => {
                            {
                                let mut holders = holders.lock().expect("holders");
                                let previous = holders.insert(i, lease.token.0);
                                assert!(
                                    previous.is_none(),
                                    "round {round}: two live leases on key {i}"
                                );
                            }
                            // Every third key is given back instead of completed.
                            if (n + thread) % 3 == 0 {
                                holders.lock().expect("holders").remove(&i);
                                assert_eq!(
                                    store.release(&lease).await.expect("release"),
                                    FenceCheck::Accepted
                                );
                            } else {
                                holders.lock().expect("holders").remove(&i);
                                assert_eq!(
                                    store.complete(&lease, DAY, None).await.expect("complete"),
                                    FenceCheck::Accepted
                                );
                                completed.push(i);
                            }
                        }
                        Claim::InFlight { .. } | Claim::Done { .. } => {}
                        Claim::Conflict => panic!("a claim without a fingerprint met a conflict"),
                    }
                }
                completed
            })
        });
        let mut all: Vec<usize> = completions.into_iter().flatten().collect();
        all.sort_unstable();
        let unique: HashSet<usize> = all.iter().copied().collect();
        assert_eq!(
            all.len(),
            unique.len(),
            "round {round}: a key completed twice: {all:?}"
        );
        // Finish what was released and never picked up again; then every key is done once.
        block_on(async {
            for i in 0..KEYS {
                let k = key(&format!("k{round}-{i}"));
                if let Claim::Acquired(lease) = store
                    .claim(&k, home(&store, &k), LEASE)
                    .await
                    .expect("claim")
                {
                    assert!(!unique.contains(&i));
                    store.complete(&lease, DAY, None).await.expect("complete");
                }
                assert_eq!(
                    store
                        .claim(&k, home(&store, &k), LEASE)
                        .await
                        .expect("claim"),
                    Claim::Done { outcome: None }
                );
            }
        });
    }
    // Takeovers under a race: leases run out while others hold them; each takeover fences the
    // previous holder, so exactly one completion per key succeeds.
    for round in 0..ROUNDS {
        let clock = clock();
        let store = make(clock.clone());
        let k = key(&format!("takeover-{round}"));
        let first = lease_of(
            block_on(store.claim(&k, home(&store, &k), Duration::from_millis(10))).expect("claim"),
        );
        clock.advance_ms(10);
        let grants = race(&store, THREADS, |store, _| {
            block_on(store.claim(&k, home(store, &k), LEASE)).expect("claim")
        });
        let leases: Vec<Lease> = grants
            .into_iter()
            .filter_map(|g| match g {
                Claim::Acquired(l) => Some(l),
                _ => None,
            })
            .collect();
        assert_eq!(
            leases.len(),
            1,
            "round {round}: one takeover, got {leases:?}"
        );
        let mut all = [first, leases[0]];
        all.reverse();
        let results = race(&store, 2, |store, i| {
            block_on(store.complete(&all[i], DAY, None)).expect("complete")
        });
        assert_eq!(
            results,
            vec![FenceCheck::Accepted, FenceCheck::Rejected],
            "round {round}"
        );
    }
}

/// Many threads pull the same partitions while acking: no event is handed out twice, none is
/// lost, and per chat the hand-outs follow queue order.
pub fn racing_pullers_never_share_an_event<S: Store>(make: impl Fn(ManualClock) -> S) {
    const ROUNDS: usize = 10;
    const THREADS: usize = 6;
    const EVENTS: usize = 120;
    for round in 0..ROUNDS {
        let store = make(clock());
        let mut expected: HashMap<String, Vec<u64>> = HashMap::new();
        block_on(async {
            for i in 0..EVENTS {
                let id = format!("p{round}-{i}");
                let chat = format!("chat-{}", i % 9);
                let qid = admitted(
                    store
                        .admit(event(&id, Some(&chat)), &[key(&id)], DAY)
                        .await
                        .expect("admit"),
                );
                expected.entry(chat).or_default().push(qid.seq);
            }
        });
        let log: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());
        let partitions = store.partitions();
        let handled = race(&store, THREADS, |store, thread| {
            block_on(async {
                let mut mine = 0;
                let mut idle = 0;
                while idle < 50 {
                    let mut got = false;
                    for p in 0..partitions {
                        let partition = (p + thread as u16) % partitions;
                        for delivery in store.pull(partition, 3).await.expect("pull") {
                            got = true;
                            log.lock().expect("log").push((
                                delivery
                                    .event
                                    .order_key
                                    .as_deref()
                                    .unwrap_or_default()
                                    .to_owned(),
                                delivery.id.seq,
                            ));
                            assert!(
                                store.ack(delivery.id).await.expect("ack"),
                                "acked by someone else"
                            );
                            mine += 1;
                        }
                    }
                    if got {
                        idle = 0
                    } else {
                        idle += 1;
                        std::thread::yield_now();
                    }
                }
                mine
            })
        });
        assert_eq!(
            handled.iter().sum::<usize>(),
            EVENTS,
            "round {round}: every event handled once"
        );
        let log = log.into_inner().expect("log");
        let mut per_chat: HashMap<String, Vec<u64>> = HashMap::new();
        for (chat, seq) in log {
            per_chat.entry(chat).or_default().push(seq);
        }
        assert_eq!(per_chat, expected, "round {round}: per-chat order");
        assert_eq!(block_on(store.stats()).expect("stats").queued, 0);
    }
}

/// Random sequences of operations against the reference model in [`crate::model`].
pub fn random_operations_match_the_model<S: Store>(make: impl Fn(ManualClock) -> S) {
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&crate::model::operations(), |ops| {
        let clock = clock();
        let store = make(clock.clone());
        crate::model::check(&store, &clock, &ops);
        Ok(())
    });
    if let Err(failure) = result {
        panic!("the store disagrees with the model: {failure}");
    }
}

/// Operators replaying the same dead letters at once queue each exactly once.
pub fn racing_replays_queue_each_dead_letter_once<S: Store>(make: impl Fn(ManualClock) -> S) {
    const LETTERS: usize = 12;
    const THREADS: usize = 6;
    let store = make(clock());
    let ids = block_on(async {
        let names: Vec<String> = (0..LETTERS).map(|i| format!("rr{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let ids = admit_in_order(&store, &names, None).await;
        for partition in 0..store.partitions() {
            store.pull(partition, 100).await.expect("pull");
        }
        for id in &ids {
            assert!(store.dead_letter(*id, "gave up").await.expect("dead"));
        }
        ids
    });
    let replayed = race(&store, THREADS, |store, _| {
        block_on(async {
            let mut mine = Vec::new();
            for id in &ids {
                if let Some(new) = store.replay_dead_letter(*id).await.expect("replay") {
                    mine.push(new);
                }
            }
            mine
        })
    });
    let all: Vec<_> = replayed.into_iter().flatten().collect();
    assert_eq!(all.len(), LETTERS, "each replayed once: {all:?}");
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), LETTERS);
    block_on(async {
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.dead_letters, stats.queued), (0, LETTERS as u64));
    });
}
