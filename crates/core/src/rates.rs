//! Rate budgets as the platforms define them (Feishu: 5 per second per chat; WeCom: 30 per
//! minute per member), kept with the generic cell rate algorithm: one number per bucket, the
//! theoretical arrival time of the next call, so a bucket costs the same at any rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::key::KeyHash;

/// `count` calls per `per`, of which up to `burst` may come back to back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Calls allowed per period.
    pub count: u32,
    /// The period.
    pub per: Duration,
    /// Calls that may come at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl Rate {
    /// `count` per second, in bursts of at most `count`.
    pub const fn per_second(count: u32) -> Self {
        Self {
            count,
            per: Duration::from_secs(1),
            burst: count,
        }
    }

    /// `count` per minute, in bursts of at most `burst`.
    pub const fn per_minute(count: u32, burst: u32) -> Self {
        Self {
            count,
            per: Duration::from_secs(60),
            burst,
        }
    }

    /// The spacing of calls at the sustained rate, in µs (at least 1).
    pub fn emission_us(&self) -> u64 {
        let per_us = u64::try_from(self.per.as_micros()).unwrap_or(u64::MAX);
        (per_us / u64::from(self.count.max(1))).max(1)
    }

    /// How far ahead of now the next arrival may be and still be let through, in µs.
    pub fn tolerance_us(&self) -> u64 {
        self.emission_us()
            .saturating_mul(u64::from(self.burst.max(1) - 1))
    }
}

/// What a bucket says to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateVerdict {
    /// Go now; the call was counted.
    Granted,
    /// Not yet: try again after this long (nothing was counted).
    Wait(Duration),
}

/// One step of GCRA: the verdict at `now_us` for a bucket whose next theoretical arrival is
/// `tat_us` (`None`: a fresh bucket), and the bucket's new arrival time when granted.
pub fn gcra(tat_us: Option<u64>, now_us: u64, rate: Rate) -> (RateVerdict, Option<u64>) {
    let tat = tat_us.unwrap_or(now_us).max(now_us);
    let tolerance = rate.tolerance_us();
    if tat - now_us > tolerance {
        let wait = tat - now_us - tolerance;
        return (RateVerdict::Wait(Duration::from_micros(wait)), None);
    }
    (RateVerdict::Granted, Some(tat + rate.emission_us()))
}

/// A change to a bucket other than a call taken: what the platform's own limit answers teach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateAdjust {
    /// A call taken under `rate` did not go out (a later bucket of the same send said wait):
    /// its share is given back, so a bucket counts only the calls that were made.
    GiveBack(Rate),
    /// The platform blocked the bucket: no call under `rate` is granted for this long from now.
    Hold(Rate, Duration),
}

/// The new arrival time of a bucket whose arrival time is `tat_us` (`None`: fresh) at `now_us`
/// after `adjust`; `None` when the bucket is as good as fresh.
pub fn adjusted(tat_us: Option<u64>, now_us: u64, adjust: RateAdjust) -> Option<u64> {
    match adjust {
        RateAdjust::GiveBack(rate) => tat_us
            .map(|tat| tat.saturating_sub(rate.emission_us()))
            .filter(|tat| *tat > now_us),
        RateAdjust::Hold(rate, pause) => {
            let pause = u64::try_from(pause.as_micros()).unwrap_or(u64::MAX);
            let until = now_us
                .saturating_add(pause)
                .saturating_add(rate.tolerance_us());
            Some(tat_us.unwrap_or(0).max(until))
        }
    }
}

/// Buckets kept in this process: the rate store of backends that one gateway owns.
#[derive(Debug)]
pub struct LocalRates {
    buckets: Mutex<HashMap<KeyHash, u64>>,
    max_buckets: usize,
}

impl Default for LocalRates {
    fn default() -> Self {
        Self::new(1 << 20)
    }
}

impl LocalRates {
    /// Room for `max_buckets` buckets; idle ones (whose arrival time has passed) make way.
    pub fn new(max_buckets: usize) -> Self {
        Self {
            buckets: Mutex::new(HashMap::new()),
            max_buckets: max_buckets.max(1),
        }
    }

    /// Takes one call from `bucket` at `now_us`.
    pub fn take(&self, bucket: &KeyHash, rate: Rate, now_us: u64) -> RateVerdict {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (verdict, tat) = gcra(buckets.get(bucket).copied(), now_us, rate);
        if let Some(tat) = tat {
            if buckets.len() >= self.max_buckets && !buckets.contains_key(bucket) {
                // A bucket whose arrival time has passed is as good as a fresh one.
                buckets.retain(|_, tat| *tat > now_us);
            }
            if buckets.len() < self.max_buckets || buckets.contains_key(bucket) {
                buckets.insert(*bucket, tat);
            }
        }
        verdict
    }

    /// Changes `bucket` at `now_us` as `adjust` says.
    pub fn adjust(&self, bucket: &KeyHash, adjust: RateAdjust, now_us: u64) {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match adjusted(buckets.get(bucket).copied(), now_us, adjust) {
            Some(tat) if buckets.len() < self.max_buckets || buckets.contains_key(bucket) => {
                buckets.insert(*bucket, tat);
            }
            Some(_) => {}
            None => {
                buckets.remove(bucket);
            }
        }
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let rates = LocalRates::default();
        let bucket = KeyHash::of(&["chat"]);
        let rate = Rate::per_second(5);
        for _ in 0..5 {
            assert_eq!(rates.take(&bucket, rate, 0), RateVerdict::Granted);
        }
        assert_eq!(
            rates.take(&bucket, rate, 0),
            RateVerdict::Wait(Duration::from_millis(200))
        );
        assert_eq!(
            rates.take(&bucket, rate, 150_000),
            RateVerdict::Wait(Duration::from_millis(50))
        );
        assert_eq!(rates.take(&bucket, rate, 200_000), RateVerdict::Granted);
        assert_eq!(
            rates.take(&bucket, rate, 200_000),
            RateVerdict::Wait(Duration::from_millis(200))
        );
        let other = KeyHash::of(&["another chat"]);
        assert_eq!(rates.take(&other, rate, 200_000), RateVerdict::Granted);
    }

    proptest! {
        /// Whatever the call times, no window of one period grants more than count + burst
        /// calls, and a call told to wait is granted when it comes back after that wait.
        #[test]
        fn never_more_than_the_budget(
            gaps in proptest::collection::vec(0u64..400_000, 1..300),
            count in 1u32..10,
            burst in 1u32..10,
        ) {
            let rate = Rate { count, per: Duration::from_secs(1), burst };
            let rates = LocalRates::default();
            let bucket = KeyHash::of(&["b"]);
            let mut now = 0u64;
            let mut granted = Vec::new();
            for gap in gaps {
                now += gap;
                match rates.take(&bucket, rate, now) {
                    RateVerdict::Granted => granted.push(now),
                    RateVerdict::Wait(wait) => {
                        let back = now + wait.as_micros() as u64;
                        prop_assert_eq!(rates.take(&bucket, rate, back), RateVerdict::Granted);
                        granted.push(back);
                        now = back;
                    }
                }
            }
            for (i, start) in granted.iter().enumerate() {
                let inside = granted[i..].iter().take_while(|t| **t < start + 1_000_000).count();
                prop_assert!(inside as u32 <= count + burst, "{} in one second", inside);
            }
        }
    }

    #[test]
    fn a_call_given_back_is_not_counted_and_a_hold_blocks_for_its_pause() {
        let rates = LocalRates::default();
        let bucket = KeyHash::of(&["corp"]);
        let rate = Rate::per_second(2);
        assert_eq!(rates.take(&bucket, rate, 0), RateVerdict::Granted);
        assert_eq!(rates.take(&bucket, rate, 0), RateVerdict::Granted);
        assert!(matches!(rates.take(&bucket, rate, 0), RateVerdict::Wait(_)));
        rates.adjust(&bucket, RateAdjust::GiveBack(rate), 0);
        assert_eq!(rates.take(&bucket, rate, 0), RateVerdict::Granted);
        // Held for 60 s: nothing before, the whole burst after.
        rates.adjust(
            &bucket,
            RateAdjust::Hold(rate, Duration::from_secs(60)),
            1_000_000,
        );
        assert_eq!(
            rates.take(&bucket, rate, 1_000_000),
            RateVerdict::Wait(Duration::from_secs(60))
        );
        assert_eq!(rates.take(&bucket, rate, 61_000_000), RateVerdict::Granted);
        // A shorter hold does not shorten a longer one.
        let other = KeyHash::of(&["other"]);
        rates.adjust(&other, RateAdjust::Hold(rate, Duration::from_secs(60)), 0);
        rates.adjust(&other, RateAdjust::Hold(rate, Duration::from_secs(1)), 0);
        assert!(matches!(
            rates.take(&other, rate, 2_000_000),
            RateVerdict::Wait(wait) if wait == Duration::from_secs(58)
        ));
        // Giving back more than was taken leaves a fresh bucket, not a debt.
        let fresh = KeyHash::of(&["fresh"]);
        rates.adjust(&fresh, RateAdjust::GiveBack(rate), 5_000_000);
        assert_eq!(rates.take(&fresh, rate, 5_000_000), RateVerdict::Granted);
        assert_eq!(rates.take(&fresh, rate, 5_000_000), RateVerdict::Granted);
        assert!(matches!(
            rates.take(&fresh, rate, 5_000_000),
            RateVerdict::Wait(_)
        ));
    }

    #[test]
    fn idle_buckets_make_way_when_full() {
        let rates = LocalRates::new(2);
        let rate = Rate::per_second(1);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let at = i as u64 * 2_000_000;
            assert_eq!(
                rates.take(&KeyHash::of(&[name]), rate, at),
                RateVerdict::Granted
            );
        }
        assert!(rates.len() <= 2);
    }
}
