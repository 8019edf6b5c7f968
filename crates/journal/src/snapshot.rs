//! Snapshots: the store's state written as changes, so that a restart replays the snapshot and
//! the segments after it instead of every segment ever written, and old segments can go.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use crate::frame::{self, EntryRef, Kind};
use crate::writer::{Files, Inner, sync_dir};

/// Writes a snapshot each time the writer starts a segment and asks for one.
pub(crate) fn run(files: Files, inner: Arc<Inner>, asked: Receiver<u64>) {
    while let Ok(mut number) = asked.recv() {
        // Asked again meanwhile: the newest segment is the one to start from.
        while let Ok(later) = asked.try_recv() {
            number = later;
        }
        let Some(source) = inner.snapshot_source.get() else {
            continue;
        };
        match write(&files, number, |emit| source(emit)) {
            Ok(Some(bytes)) => {
                inner.last_snapshot.store(bytes, Ordering::Relaxed);
                let _ = remove_before(&files, number);
            }
            Ok(None) => return,
            Err(_) => {
                inner.failed_snapshots.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Writes the snapshot replayed before segment `number`: its size, or `None` when the store is
/// gone.
pub(crate) fn write(
    files: &Files,
    number: u64,
    source: impl FnOnce(&mut dyn FnMut(&oncegate_memory::Change<'_>)) -> bool,
) -> std::io::Result<Option<u64>> {
    let done = files.snapshot(number);
    let path = done.with_extension("tmp");
    if path.exists() {
        std::fs::remove_file(&path)?;
    }
    let mut file = files.create(&path, Kind::Snapshot, number)?;
    let mut buffer = Vec::with_capacity(1 << 20);
    let mut count = 0u64;
    let mut failure: Option<std::io::Error> = None;
    let alive = source(&mut |change| {
        if failure.is_some() {
            return;
        }
        if let Err(error) = frame::encode(&EntryRef::Change(change), &mut buffer) {
            failure = Some(std::io::Error::other(error));
            return;
        }
        count += 1;
        if buffer.len() >= 1 << 20 {
            if let Err(error) = file.write_all(&buffer) {
                failure = Some(error);
            }
            buffer.clear();
        }
    });
    if !alive {
        let _ = std::fs::remove_file(&path);
        return Ok(None);
    }
    if let Some(error) = failure {
        let _ = std::fs::remove_file(&path);
        return Err(error);
    }
    frame::encode(&EntryRef::End(count), &mut buffer).map_err(std::io::Error::other)?;
    file.write_all(&buffer)?;
    file.sync_all()?;
    let bytes = file.metadata()?.len();
    drop(file);
    std::fs::rename(&path, &done)?;
    sync_dir(&files.dir)?;
    Ok(Some(bytes))
}

/// Removes the segments and snapshots that snapshot `number` made unnecessary.
pub(crate) fn remove_before(files: &Files, number: u64) -> std::io::Result<()> {
    for entry in std::fs::read_dir(&files.dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((_, older)) = crate::parse_name(name)
            && older < number
        {
            std::fs::remove_file(files.dir.join(name))?;
        }
    }
    sync_dir(&files.dir)
}
