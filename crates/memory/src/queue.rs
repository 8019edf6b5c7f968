//! The queue: partitions of queued events with their per-chat hand-out order.

use super::*;

#[derive(Debug)]
pub(super) struct Queued {
    pub(super) key: KeyHash,
    pub(super) event: Event,
    pub(super) attempt: u32,
}

#[derive(Debug, Default)]
pub(super) struct Partition {
    pub(super) head_seq: u64,
    pub(super) entries: VecDeque<Option<Queued>>,
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
    fn push(&mut self, letter: DeadLetter) {
        self.by_id.insert(letter.id, self.next);
        self.by_order.insert(self.next, letter);
        self.next += 1;
    }

    fn take(&mut self, id: QueueId) -> Option<DeadLetter> {
        let order = self.by_id.remove(&id)?;
        self.by_order.remove(&order)
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Appends `event` to `partition`'s queue.
    pub(super) fn enqueue(
        &self,
        partition: u16,
        key: KeyHash,
        event: Event,
        order_hash: u64,
    ) -> Option<QueueId> {
        let mut queue = lock(self.partitions.get(usize::from(partition))?);
        let seq = queue.head_seq + queue.entries.len() as u64;
        let bytes = event.payload.len();
        queue.entries.push_back(Some(Queued {
            key,
            event,
            attempt: 0,
        }));
        queue.order.push(seq, order_hash, 0, bytes);
        Some(QueueId { partition, seq })
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
        lock(&self.dead_letters).push(DeadLetter {
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
            .by_order
            .values()
            .take(limit)
            .cloned()
            .collect())
    }

    async fn replay_dead_letter(&self, id: QueueId) -> Result<Option<QueueId>, StoreError> {
        let Some(letter) = lock(&self.dead_letters).take(id) else {
            return Ok(None);
        };
        let order_hash = letter.event.order_hash();
        Ok(self.enqueue(letter.id.partition, letter.key, letter.event, order_hash))
    }

    async fn purge_dead_letter(&self, id: QueueId) -> Result<bool, StoreError> {
        Ok(lock(&self.dead_letters).take(id).is_some())
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
        let from = after.map_or(queue.head_seq, |after| {
            after.saturating_add(1).max(queue.head_seq)
        });
        let skip = usize::try_from(from - queue.head_seq).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for (offset, entry) in queue.entries.iter().enumerate().skip(skip) {
            if out.len() >= limit {
                break;
            }
            let Some(entry) = entry else { continue };
            let seq = queue.head_seq + offset as u64;
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

impl<C: Clock> MemoryStore<C> {
    fn partition(&self, partition: u16) -> Result<&Mutex<Partition>, StoreError> {
        require_partition(partition, self.partitions.len() as u16)?;
        self.partitions
            .get(usize::from(partition))
            .ok_or_else(|| StoreError::Invalid(format!("no partition {partition}")))
    }
}
