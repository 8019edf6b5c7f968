//! The records' table: 20-byte slots in one array, open addressing kept sorted by tag.
//!
//! A key's home is its tag scaled to the table (multiply and shift), and the slots hold their
//! keys in tag order, each at or after its home. Because scaling keeps tag order, the table
//! can be rebuilt at any size by one pass in order, so it grows by a quarter instead of
//! doubling and stays 68–85 % full: about 26 bytes per record where a doubling table pays 24
//! to 48. A lookup stops at the first slot that is empty or holds a larger tag; an insert
//! shifts the rest of its run one slot on; a removal shifts the displaced ones back.

use super::shard::Compact;

/// The word of an empty slot: no record has it, as no record's expiry second reaches
/// `SECS_MASK` (see `Epoch`).
pub(super) const EMPTY: u32 = u32::MAX;
/// Grow when an insert would take the table past this share of its homes, in per cent.
const MAX_LOAD: usize = 85;
/// Shrink when removals leave it below this share.
const MIN_LOAD: usize = 30;
/// The load a shrunk table is rebuilt at.
const REBUILT_LOAD: usize = 70;
/// Slots past the last home, for the runs that spill over the end; added again whenever a run
/// reaches the end (keys sharing the largest tags can always land there, whatever the size).
const SPILL: usize = 32;
/// The fewest homes a table that holds anything has.
const MIN_HOMES: usize = 16;

/// One record's entry: its key and the word with its state and expiry second.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) key: Compact,
    /// The state in the top two bits, the expiry second (from the store's epoch) below.
    pub(super) word: u32,
}

const VACANT: Slot = Slot {
    key: Compact::ZERO,
    word: EMPTY,
};

impl Slot {
    fn is_empty(&self) -> bool {
        self.word == EMPTY
    }
}

/// A shard's records.
#[derive(Debug, Default)]
pub(super) struct RecordTable {
    slots: Vec<Slot>,
    homes: usize,
    len: usize,
}

/// Where `tag` lives in a table of `homes` homes: order-preserving, so a table stays sorted
/// when rebuilt at another size.
fn home_of(tag: u32, homes: usize) -> usize {
    ((u64::from(tag) * homes as u64) >> 32) as usize
}

impl RecordTable {
    /// An empty table; it allocates on the first insert.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Records held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn home(&self, tag: u32) -> usize {
        home_of(tag, self.homes)
    }

    fn index_of(&self, key: Compact) -> Option<usize> {
        let tag = key.tag();
        let start = self.home(tag);
        let run = self.slots.get(start..)?;
        for (offset, slot) in run.iter().enumerate() {
            if slot.is_empty() || slot.key.tag() > tag {
                return None;
            }
            if slot.key == key {
                return Some(start + offset);
            }
        }
        None
    }

    /// The word of `key`'s record.
    pub(super) fn word(&self, key: Compact) -> Option<u32> {
        self.index_of(key).map(|index| self.slots[index].word)
    }

    /// The word of `key`'s record, to change in place (never to [`EMPTY`]).
    pub(super) fn word_mut(&mut self, key: Compact) -> Option<&mut u32> {
        let index = self.index_of(key)?;
        Some(&mut self.slots[index].word)
    }

    /// Adds the record of a key the table does not hold.
    pub(super) fn insert_new(&mut self, key: Compact, word: u32) {
        debug_assert_ne!(word, EMPTY, "a record's word is never the empty one");
        if (self.len + 1) * 100 > self.homes * MAX_LOAD {
            self.rebuild(self.grown());
        }
        self.insert_at_home(key, word);
        self.len += 1;
    }

    fn grown(&self) -> usize {
        (self.homes + self.homes / 4).max(MIN_HOMES)
    }

    fn insert_at_home(&mut self, key: Compact, word: u32) {
        let tag = key.tag();
        let mut at = self.home(tag);
        while let Some(slot) = self.slots.get(at) {
            if slot.is_empty() || slot.key.tag() > tag {
                break;
            }
            at += 1;
        }
        let free = match self
            .slots
            .get(at..)
            .and_then(|run| run.iter().position(Slot::is_empty))
        {
            Some(free) => at + free,
            None => {
                // The run reaches the end: more spill slots.
                let end = self.slots.len();
                self.slots.resize(end + SPILL, VACANT);
                end
            }
        };
        self.slots.copy_within(at..free, at + 1);
        self.slots[at] = Slot { key, word };
    }

    /// Forgets `key`'s record; `false` when there was none.
    pub(super) fn remove(&mut self, key: Compact) -> bool {
        let Some(mut at) = self.index_of(key) else {
            return false;
        };
        // Entries after it that sit past their home move back one slot, keeping the order.
        while let Some(next) = self.slots.get(at + 1).copied() {
            if next.is_empty() || self.home(next.key.tag()) > at {
                break;
            }
            self.slots[at] = next;
            at += 1;
        }
        self.slots[at] = VACANT;
        self.len -= 1;
        if self.homes > MIN_HOMES && self.len * 100 < self.homes * MIN_LOAD {
            self.rebuild((self.len * 100 / REBUILT_LOAD).max(MIN_HOMES));
        }
        true
    }

    /// Rebuilds at `homes` homes, in one ordered pass.
    fn rebuild(&mut self, homes: usize) {
        let mut slots = vec![VACANT; homes + SPILL];
        let mut next = 0;
        for slot in self.iter() {
            let at = home_of(slot.key.tag(), homes).max(next);
            if at >= slots.len() {
                slots.resize(at + SPILL, VACANT);
            }
            slots[at] = slot;
            next = at + 1;
        }
        self.slots = slots;
        self.homes = homes;
    }

    /// Every record, in tag order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        self.slots.iter().copied().filter(|slot| !slot.is_empty())
    }

    /// Appends the keys whose tag is `tag` (almost always one) to `into`.
    pub(super) fn keys_with_tag(&self, tag: u32, into: &mut Vec<Compact>) {
        let start = self.home(tag);
        let Some(run) = self.slots.get(start..) else {
            return;
        };
        for slot in run {
            if slot.is_empty() || slot.key.tag() > tag {
                break;
            }
            if slot.key.tag() == tag {
                into.push(slot.key);
            }
        }
    }

    /// Bytes the table holds, for sizing figures.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncegate_core::KeyHash;
    use std::collections::HashMap;

    fn key(bytes: [u8; 16]) -> Compact {
        Compact::of(&KeyHash(bytes))
    }

    fn random_key(rng: &mut fastrand::Rng, tags: u32) -> Compact {
        let mut bytes = [0u8; 16];
        rng.fill(&mut bytes);
        // A narrow tag range makes shared tags and long runs common.
        bytes[4..8].copy_from_slice(&rng.u32(..tags).to_le_bytes());
        key(bytes)
    }

    /// The table against a `HashMap` under random inserts, updates and removals, with tags
    /// drawn from a wide and from a narrow range; the sorted-run invariant is checked as well.
    #[test]
    fn behaves_like_a_map() {
        for (seed, tags) in [(1, u32::MAX), (2, 1000), (3, 20), (4, u32::MAX)] {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut table = RecordTable::new();
            let mut model: HashMap<[u32; 4], u32> = HashMap::new();
            let mut known: Vec<Compact> = Vec::new();
            for step in 0..40_000u32 {
                let grow = step < 25_000;
                match rng.u8(..10) {
                    0..=4 if grow || rng.bool() => {
                        let k = random_key(&mut rng, tags);
                        let word = rng.u32(..EMPTY);
                        if table.word(k).is_none() {
                            table.insert_new(k, word);
                            model.insert(k.words(), word);
                            known.push(k);
                        }
                    }
                    5 | 6 if !known.is_empty() => {
                        let k = known[rng.usize(..known.len())];
                        let word = rng.u32(..EMPTY);
                        if let Some(stored) = table.word_mut(k) {
                            *stored = word;
                            model.insert(k.words(), word);
                        }
                    }
                    _ if !known.is_empty() => {
                        let k = known.swap_remove(rng.usize(..known.len()));
                        assert_eq!(table.remove(k), model.remove(&k.words()).is_some());
                        assert!(!table.remove(k), "removed twice");
                    }
                    _ => {}
                }
            }
            assert_eq!(table.len(), model.len());
            for k in &known {
                assert_eq!(table.word(*k), model.get(&k.words()).copied());
            }
            let listed: Vec<Slot> = table.iter().collect();
            assert_eq!(listed.len(), model.len());
            for (at, slot) in table.slots.iter().enumerate() {
                if !slot.is_empty() {
                    assert!(table.home(slot.key.tag()) <= at, "a slot before its home");
                }
            }
            assert!(listed.windows(2).all(|w| w[0].key.tag() <= w[1].key.tag()));
            for k in &known {
                let mut found = Vec::new();
                table.keys_with_tag(k.tag(), &mut found);
                assert!(found.contains(k));
                assert!(found.iter().all(|f| f.tag() == k.tag()));
            }
        }
    }

    /// Keys sharing the largest tag all land past the last home: the spill grows with them,
    /// through growth and shrinking, and every one stays findable.
    #[test]
    fn keys_piling_up_at_the_end_spill_over() {
        let mut table = RecordTable::new();
        let mut keys = Vec::new();
        for i in 0..500u32 {
            let mut bytes = [0u8; 16];
            bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
            bytes[12..16].copy_from_slice(&i.to_le_bytes());
            let k = key(bytes);
            table.insert_new(k, i);
            keys.push(k);
        }
        assert!(keys.iter().zip(0..).all(|(k, i)| table.word(*k) == Some(i)));
        let mut found = Vec::new();
        table.keys_with_tag(u32::MAX, &mut found);
        assert_eq!(found.len(), 500);
        for k in keys.drain(..450) {
            assert!(table.remove(k));
        }
        assert!(keys.iter().all(|k| table.word(*k).is_some()));
        assert_eq!(table.len(), 50);
    }

    #[test]
    fn absent_keys_are_not_found() {
        let mut table = RecordTable::new();
        assert_eq!(table.word(key([7; 16])), None);
        assert!(!table.remove(key([7; 16])));
        table.insert_new(key([7; 16]), 5);
        let mut other = [7u8; 16];
        other[15] = 8;
        assert_eq!(table.word(key(other)), None, "same tag, other key");
        assert_eq!(table.word(key([7; 16])), Some(5));
    }

    /// Filled to a million records, the table costs at most 20 / 0.68 bytes each, and it
    /// shrinks again once most are removed.
    #[test]
    fn stays_dense_as_it_grows_and_shrinks() {
        let mut rng = fastrand::Rng::with_seed(9);
        let mut table = RecordTable::new();
        let mut keys = Vec::new();
        for count in 1..=1_000_000usize {
            let k = random_key(&mut rng, u32::MAX);
            table.insert_new(k, 1);
            keys.push(k);
            if count % 100_000 == 0 {
                let per_record = table.bytes() as f64 / count as f64;
                assert!(per_record < 20.0 / 0.68 + 0.1, "{per_record} B at {count}");
            }
        }
        for k in keys.drain(100_000..) {
            assert!(table.remove(k));
        }
        // Rebuilt at 70 % whenever it falls below 30 %.
        let per_record = table.bytes() as f64 / 100_000.0;
        assert!(per_record < 20.0 / 0.30, "{per_record} B left");
        assert!(keys.iter().all(|k| table.word(*k) == Some(1)));
    }
}
