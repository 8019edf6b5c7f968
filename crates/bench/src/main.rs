//! `oncegate-bench`: oncegate's stores side by side with a baseline of the seed design, in one
//! run, printed as a table.
//!
//! Run with `cargo run --release -p oncegate-bench`.

mod baseline;
mod durable;
mod memory;
mod micro;
mod priority;
mod redis_runs;
mod servers;

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
use durable::*;
use memory::*;
use micro::*;
use redis_runs::*;
use servers::*;

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
    /// Only these parts: admit, claim, memory, priority, embedded, journal, restart.
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
    if wants("priority") {
        priority::priority_reads(args.ops / 4);
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
