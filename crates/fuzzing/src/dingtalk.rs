//! DingTalk's event subscription: the whole callback, sealed as DingTalk does or forged.

use oncegate_core::{Callback, Decoded, Method, RefusalKind, Sealer, WebhookSource};
use oncegate_dingtalk::DingtalkApp;

use crate::wecom::NoHeaders;

/// One callback. The first byte chooses: bit 0 the rest sealed as DingTalk would (so the
/// fuzzer explores decrypted documents: an admitted event has its id and key, and nothing
/// sealed is refused as unauthenticated), else the rest is a raw body under a query made of
/// its first line (a forgery: never taken, unless it is DingTalk's own vector).
pub fn dingtalk_callback(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let Ok(app) = DingtalkApp::new(
        "mryue",
        "Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7",
        "ding6ccabc44d2c8d38b",
    ) else {
        panic!("a valid app");
    };
    if mode & 1 != 0 {
        let sealed = app.seal(rest, 1_700_000_000, "nonce", [9; 16]);
        let opened = app.decode(&Callback {
            method: Method::Post,
            query: sealed.query.as_deref(),
            headers: &NoHeaders,
            body: &sealed.body,
            tenant: None,
        });
        match opened {
            Ok(Decoded::Admit { admit, .. }) => {
                assert!(!admit.event.event_id.is_empty() && !admit.keys.as_slice().is_empty());
            }
            Ok(_) => {}
            Err(refusal) => assert_ne!(
                refusal.kind,
                RefusalKind::Unauthenticated,
                "a sealed request failed its signature: {refusal:?}"
            ),
        }
        return;
    }
    let split = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let query = String::from_utf8_lossy(&rest[..split]).into_owned();
    let body = rest.get(split + 1..).unwrap_or_default();
    let taken = app.decode(&Callback {
        method: Method::Post,
        query: Some(&query),
        headers: &NoHeaders,
        body,
        tenant: None,
    });
    // The only signed request the fuzzer can hold is the official vector of the seed corpus
    // (its hex signature in either case: the same digest).
    if taken.is_ok() {
        assert!(
            query
                .to_ascii_lowercase()
                .contains("03044561471240d4a14bb09372dfcfd4fd0e40cb"),
            "a forged DingTalk callback was taken: {query}"
        );
    }
}

/// One text frame of DingTalk's Stream mode as the connection reads it: it is refused, or a
/// system frame, or an event or robot message whose key depends on the frame's ids and content
/// alone — never on its delivery id (`messageId`), which a re-push may change.
pub fn dingtalk_stream_frames(data: &[u8]) {
    use oncegate_dingtalk::stream::{self, Inbound};
    // A WebSocket text message is UTF-8 (the socket refuses one that is not); serde skips an
    // unknown field's string without reading it as text, so bytes could pass that no frame is.
    if std::str::from_utf8(data).is_err() {
        return;
    }
    let Ok(pushed) = stream::decode(data, "dingFUZZ") else {
        return;
    };
    assert!(
        !pushed.message_id.is_empty(),
        "a frame without a delivery id was taken"
    );
    let admit = match pushed.inbound {
        Inbound::Event(admit) | Inbound::BotMessage(admit) => admit,
        Inbound::Ping { .. } | Inbound::Disconnect { .. } | Inbound::Unknown { .. } => return,
    };
    assert_eq!(&*admit.event.app, "dingFUZZ");
    assert!(!admit.event.event_id.is_empty());
    // The same frame under another delivery id keys the same.
    let Ok(mut frame) = serde_json::from_slice::<serde_json::Value>(data) else {
        panic!("a decoded frame is JSON");
    };
    frame["headers"]["messageId"] = serde_json::Value::from("another-delivery");
    let again = match stream::decode(frame.to_string().as_bytes(), "dingFUZZ").map(|p| p.inbound) {
        Ok(Inbound::Event(again) | Inbound::BotMessage(again)) => again,
        other => panic!("the same frame under another delivery id: {other:?}"),
    };
    assert_eq!(
        admit.keys, again.keys,
        "a re-push under a new messageId is the same event"
    );
}
