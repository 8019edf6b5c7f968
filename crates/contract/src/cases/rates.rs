//! Rate budgets: GCRA on the store's clock, and the budget held under racing takers.

use std::time::Duration;

use oncegate_core::{ManualClock, Rate, RateAdjust, RateVerdict, Store, key_for};

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

/// A call given back is not counted (a later bucket of the same send said wait), a hold blocks
/// the bucket for its pause (then eases in at the sustained rate) and a shorter one does not
/// shorten it, and giving back more than was
/// taken leaves a fresh bucket, not a debt.
pub fn adjusted_buckets_give_back_and_hold<S: Store>(make: impl Fn(ManualClock) -> S) {
    let clock = clock();
    let store = make(clock.clone());
    let corp = key_for("wecom", "ww_contract", "rate", "corp");
    let rate = Rate::per_second(2);
    block_on(async {
        for _ in 0..2 {
            let granted = store.take_rate(&corp, rate).await.expect("take");
            assert_eq!(granted, RateVerdict::Granted);
        }
        let waited = store.take_rate(&corp, rate).await.expect("take");
        assert!(matches!(waited, RateVerdict::Wait(_)), "the burst is spent");
        store
            .adjust_rate(&corp, RateAdjust::GiveBack(rate))
            .await
            .expect("give back");
        let granted = store.take_rate(&corp, rate).await.expect("take");
        assert_eq!(granted, RateVerdict::Granted, "the call given back is free");

        clock.advance_ms(10_000);
        store
            .adjust_rate(&corp, RateAdjust::Hold(rate, Duration::from_secs(60)))
            .await
            .expect("hold");
        store
            .adjust_rate(&corp, RateAdjust::Hold(rate, Duration::from_secs(1)))
            .await
            .expect("hold");
        let waited = store.take_rate(&corp, rate).await.expect("take");
        assert_eq!(waited, RateVerdict::Wait(Duration::from_secs(60)));
        clock.advance_ms(59_000);
        let waited = store.take_rate(&corp, rate).await.expect("take");
        assert_eq!(waited, RateVerdict::Wait(Duration::from_secs(1)));
        clock.advance_ms(1_000);
        let granted = store.take_rate(&corp, rate).await.expect("take");
        assert_eq!(granted, RateVerdict::Granted, "the pause is over");
        // The burst comes back at the sustained rate, not at once: a blocked bucket eases in.
        let waited = store.take_rate(&corp, rate).await.expect("take");
        assert_eq!(waited, RateVerdict::Wait(Duration::from_millis(500)));

        let fresh = key_for("wecom", "ww_contract", "rate", "fresh");
        store
            .adjust_rate(&fresh, RateAdjust::GiveBack(rate))
            .await
            .expect("give back");
        let mut granted = 0;
        for _ in 0..3 {
            if store.take_rate(&fresh, rate).await.expect("take") == RateVerdict::Granted {
                granted += 1;
            }
        }
        assert_eq!(granted, 2, "no debt, no credit: the burst");
    });
}
