//! What comes after a failed delivery: another attempt after a wait (the route's schedule or
//! the dispatcher's doubling backoff, never sooner than the downstream's `Retry-After`), the
//! dead letters, or — for an event that has held its chat's later events back as long as its
//! route allows — the dead letters at once, so that the chat goes on.

use std::time::Duration;

use oncegate_config::DispatcherConfig;

use crate::sink::SinkError;

/// The longest `Retry-After` a downstream gets waited for when the longest wait configured is
/// shorter: long enough for a maintenance window's 429s or 503s, short enough that an absurd
/// header cannot park an event for a day.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(600);

/// How a route retries an event whose delivery failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retries {
    /// The wait after each failed attempt; an event is tried once more than it has entries.
    /// `None`: the dispatcher's backoff (`backoff_base` doubling up to `backoff_max`, for
    /// `max_attempts`).
    pub schedule: Option<Vec<Duration>>,
    /// The longest an event with a chat (an order key) may hold that chat's later events back,
    /// from its first attempt: past it, it is set aside in the dead letters. `None`: no bound.
    pub hold_chat: Option<Duration>,
}

/// What to do with an event whose attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try again after this wait.
    Retry(Duration),
    /// No attempt left: dead-letter it.
    GiveUp,
    /// Its chat waited behind it as long as the route allows: dead-letter it now, having held
    /// the chat this long.
    SetAside(Duration),
}

/// The failed attempt, as far as the choice needs it.
pub(crate) struct Failed<'a> {
    /// Its number, from 0.
    pub(crate) attempt: u32,
    /// What the sink said.
    pub(crate) error: &'a SinkError,
    /// Whether the event holds a chat (it has an order key).
    pub(crate) ordered: bool,
    /// When its first attempt started, if this gateway saw it (unix ms).
    pub(crate) first_at_ms: Option<u64>,
    /// When this attempt started (unix ms).
    pub(crate) started_ms: u64,
    /// Now (unix ms).
    pub(crate) now_ms: u64,
}

impl Retries {
    /// How many attempts an event gets.
    fn attempts(&self, dispatcher: &DispatcherConfig) -> u32 {
        match &self.schedule {
            Some(schedule) => u32::try_from(schedule.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            None => dispatcher.max_attempts,
        }
    }

    /// The wait after attempt `attempt` failed, jittered so that the retries of many events
    /// spread out: a schedule's waits within their last tenth, the backoff's within its half.
    fn wait(&self, dispatcher: &DispatcherConfig, attempt: u32) -> Duration {
        let (full, spread) = self.full_wait(dispatcher, attempt);
        let least = full - full / spread;
        least
            + Duration::from_nanos(fastrand::u64(
                0..=u64::try_from((full - least).as_nanos()).unwrap_or(u64::MAX),
            ))
    }

    /// The unjittered wait after attempt `attempt`, and the fraction (1/n) jitter may take off.
    fn full_wait(&self, dispatcher: &DispatcherConfig, attempt: u32) -> (Duration, u32) {
        match &self.schedule {
            Some(schedule) => {
                let index = usize::try_from(attempt).unwrap_or(usize::MAX);
                let last = schedule.last().copied().unwrap_or_default();
                (schedule.get(index).copied().unwrap_or(last), 10)
            }
            None => {
                let doubled = dispatcher
                    .backoff_base
                    .saturating_mul(1u32 << attempt.min(20));
                (doubled.min(dispatcher.backoff_max), 2)
            }
        }
    }

    /// The least time the waits before attempt `attempt` took: how long an event that retried
    /// this often held its chat at least, when no gateway here saw its first attempt (it began
    /// on another gateway, or before a restart).
    fn least_held(&self, dispatcher: &DispatcherConfig, attempt: u32) -> Duration {
        (0..attempt)
            .map(|before| {
                let (full, spread) = self.full_wait(dispatcher, before);
                full - full / spread
            })
            .sum()
    }

    /// What comes after `failed`.
    pub(crate) fn next(&self, dispatcher: &DispatcherConfig, failed: &Failed<'_>) -> Next {
        let retryable = matches!(
            failed.error,
            SinkError::Transient(_) | SinkError::RetryAfter { .. }
        );
        if !retryable || failed.attempt.saturating_add(1) >= self.attempts(dispatcher) {
            return Next::GiveUp;
        }
        let mut wait = self.wait(dispatcher, failed.attempt);
        // The downstream's own wait: retrying sooner only meets the same answer and spends an
        // attempt. Up to the longest wait configured, or `RETRY_AFTER_MAX` when that is shorter.
        if let SinkError::RetryAfter { after, .. } = failed.error {
            let longest = match &self.schedule {
                Some(schedule) => schedule.iter().copied().max().unwrap_or_default(),
                None => dispatcher.backoff_max,
            };
            wait = wait.max((*after).min(longest.max(RETRY_AFTER_MAX)));
        }
        let (Some(hold), true) = (self.hold_chat, failed.ordered) else {
            return Next::Retry(wait);
        };
        let least_start = failed
            .started_ms
            .saturating_sub(oncegate_core::store::millis(
                self.least_held(dispatcher, failed.attempt),
            ));
        let first_ms = failed.first_at_ms.unwrap_or(least_start).min(least_start);
        let held = Duration::from_millis(failed.now_ms.saturating_sub(first_ms));
        match hold.checked_sub(held) {
            // One last attempt when the bound comes, if it comes before the wait ends.
            Some(left) if !left.is_zero() => Next::Retry(wait.min(left)),
            _ => Next::SetAside(held),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dispatcher() -> DispatcherConfig {
        DispatcherConfig {
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            ..DispatcherConfig::default()
        }
    }

    fn failed(attempt: u32, error: &SinkError) -> Failed<'_> {
        Failed {
            attempt,
            error,
            ordered: true,
            first_at_ms: None,
            started_ms: 1_000_000,
            now_ms: 1_000_000,
        }
    }

    fn transient() -> SinkError {
        SinkError::Transient("503".into())
    }

    #[test]
    fn the_backoff_doubles_with_jitter_and_caps_for_max_attempts() {
        let retries = Retries::default();
        let error = transient();
        for attempt in 0..4 {
            let full = (Duration::from_secs(1) * 2u32.pow(attempt)).min(Duration::from_secs(60));
            let Next::Retry(wait) = retries.next(&dispatcher(), &failed(attempt, &error)) else {
                panic!("attempt {attempt} is retried");
            };
            assert!(
                wait >= full / 2 && wait <= full,
                "attempt {attempt}: {wait:?}"
            );
        }
        assert_eq!(
            retries.next(&dispatcher(), &failed(4, &error)),
            Next::GiveUp
        );
        let permanent = SinkError::Permanent("422".into());
        assert_eq!(
            retries.next(&dispatcher(), &failed(0, &permanent)),
            Next::GiveUp
        );
    }

    #[test]
    fn a_schedule_sets_the_waits_and_the_attempts() {
        let schedule = oncegate_config::STANDARD_WEBHOOKS_SCHEDULE.to_vec();
        let retries = Retries {
            schedule: Some(schedule.clone()),
            hold_chat: None,
        };
        let error = transient();
        for (attempt, full) in schedule.iter().enumerate() {
            let attempt = u32::try_from(attempt).expect("small");
            let Next::Retry(wait) = retries.next(&dispatcher(), &failed(attempt, &error)) else {
                panic!("attempt {attempt} is retried (max_attempts does not apply)");
            };
            assert!(
                wait <= *full && wait >= *full - *full / 10,
                "{attempt}: {wait:?}"
            );
        }
        assert_eq!(
            retries.next(&dispatcher(), &failed(7, &error)),
            Next::GiveUp
        );
        // Retry-After beyond the wait is honoured, up to the schedule's longest wait.
        let asked = SinkError::RetryAfter {
            after: Duration::from_secs(60),
            reason: "429".into(),
        };
        let Next::Retry(wait) = retries.next(&dispatcher(), &failed(0, &asked)) else {
            panic!("retried");
        };
        assert_eq!(wait, Duration::from_secs(60), "not the schedule's 5 s");
    }

    #[test]
    fn a_chat_is_held_no_longer_than_the_route_allows() {
        let retries = Retries {
            schedule: Some(vec![Duration::from_secs(60); 10]),
            hold_chat: Some(Duration::from_secs(150)),
        };
        let error = transient();
        let mut attempt = failed(0, &error);
        attempt.first_at_ms = Some(1_000_000);
        // 100 s after the first attempt: the next wait (≤ 60 s) ends within the bound.
        attempt.now_ms = 1_100_000;
        assert!(matches!(
            retries.next(&dispatcher(), &attempt),
            Next::Retry(wait) if wait <= Duration::from_secs(50)
        ));
        // 149 s: one last attempt at the bound.
        attempt.now_ms = 1_149_000;
        assert_eq!(
            retries.next(&dispatcher(), &attempt),
            Next::Retry(Duration::from_secs(1))
        );
        attempt.now_ms = 1_150_000;
        assert_eq!(
            retries.next(&dispatcher(), &attempt),
            Next::SetAside(Duration::from_secs(150))
        );
        // An event without a chat holds nothing: it runs its whole schedule.
        attempt.ordered = false;
        assert!(matches!(
            retries.next(&dispatcher(), &attempt),
            Next::Retry(_)
        ));
        // Its first attempt unseen here (another gateway, a restart): at its third attempt it
        // waited at least two waits' lower bounds (2 × 54 s), so 42 s more is all it gets.
        let mut third = failed(2, &error);
        third.now_ms = third.started_ms;
        assert!(matches!(
            retries.next(&dispatcher(), &third),
            Next::Retry(wait) if wait <= Duration::from_secs(42)
        ));
        third.attempt = 3;
        assert_eq!(
            retries.next(&dispatcher(), &third),
            Next::SetAside(Duration::from_secs(162))
        );
    }
}
