//! The in-process backend: for tests, throwaway runs and as the reference implementation.
//!
//! Records live in shards, each behind its own lock. A record costs a 20-byte slot in its
//! shard's table (the 128-bit key and a 32-bit word holding the state and the expiry second),
//! which grows by a quarter and stays 68–85 % full, plus about 4 bytes in the expiry index;
//! leases, stored outcomes and fingerprints live in side tables that hold only keys in those
//! states. Expiry pops whole chunks of the index whose deadlines have passed, so
//! its cost is proportional to what expires. A size bound evicts the record due soonest, never
//! one under a live lease, and counts every eviction.

mod chunked;
mod expiry;
pub mod journal;
mod marks;
mod queue;
mod restore;
mod shard;
mod state;
mod table;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use hashbrown::HashTable;
use oncegate_core::live_counts::{Counted, LiveCounts};
use oncegate_core::passthrough::BuildPassThrough;
use oncegate_core::queue_index::PartitionIndex;
use oncegate_core::store::{millis, require_partition};
use oncegate_core::{
    Admission, Claim, Clock, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck,
    FencingToken, Fingerprint, KeyHash, Lease, QueueId, QueueSummary, QueuedEvent, QueuedState,
    Record, RecordState, StoreError, StoreStats, SystemClock, WatermarkOutcome, WatermarkStore,
    transition,
};

use std::borrow::Cow;

use expiry::ExpiryIndex;
pub use journal::{Change, Journal, NoJournal};
use queue::Partition;
pub use restore::Restore;
use shard::*;

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

/// The in-process store; with a [`Journal`] other than [`NoJournal`], a durable one.
#[derive(Debug)]
pub struct MemoryStore<C: Clock = SystemClock, J: Journal = NoJournal> {
    tables: Arc<Tables<C, J>>,
}

/// The store's state, shared with whoever snapshots it.
#[derive(Debug)]
pub struct Tables<C: Clock, J: Journal> {
    journal: J,
    clock: C,
    epoch: Epoch,
    shards: Box<[Mutex<Shard>]>,
    per_shard_limit: usize,
    partitions: Box<[Mutex<Partition>]>,
    dead_letters: Mutex<queue::DeadLetters>,
    next_token: AtomicU64,
    evicted_early: AtomicU64,
    rates: oncegate_core::rates::LocalRates,
    states: Mutex<state::States>,
    /// Which events go before the rest of their group's backlog.
    first: oncegate_core::FirstRule,
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
        // Runs are seconds since the epoch: a later store never repeats an earlier one's tokens.
        let run = clock.now_ms() / 1000;
        Self::with_journal(config, clock, NoJournal, run)
    }
}

impl<C: Clock, J: Journal> std::ops::Deref for MemoryStore<C, J> {
    type Target = Tables<C, J>;

    fn deref(&self) -> &Tables<C, J> {
        &self.tables
    }
}

impl<C: Clock, J: Journal> MemoryStore<C, J> {
    /// A store whose changes go to `journal`, granting tokens of run `run` (which must be above
    /// every run an earlier store on the same journal had).
    pub fn with_journal(config: MemoryConfig, clock: C, journal: J, run: u64) -> Self {
        Self {
            tables: Arc::new(Tables::new(config, clock, journal, run)),
        }
    }

    /// A handle on the state that does not keep the store alive: for a snapshot thread.
    pub fn downgrade(&self) -> std::sync::Weak<Tables<C, J>> {
        Arc::downgrade(&self.tables)
    }
}

impl<C: Clock, J: Journal> Tables<C, J> {
    fn new(config: MemoryConfig, clock: C, journal: J, run: u64) -> Self {
        let shards = config.shards.max(1);
        let now_ms = clock.now_ms();
        Self {
            journal,
            epoch: Epoch(now_ms),
            shards: (0..shards).map(|_| Mutex::new(Shard::new())).collect(),
            per_shard_limit: usize::try_from(config.max_records.div_ceil(shards as u64))
                .unwrap_or(usize::MAX)
                .max(1),
            partitions: (0..config.partitions.max(1))
                .map(|_| Mutex::new(Partition::default()))
                .collect(),
            dead_letters: Mutex::default(),
            next_token: AtomicU64::new(FencingToken::compose(run, 1).0),
            evicted_early: AtomicU64::new(0),
            clock,
            rates: oncegate_core::rates::LocalRates::default(),
            states: Mutex::default(),
            first: oncegate_core::FirstRule::default(),
        }
    }

    /// The journal the store writes to.
    pub fn journal(&self) -> &J {
        &self.journal
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

    /// Every record read, counted by state when its life (its retention, a held one's lease
    /// if later, to the second the store keeps) goes on after `after_ms`: O(records), an
    /// operator's census of a store (`oncegate inspect`) and the check of [`stats`]'s counts;
    /// no poll path calls it.
    ///
    /// [`stats`]: DedupStore::stats
    pub fn census(&self, after_ms: u64) -> StoreStats {
        let mut stats = self.queue_stats();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for slot in shard.slots.iter() {
                let end = self
                    .epoch
                    .ms(shard.forget_secs(slot.key, slot.word, self.epoch));
                if end <= after_ms {
                    continue;
                }
                match slot.word >> STATE_SHIFT {
                    PENDING => stats.pending += 1,
                    PROCESSING => stats.processing += 1,
                    _ => stats.completed += 1,
                }
            }
        }
        stats
    }

    /// What `stats` and `census` share: the queues, dead letters and early evictions.
    fn queue_stats(&self) -> StoreStats {
        let mut stats = StoreStats {
            evicted_early: self.evicted_early.load(Ordering::Relaxed),
            ..StoreStats::default()
        };
        for partition in self.partitions.iter() {
            let partition = lock(partition);
            stats.queued += partition.order.len() as u64;
            stats.in_flight += partition.order.in_flight() as u64;
        }
        stats.dead_letters = lock(&self.dead_letters).by_order.len() as u64;
        stats
    }

    /// Records held, live or awaiting the sweep.
    pub fn held_records(&self) -> usize {
        self.shards.iter().map(|s| lock(s).slots.len()).sum()
    }

    /// `keys` are the records' identities in the event's partition (`KeyHash::in_partition`);
    /// `primary` is the first key as the caller gave it, handed out with the event.
    fn admit_locked(
        &self,
        guards: &mut [(usize, MutexGuard<'_, Shard>)],
        event: Event,
        placed: Placed,
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
            let compact = Compact::of(key);
            // Most keys are new: one probe that misses, and no record is built.
            if shard.word(compact).is_some()
                && transition::is_seen(shard.load(compact, self.epoch).as_ref(), now_ms)
            {
                return Ok(Admission::Duplicate { key_index });
            }
        }
        let Placed {
            primary,
            order_hash,
            partition,
            first,
        } = placed;
        let queue = self.partition(partition)?;
        let full = || StoreError::Full {
            limit: (self.per_shard_limit * self.shards.len()) as u64,
        };
        // Room for every new key first, so that a full store refuses before it changes anything
        // (one key: the room is made where it is inserted, before anything else is written).
        if keys.len() > 1 {
            for key in keys {
                let shard = &mut guards[shard_of(guards, key)].1;
                if shard.word(Compact::of(key)).is_none() {
                    let evicted = shard
                        .make_room(self.per_shard_limit, self.epoch, now_ms)
                        .map_err(|()| full())?;
                    self.evicted_early.fetch_add(evicted, Ordering::Relaxed);
                }
            }
        }
        let record = transition::admitted(now_ms, retention_ms);
        let now_secs = self.epoch.secs_floor(now_ms);
        let expires_secs = self.epoch.secs_ceil(record.expires_at_ms);
        for key in keys {
            let shard = &mut guards[shard_of(guards, key)].1;
            let compact = Compact::of(key);
            if shard.word(compact).is_some() {
                // A forgotten-but-not-swept record: rewrite it in place.
                shard.write(compact, record.clone(), self.epoch, now_secs);
                continue;
            }
            if keys.len() == 1 {
                let evicted = shard
                    .make_room(self.per_shard_limit, self.epoch, now_ms)
                    .map_err(|()| full())?;
                self.evicted_early.fetch_add(evicted, Ordering::Relaxed);
            }
            shard.insert_new(compact, expires_secs, now_secs, self.epoch);
        }
        // Queued (and journaled) while the shard locks are held: no one sees the key seen
        // before the event is in the queue.
        let id = Partition::enqueue(
            queue,
            (partition, first),
            primary,
            event,
            order_hash,
            |id, event| {
                self.journal.append(&Change::Admit {
                    keys: Cow::Borrowed(keys),
                    record: Cow::Borrowed(&record),
                    id,
                    primary,
                    order_hash,
                    event: Cow::Borrowed(event),
                });
            },
        );
        Ok(Admission::Admitted { id })
    }

    /// `answer`, once the journal holds everything it may have seen.
    async fn synced<T>(&self, answer: Result<T, StoreError>) -> Result<T, StoreError> {
        let answer = answer?;
        self.journal.sync().await?;
        Ok(answer)
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
            self.journal.append(&Change::Record {
                key: *key,
                record: Cow::Borrowed(&next),
            });
            shard.write(compact, next, self.epoch, self.epoch.secs_floor(now_ms));
        }
        answer
    }

    /// `complete`'s change, journaled but not waited for: `complete` waits once, after it;
    /// `complete_and_ack` does not wait.
    fn complete_unsynced(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> FenceCheck {
        self.with_record(&lease.record_id(), |record, now_ms| {
            transition::complete(record, lease, now_ms, millis(retention), outcome)
        })
    }
}

/// Where an admitted event goes.
struct Placed {
    primary: KeyHash,
    order_hash: u64,
    partition: u16,
    /// It goes before its group's other waiting events (the store's [`FirstRule`]).
    first: bool,
}

impl<C: Clock, J: Journal> DedupStore for MemoryStore<C, J> {
    async fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> Result<Admission, StoreError> {
        oncegate_core::store::require_keys(keys)?;
        self.journal.check()?;
        let now_ms = self.clock.now_ms();
        let retention_ms = millis(retention);
        let order_hash = event.order_hash();
        let partition = oncegate_core::event::partition_of(order_hash, self.partitions());
        let placed = Placed {
            primary: keys[0],
            order_hash,
            partition,
            first: self.first.first(&event),
        };
        if let [only] = keys {
            let key = only.in_partition(partition);
            let index = self.shard_index(&key);
            let admission = {
                let mut guards = [(index, self.shard(&key, now_ms))];
                self.admit_locked(&mut guards, event, placed, &[key], retention_ms, now_ms)
            };
            return self.synced(admission).await;
        }
        let keys: Vec<KeyHash> = keys.iter().map(|k| k.in_partition(partition)).collect();
        // Several keys: lock their shards in ascending order so that two admits never deadlock.
        let mut indices: Vec<usize> = keys.iter().map(|key| self.shard_index(key)).collect();
        indices.sort_unstable();
        indices.dedup();
        let admission = {
            let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = indices
                .into_iter()
                .map(|index| {
                    let mut shard = lock(&self.shards[index]);
                    shard.sweep(self.epoch, now_ms);
                    (index, shard)
                })
                .collect();
            self.admit_locked(&mut guards, event, placed, &keys, retention_ms, now_ms)
        };
        self.synced(admission).await
    }

    async fn claim_with_fingerprint(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> Result<Claim, StoreError> {
        oncegate_core::store::require_partition(partition, self.partitions())?;
        self.journal.check()?;
        let lease_ms = millis(lease);
        let claim = self.with_record(&key.in_partition(partition), |record, now_ms| {
            transition::claim(
                record,
                *key,
                partition,
                now_ms,
                lease_ms,
                fingerprint,
                || self.token(),
            )
        });
        match claim {
            // A lease granted (or refused for a live one) needs no wait: a crash ends every
            // lease, since the run after it fences all earlier tokens.
            Claim::Acquired(_) | Claim::TookOver(_) | Claim::InFlight { .. } => Ok(claim),
            // The others report a key's done or claimed state, which must outlive a crash.
            Claim::Done { .. } | Claim::Conflict => self.synced(Ok(claim)).await,
        }
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<FenceCheck, StoreError> {
        self.journal.check()?;
        // Extends a lease, which a crash ends anyway: no wait.
        Ok(self.with_record(&lease.record_id(), |record, now_ms| {
            transition::renew(record, lease, now_ms, millis(extend))
        }))
    }

    async fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        self.journal.check()?;
        let fence = self.complete_unsynced(lease, retention, outcome);
        self.synced(Ok(fence)).await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.journal.check()?;
        // Ends a lease early, which a crash does too: no wait.
        Ok(self.with_record(&lease.record_id(), |record, now_ms| {
            transition::release(record, lease, now_ms)
        }))
    }

    async fn complete_and_ack(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
        id: QueueId,
    ) -> Result<FenceCheck, StoreError> {
        self.journal.check()?;
        // Journaled, not waited for: the dispatcher's next step needs no sync. The journal
        // keeps order, so nothing changed after this is durable without it; a crash before the
        // next sync runs the handler once more, as for one running at the crash.
        let fence = self.complete_unsynced(lease, retention, outcome);
        self.take_handed_out(id);
        Ok(fence)
    }

    async fn record(&self, key: &KeyHash, partition: u16) -> Result<Option<Record>, StoreError> {
        oncegate_core::store::require_partition(partition, self.partitions())?;
        let now_ms = self.clock.now_ms();
        let key = key.in_partition(partition);
        let record = self
            .shard(&key, now_ms)
            .load(Compact::of(&key), self.epoch)
            .filter(|record| record.is_live(now_ms));
        self.synced(Ok(record)).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        // Memory answers whenever it is asked; what can fail is the journal.
        self.journal.check()
    }

    fn durability(&self) -> oncegate_core::Durability {
        self.journal.durability()
    }

    fn broken(&self) -> Option<String> {
        // A journal that failed does not write again (what it held in memory may be ahead of
        // the file): only a restart, which replays the file, goes on.
        self.journal.check().err().map(|error| error.to_string())
    }

    async fn queued(&self) -> Result<u64, StoreError> {
        Ok(self
            .partitions
            .iter()
            .map(|partition| lock(partition).order.len() as u64)
            .sum())
    }

    /// Records from the counts the shards keep as records change (`LiveCounts`): O(shards),
    /// whatever the store holds.
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let now_ms = self.clock.now_ms();
        let mut stats = self.queue_stats();
        for shard in self.shards.iter() {
            let [pending, processing, completed] = lock(shard).counts.read(now_ms);
            stats.pending += pending;
            stats.processing += processing;
            stats.completed += completed;
        }
        Ok(stats)
    }
}
