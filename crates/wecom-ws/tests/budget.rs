//! The per-conversation budget keeps a bot within WeCom's 30 messages per minute and 1 000 per
//! hour to one conversation, however its calls come and however late they arrive.

use std::time::Duration;

use oncegate_core::RateVerdict;
use oncegate_core::rates::gcra;
use oncegate_wecom_ws::CONVERSATION_BUDGETS;
use proptest::prelude::*;

/// Sends of callers who ask again `gaps` (cycled, µs) after each send, each taking the buckets
/// one after another as the gateway does (waiting where told), arriving a jitter later; sorted.
fn arrivals(span: Duration, gaps: &[u64], jitters: &[u64]) -> Vec<u64> {
    let mut tats = [None; CONVERSATION_BUDGETS.len()];
    let (mut now, mut out) = (0u64, Vec::new());
    let end = span.as_micros() as u64;
    while now < end {
        for (tat, rate) in tats.iter_mut().zip(CONVERSATION_BUDGETS) {
            loop {
                let (verdict, next) = gcra(*tat, now, rate);
                match verdict {
                    RateVerdict::Granted => {
                        *tat = next;
                        break;
                    }
                    RateVerdict::Wait(wait) => now += wait.as_micros() as u64,
                }
            }
        }
        out.push(now + jitters[out.len() % jitters.len()]);
        now += gaps[out.len() % gaps.len()];
    }
    out.sort_unstable();
    out
}

/// The most arrivals inside any window of `window`.
fn most_in_any(arrivals: &[u64], window: Duration) -> usize {
    let window = window.as_micros() as u64;
    let mut most = 0;
    let mut start = 0;
    for end in 0..arrivals.len() {
        while arrivals[end] - arrivals[start] >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_conversation_never_gets_more_than_30_a_minute_or_1000_an_hour(
        gaps in prop::collection::vec(0u64..20_000_000, 1..16),
        jitters in prop::collection::vec(0u64..3_000_000, 1..64),
    ) {
        let arrivals = arrivals(Duration::from_secs(3 * 3600), &gaps, &jitters);
        let minute = most_in_any(&arrivals, Duration::from_secs(60));
        let hour = most_in_any(&arrivals, Duration::from_secs(3600));
        prop_assert!(minute <= 30, "{minute} in one minute");
        prop_assert!(hour <= 1000, "{hour} in one hour");
    }
}

#[test]
fn the_budget_still_lets_a_busy_conversation_talk() {
    // Asked without pause for three hours: about 900 an hour get through, 24 a minute at first.
    let arrivals = arrivals(Duration::from_secs(3 * 3600), &[0], &[0]);
    assert!(arrivals.len() >= 2_700, "{}", arrivals.len());
    assert!(most_in_any(&arrivals, Duration::from_secs(60)) >= 24);
}
