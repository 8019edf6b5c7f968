//! The partition streams: ownership, takeover, group reads and hand-outs.

use std::sync::atomic::Ordering;

use super::*;

impl<C: Clock> Inner<C> {
    /// The epoch this instance handed `id` out under, while it has not settled it since:
    /// what the owner's scripts for it name. `None`: not handed out here.
    pub(super) async fn handed_out(&self, id: QueueId) -> Option<u64> {
        let queue = self.queues.get(usize::from(id.partition))?.lock().await;
        queue.order.is_in_flight(id.seq).then_some(queue.epoch)
    }

    /// Settles handed-out `id` in the hand-out order with `step` (remove or retry), after its
    /// round trip: the partition is not locked across it, so that its pulls and the other
    /// settlements do not queue behind one call (a pull meanwhile sees `id` still handed out
    /// and holds its chat back, which is safe). `false` when `id` was settled meanwhile.
    pub(super) async fn settle(
        &self,
        id: QueueId,
        step: impl FnOnce(&mut oncegate_core::queue_index::PartitionIndex) -> bool,
    ) -> bool {
        match self.queues.get(usize::from(id.partition)) {
            Some(queue) => step(&mut queue.lock().await.order),
            None => false,
        }
    }

    /// Creates the partition's consumer group (and stream) unless it exists.
    pub(super) async fn ensure_group(
        &self,
        conn: &mut Conn,
        partition: u16,
    ) -> Result<(), StoreError> {
        let created: redis::RedisResult<Value> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.stream(partition))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            Err(error) => Err(unavailable(error)),
        }
    }

    /// Moves every pending entry of the group to this consumer (in entry order) and into the
    /// hand-out order; then forgets consumers that hold nothing (gateways that are gone).
    /// `false` when the partition is not this instance's under its epoch anymore.
    pub(super) async fn reclaim(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
    ) -> Result<bool, StoreError> {
        let mut start = "0-0".to_owned();
        loop {
            let Some(reply) = self
                .owner_read(conn, partition, queue.epoch, "claim", &start)
                .await?
            else {
                return Ok(false);
            };
            let mut parts = array(reply)?.into_iter();
            let next = parts.next().as_ref().and_then(text).map(str::to_owned);
            let entries = array(parts.next().unwrap_or(Value::Array(Vec::new())))?;
            self.fold(conn, partition, queue, entries, false).await?;
            match next {
                Some(next) if next != "0-0" => start = next,
                _ => break,
            }
        }
        let consumers: Vec<Value> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(self.stream(partition))
            .arg(GROUP)
            .query_async(conn)
            .await
            .map_err(from_redis)?;
        for consumer in consumers {
            let fields = array(consumer)?;
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|pair| text(&pair[0]) == Some(name))
                    .and_then(|pair| pair.get(1))
            };
            let (Some(name), Some(pending)) =
                (field("name").and_then(text), field("pending").and_then(int))
            else {
                continue;
            };
            if pending == 0 && name != self.instance {
                let _: Value = redis::cmd("XGROUP")
                    .arg("DELCONSUMER")
                    .arg(self.stream(partition))
                    .arg(GROUP)
                    .arg(name)
                    .query_async(conn)
                    .await
                    .map_err(from_redis)?;
            }
        }
        Ok(true)
    }

    /// Brings the hand-out order up to date: takes over earlier owners' pending entries once
    /// after a takeover, reads this consumer's own pending list back after a read whose answer
    /// may have been lost, then reads what the group has not delivered yet. Each step is
    /// repeated on the next pull until it has gone through, so no entry is left pending
    /// unknown, and entries are folded in id order.
    pub(super) async fn catch_up(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
    ) -> Result<(), StoreError> {
        if queue.reclaim {
            self.ensure_group(conn, partition).await?;
            // XAUTOCLAIM moves entries to this consumer before answering: if the answer is
            // lost, they are in our own pending list.
            queue.resync = true;
            if !self.reclaim(conn, partition, queue).await? {
                queue.forget();
                return Ok(());
            }
            queue.reclaim = false;
        }
        if queue.resynced.is_none_or(|at| at.elapsed() >= RESYNC_EVERY) {
            queue.resync = true;
        }
        if queue.resync {
            let mut after = "0".to_owned();
            loop {
                let Some(entries) = self
                    .read_group(conn, partition, queue.epoch, &after)
                    .await?
                else {
                    queue.forget();
                    return Ok(());
                };
                let Some(last) = entries.last().and_then(entry_id) else {
                    break;
                };
                let done = entries.len() < CATCH_UP;
                after = last;
                self.fold(conn, partition, queue, entries, false).await?;
                if done {
                    break;
                }
            }
            queue.resync = false;
            queue.resynced = Some(std::time::Instant::now());
        }
        let unread = self.unread[usize::from(partition)].swap(false, Ordering::AcqRel);
        if !unread && queue.read.is_some_and(|at| at.elapsed() < READ_EVERY) {
            return Ok(());
        }
        loop {
            queue.resync = true;
            let read = self.read_group(conn, partition, queue.epoch, ">").await;
            let entries = match read {
                Ok(Some(entries)) => entries,
                Ok(None) => {
                    queue.forget();
                    return Ok(());
                }
                Err(error) => {
                    // Read again next time, whatever was appended.
                    self.unread[usize::from(partition)].store(true, Ordering::Release);
                    return Err(error);
                }
            };
            queue.read = Some(std::time::Instant::now());
            let done = entries.len() < CATCH_UP;
            // Never delivered before: no other gateway can ack them behind our back, so their
            // payloads may be kept for the hand-out.
            self.fold(conn, partition, queue, entries, true).await?;
            queue.resync = false;
            if done {
                return Ok(());
            }
        }
    }

    /// `XREADGROUP` for this consumer from `from`: `>` for entries never delivered, an id for
    /// this consumer's own pending entries after it. `None` when the partition is not this
    /// instance's under `epoch` (nothing was read).
    pub(super) async fn read_group(
        &self,
        conn: &mut Conn,
        partition: u16,
        epoch: u64,
        from: &str,
    ) -> Result<Option<Vec<Value>>, StoreError> {
        let Some(reply) = self
            .owner_read(conn, partition, epoch, "read", from)
            .await?
        else {
            return Ok(None);
        };
        match reply {
            Value::Nil => Ok(Some(Vec::new())),
            // [[stream, [entries]]] (RESP2) or {stream: [entries]} (RESP3)
            Value::Array(streams) => match streams.into_iter().next() {
                Some(stream) => Ok(Some(array(
                    array(stream)?.into_iter().nth(1).unwrap_or(Value::Nil),
                )?)),
                None => Ok(Some(Vec::new())),
            },
            Value::Map(streams) => match streams.into_iter().next() {
                Some((_, entries)) => Ok(Some(array(entries)?)),
                None => Ok(Some(Vec::new())),
            },
            other => Err(StoreError::Corrupt(format!(
                "unexpected XREADGROUP reply {other:?}"
            ))),
        }
    }

    /// One of the owner's group reads (`lua/read.lua`, `mode` read or claim) under `epoch`:
    /// the command's reply, or `None` when the partition is not this instance's under it. A
    /// group that is gone (a Redis that lost its data) is made again, once.
    async fn owner_read(
        &self,
        conn: &mut Conn,
        partition: u16,
        epoch: u64,
        mode: &str,
        from: &str,
    ) -> Result<Option<Value>, StoreError> {
        let mut recreated = false;
        loop {
            let reply: Value = self
                .scripts
                .read
                .key(self.stream(partition))
                .key(self.owner(partition))
                .arg(&self.instance)
                .arg(epoch)
                .arg(GROUP)
                .arg(CATCH_UP)
                .arg(mode)
                .arg(from)
                .invoke_async(conn)
                .await
                .map_err(from_redis)?;
            let mut parts = array(reply)?.into_iter();
            match parts.next() {
                Some(Value::Int(1)) => return Ok(Some(parts.next().unwrap_or(Value::Nil))),
                Some(Value::Int(0)) => return Ok(None),
                Some(Value::Int(-1)) if !recreated => {
                    self.ensure_group(conn, partition).await?;
                    recreated = true;
                }
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "unexpected group read reply {other:?}"
                    )));
                }
            }
        }
    }

    /// Adds stream entries (in entry order) to the hand-out order, with their retry times.
    /// `fresh` entries (a `>` read: never delivered before) have no retry times, and their
    /// payloads are kept while the partition's bound allows.
    pub(super) async fn fold(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
        entries: Vec<Value>,
        fresh: bool,
    ) -> Result<(), StoreError> {
        let mut seqs = Vec::with_capacity(entries.len());
        for entry in entries {
            if is_deleted(&entry) {
                // Redis 6.2 lists an entry deleted while pending as nil; it was acked.
                continue;
            }
            let Some((seq, key, order, stored)) = parse_entry(entry) else {
                return Err(StoreError::Corrupt("a stream entry lacks k, o or e".into()));
            };
            if seq > queue.last_seq {
                seqs.push((seq, key, order, stored));
            }
        }
        if seqs.is_empty() {
            return Ok(());
        }
        // Entries never delivered before were never retried: no attempts to read (and no
        // round trip on every new entry's way to its handler).
        let attempts: Vec<Option<String>> = if fresh {
            vec![None; seqs.len()]
        } else {
            let fields: Vec<String> = seqs.iter().map(|(seq, ..)| seq.to_string()).collect();
            redis::cmd("HMGET")
                .arg(self.attempts(partition))
                .arg(&fields)
                .query_async(conn)
                .await
                .map_err(from_redis)?
        };
        for ((seq, key, order, stored), attempt) in seqs.into_iter().zip(attempts) {
            let (attempt, mut not_before) = attempts_of(attempt.as_deref());
            if !fresh {
                // Taken over from an owner that may still run its lean hand-outs.
                not_before = not_before.max(queue.hold_until_ms);
            }
            let place = place_of_stored(&self.first, &stored, order);
            queue.order.push_at(seq, place, not_before, stored.len());
            queue.last_seq = seq;
            if fresh {
                queue.keep_body(seq, key, stored, attempt);
            }
        }
        Ok(())
    }
}

/// Reads the entries `seqs` of a partition's stream with their attempt counts, in one round
/// trip; `None` for an entry that is gone.
pub(super) async fn fetch<C>(
    inner: &Inner<C>,
    conn: &mut Conn,
    partition: u16,
    seqs: &[u64],
) -> Result<Vec<Option<Delivery>>, StoreError> {
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let stream = inner.stream(partition);
    let attempts = inner.attempts(partition);
    let mut pipe = redis::pipe();
    for &seq in seqs {
        let id = format!("0-{seq}");
        pipe.cmd("XRANGE").arg(&stream).arg(&id).arg(&id);
        pipe.cmd("HGET").arg(&attempts).arg(seq);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await.map_err(from_redis)?;
    let mut out = Vec::with_capacity(seqs.len());
    let mut replies = replies.into_iter();
    for &seq in seqs {
        let (Some(entries), Some(attempt)) = (replies.next(), replies.next()) else {
            return Err(StoreError::Corrupt(
                "a short pipeline reply from redis".into(),
            ));
        };
        let Some((_, key, _, bytes)) = array(entries)?.into_iter().next().and_then(parse_entry)
        else {
            out.push(None);
            continue;
        };
        out.push(Some(delivery_of(
            QueueId { partition, seq },
            key,
            &bytes,
            attempts_of(text(&attempt)).0,
        )?));
    }
    Ok(out)
}

/// The fields of a stored event that say whose it is: postcard reads them from the front of
/// the stored bytes and leaves the rest (the payload) unread.
#[derive(serde::Deserialize)]
struct Whose<'a> {
    #[serde(borrow)]
    platform: &'a str,
    #[serde(borrow)]
    app: &'a str,
    #[serde(borrow)]
    tenant: Option<&'a str>,
}

/// A stored event's group hash ([`oncegate_core::Event::group_hash`]); one that does not read
/// is a group of its own chain (handed out in queue order, as before groups).
fn group_of_stored(stored: &[u8], order: u64) -> u64 {
    #[derive(serde::Deserialize)]
    struct StoredWhose<'a> {
        #[serde(borrow)]
        event: Whose<'a>,
    }
    match postcard::from_bytes::<StoredWhose<'_>>(stored) {
        Ok(StoredWhose { event }) => {
            oncegate_core::event::group_of(event.platform, event.app, event.tenant)
        }
        Err(_) => order,
    }
}

/// Where a stored event of chain `order` joins the hand-out order, from one read: the whole
/// event while a rule is set (the rule reads it), else only whose it is. One that does not
/// read is a group of its own chain and does not go first.
fn place_of_stored(
    rule: &oncegate_core::FirstRule,
    stored: &[u8],
    order: u64,
) -> oncegate_core::Place {
    let place = |group, first| oncegate_core::Place {
        order_hash: order,
        group,
        first,
    };
    if !rule.is_set() {
        return place(group_of_stored(stored, order), false);
    }
    match postcard::from_bytes::<Stored>(stored) {
        Ok(Stored { event }) => place(event.group_hash(), rule.first(&event)),
        Err(_) => place(order, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the hand-out order reads of a stored event is the event's own group: every
    /// gateway groups an event as the store that admitted it does.
    #[test]
    fn a_stored_events_group_is_the_events_own() {
        for tenant in [Some("t1"), Some(""), None] {
            let mut event = oncegate_contract::event("e1", Some("oc_chat"));
            event.tenant = tenant.map(std::sync::Arc::from);
            let stored = postcard::to_stdvec(&Stored {
                event: event.clone(),
            })
            .expect("encodes");
            assert_eq!(
                group_of_stored(&stored, 7),
                event.group_hash(),
                "{tenant:?}"
            );
        }
        let other = oncegate_contract::event("e2", Some("oc_chat"));
        let mut another = other.clone();
        another.tenant = Some("someone else".into());
        assert_ne!(other.group_hash(), another.group_hash());
        // Bytes that do not read: a group of the chain's own.
        assert_eq!(group_of_stored(b"\xff", 7), 7);
    }

    /// With a rule set, one read of the stored event gives both its group (the same as
    /// without a rule) and the rule's answer; bytes that do not read go first for nobody.
    #[test]
    fn a_stored_events_place_is_read_once_with_or_without_a_rule() {
        let rule = oncegate_core::FirstRule::default();
        let mention = oncegate_contract::event("mention-1", Some("oc_chat"));
        let plain = oncegate_contract::event("plain-1", Some("oc_chat"));
        let stored = |event: &oncegate_core::Event| {
            postcard::to_stdvec(&Stored {
                event: event.clone(),
            })
            .expect("encodes")
        };
        let place = |group, first| oncegate_core::Place {
            order_hash: 7,
            group,
            first,
        };
        assert_eq!(
            place_of_stored(&rule, &stored(&mention), 7),
            place(mention.group_hash(), false),
            "no rule: nothing first"
        );
        let first = |event: &oncegate_core::Event| event.event_id.starts_with("mention");
        rule.set(std::sync::Arc::new(first)).expect("set");
        assert_eq!(
            place_of_stored(&rule, &stored(&mention), 7),
            place(mention.group_hash(), true)
        );
        assert_eq!(
            place_of_stored(&rule, &stored(&plain), 7),
            place(plain.group_hash(), false)
        );
        assert_eq!(place_of_stored(&rule, b"\xff", 7), place(7, false));
    }
}
