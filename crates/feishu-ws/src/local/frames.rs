//! Frames and documents as Feishu sends them, for tests and `simulate`.

use super::*;

/// A data frame of type `event`, part `seq` of `sum`.
pub fn data_frame(seq_id: u64, message_id: &str, sum: usize, seq: usize, part: &[u8]) -> Vec<u8> {
    let header = |key: &str, value: String| Header {
        key: key.into(),
        value,
    };
    Frame {
        seq_id,
        log_id: seq_id + 1_000_000,
        service: 1,
        method: METHOD_DATA,
        headers: vec![
            header("type", "event".into()),
            header("message_id", message_id.into()),
            header("sum", sum.to_string()),
            header("seq", seq.to_string()),
            header("trace_id", format!("trace-{message_id}")),
        ],
        payload_encoding: None,
        payload_type: None,
        payload: Some(Bytes::copy_from_slice(part)),
        log_id_new: None,
    }
    .to_bytes()
}

/// A schema 2.0 `im.message.receive_v1` event, as Feishu pushes it.
pub fn message_event(app_id: &str, event_id: &str, chat: &str, created_ms: u64) -> Vec<u8> {
    serde_json::json!({
        "schema": "2.0",
        "header": {
            "event_id": event_id, "token": "", "create_time": created_ms.to_string(),
            "event_type": "im.message.receive_v1", "tenant_key": "local", "app_id": app_id,
        },
        "event": {
            "sender": {"sender_id": {"open_id": "ou_local"}, "sender_type": "user", "tenant_key": "local"},
            "message": {
                "message_id": format!("om_{event_id}"), "create_time": created_ms.to_string(),
                "chat_id": chat, "chat_type": "group",
                "message_type": "text", "content": "{\"text\":\"hello\"}",
            }
        }
    })
    .to_string()
    .into_bytes()
}

/// A `card.action.trigger` callback, as Feishu pushes it over the socket.
pub fn card_action(app_id: &str, event_id: &str, value: &str) -> Vec<u8> {
    serde_json::json!({
        "schema": "2.0",
        "header": {
            "event_id": event_id, "token": "", "create_time": "1700000000000",
            "event_type": "card.action.trigger", "tenant_key": "local", "app_id": app_id,
        },
        "event": {
            "operator": {"open_id": "ou_local"},
            "action": {"tag": "button", "value": {"choice": value}},
            "context": {"open_message_id": "om_card", "open_chat_id": "oc_card"},
        }
    })
    .to_string()
    .into_bytes()
}
