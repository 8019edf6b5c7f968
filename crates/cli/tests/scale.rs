//! Many gateways share the dispatch: three `oncegate serve` processes on one Redis (and on a
//! Redis Cluster) with a slow downstream. Gateways that join take their share and deliver part
//! of what comes after; one that stops (SIGTERM) gives its partitions up at once; one killed
//! (kill -9) loses them when its ownership runs out. Each event is delivered once (a handler
//! running at the kill may run once more, with the same Idempotency-Key), every chat in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e;
use e2e::*;

const CHATS: usize = 24;
/// Events per chat in each phase: while gateways join, after all joined, while two leave.
const PER_PHASE: usize = 12;
/// The downstream's time per event.
const DOWNSTREAM: Duration = Duration::from_millis(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_one_redis_share_the_dispatch_through_joins_and_leaves() {
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    });
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"scale{}\"\npartitions = 8\nownership = \"4s\"",
        std::process::id()
    );
    share_the_dispatch(&store, "one redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_a_redis_cluster_share_the_dispatch_through_joins_and_leaves() {
    let urls = std::env::var("ONCEGATE_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        panic!(
            "ONCEGATE_TEST_REDIS_CLUSTER_URL is not set: run scripts/test, which starts a redis cluster"
        )
    });
    let store = format!(
        "backend = \"redis\"\ncluster = true\nurl = \"{urls}\"\nprefix = \"scalec{}\"\npartitions = 12\nownership = \"4s\"",
        std::process::id()
    );
    share_the_dispatch(&store, "a redis cluster").await;
}

/// Sends events `from..to` of every chat, each chat in order and `pace` apart, each event until
/// some gateway answers 200 (as a platform retries); `acked` counts the answered ones.
fn send_phase(
    urls: &Arc<Vec<String>>,
    from: usize,
    to: usize,
    pace: Duration,
    acked: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let client = client();
    (0..CHATS)
        .map(|chat| {
            let (client, urls, acked) = (client.clone(), urls.clone(), acked.clone());
            tokio::spawn(async move {
                for n in from..to {
                    let plain = message(
                        &format!("scale-{chat}-{n}"),
                        &format!("oc_scale{chat}"),
                        1_000 + n as u64,
                    );
                    let mut target = (chat + n) % urls.len();
                    loop {
                        match post(&client, &urls[target], &sign(&plain)).await {
                            Ok((200, _)) => break,
                            _ => {
                                target = (target + 1) % urls.len();
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                    acked.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(pace).await;
                }
            })
        })
        .collect()
}

/// Waits until `acked` reaches `target`, or every sender is done.
async fn acked_at_least(
    acked: &AtomicUsize,
    target: usize,
    senders: &[tokio::task::JoinHandle<()>],
) {
    while acked.load(Ordering::Relaxed) < target && !senders.iter().all(|s| s.is_finished()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The owners `gateway` reports.
async fn owners(gateway: &Gateway) -> Value {
    queue(gateway).await["owners"].clone()
}

/// `/admin/queue` of a gateway: every partition's summary and the owners.
async fn queue(gateway: &Gateway) -> Value {
    reqwest::get(format!("{}/admin/queue", gateway.admin))
        .await
        .expect("queue")
        .json()
        .await
        .expect("json")
}

/// Events queued in the partitions `gateway` owns.
async fn queued_here(gateway: &Gateway) -> u64 {
    queue(gateway).await["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["owner"]["here"] == true)
        .filter_map(|p| p["events"].as_u64())
        .sum()
}

fn delivered(stats: &Value) -> u64 {
    stats["gateway"]["delivered"].as_u64().unwrap_or(0)
}

/// Waits until `done` holds for the owners `gateway` reports, for at most `within`.
async fn owners_until(
    gateway: &Gateway,
    within: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        let owners = owners(gateway).await;
        if done(&owners) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {owners}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn gateway_counts(owners: &Value) -> Vec<u64> {
    let mut counts: Vec<u64> = owners["gateways"]
        .as_object()
        .map(|g| g.values().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    counts.sort_unstable();
    counts
}

async fn share_the_dispatch(store: &str, label: &str) {
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = DOWNSTREAM;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let start =
        |i: usize| Gateway::start_with_lease(dirs[i].path(), addr, false, store, "3s", "1s");
    let mut gateways = vec![Some(start(0))];
    let partitions: u64 = store
        .lines()
        .find_map(|l| l.strip_prefix("partitions = "))
        .and_then(|p| p.parse().ok())
        .expect("partitions");
    // Phase 1: the first gateway alone, two more join while the chats send.
    let mut urls_list = vec![gateways[0].as_ref().expect("g0").url.clone()];
    let acked = Arc::new(AtomicUsize::new(0));
    let first_urls = Arc::new(urls_list.clone());
    let senders = send_phase(&first_urls, 0, PER_PHASE, Duration::from_millis(10), &acked);
    acked_at_least(&acked, CHATS * PER_PHASE / 3, &senders).await;
    let joins = Instant::now();
    for i in 1..3 {
        let gateway = start(i);
        urls_list.push(gateway.url.clone());
        gateways.push(Some(gateway));
    }
    for sender in senders {
        sender.await.expect("sender");
    }
    let first = gateways[0].as_ref().expect("g0");
    owners_until(
        first,
        Duration::from_secs(10),
        "three gateways sharing",
        |o| gateway_counts(o).len() == 3 && gateway_counts(o).iter().sum::<u64>() == partitions,
    )
    .await;
    // Each named as its log names it (`[log] instance`: host:pid by default), then a random
    // part: not an opaque id.
    let names = owners(first).await["gateways"].clone();
    for name in names.as_object().expect("owners").keys() {
        let (label, random) = name.rsplit_once('-').unwrap_or_else(|| panic!("{name}"));
        assert!(
            label.contains(':')
                && random.len() == 8
                && random.chars().all(|c| c.is_ascii_hexdigit()),
            "{name}"
        );
    }
    let settled = joins.elapsed();
    // The first gateway's metrics say what it owns, how many gateways live, what it gave up
    // (as of its last heartbeat: they may lag what Redis shows by a round).
    let deadline = Instant::now() + Duration::from_secs(10);
    let (metrics, mine) = loop {
        let view = owners(first).await;
        let name = view["this_gateway"].as_str().unwrap_or("-").to_owned();
        let mine = view["gateways"][&name].as_u64().unwrap_or(0);
        let metrics = reqwest::get(format!("{}/metrics", first.admin))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        let owned = format!("oncegate_partitions_owned{{gateway=\"{name}\"}} {mine}");
        if metrics.lines().any(|l| l == owned)
            && metrics.lines().any(|l| l == "oncegate_gateways_live 3")
        {
            break (metrics, mine);
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never showed {owned} and 3 gateways: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let value = |line: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .map(str::trim)
    };
    let out = value("oncegate_partition_handoffs_total{direction=\"out\"} ")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert_eq!(
        out,
        partitions - mine,
        "it handed over what the others own: {metrics}"
    );
    assert!(
        metrics.contains("oncegate_partition_handoff_seconds"),
        "{metrics}"
    );
    downstream
        .wait_for("phase one", |got| got.len() >= CHATS * PER_PHASE)
        .await;
    // Phase 2: a batch posted once all three share the partitions: every gateway delivers a
    // part of it, and every event once.
    let mut before = Vec::new();
    for gateway in gateways.iter().flatten() {
        before.push(delivered(&gateway.stats().await));
    }
    let urls = Arc::new(urls_list);
    for sender in send_phase(&urls, PER_PHASE, 2 * PER_PHASE, Duration::ZERO, &acked) {
        sender.await.expect("sender");
    }
    downstream
        .wait_for("phase two", |got| got.len() >= 2 * CHATS * PER_PHASE)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = downstream.got();
    assert_eq!(
        got.len(),
        2 * CHATS * PER_PHASE,
        "each event once through the joins"
    );
    let mut parts = Vec::new();
    for (gateway, before) in gateways.iter().flatten().zip(&before) {
        parts.push(delivered(&gateway.stats().await) - before);
    }
    assert_eq!(
        parts.iter().sum::<u64>(),
        (CHATS * PER_PHASE) as u64,
        "{parts:?}"
    );
    assert!(
        parts.iter().all(|&part| part > 0),
        "every gateway delivers part of the batch: {parts:?}"
    );
    // Phase 3: while the chats send, the second gateway stops and the third is killed. A
    // slower downstream keeps a backlog, so that the kill leaves events behind.
    downstream.behavior.lock().expect("behavior").delay = DOWNSTREAM * 5;
    let senders = send_phase(
        &urls,
        2 * PER_PHASE,
        3 * PER_PHASE,
        Duration::from_millis(30),
        &acked,
    );
    acked_at_least(
        &acked,
        acked.load(Ordering::Relaxed) + CHATS * PER_PHASE / 4,
        &senders,
    )
    .await;
    let stopping = gateways[1].take().expect("g1");
    let stopped_name = owners(&stopping).await["this_gateway"].clone();
    stopping.stop();
    let stopped = Instant::now();
    // Its partitions move at once (the ownership would take 4 s to run out).
    owners_until(
        gateways[0].as_ref().expect("g0"),
        Duration::from_secs(3),
        "the stopped gateway's partitions taken over",
        |o| {
            o["gateways"]
                .get(stopped_name.as_str().unwrap_or("-"))
                .is_none()
                && gateway_counts(o).iter().sum::<u64>() == partitions
        },
    )
    .await;
    let moved_after_stop = stopped.elapsed();
    let killed = gateways[2].take().expect("g2");
    let left_behind = queued_here(&killed).await;
    killed.kill9();
    for sender in senders {
        sender.await.expect("sender");
    }
    let all = 3 * CHATS * PER_PHASE;
    downstream
        .wait_for("every event", |got| {
            got.iter()
                .map(|g| &g.event_id)
                .collect::<std::collections::HashSet<_>>()
                .len()
                == all
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = downstream.got();
    let mut keys: HashMap<&str, std::collections::HashSet<&str>> = HashMap::new();
    let mut per_chat: HashMap<&str, Vec<&str>> = HashMap::new();
    for g in &got {
        keys.entry(&g.event_id)
            .or_default()
            .insert(&g.idempotency_key);
        per_chat
            .entry(g.order_key.as_deref().unwrap_or_default())
            .or_default()
            .push(&g.event_id);
    }
    assert!(
        keys.values().all(|k| k.len() == 1),
        "a repeat carries the same Idempotency-Key"
    );
    assert!(
        left_behind > 0,
        "the kill left nothing behind: the test shows nothing"
    );
    // Only handlers running at the kill may run again: at most one per chat, right after itself.
    let repeats = got.len() - keys.len();
    assert!(repeats <= CHATS, "{repeats} repeats");
    for chat in 0..CHATS {
        let mut seen = per_chat[format!("oc_scale{chat}").as_str()].clone();
        seen.dedup();
        let expected: Vec<String> = (0..3 * PER_PHASE)
            .map(|n| format!("scale-{chat}-{n}"))
            .collect();
        assert_eq!(
            seen, expected,
            "chat {chat} in order, each event once but at the kill"
        );
    }
    eprintln!(
        "three gateways on {label}: shares settled {:.1} s after the joins started, a batch split {parts:?}, \
         a stopped gateway's partitions moved in {:.1} s, a killed one left {left_behind} events behind, \
         {repeats} repeats after the kill, {} deliveries for {all} events",
        settled.as_secs_f64(),
        moved_after_stop.as_secs_f64(),
        got.len()
    );
}
