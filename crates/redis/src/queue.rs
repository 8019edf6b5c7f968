//! The queue: pull, ack, retry, dead letters.

use super::*;
use oncegate_core::{GroupLoad, Loads, Unranked};

impl<C: Clock> EventQueue for RedisStore<C> {
    fn partitions(&self) -> u16 {
        self.inner.partitions
    }

    async fn put_first(
        &self,
        rule: std::sync::Arc<dyn oncegate_core::Precedence>,
    ) -> Result<(), StoreError> {
        // Entries join the hand-out order as a pull reads them: set before the first pull,
        // every entry is ranked by it.
        self.inner.first.set(rule)
    }

    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        require_partition(partition, self.inner.partitions)?;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            Ok(hand_out(&inner, &mut conn, partition, max, &Unranked)
                .await?
                .0)
        })
        .await
    }

    async fn pull_claimed(
        &self,
        partition: u16,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<oncegate_core::ClaimedDelivery>, StoreError> {
        self.pull_claimed_ranked(partition, max, lease, &unranked())
            .await
    }

    async fn pull_ranked(
        &self,
        partition: u16,
        max: usize,
        load: &Loads,
    ) -> Result<Vec<Delivery>, StoreError> {
        require_partition(partition, self.inner.partitions)?;
        let load = load.clone();
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            Ok(hand_out(&inner, &mut conn, partition, max, &*load).await?.0)
        })
        .await
    }

    async fn next_group(
        &self,
        partition: u16,
        load: &Loads,
    ) -> Result<Option<oncegate_core::queue_index::Next>, StoreError> {
        require_partition(partition, self.inner.partitions)?;
        let load = load.clone();
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            next_group(&inner, &mut conn, partition, &*load).await
        })
        .await
    }

    async fn pull_claimed_ranked(
        &self,
        partition: u16,
        max: usize,
        lease: Duration,
        load: &Loads,
    ) -> Result<Vec<oncegate_core::ClaimedDelivery>, StoreError> {
        require_partition(partition, self.inner.partitions)?;
        let load = load.clone();
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let (pulled, epoch) = hand_out(&inner, &mut conn, partition, max, &*load).await?;
            if pulled.is_empty() {
                return Ok(Vec::new());
            }
            Ok(lean::claims(&inner, &mut conn, partition, epoch, pulled, millis(lease)).await)
        })
        .await
    }

    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some(epoch) = inner.handed_out(id).await else {
                return Ok(false);
            };
            let acked: i64 = inner
                .scripts
                .ack
                .key(inner.stream(id.partition))
                .key(inner.attempts(id.partition))
                .key(inner.owner(id.partition))
                .arg(&inner.instance)
                .arg(epoch)
                .arg(GROUP)
                .arg(id.seq)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            // Refused: the partition is another owner's now, and so is the entry.
            let settled = inner.settle(id, |order| order.remove(id.seq)).await;
            Ok(acked == 1 && settled)
        })
        .await
    }

    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            // Locked across its round trip: a second retry of the same hand-out must see it
            // settled, or the attempt would be counted twice.
            let Some(queue) = inner.queues.get(usize::from(id.partition)) else {
                return Ok(false);
            };
            let mut queue = queue.lock().await;
            if !queue.order.is_in_flight(id.seq) {
                return Ok(false);
            }
            let counted: i64 = inner
                .scripts
                .retry
                .key(inner.attempts(id.partition))
                .key(inner.owner(id.partition))
                .arg(&inner.instance)
                .arg(queue.epoch)
                .arg(id.seq)
                .arg(not_before_ms)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            if counted != 1 {
                // Another owner's now: it takes the entry over with its pending list.
                queue.order.remove(id.seq);
                return Ok(false);
            }
            Ok(queue.order.retry(id.seq, not_before_ms))
        })
        .await
    }

    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        let reason = reason.to_owned();
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some(epoch) = inner.handed_out(id).await else {
                return Ok(false);
            };
            let moved: i64 = inner
                .scripts
                .dead_letter
                .key(inner.stream(id.partition))
                .key(inner.attempts(id.partition))
                .key(inner.dead(id.partition))
                .key(inner.dead_index(id.partition))
                .key(inner.owner(id.partition))
                .arg(format!("0-{}", id.seq))
                .arg(id.seq)
                .arg(reason)
                .arg(inner.clock.now_ms())
                .arg(id.partition)
                .arg(GROUP)
                .arg(&inner.instance)
                .arg(epoch)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let settled = inner.settle(id, |order| order.remove(id.seq)).await;
            Ok(moved == 1 && settled)
        })
        .await
    }

    /// The oldest `limit` dead letters of all partitions (each partition keeps its own, in its
    /// slot), oldest first.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let mut out = Vec::new();
            for partition in 0..inner.partitions {
                let entries: Value = redis::cmd("XRANGE")
                    .arg(inner.dead(partition))
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(limit)
                    .query_async(&mut conn)
                    .await
                    .map_err(from_redis)?;
                for entry in array(entries)? {
                    out.push(parse_dead_letter(entry)?);
                }
            }
            out.sort_by_key(|letter| (letter.at_ms, letter.id));
            out.truncate(limit);
            Ok(out)
        })
        .await
    }

    async fn dead_letter_count(&self) -> Result<u64, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            // One XLEN per partition: the dead streams live in their partitions' slots.
            let mut count = 0u64;
            for partition in 0..inner.partitions {
                let dead: u64 = redis::cmd("XLEN")
                    .arg(inner.dead(partition))
                    .query_async(&mut conn)
                    .await
                    .map_err(from_redis)?;
                count += dead;
            }
            Ok(count)
        })
        .await
    }

    async fn replay_dead_letter(&self, id: QueueId) -> Result<Option<QueueId>, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some((entry, letter)) = find_dead(&inner, &mut conn, id).await? else {
                return Ok(None);
            };
            let seq: i64 = inner
                .scripts
                .dead_replay
                .key(inner.dead(id.partition))
                .key(inner.dead_index(id.partition))
                .key(inner.stream(id.partition))
                .arg(entry)
                .arg(id.seq)
                .arg(letter.event.order_hash())
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            inner.unread[usize::from(id.partition)]
                .store(true, std::sync::atomic::Ordering::Release);
            Ok(u64::try_from(seq).ok().map(|seq| QueueId {
                partition: id.partition,
                seq,
            }))
        })
        .await
    }

    async fn purge_dead_letter(&self, id: QueueId) -> Result<bool, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some((entry, _)) = find_dead(&inner, &mut conn, id).await? else {
                return Ok(false);
            };
            let removed: i64 = inner
                .scripts
                .dead_purge
                .key(inner.dead(id.partition))
                .key(inner.dead_index(id.partition))
                .arg(entry)
                .arg(id.seq)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            Ok(removed == 1)
        })
        .await
    }

    async fn leave(&self) -> Result<(), StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            // What it admitted joins the counts before it goes (one more try: the counts,
            // not the events, lose what does not make it).
            let _ = inner.write_tallies(&mut conn).await;
            inner.leave(&mut conn).await
        })
        .await
    }

    async fn owners(&self) -> Result<Vec<oncegate_core::PartitionOwner>, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            inner.owners(&mut conn).await
        })
        .await
    }

    async fn group_queued(&self, group: u64) -> Result<Option<u64>, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            inner.group_queued(&mut conn, group).await.map(Some)
        })
        .await
    }

    async fn busiest_groups(&self, max: usize) -> Result<Option<Vec<(u64, u64)>>, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            inner.busiest_groups(&mut conn, max).await.map(Some)
        })
        .await
    }

    async fn queue_summary(&self, partition: u16) -> Result<QueueSummary, StoreError> {
        require_partition(partition, self.inner.partitions)?;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            view::summary(&inner, &mut conn, partition).await
        })
        .await
    }

    async fn queued_events(
        &self,
        partition: u16,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<QueuedEvent>, StoreError> {
        require_partition(partition, self.inner.partitions)?;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            view::entries(&inner, &mut conn, partition, after, limit).await
        })
        .await
    }
}

/// Dead letter `id` and its entry in the dead stream: through the index, or (for letters
/// written before it existed) by reading the partition's dead stream.
async fn find_dead<C>(
    inner: &Inner<C>,
    conn: &mut Conn,
    id: QueueId,
) -> Result<Option<(String, DeadLetter)>, StoreError> {
    if id.partition >= inner.partitions {
        return Ok(None);
    }
    let indexed: Option<String> = redis::cmd("HGET")
        .arg(inner.dead_index(id.partition))
        .arg(id.seq)
        .query_async(conn)
        .await
        .map_err(from_redis)?;
    let (start, end, count) = match &indexed {
        Some(entry) => (entry.clone(), entry.clone(), 1),
        None => ("-".to_owned(), "+".to_owned(), 1000),
    };
    let mut start = start;
    loop {
        let entries: Value = redis::cmd("XRANGE")
            .arg(inner.dead(id.partition))
            .arg(&start)
            .arg(&end)
            .arg("COUNT")
            .arg(count)
            .query_async(conn)
            .await
            .map_err(from_redis)?;
        let entries = array(entries)?;
        let (seen, last) = (entries.len(), entries.last().and_then(entry_id));
        for entry in entries {
            let name = entry_id(&entry);
            let letter = parse_dead_letter(entry)?;
            if letter.id == id
                && let Some(name) = name
            {
                return Ok(Some((name, letter)));
            }
        }
        match last {
            Some(last) if indexed.is_none() && seen == count => start = format!("({last}"),
            _ => return Ok(None),
        }
    }
}

/// A load that ranks nothing: each partition's own order.
fn unranked() -> Loads {
    Arc::new(Unranked)
}

/// Whether the partition's hand-out order is recent enough to hand out from without a read:
/// chats whose next event is here already go out without waiting for one, since what a read
/// brings is newer than all of it.
fn fresh(queue: &Partition) -> bool {
    queue.read.is_some_and(|at| at.elapsed() < READ_EVERY) && !queue.reclaim && !queue.resync
}

/// The group a ranked hand-out of `partition` would serve next (see `EventQueue::next_group`):
/// from the order as it stands while it is fresh, else after a read. The hand-out that follows
/// finds the order fresh and costs no second read.
async fn next_group<C: Clock>(
    inner: &Inner<C>,
    conn: &mut Conn,
    partition: u16,
    load: &dyn GroupLoad,
) -> Result<Option<oncegate_core::queue_index::Next>, StoreError> {
    inner.balance_if_due(conn).await?;
    let mut queue = inner.queues[usize::from(partition)].lock().await;
    if !queue.serving(Duration::from_millis(inner.ownership_ms)) {
        return Ok(None);
    }
    let now = inner.clock.now_ms();
    if fresh(&queue)
        && let Some(group) = queue.order.next_group(now, load)
    {
        return Ok(Some(group));
    }
    inner.catch_up(conn, partition, &mut queue).await?;
    Ok(queue.order.next_group(now, load))
}

/// Hands out up to `max` ready events of `partition` (see `EventQueue::pull`), ranked by
/// `load`, with the epoch they were handed out under.
async fn hand_out<C: Clock>(
    inner: &Inner<C>,
    conn: &mut Conn,
    partition: u16,
    max: usize,
    load: &dyn GroupLoad,
) -> Result<(Vec<Delivery>, u64), StoreError> {
    inner.balance_if_due(conn).await?;
    let mut queue = inner.queues[usize::from(partition)].lock().await;
    if !queue.serving(Duration::from_millis(inner.ownership_ms)) {
        return Ok((Vec::new(), 0));
    }
    let now = inner.clock.now_ms();
    // The next pull reads.
    let mut ready = if fresh(&queue) {
        queue.order.take_ranked(now, max, load)
    } else {
        Vec::new()
    };
    if ready.is_empty() {
        inner.catch_up(conn, partition, &mut queue).await?;
        ready = queue.order.take_ranked(now, max, load);
    }
    // A count not published now is published at the next hand-out or renewal.
    let _ = inner
        .publish_groups(conn, partition, &mut queue, false)
        .await;
    // Kept payloads go out as they are; only the others are read again.
    let mut kept = Vec::with_capacity(ready.len());
    let mut missing = Vec::new();
    let mut broken = None;
    for &seq in &ready {
        match queue.take_body(partition, seq) {
            Some(Ok(delivery)) => kept.push(Some(delivery)),
            Some(Err(error)) => {
                broken.get_or_insert(error);
                kept.push(None);
            }
            None => {
                missing.push(seq);
                kept.push(None);
            }
        }
    }
    let fetched = match broken {
        Some(error) => Err(error),
        None => fetch(inner, conn, partition, &missing).await,
    };
    match fetched {
        Ok(fetched) => {
            let mut fetched = fetched.into_iter();
            let mut out = Vec::with_capacity(ready.len());
            for (seq, kept) in ready.iter().zip(kept) {
                match kept.or_else(|| fetched.next().flatten()) {
                    Some(delivery) => out.push(delivery),
                    // Gone (acked by an earlier owner): forget it here too.
                    None => {
                        queue.order.remove(*seq);
                    }
                }
            }
            Ok((out, queue.epoch))
        }
        Err(error) => {
            // Not handed out after all: put them back so that they go out later.
            for seq in ready {
                queue.order.retry(seq, 0);
            }
            Err(error)
        }
    }
}
