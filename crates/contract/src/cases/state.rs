//! Shared values ([`StateStore`]): versions, compare-and-set, expiry, paged listing, races.

use oncegate_core::state::{MAX_LIST, MAX_NAME, MAX_VALUE};
use oncegate_core::{Changed, Expect, StateStore};

use super::*;

fn done(changed: Changed) -> u64 {
    match changed {
        Changed::Done(version) => version,
        Changed::Stale(current) => panic!("expected the change done, it was stale at {current}"),
    }
}

/// Every change is conditional on the version read, and the generation grows with each.
pub fn state_changes_are_compare_and_set<S: StateStore>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        assert_eq!(store.state_generation("tenants").await.expect("gen"), 0);
        assert_eq!(store.state_get("tenants", "wwA").await.expect("get"), None);
        let first = done(
            store
                .state_put("tenants", "wwA", Bytes::from("one"), Expect::Absent, None)
                .await
                .expect("put"),
        );
        assert!(first > 0);
        assert_eq!(
            store
                .state_put("tenants", "wwA", Bytes::from("two"), Expect::Absent, None)
                .await
                .expect("put"),
            Changed::Stale(first),
            "present: an add refused"
        );
        let second = done(
            store
                .state_put(
                    "tenants",
                    "wwA",
                    Bytes::from("two"),
                    Expect::Version(first),
                    None,
                )
                .await
                .expect("put"),
        );
        assert!(second > first);
        assert_eq!(
            store
                .state_put(
                    "tenants",
                    "wwA",
                    Bytes::from("late"),
                    Expect::Version(first),
                    None
                )
                .await
                .expect("put"),
            Changed::Stale(second),
            "a writer that read the old version loses"
        );
        let got = store
            .state_get("tenants", "wwA")
            .await
            .expect("get")
            .expect("some");
        assert_eq!(
            (got.version, got.value, got.expires_at_ms),
            (second, Bytes::from("two"), None)
        );
        // Another namespace, another name: apart.
        assert_eq!(store.state_get("tickets", "wwA").await.expect("get"), None);
        assert_eq!(store.state_generation("tickets").await.expect("gen"), 0);
        let generation = store.state_generation("tenants").await.expect("gen");
        assert_eq!(generation, second);
        assert_eq!(
            store
                .state_remove("tenants", "wwA", Expect::Version(first))
                .await
                .expect("remove"),
            Changed::Stale(second)
        );
        let removed = done(
            store
                .state_remove("tenants", "wwA", Expect::Version(second))
                .await
                .expect("remove"),
        );
        assert!(removed > second);
        assert_eq!(store.state_get("tenants", "wwA").await.expect("get"), None);
        assert_eq!(
            store.state_generation("tenants").await.expect("gen"),
            removed
        );
        // Unconditional writes and removals, of absent names too.
        let any = done(
            store
                .state_put("tenants", "wwA", Bytes::from("three"), Expect::Any, None)
                .await
                .expect("put"),
        );
        assert!(any > removed);
        assert!(matches!(
            store.state_remove("tenants", "nobody", Expect::Any).await.expect("remove"),
            Changed::Done(v) if v > any
        ));
        assert_eq!(
            store
                .state_remove("tenants", "nobody", Expect::Absent)
                .await
                .expect("remove"),
            Changed::Done(any + 2),
        );
    });
}

/// Names are opaque and case-sensitive; bounds are refused as invalid, changing nothing.
pub fn state_names_are_opaque_and_bounded<S: StateStore>(make: impl Fn(ManualClock) -> S) {
    let store = make(clock());
    block_on(async {
        for name in [
            "wwAbCd",
            "wwabcd",
            "WWABCD",
            "corp with spaces",
            "企业:1",
            "a:b/c",
        ] {
            done(
                store
                    .state_put(
                        "tenants",
                        name,
                        Bytes::from(name.to_owned()),
                        Expect::Absent,
                        None,
                    )
                    .await
                    .expect("put"),
            );
        }
        for name in ["wwAbCd", "wwabcd", "WWABCD", "企业:1"] {
            let got = store
                .state_get("tenants", name)
                .await
                .expect("get")
                .expect("some");
            assert_eq!(got.value, Bytes::from(name.to_owned()), "{name} kept apart");
        }
        let generation = store.state_generation("tenants").await.expect("gen");
        let invalid = [
            store
                .state_put(
                    "tenants",
                    &"n".repeat(MAX_NAME + 1),
                    Bytes::new(),
                    Expect::Any,
                    None,
                )
                .await,
            store
                .state_put(
                    "tenants",
                    "big",
                    Bytes::from(vec![7; MAX_VALUE + 1]),
                    Expect::Any,
                    None,
                )
                .await,
            store
                .state_put("", "x", Bytes::new(), Expect::Any, None)
                .await,
            store
                .state_put("a{b}", "x", Bytes::new(), Expect::Any, None)
                .await,
            store
                .state_put("tenants", "", Bytes::new(), Expect::Any, None)
                .await,
        ];
        for answer in invalid {
            assert!(matches!(answer, Err(StoreError::Invalid(_))), "{answer:?}");
        }
        assert_eq!(
            store.state_generation("tenants").await.expect("gen"),
            generation
        );
        // The largest value there may be goes in and comes back whole.
        let largest = Bytes::from((0..MAX_VALUE).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        done(
            store
                .state_put("tenants", "largest", largest.clone(), Expect::Any, None)
                .await
                .expect("put"),
        );
        let got = store
            .state_get("tenants", "largest")
            .await
            .expect("get")
            .expect("some");
        assert_eq!(got.value, largest);
    });
}

/// A value written with a time to live is gone after it (for reads, listings and adds).
pub fn state_values_expire<S: StateStore>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        let ticket = done(
            store
                .state_put(
                    "tickets",
                    "suite",
                    Bytes::from("t1"),
                    Expect::Any,
                    Some(secs(1800)),
                )
                .await
                .expect("put"),
        );
        let got = store
            .state_get("tickets", "suite")
            .await
            .expect("get")
            .expect("some");
        assert_eq!(got.expires_at_ms, Some(START_MS + 1_800_000));
        clock.advance_ms(1_799_000);
        assert!(
            store
                .state_get("tickets", "suite")
                .await
                .expect("get")
                .is_some()
        );
        clock.advance_ms(2_000);
        assert_eq!(
            store.state_get("tickets", "suite").await.expect("get"),
            None
        );
        assert!(
            store
                .state_list("tickets", None, 10)
                .await
                .expect("list")
                .is_empty()
        );
        // Expired is absent: an add succeeds, and a writer holding the old version loses.
        assert!(matches!(
            store
                .state_put(
                    "tickets",
                    "suite",
                    Bytes::from("t2"),
                    Expect::Version(ticket),
                    None
                )
                .await
                .expect("put"),
            Changed::Stale(0)
        ));
        done(
            store
                .state_put("tickets", "suite", Bytes::from("t2"), Expect::Absent, None)
                .await
                .expect("put"),
        );
        clock.advance_ms(100_000_000);
        assert_eq!(
            store
                .state_get("tickets", "suite")
                .await
                .expect("get")
                .map(|v| v.value),
            Some(Bytes::from("t2")),
            "no time to live: kept"
        );
    });
}

/// Listing walks a namespace in name order, page by page, live values only.
pub fn state_lists_in_pages<S: StateStore>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    block_on(async {
        for i in 0..25 {
            let ttl = (i % 5 == 0).then(|| secs(10));
            done(
                store
                    .state_put(
                        "tenants",
                        &format!("corp{i:02}"),
                        Bytes::from(format!("v{i}")),
                        Expect::Any,
                        ttl,
                    )
                    .await
                    .expect("put"),
            );
        }
        done(
            store
                .state_put("others", "corp99", Bytes::new(), Expect::Any, None)
                .await
                .expect("put"),
        );
        clock.advance_ms(11_000);
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = store
                .state_list("tenants", after.as_deref(), 7)
                .await
                .expect("list");
            assert!(page.len() <= 7);
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (name, value) in &page {
                assert_eq!(
                    value.value,
                    Bytes::from(format!(
                        "v{}",
                        &name[4..]
                            .trim_start_matches('0')
                            .parse::<u32>()
                            .unwrap_or(0)
                    ))
                );
            }
            seen.extend(page.into_iter().map(|(name, _)| name));
        }
        let expected: Vec<String> = (0..25)
            .filter(|i| i % 5 != 0)
            .map(|i| format!("corp{i:02}"))
            .collect();
        assert_eq!(seen, expected);
        assert!(
            store
                .state_list("tenants", None, MAX_LIST * 10)
                .await
                .expect("list")
                .len()
                <= MAX_LIST
        );
        assert!(
            store
                .state_list("nothing", None, 10)
                .await
                .expect("list")
                .is_empty()
        );
    });
}

/// Many threads add to one value by compare-and-set: every success is counted once, no two
/// share a version, and the final value holds them all.
pub fn racing_state_writers_lose_no_update<S: StateStore>(make: impl Fn(ManualClock) -> S) {
    const THREADS: usize = 8;
    const ADDS: usize = 25;
    let store = make(clock());
    let barrier = Barrier::new(THREADS);
    let versions: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (store, barrier) = (&store, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    block_on(async {
                        let mut won = Vec::new();
                        while won.len() < ADDS {
                            let current = store.state_get("counters", "c").await.expect("get");
                            let (expect, count) = match &current {
                                Some(v) => (
                                    Expect::Version(v.version),
                                    std::str::from_utf8(&v.value)
                                        .expect("utf8")
                                        .parse::<usize>()
                                        .expect("n"),
                                ),
                                None => (Expect::Absent, 0),
                            };
                            let next = Bytes::from((count + 1).to_string());
                            if let Changed::Done(version) = store
                                .state_put("counters", "c", next, expect, None)
                                .await
                                .expect("put")
                            {
                                won.push(version);
                            }
                        }
                        won
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer"))
            .collect()
    });
    let mut all: Vec<u64> = versions.into_iter().flatten().collect();
    all.sort_unstable();
    let total = all.len();
    all.dedup();
    assert_eq!(all.len(), total, "no version granted twice");
    assert_eq!(total, THREADS * ADDS);
    let last = block_on(store.state_get("counters", "c"))
        .expect("get")
        .expect("some");
    assert_eq!(
        last.value,
        Bytes::from((THREADS * ADDS).to_string()),
        "no update lost"
    );
}
