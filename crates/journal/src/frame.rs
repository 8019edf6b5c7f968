//! The file format: a header, then frames of `[length u32][checksum u32][postcard entry]`.
//!
//! Segments and snapshots share it. Each batch the writer syncs starts with a [`Entry::Batch`]
//! mark, numbered one after the other: what a crash can leave is only the end of the last batch
//! (its frames cut short or with blocks that never reached the disk), so a frame failing its
//! checksum with a later batch's mark after it, or lying whole on the disk, is damage, never a
//! torn tail to cut (see [`Ending`]).

use std::io::{self, Read};

use oncegate_memory::Change;
use serde::{Deserialize, Serialize};

/// The first bytes of every journal file.
pub(crate) const MAGIC: &[u8; 16] = b"oncegate-journ1\n";
/// Magic, kind, partitions, file number, run.
pub(crate) const HEADER_LEN: usize = 16 + 1 + 2 + 8 + 8;
/// The largest frame a reader accepts: far above any event the gateway admits.
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// What a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Segment = 1,
    Snapshot = 2,
}

/// One frame's content, as read.
// Read one at a time and applied at once: boxing the change would allocate for every frame.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Deserialize)]
pub(crate) enum Entry<'a> {
    /// A change to the store.
    Change(Change<'a>),
    /// The end of a complete snapshot, with the changes it holds.
    End(u64),
    /// The start of a batch the writer synced, numbered one after the other.
    Batch(u64),
}

/// One frame's content, as written: the same encoding as [`Entry`], from a borrowed change.
#[derive(Debug, Serialize)]
pub(crate) enum EntryRef<'a> {
    /// A change to the store.
    Change(&'a Change<'a>),
    /// The end of a complete snapshot.
    End(u64),
    /// The start of a batch.
    Batch(u64),
}

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    pub(crate) partitions: u16,
    /// The segment number (a snapshot's: the first segment replayed after it).
    pub(crate) number: u64,
    /// The run that wrote the file: every later run's tokens are above it.
    pub(crate) run: u64,
}

/// A file's header.
pub(crate) fn header(header: Header) -> [u8; HEADER_LEN] {
    let mut bytes = [0u8; HEADER_LEN];
    bytes[..16].copy_from_slice(MAGIC);
    bytes[16] = header.kind as u8;
    bytes[17..19].copy_from_slice(&header.partitions.to_le_bytes());
    bytes[19..27].copy_from_slice(&header.number.to_le_bytes());
    bytes[27..35].copy_from_slice(&header.run.to_le_bytes());
    bytes
}

/// Reads a header, or says what is wrong with it.
pub(crate) fn read_header(bytes: &[u8]) -> Result<Header, String> {
    if bytes.len() < HEADER_LEN || &bytes[..16] != MAGIC {
        return Err("it is not an oncegate journal file (no header)".into());
    }
    let kind = match bytes[16] {
        1 => Kind::Segment,
        2 => Kind::Snapshot,
        other => return Err(format!("unknown file kind {other}")),
    };
    let word = |at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(word)
    };
    Ok(Header {
        kind,
        partitions: u16::from_le_bytes([bytes[17], bytes[18]]),
        number: word(19),
        run: word(27),
    })
}

fn checksum(payload: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(payload) as u32
}

/// Appends `entry` as one frame to `buffer`.
pub(crate) fn encode(entry: &EntryRef<'_>, buffer: &mut Vec<u8>) -> Result<(), postcard::Error> {
    let start = buffer.len();
    buffer.extend_from_slice(&[0u8; 8]);
    let mut payload = postcard::to_extend(entry, std::mem::take(buffer))?;
    let length = (payload.len() - start - 8) as u32;
    let sum = checksum(&payload[start + 8..]);
    payload[start..start + 4].copy_from_slice(&length.to_le_bytes());
    payload[start + 4..start + 8].copy_from_slice(&sum.to_le_bytes());
    *buffer = payload;
    Ok(())
}

/// How a file's frames ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// At the end of the file.
    Clean,
    /// In a frame that starts at `at` and is cut short or has blocks that never reached the
    /// disk, in the last batch: what a crash during the last write leaves. `bytes` is the
    /// extent from `at` to the last byte that is not zero (what cutting the tail drops).
    Torn {
        /// Where the torn frame starts.
        at: u64,
        /// The bytes from `at` to the last non-zero byte.
        bytes: u64,
    },
    /// At this offset, where only zeros follow to the end of the file: the room a writer
    /// zeroed ahead of its frames (a frame's checksum never matches an all-zero head).
    Zeroed(u64),
    /// A frame at `at` fails its checksum where no crash could have left it so.
    Damaged {
        /// Where the damaged frame starts.
        at: u64,
        /// Why it is damage and not a torn tail.
        why: String,
    },
}

/// The unit a disk writes whole: a block that did not reach the disk before a crash reads as
/// the zeros written ahead of the frames. The smallest sector there is, so a larger one (whose
/// sectors are each all zero too) is found as well.
const SECTOR: u64 = 512;

/// Reads every frame after the header, handing each entry to `each`; stops at the first frame
/// that is cut short or fails its checksum, and says whether a crash could have left it.
pub(crate) fn read_frames(
    reader: &mut impl Read,
    mut each: impl FnMut(Entry<'_>) -> Result<(), String>,
) -> io::Result<Result<Ending, String>> {
    let mut offset = HEADER_LEN as u64;
    let mut payload = Vec::new();
    let mut last_batch = 0u64;
    loop {
        let mut head = [0u8; 8];
        let read = read_full(reader, &mut head)?;
        if read == 0 {
            return Ok(Ok(Ending::Clean));
        }
        if read < 8 {
            return Ok(Ok(classify(
                offset,
                &head[..read],
                None,
                reader,
                last_batch,
            )?));
        }
        let length = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let sum = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if head == [0; 8] || length > MAX_FRAME {
            return Ok(Ok(classify(offset, &head, None, reader, last_batch)?));
        }
        payload.resize(length, 0);
        let got = read_full(reader, &mut payload)?;
        if got < length || checksum(&payload) != sum {
            let mut seen = head.to_vec();
            seen.extend_from_slice(&payload[..got]);
            let end = offset + 8 + length as u64;
            return Ok(Ok(classify(offset, &seen, Some(end), reader, last_batch)?));
        }
        let entry = match postcard::from_bytes::<Entry<'_>>(&payload) {
            Ok(entry) => entry,
            Err(error) => {
                return Ok(Err(format!(
                    "the frame at byte {offset} passes its checksum but does not decode ({error}): \
                     written by another version?"
                )));
            }
        };
        if let Entry::Batch(number) = entry {
            last_batch = number;
        }
        if let Err(message) = each(entry) {
            return Ok(Err(message));
        }
        offset += 8 + length as u64;
    }
}

/// What the bytes from a bad frame at `at` on say: `seen` is what was read of it already,
/// `frame_end` where its head says it ends (when the head is whole and plausible), `rest` the
/// file after `seen`, `last_batch` the number of the last batch mark read before it.
///
/// A crash leaves the end of the last batch with each of its sectors either written or still
/// zero: so a later batch's mark after the frame proves damage, and so does a frame that lies
/// whole on the disk with every sector written. Marks are looked for at every offset (a damaged
/// length hides where frames start), numbered after `last_batch` (a batch mark is 10 to 19
/// bytes with its own checksum: found inside an event's bytes by chance, it would make opening
/// refuse, never cut).
fn classify(
    at: u64,
    seen: &[u8],
    frame_end: Option<u64>,
    rest: &mut impl Read,
    last_batch: u64,
) -> io::Result<Ending> {
    let frame_end = frame_end.unwrap_or(at + seen.len().max(8) as u64);
    let mut scan = Scan {
        at,
        frame_end,
        last_batch,
        window: seen.to_vec(),
        base: at,
        next_mark: at + 1,
        sector_zero: None,
        unwritten: false,
        last_nonzero: None,
        mark: None,
    };
    let mut chunk = vec![0u8; 64 << 10];
    let mut processed = at;
    loop {
        let read = read_full(rest, &mut chunk)?;
        scan.window.extend_from_slice(&chunk[..read]);
        let eof = read < chunk.len();
        processed = scan.bytes(processed);
        scan.marks(eof);
        if scan.mark.is_some() || eof {
            break;
        }
    }
    let file_end = processed;
    scan.finish_sector();
    if let Some(mark) = scan.mark {
        return Ok(Ending::Damaged {
            at,
            why: format!(
                "a frame fails its checksum, and a later batch of frames starts at byte {mark}: \
                 damage inside the file, not a write a crash cut short"
            ),
        });
    }
    let Some(last_nonzero) = scan.last_nonzero else {
        return Ok(Ending::Zeroed(at));
    };
    if file_end < frame_end || scan.unwritten {
        return Ok(Ending::Torn {
            at,
            bytes: last_nonzero + 1 - at,
        });
    }
    Ok(Ending::Damaged {
        at,
        why: "a frame lies whole on the disk yet fails its checksum: a changed byte, not a \
              write a crash cut short"
            .into(),
    })
}

/// The state of [`classify`]'s one pass over the bytes after a bad frame.
struct Scan {
    at: u64,
    frame_end: u64,
    last_batch: u64,
    /// Bytes from `base` on not yet looked at for marks.
    window: Vec<u8>,
    base: u64,
    /// The next offset a mark may start at.
    next_mark: u64,
    /// Whether the sector being read is zero so far (`None` before its first byte).
    sector_zero: Option<bool>,
    /// A sector of the frame never reached the disk.
    unwritten: bool,
    last_nonzero: Option<u64>,
    /// Where a later batch's mark was found.
    mark: Option<u64>,
}

impl Scan {
    /// Looks at the window's bytes from offset `from` on for zero sectors and the last
    /// non-zero byte; returns the offset after the window.
    fn bytes(&mut self, from: u64) -> u64 {
        let end = self.base + self.window.len() as u64;
        for offset in from..end {
            let byte = self.window[(offset - self.base) as usize];
            if offset > self.at && offset % SECTOR == 0 {
                self.finish_sector();
            }
            if byte != 0 {
                self.last_nonzero = Some(offset);
            }
            // The sectors the frame touches, each whole (a sector past its end still holds
            // the next frames' bytes, or zeros where it never reached the disk).
            if offset - offset % SECTOR < self.frame_end {
                let zero = self.sector_zero.unwrap_or(true) && byte == 0;
                self.sector_zero = Some(zero);
            }
        }
        end
    }

    /// Ends the sector being read: a sector of the frame (from `at`) that is all zeros never
    /// reached the disk.
    fn finish_sector(&mut self) {
        if self.sector_zero.take() == Some(true) {
            self.unwritten = true;
        }
    }

    /// Looks for a later batch's mark at every offset whose frame the window holds whole (or
    /// all offsets at the end of the file), then drops what no mark can still start in.
    fn marks(&mut self, eof: bool) {
        const LONGEST: u64 = 8 + 11;
        let end = self.base + self.window.len() as u64;
        while self.mark.is_none()
            && (self.next_mark + LONGEST <= end || (eof && self.next_mark < end))
        {
            let start = (self.next_mark - self.base) as usize;
            if let Some(number) = batch_mark(&self.window[start..])
                && number > self.last_batch
            {
                self.mark = Some(self.next_mark);
            } else {
                self.next_mark += 1;
            }
        }
        let keep = (self.next_mark.min(end) - self.base) as usize;
        self.window.drain(..keep);
        self.base += keep as u64;
    }
}

/// The number of the batch mark `bytes` starts with, if it starts with one.
fn batch_mark(bytes: &[u8]) -> Option<u64> {
    let head = bytes.get(..8)?;
    let length = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    // A mark's payload: the variant's index (2) and the number as a varint.
    if !(2..=11).contains(&length) {
        return None;
    }
    let payload = bytes.get(8..8 + length)?;
    if payload[0] != 2
        || checksum(payload) != u32::from_le_bytes([head[4], head[5], head[6], head[7]])
    {
        return None;
    }
    match postcard::from_bytes::<Entry<'_>>(payload) {
        Ok(Entry::Batch(number)) => Some(number),
        _ => None,
    }
}

/// Reads until `buffer` is full or the file ends: the bytes read.
fn read_full(reader: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncegate_core::KeyHash;

    fn frames(entries: &[EntryRef<'_>]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for entry in entries {
            encode(entry, &mut bytes).expect("encodes");
        }
        bytes
    }

    fn read(bytes: &[u8]) -> (Vec<String>, Ending) {
        let mut seen = Vec::new();
        let ending = read_frames(&mut &bytes[..], |entry| {
            seen.push(format!("{entry:?}"));
            Ok(())
        })
        .expect("io")
        .expect("decodes");
        (seen, ending)
    }

    /// What cutting the file at `cut` leaves after the frame starting at `start` (offsets in
    /// `bytes`): only zeros is zeroed room, anything else a torn frame up to its last byte
    /// that is not zero.
    fn cut_ending(bytes: &[u8], start: usize, cut: usize) -> Ending {
        let at = (HEADER_LEN + start) as u64;
        match bytes[start..cut].iter().rposition(|byte| *byte != 0) {
            None => Ending::Zeroed(at),
            Some(last) => Ending::Torn {
                at,
                bytes: last as u64 + 1,
            },
        }
    }

    #[test]
    fn frames_read_back_and_a_cut_anywhere_is_a_torn_end() {
        let ack = Change::Ack {
            id: oncegate_core::QueueId {
                partition: 3,
                seq: 99,
            },
        };
        let mark = Change::Mark {
            scope: KeyHash([5; 16]),
            value: 12,
            deadline_ms: 1_700_000_000_000,
        };
        let bytes = frames(&[
            EntryRef::Change(&ack),
            EntryRef::Change(&mark),
            EntryRef::End(2),
        ]);
        let (all, ending) = read(&bytes);
        assert_eq!(all.len(), 3);
        assert_eq!(ending, Ending::Clean);
        let mut boundaries = vec![0];
        while let Some(&at) = boundaries.last().filter(|at| **at < bytes.len()) {
            let length =
                u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            boundaries.push(at + 8 + length as usize);
        }
        assert_eq!(boundaries.len(), 4);
        for cut in 1..bytes.len() {
            let (seen, ending) = read(&bytes[..cut]);
            let whole = boundaries.iter().filter(|b| **b <= cut).count() - 1;
            assert_eq!(seen.len(), whole, "cut at {cut}");
            let expected = if boundaries.contains(&cut) {
                Ending::Clean
            } else {
                cut_ending(&bytes, boundaries[whole], cut)
            };
            assert_eq!(ending, expected, "cut at {cut}");
        }
        let first_len = boundaries[1];
        // A flipped bit in the second frame, which lies whole in the file: no crash leaves
        // that.
        let mut damaged = bytes.clone();
        damaged[first_len + 9] ^= 0x10;
        let (seen, ending) = read(&damaged);
        assert_eq!(seen.len(), 1);
        assert!(
            matches!(ending, Ending::Damaged { at, .. } if at == (HEADER_LEN + first_len) as u64),
            "{ending:?}"
        );
    }

    /// Zeros after the frames (room zeroed ahead) end the read there as `Zeroed`; zeros with
    /// a byte far into them, or a frame written over only part of them, are a torn end; a
    /// byte in the head of what would be the next frame is damage.
    #[test]
    fn a_zeroed_tail_ends_the_frames_and_anything_in_it_is_torn() {
        let ack = Change::Ack {
            id: oncegate_core::QueueId {
                partition: 1,
                seq: 7,
            },
        };
        let bytes = frames(&[EntryRef::Change(&ack), EntryRef::Change(&ack)]);
        let end = (HEADER_LEN + bytes.len()) as u64;
        for zeros in [5, 8, 9, 20_000] {
            let mut padded = bytes.clone();
            padded.resize(bytes.len() + zeros, 0);
            let (seen, ending) = read(&padded);
            assert_eq!(
                (seen.len(), ending),
                (2, Ending::Zeroed(end)),
                "{zeros} zeros"
            );
        }
        // A stray byte far into the zeros: blocks of a batch, the one before never written.
        let mut stray = bytes.clone();
        stray.resize(bytes.len() + 20_000, 0);
        stray[bytes.len() + 10_000] = 1;
        assert_eq!(
            read(&stray).1,
            Ending::Torn {
                at: end,
                bytes: 10_001
            }
        );
        // A stray byte in the next head's sector: not what a crash leaves.
        let mut head = bytes.clone();
        head.resize(bytes.len() + 8, 0);
        head[bytes.len() + 6] = 1;
        assert!(matches!(read(&head).1, Ending::Damaged { at, .. } if at == end));
        // A frame across a sector boundary whose first sector reached the disk and whose
        // second did not (nor anything after it).
        let many: Vec<EntryRef<'_>> = (0..200).map(|_| EntryRef::Change(&ack)).collect();
        let mut torn = frames(&many);
        let boundary = 2 * SECTOR as usize - HEADER_LEN;
        torn[boundary..].fill(0);
        torn.resize(torn.len() + 4096, 0);
        let mut start = 0;
        while start + 8 + (torn[start] as usize) <= boundary {
            start += 8 + torn[start] as usize;
        }
        assert!(start < boundary, "a frame straddles the boundary");
        assert_eq!(read(&torn).1, cut_ending(&torn, start, boundary));
        assert!(matches!(read(&torn).1, Ending::Torn { .. }));
        // The same frame with only its last bytes zeroed, inside one sector that reached
        // the disk: no crash leaves that.
        let mut inside = frames(&many);
        let frame_end = start + 8 + inside[start] as usize;
        inside[frame_end - 2..frame_end].fill(0);
        let sector_end = boundary + SECTOR as usize;
        assert!(frame_end + 2 < sector_end);
        let ending = read(&inside).1;
        assert!(matches!(ending, Ending::Damaged { .. }), "{ending:?}");
    }

    /// A segment as the writer leaves it: batches of `per` acks, each after its mark; the
    /// file offsets (after the header) where each batch starts.
    fn batches(count: u64, per: u64) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        for batch in 1..=count {
            starts.push(HEADER_LEN + bytes.len());
            encode(&EntryRef::Batch(batch), &mut bytes).expect("encodes");
            for seq in 0..per {
                let ack = Change::Ack {
                    id: oncegate_core::QueueId {
                        partition: 1,
                        seq: batch * 1000 + seq,
                    },
                };
                encode(&EntryRef::Change(&ack), &mut bytes).expect("encodes");
            }
        }
        (bytes, starts)
    }

    /// The file offset of the first frame of `bytes` that `changed` differs in, and the
    /// extent from it to the last byte of `changed` that is not zero.
    fn first_changed(bytes: &[u8], changed: &[u8]) -> (u64, u64) {
        let mut at = 0;
        loop {
            let length =
                u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            let next = at + 8 + length as usize;
            if bytes[at..next] != changed[at..next] {
                let last = changed.iter().rposition(|byte| *byte != 0).expect("bytes");
                return ((HEADER_LEN + at) as u64, (last + 1 - at) as u64);
            }
            at = next;
        }
    }

    /// What a crash can do to the last batch (blocks of it never written, in any order; the
    /// file cut short) is a torn tail; the same to an earlier batch, or a changed byte
    /// anywhere, is damage.
    #[test]
    fn only_the_last_batch_can_be_torn_and_damage_anywhere_is_named() {
        let (bytes, starts) = batches(6, 300);
        assert_eq!(read(&bytes).0.len(), 6 * 301);
        let sector = SECTOR as usize;
        let end = HEADER_LEN + bytes.len();
        // Every sector of the last batch unwritten in turn, the ones after it written: torn.
        let mut offset = starts[5] - starts[5] % sector + sector;
        let mut tried = 0;
        while offset + sector < end {
            let mut torn = bytes.clone();
            torn[offset - HEADER_LEN..offset - HEADER_LEN + sector].fill(0);
            let (at, cut) = first_changed(&bytes, &torn);
            assert_eq!(
                read(&torn).1,
                Ending::Torn { at, bytes: cut },
                "sector at {offset}"
            );
            offset += sector;
            tried += 1;
        }
        assert!(tried >= 4, "{tried} sectors");
        // Cut short anywhere in the last batch: torn.
        for cut in [starts[5] + 1, starts[5] + 700, end - 1] {
            let short = &bytes[..cut - HEADER_LEN];
            assert!(matches!(read(short).1, Ending::Torn { .. }), "cut at {cut}");
        }
        // A 4 KiB block zeroed in the middle, or a flipped byte anywhere: damage, with the
        // offset of the first bad frame.
        let middle = starts[2] - starts[2] % 4096 + 4096;
        assert!(middle + 4096 < starts[4]);
        let mut zeroed = bytes.clone();
        zeroed[middle - HEADER_LEN..middle - HEADER_LEN + 4096].fill(0);
        let (expected, _) = first_changed(&bytes, &zeroed);
        let ending = read(&zeroed).1;
        assert!(
            matches!(ending, Ending::Damaged { at, ref why } if at == expected && why.contains("later batch")),
            "{ending:?}"
        );
        for at in [starts[1] + 3, starts[3] + 200, starts[5] + 40, end - 2] {
            let mut flipped = bytes.clone();
            flipped[at - HEADER_LEN] ^= 0x04;
            let (expected, _) = first_changed(&bytes, &flipped);
            let ending = read(&flipped).1;
            assert!(
                matches!(ending, Ending::Damaged { at: bad, .. } if bad == expected),
                "flipped at {at}: {ending:?}"
            );
        }
        // A batch mark's own frame damaged, with a later batch after it.
        let mut mark = bytes.clone();
        mark[starts[4] - HEADER_LEN + 9] ^= 0x01;
        let ending = read(&mark).1;
        assert!(
            matches!(ending, Ending::Damaged { at, .. } if at == starts[4] as u64),
            "{ending:?}"
        );
    }

    #[test]
    fn headers_round_trip_and_strangers_are_refused() {
        let written = Header {
            kind: Kind::Snapshot,
            partitions: 16,
            number: 42,
            run: 9,
        };
        assert_eq!(read_header(&header(written)), Ok(written));
        assert!(read_header(b"SQLite format 3\0 and more bytes here").is_err());
        assert!(read_header(&header(written)[..10]).is_err());
    }
}
