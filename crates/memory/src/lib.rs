//! The in-process backend: for tests, throwaway runs and as the reference implementation.
//!
//! Records live in shards, each behind its own lock. A record costs 20 bytes in its shard's
//! table (the 128-bit key and a 32-bit word holding the state and the expiry second) plus 16
//! bytes in the expiry index; leases and stored outcomes live in side tables that only hold
//! keys in those states. Expiry pops whole chunks of the index whose deadlines have passed, so
//! its cost is proportional to what expires. A size bound evicts the record due soonest, never
//! one under a live lease, and counts every eviction.

mod expiry;

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::queue_index::PartitionIndex;
use oncegate_core::store::millis;
use oncegate_core::{
    Admission, Claim, Clock, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck,
    FencingToken, KeyHash, Lease, QueueId, Record, RecordState, StoreError, StoreStats,
    SystemClock, WatermarkOutcome, WatermarkStore, transition,
};

use expiry::ExpiryIndex;

/// Sizing of a memory store.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// Independent locks over the records; more shards, less contention.
    pub shards: usize,
    /// The most records held; beyond it the record due soonest is evicted early.
    pub max_records: u64,
    /// Queue partitions.
    pub partitions: u16,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            shards: 64,
            max_records: 10_000_000,
            partitions: 16,
        }
    }
}

/// A key as stored: the 128-bit hash as four 32-bit words, so that a table entry with its
/// 32-bit slot packs into 20 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Compact([u32; 4]);

impl Compact {
    fn of(key: &KeyHash) -> Self {
        let word =
            |i: usize| u32::from_le_bytes([key.0[i], key.0[i + 1], key.0[i + 2], key.0[i + 3]]);
        Self([word(0), word(4), word(8), word(12)])
    }
}

impl Hash for Compact {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The key is already a uniform hash: its low bits are the table hash.
        state.write_u64(u64::from(self.0[0]) | (u64::from(self.0[1]) << 32));
    }
}

/// A hasher that passes an already uniform 64-bit value through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type Table<V> = HashMap<Compact, V, BuildHasherDefault<PassThrough>>;

/// The state in the top two bits of a slot, the expiry second (from the store's epoch) below.
const STATE_SHIFT: u32 = 30;
const SECS_MASK: u32 = (1 << STATE_SHIFT) - 1;
const PENDING: u32 = 0;
const PROCESSING: u32 = 1;
const COMPLETED: u32 = 2;
const COMPLETED_WITH_OUTCOME: u32 = 3;

/// Keys looked at per sweep of a shard, so that no operation waits long behind expiry.
const SWEEP_BUDGET: usize = 1024;
/// Index entries looked at per eviction before giving up with `Full`.
const EVICTION_TRIES: usize = 256;

#[derive(Debug, Clone, Copy)]
struct LeaseSlot {
    token: FencingToken,
    until_ms: u64,
}

#[derive(Debug)]
struct Shard {
    slots: Table<u32>,
    leases: Table<LeaseSlot>,
    outcomes: Table<Bytes>,
    watermarks: Table<(u64, u32)>,
    expiry: ExpiryIndex<Compact>,
    next_sweep_secs: u32,
}

/// Converts between unix milliseconds and the store's 30-bit expiry seconds.
#[derive(Debug, Clone, Copy)]
struct Epoch(u64);

impl Epoch {
    /// Rounds up, so a record never expires before its retention.
    fn secs_ceil(self, ms: u64) -> u32 {
        let rel = ms.saturating_sub(self.0);
        rel.div_ceil(1000).min(u64::from(SECS_MASK)) as u32
    }
    fn secs_floor(self, ms: u64) -> u32 {
        (ms.saturating_sub(self.0) / 1000).min(u64::from(SECS_MASK)) as u32
    }
    fn ms(self, secs: u32) -> u64 {
        self.0 + u64::from(secs) * 1000
    }
}

impl Shard {
    fn new() -> Self {
        Self {
            slots: Table::default(),
            leases: Table::default(),
            outcomes: Table::default(),
            watermarks: Table::default(),
            expiry: ExpiryIndex::new(),
            next_sweep_secs: 0,
        }
    }

    fn load(&self, key: Compact, epoch: Epoch) -> Option<Record> {
        let slot = *self.slots.get(&key)?;
        let expires_at_ms = epoch.ms(slot & SECS_MASK);
        let state = match slot >> STATE_SHIFT {
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
        })
    }

    fn forget_secs(&self, key: Compact, epoch: Epoch) -> Option<u32> {
        let slot = *self.slots.get(&key)?;
        let lease = self
            .leases
            .get(&key)
            .map_or(0, |lease| epoch.secs_ceil(lease.until_ms));
        Some((slot & SECS_MASK).max(lease))
    }

    fn write(&mut self, key: Compact, record: Record, epoch: Epoch, now_secs: u32) {
        let before = self.forget_secs(key, epoch);
        let secs = epoch.secs_ceil(record.expires_at_ms);
        let state = match record.state {
            RecordState::Pending => {
                self.leases.remove(&key);
                self.outcomes.remove(&key);
                PENDING
            }
            RecordState::Processing {
                token,
                lease_until_ms,
            } => {
                self.outcomes.remove(&key);
                self.leases.insert(
                    key,
                    LeaseSlot {
                        token,
                        until_ms: lease_until_ms,
                    },
                );
                PROCESSING
            }
            RecordState::Completed { outcome: None } => {
                self.leases.remove(&key);
                self.outcomes.remove(&key);
                COMPLETED
            }
            RecordState::Completed {
                outcome: Some(outcome),
            } => {
                self.leases.remove(&key);
                self.outcomes.insert(key, outcome);
                COMPLETED_WITH_OUTCOME
            }
        };
        self.slots.insert(key, (state << STATE_SHIFT) | secs);
        let after = self.forget_secs(key, epoch);
        if let Some(deadline) = after.filter(|after| Some(*after) != before) {
            self.expiry.push(key, now_secs, deadline);
        }
    }

    fn remove(&mut self, key: Compact) {
        if self.slots.remove(&key).is_some() {
            self.leases.remove(&key);
            self.outcomes.remove(&key);
        }
    }

    /// Forgets what has expired, within the sweep budget.
    fn sweep(&mut self, epoch: Epoch, now_ms: u64) {
        let now_secs = epoch.secs_floor(now_ms);
        if now_secs < self.next_sweep_secs {
            return;
        }
        let mut expired = Vec::new();
        let more = self.expiry.drain_passed(now_secs, SWEEP_BUDGET, |key| {
            expired.push(key);
        });
        for key in expired {
            if let Some(record) = self.load(key, epoch) {
                if record.forget_after_ms() <= now_ms {
                    self.remove(key);
                }
            }
            if let Entry::Occupied(mark) = self.watermarks.entry(key) {
                if epoch.ms(mark.get().1) <= now_ms {
                    mark.remove();
                }
            }
        }
        self.next_sweep_secs = if more { now_secs } else { now_secs + 1 };
    }

    /// Makes room for one more record: sweep, then evict the record due soonest that no live
    /// lease protects. Returns how many live records were evicted early.
    fn make_room(&mut self, limit: usize, epoch: Epoch, now_ms: u64) -> Result<u64, ()> {
        if self.slots.len() < limit {
            return Ok(0);
        }
        self.next_sweep_secs = 0;
        self.sweep(epoch, now_ms);
        let now_secs = epoch.secs_floor(now_ms);
        let mut protected = Vec::new();
        let mut evicted = 0;
        for _ in 0..EVICTION_TRIES {
            if self.slots.len() < limit {
                break;
            }
            let Some(key) = self.expiry.pop_oldest() else {
                break;
            };
            match self.load(key, epoch) {
                Some(Record {
                    state: RecordState::Processing { lease_until_ms, .. },
                    ..
                }) if lease_until_ms > now_ms => protected.push(key),
                Some(record) => {
                    if record.is_live(now_ms) {
                        evicted += 1;
                    }
                    self.remove(key);
                }
                None => {}
            }
        }
        for key in protected {
            if let Some(deadline) = self.forget_secs(key, epoch) {
                self.expiry.push(key, now_secs, deadline);
            }
        }
        if self.slots.len() < limit {
            Ok(evicted)
        } else {
            Err(())
        }
    }
}

#[derive(Debug)]
struct Queued {
    key: KeyHash,
    event: Event,
    attempt: u32,
}

#[derive(Debug, Default)]
struct Partition {
    head_seq: u64,
    entries: VecDeque<Option<Queued>>,
    order: PartitionIndex,
}

impl Partition {
    fn get_mut(&mut self, seq: u64) -> Option<&mut Queued> {
        let index = usize::try_from(seq.checked_sub(self.head_seq)?).ok()?;
        self.entries.get_mut(index)?.as_mut()
    }

    /// Takes a handed-out entry out of the queue.
    fn take_in_flight(&mut self, seq: u64) -> Option<Queued> {
        if !self.order.remove(seq) {
            return None;
        }
        let index = usize::try_from(seq.checked_sub(self.head_seq)?).ok()?;
        let taken = self.entries.get_mut(index)?.take();
        while matches!(self.entries.front(), Some(None)) {
            self.entries.pop_front();
            self.head_seq += 1;
        }
        taken
    }
}

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore<C: Clock = SystemClock> {
    clock: C,
    epoch: Epoch,
    shards: Box<[Mutex<Shard>]>,
    per_shard_limit: usize,
    partitions: Box<[Mutex<Partition>]>,
    dead_letters: Mutex<VecDeque<DeadLetter>>,
    next_token: AtomicU64,
    evicted_early: AtomicU64,
}

/// Takes a lock even if a holder panicked: every critical section leaves the data consistent
/// before anything that can panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MemoryStore<SystemClock> {
    /// A store with default sizing on the system clock.
    pub fn new() -> Self {
        Self::with_clock(MemoryConfig::default(), SystemClock)
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store with the given sizing and clock.
    pub fn with_clock(config: MemoryConfig, clock: C) -> Self {
        let shards = config.shards.max(1);
        let now_ms = clock.now_ms();
        // Runs are seconds since the epoch: a later store never repeats an earlier one's tokens.
        let run = now_ms / 1000;
        Self {
            epoch: Epoch(now_ms),
            shards: (0..shards).map(|_| Mutex::new(Shard::new())).collect(),
            per_shard_limit: usize::try_from(config.max_records.div_ceil(shards as u64))
                .unwrap_or(usize::MAX)
                .max(1),
            partitions: (0..config.partitions.max(1))
                .map(|_| Mutex::new(Partition::default()))
                .collect(),
            dead_letters: Mutex::new(VecDeque::new()),
            next_token: AtomicU64::new(FencingToken::compose(run, 1).0),
            evicted_early: AtomicU64::new(0),
            clock,
        }
    }

    fn shard_index(&self, key: &KeyHash) -> usize {
        // The high half picks the shard; the low half is the table hash inside it.
        (key.high64() % self.shards.len() as u64) as usize
    }

    fn shard(&self, key: &KeyHash, now_ms: u64) -> MutexGuard<'_, Shard> {
        let mut shard = lock(&self.shards[self.shard_index(key)]);
        shard.sweep(self.epoch, now_ms);
        shard
    }

    fn token(&self) -> FencingToken {
        FencingToken(self.next_token.fetch_add(1, Ordering::Relaxed))
    }

    /// Forgets every expired record now, instead of bit by bit as operations pass.
    pub fn sweep_all(&self) {
        let now_ms = self.clock.now_ms();
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            loop {
                shard.next_sweep_secs = 0;
                shard.sweep(self.epoch, now_ms);
                if shard.next_sweep_secs > self.epoch.secs_floor(now_ms) {
                    break;
                }
            }
        }
    }

    /// Records held, live or awaiting the sweep.
    pub fn held_records(&self) -> usize {
        self.shards.iter().map(|s| lock(s).slots.len()).sum()
    }

    fn admit_locked(
        &self,
        guards: &mut [(usize, MutexGuard<'_, Shard>)],
        event: Event,
        keys: &[KeyHash],
        retention_ms: u64,
        now_ms: u64,
    ) -> Result<Admission, StoreError> {
        let shard_of = |guards: &[(usize, MutexGuard<'_, Shard>)], key: &KeyHash| {
            let index = self.shard_index(key);
            guards.iter().position(|(i, _)| *i == index).unwrap_or(0)
        };
        for (key_index, key) in keys.iter().enumerate() {
            let shard = &guards[shard_of(guards, key)].1;
            if transition::is_seen(shard.load(Compact::of(key), self.epoch).as_ref(), now_ms) {
                return Ok(Admission::Duplicate { key_index });
            }
        }
        let record = transition::admitted(now_ms, retention_ms);
        let now_secs = self.epoch.secs_floor(now_ms);
        for key in keys {
            let shard = &mut guards[shard_of(guards, key)].1;
            let compact = Compact::of(key);
            if !shard.slots.contains_key(&compact) {
                let evicted = shard
                    .make_room(self.per_shard_limit, self.epoch, now_ms)
                    .map_err(|()| StoreError::Full {
                        limit: (self.per_shard_limit * self.shards.len()) as u64,
                    })?;
                self.evicted_early.fetch_add(evicted, Ordering::Relaxed);
            }
            shard.write(compact, record.clone(), self.epoch, now_secs);
        }
        // Queued while the shard locks are held: no one sees the key seen before the event
        // is in the queue.
        let order_hash = event.order_hash();
        let partition = oncegate_core::event::partition_of(order_hash, self.partitions());
        let mut queue = lock(&self.partitions[usize::from(partition)]);
        let seq = queue.head_seq + queue.entries.len() as u64;
        queue.entries.push_back(Some(Queued {
            key: keys[0],
            event,
            attempt: 0,
        }));
        queue.order.push(seq, order_hash, 0);
        Ok(Admission::Admitted {
            id: QueueId { partition, seq },
        })
    }

    fn with_record<T>(
        &self,
        key: &KeyHash,
        step: impl FnOnce(Option<&Record>, u64) -> (T, Option<Record>),
    ) -> T {
        let now_ms = self.clock.now_ms();
        let mut shard = self.shard(key, now_ms);
        let compact = Compact::of(key);
        let record = shard.load(compact, self.epoch);
        let (answer, next) = step(record.as_ref(), now_ms);
        if let Some(next) = next {
            shard.write(compact, next, self.epoch, self.epoch.secs_floor(now_ms));
        }
        answer
    }
}

impl<C: Clock> DedupStore for MemoryStore<C> {
    async fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> Result<Admission, StoreError> {
        if keys.is_empty() {
            return Err(StoreError::Invalid(
                "admit needs at least one dedup key".into(),
            ));
        }
        let now_ms = self.clock.now_ms();
        let retention_ms = millis(retention);
        if keys.len() == 1 {
            let index = self.shard_index(&keys[0]);
            let mut guards = [(index, self.shard(&keys[0], now_ms))];
            return self.admit_locked(&mut guards, event, keys, retention_ms, now_ms);
        }
        // Several keys: lock their shards in ascending order so that two admits never deadlock.
        let mut indices: Vec<usize> = keys.iter().map(|key| self.shard_index(key)).collect();
        indices.sort_unstable();
        indices.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = indices
            .into_iter()
            .map(|index| {
                let mut shard = lock(&self.shards[index]);
                shard.sweep(self.epoch, now_ms);
                (index, shard)
            })
            .collect();
        self.admit_locked(&mut guards, event, keys, retention_ms, now_ms)
    }

    async fn claim(&self, key: &KeyHash, lease: Duration) -> Result<Claim, StoreError> {
        let lease_ms = millis(lease);
        Ok(self.with_record(key, |record, now_ms| {
            transition::claim(record, *key, now_ms, lease_ms, self.token())
        }))
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<FenceCheck, StoreError> {
        Ok(self.with_record(&lease.key, |record, now_ms| {
            transition::renew(record, lease, now_ms, millis(extend))
        }))
    }

    async fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        Ok(self.with_record(&lease.key, |record, now_ms| {
            transition::complete(record, lease, now_ms, millis(retention), outcome)
        }))
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        Ok(self.with_record(&lease.key, |record, now_ms| {
            transition::release(record, lease, now_ms)
        }))
    }

    async fn record(&self, key: &KeyHash) -> Result<Option<Record>, StoreError> {
        let now_ms = self.clock.now_ms();
        let shard = self.shard(key, now_ms);
        Ok(shard
            .load(Compact::of(key), self.epoch)
            .filter(|record| record.is_live(now_ms)))
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let now_ms = self.clock.now_ms();
        let mut stats = StoreStats {
            evicted_early: self.evicted_early.load(Ordering::Relaxed),
            ..StoreStats::default()
        };
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for key in shard.slots.keys() {
                match shard.load(*key, self.epoch) {
                    Some(record) if record.is_live(now_ms) => match record.state {
                        RecordState::Pending => stats.pending += 1,
                        RecordState::Processing { .. } => stats.processing += 1,
                        RecordState::Completed { .. } => stats.completed += 1,
                    },
                    _ => {}
                }
            }
        }
        for partition in self.partitions.iter() {
            let partition = lock(partition);
            stats.queued += partition.order.len() as u64;
            stats.in_flight += partition.order.in_flight() as u64;
        }
        stats.dead_letters = lock(&self.dead_letters).len() as u64;
        Ok(stats)
    }
}

impl<C: Clock> EventQueue for MemoryStore<C> {
    fn partitions(&self) -> u16 {
        self.partitions.len() as u16
    }

    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        let queue = self
            .partitions
            .get(usize::from(partition))
            .ok_or_else(|| StoreError::Invalid(format!("no partition {partition}")))?;
        let now_ms = self.clock.now_ms();
        let mut queue = lock(queue);
        let ready = queue.order.take_ready(now_ms, max);
        let mut out = Vec::with_capacity(ready.len());
        for seq in ready {
            if let Some(entry) = queue.get_mut(seq) {
                out.push(Delivery {
                    id: QueueId { partition, seq },
                    key: entry.key,
                    event: entry.event.clone(),
                    attempt: entry.attempt,
                });
            }
        }
        Ok(out)
    }

    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        let Some(queue) = self.partitions.get(usize::from(id.partition)) else {
            return Ok(false);
        };
        Ok(lock(queue).take_in_flight(id.seq).is_some())
    }

    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        let Some(queue) = self.partitions.get(usize::from(id.partition)) else {
            return Ok(false);
        };
        let mut queue = lock(queue);
        if !queue.order.retry(id.seq, not_before_ms) {
            return Ok(false);
        }
        if let Some(entry) = queue.get_mut(id.seq) {
            entry.attempt += 1;
        }
        Ok(true)
    }

    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        let Some(queue) = self.partitions.get(usize::from(id.partition)) else {
            return Ok(false);
        };
        let Some(entry) = lock(queue).take_in_flight(id.seq) else {
            return Ok(false);
        };
        lock(&self.dead_letters).push_back(DeadLetter {
            id,
            key: entry.key,
            event: entry.event,
            attempts: entry.attempt + 1,
            reason: reason.to_owned(),
            at_ms: self.clock.now_ms(),
        });
        Ok(true)
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(lock(&self.dead_letters)
            .iter()
            .take(limit)
            .cloned()
            .collect())
    }
}

impl<C: Clock> WatermarkStore for MemoryStore<C> {
    async fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> Result<WatermarkOutcome, StoreError> {
        let now_ms = self.clock.now_ms();
        let mut shard = self.shard(scope, now_ms);
        let compact = Compact::of(scope);
        let current = shard
            .watermarks
            .get(&compact)
            .filter(|(_, secs)| self.epoch.ms(*secs) > now_ms)
            .map(|(mark, _)| *mark);
        let (outcome, next) = transition::watermark(current, value);
        if let Some(mark) = next {
            let retention_ms = millis(retention);
            let needed = self.epoch.secs_ceil(now_ms.saturating_add(retention_ms));
            let kept = shard.watermarks.get(&compact).map_or(0, |(_, secs)| *secs);
            // A busy chat advances its mark on every event: extend the deadline with 1/8 of
            // slack so that the expiry index gets one entry per eighth of the retention, not one
            // per event.
            let deadline = if kept >= needed {
                kept
            } else {
                let slack = retention_ms / 8;
                let deadline = self
                    .epoch
                    .secs_ceil(now_ms.saturating_add(retention_ms).saturating_add(slack));
                shard
                    .expiry
                    .push(compact, self.epoch.secs_floor(now_ms), deadline);
                deadline
            };
            shard.watermarks.insert(compact, (mark, deadline));
        }
        Ok(outcome)
    }
}
