//! What a store pays to ask whether a queued event is a message to the bot: the read the
//! stores make (`oncegate_feishu::events::addresses_bot`) against the typed read of the same
//! message, side by side in one run, on Feishu's documented `im.message.receive_v1`.

use super::*;

/// The `im.message.receive_v1` page's example (a group message mentioning a person).
const MESSAGE: &str = include_str!("../../feishu/tests/fixtures/message_receive_v1.json");

fn message(payload: String) -> Event {
    Event {
        platform: Arc::from("feishu"),
        app: Arc::from("cli_9f5343c580712544"),
        tenant: Some(Arc::from("2ca1d211f64f6438")),
        event_id: Arc::from("5e3702a84e847582be8db7fb73283c02"),
        event_type: Arc::from("im.message.receive_v1"),
        created_at_ms: 1_608_725_989_000,
        order_key: Some(Arc::from("oc_5ce6d572455d361153b7xx51da133945")),
        payload: Bytes::from(payload),
    }
}

/// Calls of `f` a second, best of three rounds of `calls`.
fn rate(calls: u64, f: impl Fn() -> bool) -> f64 {
    let mut best = 0f64;
    for _ in 0..3 {
        let started = Instant::now();
        let mut yes = 0u64;
        for _ in 0..calls {
            yes += u64::from(std::hint::black_box(f()));
        }
        std::hint::black_box(yes);
        best = best.max(calls as f64 / started.elapsed().as_secs_f64());
    }
    best
}

/// Prints the rows: with the documented mentions (a full read either way), and without any
/// (the stores' read answers from a byte scan).
pub(crate) fn priority_reads(calls: u64) {
    use oncegate_core::FromEvent;
    use oncegate_feishu::events::{MessageReceived, addresses_bot};
    let bot = Some("ou_bot00000000000000000000000001");
    let mentioning = message(MESSAGE.to_owned());
    let start = MESSAGE.find(r#","mentions":"#).unwrap_or(MESSAGE.len());
    let end = MESSAGE.find(r#","user_agent""#).unwrap_or(start);
    let quiet = message(format!("{}{}", &MESSAGE[..start], &MESSAGE[end..]));
    for (label, event) in [("mentions", &mentioning), ("no mention", &quiet)] {
        let typed = rate(calls, || {
            MessageReceived::from_event(event).is_ok_and(|message| message.addresses_bot(bot))
        });
        let ours = rate(calls, || addresses_bot(event, bot));
        row(
            &format!("priority read, {label}"),
            ours,
            typed,
            "/s",
            "against the typed read of the same message",
        );
    }
}
