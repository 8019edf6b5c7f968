//! The fault suite: real gateways, a real Redis, a receiver that applies each Idempotency-Key
//! once, a platform that retries what was not answered 200 — and faults injected while the
//! events flow: kill -9 and SIGSTOP of the gateway and of Redis, a primary's failover to its
//! replica under Sentinel, a blackhole and cut
//! connections on the way to Redis and to the downstream, flaky, `Retry-After`-answering and
//! hung downstreams. The checker reads the history: every event the platform saw acknowledged
//! delivered (lost), applied under one key (twice), each chat's events applied in the order the
//! platform sent them, raw re-deliveries, the platform's retries, and how long after the fault
//! the last event arrived.
//!
//! The embedded store's journal damaged at rest while the gateway is down: a flipped byte
//! refuses the start with the file named (nothing cut), and the operator's restored file starts;
//! a torn last write (a later block of it on the disk, an earlier one not) is cut, kept beside
//! the segment and said.
//!
//! A WeCom AI bot's long connection (`faults/aibot.rs`): slow replies past the 64 that run at
//! once with the connection cut while they wait, and a flood past `dispatcher.max_queued` — every
//! callback handled once and every reply on the wire once.
//!
//! CI runs it shortened; `FAULT_SCALE=10 cargo test -p oncegate --test binary faults:: -- --nocapture`
//! is the soak. The table goes to stdout and `target/test-output/faults.md` (RELIABILITY.md
//! publishes it).

mod aibot;
use crate::e2e;
use crate::support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::proxy::{FaultProxy, Mode};
use e2e::*;

/// Chats, each sent in order by one platform sender.
const CHATS: usize = 12;
/// The pause between a chat's events: the traffic spans the fault.
const PACE: Duration = Duration::from_millis(40);

fn scale() -> usize {
    std::env::var("FAULT_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// One scenario's figures.
#[derive(Debug)]
struct Row {
    scenario: &'static str,
    /// Whether the figures show the fault was felt where it must be.
    felt: fn(&Row) -> bool,
    acknowledged: usize,
    lost: usize,
    twice: usize,
    out_of_order: usize,
    redeliveries: usize,
    retries: usize,
    /// From the fault's end to the first delivery attempt after it, and to the last event's
    /// arrival (the traffic still being sent included).
    first_ms: u128,
    recovery_ms: u128,
    /// What else shows the fault (the rows that read it say what: connections dialled again,
    /// callbacks admitted over the bound).
    seen: usize,
    /// Events the platform sent: every one must end acknowledged.
    sent: usize,
}

/// The platform: one sender per chat, each event posted (signed, fresh stamp each time) until
/// it is answered 200 — Feishu's retry schedule compressed to 100 ms doubling to 1 s.
struct Platform {
    acked: Arc<Mutex<Vec<String>>>,
    retries: Arc<AtomicUsize>,
    senders: Vec<tokio::task::JoinHandle<()>>,
}

impl Platform {
    fn start(url: &str, prefix: &str, per_chat: usize) -> Self {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let retries = Arc::new(AtomicUsize::new(0));
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .expect("client");
        let senders = (0..CHATS)
            .map(|chat| {
                let (client, url, acked, retries) = (
                    client.clone(),
                    url.to_owned(),
                    acked.clone(),
                    retries.clone(),
                );
                let prefix = prefix.to_owned();
                tokio::spawn(async move {
                    for i in 0..per_chat {
                        let id = format!("{prefix}-{chat}-{i}");
                        let plain = message(&id, &format!("oc_{prefix}_{chat}"), 1_000 + i as u64);
                        let mut wait = Duration::from_millis(100);
                        let deadline = Instant::now() + Duration::from_secs(60);
                        loop {
                            if let Ok((200, _)) = post(&client, &url, &sign(&plain)).await {
                                break;
                            }
                            assert!(Instant::now() < deadline, "{id} never acknowledged");
                            retries.fetch_add(1, Relaxed);
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(Duration::from_secs(1));
                        }
                        acked.lock().expect("acked").push(id);
                        tokio::time::sleep(PACE).await;
                    }
                })
            })
            .collect();
        Self {
            acked,
            retries,
            senders,
        }
    }

    async fn wait_acked(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.acked.lock().expect("acked").len() < count {
            assert!(
                Instant::now() < deadline,
                "{count} events never acknowledged"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits for every sender; what was acknowledged and how many retries it took.
    async fn finish(self) -> (Vec<String>, usize) {
        for sender in self.senders {
            sender.await.expect("sender");
        }
        let acked = self.acked.lock().expect("acked").clone();
        (acked, self.retries.load(Relaxed))
    }
}

/// The gateway's configuration: fixed ports (a restart keeps them), `store`, events to `sink`.
fn config(dir: &Path, store: &str, sink: SocketAddr) -> PathBuf {
    let path = dir.join("oncegate.toml");
    let (listen, admin) = (free_port(), free_port());
    std::fs::write(
        &path,
        format!(
            r#"
[store]
{store}

[server]
listen = "127.0.0.1:{listen}"
admin_listen = "127.0.0.1:{admin}"

[dispatcher]
concurrency = 32
max_attempts = 100
backoff_base = "50ms"
backoff_max = "500ms"
shutdown_grace = "2s"

[lease]
duration = "5s"
renew_every = "1s"

[[source]]
name = "main"
platform = "feishu"
app_id = "{APP_ID}"
encrypt_key = "{ENCRYPT_KEY}"
verification_token = "{TOKEN}"

[[route]]
events = ["*"]
sink = "http"
url = "http://{sink}/events"
secret = "{SECRET}"
timeout = "1s"
"#
        ),
    )
    .expect("config");
    path
}

fn embedded(dir: &Path) -> String {
    format!(
        "backend = \"embedded\"\npath = \"{}\"\npartitions = 8",
        dir.join("store").display()
    )
}

fn on_redis(url: &str) -> String {
    format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"faults{}\"\npartitions = 8",
        fastrand::u32(..)
    )
}

/// Waits until every acknowledged event reached the receiver (60 s at most), then reads the
/// history.
async fn check(
    scenario: &'static str,
    felt: fn(&Row) -> bool,
    downstream: &Downstream,
    acked: &[String],
    retries: usize,
    fault_over: Instant,
) -> Row {
    let wanted: HashSet<&str> = acked.iter().map(String::as_str).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = downstream.got();
        let arrived: HashSet<&str> = got.iter().map(|g| g.event_id.as_str()).collect();
        if wanted.iter().all(|id| arrived.contains(id)) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovery_ms = fault_over.elapsed().as_millis();
    let first_ms = {
        let behavior = downstream.behavior.lock().expect("behavior");
        behavior
            .attempts
            .values()
            .flatten()
            .filter(|at| **at >= fault_over)
            .min()
            .map_or(0, |at| at.duration_since(fault_over).as_millis())
    };
    // Late repeats (a handler re-run after a lease ran out) have a moment to show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = downstream.got();
    let mut keys: HashMap<&str, HashSet<&str>> = HashMap::new();
    for g in &got {
        keys.entry(&g.event_id)
            .or_default()
            .insert(&g.idempotency_key);
    }
    let lost = wanted.iter().filter(|id| !keys.contains_key(*id)).count();
    let twice = keys.values().map(|k| k.len() - 1).sum();
    // Each chat's first applications must follow the platform's order (its senders wait for
    // each acknowledgement).
    let mut applied: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut seen = HashSet::new();
    for g in &got {
        if seen.insert(g.event_id.as_str())
            && let Some((chat, index)) = g.event_id.rsplit_once('-')
        {
            applied
                .entry(chat.to_owned())
                .or_default()
                .push(index.parse().unwrap_or(0));
        }
    }
    let out_of_order = applied
        .values()
        .map(|order| order.windows(2).filter(|w| w[1] < w[0]).count())
        .sum();
    Row {
        scenario,
        felt,
        acknowledged: acked.len(),
        lost,
        twice,
        out_of_order,
        redeliveries: got.len() - keys.len(),
        retries,
        first_ms,
        recovery_ms,
        seen: 0,
        sent: CHATS * per_chat(),
    }
}

/// The fault window's start: a third of the events acknowledged.
async fn third(platform: &Platform) {
    platform.wait_acked(CHATS * per_chat() / 3).await;
}

fn per_chat() -> usize {
    60 * scale()
}

async fn gateway_kill_9() -> Row {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let config = config(dir.path(), &embedded(dir.path()), addr);
    let gateway = Gateway::run(&config);
    let platform = Platform::start(&gateway.url, "k9", per_chat());
    third(&platform).await;
    gateway.kill9();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _gateway = Gateway::run(&config);
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "gateway kill -9, restart",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn gateway_sigstop() -> Row {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let gateway = Gateway::run(&config(dir.path(), &embedded(dir.path()), addr));
    let platform = Platform::start(&gateway.url, "stop", per_chat());
    third(&platform).await;
    gateway.signal("STOP");
    tokio::time::sleep(Duration::from_secs(2)).await;
    gateway.signal("CONT");
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "gateway SIGSTOP 2 s",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn redis_kill_9() -> Row {
    let mut redis = OwnRedis::start();
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let gateway = Gateway::run(&config(dir.path(), &on_redis(&redis.url()), addr));
    let platform = Platform::start(&gateway.url, "rk9", per_chat());
    third(&platform).await;
    redis.kill9();
    tokio::time::sleep(Duration::from_millis(700)).await;
    redis.run();
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "Redis kill -9, restart (fsync)",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn sentinel_failover() -> Row {
    let mut redis = Replicated::start();
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let store = format!(
        "{}\ndurability = \"replicas\"\nmin_replicas = 1\nreplica_wait = \"500ms\"",
        on_redis(&redis.url())
    );
    let gateway = Gateway::run(&config(dir.path(), &store, addr));
    let platform = Platform::start(&gateway.url, "fail", per_chat());
    third(&platform).await;
    redis.fail_over().await;
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "Redis primary kill -9, Sentinel failover (replicas)",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn redis_sigstop() -> Row {
    let redis = OwnRedis::start();
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let gateway = Gateway::run(&config(dir.path(), &on_redis(&redis.url()), addr));
    let platform = Platform::start(&gateway.url, "rstop", per_chat());
    third(&platform).await;
    redis.pause(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    redis.pause(false);
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "Redis SIGSTOP 2 s",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn redis_blackhole() -> Row {
    let redis = OwnRedis::start();
    let target: SocketAddr = format!("127.0.0.1:{}", redis.port).parse().expect("addr");
    let proxy = FaultProxy::start(target).await;
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let url = format!("redis://{}", proxy.addr);
    let gateway = Gateway::run(&config(dir.path(), &on_redis(&url), addr));
    let platform = Platform::start(&gateway.url, "hole", per_chat());
    third(&platform).await;
    proxy.set(Mode::Blackhole);
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set(Mode::Pass);
    proxy.cut_all();
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "gateway↔Redis blackhole 2 s, then cut",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn downstream_cuts() -> Row {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let proxy = FaultProxy::start(addr).await;
    let gateway = Gateway::run(&config(dir.path(), &embedded(dir.path()), proxy.addr));
    let platform = Platform::start(&gateway.url, "cut", per_chat());
    third(&platform).await;
    // Responses 200 ms late, and every connection cut every 300 ms, for 2 s: deliveries that
    // reached the receiver lose their answer and are sent again.
    proxy.set(Mode::Delay(Duration::from_millis(200)));
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.cut_all();
    }
    proxy.set(Mode::Pass);
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "gateway↔downstream latency + cuts 2 s",
        row_redelivered,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn downstream_flaky() -> Row {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    {
        let mut behavior = downstream.behavior.lock().expect("behavior");
        behavior.delay = Duration::from_millis(2);
        for chat in 0..CHATS {
            for i in 0..per_chat() {
                let id = format!("flaky-{chat}-{i}");
                match i % 7 {
                    0 => {
                        behavior.transient.insert(id, 2);
                    }
                    3 => {
                        behavior.retry_after.insert(id, 1);
                    }
                    _ => {}
                }
            }
        }
    }
    let gateway = Gateway::run(&config(dir.path(), &embedded(dir.path()), addr));
    let platform = Platform::start(&gateway.url, "flaky", per_chat());
    let (acked, retries) = platform.finish().await;
    // The fault lasts the whole run: counted from the last acknowledgement.
    let over = Instant::now();
    check(
        "downstream 503s and 429 Retry-After: 1",
        row_retried_downstream,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn downstream_hung() -> Row {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let gateway = Gateway::run(&config(dir.path(), &embedded(dir.path()), addr));
    let platform = Platform::start(&gateway.url, "hung", per_chat());
    third(&platform).await;
    // Applies, then answers after 3 s, past the sink's 1 s timeout: every attempt in the
    // window times out after the receiver applied it.
    downstream.behavior.lock().expect("behavior").answer_late = Duration::from_secs(3);
    tokio::time::sleep(Duration::from_secs(2)).await;
    downstream.behavior.lock().expect("behavior").answer_late = Duration::ZERO;
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "downstream hung 2 s (applies, answers after the timeout)",
        row_redelivered,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

/// The newest segment of the embedded store in `dir`, and where its frames end (the zeroed
/// room a kill leaves after them starts there).
fn newest_segment(dir: &Path) -> (PathBuf, usize) {
    let segment = std::fs::read_dir(dir.join("store"))
        .expect("the store folder")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("segment-") && n.ends_with(".log"))
        })
        .max()
        .expect("a segment");
    let bytes = std::fs::read(&segment).expect("read the segment");
    let end = bytes.iter().rposition(|byte| *byte != 0).expect("frames") + 1;
    (segment, end)
}

async fn journal_flipped_byte() -> Row {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let config = config(dir.path(), &embedded(dir.path()), addr);
    let gateway = Gateway::run(&config);
    let platform = Platform::start(&gateway.url, "flip", per_chat());
    third(&platform).await;
    gateway.kill9();
    let (segment, end) = newest_segment(dir.path());
    let mut bytes = std::fs::read(&segment).expect("read");
    bytes[end / 2] ^= 0x01;
    std::fs::write(&segment, &bytes).expect("damage");
    let said = support::refused_start(&config, &[]);
    let name = segment.file_name().expect("name").to_string_lossy();
    assert!(
        said.contains(&*name) && said.contains("damaged at byte"),
        "the refusal names the file and the offset: {said}"
    );
    // The operator puts the file back as it was (from a backup) and starts again.
    bytes[end / 2] ^= 0x01;
    std::fs::write(&segment, &bytes).expect("restore");
    let _gateway = Gateway::run(&config);
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    check(
        "journal: a byte flipped at rest, start refused, file restored",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

async fn journal_torn_write() -> Row {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    let config = config(dir.path(), &embedded(dir.path()), addr);
    let gateway = Gateway::run(&config);
    let platform = Platform::start(&gateway.url, "torn", per_chat());
    third(&platform).await;
    gateway.kill9();
    // A last write whose later block reached the disk and whose earlier ones did not, as a
    // power loss can leave it: bytes in the zeroed room after the frames.
    let (segment, end) = newest_segment(dir.path());
    let mut bytes = std::fs::read(&segment).expect("read");
    let block = (end / 512 + 2) * 512;
    assert!(
        bytes.len() >= block + 512,
        "the zeroed room after the frames"
    );
    bytes[block..block + 512].fill(0xA5);
    std::fs::write(&segment, &bytes).expect("tear");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _gateway = Gateway::run(&config);
    let over = Instant::now();
    let (acked, retries) = platform.finish().await;
    let kept: Vec<PathBuf> = std::fs::read_dir(dir.path().join("store"))
        .expect("list")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.to_string_lossy().contains(".cut-at-"))
        .collect();
    assert_eq!(
        kept.len(),
        1,
        "the cut is kept beside the segment: {kept:?}"
    );
    let cut = std::fs::read(&kept[0]).expect("read the cut");
    assert!(
        cut.ends_with(&[0xA5; 512]),
        "the torn bytes are what was cut"
    );
    check(
        "journal: a torn last write at rest, cut and kept",
        row_retried,
        &downstream,
        &acked,
        retries,
        over,
    )
    .await
}

fn row_retried(row: &Row) -> bool {
    row.retries > 0
}

fn row_redelivered(row: &Row) -> bool {
    row.redeliveries > 0
}

/// The flaky downstream's failures are answered before anything is applied: no re-delivery
/// reaches the receiver, but the run takes the retries' time.
fn row_retried_downstream(row: &Row) -> bool {
    row.recovery_ms > 1_000
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | acknowledged | lost | applied twice | out of chat order | raw re-deliveries | platform retries | first delivery after the fault | last event in |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} ms | {} ms |\n",
            r.scenario,
            r.acknowledged,
            r.lost,
            r.twice,
            r.out_of_order,
            r.redeliveries,
            r.retries,
            r.first_ms,
            r.recovery_ms
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_event_is_applied_once_in_order_under_faults() {
    let rows = vec![
        gateway_kill_9().await,
        gateway_sigstop().await,
        redis_kill_9().await,
        sentinel_failover().await,
        redis_sigstop().await,
        redis_blackhole().await,
        downstream_cuts().await,
        downstream_flaky().await,
        downstream_hung().await,
        journal_flipped_byte().await,
        journal_torn_write().await,
        aibot::slow_replies_and_a_cut().await,
        aibot::flood_past_the_bound().await,
    ];
    let table = table(&rows);
    println!("{table}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let path = target.join("test-output/faults.md");
    std::fs::create_dir_all(path.parent().expect("folder")).expect("folder");
    std::fs::write(&path, &table).expect("table");
    // Each fault was felt where it should be: the platform had to retry (the gateway or its
    // store could not answer), or the receiver got deliveries again (answers lost).
    for row in &rows {
        assert!(
            (row.felt)(row),
            "{}: the fault was not felt\n{table}",
            row.scenario
        );
    }
    for row in &rows {
        assert_eq!(row.lost, 0, "{}: lost\n{table}", row.scenario);
        assert_eq!(row.twice, 0, "{}: applied twice\n{table}", row.scenario);
        assert_eq!(
            row.out_of_order, 0,
            "{}: out of order\n{table}",
            row.scenario
        );
        assert_eq!(
            row.acknowledged, row.sent,
            "{}: every event acknowledged in the end",
            row.scenario
        );
    }
}
