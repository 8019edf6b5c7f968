//! Claims and completions made at once share scripts: each caller still gets its own answer,
//! in a batch as alone — the same key twice in one script, a stale lease among live ones.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use oncegate_contract::{event, key};
use oncegate_core::{
    Admission, Claim, DedupStore, EventQueue, FenceCheck, RecordState, StoreError, SystemClock,
};
use oncegate_redis::RedisStore;

mod common;
use common::{config, plain};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(600);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a test runtime")
}

fn store(prefix: &str) -> Arc<RedisStore> {
    let prefix = format!("{prefix}{}", std::process::id());
    Arc::new(RedisStore::connect_with_clock(config(&prefix), SystemClock).expect("connect"))
}

/// The answers of calls run as tasks, in order.
async fn answers<T>(tasks: Vec<tokio::task::JoinHandle<Result<T, StoreError>>>) -> Vec<T> {
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.expect("a call's task").expect("a store call"));
    }
    answers
}

/// Calls of `command` the test Redis has run so far.
fn calls(command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut plain())
        .expect("info commandstats");
    let line = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn claims_made_at_once_share_scripts_and_each_gets_its_own_lease() {
    const CLAIMS: usize = 200;
    let store = store("gclaim");
    let keys: Vec<_> = (0..CLAIMS).map(|i| key(&format!("g{i}"))).collect();
    let time_before = calls("time");
    let claims = runtime().block_on(async {
        let tasks: Vec<_> = keys
            .iter()
            .map(|k| {
                let (store, k) = (store.clone(), *k);
                tokio::spawn(async move { store.claim(&k, 0, LEASE).await })
            })
            .collect();
        answers(tasks).await
    });
    // Each grant's script reads the server's time once, whatever its number of claims.
    let scripts = calls("time") - time_before;
    assert!(
        scripts < CLAIMS as u64,
        "{CLAIMS} claims at once took {scripts} scripts"
    );
    let mut tokens = HashSet::new();
    for (claim, k) in claims.iter().zip(&keys) {
        let Claim::Acquired(lease) = claim else {
            panic!("a fresh key was not granted: {claim:?}");
        };
        assert_eq!(&lease.key, k, "a caller got another caller's lease");
        assert!(
            tokens.insert(lease.token.0),
            "token {:?} granted twice",
            lease.token
        );
    }
}

#[test]
fn one_key_claimed_many_times_at_once_is_granted_once() {
    let store = store("gsame");
    let k = key("same");
    let claims = runtime().block_on(async {
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { store.claim(&k, 0, LEASE).await })
            })
            .collect();
        answers(tasks).await
    });
    let granted: Vec<_> = claims
        .iter()
        .filter_map(|c| match c {
            Claim::Acquired(lease) => Some(*lease),
            _ => None,
        })
        .collect();
    assert_eq!(granted.len(), 1, "{claims:?}");
    for claim in &claims {
        match claim {
            Claim::Acquired(_) => {}
            Claim::InFlight { until_ms } => assert_eq!(*until_ms, granted[0].until_ms),
            other => panic!("expected in flight, got {other:?}"),
        }
    }
}

#[test]
fn completions_made_at_once_are_fenced_one_by_one_and_ack_every_entry() {
    const EVENTS: usize = 100;
    let store = store("gdone");
    let runtime = runtime();
    let (leases, deliveries, stale) = runtime.block_on(async {
        for i in 0..EVENTS {
            let id = format!("d{i}");
            let admitted = store
                .admit(event(&id, Some(&id)), &[key(&id)], RETENTION)
                .await
                .expect("admit");
            assert!(
                matches!(admitted, Admission::Admitted { .. }),
                "{admitted:?}"
            );
        }
        let mut deliveries = Vec::new();
        while deliveries.len() < EVENTS {
            let pulled = store.pull(0, EVENTS).await.expect("pull");
            assert!(
                !pulled.is_empty(),
                "{} of {EVENTS} handed out",
                deliveries.len()
            );
            deliveries.extend(pulled);
        }
        let mut leases = Vec::new();
        for delivery in &deliveries {
            let Claim::Acquired(lease) = store.claim(&delivery.key, 0, LEASE).await.expect("claim")
            else {
                panic!("{:?} was not granted", delivery.key);
            };
            leases.push(lease);
        }
        // The first event's lease is given back and granted again: the old one is stale.
        assert_eq!(
            store.release(&leases[0]).await.expect("release"),
            FenceCheck::Accepted
        );
        let stale = leases[0];
        let Claim::Acquired(again) = store.claim(&stale.key, 0, LEASE).await.expect("claim") else {
            panic!("a released key was not granted again");
        };
        leases[0] = again;
        (leases, deliveries, stale)
    });
    let fences = runtime.block_on(async {
        let mut calls = vec![(stale, deliveries[0].id)];
        calls.extend(leases.iter().copied().zip(deliveries.iter().map(|d| d.id)));
        let tasks: Vec<_> = calls
            .into_iter()
            .map(|(lease, id)| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.complete_and_ack(&lease, RETENTION, None, id).await },
                )
            })
            .collect();
        answers(tasks).await
    });
    assert_eq!(fences[0], FenceCheck::Rejected, "the stale lease completed");
    assert!(
        fences[1..].iter().all(|f| *f == FenceCheck::Accepted),
        "{fences:?}"
    );
    runtime.block_on(async {
        for delivery in &deliveries {
            let record = store.record(&delivery.key, 0).await.expect("record");
            assert!(
                matches!(record.map(|r| r.state), Some(RecordState::Completed { .. })),
                "{:?}",
                delivery.key
            );
        }
        assert_eq!(
            store.queued().await.expect("queued"),
            0,
            "every entry acked"
        );
        assert!(store.pull(0, EVENTS).await.expect("pull").is_empty());
    });
}
