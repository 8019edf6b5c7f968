//! The store as the gateway calls it: every call timed into `oncegate_store_seconds{op}`, every
//! refusal counted in `oncegate_store_errors_total{op}` and every claim that took over an
//! expired lease in `oncegate_lease_expiries_total`, in this one place instead of at each of the
//! dispatcher's, ingress's, the APIs' and the long connections' call sites.

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use metrics::{Counter, Histogram};
use oncegate_core::{
    Admission, Claim, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck, Fingerprint,
    KeyHash, Lease, Loads, Nonce, QueueId, QueueSummary, QueuedEvent, Rate, RateStore, RateVerdict,
    Record, Store, StoreError, StoreStats, WatermarkOutcome, WatermarkStore,
};

use crate::base::at_rest::{AtRest, Place};
use crate::base::meters::ByLabel;

/// The store calls told apart, in `OPS`' order.
#[derive(Debug, Clone, Copy)]
enum Op {
    Admit,
    Claim,
    Renew,
    Complete,
    Release,
    Record,
    Stats,
    Queued,
    Ping,
    Pull,
    Ack,
    Retry,
    DeadLetter,
    DeadLetters,
    DeadLetterCount,
    Replay,
    Purge,
    QueueSummary,
    QueuedEvents,
    Watermark,
    Rate,
    State,
}

const OPS: [&str; 22] = [
    "admit",
    "claim",
    "renew",
    "complete",
    "release",
    "record",
    "stats",
    "queued",
    "ping",
    "pull",
    "ack",
    "retry",
    "dead_letter",
    "dead_letters",
    "dead_letter_count",
    "replay",
    "purge",
    "queue_summary",
    "queued_events",
    "watermark",
    "rate",
    "state",
];

/// A store whose calls are measured (and whose payloads, results and shared values are sealed
/// at rest when `[store.encryption]` is set: this is the one way the gateway reaches its store).
pub(crate) struct Timed<S> {
    pub(crate) inner: S,
    at_rest: OnceLock<std::sync::Arc<AtRest>>,
    seconds: [OnceLock<Histogram>; OPS.len()],
    errors: ByLabel<{ OPS.len() }>,
    expiries: OnceLock<Counter>,
}

impl<S> Timed<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            at_rest: OnceLock::new(),
            seconds: [const { OnceLock::new() }; OPS.len()],
            errors: ByLabel::new("oncegate_store_errors_total", "op", OPS),
            expiries: OnceLock::new(),
        }
    }

    /// Seals values with `at_rest` from now on (set once, before the gateway runs).
    pub(crate) fn seal_with(&self, at_rest: std::sync::Arc<AtRest>) {
        let _ = self.at_rest.set(at_rest);
    }

    fn seal_event(&self, event: Event) -> Result<Event, StoreError> {
        match self.at_rest.get() {
            Some(at_rest) => at_rest.seal_event(event),
            None => Ok(event),
        }
    }

    fn seal_outcome(&self, outcome: Option<Bytes>) -> Result<Option<Bytes>, StoreError> {
        match self.at_rest.get() {
            Some(at_rest) => at_rest.seal_outcome(outcome),
            None => Ok(outcome),
        }
    }

    fn open_claim(&self, claim: Claim) -> Result<Claim, StoreError> {
        match self.at_rest.get() {
            Some(at_rest) => at_rest.open_claim(claim),
            None => Ok(claim),
        }
    }

    fn open_events<'a>(
        &self,
        events: impl Iterator<Item = &'a mut Event>,
    ) -> Result<(), StoreError> {
        if let Some(at_rest) = self.at_rest.get() {
            for event in events {
                at_rest.open_event(event)?;
            }
        }
        Ok(())
    }

    fn expiries(&self) -> &Counter {
        self.expiries
            .get_or_init(|| metrics::counter!("oncegate_lease_expiries_total"))
    }

    /// Every op's error count at 0, for alerts that read them.
    pub(crate) fn register(&self) {
        self.errors.register();
        self.expiries().increment(0);
    }

    async fn time<T>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = call.await;
        self.record(op, started.elapsed(), result.is_err());
        result
    }

    fn record(&self, op: Op, took: Duration, failed: bool) {
        let slot = op as usize;
        self.seconds[slot]
            .get_or_init(|| metrics::histogram!("oncegate_store_seconds", "op" => OPS[slot]))
            .record(took.as_secs_f64());
        if failed {
            self.errors.add(slot, 1);
        }
    }
}

impl<S: Store> DedupStore for Timed<S> {
    async fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> Result<Admission, StoreError> {
        let event = self.seal_event(event)?;
        self.time(Op::Admit, self.inner.admit(event, keys, retention))
            .await
    }

    async fn admit_with_nonce(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
        nonce: Option<Nonce>,
    ) -> Result<Admission, StoreError> {
        let event = self.seal_event(event)?;
        self.time(
            Op::Admit,
            self.inner.admit_with_nonce(event, keys, retention, nonce),
        )
        .await
    }

    async fn claim_with_fingerprint(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> Result<Claim, StoreError> {
        let claim = self
            .time(
                Op::Claim,
                self.inner
                    .claim_with_fingerprint(key, partition, lease, fingerprint),
            )
            .await;
        if let Ok(Claim::TookOver(_)) = claim {
            self.expiries().increment(1);
        }
        self.open_claim(claim?)
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<FenceCheck, StoreError> {
        self.time(Op::Renew, self.inner.renew(lease, extend)).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        let outcome = self.seal_outcome(outcome)?;
        self.time(Op::Complete, self.inner.complete(lease, retention, outcome))
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.time(Op::Release, self.inner.release(lease)).await
    }

    async fn record(&self, key: &KeyHash, partition: u16) -> Result<Option<Record>, StoreError> {
        let record = self
            .time(Op::Record, self.inner.record(key, partition))
            .await?;
        match (self.at_rest.get(), record) {
            (Some(at_rest), Some(record)) => at_rest.open_record(record).map(Some),
            (_, record) => Ok(record),
        }
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        self.time(Op::Stats, self.inner.stats()).await
    }

    async fn queued(&self) -> Result<u64, StoreError> {
        self.time(Op::Queued, self.inner.queued()).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.time(Op::Ping, self.inner.ping()).await
    }

    fn durability(&self) -> oncegate_core::Durability {
        self.inner.durability()
    }

    fn broken(&self) -> Option<String> {
        self.inner.broken()
    }

    async fn complete_and_ack(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
        id: QueueId,
    ) -> Result<FenceCheck, StoreError>
    where
        Self: EventQueue + Sized,
    {
        let outcome = self.seal_outcome(outcome)?;
        self.time(
            Op::Complete,
            self.inner.complete_and_ack(lease, retention, outcome, id),
        )
        .await
    }
}

impl<S: Store> Timed<S> {
    /// A pull's claimed hand-outs with their events and done claims opened, the claims made
    /// in the hand-out counted as `claim` would count them.
    fn opened_claims(
        &self,
        mut pulled: Vec<oncegate_core::ClaimedDelivery>,
    ) -> Result<Vec<oncegate_core::ClaimedDelivery>, StoreError> {
        self.open_events(pulled.iter_mut().map(|(delivery, _)| &mut delivery.event))?;
        for (_, claim) in &mut pulled {
            if let Ok(done @ Claim::Done { .. }) = claim {
                *done = self.open_claim(done.clone())?;
            }
        }
        // The claims made in the hand-out count as `claim` would.
        for (_, claim) in &pulled {
            match claim {
                Ok(Claim::TookOver(_)) => self.expiries().increment(1),
                Err(_) => self.errors.add(Op::Claim as usize, 1),
                Ok(_) => {}
            }
        }
        Ok(pulled)
    }
}

impl<S: Store> EventQueue for Timed<S> {
    fn partitions(&self) -> u16 {
        self.inner.partitions()
    }

    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        let mut pulled = self.time(Op::Pull, self.inner.pull(partition, max)).await?;
        self.open_events(pulled.iter_mut().map(|delivery| &mut delivery.event))?;
        Ok(pulled)
    }

    async fn pull_ranked(
        &self,
        partition: u16,
        max: usize,
        load: &Loads,
    ) -> Result<Vec<Delivery>, StoreError> {
        let mut pulled = self
            .time(Op::Pull, self.inner.pull_ranked(partition, max, load))
            .await?;
        self.open_events(pulled.iter_mut().map(|delivery| &mut delivery.event))?;
        Ok(pulled)
    }

    async fn put_first(
        &self,
        rule: std::sync::Arc<dyn oncegate_core::Precedence>,
    ) -> Result<(), StoreError> {
        self.inner.put_first(rule).await
    }

    async fn group_queued(&self, group: u64) -> Result<Option<u64>, StoreError> {
        self.time(Op::Queued, self.inner.group_queued(group)).await
    }

    async fn busiest_groups(&self, max: usize) -> Result<Option<Vec<(u64, u64)>>, StoreError> {
        self.time(Op::Queued, self.inner.busiest_groups(max)).await
    }

    async fn next_group(
        &self,
        partition: u16,
        load: &Loads,
    ) -> Result<Option<oncegate_core::queue_index::Next>, StoreError> {
        self.time(Op::Pull, self.inner.next_group(partition, load))
            .await
    }

    async fn pull_claimed(
        &self,
        partition: u16,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<oncegate_core::ClaimedDelivery>, StoreError>
    where
        Self: DedupStore + Sized,
    {
        let pulled = self
            .time(Op::Pull, self.inner.pull_claimed(partition, max, lease))
            .await?;
        self.opened_claims(pulled)
    }

    async fn pull_claimed_ranked(
        &self,
        partition: u16,
        max: usize,
        lease: Duration,
        load: &Loads,
    ) -> Result<Vec<oncegate_core::ClaimedDelivery>, StoreError>
    where
        Self: DedupStore + Sized,
    {
        let pulled = self
            .time(
                Op::Pull,
                self.inner.pull_claimed_ranked(partition, max, lease, load),
            )
            .await?;
        self.opened_claims(pulled)
    }

    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        self.time(Op::Ack, self.inner.ack(id)).await
    }

    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        self.time(Op::Retry, self.inner.retry(id, not_before_ms))
            .await
    }

    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        self.time(Op::DeadLetter, self.inner.dead_letter(id, reason))
            .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let mut letters = self
            .time(Op::DeadLetters, self.inner.dead_letters(limit))
            .await?;
        self.open_events(letters.iter_mut().map(|letter| &mut letter.event))?;
        Ok(letters)
    }

    async fn dead_letter_count(&self) -> Result<u64, StoreError> {
        self.time(Op::DeadLetterCount, self.inner.dead_letter_count())
            .await
    }

    async fn replay_dead_letter(&self, id: QueueId) -> Result<Option<QueueId>, StoreError> {
        self.time(Op::Replay, self.inner.replay_dead_letter(id))
            .await
    }

    async fn purge_dead_letter(&self, id: QueueId) -> Result<bool, StoreError> {
        self.time(Op::Purge, self.inner.purge_dead_letter(id)).await
    }

    async fn leave(&self) -> Result<(), StoreError> {
        self.inner.leave().await
    }

    async fn owners(&self) -> Result<Vec<oncegate_core::PartitionOwner>, StoreError> {
        self.inner.owners().await
    }

    async fn queue_summary(&self, partition: u16) -> Result<QueueSummary, StoreError> {
        self.time(Op::QueueSummary, self.inner.queue_summary(partition))
            .await
    }

    async fn queued_events(
        &self,
        partition: u16,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<QueuedEvent>, StoreError> {
        let mut queued = self
            .time(
                Op::QueuedEvents,
                self.inner.queued_events(partition, after, limit),
            )
            .await?;
        self.open_events(queued.iter_mut().map(|queued| &mut queued.event))?;
        Ok(queued)
    }
}

impl<S: Store> WatermarkStore for Timed<S> {
    async fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> Result<WatermarkOutcome, StoreError> {
        self.time(
            Op::Watermark,
            self.inner.advance_watermark(scope, value, retention),
        )
        .await
    }
}

impl<S: Store> RateStore for Timed<S> {
    async fn take_rate(&self, bucket: &KeyHash, rate: Rate) -> Result<RateVerdict, StoreError> {
        self.time(Op::Rate, self.inner.take_rate(bucket, rate))
            .await
    }

    async fn adjust_rate(
        &self,
        bucket: &KeyHash,
        adjust: oncegate_core::RateAdjust,
    ) -> Result<(), StoreError> {
        self.time(Op::Rate, self.inner.adjust_rate(bucket, adjust))
            .await
    }
}

impl<S: Store> oncegate_core::StateStore for Timed<S> {
    async fn state_get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<oncegate_core::Versioned>, StoreError> {
        let kept = self
            .time(Op::State, self.inner.state_get(namespace, name))
            .await?;
        match (self.at_rest.get(), kept) {
            (Some(at_rest), Some(mut kept)) => {
                kept.value = at_rest.open(&kept.value, Place::State(namespace, name))?;
                Ok(Some(kept))
            }
            (_, kept) => Ok(kept),
        }
    }

    async fn state_put(
        &self,
        namespace: &str,
        name: &str,
        value: bytes::Bytes,
        expect: oncegate_core::Expect,
        ttl: Option<Duration>,
    ) -> Result<oncegate_core::Changed, StoreError> {
        let value = match self.at_rest.get() {
            Some(at_rest) => at_rest.seal(&value, Place::State(namespace, name))?,
            None => value,
        };
        self.time(
            Op::State,
            self.inner.state_put(namespace, name, value, expect, ttl),
        )
        .await
    }

    async fn state_remove(
        &self,
        namespace: &str,
        name: &str,
        expect: oncegate_core::Expect,
    ) -> Result<oncegate_core::Changed, StoreError> {
        self.time(Op::State, self.inner.state_remove(namespace, name, expect))
            .await
    }

    async fn state_list(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, oncegate_core::Versioned)>, StoreError> {
        let mut listed = self
            .time(Op::State, self.inner.state_list(namespace, after, limit))
            .await?;
        if let Some(at_rest) = self.at_rest.get() {
            for (name, kept) in &mut listed {
                kept.value = at_rest.open(&kept.value, Place::State(namespace, name))?;
            }
        }
        Ok(listed)
    }

    async fn state_generation(&self, namespace: &str) -> Result<u64, StoreError> {
        self.time(Op::State, self.inner.state_generation(namespace))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use oncegate_core::ManualClock;
    use oncegate_memory::{MemoryConfig, MemoryStore};

    fn event() -> Event {
        Event {
            platform: "feishu".into(),
            app: "app".into(),
            tenant: None,
            event_id: "e".into(),
            event_type: "t".into(),
            created_at_ms: 1_000_000,
            order_key: None,
            payload: Bytes::new(),
        }
    }

    /// Every call lands in its op's histogram, a refused one in its op's error count too, and
    /// a claim that takes over an expired lease (alone or in a hand-out) in the expiry count.
    #[test]
    fn calls_are_timed_by_op_refusals_and_lease_expiries_counted() {
        let recorder = crate::MetricsRecorder::new();
        let handle = recorder.render_handle();
        metrics::with_local_recorder(&recorder, || {
            let clock = Arc::new(ManualClock::new(1_000_000));
            let store = Timed::new(MemoryStore::with_clock(
                MemoryConfig::default(),
                clock.clone(),
            ));
            store.register();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                assert!(store.pull(0, 10).await.expect("pull").is_empty());
                assert!(store.pull(0, 10).await.is_ok());
                let beyond = store.partitions();
                assert!(matches!(
                    store.pull(beyond, 10).await,
                    Err(StoreError::Invalid(_))
                ));
                let nothing = QueueId {
                    partition: 0,
                    seq: 9,
                };
                assert!(!store.ack(nothing).await.expect("ack"));
                let key = oncegate_core::key_for("feishu", "app", "event_id", "e");
                let partition = event().partition(store.partitions());
                store
                    .admit(event(), &[key], Duration::from_secs(3600))
                    .await
                    .expect("admit");
                let lease = Duration::from_secs(1);
                let first = store.claim(&key, partition, lease).await.expect("claim");
                assert!(matches!(first, Claim::Acquired(_)), "{first:?}");
                clock.advance_ms(1_001);
                let second = store.claim(&key, partition, lease).await.expect("claim");
                assert!(matches!(second, Claim::TookOver(_)), "{second:?}");
                // A hand-out's claim that takes over counts as well.
                clock.advance_ms(1_001);
                let handed = store
                    .pull_claimed(partition, 10, lease)
                    .await
                    .expect("pull claimed");
                assert!(
                    matches!(handed.as_slice(), [(_, Ok(Claim::TookOver(_)))]),
                    "{handed:?}"
                );
            });
        });
        let text = handle.render();
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .to_owned()
        };
        assert!(line("oncegate_store_seconds_count{op=\"pull\"}").ends_with(" 4"));
        assert!(line("oncegate_store_seconds_count{op=\"ack\"}").ends_with(" 1"));
        assert!(line("oncegate_store_seconds_count{op=\"claim\"}").ends_with(" 2"));
        assert!(line("oncegate_store_errors_total{op=\"pull\"}").ends_with(" 1"));
        assert!(line("oncegate_store_errors_total{op=\"ack\"}").ends_with(" 0"));
        assert!(line("oncegate_store_errors_total{op=\"admit\"}").ends_with(" 0"));
        assert!(line("oncegate_lease_expiries_total ").ends_with(" 2"));
    }
}
