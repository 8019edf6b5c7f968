//! The journal: changes are framed into a buffer by the callers, and one writer thread appends
//! whatever has gathered while it synced the last batch, syncs once, and tells every waiter.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, mpsc};
use std::thread::JoinHandle;

use oncegate_core::StoreError;
use oncegate_memory::{Change, Journal};
use tokio::sync::watch;

use crate::frame::{self, EntryRef, Header, Kind};
use crate::tail::Tail;

/// How long a small batch waits for more changes before it is synced, and the size from which
/// it does not: every sync costs the machine the same whatever it carries, and under load the
/// callers' next changes arrive within this window.
const GATHER_WAIT: std::time::Duration = std::time::Duration::from_micros(100);
const GATHER_BYTES: usize = 64 << 10;

/// Emits a snapshot of the store through the given sink; `false` once the store is gone.
pub(crate) type SnapshotSource = Box<dyn Fn(&mut dyn FnMut(&Change<'_>)) -> bool + Send + Sync>;

/// Changes framed but not yet written.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    closing: bool,
    /// Batches begun: every batch starts with a mark of its number, so that opening can tell
    /// the end of the last batch (what a crash can tear) from damage before it.
    batches: u64,
}

/// What callers and the writer thread share.
pub(crate) struct Inner {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// Changes appended so far: the position every `sync` waits for.
    appended: AtomicU64,
    /// Changes durable so far.
    durable: watch::Sender<u64>,
    failed: AtomicBool,
    failure: OnceLock<String>,
    pub(crate) snapshot_source: OnceLock<SnapshotSource>,
    /// Bytes and syncs written, for figures.
    pub(crate) synced_batches: AtomicU64,
    pub(crate) written_bytes: AtomicU64,
    /// The size of the last snapshot: the journal may grow that much before the next.
    pub(crate) last_snapshot: AtomicU64,
    /// Snapshots that could not be written (the journal then grows until one can).
    pub(crate) failed_snapshots: AtomicU64,
    /// Bytes the segments hold since the last snapshot.
    pub(crate) since_snapshot: AtomicU64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("appended", &self.appended)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Inner {
    fn fail(&self, why: String) {
        let _ = self.failure.set(why);
        self.failed.store(true, Ordering::SeqCst);
        // Wake every waiter: they look at `failed` once woken.
        self.durable.send_modify(|_| {});
    }

    fn refusal(&self) -> StoreError {
        let why = self.failure.get().map_or("unknown", String::as_str);
        StoreError::Unavailable(format!(
            "the journal could not be written ({why}); nothing from then on is durable: restart \
             the gateway once the disk is writable again"
        ))
    }
}

/// Where segments go and how they are named.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    pub(crate) dir: PathBuf,
    pub(crate) partitions: u16,
    /// This open's run.
    pub(crate) run: u64,
}

impl Files {
    pub(crate) fn segment(&self, number: u64) -> PathBuf {
        self.dir.join(format!("segment-{number:016x}.log"))
    }

    pub(crate) fn snapshot(&self, number: u64) -> PathBuf {
        self.dir.join(format!("snapshot-{number:016x}.snap"))
    }

    /// Creates file `path` with its header (and `first` frames), durable with its name.
    pub(crate) fn create(&self, path: &Path, kind: Kind, number: u64) -> std::io::Result<File> {
        oncegate_files::create_private(path)?;
        // Not in append mode: a segment is written at its own offsets, into room zeroed ahead.
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        file.write_all(&frame::header(Header {
            kind,
            partitions: self.partitions,
            number,
            run: self.run,
        }))?;
        file.sync_all()?;
        sync_dir(&self.dir)?;
        Ok(file)
    }

    /// Creates segment `number` under a temporary name and renames it once its header is
    /// durable, so that a crash never leaves a segment without one (which no open could read).
    pub(crate) fn create_segment(&self, number: u64) -> std::io::Result<File> {
        let done = self.segment(number);
        let path = done.with_extension("tmp");
        if path.exists() {
            std::fs::remove_file(&path)?;
        }
        let file = self.create(&path, Kind::Segment, number)?;
        std::fs::rename(&path, &done)?;
        sync_dir(&self.dir)?;
        Ok(file)
    }
}

/// Makes the folder's entries (a created, renamed or removed file) durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The journal a durable store writes to.
#[derive(Debug)]
pub struct FileJournal {
    pub(crate) inner: Arc<Inner>,
    writer: Option<JoinHandle<()>>,
    snapshots: Option<(mpsc::Sender<u64>, JoinHandle<()>)>,
    /// The folder's lock, held while the journal is open.
    pub(crate) lock: Option<File>,
    /// What must live as long as the journal (a temporary folder).
    pub(crate) keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// When the writer starts a new segment and asks for a snapshot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rotation {
    /// Bytes in the segments since the last snapshot, at open.
    pub(crate) since_snapshot: u64,
    /// The configured least journal size before a snapshot.
    pub(crate) snapshot_after: u64,
    /// The size of the last snapshot, at open.
    pub(crate) last_snapshot: u64,
}

impl FileJournal {
    /// Starts a journal whose current segment `number` was just created as `file`.
    pub(crate) fn start(
        files: Files,
        file: File,
        number: u64,
        rotation: Rotation,
    ) -> std::io::Result<Self> {
        let (durable, _) = watch::channel(0);
        let inner = Arc::new(Inner {
            pending: Mutex::default(),
            wake: Condvar::new(),
            appended: AtomicU64::new(0),
            durable,
            failed: AtomicBool::new(false),
            failure: OnceLock::new(),
            snapshot_source: OnceLock::new(),
            synced_batches: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            last_snapshot: AtomicU64::new(rotation.last_snapshot),
            failed_snapshots: AtomicU64::new(0),
            since_snapshot: AtomicU64::new(rotation.since_snapshot),
        });
        let (ask, asked) = mpsc::channel::<u64>();
        let snapshot_files = files.clone();
        let snapshot_inner = inner.clone();
        let snapshotter = std::thread::Builder::new()
            .name("oncegate-journal-snapshot".into())
            .spawn(move || crate::snapshot::run(snapshot_files, snapshot_inner, asked))?;
        let writer_inner = inner.clone();
        let writer_ask = ask.clone();
        let writer = std::thread::Builder::new()
            .name("oncegate-journal-writer".into())
            .spawn(move || write_loop(writer_inner, files, file, number, rotation, writer_ask))?;
        Ok(Self {
            inner,
            writer: Some(writer),
            snapshots: Some((ask, snapshotter)),
            lock: None,
            keep: None,
        })
    }

    /// (batches synced, bytes written) since open.
    pub fn figures(&self) -> (u64, u64) {
        (
            self.inner.synced_batches.load(Ordering::Relaxed),
            self.inner.written_bytes.load(Ordering::Relaxed),
        )
    }
}

impl Drop for FileJournal {
    fn drop(&mut self) {
        lock(&self.inner.pending).closing = true;
        self.inner.wake.notify_all();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        if let Some((ask, snapshotter)) = self.snapshots.take() {
            drop(ask);
            // The store may be dropped by the snapshot thread itself (it held the last handle
            // while it wrote): it cannot wait for itself.
            if snapshotter.thread().id() != std::thread::current().id() {
                let _ = snapshotter.join();
            }
        }
    }
}

impl Journal for FileJournal {
    fn durability(&self) -> oncegate_core::Durability {
        oncegate_core::Durability::on_disk(
            "every acknowledged change is in the journal file and fsynced before the answer",
        )
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.inner.failed.load(Ordering::SeqCst) {
            Err(self.inner.refusal())
        } else {
            Ok(())
        }
    }

    fn append(&self, change: &Change<'_>) {
        let mut pending = lock(&self.inner.pending);
        let was_empty = pending.bytes.is_empty();
        if was_empty {
            // The writer takes everything pending as one batch: this change starts the next.
            pending.batches += 1;
            let mark = EntryRef::Batch(pending.batches);
            if let Err(error) = frame::encode(&mark, &mut pending.bytes) {
                drop(pending);
                self.inner
                    .fail(format!("a batch mark did not encode: {error}"));
                return;
            }
        }
        if let Err(error) = frame::encode(&EntryRef::Change(change), &mut pending.bytes) {
            drop(pending);
            self.inner.fail(format!("a change did not encode: {error}"));
            return;
        }
        self.inner.appended.fetch_add(1, Ordering::SeqCst);
        drop(pending);
        if was_empty {
            self.inner.wake.notify_one();
        }
    }

    async fn sync(&self) -> Result<(), StoreError> {
        let target = self.inner.appended.load(Ordering::SeqCst);
        let inner = &self.inner;
        if *inner.durable.borrow() >= target {
            return Ok(());
        }
        let mut durable = inner.durable.subscribe();
        let reached = durable
            .wait_for(|done| *done >= target || inner.failed.load(Ordering::SeqCst))
            .await
            .map(|done| *done >= target);
        match reached {
            Ok(true) => Ok(()),
            _ => Err(inner.refusal()),
        }
    }
}

fn write_loop(
    inner: Arc<Inner>,
    files: Files,
    file: File,
    mut number: u64,
    rotation: Rotation,
    ask: mpsc::Sender<u64>,
) {
    let mut tail = Tail::new(file, &files.segment(number));
    let mut batch = Vec::new();
    loop {
        let appended = {
            let mut pending = lock(&inner.pending);
            while pending.bytes.is_empty() && !pending.closing {
                pending = inner
                    .wake
                    .wait(pending)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if pending.bytes.is_empty() {
                // Closing: a clean close leaves no zeroed room (an open would trim it anyway).
                if let Err(error) = tail.trim() {
                    inner.fail(format!("{}: {error}", files.segment(number).display()));
                }
                return;
            }
            let deadline = std::time::Instant::now() + GATHER_WAIT;
            while pending.bytes.len() < GATHER_BYTES && !pending.closing {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                pending = inner
                    .wake
                    .wait_timeout(pending, left)
                    .map_or_else(|poisoned| poisoned.into_inner().0, |(guard, _)| guard);
            }
            std::mem::swap(&mut pending.bytes, &mut batch);
            inner.appended.load(Ordering::SeqCst)
        };
        if inner.failed.load(Ordering::SeqCst) {
            return;
        }
        if let Err(error) = tail.append(&batch) {
            inner.fail(format!("{}: {error}", files.segment(number).display()));
            return;
        }
        inner.synced_batches.fetch_add(1, Ordering::Relaxed);
        inner
            .written_bytes
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let since_snapshot = inner
            .since_snapshot
            .fetch_add(batch.len() as u64, Ordering::Relaxed)
            + batch.len() as u64;
        batch.clear();
        inner.durable.send_replace(appended);
        let due = rotation
            .snapshot_after
            .max(inner.last_snapshot.load(Ordering::Relaxed));
        if since_snapshot >= due && inner.snapshot_source.get().is_some() && number < u64::MAX {
            // Everything framed from now on goes to the next segment, which the snapshot
            // (taken after this point) is replayed before.
            if let Err(error) = tail.trim() {
                inner.fail(format!("{}: {error}", files.segment(number).display()));
                return;
            }
            match files.create_segment(number + 1) {
                Ok(next) => {
                    tail = Tail::new(next, &files.segment(number + 1));
                    number += 1;
                    inner.since_snapshot.store(0, Ordering::Relaxed);
                    let _ = ask.send(number);
                }
                Err(error) => {
                    inner.fail(format!("{}: {error}", files.segment(number + 1).display()));
                    return;
                }
            }
        }
    }
}
