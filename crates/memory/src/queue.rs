//! The queue: partitions of queued events with their per-chat hand-out order.

use super::*;
use crate::chunked::ChunkedDeque;
use oncegate_core::{GroupLoad, Loads, Unranked};

#[derive(Debug)]
pub(super) struct Queued {
    pub(super) key: KeyHash,
    pub(super) event: Event,
    pub(super) attempt: u32,
}

/// A partition's queue: a ring from the oldest entry still queued (`head_seq`), acked entries
/// leaving holes until the head passes them.
#[derive(Debug, Default)]
pub(super) struct Partition {
    pub(super) head_seq: u64,
    pub(super) next_seq: u64,
    pub(super) entries: ChunkedDeque<Option<Queued>>,
    pub(super) order: PartitionIndex,
}

impl Partition {
    pub(super) fn get(&self, seq: u64) -> Option<&Queued> {
        let index = usize::try_from(seq.checked_sub(self.head_seq)?).ok()?;
        self.entries.get(index)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, seq: u64) -> Option<&mut Queued> {
        let index = usize::try_from(seq.checked_sub(self.head_seq)?).ok()?;
        self.entries.get_mut(index)?.as_mut()
    }

    /// Places `entry` at `seq`, which must be above every seq placed before.
    pub(super) fn place(&mut self, seq: u64, entry: Queued) {
        if self.entries.is_empty() {
            self.head_seq = seq;
        }
        while self.head_seq + (self.entries.len() as u64) < seq {
            self.entries.push_back(None);
        }
        self.entries.push_back(Some(entry));
        self.next_seq = self.next_seq.max(seq.saturating_add(1));
    }

    /// The queued entries from `from` on, in seq order.
    pub(super) fn entries_from(&self, from: u64) -> impl Iterator<Item = (u64, &Queued)> {
        let skip = usize::try_from(from.saturating_sub(self.head_seq)).unwrap_or(usize::MAX);
        let first = self.head_seq.saturating_add(skip as u64);
        self.entries
            .iter_from(skip)
            .enumerate()
            .filter_map(move |(offset, entry)| Some((first + offset as u64, entry.as_ref()?)))
    }

    /// Takes a handed-out entry out of the queue.
    pub(super) fn take_in_flight(&mut self, seq: u64) -> Option<Queued> {
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

/// Dead letters in the order they died, findable by their queue id.
#[derive(Debug, Default)]
pub(super) struct DeadLetters {
    next: u64,
    pub(super) by_order: std::collections::BTreeMap<u64, DeadLetter>,
    by_id: HashMap<QueueId, u64>,
}

impl DeadLetters {
    pub(super) fn push(&mut self, letter: DeadLetter) {
        self.by_id.insert(letter.id, self.next);
        self.by_order.insert(self.next, letter);
        self.next += 1;
    }

    pub(super) fn take(&mut self, id: QueueId) -> Option<DeadLetter> {
        let order = self.by_id.remove(&id)?;
        self.by_order.remove(&order)
    }
}

impl Partition {
    /// Appends `event` to the queue of `partition` (this one, behind `queue`'s lock), before
    /// its group's other waiting events if `first`, and calls `log` with its place while the
    /// lock is held.
    pub(super) fn enqueue(
        queue: &Mutex<Partition>,
        (partition, first): (u16, bool),
        key: KeyHash,
        event: Event,
        order_hash: u64,
        log: impl FnOnce(QueueId, &Event),
    ) -> QueueId {
        let mut queue = lock(queue);
        let seq = queue.next_seq;
        let id = QueueId { partition, seq };
        log(id, &event);
        let bytes = event.payload.len();
        let place = oncegate_core::Place {
            order_hash,
            group: event.group_hash(),
            first,
        };
        queue.place(
            seq,
            Queued {
                key,
                event,
                attempt: 0,
            },
        );
        queue.order.push_at(seq, place, 0, bytes);
        id
    }
}

impl<C: Clock, J: Journal> Tables<C, J> {
    /// Takes handed-out entry `id` out of the queue, journaled: `false` when it was not.
    pub(super) fn take_handed_out(&self, id: QueueId) -> bool {
        let Some(queue) = self.partitions.get(usize::from(id.partition)) else {
            return false;
        };
        let mut queue = lock(queue);
        let taken = queue.take_in_flight(id.seq).is_some();
        if taken {
            self.journal.append(&Change::Ack { id });
        }
        taken
    }
}

impl<C: Clock, J: Journal> MemoryStore<C, J> {
    /// Hands out up to `max` ready events of `partition`, ranked by `load`.
    async fn pull_by(
        &self,
        partition: u16,
        max: usize,
        load: &dyn GroupLoad,
    ) -> Result<Vec<Delivery>, StoreError> {
        let queue = self
            .partitions
            .get(usize::from(partition))
            .ok_or_else(|| StoreError::Invalid(format!("no partition {partition}")))?;
        let now_ms = self.clock.now_ms();
        let out = {
            let mut queue = lock(queue);
            let ready = queue.order.take_ranked(now_ms, max, load);
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
            out
        };
        if out.is_empty() {
            // Nothing handed out, nothing to wait for: an idle partition's pull costs no sync.
            return Ok(out);
        }
        // An event goes out only once its admission is durable.
        self.synced(Ok(out)).await
    }
}

impl<C: Clock, J: Journal> EventQueue for MemoryStore<C, J> {
    fn partitions(&self) -> u16 {
        self.partitions.len() as u16
    }

    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        self.pull_by(partition, max, &Unranked).await
    }

    async fn put_first(
        &self,
        rule: std::sync::Arc<dyn oncegate_core::Precedence>,
    ) -> Result<(), StoreError> {
        self.first.set(rule)?;
        // What was queued before (restored from the journal, or admitted meanwhile).
        for queue in self.partitions.iter() {
            let mut queue = lock(queue);
            let first: Vec<(u64, u64)> = queue
                .entries_from(queue.head_seq)
                .filter(|(_, entry)| self.first.first(&entry.event))
                .map(|(seq, entry)| (seq, entry.event.order_hash()))
                .collect();
            for (seq, order_hash) in first {
                queue.order.mark_first(seq, order_hash);
            }
        }
        Ok(())
    }

    async fn pull_ranked(
        &self,
        partition: u16,
        max: usize,
        load: &Loads,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.pull_by(partition, max, &**load).await
    }

    async fn group_queued(&self, group: u64) -> Result<Option<u64>, StoreError> {
        Ok(Some(
            self.partitions
                .iter()
                .map(|queue| lock(queue).order.group_events(group))
                .sum(),
        ))
    }

    async fn busiest_groups(&self, max: usize) -> Result<Option<Vec<(u64, u64)>>, StoreError> {
        let mut counts = Vec::new();
        for queue in &self.partitions {
            counts.extend(lock(queue).order.group_counts());
        }
        Ok(Some(oncegate_core::store::busiest(counts, max)))
    }

    async fn next_group(
        &self,
        partition: u16,
        load: &Loads,
    ) -> Result<Option<oncegate_core::queue_index::Next>, StoreError> {
        let queue = self
            .partitions
            .get(usize::from(partition))
            .ok_or_else(|| StoreError::Invalid(format!("no partition {partition}")))?;
        let now_ms = self.clock.now_ms();
        Ok(lock(queue).order.next_group(now_ms, &**load))
    }

    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        self.journal.check()?;
        let taken = self.take_handed_out(id);
        self.synced(Ok(taken)).await
    }

    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        self.journal.check()?;
        let Some(queue) = self.partitions.get(usize::from(id.partition)) else {
            return Ok(false);
        };
        let retried = {
            let mut queue = lock(queue);
            let retried = queue.order.retry(id.seq, not_before_ms);
            if retried && let Some(entry) = queue.get_mut(id.seq) {
                entry.attempt += 1;
                let attempt = entry.attempt;
                self.journal.append(&Change::Retry {
                    id,
                    attempt,
                    not_before_ms,
                });
            }
            retried
        };
        self.synced(Ok(retried)).await
    }

    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        self.journal.check()?;
        let Some(queue) = self.partitions.get(usize::from(id.partition)) else {
            return Ok(false);
        };
        let Some(entry) = lock(queue).take_in_flight(id.seq) else {
            return Ok(false);
        };
        let letter = DeadLetter {
            id,
            key: entry.key,
            event: entry.event,
            attempts: entry.attempt + 1,
            reason: reason.to_owned(),
            at_ms: self.clock.now_ms(),
        };
        {
            let mut dead = lock(&self.dead_letters);
            self.journal.append(&Change::Dead {
                letter: Cow::Borrowed(&letter),
            });
            dead.push(letter);
        }
        self.synced(Ok(true)).await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(lock(&self.dead_letters)
            .by_order
            .values()
            .take(limit)
            .cloned()
            .collect())
    }

    async fn dead_letter_count(&self) -> Result<u64, StoreError> {
        Ok(lock(&self.dead_letters).by_order.len() as u64)
    }

    async fn replay_dead_letter(&self, id: QueueId) -> Result<Option<QueueId>, StoreError> {
        self.journal.check()?;
        let queue = self.partition(id.partition)?;
        let Some(letter) = lock(&self.dead_letters).take(id) else {
            return self.synced(Ok(None)).await;
        };
        let order_hash = letter.event.order_hash();
        let letter_key = letter.key;
        let first = self.first.first(&letter.event);
        let to = Partition::enqueue(
            queue,
            (letter.id.partition, first),
            letter.key,
            letter.event,
            order_hash,
            |to, event| {
                self.journal.append(&Change::Revived {
                    from: id,
                    to,
                    key: letter_key,
                    order_hash,
                    event: Cow::Borrowed(event),
                });
            },
        );
        self.synced(Ok(Some(to))).await
    }

    async fn purge_dead_letter(&self, id: QueueId) -> Result<bool, StoreError> {
        self.journal.check()?;
        let purged = {
            let mut dead = lock(&self.dead_letters);
            let purged = dead.take(id).is_some();
            if purged {
                self.journal.append(&Change::Purged { id });
            }
            purged
        };
        self.synced(Ok(purged)).await
    }

    async fn queue_summary(&self, partition: u16) -> Result<QueueSummary, StoreError> {
        let queue = self.partition(partition)?;
        let queue = lock(queue);
        let oldest_created_ms = queue
            .order
            .oldest()
            .and_then(|seq| queue.get(seq))
            .map(|entry| entry.event.created_at_ms);
        Ok(QueueSummary {
            partition,
            events: queue.order.len() as u64,
            handed_out: queue.order.in_flight() as u64,
            bytes: queue.order.bytes(),
            oldest_created_ms,
        })
    }

    async fn queued_events(
        &self,
        partition: u16,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<QueuedEvent>, StoreError> {
        let queue = self.partition(partition)?;
        let now_ms = self.clock.now_ms();
        let queue = lock(queue);
        let from = after.map_or(0, |after| after.saturating_add(1));
        let mut out = Vec::new();
        for (seq, entry) in queue.entries_from(from).take(limit) {
            let state = queue
                .order
                .state(seq, entry.event.order_hash(), now_ms)
                .unwrap_or(QueuedState::Waiting);
            out.push(QueuedEvent {
                id: QueueId { partition, seq },
                key: entry.key,
                event: entry.event.clone(),
                attempt: entry.attempt,
                state,
            });
        }
        Ok(out)
    }
}

impl<C: Clock, J: Journal> Tables<C, J> {
    pub(super) fn partition(&self, partition: u16) -> Result<&Mutex<Partition>, StoreError> {
        require_partition(partition, self.partitions.len() as u16)?;
        self.partitions
            .get(usize::from(partition))
            .ok_or_else(|| StoreError::Invalid(format!("no partition {partition}")))
    }
}
