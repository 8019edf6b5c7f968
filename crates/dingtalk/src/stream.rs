//! DingTalk's Stream mode as data (`shared/protocols/sources.md` §1c): the frames the server
//! pushes (`SYSTEM` pings and disconnects, `EVENT`s, robot `CALLBACK`s) read into what the
//! gateway admits, and the acks it answers with. No I/O: the connection is
//! `oncegate-dingtalk-stream`'s.
//!
//! Keys: an event by its header `eventId`, a robot message by its `msgId` (else a digest of the
//! robot, conversation, sender, time and text) — never by the delivery's `messageId`, which a
//! re-push of the same message may not repeat.
//!
//! ```
//! use oncegate_dingtalk::stream::{self, Inbound};
//!
//! let frame = br#"{"specVersion":"1.0","type":"EVENT","headers":{"messageId":"m-1",
//!     "topic":"*","eventId":"ev-1","eventType":"chat_update_title","eventCorpId":"ding1",
//!     "eventBornTime":"1700000000000"},"data":"{\"chatId\":\"chat-1\"}"}"#;
//! let pushed = stream::decode(frame, "dingappkey").expect("a frame");
//! assert_eq!(pushed.message_id, "m-1");
//! let Inbound::Event(admit) = pushed.inbound else { panic!("an event") };
//! assert_eq!(&*admit.event.event_id, "ev-1");
//! assert_eq!(admit.event.order_key.as_deref(), Some("chat-1"));
//! ```

use std::sync::Arc;

use bytes::Bytes;
use oncegate_core::{Admit, Event, Keys, Refusal, RefusalKind, key_for};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::Digest as _;

use crate::source::{CHAT_FIELDS, arrival_ms, field};

/// The topic of robot messages pushed as `CALLBACK`s.
pub const BOT_TOPIC: &str = "/v1.0/im/bot/messages/get";
/// The event type robot messages are routed by (DingTalk names none: the callback's topic
/// says what they are).
pub const BOT_MESSAGE: &str = "bot_message";

/// A frame as it travels, in both directions' shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamFrame {
    /// `1.0`.
    #[serde(rename = "specVersion", default)]
    pub spec_version: String,
    /// `SYSTEM`, `EVENT` or `CALLBACK`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `topic`, `messageId`, `contentType`, `time` and, for events, `eventId`, `eventType`,
    /// `eventCorpId`, `eventBornTime`.
    pub headers: Map<String, Value>,
    /// The payload: a JSON document as a string.
    #[serde(default)]
    pub data: String,
}

impl StreamFrame {
    /// A header as text (DingTalk sends them as strings; a number is read too).
    pub fn header(&self, name: &str) -> Option<Arc<str>> {
        match self.headers.get(name)? {
            Value::String(text) if !text.is_empty() => Some(Arc::from(text.as_str())),
            Value::Number(number) => Some(Arc::from(number.to_string())),
            _ => None,
        }
    }
}

/// What a pushed frame asks of the client.
#[derive(Debug)]
pub enum Inbound {
    /// A keep-alive: echo its `data` in a 200 ack.
    Ping {
        /// The `data` to echo (`{"opaque": …}`).
        data: String,
    },
    /// The server will close the connection in about 10 s: ack it, then connect anew with a
    /// new ticket.
    Disconnect {
        /// Why, as the server said.
        reason: String,
    },
    /// An event (`EVENT`) to admit; acked with `SUCCESS` once admitted, `LATER` otherwise.
    Event(Admit),
    /// A robot message (`CALLBACK` on [`BOT_TOPIC`]) to admit; acked once admitted.
    BotMessage(Admit),
    /// A system frame or callback topic this client does not know: answered 404, as DingTalk's
    /// own SDKs answer an unknown topic.
    Unknown {
        /// Its topic.
        topic: String,
    },
}

/// One pushed frame: its delivery id (what the ack names) and what it asks.
#[derive(Debug)]
pub struct Pushed {
    /// The header `messageId`: the ack's reference, never a dedup key.
    pub message_id: String,
    /// What it asks.
    pub inbound: Inbound,
}

fn bad(label: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::new(RefusalKind::BadInput, label, message.into())
}

/// The delivery id (`headers.messageId`) of a frame [`decode`] refused, when it has one: the
/// frame is then acked with code 500 (DingTalk's error), an answer rather than silence.
pub fn message_id_of(text: &[u8]) -> Option<String> {
    let document: Value = serde_json::from_slice(text).ok()?;
    let id = document.get("headers")?.get("messageId")?.as_str()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// Reads one frame pushed to the app `app_key` (its Client ID).
pub fn decode(text: &[u8], app_key: &str) -> Result<Pushed, Refusal> {
    let frame: StreamFrame = serde_json::from_slice(text)
        .map_err(|error| bad("bad_frame", format!("not a Stream frame: {error}")))?;
    let message_id = frame
        .header("messageId")
        .ok_or_else(|| bad("bad_frame", "the frame has no messageId header"))?
        .to_string();
    let topic = frame
        .header("topic")
        .map(|topic| topic.to_string())
        .unwrap_or_default();
    let inbound = match (frame.kind.as_str(), topic.as_str()) {
        ("SYSTEM", "ping") => Inbound::Ping { data: frame.data },
        ("SYSTEM", "disconnect") => Inbound::Disconnect {
            reason: serde_json::from_str::<Value>(&frame.data)
                .ok()
                .and_then(|data| {
                    data.get("reason")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_default(),
        },
        ("EVENT", _) => Inbound::Event(event(&frame, app_key)?),
        ("CALLBACK", BOT_TOPIC) => Inbound::BotMessage(bot_message(&frame, app_key)?),
        ("SYSTEM" | "CALLBACK", _) => Inbound::Unknown { topic },
        (kind, _) => return Err(bad("bad_frame", format!("unknown frame type {kind:?}"))),
    };
    Ok(Pushed {
        message_id,
        inbound,
    })
}

/// The frame's `data` as a JSON document.
fn document(frame: &StreamFrame) -> Result<Value, Refusal> {
    serde_json::from_str(&frame.data).map_err(|_| bad("not_json", "the frame's data is not JSON"))
}

fn event(frame: &StreamFrame, app_key: &str) -> Result<Admit, Refusal> {
    let data = document(frame)?;
    let event_id = frame
        .header("eventId")
        .ok_or_else(|| bad("no_event_id", "an EVENT frame without an eventId header"))?;
    let event = Event {
        platform: Arc::from("dingtalk"),
        app: Arc::from(app_key),
        tenant: frame.header("eventCorpId"),
        event_id: event_id.clone(),
        event_type: frame
            .header("eventType")
            .unwrap_or_else(|| Arc::from("unknown")),
        created_at_ms: time(frame.header("eventBornTime")),
        order_key: field(&data, CHAT_FIELDS),
        payload: Bytes::from(frame.data.clone()),
    };
    let keys = Keys::new(key_for("dingtalk", app_key, "event_id", &event_id));
    Ok(Admit::new(event, keys))
}

fn bot_message(frame: &StreamFrame, app_key: &str) -> Result<Admit, Refusal> {
    let data = document(frame)?;
    let text = |names: &[&str]| field(&data, names);
    let (kind, event_id) = match text(&["msgId"]) {
        Some(id) => ("msg_id", id),
        None => {
            // No id: what the message is, which a re-push repeats (its JSON is identical).
            let mut digest = sha2::Sha256::new();
            for name in ["robotCode", "conversationId", "senderStaffId", "createAt"] {
                digest.update(text(&[name]).as_deref().unwrap_or("").as_bytes());
                digest.update([0]);
            }
            let content = data.pointer("/text/content").map(Value::to_string);
            digest.update(content.unwrap_or_default().as_bytes());
            (
                "fp",
                Arc::from(oncegate_core::fingerprint_id(&digest.finalize().into())),
            )
        }
    };
    let event = Event {
        platform: Arc::from("dingtalk"),
        app: Arc::from(app_key),
        tenant: text(&["chatbotCorpId", "senderCorpId"]),
        event_id: event_id.clone(),
        event_type: Arc::from(BOT_MESSAGE),
        created_at_ms: time(text(&["createAt"])),
        order_key: text(&["conversationId"]),
        payload: Bytes::from(frame.data.clone()),
    };
    let keys = Keys::new(key_for("dingtalk", app_key, kind, &event_id));
    Ok(Admit::new(event, keys))
}

/// DingTalk's time (ms), else the time the frame arrived.
fn time(text: Option<Arc<str>>) -> u64 {
    text.and_then(|t| t.parse::<u64>().ok())
        .unwrap_or_else(arrival_ms)
}

/// The ack of the frame `message_id`: `code` (200, 404, 500) and `data`, a JSON document as a
/// string.
pub fn ack(message_id: &str, code: u16, data: &str) -> String {
    let message = match code {
        200 => "OK",
        404 => "topic not found",
        _ => "error",
    };
    serde_json::json!({
        "code": code,
        "headers": {"messageId": message_id, "contentType": "application/json"},
        "message": message,
        "data": data,
    })
    .to_string()
}

/// An event's ack data: `SUCCESS` once admitted, `LATER` (DingTalk pushes it again) when not.
pub fn event_status(admitted: bool, message: &str) -> String {
    serde_json::json!({
        "status": if admitted { "SUCCESS" } else { "LATER" },
        "message": message,
    })
    .to_string()
}

/// A robot message's ack data: no answer over the socket (replies go through `/send`).
pub const BOT_ANSWER: &str = r#"{"response":null}"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: &str, headers: Value, data: &str) -> Vec<u8> {
        serde_json::json!({"specVersion": "1.0", "type": kind, "headers": headers, "data": data})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn system_frames_are_pings_and_disconnects() {
        let ping = frame(
            "SYSTEM",
            serde_json::json!({"topic": "ping", "messageId": "p1"}),
            r#"{"opaque":"x1"}"#,
        );
        let pushed = decode(&ping, "app").expect("ping");
        assert_eq!(pushed.message_id, "p1");
        assert!(matches!(pushed.inbound, Inbound::Ping { data } if data == r#"{"opaque":"x1"}"#));
        let bye = frame(
            "SYSTEM",
            serde_json::json!({"topic": "disconnect", "messageId": "d1"}),
            r#"{"reason":"rebalance"}"#,
        );
        assert!(matches!(
            decode(&bye, "app").expect("disconnect").inbound,
            Inbound::Disconnect { reason } if reason == "rebalance"
        ));
        let other = frame(
            "CALLBACK",
            serde_json::json!({"topic": "/v1.0/card/instances/callback", "messageId": "c1"}),
            "{}",
        );
        assert!(matches!(
            decode(&other, "app").expect("unknown").inbound,
            Inbound::Unknown { .. }
        ));
    }

    #[test]
    fn a_robot_message_is_keyed_by_its_msg_id_not_the_delivery() {
        let data = serde_json::json!({
            "msgId": "msgABC", "conversationId": "cid1", "chatbotCorpId": "ding1",
            "createAt": 1_700_000_000_000u64, "text": {"content": "hi"}, "robotCode": "rb",
        })
        .to_string();
        let one = frame(
            "CALLBACK",
            serde_json::json!({"topic": BOT_TOPIC, "messageId": "deliv-1"}),
            &data,
        );
        let again = frame(
            "CALLBACK",
            serde_json::json!({"topic": BOT_TOPIC, "messageId": "deliv-2"}),
            &data,
        );
        let key = |bytes: &[u8]| match decode(bytes, "app").expect("frame").inbound {
            Inbound::BotMessage(admit) => (admit.keys.primary(), admit.event),
            other => panic!("{other:?}"),
        };
        let ((first, event), (second, _)) = (key(&one), key(&again));
        assert_eq!(
            first, second,
            "a re-push under a new messageId is the same message"
        );
        assert_eq!(first, key_for("dingtalk", "app", "msg_id", "msgABC"));
        assert_eq!(&*event.event_type, BOT_MESSAGE);
        assert_eq!(event.order_key.as_deref(), Some("cid1"));
        assert_eq!(event.created_at_ms, 1_700_000_000_000);
        assert_eq!(event.tenant.as_deref(), Some("ding1"));
    }

    #[test]
    fn a_robot_message_without_an_id_is_keyed_by_what_it_says() {
        let message = |text: &str| {
            let data = serde_json::json!({
                "conversationId": "cid1", "senderStaffId": "u1", "createAt": 5,
                "text": {"content": text}, "robotCode": "rb",
            })
            .to_string();
            let bytes = frame(
                "CALLBACK",
                serde_json::json!({"topic": BOT_TOPIC, "messageId": format!("deliv-{text}")}),
                &data,
            );
            match decode(&bytes, "app").expect("frame").inbound {
                Inbound::BotMessage(admit) => admit.keys.primary(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(message("hi"), message("hi"));
        assert_ne!(message("hi"), message("ho"));
    }

    #[test]
    fn frames_that_cannot_be_used_are_refused() {
        for bytes in [
            &b"not json"[..],
            br#"{"type":"EVENT","headers":{},"data":"{}"}"#,
            br#"{"type":"EVENT","headers":{"messageId":"m"},"data":"{}"}"#,
            br#"{"type":"EVENT","headers":{"messageId":"m","eventId":"e"},"data":"nope"}"#,
            br#"{"type":"WHAT","headers":{"messageId":"m"},"data":"{}"}"#,
        ] {
            let refusal = decode(bytes, "app").expect_err("refused");
            assert_eq!(refusal.kind, RefusalKind::BadInput, "{refusal:?}");
        }
    }

    #[test]
    fn acks_name_the_delivery_and_carry_their_data_as_a_string() {
        let ack: Value =
            serde_json::from_str(&ack("m-9", 200, &event_status(false, "busy"))).expect("json");
        assert_eq!(ack["code"], 200);
        assert_eq!(ack["headers"]["messageId"], "m-9");
        let data: Value =
            serde_json::from_str(ack["data"].as_str().expect("a string")).expect("json");
        assert_eq!(data["status"], "LATER");
    }
}
