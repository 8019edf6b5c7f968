//! What the platforms' rate answers teach a gateway. The budgets are kept inside the published
//! limits, yet a platform may count more than this gateway sees (another system spending the
//! same corp's quota, limits changed since): its 429 (Feishu's `x-ogw-ratelimit-reset`) or
//! 45009 then lowers the budget it speaks of — halved, to a sixteenth at the least — and holds
//! it on the shared store for the pause the platform named, so that every gateway waits; the
//! rate comes back by a fifth a minute without another such answer. WeCom's 45033 (calls in
//! flight) lowers the sender's calls in flight the same way, a call more every ten seconds.
//! Each budget is lowered on its own: one tenant's or receiver's answer lowers no other's.

use std::collections::HashMap;
use std::sync::Mutex;
#[cfg(any(feature = "send", test))]
use std::time::Duration;

use oncegate_core::{KeyHash, Rate};
use serde::Serialize;
use tokio::time::Instant;

/// The least a lowered budget keeps of its rate.
#[cfg(feature = "send")]
const FLOOR: f64 = 1.0 / 16.0;
/// How much of its rate a lowered budget gets back a minute.
const RECOVERY_PER_MINUTE: f64 = 0.2;
/// Budgets (and senders) remembered as lowered at most: recovered ones make way first.
#[cfg(feature = "send")]
const MAX_KEPT: usize = 4096;
/// How long a lowered cap on calls in flight takes to allow one more.
#[cfg(feature = "send")]
pub(crate) const CAP_STEP: Duration = Duration::from_secs(10);
/// A cap that has grown back to this many calls in flight is lifted.
#[cfg(feature = "send")]
const CAP_LIFTED: usize = 64;
/// The budgets shown by `/admin/send-budgets`, the most lowered first.
const SHOWN: usize = 100;

/// The budgets and senders lowered in this gateway.
#[derive(Default)]
pub(crate) struct Learned {
    lowered: Mutex<HashMap<KeyHash, Lowered>>,
    #[cfg(feature = "send")]
    caps: Mutex<HashMap<String, Cap>>,
    #[cfg(feature = "send")]
    freed: tokio::sync::Notify,
}

struct Lowered {
    /// The share of its rate it kept when last lowered.
    factor: f64,
    at: Instant,
    /// Until when the pause the platform named lasts: the answers to calls made before it
    /// speak of the same excess, and lower it no further.
    #[cfg_attr(not(feature = "send"), allow(dead_code))]
    pause_until: Instant,
    /// The pause last held.
    #[cfg(feature = "send")]
    pause: Duration,
    /// The budget, as `/admin/send-budgets` names it: its sender's scope and its name.
    label: String,
    times: u64,
}

impl Lowered {
    fn factor_at(&self, now: Instant) -> f64 {
        let minutes = now.saturating_duration_since(self.at).as_secs_f64() / 60.0;
        (self.factor + minutes * RECOVERY_PER_MINUTE).min(1.0)
    }
}

/// `rate` kept to `factor` of itself: fewer calls a period and a smaller burst, one at least.
pub(crate) fn scaled(rate: Rate, factor: f64) -> Rate {
    if factor >= 1.0 {
        return rate;
    }
    let part = |n: u32| ((f64::from(n) * factor).floor() as u32).max(1);
    Rate {
        count: part(rate.count),
        per: rate.per,
        burst: part(rate.burst),
    }
}

/// A lowered budget or sender, as `/admin/send-budgets` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct Shown {
    /// The sender's scope and the budget's name (`corp/agent app`), or the sender's scope.
    pub(crate) budget: String,
    /// The share of its rate it has now (budgets), or the calls in flight it allows (senders).
    pub(crate) now: f64,
    /// How often the platform's answers lowered it since it was last whole.
    pub(crate) lowered: u64,
    /// Since its last lowering.
    pub(crate) since_ms: u64,
}

impl Learned {
    /// `rate` as the platform's answers have left `bucket`'s.
    pub(crate) fn rate(&self, bucket: &KeyHash, rate: Rate, now: Instant) -> Rate {
        let mut lowered = lock(&self.lowered);
        let Some(entry) = lowered.get(bucket) else {
            return rate;
        };
        let factor = entry.factor_at(now);
        if factor >= 1.0 {
            lowered.remove(bucket);
        }
        scaled(rate, factor)
    }

    /// Lowers `bucket` after a platform's rate answer that asked for `pause`: the share it
    /// keeps now, and the pause to hold on the store. Once a pause: a burst's many answers are
    /// one excess, halved once (`None`: held already). An answer that may mean a `longer`
    /// block (WeCom's 45009: a minute's or an hour's) met again within a pause of the last
    /// one's end — the platform still blocks — holds the longer one.
    #[cfg(feature = "send")]
    pub(crate) fn lower(
        &self,
        bucket: &KeyHash,
        label: &str,
        now: Instant,
        (pause, longer): (Duration, Option<Duration>),
    ) -> (f64, Option<Duration>) {
        let mut lowered = lock(&self.lowered);
        if !lowered.contains_key(bucket) && lowered.len() >= MAX_KEPT {
            lowered.retain(|_, entry| entry.factor_at(now) < 1.0);
            if lowered.len() >= MAX_KEPT {
                // The least lowered makes way: the most lowered matter most.
                let most = lowered
                    .iter()
                    .max_by(|a, b| a.1.factor_at(now).total_cmp(&b.1.factor_at(now)))
                    .map(|(bucket, _)| *bucket);
                if let Some(most) = most {
                    lowered.remove(&most);
                }
            }
        }
        let fresh = !lowered.contains_key(bucket);
        let entry = lowered.entry(*bucket).or_insert_with(|| Lowered {
            factor: 1.0,
            at: now,
            pause_until: now,
            pause,
            label: label.to_owned(),
            times: 0,
        });
        entry.times += 1;
        if now < entry.pause_until {
            return (entry.factor_at(now), None);
        }
        let still_blocked = !fresh && now < entry.pause_until + entry.pause;
        let pause = match longer {
            Some(longer) if still_blocked && longer > pause => longer,
            _ => pause,
        };
        entry.factor = (entry.factor_at(now) / 2.0).max(FLOOR);
        entry.at = now;
        entry.pause_until = now + pause;
        entry.pause = pause;
        (entry.factor, Some(pause))
    }

    /// The budgets lowered now, the most lowered first, and the senders whose calls in flight
    /// are capped.
    pub(crate) fn shown(&self, now: Instant) -> (Vec<Shown>, Vec<Shown>) {
        let mut budgets: Vec<Shown> = lock(&self.lowered)
            .values()
            .filter(|entry| entry.factor_at(now) < 1.0)
            .map(|entry| Shown {
                budget: entry.label.clone(),
                now: entry.factor_at(now),
                lowered: entry.times,
                since_ms: since_ms(entry.at, now),
            })
            .collect();
        budgets.sort_by(|a, b| a.now.total_cmp(&b.now));
        budgets.truncate(SHOWN);
        #[cfg(feature = "send")]
        let senders = self.capped(now);
        #[cfg(not(feature = "send"))]
        let senders = Vec::new();
        (budgets, senders)
    }
}

fn since_ms(at: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(u64::MAX)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// One sender's calls in flight, and the cap its 45033s left.
#[cfg(feature = "send")]
#[derive(Default)]
struct Cap {
    in_flight: usize,
    /// The cap when last lowered, when, and how often since it was lifted.
    lowered: Option<(usize, Instant, u64)>,
}

#[cfg(feature = "send")]
impl Cap {
    fn at(&self, now: Instant) -> Option<usize> {
        let (to, at, _) = self.lowered?;
        let steps = now.saturating_duration_since(at).as_secs() / CAP_STEP.as_secs();
        let cap = to.saturating_add(usize::try_from(steps).unwrap_or(usize::MAX));
        (cap < CAP_LIFTED).then_some(cap)
    }
}

/// A call in flight of a sender, counted until dropped.
#[cfg(feature = "send")]
pub(crate) struct InFlight<'a> {
    learned: &'a Learned,
    scope: String,
}

#[cfg(feature = "send")]
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut caps = lock(&self.learned.caps);
        if let Some(cap) = caps.get_mut(&self.scope) {
            cap.in_flight = cap.in_flight.saturating_sub(1);
            if cap.in_flight == 0 && cap.at(Instant::now()).is_none() {
                caps.remove(&self.scope);
            }
        }
        drop(caps);
        self.learned.freed.notify_waiters();
    }
}

#[cfg(feature = "send")]
impl Learned {
    /// A place among `scope`'s calls in flight, waiting until `deadline` at most while its cap
    /// is reached: `None` when it was not found in time.
    pub(crate) async fn enter(&self, scope: &str, deadline: Instant) -> Option<InFlight<'_>> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let now = Instant::now();
            {
                let mut caps = lock(&self.caps);
                if !caps.contains_key(scope) && caps.len() >= MAX_KEPT {
                    caps.retain(|_, cap| cap.in_flight > 0 || cap.at(now).is_some());
                }
                let cap = caps.entry(scope.to_owned()).or_default();
                if cap.at(now).is_none_or(|most| cap.in_flight < most) {
                    cap.in_flight += 1;
                    return Some(InFlight {
                        learned: self,
                        scope: scope.to_owned(),
                    });
                }
            }
            // A cap also grows back with time, with no call finishing.
            let until = deadline.min(now + CAP_STEP);
            if tokio::time::timeout_at(until, freed).await.is_err() && until >= deadline {
                return None;
            }
        }
    }

    /// Lowers `scope`'s calls in flight after the platform said too many (this one among
    /// them): half those in flight now, one at the least. The cap it keeps now.
    pub(crate) fn lower_in_flight(&self, scope: &str, now: Instant) -> usize {
        let mut caps = lock(&self.caps);
        let cap = caps.entry(scope.to_owned()).or_default();
        let seen = cap.at(now).unwrap_or(usize::MAX).min(cap.in_flight.max(1));
        let to = (seen / 2).max(1);
        let times = cap.lowered.map_or(0, |(_, _, times)| times) + 1;
        cap.lowered = Some((to, now, times));
        to
    }

    fn capped(&self, now: Instant) -> Vec<Shown> {
        let mut senders: Vec<Shown> = lock(&self.caps)
            .iter()
            .filter_map(|(scope, cap)| {
                let most = cap.at(now)?;
                let (_, at, times) = cap.lowered?;
                Some(Shown {
                    budget: scope.clone(),
                    now: most as f64,
                    lowered: times,
                    since_ms: since_ms(at, now),
                })
            })
            .collect();
        senders.sort_by(|a, b| a.now.total_cmp(&b.now));
        senders.truncate(SHOWN);
        senders
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_budget_halves_to_a_floor_and_recovers_by_a_fifth_a_minute() {
        let learned = Learned::default();
        let bucket = KeyHash::of(&["corp"]);
        let other = KeyHash::of(&["other corp"]);
        let rate = Rate::per_minute(10_000, 200);
        let start = Instant::now();
        assert_eq!(learned.rate(&bucket, rate, start), rate, "whole until told");
        let pause = Duration::from_secs(1);
        assert_eq!(
            learned.lower(&bucket, "ww1/1 app", start, (pause, None)).0,
            0.5
        );
        assert_eq!(
            learned.rate(&bucket, rate, start),
            Rate::per_minute(5_000, 100)
        );
        assert_eq!(
            learned.rate(&other, rate, start),
            rate,
            "one tenant's answer only"
        );
        // The other answers to one burst, within the pause, are the same excess.
        for _ in 0..5 {
            assert_eq!(
                learned.lower(&bucket, "ww1/1 app", start, (pause, None)).0,
                0.5
            );
        }
        // Each excess after a pause halves it again, to the floor.
        let mut at = start;
        for _ in 0..5 {
            at += pause;
            learned.lower(&bucket, "ww1/1 app", at, (pause, None));
        }
        let start = at;
        assert_eq!(
            learned.rate(&bucket, rate, start),
            Rate::per_minute(625, 12)
        );
        let later = start + Duration::from_secs(60);
        let back = learned.rate(&bucket, rate, later);
        assert_eq!(back.count, (10_000.0 * (FLOOR + 0.2)) as u32);
        let (shown, _) = learned.shown(later);
        assert_eq!(shown.len(), 1);
        assert_eq!(
            (shown[0].budget.as_str(), shown[0].lowered),
            ("ww1/1 app", 11)
        );
        let whole = start + Duration::from_secs(300);
        assert_eq!(
            learned.rate(&bucket, rate, whole),
            rate,
            "whole after five minutes"
        );
        assert!(learned.shown(whole).0.is_empty());
    }

    #[cfg(feature = "send")]
    #[test]
    fn a_block_met_again_right_after_its_pause_is_held_for_the_longer_window() {
        let learned = Learned::default();
        let bucket = KeyHash::of(&["corp"]);
        let (minute, hour) = (Duration::from_secs(60), Duration::from_secs(3600));
        let start = Instant::now();
        let answer = (minute, Some(hour));
        assert_eq!(
            learned.lower(&bucket, "ww1/1 app", start, answer),
            (0.5, Some(minute)),
            "a first 45009: the minute's block"
        );
        // Within the pause: the same excess, held already.
        let within = start + Duration::from_secs(30);
        assert_eq!(learned.lower(&bucket, "ww1/1 app", within, answer).1, None);
        // Blocked again right after the minute: the hour's count was passed.
        let after = start + Duration::from_secs(61);
        let (factor, held) = learned.lower(&bucket, "ww1/1 app", after, answer);
        assert_eq!(held, Some(hour));
        assert!(factor < 0.5, "lowered again: {factor}");
        let within = after + Duration::from_secs(1800);
        assert_eq!(learned.lower(&bucket, "ww1/1 app", within, answer).1, None);
        // Long after, a new excess is a minute's again; an answer with no longer window
        // (Feishu's 429 names its reset) never escalates.
        let later = after + hour * 3;
        assert_eq!(
            learned.lower(&bucket, "ww1/1 app", later, answer).1,
            Some(minute)
        );
        let feishu = KeyHash::of(&["feishu app"]);
        assert_eq!(
            learned.lower(&feishu, "cli_a app", start, (minute, None)).1,
            Some(minute)
        );
        let again = start + Duration::from_secs(61);
        assert_eq!(
            learned.lower(&feishu, "cli_a app", again, (minute, None)).1,
            Some(minute)
        );
    }

    #[test]
    fn a_small_rate_keeps_one_call_and_a_burst_of_one() {
        let rate = Rate::per_second(5);
        assert_eq!(scaled(rate, FLOOR), Rate::per_second(1));
        assert_eq!(scaled(rate, 1.0), rate);
    }

    #[cfg(feature = "send")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_capped_sender_never_has_more_in_flight_and_grows_back() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let learned = Arc::new(Learned::default());
        let deadline = Instant::now() + Duration::from_secs(5);
        let held: Vec<_> =
            futures_util::future::join_all((0..8).map(|_| learned.enter("ww1/1", deadline))).await;
        assert!(held.iter().all(Option::is_some), "no cap until told");
        assert_eq!(learned.lower_in_flight("ww1/1", Instant::now()), 4);
        drop(held);
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let calls: Vec<_> = (0..32)
            .map(|_| {
                let (learned, now, most) = (learned.clone(), now.clone(), most.clone());
                tokio::spawn(async move {
                    let Some(_call) = learned.enter("ww1/1", deadline).await else {
                        return false;
                    };
                    let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(in_flight, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    true
                })
            })
            .collect();
        for call in calls {
            assert!(call.await.expect("join"), "every call gets its turn");
        }
        assert_eq!(most.load(Ordering::SeqCst), 4, "the cap, exactly");
        let other = learned.enter("ww2/1", deadline).await;
        assert!(other.is_some(), "another sender is not capped");
        let (_, senders) = learned.shown(Instant::now());
        assert_eq!((senders.len(), senders[0].now), (1, 4.0));
        let grown = Instant::now() + CAP_STEP * 3;
        assert_eq!(learned.shown(grown).1[0].now, 7.0, "a call more every step");
    }
}
