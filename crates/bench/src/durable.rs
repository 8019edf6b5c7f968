//! Durable events: the embedded journal against redb, restarts, filled stores.

use super::*;

/// Durable admits per second, and the mean batch and commit time behind it.
pub(crate) struct EmbeddedRun {
    pub(crate) admits_per_sec: f64,
    pub(crate) mean_batch: f64,
    pub(crate) ms_per_commit: f64,
}

pub(crate) fn embedded_admits(
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
pub(crate) fn durable_events<S: DedupStore + EventQueue>(
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
pub(crate) fn process_cpu_seconds() -> anyhow::Result<f64> {
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
pub(crate) fn journal_restart(dir: &std::path::Path, keys: u64) -> anyhow::Result<(f64, u64)> {
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
pub(crate) fn fill_store(
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
pub(crate) type Durable = (f64, f64);

/// The journal store against the redb store on the same workload: admits alone, then admit,
/// claim and complete for each event; (journal, redb) pairs of (events/s, CPU µs per event).
pub(crate) fn journal_vs_redb(
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
