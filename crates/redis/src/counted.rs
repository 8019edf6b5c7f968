//! The counts (`lua/counts.lua`) of the two scripts every event runs — its admit, and the
//! complete-and-ack of its batch — gathered in the gateway per partition, state and minute and
//! written about once a second (`lua/count.lua`) instead of by the scripts: counting there cost
//! Redis two `HINCRBY`s a request and four a batch, 23 % more CPU per event (BENCHMARKS.md).
//! Every other transition counts itself in its script. What a gateway gathered and had not
//! written when it died is missing from the counts until the minutes it named are over;
//! `stats` writes this gateway's first, so its own are never behind.

use std::collections::HashMap;
use std::sync::Weak;

use oncegate_core::live_counts::Counted;

use super::*;

/// A state as the counts hash names it (`lua/counts.lua`).
fn letter(state: Counted) -> &'static str {
    match state {
        Counted::Pending => "p",
        Counted::Processing => "r",
        Counted::Completed => "c",
    }
}

/// Per partition: changes of the counts by state and minute, not yet written.
#[derive(Default)]
pub(super) struct Tallies(Vec<std::sync::Mutex<HashMap<(Counted, u64), i64>>>);

impl Tallies {
    pub(super) fn new(partitions: u16) -> Self {
        Self((0..partitions).map(|_| Default::default()).collect())
    }

    /// `change` records of `state` in `partition` whose life ends in `minute` (unix ms / 60 000).
    pub(super) fn add(&self, partition: u16, state: Counted, minute: u64, change: i64) {
        if let Some(tallies) = self.0.get(usize::from(partition)) {
            *lock(tallies).entry((state, minute)).or_default() += change;
        }
    }

    fn take(&self, partition: u16) -> HashMap<(Counted, u64), i64> {
        self.0
            .get(usize::from(partition))
            .map(|tallies| std::mem::take(&mut *lock(tallies)))
            .unwrap_or_default()
    }

    fn put_back(&self, partition: u16, taken: HashMap<(Counted, u64), i64>) {
        for ((state, minute), change) in taken {
            self.add(partition, state, minute, change);
        }
    }
}

/// Changes taken out of the tallies to be written: put back when dropped unwritten, also when
/// the future writing them is dropped mid-call (a timeout), so that none are lost.
struct Taken<'a> {
    tallies: &'a Tallies,
    partition: u16,
    taken: Option<HashMap<(Counted, u64), i64>>,
}

impl Taken<'_> {
    fn written(mut self) {
        self.taken = None;
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(taken) = self.taken.take() {
            self.tallies.put_back(self.partition, taken);
        }
    }
}

/// What a complete-and-ack's reply says of the record it replaced (`lua/complete_ack.lua`):
/// its state and minute when it was in the counts.
pub(super) fn replaced(code: u64) -> Option<(Counted, u64)> {
    let state = match code % 4 {
        1 => Counted::Pending,
        2 => Counted::Processing,
        3 => Counted::Completed,
        _ => return None,
    };
    (code >= 4).then_some((state, code / 4))
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Clock> Inner<C> {
    /// Writes the changes of the counts gathered here: one script per partition that holds
    /// any. What a failed call took is put back for the next.
    pub(super) async fn write_tallies(&self, conn: &mut Conn) -> Result<(), StoreError> {
        for partition in 0..self.partitions {
            let changes = self.tallies.take(partition);
            // Changes that add up to nothing are dropped, not kept.
            if changes.values().all(|change| *change == 0) {
                continue;
            }
            let mut call = self.scripts.count.prepare_invoke();
            call.key(self.counts(partition)).arg(self.clock.now_ms());
            for ((state, minute), change) in &changes {
                call.arg(letter(*state)).arg(*minute).arg(*change);
            }
            // Until written, the changes go back to the tallies when dropped: after a failed
            // call, and when this future is dropped while it waits (the writer's timeout).
            let taken = Taken {
                tallies: &self.tallies,
                partition,
                taken: Some(changes),
            };
            call.invoke_async::<Value>(conn).await.map_err(from_redis)?;
            taken.written();
        }
        Ok(())
    }
}

/// Writes the gathered changes every second while the store lives.
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
        let _ = tokio::time::timeout(inner.timeout * 2, inner.write_tallies(&mut conn)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes complete_ack.lua answers: 1 says nothing to take out, minute × 4 + state the
    /// record replaced.
    #[test]
    fn a_completions_code_names_the_replaced_record() {
        let minute = 29_461_234;
        assert_eq!(replaced(1), None);
        assert_eq!(replaced(minute * 4 + 1), Some((Counted::Pending, minute)));
        assert_eq!(
            replaced(minute * 4 + 2),
            Some((Counted::Processing, minute))
        );
        assert_eq!(replaced(minute * 4 + 3), Some((Counted::Completed, minute)));
        assert_eq!(replaced(minute * 4), None, "no state 0");
    }
}
