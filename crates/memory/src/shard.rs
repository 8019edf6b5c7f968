//! A shard: records in a compact table, side tables for leases, outcomes and fingerprints,
//! watermarks and the expiry index.

use super::table::RecordTable;
use super::*;

/// A key as stored: the 128-bit hash as four 32-bit words, so that a table entry with its
/// 32-bit word packs into 20 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Compact([u32; 4]);

impl std::hash::Hash for Compact {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.low());
    }
}

impl Compact {
    pub(super) fn of(key: &KeyHash) -> Self {
        let word =
            |i: usize| u32::from_le_bytes([key.0[i], key.0[i + 1], key.0[i + 2], key.0[i + 3]]);
        Self([word(0), word(4), word(8), word(12)])
    }

    /// The key it was made of.
    pub(super) fn key(self) -> KeyHash {
        let mut bytes = [0u8; 16];
        for (chunk, word) in bytes.chunks_exact_mut(4).zip(self.0) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        KeyHash(bytes)
    }

    /// The low 64 bits: already uniform, they are the side tables' hash.
    pub(super) fn low(self) -> u64 {
        u64::from(self.0[0]) | (u64::from(self.0[1]) << 32)
    }

    /// Bits 32 to 63: the records table's order and the expiry index's 4-byte handle. (The
    /// shard is picked by the high half, so these are uniform inside a shard.)
    pub(super) fn tag(self) -> u32 {
        self.0[1]
    }

    /// The watermark table's hash: the tag alone, so that an expiry handle finds its mark,
    /// spread over 64 bits as hashbrown wants.
    pub(super) fn tag_hash(self) -> u64 {
        tag_hash(self.tag())
    }

    /// An all-zero key, for slots that hold none.
    pub(super) const ZERO: Self = Self([0; 4]);

    #[cfg(test)]
    pub(super) fn words(self) -> [u32; 4] {
        self.0
    }
}

/// See [`Compact::tag_hash`].
pub(super) fn tag_hash(tag: u32) -> u64 {
    u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Side tables only hold keys in their state; the key is already a hash, so it is not hashed
/// again.
pub(super) type Side<V> = HashMap<Compact, V, BuildPassThrough>;

pub(super) const STATE_SHIFT: u32 = 30;
pub(super) const SECS_MASK: u32 = (1 << STATE_SHIFT) - 1;
/// The latest expiry second a record can have: one below the mask, so that no record's word
/// is the table's `EMPTY` (about 34 years after the epoch; later expiries are clamped).
pub(super) const SECS_MAX: u32 = SECS_MASK - 1;
pub(super) const PENDING: u32 = 0;
pub(super) const PROCESSING: u32 = 1;
pub(super) const COMPLETED: u32 = 2;
pub(super) const COMPLETED_WITH_OUTCOME: u32 = 3;

/// Keys looked at per sweep of a shard, so that no operation waits long behind expiry.
pub(super) const SWEEP_BUDGET: usize = 1024;
/// Index entries looked at per eviction before giving up with `Full`.
pub(super) const EVICTION_TRIES: usize = 256;

#[derive(Debug, Clone, Copy)]
pub(super) struct LeaseSlot {
    pub(super) token: FencingToken,
    pub(super) until_ms: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    pub(super) scope: Compact,
    pub(super) value: u64,
    pub(super) deadline_secs: u32,
}

#[derive(Debug)]
pub(super) struct Shard {
    pub(super) slots: RecordTable,
    pub(super) leases: Side<LeaseSlot>,
    pub(super) outcomes: Side<Bytes>,
    /// Only records claimed for a named payload have one: events never pay for it.
    pub(super) fingerprints: Side<Fingerprint>,
    pub(super) watermarks: HashTable<Mark>,
    /// Deadlines by the key's tag: 4 bytes a record.
    pub(super) expiry: ExpiryIndex<u32>,
    pub(super) next_sweep_secs: u32,
    /// The shard's records counted by state as they change: what `stats` answers.
    pub(super) counts: LiveCounts,
}

/// How a record's stored word is counted.
fn counted(word: u32) -> Counted {
    match word >> STATE_SHIFT {
        PENDING => Counted::Pending,
        PROCESSING => Counted::Processing,
        _ => Counted::Completed,
    }
}

/// When a record may be forgotten: its retention, or a live lease beyond it.
pub(super) fn forget_secs(leases: &Side<LeaseSlot>, key: Compact, word: u32, epoch: Epoch) -> u32 {
    let lease = if word >> STATE_SHIFT == PROCESSING {
        leases
            .get(&key)
            .map_or(0, |lease| epoch.secs_ceil(lease.until_ms))
    } else {
        0
    };
    (word & SECS_MASK).max(lease)
}

/// Converts between unix milliseconds and the store's 30-bit expiry seconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Epoch(pub(super) u64);

impl Epoch {
    /// Rounds up, so a record never expires before its retention.
    pub(super) fn secs_ceil(self, ms: u64) -> u32 {
        let rel = ms.saturating_sub(self.0);
        rel.div_ceil(1000).min(u64::from(SECS_MAX)) as u32
    }
    pub(super) fn secs_floor(self, ms: u64) -> u32 {
        (ms.saturating_sub(self.0) / 1000).min(u64::from(SECS_MAX)) as u32
    }
    pub(super) fn ms(self, secs: u32) -> u64 {
        self.0 + u64::from(secs) * 1000
    }
}

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            slots: RecordTable::new(),
            leases: Side::default(),
            outcomes: Side::default(),
            fingerprints: Side::default(),
            watermarks: HashTable::new(),
            expiry: ExpiryIndex::new(),
            next_sweep_secs: 0,
            counts: LiveCounts::default(),
        }
    }

    pub(super) fn word(&self, key: Compact) -> Option<u32> {
        self.slots.word(key)
    }

    pub(super) fn load(&self, key: Compact, epoch: Epoch) -> Option<Record> {
        let word = self.word(key)?;
        let expires_at_ms = epoch.ms(word & SECS_MASK);
        let state = match word >> STATE_SHIFT {
            PENDING => RecordState::Pending,
            PROCESSING => {
                let lease = self.leases.get(&key)?;
                RecordState::Processing {
                    token: lease.token,
                    lease_until_ms: lease.until_ms,
                }
            }
            COMPLETED => RecordState::Completed { outcome: None },
            _ => RecordState::Completed {
                outcome: self.outcomes.get(&key).cloned(),
            },
        };
        Some(Record {
            state,
            expires_at_ms,
            fingerprint: self.fingerprints.get(&key).copied(),
        })
    }

    pub(super) fn forget_secs(&self, key: Compact, word: u32, epoch: Epoch) -> u32 {
        forget_secs(&self.leases, key, word, epoch)
    }

    /// Admits a key that has no entry at all: the common case, one probe and one insert.
    pub(super) fn insert_new(
        &mut self,
        key: Compact,
        expires_secs: u32,
        now_secs: u32,
        epoch: Epoch,
    ) {
        self.slots
            .insert_new(key, (PENDING << STATE_SHIFT) | expires_secs);
        self.expiry.push(key.tag(), now_secs, expires_secs);
        self.counts
            .add(Counted::Pending, epoch.ms(expires_secs), epoch.ms(now_secs));
    }

    pub(super) fn write(&mut self, key: Compact, record: Record, epoch: Epoch, now_secs: u32) {
        let Shard {
            slots,
            leases,
            outcomes,
            fingerprints,
            expiry,
            counts,
            ..
        } = self;
        let now_ms = epoch.ms(now_secs);
        match record.fingerprint {
            Some(fingerprint) => {
                fingerprints.insert(key, fingerprint);
            }
            None => {
                fingerprints.remove(&key);
            }
        }
        let slot = slots.word_mut(key);
        let before = slot
            .as_deref()
            .map(|word| forget_secs(leases, key, *word, epoch));
        if let Some((word, secs)) = slot.as_deref().zip(before) {
            counts.remove(counted(*word), epoch.ms(secs), now_ms);
        }
        let secs = epoch.secs_ceil(record.expires_at_ms);
        let state = match record.state {
            RecordState::Pending => {
                leases.remove(&key);
                outcomes.remove(&key);
                PENDING
            }
            RecordState::Processing {
                token,
                lease_until_ms,
            } => {
                outcomes.remove(&key);
                leases.insert(
                    key,
                    LeaseSlot {
                        token,
                        until_ms: lease_until_ms,
                    },
                );
                PROCESSING
            }
            RecordState::Completed { outcome: None } => {
                leases.remove(&key);
                outcomes.remove(&key);
                COMPLETED
            }
            RecordState::Completed {
                outcome: Some(outcome),
            } => {
                leases.remove(&key);
                outcomes.insert(key, outcome);
                COMPLETED_WITH_OUTCOME
            }
        };
        let word = (state << STATE_SHIFT) | secs;
        match slot {
            Some(stored) => *stored = word,
            None => slots.insert_new(key, word),
        }
        // The index needs an entry at or before the record's forget time, not at it: a later
        // time (a completion after the admit, a lease) is found when the earlier entry comes
        // due and pushed again then, so most records hold one entry.
        let after = forget_secs(leases, key, word, epoch);
        counts.add(counted(word), epoch.ms(after), now_ms);
        if before.is_none_or(|before| after < before) {
            expiry.push(key.tag(), now_secs, after);
        }
    }

    /// Sets `mark` as its scope's watermark (hashed by the tag, so that its expiry handle finds it).
    pub(super) fn put_mark(&mut self, mark: Mark) {
        let scope = mark.scope;
        match self
            .watermarks
            .find_mut(scope.tag_hash(), |kept| kept.scope == scope)
        {
            Some(kept) => *kept = mark,
            None => {
                self.watermarks
                    .insert_unique(scope.tag_hash(), mark, |kept| kept.scope.tag_hash());
            }
        }
    }

    /// Forgets `key`'s record at `now_ms`.
    pub(super) fn remove(&mut self, key: Compact, epoch: Epoch, now_ms: u64) {
        if let Some(word) = self.word(key) {
            let end = epoch.ms(self.forget_secs(key, word, epoch));
            self.counts.remove(counted(word), end, now_ms);
        }
        if self.slots.remove(key) {
            self.leases.remove(&key);
            self.outcomes.remove(&key);
            self.fingerprints.remove(&key);
        }
    }

    /// The full keys of records whose tag is `tag` (almost always one).
    pub(super) fn keys_with_tag(&self, tag: u32, into: &mut Vec<Compact>) {
        into.clear();
        self.slots.keys_with_tag(tag, into);
    }

    /// Forgets what has expired, within the sweep budget.
    pub(super) fn sweep(&mut self, epoch: Epoch, now_ms: u64) {
        let now_secs = epoch.secs_floor(now_ms);
        if now_secs < self.next_sweep_secs {
            return;
        }
        let mut due = Vec::new();
        let more = self
            .expiry
            .drain_passed(now_secs, SWEEP_BUDGET, |tag| due.push(tag));
        let mut keys = Vec::new();
        for tag in due {
            self.keys_with_tag(tag, &mut keys);
            for key in &keys {
                let Some(record) = self.load(*key, epoch) else {
                    continue;
                };
                if record.forget_after_ms() <= now_ms {
                    self.remove(*key, epoch, now_ms);
                } else if let Some(word) = self.word(*key) {
                    let deadline = self.forget_secs(*key, word, epoch);
                    self.expiry.push(key.tag(), now_secs, deadline);
                }
            }
            while let Ok(mark) = self.watermarks.find_entry(tag_hash(tag), |mark| {
                mark.scope.tag() == tag && epoch.ms(mark.deadline_secs) <= now_ms
            }) {
                mark.remove();
            }
        }
        self.next_sweep_secs = if more { now_secs } else { now_secs + 1 };
    }

    /// Makes room for one more record: sweep, then evict the record due soonest that no live
    /// lease protects. Returns how many live records were evicted early.
    pub(super) fn make_room(&mut self, limit: usize, epoch: Epoch, now_ms: u64) -> Result<u64, ()> {
        if self.slots.len() < limit {
            return Ok(0);
        }
        self.next_sweep_secs = 0;
        self.sweep(epoch, now_ms);
        let now_secs = epoch.secs_floor(now_ms);
        let mut protected = Vec::new();
        let mut evicted = 0;
        let mut keys = Vec::new();
        for _ in 0..EVICTION_TRIES {
            if self.slots.len() < limit {
                break;
            }
            let Some(tag) = self.expiry.pop_oldest() else {
                break;
            };
            self.keys_with_tag(tag, &mut keys);
            for key in &keys {
                match self.load(*key, epoch) {
                    Some(Record {
                        state: RecordState::Processing { lease_until_ms, .. },
                        ..
                    }) if lease_until_ms > now_ms => protected.push(*key),
                    Some(record) => {
                        if record.is_live(now_ms) {
                            evicted += 1;
                        }
                        self.remove(*key, epoch, now_ms);
                    }
                    None => {}
                }
            }
        }
        for key in protected {
            if let Some(word) = self.word(key) {
                let deadline = self.forget_secs(key, word, epoch);
                self.expiry.push(key.tag(), now_secs, deadline);
            }
        }
        if self.slots.len() < limit {
            Ok(evicted)
        } else {
            Err(())
        }
    }
}
