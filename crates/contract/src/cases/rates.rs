//! Rate budgets: GCRA on the store's clock, and the budget held under racing takers.

use std::time::Duration;

use oncegate_core::{ManualClock, Rate, RateVerdict, Store, key_for};

use super::race;
use crate::{block_on, clock};

/// A burst is granted, the next call waits one emission interval, time moves on and it goes;
/// buckets are independent.
pub fn rates_grant_a_burst_then_the_sustained_rate<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    let chat = key_for("feishu", "cli_contract", "rate", "chat-1");
    let rate = Rate::per_second(5);
    block_on(async {
        for call in 0..5 {
            let verdict = store.take_rate(&chat, rate).await.expect("take");
            assert_eq!(verdict, RateVerdict::Granted, "call {call} of the burst");
        }
        let waited = store.take_rate(&chat, rate).await.expect("take");
        assert_eq!(waited, RateVerdict::Wait(Duration::from_millis(200)));
        clock.advance_ms(150);
        let waited = store.take_rate(&chat, rate).await.expect("take");
        assert_eq!(
            waited,
            RateVerdict::Wait(Duration::from_millis(50)),
            "nothing was taken"
        );
        clock.advance_ms(50);
        let granted = store.take_rate(&chat, rate).await.expect("take");
        assert_eq!(granted, RateVerdict::Granted);
        let other = key_for("feishu", "cli_contract", "rate", "chat-2");
        let granted = store.take_rate(&other, rate).await.expect("take");
        assert_eq!(granted, RateVerdict::Granted, "another bucket is untouched");
        // After a quiet spell the burst is back, and no more than it.
        clock.advance_ms(10_000);
        let mut granted = 0;
        for _ in 0..8 {
            if store.take_rate(&chat, rate).await.expect("take") == RateVerdict::Granted {
                granted += 1;
            }
        }
        assert_eq!(granted, 5);
    });
}

/// Eight threads take from one bucket at once, many rounds: exactly the budget is granted at
/// one instant, never more.
pub fn racing_takers_never_exceed_the_budget<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    let rate = Rate {
        count: 30,
        per: Duration::from_secs(60),
        burst: 7,
    };
    for round in 0..20 {
        let bucket = key_for("wecom", "ww_contract", "rate", &format!("member-{round}"));
        let grants = race(&store, 8, |store, _| {
            block_on(async {
                let mut granted = 0;
                for _ in 0..5 {
                    if store.take_rate(&bucket, rate).await.expect("take") == RateVerdict::Granted {
                        granted += 1;
                    }
                }
                granted
            })
        });
        assert_eq!(
            grants.iter().sum::<usize>(),
            7,
            "round {round}: the burst, exactly"
        );
    }
}
