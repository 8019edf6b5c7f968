//! The embedded store's folder: opening it for the gateway, refusing a file of the earlier
//! format (one redb file) with what to do, moving such a file in, and reading a folder for
//! `oncegate inspect`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use oncegate_config::EmbeddedSettings;
use oncegate_core::{DedupStore, EventQueue};
use oncegate_embedded::{EmbeddedConfig, EmbeddedStore, StoreReader};
use oncegate_journal::{JournalConfig, JournalStore};

/// A store file of the earlier format where the configuration now names a folder: the path
/// itself, or the earlier default's `<path>.redb` beside a folder not created yet.
pub(crate) fn earlier_file(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path.to_path_buf());
    }
    let beside = path.with_extension("redb");
    (!path.exists() && beside.is_file()).then_some(beside)
}

/// What to run instead of starting afresh beside an earlier store file.
fn migrate_hint(file: &Path, folder: &Path) -> String {
    format!(
        "{} is a store file of the earlier embedded format (one redb file); the embedded store \
         is now a folder. Stop the gateway, run `oncegate migrate-store {} {}`, and set [store] \
         path = {:?}",
        file.display(),
        file.display(),
        folder.display(),
        folder.display()
    )
}

/// The folder `settings` names, opened for the gateway.
pub(crate) fn open_embedded(settings: &EmbeddedSettings) -> anyhow::Result<JournalStore> {
    if let Some(file) = earlier_file(&settings.path) {
        let folder = if file == settings.path {
            file.with_extension("")
        } else {
            settings.path.clone()
        };
        bail!("{}", migrate_hint(&file, &folder));
    }
    let mut config = JournalConfig::at(&settings.path);
    config.partitions = settings.partitions;
    config.max_records = settings.max_records;
    Ok(oncegate_journal::open(config)?)
}

/// Moves the earlier-format store `from` into the new folder `to`: every record, queue entry
/// (with its attempts and delay), dead letter and watermark; `from` is renamed
/// `<from>.migrated` afterwards, so that nothing starts on it again.
pub(crate) fn migrate(from: &Path, to: &Path) -> anyhow::Result<()> {
    if !from.is_file() {
        bail!("{} is not a store file", from.display());
    }
    // Opening it for writing repairs a file a crash left, and refuses one a gateway still has.
    let opened = match EmbeddedStore::open(EmbeddedConfig::at(from)) {
        Err(oncegate_embedded::OpenError::Partitions { stored, .. }) => {
            EmbeddedStore::open(EmbeddedConfig {
                partitions: stored,
                ..EmbeddedConfig::at(from)
            })
        }
        other => other,
    };
    drop(opened.with_context(|| format!("open {}", from.display()))?);
    let reader = StoreReader::open(from)?;
    let mut config = JournalConfig::at(to);
    config.partitions = reader.partitions();
    let mut failure = None;
    let changes = oncegate_journal::import(&config, reader.run()?, |emit| {
        if let Err(error) = reader.export(emit) {
            failure = Some(error);
        }
    })?;
    if let Some(error) = failure {
        bail!(
            "read {}: {error}; nothing was moved: remove {} before trying again",
            from.display(),
            to.display()
        );
    }
    drop(reader);
    let moved = PathBuf::from(format!("{}.migrated", from.display()));
    std::fs::rename(from, &moved)
        .with_context(|| format!("rename {} to {}", from.display(), moved.display()))?;
    println!(
        "moved {changes} changes from {} into {} ({} partitions); the old file is now {}",
        from.display(),
        to.display(),
        config.partitions,
        moved.display()
    );
    Ok(())
}

/// A store read by `oncegate inspect`: a folder, or a file of the earlier format.
pub(crate) enum Inspected {
    /// A file of the earlier format.
    File(StoreReader),
    /// A folder, replayed read-only into memory.
    Folder(oncegate_memory::MemoryStore),
}

impl Inspected {
    /// Reads the store at `path`.
    pub(crate) fn open(path: &Path) -> anyhow::Result<Self> {
        if path.is_dir() {
            Ok(Self::Folder(oncegate_journal::read_only(path)?))
        } else {
            Ok(Self::File(StoreReader::open(path)?))
        }
    }

    /// Counts by state, every record read: the operator's census.
    pub(crate) fn stats(&self, now_ms: u64) -> anyhow::Result<oncegate_core::StoreStats> {
        match self {
            Self::File(reader) => Ok(reader.stats(now_ms)?),
            Self::Folder(store) => Ok(store.census(now_ms)),
        }
    }

    /// One key's records, in whichever partitions hold one.
    pub(crate) fn record(
        &self,
        key: &oncegate_core::KeyHash,
    ) -> anyhow::Result<Vec<(u16, oncegate_core::Record)>> {
        match self {
            Self::File(reader) => Ok(reader.record(key)?),
            Self::Folder(store) => {
                let mut found = Vec::new();
                for partition in 0..store.partitions() {
                    if let Some(record) = ready(store.record(key, partition))? {
                        found.push((partition, record));
                    }
                }
                Ok(found)
            }
        }
    }

    /// Up to `limit` records.
    pub(crate) fn records(
        &self,
        limit: usize,
    ) -> anyhow::Result<Vec<(oncegate_core::KeyHash, oncegate_core::Record)>> {
        match self {
            Self::File(reader) => Ok(reader.records(limit)?),
            Self::Folder(store) => {
                let mut out = Vec::new();
                store.snapshot(&mut |change| {
                    if let oncegate_memory::Change::Record { key, record } = change
                        && out.len() < limit
                    {
                        out.push((*key, record.as_ref().clone()));
                    }
                });
                Ok(out)
            }
        }
    }

    /// Up to `limit` queued events, oldest first per partition.
    pub(crate) fn queued(
        &self,
        limit: usize,
    ) -> anyhow::Result<Vec<(oncegate_core::QueueId, oncegate_core::Event, u32)>> {
        match self {
            Self::File(reader) => Ok(reader.queued(limit)?),
            Self::Folder(store) => {
                let mut out = Vec::new();
                for partition in 0..store.partitions() {
                    let left = limit.saturating_sub(out.len());
                    for queued in ready(store.queued_events(partition, None, left))? {
                        out.push((queued.id, queued.event, queued.attempt));
                    }
                }
                Ok(out)
            }
        }
    }

    /// Up to `limit` dead letters, oldest first.
    pub(crate) fn dead_letters(
        &self,
        limit: usize,
    ) -> anyhow::Result<Vec<oncegate_core::DeadLetter>> {
        match self {
            Self::File(reader) => Ok(reader.dead_letters(limit)?),
            Self::Folder(store) => Ok(ready(store.dead_letters(limit))?),
        }
    }
}

/// The answer of a memory store's call, which never waits.
fn ready<T>(future: impl std::future::Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
    }
}
