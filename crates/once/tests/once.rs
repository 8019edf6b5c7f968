//! The protocol's promises on the memory store: a side effect runs once however many callers
//! race; failures, panics and dropped guards give the key back; a guard settles once; a lease
//! is renewed while its work runs and fenced when it was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{DedupStore, KeyHash, Lease, RecordState};
use oncegate_memory::MemoryStore;
use oncegate_once::{
    Claimed, Held, LeaseEnded, Observer, Once, OnceKey, Outcome, Renewal, RunError,
};

#[derive(Default)]
struct Counts {
    renewed: AtomicU32,
    lost: AtomicU32,
    fenced: AtomicU32,
    abandoned: AtomicU32,
}

impl Observer for Counts {
    fn renewal(&self, _: &Lease, renewal: Renewal) {
        match renewal {
            Renewal::Renewed => &self.renewed,
            Renewal::Lost => &self.lost,
            Renewal::Failed => return,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
    fn fenced(&self, _: &Lease) {
        self.fenced.fetch_add(1, Ordering::Relaxed);
    }
    fn abandoned(&self, _: &Lease) {
        self.abandoned.fetch_add(1, Ordering::Relaxed);
    }
}

fn once() -> (Once<MemoryStore>, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let once = Once::new(Arc::new(MemoryStore::new())).with_observer(counts.clone());
    (once, counts)
}

fn key(name: &str) -> OnceKey {
    OnceKey::new(KeyHash::of(&["test", name]), 0)
}

fn held(claimed: Claimed<MemoryStore>) -> Held<MemoryStore> {
    match claimed {
        Claimed::Run(held) => held,
        other => panic!("expected to hold the key, got {other:?}"),
    }
}

async fn state(once: &Once<MemoryStore>, key: OnceKey) -> Option<RecordState> {
    once.store()
        .record(&key.key(), key.partition())
        .await
        .expect("record")
        .map(|record| record.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_racing_callers_run_the_side_effect_once_and_all_get_its_result() {
    let (once, _) = once();
    for round in 0..40 {
        let effects = Arc::new(AtomicU32::new(0));
        let key = key(&format!("race-{round}"));
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let (once, effects) = (once.clone(), effects.clone());
                tokio::spawn(async move {
                    once.run(key, Duration::from_secs(10), |_| async {
                        effects.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..5))).await;
                        Ok::<_, String>(Some(Bytes::from(format!("result-{round}"))))
                    })
                    .await
                })
            })
            .collect();
        let mut ran = 0;
        for caller in callers {
            let result = match caller.await.expect("joined").expect("ran") {
                Outcome::Ran(result) => {
                    ran += 1;
                    result
                }
                Outcome::Done(result) => result,
                other => panic!("round {round}: {other:?}"),
            };
            assert_eq!(result, Some(Bytes::from(format!("result-{round}"))));
        }
        assert_eq!(ran, 1, "round {round}");
        assert_eq!(effects.load(Ordering::SeqCst), 1, "round {round}");
    }
}

#[tokio::test]
async fn a_failing_or_panicking_work_gives_the_key_back_for_a_retry() {
    let (once, _) = once();
    let key = key("fails");
    let failed = once
        .run(key, Duration::ZERO, |_| async {
            Err::<Option<Bytes>, _>("no")
        })
        .await;
    assert!(matches!(failed, Err(RunError::Failed("no"))), "{failed:?}");
    // Given back: nobody holds it (a key no event brought in has no record left).
    let left = state(&once, key).await;
    assert!(
        matches!(left, None | Some(RecordState::Pending)),
        "{left:?}"
    );
    let panicked = once
        .run(key, Duration::ZERO, |_| async {
            if key.partition() == 0 {
                panic!("the handler's bug");
            }
            Ok::<_, String>(None)
        })
        .await;
    assert!(matches!(panicked, Err(RunError::Panicked)), "{panicked:?}");
    let retried = once
        .run(key, Duration::ZERO, |_| async {
            Ok::<_, String>(Some("third".into()))
        })
        .await
        .expect("ran");
    assert_eq!(retried, Outcome::Ran(Some("third".into())));
    assert!(matches!(
        state(&once, key).await,
        Some(RecordState::Completed { outcome: Some(_) })
    ));
}

#[tokio::test]
async fn a_guard_dropped_unsettled_releases_its_key() {
    let (once, counts) = once();
    let key = key("dropped");
    let first = held(once.claim(key).await.expect("claim"));
    let token = first.lease().token;
    // An early return, a `?`, a cancelled task: the guard goes out of scope unsettled.
    drop(first);
    assert_eq!(counts.abandoned.load(Ordering::Relaxed), 1);
    // The release runs in the background: the key is free long before its 30 s lease ends.
    let second = held(
        once.claim_or_wait(key, Duration::from_secs(5))
            .await
            .expect("claim"),
    );
    assert!(second.lease().token > token);
    second.complete(None).await.expect("complete");
    drop(second);
    assert_eq!(
        counts.abandoned.load(Ordering::Relaxed),
        1,
        "a settled guard is not abandoned"
    );
}

#[tokio::test]
async fn a_cancelled_task_releases_the_key_it_held() {
    let (once, counts) = once();
    let key = key("cancelled");
    let task = {
        let once = once.clone();
        tokio::spawn(async move {
            once.run(key, Duration::ZERO, |_| {
                std::future::pending::<Result<Option<Bytes>, String>>()
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(matches!(
        once.claim(key).await.expect("claim"),
        Claimed::InFlight { .. }
    ));
    task.abort();
    let _ = task.await;
    assert_eq!(counts.abandoned.load(Ordering::Relaxed), 1);
    let again = once
        .claim_or_wait(key, Duration::from_secs(5))
        .await
        .expect("claim");
    held(again).release().await.expect("release");
}

#[tokio::test]
async fn a_guard_settles_once() {
    let (once, _) = once();
    let key = key("settles");
    let guard = held(once.claim(key).await.expect("claim"));
    guard.complete(Some("done".into())).await.expect("complete");
    assert!(guard.is_settled());
    let again = guard.release().await.expect("answered");
    assert_eq!(again, oncegate_core::FenceCheck::Rejected);
    drop(guard);
    // The release was refused: the key stays done with its result.
    match once.claim(key).await.expect("claim") {
        Claimed::Done(result) => assert_eq!(result.as_deref(), Some(&b"done"[..])),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_lease_handed_on_is_not_released_and_is_settled_by_whoever_adopts_it() {
    let (once, counts) = once();
    let key = key("handed-on");
    let lease = held(once.claim(key).await.expect("claim")).into_lease();
    assert_eq!(counts.abandoned.load(Ordering::Relaxed), 0);
    assert!(matches!(
        once.claim(key).await.expect("claim"),
        Claimed::InFlight { .. }
    ));
    // The client presents the token again, later.
    assert_eq!(
        once.renew_lease(&lease, Duration::from_secs(5))
            .await
            .expect("renew"),
        oncegate_core::FenceCheck::Accepted
    );
    once.complete_lease(&lease, Some("r".into()))
        .await
        .expect("complete");
    assert!(matches!(
        state(&once, key).await,
        Some(RecordState::Completed { .. })
    ));
}

#[tokio::test]
async fn a_long_work_is_renewed_and_nobody_takes_its_key_meanwhile() {
    let (once, counts) = once();
    let key = key("long").lease(Duration::from_millis(120));
    let runner = {
        let once = once.clone();
        tokio::spawn(async move {
            once.run(key, Duration::ZERO, |_| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<_, String>(None)
            })
            .await
        })
    };
    // Each probe comes after the lease alone would have run out.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let probe = once.claim(key).await.expect("claim");
        assert!(matches!(probe, Claimed::InFlight { .. }), "{probe:?}");
    }
    assert_eq!(
        runner.await.expect("joined").expect("ran"),
        Outcome::Ran(None)
    );
    assert!(counts.renewed.load(Ordering::Relaxed) >= 3);
}

#[tokio::test]
async fn a_lease_that_ran_out_is_fenced_and_keep_says_so() {
    let (once, counts) = once();
    // Renewed too late on purpose: the lease runs out between renewals.
    let key = key("lost")
        .lease(Duration::from_millis(50))
        .renew_every(Duration::from_millis(200));
    let first = held(once.claim(key).await.expect("claim"));
    tokio::time::sleep(Duration::from_millis(80)).await;
    let second = held(once.claim(key).await.expect("take over"));
    assert!(matches!(first.keep().await, LeaseEnded::TakenOver));
    assert_eq!(counts.lost.load(Ordering::Relaxed), 1);
    assert_eq!(
        first.complete(None).await.expect("complete"),
        oncegate_core::FenceCheck::Rejected
    );
    assert_eq!(counts.fenced.load(Ordering::Relaxed), 1);
    second
        .complete(Some("second".into()))
        .await
        .expect("complete");
    match once.claim(key).await.expect("claim") {
        Claimed::Done(result) => assert_eq!(result.as_deref(), Some(&b"second"[..])),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_work_whose_lease_was_taken_over_is_told_it_was_fenced() {
    let (once, _) = once();
    let key = key("fenced")
        .lease(Duration::from_millis(40))
        .renew_every(Duration::from_secs(5));
    let taker = {
        let once = once.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(80)).await;
            let held = held(once.claim(key).await.expect("claim"));
            held.into_lease()
        })
    };
    let ran = once
        .run(key, Duration::ZERO, |_| async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok::<_, String>(Some("late".into()))
        })
        .await;
    taker.await.expect("joined");
    assert!(
        matches!(&ran, Err(RunError::Fenced { result }) if result.as_deref() == Some(&b"late"[..])),
        "{ran:?}"
    );
}

#[tokio::test]
async fn another_payload_under_the_key_is_a_conflict_and_does_not_run() {
    let (once, _) = once();
    let key = key("payload");
    let first = once
        .run(
            key.payload(b"order 42 for 3 items"),
            Duration::ZERO,
            |_| async { Ok::<_, String>(None) },
        )
        .await
        .expect("ran");
    assert_eq!(first, Outcome::Ran(None));
    let other = once
        .run(
            key.payload(b"order 42 for 4 items"),
            Duration::ZERO,
            |_| async { panic!("must not run") },
        )
        .await
        .map_err(|_: RunError<String>| ())
        .expect("answered");
    assert_eq!(other, Outcome::Conflict);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_waits_for_the_first_runs_result_in_many_races() {
    let (once, _) = once();
    for round in 0..50 {
        let key = key(&format!("wait-{round}")).payload(b"p");
        let first = held(once.claim(key).await.expect("claim"));
        let repeats: Vec<_> = (0..4)
            .map(|_| {
                let once = once.clone();
                tokio::spawn(async move { once.claim_or_wait(key, Duration::from_secs(5)).await })
            })
            .collect();
        // The first run ends after the repeats started waiting (a few rounds of polls).
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..30))).await;
        let result = Bytes::from(format!("result-{round}"));
        first
            .complete(Some(result.clone()))
            .await
            .expect("complete");
        for repeat in repeats {
            match repeat.await.expect("joined").expect("claim") {
                Claimed::Done(Some(stored)) => assert_eq!(stored, result),
                other => panic!("round {round}: a repeat got {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn a_repeat_takes_the_key_when_the_first_run_gives_up() {
    let (once, _) = once();
    let key = key("given-up").payload(b"p");
    let first = held(once.claim(key).await.expect("claim"));
    let waiter = {
        let once = once.clone();
        tokio::spawn(async move { once.claim_or_wait(key, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.release().await.expect("release");
    let second = held(waiter.await.expect("joined").expect("claim"));
    assert!(second.lease().token > first.lease().token);
    second.release().await.expect("release");
}

#[tokio::test]
async fn waiting_ends_at_the_deadline_and_conflicts_do_not_wait() {
    let (once, _) = once();
    let key = key("slow");
    let first = held(once.claim(key.payload(b"p")).await.expect("claim"));
    let started = tokio::time::Instant::now();
    let claimed = once
        .claim_or_wait(key.payload(b"p"), Duration::from_millis(60))
        .await
        .expect("claim");
    assert!(
        matches!(claimed, Claimed::InFlight { until_ms } if until_ms == first.lease().until_ms),
        "{claimed:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(60));
    let claimed = once
        .claim_or_wait(key.payload(b"other"), Duration::from_secs(60))
        .await
        .expect("claim");
    assert!(matches!(claimed, Claimed::Conflict), "{claimed:?}");
    first.release().await.expect("release");
}
