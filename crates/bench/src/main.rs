//! `oncegate-bench`: oncegate's stores side by side with a baseline of the seed design, in one
//! run, printed as a table.
//!
//! Run with `cargo run --release -p oncegate-bench`.

mod baseline;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::Parser;
use oncegate_core::{
    Admission, Claim, Clock, DedupStore, Event, EventQueue, KeyHash, SystemClock, key_for,
};
use oncegate_embedded::{EmbeddedConfig, EmbeddedStore};
use oncegate_memory::{MemoryConfig, MemoryStore};

use baseline::{MinimalStore, SeedDeduplicator};

/// Benchmarks of oncegate's stores against the seed design.
#[derive(Debug, Parser)]
struct Args {
    /// Operations per thread for the memory throughput runs.
    #[arg(long, default_value_t = 2_000_000)]
    ops: u64,
    /// Keys for the memory-per-key measurement.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Seconds per embedded run.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Concurrent callers for the embedded runs.
    #[arg(long, default_value_t = 64)]
    callers: usize,
    /// Folder for the embedded store files (on disk, not tmpfs, for honest fsyncs).
    #[arg(long, default_value = "target/bench-data")]
    dir: PathBuf,
    /// Only these parts: admit, claim, memory, embedded, journal, restart.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// A Redis to measure the Redis backend on (part "redis"): our admits with `callers`
    /// concurrent callers vs. redis-benchmark running the admit script pipelined.
    #[arg(long)]
    redis_url: Option<String>,
    /// Run only one side of the throughput comparisons (for profiling): ours or baseline.
    #[arg(long)]
    side: Option<String>,
    /// Serve a bare HTTP endpoint on this address that answers every POST with 200 and does
    /// nothing else: the ceiling for the gateway benchmark (`scripts/bench-gateway`).
    #[arg(long)]
    bare_server: Option<String>,
    /// Serve a slow downstream on this address for `scripts/bench-scale`: every POST is
    /// answered 204 after `--delay-ms`, and counted; `GET /count` answers the count with the
    /// first and last delivery's unix ms, `GET /reset` starts counting again.
    #[arg(long)]
    slow_sink: Option<String>,
    /// The slow downstream's time per request.
    #[arg(long, default_value_t = 40)]
    delay_ms: u64,
    /// Write a new embedded store folder at this path that remembers `--keys` completed events
    /// (retention a day), for a gateway to start on (`scripts/bench-retention`), and exit.
    #[arg(long, value_name = "DIR")]
    fill_store: Option<PathBuf>,
    /// Queue partitions of the folder `--fill-store` writes (the gateway's configuration's;
    /// without it, the gateway's default).
    #[arg(long)]
    partitions: Option<u16>,
    /// Internal: measure memory per key in a fresh process.
    #[arg(long, hide = true)]
    child: Option<String>,
}

/// The allocator the gateway runs with (see the CLI), so that the stores are measured as they
/// run there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const THREADS: u64 = 2;
const DAY: Duration = Duration::from_secs(86_400);

/// Polls a future that completes without waiting (the memory store's) to its end.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
    }
}

/// The event ids of one thread: every other operation is a new id, the rest repeat an earlier
/// id of the same thread picked at random, so half the keys are duplicates.
struct Workload {
    state: u64,
    base: u64,
}

impl Workload {
    fn new(thread: u64) -> Self {
        Self {
            state: 0x9E37_79B9_7F4A_7C15 ^ (thread + 1),
            base: thread << 40,
        }
    }
    fn id(&mut self, op: u64) -> u64 {
        if op.is_multiple_of(2) {
            return self.base + op / 2;
        }
        // xorshift64
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.base + self.state % (op / 2 + 1)
    }
}

struct Strings {
    platform: Arc<str>,
    app: Arc<str>,
    kind: Arc<str>,
}

impl Strings {
    /// Per thread, as a decoder interns them per connection.
    fn new() -> Self {
        Self {
            platform: Arc::from("feishu"),
            app: Arc::from("cli_bench"),
            kind: Arc::from("im.message.receive_v1"),
        }
    }
    fn event(&self, id: u64) -> Event {
        Event {
            platform: self.platform.clone(),
            app: self.app.clone(),
            tenant: None,
            event_id: format!("ev_{id:016x}").into(),
            event_type: self.kind.clone(),
            created_at_ms: id,
            order_key: Some(format!("oc_{:08x}", id % 4096).into()),
            payload: Bytes::from_static(b"{\"text\":\"hello\"}"),
        }
    }
}

fn run_threads(f: impl Fn(u64) -> u64 + Sync) -> (u64, Duration) {
    let start = Instant::now();
    let done: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let f = &f;
                scope.spawn(move || f(thread))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    (done, start.elapsed())
}

/// Runs the seed's cleanup timer while `f` runs (every second: the seed's 5 minutes, scaled to
/// a benchmark's length so that it runs at all).
fn with_seed_cleanup<T>(seed: &SeedDeduplicator, f: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                seed.cleanup(SystemClock.now_ms(), DAY.as_millis() as u64);
            }
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        out
    })
}

/// The events each thread will admit, made before the clock starts so that both sides are
/// timed on the store alone.
fn workload_events(ops: u64) -> Vec<Vec<Event>> {
    (0..THREADS)
        .map(|thread| {
            let strings = Strings::new();
            let mut work = Workload::new(thread);
            (0..ops).map(|op| strings.event(work.id(op))).collect()
        })
        .collect()
}

/// Each thread's events, made before the clock starts; a thread takes its own once.
struct PerThread(std::sync::Mutex<Vec<Vec<Event>>>);

impl PerThread {
    fn new(ops: u64) -> Self {
        Self(std::sync::Mutex::new(workload_events(ops)))
    }

    fn take(&self, thread: u64) -> Vec<Event> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.get_mut(thread as usize)
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

fn admit_ours(ops: u64) -> f64 {
    let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
    admit_rate(ops, |event, key| {
        matches!(
            ready(store.admit(event, &[key], DAY)),
            Ok(Admission::Admitted { .. })
        )
    })
}

/// Admits per second when each thread hands its events to `admit` (true: admitted), which
/// must admit exactly the half that are new.
fn admit_rate(ops: u64, admit: impl Fn(Event, KeyHash) -> bool + Sync) -> f64 {
    let events = PerThread::new(ops);
    let take = |thread: u64| events.take(thread);
    let (admitted, elapsed) = run_threads(|thread| {
        let mine = take(thread);
        let mut admitted = 0;
        for event in mine {
            let key = key_for(&event.platform, &event.app, "event_id", &event.event_id);
            if admit(event, key) {
                admitted += 1;
            }
        }
        admitted
    });
    check_half(admitted, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

/// The floor: each thread only hashes the key and moves the event into its own vector (no
/// dedup, no sharing). No store can admit faster than this on these events.
fn admit_floor(ops: u64) -> f64 {
    let events = PerThread::new(ops);
    let take = |thread: u64| events.take(thread);
    let (_, elapsed) = run_threads(|thread| {
        let mine = take(thread);
        let mut kept = Vec::new();
        for event in mine {
            let key = key_for(&event.platform, &event.app, "event_id", &event.event_id);
            if key.low64() & 1 == 0 {
                kept.push(event);
            }
        }
        std::hint::black_box(&kept);
        kept.len() as u64
    });
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

/// The second floor: [`MinimalStore`], sharded dedup and a partitioned queue with nothing else.
fn admit_minimal(ops: u64) -> f64 {
    let store = MinimalStore::new();
    admit_rate(ops, |event, key| store.admit(event, key))
}

fn admit_seed(ops: u64) -> f64 {
    let seed = SeedDeduplicator::default();
    let events = PerThread::new(ops);
    let take = |thread: u64| events.take(thread);
    let (admitted, elapsed) = with_seed_cleanup(&seed, || {
        run_threads(|thread| {
            let mine = take(thread);
            let mut admitted = 0;
            for event in mine {
                if seed.admit(event, SystemClock.now_ms()) {
                    admitted += 1;
                }
            }
            admitted
        })
    });
    check_half(admitted, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

fn claim_ours(ops: u64) -> f64 {
    let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
    let (completed, elapsed) = run_threads(|thread| {
        let mut work = Workload::new(thread);
        let mut completed = 0;
        let mut id_text = String::new();
        for op in 0..ops {
            use std::fmt::Write;
            id_text.clear();
            let _ = write!(id_text, "ev_{:016x}", work.id(op));
            let key = key_for("feishu", "cli_bench", "event_id", &id_text);
            if let Ok(Claim::Acquired(lease)) =
                ready(store.claim(&key, key.home(store.partitions()), Duration::from_secs(300)))
                && ready(store.complete(&lease, DAY, None)).is_ok()
            {
                completed += 1;
            }
        }
        completed
    });
    check_half(completed, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

fn claim_seed(ops: u64) -> f64 {
    let seed = SeedDeduplicator::default();
    let (completed, elapsed) = with_seed_cleanup(&seed, || {
        run_threads(|thread| {
            let mut work = Workload::new(thread);
            let mut completed = 0;
            let mut id_text = String::new();
            for op in 0..ops {
                use std::fmt::Write;
                id_text.clear();
                let _ = write!(id_text, "ev_{:016x}", work.id(op));
                let now = SystemClock.now_ms();
                if seed.try_mark_processing(&id_text, now, 300_000) {
                    seed.mark_completed(&id_text, now);
                    completed += 1;
                }
            }
            completed
        })
    });
    check_half(completed, ops);
    (ops * THREADS) as f64 / elapsed.as_secs_f64()
}

fn check_half(done: u64, ops: u64) {
    let expected = ops / 2 * THREADS;
    if done != expected {
        eprintln!(
            "warning: {done} of {} operations took effect, expected {expected}",
            ops * THREADS
        );
    }
}

fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("read /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .context("parse /proc/self/statm")?;
    Ok(pages * 4096)
}

/// In a fresh process: tracked keys after claim → complete of `keys` distinct ids, as RSS growth
/// per key.
fn child_memory(which: &str, keys: u64) -> anyhow::Result<()> {
    let mut id_text = String::new();
    let mut write_id = |i: u64| {
        use std::fmt::Write;
        id_text.clear();
        let _ = write!(id_text, "ev_{i:016x}");
        id_text.clone()
    };
    let before;
    let after;
    match which {
        "ours" => {
            let store = MemoryStore::with_clock(
                MemoryConfig {
                    max_records: keys * 2,
                    ..MemoryConfig::default()
                },
                SystemClock,
            );
            before = rss_bytes()?;
            for i in 0..keys {
                let key = key_for("feishu", "cli_bench", "event_id", &write_id(i));
                if let Ok(Claim::Acquired(lease)) =
                    ready(store.claim(&key, key.home(store.partitions()), Duration::from_secs(300)))
                {
                    let _ = ready(store.complete(&lease, DAY, None));
                }
            }
            after = rss_bytes()?;
            if store.held_records() as u64 != keys {
                bail!("expected {keys} records, hold {}", store.held_records());
            }
        }
        "seed" => {
            let seed = SeedDeduplicator::default();
            before = rss_bytes()?;
            let now = SystemClock.now_ms();
            for i in 0..keys {
                let id = write_id(i);
                if seed.try_mark_processing(&id, now, 300_000) {
                    seed.mark_completed(&id, now);
                }
            }
            after = rss_bytes()?;
            std::hint::black_box(&seed);
        }
        other => bail!("unknown child {other}"),
    }
    println!("{}", after.saturating_sub(before) as f64 / keys as f64);
    Ok(())
}

fn memory_per_key(which: &str, keys: u64) -> anyhow::Result<f64> {
    let exe = std::env::current_exe()?;
    let output = std::process::Command::new(exe)
        .args(["--child", which, "--keys", &keys.to_string()])
        .env("MIMALLOC_PURGE_DELAY", "0")
        .output()?;
    if !output.status.success() {
        bail!(
            "child {which} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().parse()?)
}

/// Durable admits per second, and the mean batch and commit time behind it.
struct EmbeddedRun {
    admits_per_sec: f64,
    mean_batch: f64,
    ms_per_commit: f64,
}

fn embedded_admits(
    dir: &std::path::Path,
    max_batch: usize,
    callers: usize,
    seconds: u64,
) -> anyhow::Result<EmbeddedRun> {
    let path = dir.join(format!("bench-{max_batch}.redb"));
    let _ = std::fs::remove_file(&path);
    let store = Arc::new(EmbeddedStore::open(EmbeddedConfig {
        max_batch,
        ..EmbeddedConfig::at(&path)
    })?);
    let (admits_per_sec, _) = durable_events(store.clone(), callers, seconds, false)?;
    let (commits, requests, committing) = store.commit_stats();
    drop(store);
    let _ = std::fs::remove_file(&path);
    Ok(EmbeddedRun {
        admits_per_sec,
        mean_batch: requests as f64 / commits.max(1) as f64,
        ms_per_commit: committing.as_secs_f64() * 1000.0 / commits.max(1) as f64,
    })
}

/// `callers` concurrent callers admit for `seconds` (and, with `handle`, claim and complete
/// each event they admitted): (events per second, CPU µs of this process per event).
fn durable_events<S: DedupStore + EventQueue>(
    store: Arc<S>,
    callers: usize,
    seconds: u64,
    handle: bool,
) -> anyhow::Result<Durable> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS as usize)
        .enable_all()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let cpu_before = process_cpu_seconds()?;
    let admitted: u64 = runtime.block_on(async {
        let mut tasks = Vec::new();
        for caller in 0..callers as u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let strings = Strings::new();
                let mut work = Workload::new(caller);
                let mut admitted = 0u64;
                let mut op = 0;
                while Instant::now() < deadline {
                    let event = strings.event(work.id(op));
                    op += 1;
                    let key = key_for(&strings.platform, &strings.app, "event_id", &event.event_id);
                    let partition = event.partition(store.partitions());
                    let Ok(Admission::Admitted { .. }) = store.admit(event, &[key], DAY).await
                    else {
                        continue;
                    };
                    admitted += 1;
                    if handle
                        && let Ok(Claim::Acquired(lease)) =
                            store.claim(&key, partition, Duration::from_secs(30)).await
                    {
                        let _ = store.complete(&lease, DAY, None).await;
                    }
                }
                admitted
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap_or(0);
        }
        total
    });
    let elapsed = start.elapsed();
    let cpu = process_cpu_seconds()? - cpu_before;
    Ok((
        admitted as f64 / elapsed.as_secs_f64(),
        cpu * 1e6 / admitted.max(1) as f64,
    ))
}

/// This process's user + system CPU seconds so far, from /proc.
fn process_cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unreadable /proc/self/stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |index: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(index)
            .context("short /proc/self/stat")?
            .parse::<f64>()?)
    };
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// How long the journal store takes to open on `keys` remembered keys (a full retention window
/// just snapshotted), and the folder's bytes: (seconds, bytes).
fn journal_restart(dir: &std::path::Path, keys: u64) -> anyhow::Result<(f64, u64)> {
    let folder = dir.join(format!("bench-restart-{keys}"));
    let _ = std::fs::remove_dir_all(&folder);
    let config = fill_store(oncegate_journal::JournalConfig::at(&folder), keys)?;
    let mut bytes = 0;
    for entry in std::fs::read_dir(&folder)? {
        bytes += entry?.metadata()?.len();
    }
    let start = Instant::now();
    let store = oncegate_journal::open(config)?;
    let elapsed = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        store.held_records() as u64 == keys,
        "the reopened store holds {} of {keys} records",
        store.held_records()
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&folder);
    Ok((elapsed, bytes))
}

/// Writes a new store folder at `config.dir` whose snapshot remembers `keys` completed events
/// (retention a day from now) in `config.partitions` partitions; `config` to open it with, with
/// room for twice the keys so that nothing is evicted early.
fn fill_store(
    mut config: oncegate_journal::JournalConfig,
    keys: u64,
) -> anyhow::Result<oncegate_journal::JournalConfig> {
    use std::borrow::Cow;
    config.max_records = keys.saturating_mul(2);
    let record = oncegate_core::Record {
        state: oncegate_core::RecordState::Completed { outcome: None },
        expires_at_ms: SystemClock.now_ms() + DAY.as_millis() as u64,
        fingerprint: None,
    };
    oncegate_journal::import(&config, 0, |emit| {
        for id in 0..keys {
            emit(&oncegate_memory::Change::Record {
                key: key_for("feishu", "cli_bench", "event_id", &id.to_string()),
                record: Cow::Borrowed(&record),
            });
        }
    })?;
    Ok(config)
}

/// A durable run's (events per second, CPU µs per event).
type Durable = (f64, f64);

/// The journal store against the redb store on the same workload: admits alone, then admit,
/// claim and complete for each event; (journal, redb) pairs of (events/s, CPU µs per event).
fn journal_vs_redb(
    dir: &std::path::Path,
    callers: usize,
    seconds: u64,
) -> anyhow::Result<Vec<(&'static str, Durable, Durable)>> {
    let mut rows = Vec::new();
    for (name, handle) in [("admit", false), ("admit+claim+complete", true)] {
        let journal_dir = dir.join("bench-journal");
        let _ = std::fs::remove_dir_all(&journal_dir);
        let journal = Arc::new(oncegate_journal::open(
            oncegate_journal::JournalConfig::at(&journal_dir),
        )?);
        let ours = durable_events(journal.clone(), callers, seconds, handle)?;
        drop(journal);
        let _ = std::fs::remove_dir_all(&journal_dir);
        let path = dir.join("bench-redb.redb");
        let _ = std::fs::remove_file(&path);
        let redb = Arc::new(EmbeddedStore::open(EmbeddedConfig::at(&path))?);
        let theirs = durable_events(redb.clone(), callers, seconds, handle)?;
        drop(redb);
        let _ = std::fs::remove_file(&path);
        rows.push((name, ours, theirs));
    }
    Ok(rows)
}

/// Answers every `POST /webhook/{source}` with the gateway's success body, and nothing more.
fn bare_server(address: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS as usize)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = axum::Router::new().route(
            "/webhook/{source}",
            axum::routing::post(|_body: axum::body::Bytes| async { "{\"msg\":\"success\"}" }),
        );
        let listener = tokio::net::TcpListener::bind(address).await?;
        println!("bare server on http://{}", listener.local_addr()?);
        axum::serve(listener, app).await?;
        Ok(())
    })
}

/// Deliveries a slow downstream counted: how many, the first's and the last's unix ms.
#[derive(Default)]
struct SinkCount {
    count: u64,
    first_ms: u64,
    last_ms: u64,
}

/// A downstream that takes `delay` per request (`--slow-sink`), to make the dispatch the
/// bottleneck and see how it scales with gateways.
fn slow_sink(address: &str, delay: Duration) -> anyhow::Result<()> {
    use axum::routing::{get, post};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let counted = Arc::new(std::sync::Mutex::new(SinkCount::default()));
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    runtime.block_on(async move {
        let (on_post, on_count, on_reset) = (counted.clone(), counted.clone(), counted);
        let app = axum::Router::new()
            .route(
                "/count",
                get(move || async move {
                    let c = on_count.lock().unwrap_or_else(|p| p.into_inner());
                    format!(
                        "{{\"count\":{},\"first_ms\":{},\"last_ms\":{}}}",
                        c.count, c.first_ms, c.last_ms
                    )
                }),
            )
            .route(
                "/reset",
                get(move || async move {
                    *on_reset.lock().unwrap_or_else(|p| p.into_inner()) = SinkCount::default();
                    "{}"
                }),
            )
            .fallback(post(move |_body: axum::body::Bytes| async move {
                tokio::time::sleep(delay).await;
                let at = now_ms();
                let mut c = on_post.lock().unwrap_or_else(|p| p.into_inner());
                if c.count == 0 {
                    c.first_ms = at;
                }
                c.count += 1;
                c.last_ms = at;
                axum::http::StatusCode::NO_CONTENT
            }));
        let listener = tokio::net::TcpListener::bind(address).await?;
        println!(
            "slow sink on http://{} ({delay:?} a request)",
            listener.local_addr()?
        );
        axum::serve(listener, app).await?;
        Ok(())
    })
}

/// Admits per second through the Redis backend with `callers` concurrent callers.
fn redis_admits(url: &str, callers: usize, seconds: u64) -> anyhow::Result<f64> {
    let store = Arc::new(oncegate_redis::RedisStore::connect(
        oncegate_redis::RedisConfig {
            prefix: format!("bench{}", std::process::id()),
            // Benchmarks run on a throwaway Redis without persistence.
            durability: oncegate_redis::RedisDurability::Memory,
            ..oncegate_redis::RedisConfig::at(url)
        },
    )?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS as usize)
        .enable_all()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let requests: u64 = runtime.block_on(async {
        let mut tasks = Vec::new();
        for caller in 0..callers as u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let strings = Strings::new();
                let mut work = Workload::new(caller);
                let mut op = 0;
                while Instant::now() < deadline {
                    let event = strings.event(work.id(op));
                    op += 1;
                    let key = key_for(&strings.platform, &strings.app, "event_id", &event.event_id);
                    let _ = store.admit(event, &[key], DAY).await;
                }
                op
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap_or(0);
        }
        total
    });
    let rate = requests as f64 / start.elapsed().as_secs_f64();
    // What an operator's /admin/stats costs on this many records (a scan of every record).
    let counting = Instant::now();
    let stats = runtime.block_on(store.stats())?;
    let took = counting.elapsed();
    println!(
        "redis stats over {} records: {:.0} ms ({} records/s)",
        stats.pending + stats.processing + stats.completed,
        took.as_secs_f64() * 1e3,
        human((stats.pending + stats.processing + stats.completed) as f64 / took.as_secs_f64())
    );
    Ok(rate)
}

/// redis-benchmark running the same admit script by EVAL with `callers` clients, pipelined 16
/// deep, on random keys: the ceiling of this Redis for our script.
fn redis_benchmark_ceiling(url: &str, callers: usize) -> anyhow::Result<f64> {
    let address = url.trim_start_matches("redis://");
    let (host, port) = address.split_once(':').unwrap_or((address, "6379"));
    let port = port.trim_end_matches(|c: char| !c.is_ascii_digit());
    let script = oncegate_redis::ADMIT_LUA;
    let output = std::process::Command::new("redis-benchmark")
        .args(["-h", host, "-p", port, "-c", &callers.to_string(), "-n", "300000", "-P", "16", "-r", "100000000", "-q"])
        .args(["EVAL", script, "3", "ceil:r:__rand_int__", "ceil:q:0", "ceil:qseq:0", "1700000000000", "86400000", "1", "00", "1", "payload-of-about-one-hundred-bytes-payload-of-about-one-hundred-bytes-payload-of-about", "60000"])
        .output()
        .context("run redis-benchmark (Debian's redis-tools)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "EVAL ...: 123456.79 requests per second, p50=..."
    let rate = text
        .split("requests per second")
        .next()
        .and_then(|head| head.rsplit(' ').find(|w| !w.is_empty()))
        .and_then(|n| n.parse::<f64>().ok())
        .with_context(|| format!("cannot read redis-benchmark's output: {text}"))?;
    Ok(rate)
}

fn row(name: &str, ours: f64, base: f64, unit: &str, target: &str) {
    let ratio = if unit == "B/key" {
        base / ours
    } else {
        ours / base
    };
    println!(
        "{name:<38} {:>14} {:>14} {:>8.1}x  {target}",
        format!("{} {unit}", human(ours)),
        format!("{} {unit}", human(base)),
        ratio
    );
}

fn human(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2}M", value / 1e6)
    } else if value >= 1e4 {
        format!("{:.1}k", value / 1e3)
    } else {
        format!("{value:.1}")
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(which) = &args.child {
        return child_memory(which, args.keys);
    }
    if let Some(address) = &args.bare_server {
        return bare_server(address);
    }
    if let Some(address) = &args.slow_sink {
        return slow_sink(address, Duration::from_millis(args.delay_ms));
    }
    if let Some(folder) = &args.fill_store {
        let mut config = oncegate_journal::JournalConfig::at(folder);
        // The gateway's own default, so that a configuration that names none opens the folder.
        config.partitions = args
            .partitions
            .unwrap_or_else(|| oncegate_config::EmbeddedSettings::default().partitions);
        fill_store(config, args.keys)?;
        println!(
            "{} remembers {} completed events",
            folder.display(),
            args.keys
        );
        return Ok(());
    }
    let wants = |part: &str| args.only.is_empty() || args.only.iter().any(|p| p == part);
    println!(
        "oncegate-bench: {THREADS} threads, 50% duplicate keys, {} ops per thread; {} cores here",
        args.ops,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<38} {:>14} {:>14} {:>9}  target",
        "measure", "oncegate", "baseline", "ratio"
    );
    if wants("admit") {
        // Interleaved and best of three, so that neither side gets the warmer machine.
        let (mut ours, mut base) = (0f64, 0f64);
        for _ in 0..3 {
            if args.side.as_deref() != Some("ours") {
                base = base.max(admit_seed(args.ops));
            }
            if args.side.as_deref() != Some("baseline") {
                ours = ours.max(admit_ours(args.ops));
            }
        }
        row(
            "memory admit",
            ours,
            base,
            "/s",
            ">= 5x baseline and >= 5M/s",
        );
        let floor = admit_floor(args.ops);
        println!(
            "{:<38} {:>14}  (hash the key and keep half the events in a Vec: no store is faster)",
            "  floor: events alone",
            format!("{} /s", human(floor))
        );
        // Best of three as for the stores, interleaved with ours so that neither gets the
        // warmer machine.
        let (mut minimal, mut ours_again) = (0f64, 0f64);
        for _ in 0..3 {
            minimal = minimal.max(admit_minimal(args.ops));
            ours_again = ours_again.max(admit_ours(args.ops));
        }
        println!(
            "{:<38} {:>14}  (64 locked hash sets and 16 locked Vecs, nothing else; ours beside it: {} /s)",
            "  floor: sharded dedup + queue",
            format!("{} /s", human(minimal)),
            human(ours_again)
        );
    }
    if wants("claim") {
        let (mut ours, mut base) = (0f64, 0f64);
        for _ in 0..3 {
            if args.side.as_deref() != Some("ours") {
                base = base.max(claim_seed(args.ops));
            }
            if args.side.as_deref() != Some("baseline") {
                ours = ours.max(claim_ours(args.ops));
            }
        }
        row("memory claim+complete", ours, base, "/s", ">= 5x baseline");
    }
    if wants("memory") {
        let ours = memory_per_key("ours", args.keys)?;
        let base = memory_per_key("seed", args.keys)?;
        row(
            &format!("memory per tracked key @{} keys", human(args.keys as f64)),
            ours,
            base,
            "B/key",
            "<= 40 B/key",
        );
    }
    if let Some(url) = args.redis_url.as_deref().filter(|_| wants("redis")) {
        let ours = redis_admits(url, args.callers, args.seconds)?;
        let ceiling = redis_benchmark_ceiling(url, args.callers)?;
        row(
            &format!("redis admits, {} callers", args.callers),
            ours,
            ceiling,
            "/s",
            ">= 70% of redis-benchmark (same script, pipelined x16)",
        );
    }
    if wants("restart") {
        std::fs::create_dir_all(&args.dir)?;
        for keys in [args.keys, args.keys * 10] {
            let (seconds, bytes) = journal_restart(&args.dir, keys)?;
            println!(
                "journal restart @{} keys: {seconds:.2} s to open ({:.1} MB on disk, {:.1} B/key)",
                human(keys as f64),
                bytes as f64 / 1e6,
                bytes as f64 / keys as f64
            );
        }
    }
    if wants("journal") {
        std::fs::create_dir_all(&args.dir)?;
        for (name, ours, theirs) in journal_vs_redb(&args.dir, args.callers, args.seconds)? {
            row(
                &format!("journal vs redb, durable {name}, {} callers", args.callers),
                ours.0,
                theirs.0,
                "/s",
                "the candidate for the embedded store",
            );
            println!(
                "  CPU per event: journal {:.1} µs, redb {:.1} µs",
                ours.1, theirs.1
            );
        }
    }
    if wants("embedded") {
        std::fs::create_dir_all(&args.dir)?;
        let grouped = embedded_admits(&args.dir, 1024, args.callers, args.seconds)?;
        let single = embedded_admits(&args.dir, 1, args.callers, args.seconds)?;
        row(
            &format!("embedded durable admits, {} callers", args.callers),
            grouped.admits_per_sec,
            single.admits_per_sec,
            "/s",
            ">= 10x (group commit vs 1 txn/event) and >= 20k/s",
        );
        println!(
            "  group commit: {:.1} requests per commit, {:.2} ms per commit; one per event: {:.2} ms",
            grouped.mean_batch, grouped.ms_per_commit, single.ms_per_commit
        );
    }
    Ok(())
}
