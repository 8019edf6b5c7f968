//! The segment being written: batches appended after its frames, each made durable by one
//! sync, into room zeroed ahead.
//!
//! Where the file system allows it, batches go straight to the disk (`O_DIRECT`), whole
//! 4 KiB blocks at a time: the block that holds the end of the frames is written again with the
//! next batch, its earlier bytes unchanged. A buffered write makes the sync walk the page cache
//! and wait for its writeback: measured on this project's VM, 63–73 µs of CPU per write and
//! sync, against 32–53 µs direct (BENCHMARKS.md). A torn write of that block cannot hurt frames
//! made durable before it: every sector of it holds either its old bytes or its new ones, and
//! both have the same earlier frames. File systems without direct writes (tmpfs) get buffered
//! ones.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::frame;

/// How far ahead of its frames the writer zeroes a segment. Writing into blocks the file
/// already has leaves its size and extents alone, so a batch's `fdatasync` flushes the data
/// without a metadata commit (a growing file makes every sync commit one: about twice the
/// sync's latency on ext4); the zeroing costs one such commit per this many bytes. Measured at
/// the gateway (BENCHMARKS.md): 2 MiB lost to not zeroing at all, its zeroing syncs stalling
/// every waiting caller; 256 KiB won.
const ZERO_AHEAD: u64 = 256 << 10;

/// The unit of a direct write: offsets, lengths and buffers are multiples of it (the largest
/// logical block size of common disks).
const BLOCK: u64 = 4096;

/// Zeros aligned for direct writes.
#[repr(C, align(4096))]
struct Zeros([u8; ZERO_AHEAD as usize]);

/// The zeros written ahead, from a static buffer rather than an allocation per extension.
static ZEROS: Zeros = Zeros([0; ZERO_AHEAD as usize]);

/// The segment being written: where its frames end and how far it is zeroed.
pub(crate) struct Tail {
    file: File,
    written: u64,
    zeroed: u64,
    direct: Option<Direct>,
}

/// The segment opened for direct writes, and the bytes of its last, partly written block.
struct Direct {
    file: File,
    partial: Vec<u8>,
    buffer: Vec<u8>,
}

impl Tail {
    /// The tail of segment `path`, just created as `file` with only its header.
    pub(crate) fn new(file: File, path: &Path) -> Self {
        let header = frame::HEADER_LEN as u64;
        Self {
            file,
            written: header,
            zeroed: header,
            direct: Direct::open(path, header),
        }
    }

    /// The tail of `file` written buffered whatever its file system allows (for tests).
    #[cfg(test)]
    fn buffered(file: File) -> Self {
        let header = frame::HEADER_LEN as u64;
        Self {
            file,
            written: header,
            zeroed: header,
            direct: None,
        }
    }

    /// Writes `batch` after the frames and makes it durable.
    pub(crate) fn append(&mut self, batch: &[u8]) -> std::io::Result<()> {
        let end = self.written + batch.len() as u64;
        match &mut self.direct {
            Some(direct) => direct.append(self.written, &mut self.zeroed, batch)?,
            None => {
                if end > self.zeroed {
                    // `end` passed the zeroed room, so at most ZERO_AHEAD bytes follow it.
                    let to = end.max(self.zeroed + ZERO_AHEAD);
                    let zeros =
                        usize::try_from(to - end).map_or(ZEROS.0.len(), |n| n.min(ZEROS.0.len()));
                    self.file.write_all_at(&ZEROS.0[..zeros], end)?;
                    self.zeroed = end + zeros as u64;
                }
                self.file.write_all_at(batch, self.written)?;
                self.file.sync_data()?;
            }
        }
        self.written = end;
        Ok(())
    }

    /// Gives back the zeroed room once the segment is finished.
    pub(crate) fn trim(&self) -> std::io::Result<()> {
        self.file.set_len(self.written)?;
        self.file.sync_data()
    }
}

impl Direct {
    /// `path` opened for direct writes, holding `header` bytes; `None` where the file system
    /// refuses direct I/O, or a direct write of the header's block (or the header does not read
    /// back whole).
    fn open(path: &Path, header: u64) -> Option<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()?;
        let mut buffer = Vec::new();
        let block = aligned(&mut buffer, BLOCK as usize);
        let read = file.read_at(block, 0).ok()?;
        if read as u64 != header {
            return None;
        }
        // A file system may take the flag yet refuse these writes (a block size above 4 KiB):
        // the header's block written back once, unchanged, proves that it does not.
        block[read..].fill(0);
        file.write_all_at(block, 0).ok()?;
        let partial = block[..read].to_vec();
        Some(Self {
            file,
            partial,
            buffer,
        })
    }

    /// Writes `batch` at `at` (where the frames end) with the blocks around it, and syncs.
    fn append(&mut self, at: u64, zeroed: &mut u64, batch: &[u8]) -> std::io::Result<()> {
        let start = at - at % BLOCK;
        debug_assert_eq!(self.partial.len() as u64, at - start);
        let end = at + batch.len() as u64;
        let padded = end.div_ceil(BLOCK) * BLOCK;
        if padded > *zeroed {
            // The blocks after this batch's last one, zeroed (ZERO_AHEAD is whole blocks).
            self.file.write_all_at(&ZEROS.0, padded)?;
            *zeroed = padded + ZERO_AHEAD;
        }
        let len = usize::try_from(padded - start).map_err(std::io::Error::other)?;
        let kept = self.partial.len();
        let buffer = aligned(&mut self.buffer, len);
        buffer[..kept].copy_from_slice(&self.partial);
        buffer[kept..kept + batch.len()].copy_from_slice(batch);
        buffer[kept + batch.len()..].fill(0);
        self.file.write_all_at(buffer, start)?;
        self.file.sync_data()?;
        let last = (end - end % BLOCK - start) as usize;
        self.partial.clear();
        self.partial
            .extend_from_slice(&buffer[last..kept + batch.len()]);
        Ok(())
    }
}

/// `len` bytes of `buffer` that start on a block boundary (grown as needed).
fn aligned(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    let block = BLOCK as usize;
    if buffer.len() < len + block {
        buffer.resize((len + block).next_power_of_two(), 0);
    }
    let offset = (block - buffer.as_ptr() as usize % block) % block;
    &mut buffer[offset..offset + len]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches of every size, across block boundaries and past the zeroed room, read back as
    /// one run of bytes after the header, then zeros; trimmed, the segment is just that run.
    fn batches_read_back_whole_in_order(direct: bool) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("segment");
        let header = vec![7u8; frame::HEADER_LEN];
        std::fs::write(&path, &header).expect("header");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        let mut tail = if direct {
            Tail::new(file, &path)
        } else {
            Tail::buffered(file)
        };
        if direct && tail.direct.is_none() {
            eprintln!("this folder refuses direct writes: checked buffered");
        }
        let mut expected = header.clone();
        let mut seed = 1u64;
        for round in 0..300usize {
            let len = [1, 17, 4095, 4096, 4097, 9000, 70_000][round % 7] + round;
            let batch: Vec<u8> = (0..len)
                .map(|i| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(i as u64);
                    (seed >> 56) as u8 | 1
                })
                .collect();
            tail.append(&batch).expect("append");
            expected.extend_from_slice(&batch);
            if round % 50 == 0 {
                // What a reader (the next open) sees between batches.
                let now = std::fs::read(&path).expect("read");
                assert_eq!(&now[..expected.len()], &expected[..]);
                assert!(now[expected.len()..].iter().all(|b| *b == 0));
            }
        }
        let written = std::fs::read(&path).expect("read");
        assert_eq!(&written[..expected.len()], &expected[..]);
        assert!(written[expected.len()..].iter().all(|b| *b == 0));
        tail.trim().expect("trim");
        assert_eq!(std::fs::read(&path).expect("read"), expected);
    }

    #[test]
    fn direct_batches_read_back_whole_in_order() {
        batches_read_back_whole_in_order(true);
    }

    #[test]
    fn buffered_batches_read_back_whole_in_order() {
        batches_read_back_whole_in_order(false);
    }
}
