//! Each tenant's events per partition, for a per-tenant queue bound on every gateway
//! (`EventQueue::group_queued`). The partition's owner knows them from its hand-out order and
//! publishes them to a hash in the partition's slot (`{prefix:p}:qg`, tenant group → events):
//! at most every `PUBLISH_EVERY` from its hand-outs and at each ownership renewal, only what
//! changed, the whole hash written afresh by a new owner. The hash lives `PUBLISH_TTL` past the
//! last publish, so that an owner that is gone leaves no count behind for long. Counts are
//! rewritten from the order, never counted up and down by the scripts: nothing can drift.

use std::collections::HashMap;

use super::*;

/// How often an owner publishes from its hand-outs at most.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);
/// How long a partition's counts outlive their last publish.
const PUBLISH_TTL: Duration = Duration::from_secs(30);

impl<C: Clock> Inner<C> {
    /// Publishes `partition`'s tenant counts when due (`force`: at a renewal, whatever the
    /// last publish).
    pub(super) async fn publish_groups(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
        force: bool,
    ) -> Result<(), StoreError> {
        if !force
            && queue
                .published_at
                .is_some_and(|at| at.elapsed() < PUBLISH_EVERY)
        {
            return Ok(());
        }
        let counts: HashMap<u64, u64> = queue.order.group_counts().collect();
        let first = queue.published_at.is_none();
        let key = self.groups(partition);
        let mut pipe = redis::pipe();
        pipe.atomic();
        if first {
            pipe.cmd("DEL").arg(&*key).ignore();
        }
        let changed: Vec<(u64, u64)> = counts
            .iter()
            .filter(|(group, events)| first || queue.published.get(group) != Some(events))
            .map(|(group, events)| (*group, *events))
            .collect();
        if !changed.is_empty() {
            pipe.cmd("HSET").arg(&*key);
            for (group, events) in &changed {
                pipe.arg(group).arg(events);
            }
            pipe.ignore();
        }
        let gone: Vec<u64> = queue
            .published
            .keys()
            .filter(|group| !counts.contains_key(group))
            .copied()
            .collect();
        if !first && !gone.is_empty() {
            pipe.cmd("HDEL").arg(&*key).arg(&gone).ignore();
        }
        pipe.cmd("PEXPIRE")
            .arg(&*key)
            .arg(PUBLISH_TTL.as_millis() as u64)
            .ignore();
        let () = pipe.query_async(conn).await.map_err(from_redis)?;
        queue.published = counts;
        queue.published_at = Some(std::time::Instant::now());
        Ok(())
    }

    /// `group`'s events in every partition: from this gateway's own hand-out order where it
    /// owns the partition, else as the owner last published them — one `HGET` for each
    /// partition owned elsewhere, whatever the queue holds.
    pub(super) async fn group_queued(
        &self,
        conn: &mut Conn,
        group: u64,
    ) -> Result<u64, StoreError> {
        let mut events = 0u64;
        for partition in 0..self.partitions {
            {
                let queue = self.queues[usize::from(partition)].lock().await;
                if queue.owned {
                    events += queue.order.group_events(group);
                    continue;
                }
            }
            let count: Option<u64> = redis::cmd("HGET")
                .arg(&*self.groups(partition))
                .arg(group)
                .query_async(conn)
                .await
                .map_err(from_redis)?;
            events += count.unwrap_or(0);
        }
        Ok(events)
    }

    /// The `max` tenants with the most events: this gateway's orders for its partitions, the
    /// published counts (`HGETALL`, one a partition) for the others.
    pub(super) async fn busiest_groups(
        &self,
        conn: &mut Conn,
        max: usize,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let mut counts: Vec<(u64, u64)> = Vec::new();
        for partition in 0..self.partitions {
            {
                let queue = self.queues[usize::from(partition)].lock().await;
                if queue.owned {
                    counts.extend(queue.order.group_counts());
                    continue;
                }
            }
            let published: HashMap<u64, u64> = redis::cmd("HGETALL")
                .arg(&*self.groups(partition))
                .query_async(conn)
                .await
                .map_err(from_redis)?;
            counts.extend(published);
        }
        Ok(oncegate_core::store::busiest(counts, max))
    }
}
