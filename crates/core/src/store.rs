//! The store contract: one trait per capability, every backend implements all of them.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::event::Event;
use crate::key::KeyHash;
use crate::record::{
    Admission, Claim, DeadLetter, Delivery, FenceCheck, Fingerprint, Lease, Nonce, PartitionOwner,
    QueueId, QueueSummary, QueuedEvent, Record, StoreStats, WatermarkOutcome,
};
use crate::state::StateStore;

/// Why a store could not answer. Every variant means "nothing was changed".
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or written right now; the caller should retry later (an
    /// ingress answers 503 so that the platform retries).
    #[error("store unavailable: {0}; retry later, nothing was recorded")]
    Unavailable(String),
    /// A size bound is reached and nothing can be evicted (every record is being processed).
    #[error(
        "store full: {limit} records, all of them in processing; raise max_records or add workers"
    )]
    Full {
        /// The configured bound.
        limit: u64,
    },
    /// The call's arguments cannot be honoured.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Stored data could not be read back; the file or server holds something this version did
    /// not write.
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
}

/// Dedup and lease state: the part of the store that makes effects happen once.
///
/// Records live in partitions: `admit` puts every key of an event in the event's partition
/// (its order key's), so that one Redis Cluster slot holds all of an event's state. `claim` and
/// `record` name the partition: a queued event's is its `Delivery`'s `id.partition`; a business
/// key that no event brought in uses `KeyHash::home`. The same key in two partitions is two
/// records, in every backend alike.
pub trait DedupStore: Send + Sync + 'static {
    /// One atomic step: if any of `keys` was seen within its retention, answer `Duplicate` and
    /// change nothing; otherwise mark every key seen for `retention` and queue `event`.
    /// The first key is the one the dispatcher claims. `keys` must not be empty.
    fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send;

    /// `admit`, after checking that `nonce` was not handled already; the nonce is remembered
    /// whenever the event is admitted or a duplicate. A store shared by several gateways
    /// overrides this so that a replay sent to another gateway is refused too; a store owned by
    /// one gateway leaves nonces to that gateway's own replay guard.
    fn admit_with_nonce(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
        nonce: Option<Nonce>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        let _ = nonce;
        self.admit(event, keys, retention)
    }

    /// Takes the key's record in `partition` for `lease`, unless someone holds it or it is done.
    fn claim(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        self.claim_with_fingerprint(key, partition, lease, None)
    }

    /// `claim`, for the payload `fingerprint` names: a live record claimed before for another
    /// payload answers `Conflict`; a record without one takes this one
    /// (`transition::claim` has the rule).
    fn claim_with_fingerprint(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Extends the holder's lease to now + `extend`.
    fn renew(
        &self,
        lease: &Lease,
        extend: Duration,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;

    /// Marks the key done with `outcome`, kept for `retention`; a journaled store answers once
    /// the change is durable.
    fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;

    /// Gives the key back (`Processing → Pending`) so that a later claim can take it.
    fn release(&self, lease: &Lease)
    -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;

    /// One key's live record in `partition`, for operators.
    fn record(
        &self,
        key: &KeyHash,
        partition: u16,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Counts by state, for operators and metrics.
    fn stats(&self) -> impl Future<Output = Result<StoreStats, StoreError>> + Send;

    /// Events in the queue, handed-out ones included: for backpressure and the depth gauge,
    /// so backends whose `stats` is not cheap override it.
    fn queued(&self) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async move { self.stats().await.map(|stats| stats.queued) }
    }

    /// Whether the store answers right now: cheap, for readiness probes.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move { self.stats().await.map(|_| ()) }
    }

    /// Why the store cannot go on in this process (the embedded journal failed to write, e.g.
    /// a full disk: every later answer would be refused); `None` while it can. The gateway
    /// then stops with the reason, for a supervisor to start it again once the cause is fixed
    /// (the journal keeps what was acknowledged). Wrappers must forward it.
    fn broken(&self) -> Option<String> {
        None
    }

    /// What the store keeps of what it acknowledged, as it last found out (no call to a
    /// server): for the start-up log, `/readyz` and the durability gauge. A store that does
    /// not say is reported as keeping nothing.
    fn durability(&self) -> crate::Durability {
        crate::Durability {
            mode: "unstated",
            holds: true,
            detail: "this store does not say what it keeps".into(),
            at_risk: Some("unknown: the store does not say what survives a crash".into()),
        }
    }

    /// `complete`, then ack the handed-out queue entry `id` whatever the fence said (the entry
    /// was handed to this caller). Backends that can do both in one step override it: one write
    /// instead of two, and no moment where the key is done but its event still queued.
    ///
    /// The dispatcher's step, so unlike `complete` it may answer before the change is durable:
    /// a journaled store makes it durable with its next group commit and in order (no change
    /// made after it is durable without it), so a crash can only run the last handlers once
    /// more, in queue order and with their idempotency keys.
    fn complete_and_ack(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
        id: QueueId,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send
    where
        Self: EventQueue + Sized,
    {
        async move {
            let fence = self.complete(lease, retention, outcome).await?;
            self.ack(id).await?;
            Ok(fence)
        }
    }
}

/// A handed-out event with its key's claim (see [`EventQueue::pull_claimed`]).
pub type ClaimedDelivery = (Delivery, Result<Claim, StoreError>);

/// The dispatcher's view of each group's load, shared with the store's ranked pulls.
pub type Loads = std::sync::Arc<dyn crate::GroupLoad>;

/// Claims each pulled event's key for `lease`, as the default `pull_claimed` does.
async fn claim_each<S: DedupStore>(
    store: &S,
    pulled: Vec<Delivery>,
    lease: Duration,
) -> Vec<ClaimedDelivery> {
    let mut claimed = Vec::with_capacity(pulled.len());
    for delivery in pulled {
        let claim = store
            .claim(&delivery.key, delivery.id.partition, lease)
            .await;
        claimed.push((delivery, claim));
    }
    claimed
}

/// The durable queue of admitted events, split into partitions by order key.
pub trait EventQueue: Send + Sync + 'static {
    /// How many partitions the queue has.
    fn partitions(&self) -> u16;

    /// Hands out up to `max` ready events of `partition` in queue order. An event is held back
    /// while an earlier event with the same order key is handed out or waiting for a retry, so
    /// per-key order holds however many workers pull.
    fn pull(
        &self,
        partition: u16,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivery>, StoreError>> + Send;

    /// `pull`, and each handed-out event's key claimed for `lease` (as `claim` would, with no
    /// fingerprint; the lease runs from the hand-out). A claim that failed is that event's
    /// error: the event is handed out all the same and must be retried or acked. Backends that
    /// can claim in the hand-out's own round trip override it; one whose hand-outs are fenced
    /// by partition ownership may grant a lease it wrote nothing for (Redis's lean hand-outs),
    /// as long as the lease renews, completes and releases as a claim's would.
    fn pull_claimed(
        &self,
        partition: u16,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<ClaimedDelivery>, StoreError>> + Send
    where
        Self: DedupStore + Sized,
    {
        async move {
            let pulled = self.pull(partition, max).await?;
            Ok(claim_each(self, pulled, lease).await)
        }
    }

    /// `pull`, each hand-out to the group `load` finds least busy across the dispatcher (see
    /// [`PartitionIndex::take_ranked`](crate::queue_index::PartitionIndex::take_ranked)); a
    /// group `load` holds back gets none. A backend that cannot rank pulls in its own order.
    fn pull_ranked(
        &self,
        partition: u16,
        max: usize,
        load: &Loads,
    ) -> impl Future<Output = Result<Vec<Delivery>, StoreError>> + Send {
        let _ = load;
        self.pull(partition, max)
    }

    /// `pull_claimed`, ranked as [`pull_ranked`](Self::pull_ranked) ranks.
    fn pull_claimed_ranked(
        &self,
        partition: u16,
        max: usize,
        lease: Duration,
        load: &Loads,
    ) -> impl Future<Output = Result<Vec<ClaimedDelivery>, StoreError>> + Send
    where
        Self: DedupStore + Sized,
    {
        async move {
            let pulled = self.pull_ranked(partition, max, load).await?;
            Ok(claim_each(self, pulled, lease).await)
        }
    }

    /// The group (tenant, [`Event::group_hash`](crate::Event::group_hash)) of the event a
    /// ranked pull of `partition` would hand out now, and whether it goes first in its group;
    /// `None` when it would hand out none: what a dispatcher gives a free handler to first. A
    /// backend that cannot tell answers group 0 (something may be ready, of no group known).
    fn next_group(
        &self,
        partition: u16,
        load: &Loads,
    ) -> impl Future<Output = Result<Option<crate::queue_index::Next>, StoreError>> + Send {
        let _ = (partition, load);
        async { Ok(Some(crate::queue_index::Next::of(0))) }
    }

    /// Events of `group` (a tenant, [`Event::group_hash`](crate::Event::group_hash)) in the
    /// queue, handed out or not; `None` when the backend cannot count them. Read for each
    /// tenant at most every 100 ms or so (a per-tenant queue bound): it may cost a read of
    /// each partition.
    fn group_queued(
        &self,
        group: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send {
        let _ = group;
        async { Ok(None) }
    }

    /// The `max` tenants (groups) with the most events in the queue, most first, each with
    /// its count; `None` when the backend cannot count them. For views polled every few
    /// seconds: its cost grows with the tenants that have events queued, not with the events.
    fn busiest_groups(
        &self,
        max: usize,
    ) -> impl Future<Output = Result<Option<Vec<(u64, u64)>>, StoreError>> + Send {
        let _ = max;
        async { Ok(None) }
    }

    /// Hands the events `rule` names out before the rest of their group's waiting events in
    /// each partition (never before an earlier event of their chain; see
    /// [`PartitionIndex::mark_first`](crate::queue_index::PartitionIndex::mark_first)). Set
    /// once, before the first pull: events queued already are ranked by it too, and a second
    /// rule is refused. A backend that does not rank ignores it.
    fn put_first(
        &self,
        rule: std::sync::Arc<dyn crate::Precedence>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = rule;
        async { Ok(()) }
    }

    /// Removes a handled event. `false`: no such event was handed out.
    fn ack(&self, id: QueueId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Puts a handed-out event back, not to be handed out before `not_before_ms`.
    fn retry(
        &self,
        id: QueueId,
        not_before_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Moves a handed-out event to the dead letters with `reason`.
    fn dead_letter(
        &self,
        id: QueueId,
        reason: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The oldest `limit` dead letters.
    fn dead_letters(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, StoreError>> + Send;

    /// How many dead letters the store keeps, for the status page and the gauge that sample it
    /// every few seconds: it must stay cheap however many there are (a count the backend keeps,
    /// never a scan).
    fn dead_letter_count(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Puts dead letter `id` back at the end of its partition's queue with its key and event,
    /// attempts counted from 0 again: its new queue id, or `None` when there is no such dead
    /// letter (replayed or purged already — two replays never queue it twice).
    fn replay_dead_letter(
        &self,
        id: QueueId,
    ) -> impl Future<Output = Result<Option<QueueId>, StoreError>> + Send;

    /// Removes dead letter `id` for good; `false` when there is none.
    fn purge_dead_letter(
        &self,
        id: QueueId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives up this instance's part in a queue that several gateways share — its partitions
    /// and its membership — so that the others take over at once instead of when its ownership
    /// runs out: for a gateway that stops, after its handlers finished or were handed back.
    /// Nothing is handed out by this instance afterwards. A store of one gateway has nothing to
    /// give up.
    fn leave(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// Who owns each partition, on a store that several gateways share; empty for a store of
    /// one gateway (it hands out every partition itself). For operators: a few reads.
    fn owners(&self) -> impl Future<Output = Result<Vec<PartitionOwner>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// `partition`'s depth, handed-out count, bytes and oldest event: for the per-partition
    /// gauges, so it must stay cheap however long the queue is.
    fn queue_summary(
        &self,
        partition: u16,
    ) -> impl Future<Output = Result<QueueSummary, StoreError>> + Send;

    /// Up to `limit` events of `partition` in queue order, from the first whose seq is above
    /// `after` (all when `None`): for operators.
    fn queued_events(
        &self,
        partition: u16,
        after: Option<u64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<QueuedEvent>, StoreError>> + Send;
}

/// Per-order-key watermarks that only move upwards.
pub trait WatermarkStore: Send + Sync + 'static {
    /// Accepts `value` if it is not older than the scope's mark (and raises the mark), else
    /// answers `Stale`. The mark is kept for `retention` after its last change.
    fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> impl Future<Output = Result<WatermarkOutcome, StoreError>> + Send;
}

/// Rate budgets by bucket (an app, a chat, a user): shared by every gateway of a shared store,
/// process-local in the others (`rates::LocalRates`).
pub trait RateStore: Send + Sync + 'static {
    /// Takes one call from `bucket` under `rate`, or says how long to wait (nothing taken).
    fn take_rate(
        &self,
        bucket: &KeyHash,
        rate: crate::rates::Rate,
    ) -> impl Future<Output = Result<crate::rates::RateVerdict, StoreError>> + Send;

    /// Changes `bucket` as `adjust` says: a call given back, or a block the platform asked for,
    /// seen by every gateway that shares the bucket.
    fn adjust_rate(
        &self,
        bucket: &KeyHash,
        adjust: crate::rates::RateAdjust,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A complete backend.
pub trait Store: DedupStore + EventQueue + WatermarkStore + RateStore + StateStore {}

impl<T: DedupStore + EventQueue + WatermarkStore + RateStore + StateStore> Store for T {}

/// The `max` largest of `counts` (group, events) summed by group, most first: what
/// [`EventQueue::busiest_groups`] answers from per-partition counts.
pub fn busiest(counts: impl IntoIterator<Item = (u64, u64)>, max: usize) -> Vec<(u64, u64)> {
    let mut summed: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for (group, events) in counts {
        *summed.entry(group).or_default() += events;
    }
    let mut busiest: Vec<(u64, u64)> = summed.into_iter().collect();
    busiest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    busiest.truncate(max);
    busiest
}

/// The check every backend's `admit` starts with: at least one key.
pub fn require_keys(keys: &[KeyHash]) -> Result<(), StoreError> {
    if keys.is_empty() {
        Err(StoreError::Invalid(
            "admit needs at least one dedup key".into(),
        ))
    } else {
        Ok(())
    }
}

/// The check of every partition a caller names: the store has it.
pub fn require_partition(partition: u16, partitions: u16) -> Result<(), StoreError> {
    if partition < partitions {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "no partition {partition}: the store has {partitions}"
        )))
    }
}

/// Milliseconds of a duration, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
