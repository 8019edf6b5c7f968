//! The default backend: one redb file holding seen-marks, leases, the queue, watermarks and dead
//! letters.
//!
//! Every change goes through one writer thread that applies all waiting requests in one write
//! transaction and commits once (group commit): a burst of 64 concurrent admits costs one fsync,
//! not 64. A seen-mark and its queue entry are written in the same transaction, so after a crash
//! at any point an admitted event is both marked and queued, or neither. Expired records are found
//! through an expiry index keyed by deadline, never by a scan.

mod codec;
mod open;
mod queue;
mod reader;
mod tables;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::queue_index::PartitionIndex;
use oncegate_core::store::{millis, require_partition};
use oncegate_core::{
    Admission, Claim, Clock, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck,
    FencingToken, Fingerprint, KeyHash, Lease, QueueId, QueueSummary, QueuedEvent, Record,
    RecordState, StoreError, StoreStats, SystemClock, WatermarkOutcome, WatermarkStore,
};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::oneshot;

use codec::decode;
use writer::{Command, Writer};

pub use reader::StoreReader;

/// Seen-marks and leases: key → encoded [`Record`].
pub(crate) const RECORDS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("records");
/// The expiry index: (forget-after ms, key) → ().
pub(crate) const EXPIRY: TableDefinition<(u64, &[u8; 16]), ()> = TableDefinition::new("expiry");
/// The queue: seq → encoded [`codec::Queued`]. One sequence over all partitions, so that a
/// commit appends to one place of the tree; the partition follows from the order hash.
pub(crate) const QUEUE: TableDefinition<u64, &[u8]> = TableDefinition::new("queue");
/// Dead letters: number → encoded [`DeadLetter`].
pub(crate) const DEAD: TableDefinition<u64, &[u8]> = TableDefinition::new("dead_letters");
/// Watermarks: scope → (mark, forget-after ms).
pub(crate) const MARKS: TableDefinition<&[u8; 16], (u64, u64)> = TableDefinition::new("watermarks");
/// Counters and settings: name → value.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// How an embedded store is opened.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// The database file; its folder is created if missing.
    pub path: PathBuf,
    /// Queue partitions. Fixed when the file is created.
    pub partitions: u16,
    /// The most requests applied in one write transaction. 1 turns group commit off.
    pub max_batch: usize,
    /// redb's page cache, in bytes: the bound on the store's memory beyond the queue index.
    pub cache_bytes: usize,
}

impl EmbeddedConfig {
    /// Defaults for a file at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            partitions: 16,
            max_batch: 1024,
            cache_bytes: 64 << 20,
        }
    }
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The folder or file could not be created or read.
    #[error("cannot use {path}: {cause}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause (in the message, not a `source()`: printed with its chain, it would be said twice).
        cause: std::io::Error,
    },
    /// Another process has the file open for writing.
    #[error(
        "{path} is open in another oncegate process; stop it, or give this one another store path"
    )]
    Locked {
        /// The path.
        path: PathBuf,
    },
    /// The database refused to open.
    #[error("cannot open {path}: {message}")]
    Database {
        /// The path.
        path: PathBuf,
        /// What redb said.
        message: String,
    },
    /// The file was created with another partition count.
    #[error(
        "{path} was created with {stored} partitions but {configured} are configured; set partitions = {stored}"
    )]
    Partitions {
        /// The path.
        path: PathBuf,
        /// In the file.
        stored: u16,
        /// In the configuration.
        configured: u16,
    },
}

/// State shared by the store handle and the writer thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) db: Database,
    /// The hand-out order of each partition, rebuilt from the queue table on open. What was
    /// handed out lives only here: after a restart every unacked entry goes out again.
    pub(crate) order: Box<[Mutex<PartitionIndex>]>,
    pub(crate) next_token: AtomicU64,
    /// This open's run number: the high bits of every token it grants.
    pub(crate) run: u64,
    pub(crate) partitions: u16,
    /// Write transactions committed, and requests applied in them: their ratio is the mean
    /// group-commit batch.
    pub(crate) commits: AtomicU64,
    pub(crate) committed_requests: AtomicU64,
    /// Nanoseconds spent in commits (the fsync is in there).
    pub(crate) commit_nanos: AtomicU64,
    /// Records held per state (pending, processing, completed), counted once on open and kept
    /// up to date by the writer after each commit, so that stats cost no scan.
    pub(crate) counts: [AtomicU64; 3],
    /// Which events go before the rest of their group's backlog.
    pub(crate) first: oncegate_core::FirstRule,
}

/// The slot of a state in [`Shared::counts`].
pub(crate) fn state_index(state: &RecordState) -> usize {
    match state {
        RecordState::Pending => 0,
        RecordState::Processing { .. } => 1,
        RecordState::Completed { .. } => 2,
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("embedded store: {error}"))
}

/// The embedded store.
#[derive(Debug)]
pub struct EmbeddedStore<C: Clock = SystemClock> {
    shared: Arc<Shared>,
    clock: C,
    /// Rate buckets: the file is locked to one process, so they live in it.
    rates: oncegate_core::rates::LocalRates,
    commands: Option<mpsc::Sender<Command>>,
    writer: Option<JoinHandle<()>>,
    /// What must live as long as the store (a temporary folder).
    _keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl<C: Clock> Drop for EmbeddedStore<C> {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish what it holds and stop.
        self.commands.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl<C: Clock + Clone> DedupStore for EmbeddedStore<C> {
    async fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> Result<Admission, StoreError> {
        oncegate_core::store::require_keys(keys)?;
        let keys = keys.to_vec();
        let first = self.shared.first.first(&event);
        self.send(|reply| Command::Admit {
            event,
            first,
            keys,
            retention_ms: millis(retention),
            reply,
        })
        .await
    }

    async fn claim_with_fingerprint(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> Result<Claim, StoreError> {
        oncegate_core::store::require_partition(partition, self.shared.partitions)?;
        self.send(|reply| Command::Claim {
            key: *key,
            partition,
            lease_ms: millis(lease),
            fingerprint,
            reply,
        })
        .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<FenceCheck, StoreError> {
        self.send(|reply| Command::Renew {
            lease: *lease,
            extend_ms: millis(extend),
            reply,
        })
        .await
    }

    async fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        self.send(|reply| Command::Complete {
            lease: *lease,
            retention_ms: millis(retention),
            outcome,
            reply,
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.send(|reply| Command::Release {
            lease: *lease,
            reply,
        })
        .await
    }

    async fn record(&self, key: &KeyHash, partition: u16) -> Result<Option<Record>, StoreError> {
        oncegate_core::store::require_partition(partition, self.shared.partitions)?;
        let now_ms = self.clock.now_ms();
        let key = key.in_partition(partition);
        let stored = self.read(|txn| {
            let records = txn.open_table(RECORDS)?;
            Ok(records.get(&key.0)?.map(|v| v.value().to_vec()))
        })?;
        match stored {
            Some(bytes) => Ok(Some(codec::decode_record(&bytes)?).filter(|r| r.is_live(now_ms))),
            None => Ok(None),
        }
    }

    fn durability(&self) -> oncegate_core::Durability {
        oncegate_core::Durability::on_disk(
            "every acknowledged event is in the store file, committed and fsynced before the answer",
        )
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let in_flight = self
            .shared
            .order
            .iter()
            .map(|order| lock(order).in_flight() as u64)
            .sum();
        let queued = self
            .shared
            .order
            .iter()
            .map(|order| lock(order).len() as u64)
            .sum();
        let dead_letters = self.read(|txn| Ok(txn.open_table(DEAD)?.len()?))?;
        let count = |i: usize| self.shared.counts[i].load(std::sync::atomic::Ordering::Relaxed);
        Ok(StoreStats {
            pending: count(0),
            processing: count(1),
            completed: count(2),
            queued,
            in_flight,
            dead_letters,
            evicted_early: 0,
        })
    }

    async fn complete_and_ack(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
        id: QueueId,
    ) -> Result<FenceCheck, StoreError> {
        if !self.is_in_flight(id) {
            return self.complete(lease, retention, outcome).await;
        }
        self.send(|reply| Command::CompleteAck {
            lease: *lease,
            retention_ms: millis(retention),
            outcome,
            id,
            reply,
        })
        .await
    }
}

impl<C: Clock + Clone> WatermarkStore for EmbeddedStore<C> {
    async fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> Result<WatermarkOutcome, StoreError> {
        self.send(|reply| Command::Watermark {
            scope: *scope,
            value,
            retention_ms: millis(retention),
            reply,
        })
        .await
    }
}

impl<C: Clock> oncegate_core::RateStore for EmbeddedStore<C> {
    async fn take_rate(
        &self,
        bucket: &KeyHash,
        rate: oncegate_core::Rate,
    ) -> Result<oncegate_core::RateVerdict, StoreError> {
        // One gateway owns this store: its buckets live in its process.
        Ok(self
            .rates
            .take(bucket, rate, self.clock.now_ms().saturating_mul(1000)))
    }

    async fn adjust_rate(
        &self,
        bucket: &KeyHash,
        adjust: oncegate_core::RateAdjust,
    ) -> Result<(), StoreError> {
        self.rates
            .adjust(bucket, adjust, self.clock.now_ms().saturating_mul(1000));
        Ok(())
    }
}

/// The earlier embedded format (one redb file) keeps no shared state: it stays readable for
/// `oncegate migrate-store` and benchmarks, and what needs shared state (tenants, tickets,
/// tokens) runs on the folder format (`oncegate_journal`), memory or Redis. Every call says so.
impl<C: Clock> oncegate_core::StateStore for EmbeddedStore<C> {
    async fn state_get(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<oncegate_core::Versioned>, StoreError> {
        Err(no_state())
    }

    async fn state_put(
        &self,
        _: &str,
        _: &str,
        _: Bytes,
        _: oncegate_core::Expect,
        _: Option<Duration>,
    ) -> Result<oncegate_core::Changed, StoreError> {
        Err(no_state())
    }

    async fn state_remove(
        &self,
        _: &str,
        _: &str,
        _: oncegate_core::Expect,
    ) -> Result<oncegate_core::Changed, StoreError> {
        Err(no_state())
    }

    async fn state_list(
        &self,
        _: &str,
        _: Option<&str>,
        _: usize,
    ) -> Result<Vec<(String, oncegate_core::Versioned)>, StoreError> {
        Err(no_state())
    }

    async fn state_generation(&self, _: &str) -> Result<u64, StoreError> {
        Err(no_state())
    }
}

fn no_state() -> StoreError {
    StoreError::Invalid(
        "the earlier embedded format (one redb file) keeps no shared state (tenants, tickets, \
         tokens): move to the folder format with `oncegate migrate-store`"
            .into(),
    )
}
