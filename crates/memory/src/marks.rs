//! Watermarks (kept with the records, journaled) and rate budgets (in this process: one
//! gateway owns the store).

use super::*;

impl<C: Clock, J: Journal> WatermarkStore for MemoryStore<C, J> {
    async fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> Result<WatermarkOutcome, StoreError> {
        self.journal.check()?;
        let outcome = {
            let now_ms = self.clock.now_ms();
            let mut shard = self.shard(scope, now_ms);
            let compact = Compact::of(scope);
            let epoch = self.epoch;
            let stored = shard
                .watermarks
                .find(compact.tag_hash(), |mark| mark.scope == compact)
                .copied();
            let current = stored
                .filter(|mark| epoch.ms(mark.deadline_secs) > now_ms)
                .map(|mark| mark.value);
            let (outcome, next) = transition::watermark(current, value);
            if let Some(value) = next {
                let retention_ms = millis(retention);
                let needed = epoch.secs_ceil(now_ms.saturating_add(retention_ms));
                let kept = stored.map_or(0, |mark| mark.deadline_secs);
                // A busy chat advances its mark on every event: extend the deadline with 1/8 of
                // slack so that the expiry index gets one entry per eighth of the retention, not one
                // per event.
                let deadline_secs = if kept >= needed {
                    kept
                } else {
                    let slack = retention_ms / 8;
                    let deadline =
                        epoch.secs_ceil(now_ms.saturating_add(retention_ms).saturating_add(slack));
                    shard
                        .expiry
                        .push(compact.tag(), epoch.secs_floor(now_ms), deadline);
                    deadline
                };
                self.journal.append(&Change::Mark {
                    scope: *scope,
                    value,
                    deadline_ms: epoch.ms(deadline_secs),
                });
                let mark = Mark {
                    scope: compact,
                    value,
                    deadline_secs,
                };
                shard.put_mark(mark);
            }
            outcome
        };
        self.synced(Ok(outcome)).await
    }
}

impl<C: Clock, J: Journal> oncegate_core::RateStore for MemoryStore<C, J> {
    async fn take_rate(
        &self,
        bucket: &KeyHash,
        rate: oncegate_core::Rate,
    ) -> Result<oncegate_core::RateVerdict, StoreError> {
        // One gateway owns this store: its buckets live in its process.
        Ok(self
            .rates
            .take(bucket, rate, self.clock.now_ms().saturating_mul(1000)))
    }

    async fn adjust_rate(
        &self,
        bucket: &KeyHash,
        adjust: oncegate_core::RateAdjust,
    ) -> Result<(), StoreError> {
        self.rates
            .adjust(bucket, adjust, self.clock.now_ms().saturating_mul(1000));
        Ok(())
    }
}
