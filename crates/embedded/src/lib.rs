//! The default backend: one redb file holding seen-marks, leases, the queue, watermarks and dead
//! letters.
//!
//! Every change goes through one writer thread that applies all waiting requests in one write
//! transaction and commits once (group commit): a burst of 64 concurrent admits costs one fsync,
//! not 64. A seen-mark and its queue entry are written in the same transaction, so after a crash
//! at any point an admitted event is both marked and queued, or neither. Expired records are found
//! through an expiry index keyed by deadline, never by a scan.

mod codec;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::queue_index::PartitionIndex;
use oncegate_core::store::millis;
use oncegate_core::{
    Admission, Claim, Clock, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck,
    FencingToken, KeyHash, Lease, QueueId, Record, RecordState, StoreError, StoreStats,
    SystemClock, WatermarkOutcome, WatermarkStore,
};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::oneshot;

use codec::decode;
use writer::{Command, Writer};

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
    #[error("cannot use {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
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
    commands: Option<mpsc::Sender<Command>>,
    writer: Option<JoinHandle<()>>,
    _temp: Option<tempfile::TempDir>,
}

impl EmbeddedStore<SystemClock> {
    /// Opens (or creates) the store described by `config` on the system clock.
    pub fn open(config: EmbeddedConfig) -> Result<Self, OpenError> {
        Self::open_with_clock(config, SystemClock)
    }
}

impl<C: Clock + Clone> EmbeddedStore<C> {
    /// Opens (or creates) the store on `clock`.
    pub fn open_with_clock(config: EmbeddedConfig, clock: C) -> Result<Self, OpenError> {
        Self::open_inner(config, clock, None)
    }

    /// A store in a fresh temporary folder, deleted when the store is dropped.
    pub fn open_temporary(clock: C) -> Result<Self, OpenError> {
        let dir = tempfile::tempdir().map_err(|source| OpenError::Io {
            path: std::env::temp_dir(),
            source,
        })?;
        let config = EmbeddedConfig::at(dir.path().join("oncegate.redb"));
        Self::open_inner(config, clock, Some(dir))
    }

    fn open_inner(
        config: EmbeddedConfig,
        clock: C,
        temp: Option<tempfile::TempDir>,
    ) -> Result<Self, OpenError> {
        let path = config.path.clone();
        oncegate_files::create_parent(&path).map_err(|source| OpenError::Io {
            path: path.parent().unwrap_or(&path).to_path_buf(),
            source,
        })?;
        if !path.exists() {
            create_atomically(&path, config.partitions.max(1))?;
        }
        let db = redb::Builder::new()
            .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
            .set_cache_size(config.cache_bytes)
            .create(&path)
            .map_err(|error| match error {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    OpenError::Locked { path: path.clone() }
                }
                other => OpenError::Database {
                    path: path.clone(),
                    message: other.to_string(),
                },
            })?;
        let database_error = |error: redb::Error| OpenError::Database {
            path: path.clone(),
            message: error.to_string(),
        };
        let (run, partitions) = (|| -> Result<(u64, u16), redb::Error> {
            let txn = db.begin_write()?;
            let run;
            let partitions;
            {
                let mut meta = txn.open_table(META)?;
                run = meta.get("run")?.map_or(0, |v| v.value()) + 1;
                meta.insert("run", run)?;
                let stored = meta.get("partitions")?.map(|v| v.value());
                partitions = match stored {
                    Some(stored) => stored as u16,
                    None => {
                        meta.insert("partitions", u64::from(config.partitions.max(1)))?;
                        config.partitions.max(1)
                    }
                };
                // Create every table so that readers never meet a missing one.
                txn.open_table(RECORDS)?;
                txn.open_table(EXPIRY)?;
                txn.open_table(QUEUE)?;
                txn.open_table(DEAD)?;
                txn.open_table(MARKS)?;
            }
            txn.commit()?;
            Ok((run, partitions))
        })()
        .map_err(database_error)?;
        if partitions != config.partitions.max(1) {
            return Err(OpenError::Partitions {
                path,
                stored: partitions,
                configured: config.partitions,
            });
        }
        let order = load_order(&db, partitions).map_err(|error| OpenError::Database {
            path: path.clone(),
            message: error.to_string(),
        })?;
        let counts = count_states(&db).map_err(|error| OpenError::Database {
            path: path.clone(),
            message: error.to_string(),
        })?;
        let shared = Arc::new(Shared {
            db,
            order,
            next_token: AtomicU64::new(FencingToken::compose(run, 1).0),
            run,
            partitions,
            commits: AtomicU64::new(0),
            committed_requests: AtomicU64::new(0),
            commit_nanos: AtomicU64::new(0),
            counts: counts.map(AtomicU64::new),
        });
        let (commands, receiver) = mpsc::channel();
        let writer = Writer::new(
            shared.clone(),
            receiver,
            config.max_batch.max(1),
            clock.clone(),
        );
        let writer = std::thread::Builder::new()
            .name("oncegate-embedded-writer".into())
            .spawn(move || writer.run())
            .map_err(|source| OpenError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            shared,
            clock,
            commands: Some(commands),
            writer: Some(writer),
            _temp: temp,
        })
    }

    async fn send<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .as_ref()
            .ok_or_else(|| unavailable("the store is closing"))?
            .send(make(reply))
            .map_err(|_| unavailable("the writer thread has stopped"))?;
        answer
            .await
            .map_err(|_| unavailable("the writer thread dropped the request"))?
    }

    /// Group-commit figures since open: (commits, requests committed, time spent committing).
    pub fn commit_stats(&self) -> (u64, u64, Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.shared.commits.load(Relaxed),
            self.shared.committed_requests.load(Relaxed),
            Duration::from_nanos(self.shared.commit_nanos.load(Relaxed)),
        )
    }

    /// The path of the database file.
    pub fn path(&self) -> Option<PathBuf> {
        self._temp
            .as_ref()
            .map(|dir| dir.path().join("oncegate.redb"))
    }

    fn order(&self, partition: u16) -> Option<MutexGuard<'_, PartitionIndex>> {
        self.shared.order.get(usize::from(partition)).map(lock)
    }

    fn is_in_flight(&self, id: QueueId) -> bool {
        self.order(id.partition)
            .is_some_and(|order| order.is_in_flight(id.seq))
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let txn = self.shared.db.begin_read().map_err(unavailable)?;
        f(&txn).map_err(unavailable)
    }
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
        self.send(|reply| Command::Admit {
            event,
            keys,
            retention_ms: millis(retention),
            reply,
        })
        .await
    }

    async fn claim(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        oncegate_core::store::require_partition(partition, self.shared.partitions)?;
        self.send(|reply| Command::Claim {
            key: *key,
            partition,
            lease_ms: millis(lease),
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
            Some(bytes) => Ok(Some(decode::<Record>(&bytes)?).filter(|r| r.is_live(now_ms))),
            None => Ok(None),
        }
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

impl<C: Clock + Clone> EventQueue for EmbeddedStore<C> {
    fn partitions(&self) -> u16 {
        self.shared.partitions
    }

    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        if partition >= self.shared.partitions {
            return Err(StoreError::Invalid(format!("no partition {partition}")));
        }
        let now_ms = self.clock.now_ms();
        let ready = match self.order(partition) {
            Some(mut order) => order.take_ready(now_ms, max),
            None => Vec::new(),
        };
        if ready.is_empty() {
            return Ok(Vec::new());
        }
        let fetched = self.read(|txn| {
            let queue = txn.open_table(QUEUE)?;
            let mut stored = Vec::with_capacity(ready.len());
            for seq in &ready {
                if let Some(value) = queue.get(*seq)? {
                    stored.push((*seq, value.value().to_vec()));
                }
            }
            Ok(stored)
        });
        let stored = match fetched {
            Ok(stored) => stored,
            Err(error) => {
                // Not handed out after all: put them back so that they go out later.
                if let Some(mut order) = self.order(partition) {
                    for seq in &ready {
                        order.retry(*seq, 0);
                    }
                }
                return Err(error);
            }
        };
        let mut out = Vec::with_capacity(stored.len());
        for (seq, bytes) in stored {
            let queued: codec::Queued = decode(&bytes)?;
            out.push(Delivery {
                id: QueueId { partition, seq },
                key: queued.key,
                event: queued.event,
                attempt: queued.attempt,
            });
        }
        Ok(out)
    }

    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        if !self.is_in_flight(id) {
            return Ok(false);
        }
        self.send(|reply| Command::Ack { id, reply }).await
    }

    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        if !self.is_in_flight(id) {
            return Ok(false);
        }
        self.send(|reply| Command::Retry {
            id,
            not_before_ms,
            reply,
        })
        .await
    }

    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        if !self.is_in_flight(id) {
            return Ok(false);
        }
        let reason = reason.to_owned();
        self.send(|reply| Command::DeadLetter { id, reason, reply })
            .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let raw = self.read(|txn| {
            let dead = txn.open_table(DEAD)?;
            let mut raw = Vec::new();
            for entry in dead.iter()?.take(limit) {
                raw.push(entry?.1.value().to_vec());
            }
            Ok(raw)
        })?;
        raw.iter().map(|bytes| decode(bytes)).collect()
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

/// Creates a new store file beside `path`, commits its first transaction, and only then renames
/// it into place: a crash while creating leaves a stray temporary file, never a half-made store.
fn create_atomically(path: &Path, partitions: u16) -> Result<(), OpenError> {
    let creating = path.with_extension("creating");
    let io = |source: std::io::Error| OpenError::Io {
        path: creating.clone(),
        source,
    };
    let database = |message: String| OpenError::Database {
        path: creating.clone(),
        message,
    };
    if creating.exists() {
        std::fs::remove_file(&creating).map_err(io)?;
    }
    // Created 0600 before redb writes a byte into it: the store holds decrypted messages.
    oncegate_files::create_private(&creating).map_err(io)?;
    let db = redb::Builder::new()
        .create(&creating)
        .map_err(|e| database(e.to_string()))?;
    (|| -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(META)?
            .insert("partitions", u64::from(partitions))?;
        txn.commit()?;
        Ok(())
    })()
    .map_err(|e| database(e.to_string()))?;
    drop(db);
    std::fs::rename(&creating, path).map_err(io)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        // The rename is durable once the folder is synced.
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// Counts the stored records per state, once, on open.
fn count_states(db: &Database) -> Result<[u64; 3], StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let records = txn.open_table(RECORDS).map_err(unavailable)?;
    let mut counts = [0u64; 3];
    for entry in records.iter().map_err(unavailable)? {
        let (_, value) = entry.map_err(unavailable)?;
        if let Ok(record) = decode::<Record>(value.value()) {
            counts[state_index(&record.state)] += 1;
        }
    }
    Ok(counts)
}

/// Rebuilds every partition's hand-out order from the queue table.
fn load_order(db: &Database, partitions: u16) -> Result<Box<[Mutex<PartitionIndex>]>, StoreError> {
    let mut order: Vec<PartitionIndex> = (0..partitions).map(|_| PartitionIndex::new()).collect();
    let txn = db.begin_read().map_err(unavailable)?;
    let queue = txn.open_table(QUEUE).map_err(unavailable)?;
    for entry in queue.iter().map_err(unavailable)? {
        let (position, value) = entry.map_err(unavailable)?;
        let seq = position.value();
        let queued: codec::Queued = decode(value.value())?;
        let partition = oncegate_core::event::partition_of(queued.order_hash, partitions);
        if let Some(index) = order.get_mut(usize::from(partition)) {
            index.push(seq, queued.order_hash, queued.not_before_ms);
        }
    }
    Ok(order.into_iter().map(Mutex::new).collect())
}

/// Read-only access to a store file, for `oncegate inspect` while a gateway runs.
pub struct StoreReader {
    db: redb::ReadOnlyDatabase,
    partitions: u16,
}

impl StoreReader {
    /// Opens `path` for reading.
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        if !path.exists() {
            return Err(OpenError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such store file"),
            });
        }
        let db = redb::Builder::new()
            .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
            .open_read_only(path)
            .map_err(|error| match error {
                redb::DatabaseError::RepairAborted => OpenError::Database {
                    path: path.to_path_buf(),
                    message: "the store was not closed cleanly and needs a repair, which a \
                              read-only reader cannot do; start the gateway on it once (it \
                              repairs on open) and read again"
                        .into(),
                },
                other => OpenError::Database {
                    path: path.to_path_buf(),
                    message: other.to_string(),
                },
            })?;
        let partitions = (|| -> Result<u16, redb::Error> {
            let txn = db.begin_read()?;
            let meta = txn.open_table(META)?;
            Ok(meta.get("partitions")?.map_or(1, |v| v.value() as u16))
        })()
        .map_err(|error| OpenError::Database {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
        Ok(Self { db, partitions })
    }

    /// One key's stored records (live or not yet swept), in whichever partitions hold one.
    pub fn record(&self, key: &KeyHash) -> Result<Vec<(u16, Record)>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let records = txn.open_table(RECORDS).map_err(unavailable)?;
        let mut found = Vec::new();
        for partition in 0..self.partitions {
            let placed = key.in_partition(partition);
            if let Some(stored) = records.get(&placed.0).map_err(unavailable)? {
                found.push((partition, decode(stored.value())?));
            }
        }
        Ok(found)
    }

    /// Up to `limit` records in the order of their identities (`KeyHash::in_partition`).
    pub fn records(&self, limit: usize) -> Result<Vec<(KeyHash, Record)>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let records = txn.open_table(RECORDS).map_err(unavailable)?;
        let mut out = Vec::new();
        for entry in records.iter().map_err(unavailable)?.take(limit) {
            let (key, value) = entry.map_err(unavailable)?;
            out.push((KeyHash(*key.value()), decode(value.value())?));
        }
        Ok(out)
    }

    /// Queued events (up to `limit`), oldest first per partition.
    pub fn queued(&self, limit: usize) -> Result<Vec<(QueueId, Event, u32)>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let queue = txn.open_table(QUEUE).map_err(unavailable)?;
        let mut out = Vec::new();
        for entry in queue.iter().map_err(unavailable)?.take(limit) {
            let (position, value) = entry.map_err(unavailable)?;
            let seq = position.value();
            let queued: codec::Queued = decode(value.value())?;
            let partition = oncegate_core::event::partition_of(queued.order_hash, self.partitions);
            out.push((QueueId { partition, seq }, queued.event, queued.attempt));
        }
        Ok(out)
    }

    /// Dead letters (up to `limit`), oldest first.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let dead = txn.open_table(DEAD).map_err(unavailable)?;
        let mut out = Vec::new();
        for entry in dead.iter().map_err(unavailable)?.take(limit) {
            out.push(decode(entry.map_err(unavailable)?.1.value())?);
        }
        Ok(out)
    }

    /// Counts by state at `now_ms`; in-flight is unknown from outside the gateway and left 0.
    pub fn stats(&self, now_ms: u64) -> Result<StoreStats, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let mut stats = StoreStats::default();
        let records = txn.open_table(RECORDS).map_err(unavailable)?;
        for entry in records.iter().map_err(unavailable)? {
            let record: Record = decode(entry.map_err(unavailable)?.1.value())?;
            if record.is_live(now_ms) {
                match record.state {
                    RecordState::Pending => stats.pending += 1,
                    RecordState::Processing { .. } => stats.processing += 1,
                    RecordState::Completed { .. } => stats.completed += 1,
                }
            }
        }
        stats.queued = txn
            .open_table(QUEUE)
            .map_err(unavailable)?
            .len()
            .map_err(unavailable)?;
        stats.dead_letters = txn
            .open_table(DEAD)
            .map_err(unavailable)?
            .len()
            .map_err(unavailable)?;
        Ok(stats)
    }
}
