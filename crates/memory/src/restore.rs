//! Rebuilding a store from the changes its journal kept, and writing out its state as changes
//! (a snapshot) for a journal to restart from.

use std::collections::BTreeMap;

use super::queue::Queued;
use super::*;

/// A queue entry while the journal is replayed.
struct Entry {
    key: KeyHash,
    order_hash: u64,
    attempt: u32,
    not_before_ms: u64,
    event: Event,
}

/// A store being rebuilt: records go straight into its tables, queue entries and dead letters
/// are gathered (a replay may name them in any order of seqs) and placed by [`Restore::finish`].
pub struct Restore<C: Clock, J: Journal> {
    store: MemoryStore<C, J>,
    run: u64,
    now_ms: u64,
    queues: Vec<BTreeMap<u64, Entry>>,
    next: Vec<u64>,
    dead: BTreeMap<QueueId, DeadLetter>,
}

impl<C: Clock, J: Journal> Restore<C, J> {
    /// Rebuilds into `store`, which must be empty; leases granted before run `run` are over.
    pub fn new(store: MemoryStore<C, J>, run: u64) -> Self {
        let partitions = store.partitions.len();
        let now_ms = store.clock.now_ms();
        Self {
            store,
            run,
            now_ms,
            queues: (0..partitions).map(|_| BTreeMap::new()).collect(),
            next: vec![0; partitions],
            dead: BTreeMap::new(),
        }
    }

    /// Applies one change, in journal order.
    pub fn apply(&mut self, change: Change<'_>) -> Result<(), StoreError> {
        match change {
            Change::Record { key, record } => self.put(&key, record.into_owned()),
            Change::Admit {
                keys,
                record,
                id,
                primary,
                order_hash,
                event,
            } => {
                for key in keys.iter() {
                    self.put(key, record.as_ref().clone());
                }
                self.queue(id, primary, order_hash, 0, 0, event.into_owned())?;
            }
            Change::Queued {
                id,
                key,
                order_hash,
                attempt,
                not_before_ms,
                event,
            } => self.queue(
                id,
                key,
                order_hash,
                attempt,
                not_before_ms,
                event.into_owned(),
            )?,
            Change::Ack { id } => {
                self.entries(id)?.remove(&id.seq);
            }
            Change::Retry {
                id,
                attempt,
                not_before_ms,
            } => {
                if let Some(entry) = self.entries(id)?.get_mut(&id.seq) {
                    entry.attempt = attempt;
                    entry.not_before_ms = not_before_ms;
                }
            }
            Change::Dead { letter } => {
                let letter = letter.into_owned();
                self.entries(letter.id)?.remove(&letter.id.seq);
                self.dead.insert(letter.id, letter);
            }
            Change::Revived {
                from,
                to,
                key,
                order_hash,
                event,
            } => {
                self.dead.remove(&from);
                self.queue(to, key, order_hash, 0, 0, event.into_owned())?;
            }
            Change::Purged { id } => {
                self.dead.remove(&id);
            }
            Change::Mark {
                scope,
                value,
                deadline_ms,
            } => self.mark(&scope, value, deadline_ms),
            Change::State {
                namespace,
                name,
                value,
                version,
                expires_at_ms,
            } => lock(&self.store.states).apply(&namespace, &name, value, version, expires_at_ms),
            Change::NextSeq { partition, next } => {
                let slot = self.next.get_mut(usize::from(partition)).ok_or_else(|| {
                    StoreError::Corrupt(format!("the journal names partition {partition}"))
                })?;
                *slot = (*slot).max(next);
            }
        }
        Ok(())
    }

    /// The rebuilt store: every queue entry waiting (nothing is handed out after a restart).
    pub fn finish(self) -> MemoryStore<C, J> {
        let Self {
            store,
            queues,
            next,
            dead,
            ..
        } = self;
        for ((entries, next), slot) in queues.into_iter().zip(next).zip(store.partitions.iter()) {
            let mut partition = lock(slot);
            partition.next_seq = next;
            for (seq, entry) in entries {
                partition.order.push_in(
                    seq,
                    entry.order_hash,
                    entry.event.group_hash(),
                    entry.not_before_ms,
                    entry.event.payload.len(),
                );
                partition.place(
                    seq,
                    Queued {
                        key: entry.key,
                        event: entry.event,
                        attempt: entry.attempt,
                    },
                );
            }
        }
        let mut letters: Vec<DeadLetter> = dead.into_values().collect();
        letters.sort_by_key(|letter| (letter.at_ms, letter.id));
        let mut dead_letters = lock(&store.dead_letters);
        for letter in letters {
            dead_letters.push(letter);
        }
        drop(dead_letters);
        store
    }

    fn entries(&mut self, id: QueueId) -> Result<&mut BTreeMap<u64, Entry>, StoreError> {
        self.queues
            .get_mut(usize::from(id.partition))
            .ok_or_else(|| {
                StoreError::Corrupt(format!("the journal names partition {}", id.partition))
            })
    }

    fn queue(
        &mut self,
        id: QueueId,
        key: KeyHash,
        order_hash: u64,
        attempt: u32,
        not_before_ms: u64,
        event: Event,
    ) -> Result<(), StoreError> {
        self.entries(id)?.insert(
            id.seq,
            Entry {
                key,
                order_hash,
                attempt,
                not_before_ms,
                event,
            },
        );
        if let Some(next) = self.next.get_mut(usize::from(id.partition)) {
            *next = (*next).max(id.seq.saturating_add(1));
        }
        Ok(())
    }

    fn put(&mut self, key: &KeyHash, mut record: Record) {
        let tables = &self.store.tables;
        if let RecordState::Processing {
            token,
            lease_until_ms,
        } = &mut record.state
            && token.run() < self.run
        {
            // Its holder was a process that is gone: the lease is over now, not when it said.
            *lease_until_ms = 0;
        }
        let mut shard = tables.shard(key, self.now_ms);
        let compact = Compact::of(key);
        if !record.is_live(self.now_ms) {
            shard.remove(compact, tables.epoch, self.now_ms);
            return;
        }
        if shard.word(compact).is_none() {
            match shard.make_room(tables.per_shard_limit, tables.epoch, self.now_ms) {
                Ok(evicted) => {
                    tables.evicted_early.fetch_add(evicted, Ordering::Relaxed);
                }
                Err(()) => return,
            }
        }
        let now_secs = tables.epoch.secs_floor(self.now_ms);
        shard.write(compact, record, tables.epoch, now_secs);
    }

    fn mark(&mut self, scope: &KeyHash, value: u64, deadline_ms: u64) {
        let tables = &self.store.tables;
        if deadline_ms <= self.now_ms {
            return;
        }
        let epoch = tables.epoch;
        let mut shard = tables.shard(scope, self.now_ms);
        let compact = Compact::of(scope);
        let mark = Mark {
            scope: compact,
            value,
            deadline_secs: epoch.secs_ceil(deadline_ms),
        };
        shard.expiry.push(
            compact.tag(),
            epoch.secs_floor(self.now_ms),
            mark.deadline_secs,
        );
        shard.put_mark(mark);
    }
}

impl<C: Clock, J: Journal> Tables<C, J> {
    /// Hands every piece of live state to `emit` as a change, one lock at a time: the store
    /// keeps running, and a journal replayed from where the snapshot began over these changes
    /// ends in the store's state (every change sets its subject outright).
    pub fn snapshot(&self, emit: &mut dyn FnMut(&Change<'_>)) {
        let now_ms = self.clock.now_ms();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for slot in shard.slots.iter() {
                if let Some(record) = shard.load(slot.key, self.epoch)
                    && record.is_live(now_ms)
                {
                    emit(&Change::Record {
                        key: slot.key.key(),
                        record: Cow::Owned(record),
                    });
                }
            }
            for mark in shard.watermarks.iter() {
                let deadline_ms = self.epoch.ms(mark.deadline_secs);
                if deadline_ms > now_ms {
                    emit(&Change::Mark {
                        scope: mark.scope.key(),
                        value: mark.value,
                        deadline_ms,
                    });
                }
            }
        }
        for (index, queue) in self.partitions.iter().enumerate() {
            let partition = index as u16;
            let queue = lock(queue);
            for (seq, entry) in queue.entries_from(0) {
                let order_hash = entry.event.order_hash();
                let not_before_ms = match queue.order.state(seq, order_hash, now_ms) {
                    Some(QueuedState::Delayed { until_ms }) => until_ms,
                    _ => 0,
                };
                emit(&Change::Queued {
                    id: QueueId { partition, seq },
                    key: entry.key,
                    order_hash,
                    attempt: entry.attempt,
                    not_before_ms,
                    event: Cow::Borrowed(&entry.event),
                });
            }
            emit(&Change::NextSeq {
                partition,
                next: queue.next_seq,
            });
        }
        let dead = lock(&self.dead_letters);
        for letter in dead.by_order.values() {
            emit(&Change::Dead {
                letter: Cow::Borrowed(letter),
            });
        }
        drop(dead);
        lock(&self.states).snapshot(now_ms, emit);
    }
}
