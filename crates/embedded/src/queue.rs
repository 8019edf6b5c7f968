//! The queue: pull, ack, retry, dead letters; through the writer thread.

use super::*;
use oncegate_core::{GroupLoad, Loads, Unranked};

impl<C: Clock + Clone> EmbeddedStore<C> {
    /// Hands out up to `max` ready events of `partition`, ranked by `load`.
    fn pull_by(
        &self,
        partition: u16,
        max: usize,
        load: &dyn GroupLoad,
    ) -> Result<Vec<Delivery>, StoreError> {
        if partition >= self.shared.partitions {
            return Err(StoreError::Invalid(format!("no partition {partition}")));
        }
        let now_ms = self.clock.now_ms();
        let ready = match self.order(partition) {
            Some(mut order) => order.take_ranked(now_ms, max, load),
            None => Vec::new(),
        };
        if ready.is_empty() {
            return Ok(Vec::new());
        }
        let fetched = self.stored(&ready);
        let stored = match fetched {
            Ok(stored) => stored,
            Err(error) => {
                // Not handed out after all: put them back so that they go out later.
                if let Some(mut order) = self.order(partition) {
                    for seq in &ready {
                        order.retry(*seq, 0);
                    }
                }
                return Err(error);
            }
        };
        let mut out = Vec::with_capacity(stored.len());
        for (seq, bytes) in stored {
            let queued: codec::Queued = decode(&bytes)?;
            out.push(Delivery {
                id: QueueId { partition, seq },
                key: queued.key,
                event: queued.event,
                attempt: queued.attempt,
            });
        }
        Ok(out)
    }
}

impl<C: Clock + Clone> EventQueue for EmbeddedStore<C> {
    fn partitions(&self) -> u16 {
        self.shared.partitions
    }

    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        self.pull_by(partition, max, &Unranked)
    }

    async fn put_first(
        &self,
        rule: std::sync::Arc<dyn oncegate_core::Precedence>,
    ) -> Result<(), StoreError> {
        self.shared.first.set(rule)?;
        // What was queued before: read once from the queue table (admissions meanwhile are
        // marked as they join; marking twice changes nothing).
        let txn = self.shared.db.begin_read().map_err(unavailable)?;
        let queue = txn.open_table(QUEUE).map_err(unavailable)?;
        for entry in queue.iter().map_err(unavailable)? {
            let (position, value) = entry.map_err(unavailable)?;
            let queued: codec::Queued = decode(value.value())?;
            if self.shared.first.first(&queued.event) {
                let partition =
                    oncegate_core::event::partition_of(queued.order_hash, self.shared.partitions);
                if let Some(mut order) = self.order(partition) {
                    order.mark_first(position.value(), queued.order_hash);
                }
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
        self.pull_by(partition, max, &**load)
    }

    async fn group_queued(&self, group: u64) -> Result<Option<u64>, StoreError> {
        Ok(Some(
            (0..self.shared.partitions)
                .filter_map(|partition| {
                    self.order(partition).map(|order| order.group_events(group))
                })
                .sum(),
        ))
    }

    async fn busiest_groups(&self, max: usize) -> Result<Option<Vec<(u64, u64)>>, StoreError> {
        let mut counts = Vec::new();
        for partition in 0..self.shared.partitions {
            if let Some(order) = self.order(partition) {
                counts.extend(order.group_counts());
            }
        }
        Ok(Some(oncegate_core::store::busiest(counts, max)))
    }

    async fn next_group(
        &self,
        partition: u16,
        load: &Loads,
    ) -> Result<Option<oncegate_core::queue_index::Next>, StoreError> {
        if partition >= self.shared.partitions {
            return Err(StoreError::Invalid(format!("no partition {partition}")));
        }
        let now_ms = self.clock.now_ms();
        Ok(self
            .order(partition)
            .and_then(|order| order.next_group(now_ms, &**load)))
    }

    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        if !self.is_in_flight(id) {
            return Ok(false);
        }
        self.send(|reply| Command::Ack { id, reply }).await
    }

    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        if !self.is_in_flight(id) {
            return Ok(false);
        }
        self.send(|reply| Command::Retry {
            id,
            not_before_ms,
            reply,
        })
        .await
    }

    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        if !self.is_in_flight(id) {
            return Ok(false);
        }
        let reason = reason.to_owned();
        self.send(|reply| Command::DeadLetter { id, reason, reply })
            .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let raw = self.read(|txn| {
            let dead = txn.open_table(DEAD)?;
            let mut raw = Vec::new();
            for entry in dead.iter()?.take(limit) {
                raw.push(entry?.1.value().to_vec());
            }
            Ok(raw)
        })?;
        raw.iter().map(|bytes| decode(bytes)).collect()
    }

    async fn dead_letter_count(&self) -> Result<u64, StoreError> {
        // redb keeps a table's length in its header: no scan.
        self.read(|txn| Ok(txn.open_table(DEAD)?.len()?))
    }

    async fn replay_dead_letter(&self, id: QueueId) -> Result<Option<QueueId>, StoreError> {
        self.send(|reply| Command::ReplayDead { id, reply }).await
    }

    async fn purge_dead_letter(&self, id: QueueId) -> Result<bool, StoreError> {
        self.send(|reply| Command::PurgeDead { id, reply }).await
    }

    async fn queue_summary(&self, partition: u16) -> Result<QueueSummary, StoreError> {
        require_partition(partition, self.shared.partitions)?;
        // The oldest entry may be acked between reading the index and the file: look again.
        for _ in 0..3 {
            let (events, handed_out, bytes, oldest) = match self.order(partition) {
                Some(order) => (
                    order.len() as u64,
                    order.in_flight() as u64,
                    order.bytes(),
                    order.oldest(),
                ),
                None => (0, 0, 0, None),
            };
            let Some(seq) = oldest else {
                return Ok(QueueSummary {
                    partition,
                    ..QueueSummary::default()
                });
            };
            if let Some((_, stored)) = self.stored(&[seq])?.pop() {
                let queued: codec::Queued = decode(&stored)?;
                return Ok(QueueSummary {
                    partition,
                    events,
                    handed_out,
                    bytes,
                    oldest_created_ms: Some(queued.event.created_at_ms),
                });
            }
        }
        Err(StoreError::Unavailable(format!(
            "partition {partition}'s oldest event kept changing while it was read; ask again"
        )))
    }

    async fn queued_events(
        &self,
        partition: u16,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<QueuedEvent>, StoreError> {
        require_partition(partition, self.shared.partitions)?;
        let seqs = match self.order(partition) {
            Some(order) => order.seqs_after(after, limit),
            None => Vec::new(),
        };
        let stored = self.stored(&seqs)?;
        let now_ms = self.clock.now_ms();
        let mut out = Vec::with_capacity(stored.len());
        for (seq, bytes) in stored {
            let queued: codec::Queued = decode(&bytes)?;
            let state = self
                .order(partition)
                .and_then(|order| order.state(seq, queued.order_hash, now_ms));
            // Gone from the index since it was listed: acked meanwhile.
            let Some(state) = state else { continue };
            out.push(QueuedEvent {
                id: QueueId { partition, seq },
                key: queued.key,
                event: queued.event,
                attempt: queued.attempt,
                state,
            });
        }
        Ok(out)
    }
}

impl<C: Clock + Clone> EmbeddedStore<C> {
    /// The stored entries of `seqs` that are still queued, in one read transaction.
    fn stored(&self, seqs: &[u64]) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.read(|txn| {
            let queue = txn.open_table(QUEUE)?;
            let mut stored = Vec::with_capacity(seqs.len());
            for seq in seqs {
                if let Some(value) = queue.get(*seq)? {
                    stored.push((*seq, value.value().to_vec()));
                }
            }
            Ok(stored)
        })
    }
}
