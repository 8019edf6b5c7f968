//! The pending records admissions add to the counts (`lua/counts.lua`), gathered in the gateway
//! per partition and minute and written about once a second (`lua/count_admitted.lua`) rather
//! than by each admit: the admit is the one script every request runs, and counting there cost
//! two `HINCRBY`s a request. Every other transition counts itself in its script. What a
//! gateway gathered and had not written when it died is missing from the counts until the
//! minutes it named are over; `stats` writes this gateway's first, so its own are never behind.

use std::collections::HashMap;
use std::sync::Weak;

use super::*;

/// Per partition: records admitted by minute their life ends in, not yet written.
#[derive(Default)]
pub(super) struct Admitted(Vec<std::sync::Mutex<HashMap<u64, i64>>>);

impl Admitted {
    pub(super) fn new(partitions: u16) -> Self {
        Self((0..partitions).map(|_| Default::default()).collect())
    }

    /// `records` admitted into `partition` whose life ends at `end_ms`.
    pub(super) fn add(&self, partition: u16, end_ms: u64, records: i64) {
        if let Some(minutes) = self.0.get(usize::from(partition)) {
            *lock(minutes).entry(end_ms / 60_000).or_default() += records;
        }
    }

    fn take(&self, partition: u16) -> HashMap<u64, i64> {
        self.0
            .get(usize::from(partition))
            .map(|minutes| std::mem::take(&mut *lock(minutes)))
            .unwrap_or_default()
    }

    fn put_back(&self, partition: u16, taken: HashMap<u64, i64>) {
        for (minute, records) in taken {
            self.add(partition, minute * 60_000, records);
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Clock> Inner<C> {
    /// Writes what this gateway admitted and has not written yet: one script per partition
    /// that holds any. What a failed call took is put back for the next.
    pub(super) async fn write_admitted(&self, conn: &mut Conn) -> Result<(), StoreError> {
        for partition in 0..self.partitions {
            let taken = self.admitted.take(partition);
            if taken.is_empty() {
                continue;
            }
            let mut call = self.scripts.count_admitted.prepare_invoke();
            call.key(self.counts(partition)).arg(self.clock.now_ms());
            for (minute, records) in &taken {
                call.arg(*minute).arg(*records);
            }
            let written: Result<Value, _> = call.invoke_async(conn).await;
            if let Err(error) = written {
                self.admitted.put_back(partition, taken);
                return Err(from_redis(error));
            }
        }
        Ok(())
    }
}

/// Writes the gathered admissions every second while the store lives.
pub(super) async fn write_every_second<C: Clock>(inner: Weak<Inner<C>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mut conn = inner.conn.clone();
        // Kept for the next round when Redis does not answer: the breaker and the calls
        // themselves say so.
        let _ = tokio::time::timeout(inner.timeout * 2, inner.write_admitted(&mut conn)).await;
    }
}
