//! The budgets against the platforms' own counting: however greedy the callers and however
//! late each call arrives after its grant (within a bound), the platform never counts more
//! than it allows.

use std::time::Duration;

use oncegate_core::rates::gcra;
use oncegate_core::{Rate, RateVerdict};
use oncegate_send::limits::{
    FEISHU_APP_MINUTE, FEISHU_RECEIVER, WECOM_APP, WECOM_APP_HOUR, WECOM_ISV, WECOM_ISV_HOUR,
    WECOM_MEMBER, WECOM_MEMBER_HOUR,
};
use proptest::prelude::*;

/// Grants of `budget` to callers who ask again at once after each grant and as soon as told,
/// over `span`, each arriving at the platform a jitter (from `jitters`, cycled) later; sorted.
fn arrivals(budget: Rate, span: Duration, jitters: &[u64]) -> Vec<u64> {
    let (mut tat, mut now, mut out) = (None, 0u64, Vec::new());
    let end = span.as_micros() as u64;
    while now < end {
        let (verdict, next) = gcra(tat, now, budget);
        match verdict {
            RateVerdict::Granted => {
                tat = next;
                out.push(now + jitters[out.len() % jitters.len()]);
            }
            RateVerdict::Wait(wait) => now += wait.as_micros() as u64,
        }
    }
    out.sort_unstable();
    out
}

/// The most arrivals inside any window of `window`.
fn most_in_any(arrivals: &[u64], window: Duration) -> usize {
    let window = window.as_micros() as u64;
    (0..arrivals.len())
        .map(|i| {
            arrivals[i..]
                .iter()
                .take_while(|at| **at - arrivals[i] < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// WeCom drops, without a word, what passes 30 in a minute to one member.
    #[test]
    fn wecom_members_never_get_more_than_30_in_any_minute(
        jitters in prop::collection::vec(0u64..3_000_000, 1..64),
    ) {
        let arrivals = arrivals(WECOM_MEMBER, Duration::from_secs(300), &jitters);
        prop_assert!(arrivals.len() >= 110, "the budget still sends: {}", arrivals.len());
        let most = most_in_any(&arrivals, Duration::from_secs(60));
        prop_assert!(most <= 30, "{most} arrivals in one minute");
    }

    /// Feishu counts 5 per second per receiver with a burst of 5 (as its local stand-in does):
    /// several gateways sharing a receiver's budget, whose calls arrive up to 250 ms late,
    /// are never refused.
    #[test]
    fn feishu_receivers_are_never_refused_when_calls_arrive_late(
        jitters in prop::collection::vec(0u64..250_000, 1..64),
    ) {
        let arrivals = arrivals(FEISHU_RECEIVER, Duration::from_secs(60), &jitters);
        prop_assert!(arrivals.len() >= 260, "the budget still sends: {}", arrivals.len());
        let mut tat = None;
        for at in arrivals {
            let (verdict, next) = gcra(tat, at, Rate::per_second(5));
            prop_assert_eq!(verdict, RateVerdict::Granted, "refused at {} µs", at);
            tat = next;
        }
    }
}

#[test]
fn an_unjittered_wecom_burst_is_counted_as_documented() {
    let arrivals = arrivals(WECOM_MEMBER, Duration::from_secs(60), &[0]);
    assert_eq!(most_in_any(&arrivals, Duration::from_secs(60)), 28);
}

/// The minute and hour budgets, each against the count the platform publishes for it, with
/// calls reaching the platform up to a second after their grants: never over.
#[test]
fn the_minute_and_hour_budgets_stay_inside_the_published_counts() {
    let minute = Duration::from_secs(60);
    let hour = Duration::from_secs(3600);
    let jitters = [0, 1_000_000, 400_000, 0, 0, 999_000, 10];
    for (name, budget, window, published) in [
        ("WeCom per member per hour", WECOM_MEMBER_HOUR, hour, 1_000),
        ("WeCom per corp per minute", WECOM_APP, minute, 10_000),
        ("WeCom per corp per hour", WECOM_APP_HOUR, hour, 150_000),
        (
            "WeCom per provider address per minute",
            WECOM_ISV,
            minute,
            40_000,
        ),
        (
            "WeCom per provider address per hour",
            WECOM_ISV_HOUR,
            hour,
            1_200_000,
        ),
        (
            "Feishu sends per app and tenant per minute",
            FEISHU_APP_MINUTE,
            minute,
            1_000,
        ),
    ] {
        let arrivals = arrivals(budget, window * 2, &jitters);
        let most = most_in_window(&arrivals, window);
        assert!(most <= published, "{name}: {most} in one window");
        assert!(
            most * 100 >= published * 90,
            "{name}: {most} in one window, a budget that wastes the quota"
        );
    }
}

/// `most_in_any` in one pass, for windows of a million calls.
fn most_in_window(arrivals: &[u64], window: Duration) -> usize {
    let window = window.as_micros() as u64;
    let (mut most, mut first) = (0, 0);
    for (last, at) in arrivals.iter().enumerate() {
        while *at - arrivals[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}
