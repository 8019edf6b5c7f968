//! A durable single-node store: the memory store's compact tables, with every change appended
//! to a journal before any answer that saw it leaves the store.
//!
//! One writer thread appends whatever changes gathered while it synced the last batch and syncs
//! once (group commit): appends are sequential, whatever keys the changes touch, so a change
//! costs its bytes, not random pages of a tree. Once the journal has grown by the size of the
//! last snapshot (at least `snapshot_after_bytes`), the writer starts a new segment and a
//! snapshot thread writes the state out as changes while the store keeps running; the segments
//! before it are then removed, so disk stays within a few times the live state. Opening replays
//! the newest snapshot and the segments after it.

mod frame;
mod open;
mod snapshot;
mod tail;
mod writer;

use std::path::PathBuf;

use oncegate_memory::MemoryStore;

#[cfg(feature = "test-support")]
pub use open::open_temporary;
pub use open::{JournalConfig, OpenError, check_file, import, open, open_with_clock, read_only};
pub use writer::FileJournal;

/// The durable store: memory tables behind a [`FileJournal`].
pub type JournalStore<C = oncegate_core::SystemClock> = MemoryStore<C, FileJournal>;

/// A journal file's kind and number, from its name.
pub(crate) fn parse_name(name: &str) -> Option<(frame::Kind, u64)> {
    let (kind, rest) = if let Some(rest) = name.strip_prefix("segment-") {
        (frame::Kind::Segment, rest.strip_suffix(".log")?)
    } else {
        (
            frame::Kind::Snapshot,
            name.strip_prefix("snapshot-")?.strip_suffix(".snap")?,
        )
    };
    if rest.len() != 16 {
        return None;
    }
    Some((kind, u64::from_str_radix(rest, 16).ok()?))
}

/// The files of a journal folder, by kind, in number order.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub(crate) segments: Vec<u64>,
    pub(crate) snapshots: Vec<u64>,
    pub(crate) leftovers: Vec<PathBuf>,
}
