//! The envelopes: url_verification challenges, schema 2.0, v1, and card callbacks.

use std::sync::Arc;

use bytes::Bytes;
use oncegate_core::{Event, KeyHash, key_for};
use serde_json::Value;

use crate::crypto::{decrypt_with, same, signature};
use crate::{FeishuApp, FeishuError, SignedHeaders};

/// A verified, decoded callback.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// `url_verification`: answer `{"challenge": challenge}` at once.
    Challenge {
        /// The value to echo.
        challenge: String,
    },
    /// An event: admit it, then answer 200.
    Event(Verified),
    /// A card callback (`card.action.trigger`): synchronous and never re-delivered, so the
    /// answer of the handler goes back in the response.
    Card(Verified),
}

/// An event with its dedup keys, from a request whose signature and token checked out.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// The normalized event; its payload is the decrypted JSON.
    pub event: Event,
    /// Dedup keys: the event id, plus the message id for received messages.
    pub keys: Vec<KeyHash>,
}

fn str_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut current = value;
    for part in path {
        current = current.get(part)?;
    }
    current.as_str().filter(|s| !s.is_empty())
}

/// `create_time` in ms, µs or s, as a string or number; `ts` as fractional seconds.
fn lenient_ms(value: Option<&Value>) -> u64 {
    let number = match value {
        Some(Value::String(text)) => text.trim().parse::<f64>().ok(),
        Some(Value::Number(n)) => n.as_f64(),
        _ => None,
    };
    match number {
        Some(n) if n.is_finite() && n > 0.0 => {
            if n >= 1e14 {
                (n / 1000.0) as u64 // microseconds
            } else if n >= 1e11 {
                n as u64 // milliseconds
            } else {
                (n * 1000.0) as u64 // seconds
            }
        }
        _ => 0,
    }
}

pub(crate) fn open(
    app: &FeishuApp,
    headers: SignedHeaders<'_>,
    body: &[u8],
) -> Result<Inbound, FeishuError> {
    let outer: Value =
        serde_json::from_slice(body).map_err(|error| FeishuError::NotJson(error.to_string()))?;
    let signed = match (&app.encrypt_key, headers.signature) {
        (Some(key), Some(received)) => {
            let timestamp = headers
                .timestamp
                .ok_or(FeishuError::MissingHeader("X-Lark-Request-Timestamp"))?;
            let nonce = headers
                .nonce
                .ok_or(FeishuError::MissingHeader("X-Lark-Request-Nonce"))?;
            if !same(&signature(timestamp, nonce, key, body), received) {
                return Err(FeishuError::BadSignature);
            }
            true
        }
        _ => false,
    };
    let plain: Value = match outer.get("encrypt") {
        Some(Value::String(ciphertext)) => {
            let key = app.aes_key.as_ref().ok_or(FeishuError::NoKey)?;
            let bytes = decrypt_with(key, ciphertext)?;
            let value = serde_json::from_slice(&bytes)
                .map_err(|error| FeishuError::NotJson(format!("decrypted body: {error}")))?;
            return decode(app, value, Bytes::from(bytes), signed);
        }
        Some(_) => {
            return Err(FeishuError::UnknownEnvelope(
                "\"encrypt\" must be a string".into(),
            ));
        }
        None => outer,
    };
    decode(app, plain, Bytes::copy_from_slice(body), signed)
}

fn decode(
    app: &FeishuApp,
    value: Value,
    payload: Bytes,
    signed: bool,
) -> Result<Inbound, FeishuError> {
    let check_token = |token: Option<&str>| match &app.verification_token {
        Some(expected) if !token.is_some_and(|t| same_token(expected, t)) => {
            Err(FeishuError::BadToken)
        }
        _ => Ok(()),
    };
    // The challenge is the one request an app with an encrypt key may send unsigned.
    if str_at(&value, &["type"]) == Some("url_verification") {
        check_token(str_at(&value, &["token"]))?;
        let challenge = str_at(&value, &["challenge"]).ok_or_else(|| {
            FeishuError::UnknownEnvelope("url_verification without a challenge".into())
        })?;
        return Ok(Inbound::Challenge {
            challenge: challenge.to_owned(),
        });
    }
    if app.encrypt_key.is_some() && !signed {
        return Err(FeishuError::MissingHeader("X-Lark-Signature"));
    }
    if value.get("schema").is_some() || value.get("header").is_some() {
        check_token(str_at(&value, &["header", "token"]))?;
        let header = &value["header"];
        let event_id = str_at(header, &["event_id"]).ok_or_else(|| {
            FeishuError::UnknownEnvelope("schema 2.0 envelope without header.event_id".into())
        })?;
        let event_type = str_at(header, &["event_type"]).ok_or_else(|| {
            FeishuError::UnknownEnvelope("schema 2.0 envelope without header.event_type".into())
        })?;
        check_app(app, str_at(header, &["app_id"]))?;
        let event = &value["event"];
        let order_key = str_at(event, &["message", "chat_id"])
            .or_else(|| str_at(event, &["context", "open_chat_id"]))
            .or_else(|| str_at(event, &["chat_id"]))
            .or_else(|| str_at(event, &["open_chat_id"]));
        let mut keys = vec![key_for(&app.source, &app.app_id, "event_id", event_id)];
        if let Some(message_id) = str_at(event, &["message", "message_id"])
            .filter(|_| event_type == "im.message.receive_v1")
        {
            keys.push(key_for(&app.source, &app.app_id, "message_id", message_id));
        }
        let verified = Verified {
            event: Event {
                source: app.source.clone(),
                app: app.app_id.clone(),
                tenant: str_at(header, &["tenant_key"]).map(Arc::from),
                event_id: event_id.to_owned(),
                event_type: Arc::from(event_type),
                created_at_ms: lenient_ms(header.get("create_time")),
                order_key: order_key.map(str::to_owned),
                payload,
            },
            keys,
        };
        return Ok(
            if event_type == "card.action.trigger" || event_type == "url.preview.get" {
                Inbound::Card(verified)
            } else {
                Inbound::Event(verified)
            },
        );
    }
    if let Some(uuid) = str_at(&value, &["uuid"]) {
        check_token(str_at(&value, &["token"]))?;
        let event = &value["event"];
        let event_type = str_at(event, &["type"])
            .ok_or_else(|| FeishuError::UnknownEnvelope("v1 envelope without event.type".into()))?;
        check_app(app, str_at(event, &["app_id"]))?;
        let order_key = str_at(event, &["open_chat_id"]).or_else(|| str_at(event, &["chat_id"]));
        return Ok(Inbound::Event(Verified {
            event: Event {
                source: app.source.clone(),
                app: app.app_id.clone(),
                tenant: str_at(event, &["tenant_key"]).map(Arc::from),
                event_id: uuid.to_owned(),
                event_type: Arc::from(event_type),
                created_at_ms: lenient_ms(value.get("ts")),
                order_key: order_key.map(str::to_owned),
                payload,
            },
            keys: vec![key_for(&app.source, &app.app_id, "event_id", uuid)],
        }));
    }
    Err(FeishuError::UnknownEnvelope(
        "neither url_verification, schema 2.0 (header.event_id) nor v1 (uuid)".into(),
    ))
}

fn same_token(expected: &str, got: &str) -> bool {
    use subtle::ConstantTimeEq;
    expected.len() == got.len() && bool::from(expected.as_bytes().ct_eq(got.as_bytes()))
}

fn check_app(app: &FeishuApp, got: Option<&str>) -> Result<(), FeishuError> {
    match got {
        Some(got) if got != &*app.app_id => Err(FeishuError::WrongApp {
            expected: app.app_id.to_string(),
            got: got.to_owned(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SignedHeaders;

    fn app(key: Option<&str>) -> FeishuApp {
        FeishuApp::new(
            false,
            "cli_test",
            key.map(str::to_owned),
            Some("vtoken".into()),
        )
    }

    fn message(event_id: &str, message_id: &str, chat: &str) -> String {
        serde_json::json!({
            "schema": "2.0",
            "header": {"event_id": event_id, "token": "vtoken", "create_time": "1608725989000",
                       "event_type": "im.message.receive_v1", "tenant_key": "t1", "app_id": "cli_test"},
            "event": {"message": {"message_id": message_id, "chat_id": chat, "content": "{\"text\":\"hi\"}"}}
        })
        .to_string()
    }

    fn sealed(app: &FeishuApp, plain: &str) -> (Vec<u8>, String) {
        let (body, sig) = app.seal(plain.as_bytes(), "1700000000", "nonce-1", [3; 16]);
        (body, sig.expect("signed"))
    }

    fn headers(sig: &str) -> SignedHeaders<'_> {
        SignedHeaders {
            timestamp: Some("1700000000"),
            nonce: Some("nonce-1"),
            signature: Some(sig),
        }
    }

    #[test]
    fn an_encrypted_signed_message_decodes_with_both_keys() {
        let app = app(Some("ekey"));
        let (body, sig) = sealed(&app, &message("ev1", "om_1", "oc_chat"));
        let Inbound::Event(verified) = app.open(headers(&sig), &body).expect("open") else {
            panic!("event")
        };
        assert_eq!(verified.event.event_id, "ev1");
        assert_eq!(&*verified.event.event_type, "im.message.receive_v1");
        assert_eq!(verified.event.order_key.as_deref(), Some("oc_chat"));
        assert_eq!(verified.event.created_at_ms, 1_608_725_989_000);
        assert_eq!(verified.event.tenant.as_deref(), Some("t1"));
        assert_eq!(
            verified.keys,
            vec![
                key_for("feishu", "cli_test", "event_id", "ev1"),
                key_for("feishu", "cli_test", "message_id", "om_1"),
            ]
        );
        assert!(verified.event.payload.starts_with(b"{\"event\""));
    }

    #[test]
    fn every_forgery_is_refused_with_its_reason() {
        let app = app(Some("ekey"));
        let (body, sig) = sealed(&app, &message("ev1", "om_1", "oc"));
        let mut tampered = body.clone();
        tampered[12] ^= 1;
        assert_eq!(
            app.open(headers(&sig), &tampered),
            Err(FeishuError::BadSignature)
        );
        assert_eq!(
            app.open(SignedHeaders::default(), &body),
            Err(FeishuError::MissingHeader("X-Lark-Signature"))
        );
        let no_nonce = SignedHeaders {
            nonce: None,
            ..headers(&sig)
        };
        assert_eq!(
            app.open(no_nonce, &body),
            Err(FeishuError::MissingHeader("X-Lark-Request-Nonce"))
        );
        let other = FeishuApp::new(
            false,
            "cli_test",
            Some("ekey".into()),
            Some("other-token".into()),
        );
        assert_eq!(other.open(headers(&sig), &body), Err(FeishuError::BadToken));
        let wrong_key = FeishuApp::new(false, "cli_test", Some("nope".into()), None);
        let (body2, sig2) = {
            let (b, s) = wrong_key.seal(br#"{"x":1}"#, "1", "2", [0; 16]);
            (b, s.expect("sig"))
        };
        let bad = app.open(
            SignedHeaders {
                timestamp: Some("1"),
                nonce: Some("2"),
                signature: Some(&sig2),
            },
            &body2,
        );
        assert_eq!(bad, Err(FeishuError::BadSignature));
        assert!(matches!(
            app.open(headers("x"), b"not json"),
            Err(FeishuError::NotJson(_))
        ));
    }

    #[test]
    fn plain_apps_check_the_token_and_the_app() {
        let app = app(None);
        let body = message("ev2", "om_2", "oc");
        assert!(matches!(
            app.open(SignedHeaders::default(), body.as_bytes()),
            Ok(Inbound::Event(_))
        ));
        let wrong = body.replace("vtoken", "xtoken");
        assert_eq!(
            app.open(SignedHeaders::default(), wrong.as_bytes()),
            Err(FeishuError::BadToken)
        );
        let other_app = body.replace("cli_test", "cli_other");
        assert!(matches!(
            app.open(SignedHeaders::default(), other_app.as_bytes()),
            Err(FeishuError::WrongApp { .. })
        ));
        let unknown = r#"{"hello":"world"}"#;
        assert!(matches!(
            app.open(SignedHeaders::default(), unknown.as_bytes()),
            Err(FeishuError::UnknownEnvelope(_))
        ));
        let err = app
            .open(SignedHeaders::default(), unknown.as_bytes())
            .expect_err("unknown");
        assert_eq!(err.status(), 400);
        assert_eq!(FeishuError::BadToken.status(), 401);
    }

    #[test]
    fn challenges_are_answered_encrypted_or_plain() {
        let plain = app(None);
        let challenge = r#"{"challenge":"ajls384kdjx","token":"vtoken","type":"url_verification"}"#;
        assert_eq!(
            plain.open(SignedHeaders::default(), challenge.as_bytes()),
            Ok(Inbound::Challenge {
                challenge: "ajls384kdjx".into()
            })
        );
        let encrypted = app(Some("ekey"));
        let body =
            serde_json::json!({"encrypt": crate::encrypt("ekey", challenge.as_bytes(), [1; 16])})
                .to_string();
        assert_eq!(
            encrypted.open(SignedHeaders::default(), body.as_bytes()),
            Ok(Inbound::Challenge {
                challenge: "ajls384kdjx".into()
            })
        );
        let bad = challenge.replace("vtoken", "nope");
        assert_eq!(
            plain.open(SignedHeaders::default(), bad.as_bytes()),
            Err(FeishuError::BadToken)
        );
    }

    #[test]
    fn v1_envelopes_and_cards_and_lenient_times() {
        let app = app(None);
        let v1 = r#"{"ts":"1502199207.7171419","uuid":"bc447199585340d1f3728d26b1c0297a","token":"vtoken","type":"event_callback","event":{"type":"p2p_chat_create","app_id":"cli_test","tenant_key":"t","chat_id":"oc_1"}}"#;
        let Ok(Inbound::Event(v)) = app.open(SignedHeaders::default(), v1.as_bytes()) else {
            panic!("v1")
        };
        assert_eq!(v.event.event_id, "bc447199585340d1f3728d26b1c0297a");
        assert_eq!(&*v.event.event_type, "p2p_chat_create");
        assert_eq!(v.event.created_at_ms, 1_502_199_207_717);
        assert_eq!(v.event.order_key.as_deref(), Some("oc_1"));
        let card = r#"{"schema":"2.0","header":{"event_id":"c1","token":"vtoken","create_time":"1603977298000000","event_type":"card.action.trigger","app_id":"cli_test"},"event":{"action":{"value":{"k":"v"}},"context":{"open_chat_id":"oc_9","open_message_id":"om_9"}}}"#;
        let Ok(Inbound::Card(c)) = app.open(SignedHeaders::default(), card.as_bytes()) else {
            panic!("card")
        };
        assert_eq!(
            c.event.created_at_ms, 1_603_977_298_000,
            "microseconds read leniently"
        );
        assert_eq!(c.event.order_key.as_deref(), Some("oc_9"));
        assert_eq!(c.keys.len(), 1);
    }
}
