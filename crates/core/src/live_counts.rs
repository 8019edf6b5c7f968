//! Records counted by state as they change, so that a store answers how many it holds without
//! reading them: per state a total, and per minute the records whose life ends in it (a held
//! record's life ends at the later of its retention and lease ends), folded out of the totals
//! once the minute is over. A record whose life ends in the current minute is counted until the
//! minute is over (at most 60 s late). The Redis store keeps the same counts in its scripts
//! (`crates/redis/lua/counts.lua`).

use std::collections::HashMap;

use crate::RecordState;

const MINUTE_MS: u64 = 60_000;

/// A record's state as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counted {
    /// Admitted, not claimed.
    Pending = 0,
    /// Claimed (its lease may have run out).
    Processing = 1,
    /// Done.
    Completed = 2,
}

impl Counted {
    /// How `state` is counted.
    pub fn of(state: &RecordState) -> Self {
        match state {
            RecordState::Pending => Self::Pending,
            RecordState::Processing { .. } => Self::Processing,
            RecordState::Completed { .. } => Self::Completed,
        }
    }
}

/// Counts of held records by state, kept as they change.
///
/// ```
/// use oncegate_core::live_counts::{Counted, LiveCounts};
///
/// let mut counts = LiveCounts::default();
/// let now = 1_700_000_000_000;
/// counts.add(Counted::Pending, now + 90_000, now);
/// assert_eq!(counts.read(now), [1, 0, 0]);
/// counts.remove(Counted::Pending, now + 90_000, now);
/// counts.add(Counted::Completed, now + 30_000, now);
/// assert_eq!(counts.read(now), [0, 0, 1]);
/// // Two minutes on, the completed record's time is over.
/// assert_eq!(counts.read(now + 120_000), [0, 0, 0]);
/// ```
#[derive(Debug, Default, Clone)]
pub struct LiveCounts {
    totals: [i64; 3],
    /// Per minute (unix ms / 60 000) the records whose life ends in it, by state.
    minutes: HashMap<u64, [i64; 3]>,
    /// Minutes before this one are folded out of the totals.
    folded: u64,
}

impl LiveCounts {
    /// Counts a record of `state` whose life ends at `end_ms`, at `now_ms`; one whose minute is
    /// over is in no count.
    pub fn add(&mut self, state: Counted, end_ms: u64, now_ms: u64) {
        self.change(state, end_ms, now_ms, 1);
    }

    /// Takes back what [`add`](Self::add) counted for the same state and end.
    pub fn remove(&mut self, state: Counted, end_ms: u64, now_ms: u64) {
        self.change(state, end_ms, now_ms, -1);
    }

    fn change(&mut self, state: Counted, end_ms: u64, now_ms: u64, delta: i64) {
        let minute = end_ms / MINUTE_MS;
        // A minute over is folded (or will be, at the next read, with what it holds now).
        if minute < now_ms / MINUTE_MS || minute < self.folded {
            return;
        }
        self.totals[state as usize] += delta;
        let counts = self.minutes.entry(minute).or_default();
        counts[state as usize] += delta;
        if *counts == [0; 3] {
            self.minutes.remove(&minute);
        }
    }

    /// The records counted at `now_ms`: pending, processing, completed. The minutes over since
    /// the last read leave the totals first.
    pub fn read(&mut self, now_ms: u64) -> [u64; 3] {
        let now = now_ms / MINUTE_MS;
        if now > self.folded {
            // Whichever is fewer: the minutes passed, or the minutes held.
            let over: Vec<u64> = if now - self.folded <= self.minutes.len() as u64 {
                (self.folded..now).collect()
            } else {
                self.minutes.keys().copied().filter(|m| *m < now).collect()
            };
            for minute in over {
                if let Some(counts) = self.minutes.remove(&minute) {
                    for (total, count) in self.totals.iter_mut().zip(counts) {
                        *total -= count;
                    }
                }
            }
            self.folded = now;
        }
        self.totals.map(|total| total.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_017_345;

    /// A model: every record with its state and end, counted by the stated rule.
    fn census(records: &[(Counted, u64)], now_ms: u64) -> [u64; 3] {
        let since = now_ms - now_ms % MINUTE_MS;
        let mut counts = [0; 3];
        for (state, end) in records {
            if *end >= since {
                counts[*state as usize] += 1;
            }
        }
        counts
    }

    /// Random records come, change state and go while the clock moves by seconds to hours;
    /// the counts equal the census at every step.
    #[test]
    fn counts_equal_a_census_of_the_records_as_they_change_and_time_passes() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut counts = LiveCounts::default();
        let mut records: Vec<(Counted, u64)> = Vec::new();
        let mut now = NOW;
        let states = [Counted::Pending, Counted::Processing, Counted::Completed];
        for step in 0..20_000 {
            match rng.u8(0..4) {
                0 => {
                    let record = (states[rng.usize(..3)], now + rng.u64(0..600_000));
                    counts.add(record.0, record.1, now);
                    records.push(record);
                }
                1 if !records.is_empty() => {
                    let at = rng.usize(..records.len());
                    let (state, end) = records[at];
                    counts.remove(state, end, now);
                    records[at] = (states[rng.usize(..3)], now + rng.u64(0..600_000));
                    counts.add(records[at].0, records[at].1, now);
                }
                2 if !records.is_empty() => {
                    let (state, end) = records.swap_remove(rng.usize(..records.len()));
                    counts.remove(state, end, now);
                }
                _ => {
                    now += match rng.u8(0..10) {
                        0 => rng.u64(0..7_200_000),
                        _ => rng.u64(0..20_000),
                    };
                }
            }
            if step % 7 == 0 {
                assert_eq!(counts.read(now), census(&records, now), "step {step}");
            }
            // Records long over leave the model as a sweep would take them.
            records.retain(|(_, end)| *end + 3 * MINUTE_MS > now);
        }
        assert!(counts.minutes.len() <= 12, "only minutes to come are held");
    }

    /// A record whose minute is over is neither counted nor taken back, whenever it changes.
    #[test]
    fn a_minute_over_is_not_touched() {
        let mut counts = LiveCounts::default();
        counts.add(Counted::Completed, NOW - 120_000, NOW);
        counts.remove(Counted::Pending, NOW - 120_000, NOW);
        assert_eq!(counts.read(NOW), [0, 0, 0]);
        assert!(counts.minutes.is_empty());
        // Within the current minute: counted until it is over.
        counts.add(Counted::Processing, NOW - 1, NOW);
        assert_eq!(counts.read(NOW), [0, 1, 0]);
        assert_eq!(counts.read(NOW + MINUTE_MS), [0, 0, 0]);
    }
}
