//! Records: admit, claim, the fenced transitions, look-ups, stats, watermarks.

use super::gather::{Batch, one_each};
use super::*;

impl<C: Clock> DedupStore for RedisStore<C> {
    async fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> Result<Admission, StoreError> {
        self.admit_with_nonce(event, keys, retention, None).await
    }

    async fn admit_with_nonce(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
        nonce: Option<Nonce>,
    ) -> Result<Admission, StoreError> {
        oncegate_core::store::require_keys(keys)?;
        self.inner.promise.admits()?;
        // Each key once (with its index among the caller's): the script marks them one by one,
        // and a key named twice would find its own mark live. Only a list with a repeat is
        // rebuilt (an event names one or two keys).
        let repeated = keys
            .iter()
            .enumerate()
            .any(|(i, key)| keys[..i].contains(key));
        let (keys, indexes) = if repeated {
            let mut indexes = Vec::with_capacity(keys.len());
            let mut unique: Vec<KeyHash> = Vec::with_capacity(keys.len());
            for (index, key) in keys.iter().enumerate() {
                if !unique.contains(key) {
                    unique.push(*key);
                    indexes.push(index);
                }
            }
            (unique, Some(indexes))
        } else {
            (keys.to_vec(), None)
        };
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            // Only `replicas` needs it: for a Sentinel primary it costs a lock and a copy.
            let written_at = inner.promise.waits().then(|| conn.primary()).flatten();
            let order_hash = event.order_hash();
            let partition = oncegate_core::event::partition_of(order_hash, inner.partitions);
            let bytes = postcard::to_stdvec(&Stored { event })
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let now_ms = inner.clock.now_ms();
            let mut call = inner.scripts.admit.prepare_invoke();
            for key in &keys {
                call.key(inner.record_key(key, partition));
            }
            call.key(inner.stream(partition))
                .key(inner.sequence(partition));
            call.arg(now_ms)
                .arg(millis(retention))
                .arg(keys.len())
                .arg(&keys[0].hex_digits()[..])
                .arg(order_hash)
                .arg(bytes)
                .arg(TTL_SLACK_MS);
            if let Some(nonce) = nonce {
                // In the event's slot: a replay carries the same event, so the same partition.
                call.key(inner.nonce_bucket(nonce.timestamp_secs, partition))
                    .arg(nonce.window_ms.max(1))
                    .arg(&nonce.key.0[..]);
            }
            call.key(inner.counts(partition));
            let reply = call.invoke_async(&mut conn).await.map_err(from_redis);
            // Even after an error: the script may have appended before it failed.
            inner.unread[usize::from(partition)].store(true, std::sync::atomic::Ordering::Release);
            let reply = array(reply?)?;
            let admission = match (reply.first().and_then(int), reply.get(1).and_then(int)) {
                (Some(1), Some(seq)) => {
                    let records = i64::try_from(keys.len()).unwrap_or(i64::MAX);
                    let minute = now_ms.saturating_add(millis(retention)) / 60_000;
                    inner.tallies.add(
                        partition,
                        oncegate_core::live_counts::Counted::Pending,
                        minute,
                        records,
                    );
                    Admission::Admitted {
                        id: QueueId { partition, seq },
                    }
                }
                (Some(0), Some(index)) => Admission::Duplicate {
                    key_index: usize::try_from(index)
                        .ok()
                        .and_then(|index| {
                            indexes
                                .as_ref()
                                .map_or(Some(index), |indexes| indexes.get(index).copied())
                        })
                        .unwrap_or(0),
                },
                (Some(2), None) => return Ok(Admission::Replayed),
                _ => {
                    return Err(StoreError::Corrupt(format!(
                        "unexpected admit reply {reply:?}"
                    )));
                }
            };
            // Answered 200 either way: a duplicate too waits for the write that made it one.
            inner.replicated(partition, written_at).await?;
            Ok(admission)
        })
        .await
    }

    async fn claim_with_fingerprint(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> Result<Claim, StoreError> {
        require_partition(partition, self.inner.partitions)?;
        let call = ClaimCall {
            key: *key,
            lease_ms: millis(lease),
            fingerprint,
        };
        self.gathered(partition, call).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<FenceCheck, StoreError> {
        self.fence("renew", *lease, millis(extend), None).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        let fence = self
            .fence("complete", *lease, millis(retention), outcome)
            .await?;
        // A business key's outcome and a send's answer are answered to the caller as kept.
        if self.inner.promise.waits() {
            let partition = lease.partition;
            self.run(move |inner: Arc<Inner<C>>, conn: Conn| async move {
                inner.replicated(partition, conn.primary()).await
            })
            .await?;
        }
        Ok(fence)
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.fence("release", *lease, 0, None).await
    }

    async fn record(&self, key: &KeyHash, partition: u16) -> Result<Option<Record>, StoreError> {
        oncegate_core::store::require_partition(partition, self.inner.partitions)?;
        let key = *key;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let reply: Value = inner
                .scripts
                .records
                .key(inner.record_key(&key, partition))
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let now = inner.clock.now_ms();
            let reply = array(reply)?;
            let record = reply.first().map(record_of).transpose()?.flatten();
            Ok(record.filter(|record| record.is_live(now)))
        })
        .await
    }

    async fn complete_and_ack(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
        id: QueueId,
    ) -> Result<FenceCheck, StoreError> {
        if lease.partition != id.partition {
            // Two slots in a cluster: no one script can touch both.
            let fence = self.complete(lease, retention, outcome).await?;
            self.ack(id).await?;
            return Ok(fence);
        }
        require_partition(id.partition, self.inner.partitions)?;
        let call = CompleteCall {
            lease: *lease,
            retention_ms: millis(retention),
            outcome,
            seq: id.seq,
        };
        self.gathered(id.partition, call).await
    }

    fn durability(&self) -> oncegate_core::Durability {
        self.inner.promise.current()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run(move |_inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(from_redis)?;
            Ok(())
        })
        .await
    }

    /// The streams' lengths, one pipelined round trip: entries stay in a stream until acked.
    async fn queued(&self) -> Result<u64, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let lengths = (0..inner.partitions)
                .map(|partition| {
                    let mut xlen = redis::cmd("XLEN");
                    xlen.arg(inner.stream(partition));
                    xlen
                })
                .collect();
            let lengths = conn.each(lengths).await.map_err(from_redis)?;
            Ok(lengths.iter().filter_map(int).sum())
        })
        .await
    }

    /// The records counted as they change (`lua/counts.lua`) and the streams' lengths: one
    /// script per partition, pipelined, whatever the records held. A record whose life ends in
    /// the current minute is counted until the minute is over; records written by versions
    /// before the counts are not counted.
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let mut in_flight = 0u64;
        for queue in &self.inner.queues {
            in_flight += queue.lock().await.order.in_flight() as u64;
        }
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            // This gateway's admissions first: its own are never behind.
            inner.write_tallies(&mut conn).await?;
            let now = inner.clock.now_ms();
            let calls = (0..inner.partitions)
                .map(|partition| {
                    let mut call = redis::cmd("EVALSHA");
                    call.arg(inner.scripts.stats.get_hash())
                        .arg(3)
                        .arg(&*inner.counts(partition))
                        .arg(&*inner.stream(partition))
                        .arg(&*inner.dead(partition))
                        .arg(now);
                    call
                })
                .collect();
            let replies = match conn.each(calls).await {
                Ok(replies) => replies,
                // Not loaded yet (a new server, or a cluster node): each partition on its own,
                // which loads it.
                Err(error)
                    if error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    let mut replies = Vec::with_capacity(usize::from(inner.partitions));
                    for partition in 0..inner.partitions {
                        let reply: Value = inner
                            .scripts
                            .stats
                            .key(&*inner.counts(partition))
                            .key(&*inner.stream(partition))
                            .key(&*inner.dead(partition))
                            .arg(now)
                            .invoke_async(&mut conn)
                            .await
                            .map_err(from_redis)?;
                        replies.push(reply);
                    }
                    replies
                }
                Err(error) => return Err(from_redis(error)),
            };
            let mut stats = StoreStats {
                in_flight,
                ..StoreStats::default()
            };
            for reply in replies {
                let counts = array(reply)?;
                let count = |i: usize| {
                    counts.get(i).and_then(int).ok_or_else(|| {
                        StoreError::Corrupt(format!("unexpected stats reply {counts:?}"))
                    })
                };
                stats.pending += count(0)?;
                stats.processing += count(1)?;
                stats.completed += count(2)?;
                stats.queued += count(3)?;
                stats.dead_letters += count(4)?;
            }
            Ok(stats)
        })
        .await
    }
}

impl<C: Clock> RedisStore<C> {
    pub(super) async fn fence(
        &self,
        op: &'static str,
        lease: Lease,
        ms: u64,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            inner
                .fence_on(&mut conn, op, &lease, ms, outcome.as_deref())
                .await
        })
        .await
    }
}

impl<C: Clock> Inner<C> {
    /// A fenced transition of `lease`'s record (`lua/fence.lua`): renew, complete or release.
    pub(super) async fn fence_on(
        &self,
        conn: &mut Conn,
        op: &'static str,
        lease: &Lease,
        ms: u64,
        outcome: Option<&[u8]>,
    ) -> Result<FenceCheck, StoreError> {
        let mut call = self.scripts.fence.prepare_invoke();
        call.key(self.record_key(&lease.key, lease.partition))
            .key(self.counts(lease.partition))
            .arg(op)
            .arg(lease.token.0)
            .arg(self.clock.now_ms())
            .arg(ms)
            .arg(TTL_SLACK_MS)
            .arg(outcome_arg(outcome));
        if let Some(epoch) = lean_epoch(lease.token) {
            call.key(self.owner(lease.partition))
                .arg(&self.instance)
                .arg(epoch);
        }
        let applied: i64 = call.invoke_async(conn).await.map_err(from_redis)?;
        Ok(if applied == 1 {
            FenceCheck::Accepted
        } else {
            FenceCheck::Rejected
        })
    }
}

/// An outcome as the scripts take it: "-" for none, "o" and its bytes for one (which may be
/// empty).
fn outcome_arg(outcome: Option<&[u8]>) -> Vec<u8> {
    let mut arg = Vec::with_capacity(outcome.map_or(1, |o| o.len() + 1));
    match outcome {
        Some(bytes) => {
            arg.push(b'o');
            arg.extend_from_slice(bytes);
        }
        None => arg.push(b'-'),
    }
    arg
}

impl<C: Clock> WatermarkStore for RedisStore<C> {
    async fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> Result<WatermarkOutcome, StoreError> {
        let scope = *scope;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let reply: Value = inner
                .scripts
                .watermark
                .key(format!("{}:w:{scope}", inner.prefix))
                .arg(inner.clock.now_ms())
                .arg(value)
                .arg(millis(retention))
                .arg(TTL_SLACK_MS)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let reply = array(reply)?;
            match (reply.first().and_then(int), reply.get(1).and_then(int)) {
                (Some(1), previous) => Ok(WatermarkOutcome::Accepted { previous }),
                (Some(0), Some(current)) => Ok(WatermarkOutcome::Stale { current }),
                _ => Err(StoreError::Corrupt(format!(
                    "unexpected watermark reply {reply:?}"
                ))),
            }
        })
        .await
    }
}

/// A claim waiting for its partition's next claim script.
pub(super) struct ClaimCall {
    key: KeyHash,
    lease_ms: u64,
    fingerprint: Option<Fingerprint>,
}

impl ClaimCall {
    /// A claim of `key` for `lease_ms`, naming no payload.
    pub(super) fn new(key: KeyHash, lease_ms: u64) -> Self {
        Self {
            key,
            lease_ms,
            fingerprint: None,
        }
    }
}

impl<C: Clock> Batch<C> for ClaimCall {
    type Reply = Claim;

    fn gather(inner: &Inner<C>, partition: u16) -> &Gather<Self, Claim> {
        &inner.claims[usize::from(partition)]
    }

    async fn run(
        inner: &Inner<C>,
        conn: &mut Conn,
        partition: u16,
        calls: &[Self],
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        let mut script = inner.scripts.claim.prepare_invoke();
        let now_ms = inner.clock.now_ms();
        script
            .key(inner.tokens(partition))
            .key(inner.counts(partition))
            .arg(now_ms)
            .arg(TTL_SLACK_MS);
        for call in calls {
            script
                .key(inner.record_key(&call.key, partition))
                .arg(call.lease_ms)
                // Empty for none: a fingerprint is always 16 bytes.
                .arg(call.fingerprint.as_ref().map_or(&[][..], |f| &f.0[..]));
        }
        let reply: Value = script.invoke_async(conn).await.map_err(from_redis)?;
        Ok(one_each(reply, calls.len())?
            .into_iter()
            .zip(calls)
            .map(|(reply, call)| {
                claim_of(
                    reply,
                    call.key,
                    partition,
                    now_ms.saturating_add(call.lease_ms),
                )
            })
            .collect())
    }
}

/// One claim's answer in the claim script's reply: a grant is its token (negated for a
/// takeover), whose lease ends at `until_ms` (the script's now plus the lease).
fn claim_of(
    reply: Value,
    key: KeyHash,
    partition: u16,
    until_ms: u64,
) -> Result<Claim, StoreError> {
    if let Value::Int(granted) = reply {
        let lease = |token: u64| Lease {
            key,
            partition,
            token: FencingToken(token),
            until_ms,
        };
        return match granted {
            1.. => Ok(Claim::Acquired(lease(granted.unsigned_abs()))),
            ..0 => Ok(Claim::TookOver(lease(granted.unsigned_abs()))),
            0 => Err(StoreError::Corrupt(
                "unexpected claim reply: token 0 (tokens start at 1)".to_owned(),
            )),
        };
    }
    let reply = array(reply)?;
    let unexpected = || StoreError::Corrupt(format!("unexpected claim reply {reply:?}"));
    match reply.first().and_then(text) {
        Some("inflight") => Ok(Claim::InFlight {
            until_ms: reply.get(1).and_then(int).unwrap_or(0),
        }),
        Some("conflict") => Ok(Claim::Conflict),
        Some("done") => Ok(Claim::Done {
            outcome: match reply.get(1) {
                Some(Value::BulkString(bytes)) => Some(Bytes::from(bytes.clone())),
                _ => None,
            },
        }),
        _ => Err(unexpected()),
    }
}

/// A completion (with its queue entry's ack) waiting for its partition's next script.
pub(super) struct CompleteCall {
    lease: Lease,
    retention_ms: u64,
    outcome: Option<Bytes>,
    seq: u64,
}

impl<C: Clock> Batch<C> for CompleteCall {
    type Reply = FenceCheck;

    fn gather(inner: &Inner<C>, partition: u16) -> &Gather<Self, FenceCheck> {
        &inner.completions[usize::from(partition)]
    }

    async fn run(
        inner: &Inner<C>,
        conn: &mut Conn,
        partition: u16,
        calls: &[Self],
    ) -> Result<Vec<Result<FenceCheck, StoreError>>, StoreError> {
        let mut script = inner.scripts.complete_ack.prepare_invoke();
        let now_ms = inner.clock.now_ms();
        script
            .key(inner.stream(partition))
            .key(inner.attempts(partition))
            .key(inner.owner(partition))
            .arg(now_ms)
            .arg(TTL_SLACK_MS)
            .arg(GROUP)
            .arg(&inner.instance)
            .arg(inner.epoch(partition).await);
        for call in calls {
            script
                .key(inner.record_key(&call.lease.key, partition))
                .arg(call.lease.token.0)
                .arg(call.retention_ms)
                .arg(call.seq)
                .arg(outcome_arg(call.outcome.as_deref()))
                .arg(if lean_epoch(call.lease.token).is_some() {
                    "1"
                } else {
                    "0"
                });
        }
        let reply: Value = script.invoke_async(conn).await.map_err(from_redis)?;
        let applied = one_each(reply, calls.len())?;
        // Acked and removed in Redis whatever the fences said (or left to the partition's new
        // owner): out of this instance's hand-out order either way, under one lock for the
        // batch.
        if let Some(queue) = inner.queues.get(usize::from(partition)) {
            let mut queue = queue.lock().await;
            for call in calls {
                queue.order.remove(call.seq);
            }
        }
        Ok(applied
            .iter()
            .zip(calls)
            .map(|(applied, call)| match int(applied) {
                Some(0) => Ok(FenceCheck::Rejected),
                Some(code) => {
                    // The completed record joins the counts, the one it replaced leaves them.
                    let ends = now_ms.saturating_add(call.retention_ms) / 60_000;
                    let tallies = &inner.tallies;
                    tallies.add(
                        partition,
                        oncegate_core::live_counts::Counted::Completed,
                        ends,
                        1,
                    );
                    if let Some((state, minute)) = counted::replaced(code) {
                        tallies.add(partition, state, minute, -1);
                    }
                    Ok(FenceCheck::Accepted)
                }
                None => Err(StoreError::Corrupt(format!(
                    "unexpected complete reply {applied:?}"
                ))),
            })
            .collect())
    }
}
