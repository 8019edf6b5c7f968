//! Memory per remembered key, measured in a child process.

use super::*;

pub(crate) fn rss_bytes() -> anyhow::Result<u64> {
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
pub(crate) fn child_memory(which: &str, keys: u64) -> anyhow::Result<()> {
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

pub(crate) fn memory_per_key(which: &str, keys: u64) -> anyhow::Result<f64> {
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
