//! Rate budgets on Redis: one key a bucket, its GCRA arrival time, shared by every gateway.

use super::*;

impl<C: Clock> RateStore for RedisStore<C> {
    async fn take_rate(&self, bucket: &KeyHash, rate: Rate) -> Result<RateVerdict, StoreError> {
        let bucket = *bucket;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let reply: Value = inner
                .scripts
                .rate
                .key(format!("{}:r:{bucket}", inner.prefix))
                .arg(inner.clock.now_ms().saturating_mul(1000))
                .arg(rate.emission_us())
                .arg(rate.tolerance_us())
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let reply = array(reply)?;
            match (reply.first().and_then(int), reply.get(1).and_then(int)) {
                (Some(1), _) => Ok(RateVerdict::Granted),
                (Some(0), Some(wait_us)) => Ok(RateVerdict::Wait(Duration::from_micros(wait_us))),
                _ => Err(StoreError::Corrupt(format!(
                    "unexpected rate reply {reply:?}"
                ))),
            }
        })
        .await
    }

    async fn adjust_rate(
        &self,
        bucket: &KeyHash,
        adjust: oncegate_core::RateAdjust,
    ) -> Result<(), StoreError> {
        let bucket = *bucket;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let now_us = inner.clock.now_ms().saturating_mul(1000);
            let (mode, amount) = match adjust {
                oncegate_core::RateAdjust::GiveBack(rate) => ("give_back", rate.emission_us()),
                hold @ oncegate_core::RateAdjust::Hold(..) => (
                    "hold",
                    oncegate_core::rates::adjusted(None, now_us, hold).unwrap_or(now_us),
                ),
            };
            let _: Value = inner
                .scripts
                .rate_adjust
                .key(format!("{}:r:{bucket}", inner.prefix))
                .arg(now_us)
                .arg(mode)
                .arg(amount)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            Ok(())
        })
        .await
    }
}
