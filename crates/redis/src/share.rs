//! Many gateways on one Redis: who is alive, each one's fair share of the partitions, handing
//! partitions over, and leaving.
//!
//! Every instance that pulls says it is alive on its pulls (a sorted set scored by expiry,
//! `lua/members.lua`) and learns who else is: a round every `balance_every` renews what it owns,
//! and between rounds a heartbeat alone (every tenth of that) notices a member that joined or
//! left, which starts a round at once; while shares move, rounds come every twentieth. With `n` live
//! gateways sorted by name, the one at rank `r` owns `partitions / n` partitions, and one more
//! when `r < partitions % n`. Under its share it takes free partitions (nobody's, or an owner's
//! that ran out) under a new epoch; over it, it stops handing out the excess, waits until the
//! events it handed out there are settled, and only then releases them — so the next owner's
//! first hand-out of a chat comes after this owner's last handler of it ended. A gateway that
//! stops releases everything at once (`leave`); one that is killed loses its partitions and its
//! membership together, `ownership` after its last heartbeat.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::*;

/// This instance's view of the membership, from its last balancing round.
#[derive(Default)]
pub(super) struct Share {
    /// When the last round's heartbeat was sent.
    last: Option<Instant>,
    /// When the last heartbeat was sent, a round's or one between rounds.
    beat: Option<Instant>,
    /// The live members the last heartbeat named, sorted.
    members: Vec<String>,
    /// Whether the last round left this instance at its share with nothing being handed over.
    settled: bool,
}

/// How often an instance says it is alive and rebalances: often enough that a newcomer gets its
/// share and a handover completes within a second or two, rarely enough to cost Redis nothing
/// (a few small scripts a round).
pub(super) fn balance_every(ownership: Duration) -> Duration {
    (ownership / 10).clamp(Duration::from_millis(20), Duration::from_secs(1))
}

/// Between rounds, how often a heartbeat alone asks who is alive: a join or a leave starts a
/// round within it (one small script, instead of a round's one per partition owned).
pub(super) fn beat_every(balance_every: Duration) -> Duration {
    (balance_every / 10).max(Duration::from_millis(20))
}

/// How often rounds come while this instance's share is not settled (it waits for free
/// partitions, or hands some over): a handover then completes in a few of these, not in rounds.
pub(super) fn settle_every(balance_every: Duration) -> Duration {
    (balance_every / 20).max(Duration::from_millis(20))
}

/// How many of `partitions` the gateway at `rank` among `members` live ones owns.
pub(super) fn fair_share(partitions: u16, members: usize, rank: usize) -> usize {
    let partitions = usize::from(partitions);
    let members = members.max(1);
    partitions / members + usize::from(rank < partitions % members)
}

/// What `lua/own.lua` answered.
enum Own {
    /// Renewed or released: it was ours under the epoch named.
    Done,
    /// Newly ours, under this epoch; the entries of an owner whose ownership ran out wait
    /// this many ms (its lean hand-outs may still run).
    Taken(u64, u64),
    /// Not ours (someone else's, or ours under another epoch).
    Refused,
}

impl<C: Clock> Inner<C> {
    async fn own_call(
        &self,
        conn: &mut Conn,
        partition: u16,
        op: &str,
        epoch: u64,
    ) -> Result<Own, StoreError> {
        let reply: Value = self
            .scripts
            .own
            .key(self.owner(partition))
            .key(self.tokens(partition))
            .arg(op)
            .arg(&self.instance)
            .arg(epoch)
            .arg(self.ownership_ms)
            .invoke_async(conn)
            .await
            .map_err(from_redis)?;
        let reply = array(reply)?;
        match (reply.first().and_then(int), reply.get(1).and_then(int)) {
            (Some(1), _) => Ok(Own::Done),
            (Some(2), Some(epoch)) => {
                Ok(Own::Taken(epoch, reply.get(2).and_then(int).unwrap_or(0)))
            }
            (Some(0), _) => Ok(Own::Refused),
            _ => Err(StoreError::Corrupt(format!(
                "unexpected ownership reply {reply:?}"
            ))),
        }
    }

    /// Says this instance is alive (or, `leaving`, that it is gone): the live members' names.
    async fn heartbeat(&self, conn: &mut Conn, leaving: bool) -> Result<Vec<String>, StoreError> {
        self.scripts
            .members
            .key(self.members())
            .arg(&self.instance)
            .arg(self.ownership_ms)
            .arg(u8::from(leaving))
            .invoke_async(conn)
            .await
            .map_err(from_redis)
    }

    /// Runs a balancing round when one is due. The first round is waited for (a store's first
    /// pull hands out what it owns after it); later pulls go on while another runs one.
    pub(super) async fn balance_if_due(&self, conn: &mut Conn) -> Result<(), StoreError> {
        if self.left.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut share = if self.joined.load(Ordering::Acquire) {
            match self.share.try_lock() {
                Ok(share) => share,
                Err(_) => return Ok(()),
            }
        } else {
            self.share.lock().await
        };
        if self.left.load(Ordering::Acquire) {
            return Ok(());
        }
        let every = if share.settled {
            self.balance_every
        } else {
            settle_every(self.balance_every)
        };
        if share.last.is_none_or(|at| at.elapsed() >= every) {
            self.balance(conn, &mut share, None).await?;
        } else if share
            .beat
            .is_some_and(|at| at.elapsed() >= beat_every(self.balance_every))
        {
            let sent = Instant::now();
            let members = self.members_now(conn).await?;
            share.beat = Some(sent);
            if members != share.members {
                self.balance(conn, &mut share, Some((sent, members)))
                    .await?;
            }
        }
        self.joined.store(true, Ordering::Release);
        Ok(())
    }

    /// The heartbeat's answer, sorted (ranks are positions in it).
    async fn members_now(&self, conn: &mut Conn) -> Result<Vec<String>, StoreError> {
        let mut members = self.heartbeat(conn, false).await?;
        members.sort_unstable();
        Ok(members)
    }

    /// One round: the heartbeat (or the one `beat` just sent), then renewals, releases of
    /// drained partitions, and takes or hand-overs towards this instance's share.
    async fn balance(
        &self,
        conn: &mut Conn,
        share: &mut Share,
        beat: Option<(Instant, Vec<String>)>,
    ) -> Result<(), StoreError> {
        let (sent, members) = match beat {
            Some(beat) => beat,
            None => (Instant::now(), self.members_now(conn).await?),
        };
        let rank = members
            .iter()
            .position(|member| *member == self.instance)
            .unwrap_or(members.len());
        let target = fair_share(self.partitions, members.len(), rank);
        metrics::gauge!("oncegate_gateways_live").set(members.len() as f64);
        let mut kept = 0usize;
        let mut draining = Vec::new();
        for partition in 0..self.partitions {
            let mut queue = self.queues[usize::from(partition)].lock().await;
            if !queue.owned {
                continue;
            }
            // Handed over once its handed-out events are settled, or after `handover` at the
            // latest: a handler still running then keeps its key's claim, so the next owner
            // waits for it all the same (then only that chat waits, for the claim's lease).
            if queue.draining.is_some_and(|since| {
                queue.order.in_flight() == 0 || since.elapsed() >= self.handover
            }) {
                self.give_up(conn, partition, &mut queue).await?;
                continue;
            }
            match self.own_call(conn, partition, "renew", queue.epoch).await? {
                Own::Done => {
                    queue.renewed = Some(sent);
                    let _ = self.publish_groups(conn, partition, &mut queue, true).await;
                    // Its lean leases must outlive a lost ownership once they run long.
                    self.claim_lean(conn, partition, &mut queue, Some(self.lean_for()))
                        .await?;
                    if queue.draining.is_some() {
                        draining.push(partition);
                    } else {
                        kept += 1;
                    }
                }
                Own::Taken(..) | Own::Refused => {
                    tracing::warn!(
                        partition,
                        "partition lost: its ownership ran out before this gateway renewed it; its events go to the next owner"
                    );
                    metrics::counter!("oncegate_partition_handoffs_total", "direction" => "lost")
                        .increment(1);
                    queue.forget();
                }
            }
        }
        // Partitions still being handed over after this round.
        let mut handing_over = 0;
        if kept < target {
            // Keep what is being handed over before taking anything new.
            for partition in draining {
                let mut queue = self.queues[usize::from(partition)].lock().await;
                if kept < target && queue.owned && queue.draining.take().is_some() {
                    kept += 1;
                } else if queue.owned && queue.draining.is_some() {
                    handing_over += 1;
                }
            }
            if kept < target {
                kept += self.take(conn, target - kept, rank, members.len()).await?;
            }
        } else if kept > target {
            handing_over += draining.len();
            // Those with the fewest handed-out events first: they can go at once.
            let mut candidates = Vec::with_capacity(kept);
            for partition in 0..self.partitions {
                let queue = self.queues[usize::from(partition)].lock().await;
                if queue.owned && queue.draining.is_none() {
                    candidates.push((queue.order.in_flight(), std::cmp::Reverse(partition)));
                }
            }
            candidates.sort_unstable();
            let mut excess = kept - target;
            for (_, std::cmp::Reverse(partition)) in candidates {
                if excess == 0 {
                    break;
                }
                let mut queue = self.queues[usize::from(partition)].lock().await;
                if !queue.owned || queue.draining.is_some() {
                    continue;
                }
                queue.draining = Some(Instant::now());
                excess -= 1;
                kept -= 1;
                if queue.order.in_flight() == 0 {
                    self.give_up(conn, partition, &mut queue).await?;
                } else {
                    handing_over += 1;
                }
            }
        } else {
            handing_over += draining.len();
        }
        metrics::gauge!("oncegate_partitions_owned", "gateway" => self.instance.clone())
            .set(kept as f64);
        share.last = Some(sent);
        share.beat = Some(sent);
        share.settled = kept == target && handing_over == 0;
        share.members = members;
        Ok(())
    }

    /// Takes up to `wanted` free partitions, starting where this rank's share would begin so
    /// that newcomers try different ones first; how many it took.
    async fn take(
        &self,
        conn: &mut Conn,
        wanted: usize,
        rank: usize,
        members: usize,
    ) -> Result<usize, StoreError> {
        let partitions = usize::from(self.partitions);
        let start = partitions * rank.min(members) / members.max(1);
        let mut taken = 0;
        for i in 0..partitions {
            if taken == wanted {
                break;
            }
            let partition = ((start + i) % partitions) as u16;
            let mut queue = self.queues[usize::from(partition)].lock().await;
            if queue.owned {
                continue;
            }
            let sent = Instant::now();
            if let Own::Taken(epoch, held) = self.own_call(conn, partition, "take", 0).await? {
                queue.forget();
                queue.owned = true;
                queue.epoch = epoch;
                queue.hold_until_ms = self.clock.now_ms().saturating_add(held);
                queue.renewed = Some(sent);
                // What earlier owners were handed and never acked comes out first.
                queue.reclaim = true;
                taken += 1;
                metrics::counter!("oncegate_partition_handoffs_total", "direction" => "in")
                    .increment(1);
            }
        }
        Ok(taken)
    }

    /// Releases a partition this instance owns (its handed-out events settled).
    async fn give_up(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
    ) -> Result<(), StoreError> {
        // Handlers still running keep their events through claims of their own: the next owner
        // finds them in flight instead of running them again.
        self.claim_lean(conn, partition, queue, None).await?;
        // Refused: it was not ours anymore; forgotten all the same.
        let _ = self
            .own_call(conn, partition, "release", queue.epoch)
            .await?;
        if let Some(since) = queue.draining {
            metrics::histogram!("oncegate_partition_handoff_seconds")
                .record(since.elapsed().as_secs_f64());
        }
        metrics::counter!("oncegate_partition_handoffs_total", "direction" => "out").increment(1);
        queue.forget();
        Ok(())
    }

    /// Gives up every partition and the membership: the other gateways take over at their next
    /// round instead of after the ownership runs out. Nothing is taken afterwards.
    pub(super) async fn leave(&self, conn: &mut Conn) -> Result<(), StoreError> {
        self.left.store(true, Ordering::Release);
        let _share = self.share.lock().await;
        let mut failed = None;
        for partition in 0..self.partitions {
            let mut queue = self.queues[usize::from(partition)].lock().await;
            if queue.owned
                && let Err(error) = self.give_up(conn, partition, &mut queue).await
            {
                failed.get_or_insert(error);
                queue.forget();
            }
        }
        if let Err(error) = self.heartbeat(conn, true).await {
            failed.get_or_insert(error);
        }
        metrics::gauge!("oncegate_partitions_owned", "gateway" => self.instance.clone()).set(0.0);
        failed.map_or(Ok(()), Err)
    }

    /// Every partition's owner as Redis has it, with what this instance knows of its own.
    pub(super) async fn owners(&self, conn: &mut Conn) -> Result<Vec<PartitionOwner>, StoreError> {
        let mut commands = vec![redis::cmd("TIME")];
        for partition in 0..self.partitions {
            let mut get = redis::cmd("GET");
            get.arg(self.owner(partition));
            commands.push(get);
        }
        let replies = conn.each(commands).await.map_err(from_redis)?;
        let mut replies = replies.into_iter();
        let now_ms = match replies.next().map(array).transpose()?.as_deref() {
            Some([secs, micros]) => int(secs).unwrap_or(0) * 1000 + int(micros).unwrap_or(0) / 1000,
            _ => return Err(StoreError::Corrupt("unexpected TIME reply".into())),
        };
        let mut owners = Vec::with_capacity(usize::from(self.partitions));
        for (partition, record) in (0..self.partitions).zip(replies) {
            let (gateway, epoch) = match text(&record).and_then(parse_owner) {
                Some((expires, epoch, gateway)) if now_ms < expires => (Some(gateway), epoch),
                _ => (None, 0),
            };
            let queue = self.queues[usize::from(partition)].lock().await;
            owners.push(PartitionOwner {
                partition,
                here: gateway.as_deref() == Some(self.instance.as_str()),
                handing_over: queue.owned && queue.draining.is_some(),
                gateway,
                epoch,
            });
        }
        Ok(owners)
    }

    /// How long a lean lease goes without a claim of its own: half the ownership, so that a
    /// round (every tenth of it at most) makes it one well before a lost ownership could let
    /// another owner take the partition.
    pub(super) fn lean_for(&self) -> Duration {
        Duration::from_millis(self.ownership_ms / 2)
    }

    /// The epoch this instance owns `partition` under (0 when it does not).
    pub(super) async fn epoch(&self, partition: u16) -> u64 {
        match self.queues.get(usize::from(partition)) {
            Some(queue) => queue.lock().await.epoch,
            None => 0,
        }
    }
}

/// An owner record (`lua/own.lua`): expiry (server ms), epoch, owner.
fn parse_owner(record: &str) -> Option<(u64, u64, String)> {
    let mut parts = record.splitn(3, ',');
    let expires = parts.next()?.parse().ok()?;
    let epoch = parts.next()?.parse().ok()?;
    Some((expires, epoch, parts.next()?.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shares add up to the partitions, differ by at most one, and the larger ones go to the
    /// first ranks; a gateway missing from the list (it just left) gets the smaller share.
    #[test]
    fn fair_shares_add_up() {
        for partitions in [1u16, 2, 7, 16, 64, 1000] {
            for members in 1..=20usize {
                let shares: Vec<usize> = (0..members)
                    .map(|rank| fair_share(partitions, members, rank))
                    .collect();
                assert_eq!(shares.iter().sum::<usize>(), usize::from(partitions));
                let (min, max) = (shares.iter().min(), shares.iter().max());
                assert!(max.zip(min).is_some_and(|(max, min)| max - min <= 1));
                assert!(shares.windows(2).all(|pair| pair[0] >= pair[1]));
            }
        }
        assert_eq!(fair_share(16, 3, 0), 6);
        assert_eq!(fair_share(16, 3, 2), 5);
        assert_eq!(fair_share(16, 3, 3), 5);
        assert_eq!(fair_share(16, 0, 0), 16);
    }

    #[test]
    fn owner_records_parse_as_the_script_writes_them() {
        assert_eq!(
            parse_owner("1700000000000,1700000000000123,0123abcd"),
            Some((
                1_700_000_000_000,
                1_700_000_000_000_123,
                "0123abcd".to_owned()
            ))
        );
        assert_eq!(parse_owner("12,3,a,b"), Some((12, 3, "a,b".to_owned())));
        assert_eq!(parse_owner("12,x,a"), None);
        assert_eq!(parse_owner("12"), None);
    }

    #[test]
    fn beats_and_unsettled_rounds_come_between_rounds() {
        let every = balance_every(Duration::from_secs(10));
        assert_eq!(beat_every(every), Duration::from_millis(100));
        assert_eq!(settle_every(every), Duration::from_millis(50));
        assert_eq!(
            beat_every(Duration::from_millis(20)),
            Duration::from_millis(20)
        );
        assert_eq!(
            settle_every(Duration::from_millis(20)),
            Duration::from_millis(20)
        );
    }

    #[test]
    fn rounds_come_often_but_not_too_often() {
        assert_eq!(
            balance_every(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            balance_every(Duration::from_millis(300)),
            Duration::from_millis(30)
        );
        assert_eq!(
            balance_every(Duration::from_millis(10)),
            Duration::from_millis(20)
        );
    }
}
