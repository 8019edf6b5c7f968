//! The file format: a header, then frames of `[length u32][checksum u32][postcard entry]`.
//!
//! Segments and snapshots share it. A frame cut short or failing its checksum ends a segment
//! that was being written when the process died; anywhere else it is corruption.

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
}

/// One frame's content, as written: the same encoding as [`Entry`], from a borrowed change.
#[derive(Debug, Serialize)]
pub(crate) enum EntryRef<'a> {
    /// A change to the store.
    Change(&'a Change<'a>),
    /// The end of a complete snapshot.
    End(u64),
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
    /// In a frame cut short or damaged, which starts at this offset.
    Torn(u64),
    /// At this offset, where only zeros follow to the end of the file: the room a writer
    /// zeroed ahead of its frames (a frame's checksum never matches an all-zero head).
    Zeroed(u64),
}

/// Reads every frame after the header, handing each entry to `each`; stops at the first frame
/// that is cut short or fails its checksum.
pub(crate) fn read_frames(
    reader: &mut impl Read,
    mut each: impl FnMut(Entry<'_>) -> Result<(), String>,
) -> io::Result<Result<Ending, String>> {
    let mut offset = HEADER_LEN as u64;
    let mut payload = Vec::new();
    loop {
        let mut head = [0u8; 8];
        match read_full(reader, &mut head)? {
            0 => return Ok(Ok(Ending::Clean)),
            8 => {}
            _ => return Ok(Ok(Ending::Torn(offset))),
        }
        if head == [0; 8] {
            return Ok(Ok(if only_zeros(reader)? {
                Ending::Zeroed(offset)
            } else {
                Ending::Torn(offset)
            }));
        }
        let length = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let sum = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if length > MAX_FRAME {
            return Ok(Ok(Ending::Torn(offset)));
        }
        payload.resize(length, 0);
        if read_full(reader, &mut payload)? < length || checksum(&payload) != sum {
            return Ok(Ok(Ending::Torn(offset)));
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
        if let Err(message) = each(entry) {
            return Ok(Err(message));
        }
        offset += 8 + length as u64;
    }
}

/// Whether everything left to read is zero.
fn only_zeros(reader: &mut impl Read) -> io::Result<bool> {
    let mut chunk = [0u8; 8192];
    loop {
        match read_full(reader, &mut chunk)? {
            0 => return Ok(true),
            n if chunk[..n].iter().any(|byte| *byte != 0) => return Ok(false),
            _ => {}
        }
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
                Ending::Torn((HEADER_LEN + boundaries[whole]) as u64)
            };
            assert_eq!(ending, expected, "cut at {cut}");
        }
        let first_len = boundaries[1];
        // A flipped bit in the second frame ends the read there.
        let mut damaged = bytes.clone();
        damaged[first_len + 9] ^= 0x10;
        let (seen, ending) = read(&damaged);
        assert_eq!(seen.len(), 1);
        assert_eq!(ending, Ending::Torn((HEADER_LEN + first_len) as u64));
    }

    /// Zeros after the frames (room zeroed ahead) end the read there as `Zeroed`; zeros with
    /// anything else after them, or a frame written over only part of them, are a torn end.
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
        for zeros in [8, 9, 20_000] {
            let mut padded = bytes.clone();
            padded.resize(bytes.len() + zeros, 0);
            let (seen, ending) = read(&padded);
            assert_eq!(
                (seen.len(), ending),
                (2, Ending::Zeroed(end)),
                "{zeros} zeros"
            );
            // A stray byte far into the zeros: not room zeroed ahead.
            let last = padded.len() - 1;
            padded[last] = 1;
            assert_eq!(read(&padded), (seen, Ending::Torn(end)));
        }
        // Fewer than a frame head of zeros is a head cut short.
        let mut short = bytes.clone();
        short.resize(bytes.len() + 5, 0);
        assert_eq!(read(&short).1, Ending::Torn(end));
        // A third frame whose first page reached the disk but whose tail did not.
        let mut torn = frames(&[
            EntryRef::Change(&ack),
            EntryRef::Change(&ack),
            EntryRef::Change(&ack),
        ]);
        let cut = torn.len() - 3;
        torn[cut..].fill(0);
        torn.resize(torn.len() + 4096, 0);
        assert_eq!(read(&torn).1, Ending::Torn(end));
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
