//! Opening a journal folder: locking it, replaying the newest snapshot and the segments after
//! it into fresh tables, cutting a torn tail off, and starting the next segment.

use std::fs::File;
use std::path::{Path, PathBuf};

use oncegate_core::{Clock, FencingToken, SystemClock};
use oncegate_memory::{MemoryConfig, MemoryStore, Restore};

use crate::frame::{self, Ending, Entry, Kind};
use crate::writer::{Files, Rotation};
use crate::{FileJournal, JournalStore, Listing, parse_name};

/// How a journal store is opened.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// The folder holding the segments and snapshots; created if missing.
    pub dir: PathBuf,
    /// Queue partitions. Fixed when the folder is created.
    pub partitions: u16,
    /// The most records held (beyond, the record due soonest is evicted early and counted).
    pub max_records: u64,
    /// The least the journal grows between two snapshots.
    pub snapshot_after_bytes: u64,
}

impl JournalConfig {
    /// Defaults for a folder at `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            partitions: 16,
            max_records: 10_000_000,
            snapshot_after_bytes: 64 << 20,
        }
    }
}

/// Why a journal store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The folder or a file in it could not be created, read or written.
    #[error("cannot use {path}: {cause}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause (in the message, not a `source()`: printed with its chain, it would be said twice).
        cause: std::io::Error,
    },
    /// Another process has the folder open.
    #[error(
        "{path} is open in another oncegate process; stop it, or give this one another store path"
    )]
    Locked {
        /// The folder.
        path: PathBuf,
    },
    /// A file holds something this version cannot replay.
    #[error(
        "{path}: {message}; move the folder aside and start afresh, or restore it from a backup"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The folder was created with another partition count.
    #[error(
        "{path} was created with {stored} partitions but {configured} are configured; set partitions = {stored}"
    )]
    Partitions {
        /// The folder.
        path: PathBuf,
        /// In the files.
        stored: u16,
        /// In the configuration.
        configured: u16,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |cause| OpenError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// Opens (or creates) the store in `config.dir` on the system clock.
pub fn open(config: JournalConfig) -> Result<JournalStore, OpenError> {
    open_with_clock(config, SystemClock)
}

/// A store in a fresh temporary folder, removed when the store is dropped (feature
/// `test-support`).
#[cfg(feature = "test-support")]
pub fn open_temporary<C: Clock>(clock: C) -> Result<JournalStore<C>, OpenError> {
    let dir = tempfile::tempdir().map_err(io(&std::env::temp_dir()))?;
    let mut store_dir = JournalConfig::at(dir.path().join("journal"));
    store_dir.snapshot_after_bytes = 1 << 20;
    open_inner(store_dir, clock, Some(Box::new(dir)))
}

/// Opens (or creates) the store in `config.dir` on `clock`.
pub fn open_with_clock<C: Clock>(
    config: JournalConfig,
    clock: C,
) -> Result<JournalStore<C>, OpenError> {
    open_inner(config, clock, None)
}

fn open_inner<C: Clock>(
    config: JournalConfig,
    clock: C,
    keep: Option<Box<dyn std::any::Any + Send + Sync>>,
) -> Result<JournalStore<C>, OpenError> {
    let dir = config.dir.clone();
    let partitions = config.partitions.max(1);
    oncegate_files::create_dir_all(&dir).map_err(io(&dir))?;
    let lock_path = dir.join("lock");
    oncegate_files::create_private(&lock_path).map_err(io(&lock_path))?;
    let lock = File::options()
        .write(true)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    if lock.try_lock().is_err() {
        return Err(OpenError::Locked { path: dir });
    }
    let mut listing = list(&dir)?;
    for leftover in &listing.leftovers {
        std::fs::remove_file(leftover).map_err(io(leftover))?;
    }
    let mut files = Files {
        dir: dir.clone(),
        partitions,
        run: 0,
    };
    remove_unstarted_segment(&files, &mut listing)?;
    let plan = plan(&files, &listing, config.partitions)?;
    // The run of this open is above every run that wrote a file.
    // Headers come from disk: a run or a file number at the end of its range is refused, not
    // wrapped (a wrapped run would grant tokens below earlier ones).
    let run = plan
        .last_run
        .checked_add(1)
        .filter(|run| FencingToken::compose(*run, 0).run() == *run)
        .ok_or_else(|| corrupt(&dir, "the run counter is exhausted"))?;
    files.run = run;
    let next = match plan.replayed.last() {
        Some(last) => last
            .checked_add(1)
            .ok_or_else(|| corrupt(&files.segment(*last), "no segment number follows it"))?,
        None => plan.first,
    };
    let next_path = files.segment(next);
    let file = files.create_segment(next).map_err(io(&next_path))?;
    let last_snapshot = match plan.snapshot {
        Some(number) => std::fs::metadata(files.snapshot(number))
            .map_err(io(&files.snapshot(number)))?
            .len(),
        None => 0,
    };
    let rotation = Rotation {
        since_snapshot: 0,
        snapshot_after: config.snapshot_after_bytes,
        last_snapshot,
    };
    let mut journal = FileJournal::start(files.clone(), file, next, rotation).map_err(io(&dir))?;
    journal.lock = Some(lock);
    journal.keep = keep;
    let store = MemoryStore::with_journal(memory_config(&config), clock, journal, run);
    let mut restore = Restore::new(store, run);
    let since_snapshot = load(&files, &plan, &mut restore, true)?;
    let store = restore.finish();
    store
        .journal()
        .inner
        .since_snapshot
        .store(since_snapshot, std::sync::atomic::Ordering::Relaxed);
    let weak = store.downgrade();
    let source: crate::writer::SnapshotSource = Box::new(move |emit| match weak.upgrade() {
        Some(tables) => {
            tables.snapshot(emit);
            true
        }
        None => false,
    });
    let _ = store.journal().inner.snapshot_source.set(source);
    if let Some(number) = plan.snapshot {
        crate::snapshot::remove_before(&files, number).map_err(io(&dir))?;
    }
    Ok(store)
}

/// The state of the store in `dir` as it is, for reading while a gateway may write it: nothing
/// is locked, cut or created; a frame being written stops the read. Leases of the newest run
/// stand. The partition count is the folder's.
pub fn read_only(dir: &Path) -> Result<MemoryStore, OpenError> {
    if !dir.is_dir() {
        return Err(OpenError::Io {
            path: dir.to_path_buf(),
            cause: std::io::Error::new(std::io::ErrorKind::NotFound, "no such store folder"),
        });
    }
    let listing = list(dir)?;
    let any = listing
        .snapshots
        .last()
        .map(|n| (Kind::Snapshot, *n))
        .or_else(|| listing.segments.first().map(|n| (Kind::Segment, *n)));
    let mut files = Files {
        dir: dir.to_path_buf(),
        partitions: 1,
        run: 0,
    };
    if let Some((kind, number)) = any {
        files.partitions = read_header(&path_of(&files, kind, number))?.partitions;
    }
    let plan = plan(&files, &listing, files.partitions)?;
    let mut config = JournalConfig::at(dir);
    config.partitions = files.partitions;
    config.max_records = u64::MAX;
    let store = MemoryStore::with_journal(
        memory_config(&config),
        SystemClock,
        oncegate_memory::NoJournal,
        plan.last_run,
    );
    let mut restore = Restore::new(store, plan.last_run);
    load(&files, &plan, &mut restore, false)?;
    Ok(restore.finish())
}

/// Writes the state `fill` hands over as the first snapshot of a new store in `config.dir`
/// (absent or empty), its tokens above run `run`: how a store of another format moves in.
/// Returns the changes written.
pub fn import(
    config: &JournalConfig,
    run: u64,
    fill: impl FnOnce(&mut dyn FnMut(&oncegate_memory::Change<'_>)),
) -> Result<u64, OpenError> {
    let dir = &config.dir;
    oncegate_files::create_dir_all(dir).map_err(io(dir))?;
    let listing = list(dir)?;
    if !listing.segments.is_empty() || !listing.snapshots.is_empty() {
        return Err(corrupt(
            dir,
            "already holds a store: import into a new folder",
        ));
    }
    let files = Files {
        dir: dir.clone(),
        partitions: config.partitions.max(1),
        run,
    };
    let mut count = 0u64;
    crate::snapshot::write(&files, 0, |emit| {
        fill(&mut |change| {
            count += 1;
            emit(change);
        });
        true
    })
    .map_err(io(dir))?;
    Ok(count)
}

/// What one journal file holds, as opening would read it: the changes it replays into a fresh
/// store of its partition count, and whether it ends torn; or why opening would refuse it.
/// For tools and fuzzing: any bytes get an answer, never a panic.
pub fn check_file(bytes: &[u8]) -> Result<(u64, bool), String> {
    let header = frame::read_header(bytes)?;
    if header.partitions == 0 || header.partitions > 4096 {
        return Err(format!(
            "{} partitions: no store has that many",
            header.partitions
        ));
    }
    let store = MemoryStore::with_journal(
        MemoryConfig {
            shards: 4,
            max_records: 100_000,
            partitions: header.partitions.max(1),
        },
        SystemClock,
        oncegate_memory::NoJournal,
        header.run,
    );
    let mut restore = Restore::new(store, header.run.saturating_add(1));
    let mut changes = 0u64;
    let mut reader = &bytes[frame::HEADER_LEN..];
    let ending = frame::read_frames(&mut reader, |entry| match entry {
        Entry::Change(change) => {
            changes += 1;
            restore.apply(change).map_err(|e| e.to_string())
        }
        Entry::End(_) | Entry::Batch(_) => Ok(()),
    })
    .map_err(|e| e.to_string())??;
    drop(restore.finish());
    match ending {
        Ending::Damaged { at, why } => Err(format!("damaged at byte {at}: {why}")),
        ending => Ok((changes, matches!(ending, Ending::Torn { .. }))),
    }
}

fn memory_config(config: &JournalConfig) -> MemoryConfig {
    MemoryConfig {
        shards: 64,
        max_records: config.max_records,
        partitions: config.partitions.max(1),
    }
}

/// What a folder's files say, checked: where replay starts and what it reads.
struct Plan {
    snapshot: Option<u64>,
    replayed: Vec<u64>,
    /// The first segment replayed (or created) after the snapshot.
    first: u64,
    last_run: u64,
}

fn plan(files: &Files, listing: &Listing, configured: u16) -> Result<Plan, OpenError> {
    let snapshot = listing.snapshots.last().copied();
    let replayed: Vec<u64> = listing
        .segments
        .iter()
        .copied()
        .filter(|number| snapshot.is_none_or(|from| *number >= from))
        .collect();
    let mut last_run = 0;
    for (kind, number) in snapshot
        .map(|n| (Kind::Snapshot, n))
        .into_iter()
        .chain(replayed.iter().map(|n| (Kind::Segment, *n)))
    {
        let path = path_of(files, kind, number);
        let header = read_header(&path)?;
        if header.partitions != files.partitions {
            return Err(OpenError::Partitions {
                path: files.dir.clone(),
                stored: header.partitions,
                configured,
            });
        }
        if header.kind != kind || header.number != number {
            return Err(corrupt(&path, "its header names another file"));
        }
        last_run = last_run.max(header.run);
    }
    let first = snapshot.unwrap_or(0);
    for (position, number) in replayed.iter().enumerate() {
        if *number != first + position as u64 {
            let missing = files.segment(first + position as u64);
            return Err(corrupt(&missing, "this segment is missing"));
        }
    }
    Ok(Plan {
        snapshot,
        replayed,
        first,
        last_run,
    })
}

/// Replays the plan's snapshot and segments into `restore`; with `cut`, a torn tail of the last
/// segment is cut off. Returns the bytes of the segments replayed.
fn load<C: Clock, J: oncegate_memory::Journal>(
    files: &Files,
    plan: &Plan,
    restore: &mut Restore<C, J>,
    cut: bool,
) -> Result<u64, OpenError> {
    if let Some(number) = plan.snapshot {
        let path = files.snapshot(number);
        match replay(&path, restore)? {
            (Ending::Clean, true) => {}
            (Ending::Damaged { at, why }, _) => {
                return Err(corrupt(&path, &format!("damaged at byte {at}: {why}")));
            }
            _ => return Err(corrupt(&path, "the snapshot is incomplete")),
        }
    }
    let mut bytes = 0;
    for (position, number) in plan.replayed.iter().enumerate() {
        let path = files.segment(*number);
        bytes += std::fs::metadata(&path).map_err(io(&path))?.len();
        let newest = position + 1 == plan.replayed.len();
        match replay(&path, restore)?.0 {
            Ending::Clean => {}
            // Room the writer zeroed ahead: the newest segment gives it back, an earlier one
            // (left so by a crash between a rotation and its trim) keeps it.
            Ending::Zeroed(at) if newest && cut => truncate(&path, at)?,
            Ending::Zeroed(_) => {}
            // The process died while writing its last batch: nothing in it was answered.
            Ending::Torn { at, bytes } if newest => {
                if cut {
                    keep_cut(&path, at, bytes)?;
                    truncate(&path, at)?;
                }
            }
            Ending::Torn { at, .. } => {
                return Err(corrupt(
                    &path,
                    &format!("damaged at byte {at}, before later segments"),
                ));
            }
            // Read while a gateway writes it: the batch being written stops the read.
            Ending::Damaged { .. } if newest && !cut => {}
            Ending::Damaged { at, why } => {
                let remedy = if newest {
                    format!(
                        " (to start from what precedes it, losing the events after it: keep a \
                         copy of the file, then `truncate -s {at}` it)"
                    )
                } else {
                    String::new()
                };
                return Err(corrupt(
                    &path,
                    &format!("damaged at byte {at}: {why}{remedy}"),
                ));
            }
        }
    }
    Ok(bytes)
}

/// Cuts `path` back to `at` bytes, durably.
fn truncate(path: &Path, at: u64) -> Result<(), OpenError> {
    let file = File::options().write(true).open(path).map_err(io(path))?;
    file.set_len(at)
        .and_then(|()| file.sync_all())
        .map_err(io(path))
}

/// Keeps the `bytes` of a torn tail at `at` of `path` beside it (`<name>.cut-at-<at>`, owner
/// only: it may hold events) before they are cut, and says so: a cut is never silent.
fn keep_cut(path: &Path, at: u64, bytes: u64) -> Result<(), OpenError> {
    use std::io::{Read, Seek};
    let name = path
        .file_name()
        .map_or_else(|| "segment".into(), |name| name.to_string_lossy());
    let side = path.with_file_name(format!("{name}.cut-at-{at}"));
    let copy = || -> std::io::Result<()> {
        let mut from = File::open(path)?;
        from.seek(std::io::SeekFrom::Start(at))?;
        oncegate_files::create_private(&side)?;
        let mut to = File::options().write(true).truncate(true).open(&side)?;
        std::io::copy(&mut from.take(bytes), &mut to)?;
        to.sync_all()?;
        if let Some(dir) = side.parent() {
            crate::writer::sync_dir(dir)?;
        }
        Ok(())
    };
    copy().map_err(io(&side))?;
    tracing::warn!(
        segment = %path.display(),
        at,
        bytes,
        kept = %side.display(),
        "the journal's last write was torn by a crash: its {bytes} bytes from byte {at} were never \
         acknowledged and are cut (the platform sends those events again); the cut bytes are kept \
         beside the segment"
    );
    Ok(())
}

/// Builds before segments were created under a temporary name could die between creating the
/// newest segment and writing its header: such a file is shorter than a header, and nothing was
/// ever written into it (frames follow a synced header), so it goes.
fn remove_unstarted_segment(files: &Files, listing: &mut Listing) -> Result<(), OpenError> {
    let Some(&last) = listing.segments.last() else {
        return Ok(());
    };
    let path = files.segment(last);
    let len = std::fs::metadata(&path).map_err(io(&path))?.len();
    if len < frame::HEADER_LEN as u64 {
        std::fs::remove_file(&path).map_err(io(&path))?;
        listing.segments.pop();
    }
    Ok(())
}

fn corrupt(path: &Path, message: &str) -> OpenError {
    OpenError::Corrupt {
        path: path.to_path_buf(),
        message: message.to_owned(),
    }
}

fn path_of(files: &Files, kind: Kind, number: u64) -> PathBuf {
    match kind {
        Kind::Segment => files.segment(number),
        Kind::Snapshot => files.snapshot(number),
    }
}

fn read_header(path: &Path) -> Result<frame::Header, OpenError> {
    use std::io::Read;
    let mut bytes = [0u8; frame::HEADER_LEN];
    let mut file = File::open(path).map_err(io(path))?;
    let mut read = 0;
    while read < bytes.len() {
        match file.read(&mut bytes[read..]).map_err(io(path))? {
            0 => break,
            n => read += n,
        }
    }
    frame::read_header(&bytes[..read]).map_err(|message| corrupt(path, &message))
}

/// Replays one file: how it ended, and whether it held a snapshot's end mark.
fn replay<C: Clock, J: oncegate_memory::Journal>(
    path: &Path,
    restore: &mut Restore<C, J>,
) -> Result<(Ending, bool), OpenError> {
    let file = File::open(path).map_err(io(path))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    std::io::Read::read_exact(&mut reader, &mut [0u8; frame::HEADER_LEN]).map_err(io(path))?;
    let mut ended = false;
    let mut changes = 0u64;
    let ending = frame::read_frames(&mut reader, |entry| match entry {
        Entry::Change(change) if !ended => {
            changes += 1;
            restore.apply(change).map_err(|e| e.to_string())
        }
        Entry::Change(_) => Err("changes after the end of a snapshot".into()),
        Entry::End(count) if count == changes => {
            ended = true;
            Ok(())
        }
        Entry::End(count) => Err(format!(
            "the snapshot says {count} changes but holds {changes}"
        )),
        Entry::Batch(_) => Ok(()),
    })
    .map_err(io(path))?
    .map_err(|message| corrupt(path, &message))?;
    Ok((ending, ended))
}

/// The folder's journal files; a temporary snapshot left by a crash is a leftover.
fn list(dir: &Path) -> Result<Listing, OpenError> {
    let mut listing = Listing::default();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if (name.starts_with("snapshot-") || name.starts_with("segment-")) && name.ends_with(".tmp")
        {
            listing.leftovers.push(entry.path());
            continue;
        }
        match parse_name(name) {
            Some((Kind::Segment, number)) => listing.segments.push(number),
            Some((Kind::Snapshot, number)) => listing.snapshots.push(number),
            None => {}
        }
    }
    listing.segments.sort_unstable();
    listing.snapshots.sort_unstable();
    Ok(listing)
}
