//! The envelopes: url_verification challenges, schema 2.0, v1, and card callbacks.

use std::sync::Arc;

use bytes::Bytes;
use oncegate_core::{Event, Keys, key_for};

use crate::crypto::{decrypt_with, signature_matches};
use crate::json::{self, Doc, Scalar, Token};
use crate::{EncryptKey, FeishuApp, FeishuError, SignedHeaders};

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
    pub keys: Keys,
}

/// The largest unsigned request an app with an encrypt key answers: a URL-verification
/// challenge is a few hundred bytes.
pub const UNSIGNED_LIMIT: usize = 4096;

/// `create_time` in ms, µs or s, as a string or number; `ts` as fractional seconds.
fn lenient_ms(value: &Scalar<'_>) -> u64 {
    let number = match value {
        Scalar::Text(text) => text.trim().parse::<f64>().ok(),
        Scalar::Number(n) => Some(*n),
        Scalar::Other => None,
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

/// What vouches for a document: the verification token in it (webhooks), or the connection it
/// came on (the long connection, which the app's secret opened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    Token,
    Connection,
}

/// A document pushed over the long connection: plaintext JSON (decrypted first should an
/// encrypt key be configured and the push be encrypted), authenticated by the connection.
pub(crate) fn open_pushed(app: &FeishuApp, body: &[u8]) -> Result<Inbound, FeishuError> {
    let doc: Doc<'_> = parse(body)?;
    match (&doc.encrypt, &app.key) {
        (Some(Scalar::Text(ciphertext)), Some(key)) => {
            let plain = decrypt_with(&key.aes, ciphertext)?;
            let inner = serde_json::from_slice(&plain)
                .map_err(|error| FeishuError::NotJson(format!("decrypted body: {error}")))?;
            decode(app, inner, &plain, Trust::Connection)
        }
        (Some(_), _) => Err(FeishuError::NoKey),
        (None, _) => decode(app, doc, body, Trust::Connection),
    }
}

pub(crate) fn open(
    app: &FeishuApp,
    headers: SignedHeaders<'_>,
    body: &[u8],
) -> Result<Inbound, FeishuError> {
    let Some(key) = &app.key else {
        // A token-only (or explicitly unsigned) app: Feishu sends plaintext and no signature
        // headers; the token in the body is what authenticates it.
        let doc: Doc<'_> = parse(body)?;
        if doc.encrypt.is_some() {
            return Err(FeishuError::NoKey);
        }
        return decode(app, doc, body, Trust::Token);
    };
    let Some(received) = headers.signature else {
        return unsigned_challenge(key, app, body).ok_or(FeishuError::Unsigned);
    };
    let timestamp = headers
        .timestamp
        .ok_or(FeishuError::MissingHeader("X-Lark-Request-Timestamp"))?;
    let nonce = headers
        .nonce
        .ok_or(FeishuError::MissingHeader("X-Lark-Request-Nonce"))?;
    // The signature covers the raw bytes: nothing is parsed or decrypted before it holds.
    if !signature_matches(timestamp, nonce, &key.text, body, received) {
        return Err(FeishuError::BadSignature);
    }
    let doc: Doc<'_> = parse(body)?;
    match doc.encrypt {
        Some(Scalar::Text(ref ciphertext)) => {
            let plain = decrypt_with(&key.aes, ciphertext)?;
            let inner = serde_json::from_slice(&plain)
                .map_err(|error| FeishuError::NotJson(format!("decrypted body: {error}")))?;
            decode(app, inner, &plain, Trust::Token)
        }
        Some(_) => Err(FeishuError::UnknownEnvelope(
            "\"encrypt\" must be a string".into(),
        )),
        // Signed but not encrypted: the body is the envelope, parsed once.
        None => decode(app, doc, body, Trust::Token),
    }
}

fn parse<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, FeishuError> {
    serde_json::from_slice(bytes).map_err(|error| FeishuError::NotJson(error.to_string()))
}

/// The one request an app with an encrypt key may send without a signature: the challenge.
/// Every failure here is the same `None`, so that an unauthenticated caller learns nothing
/// about why (no padding or parse oracle).
fn unsigned_challenge(key: &EncryptKey, app: &FeishuApp, body: &[u8]) -> Option<Inbound> {
    if body.len() > UNSIGNED_LIMIT {
        return None;
    }
    let outer: Doc<'_> = serde_json::from_slice(body).ok()?;
    let plain = match outer.encrypt {
        Some(Scalar::Text(ciphertext)) => decrypt_with(&key.aes, &ciphertext).ok()?,
        _ => return None,
    };
    let doc: Doc<'_> = serde_json::from_slice(&plain).ok()?;
    if doc.kind.text() != Some("url_verification") || !token_ok(app, &doc.token.value) {
        return None;
    }
    Some(Inbound::Challenge {
        challenge: doc.challenge.text()?.to_owned(),
    })
}

fn token_ok(app: &FeishuApp, token: &Scalar<'_>) -> bool {
    match &app.verification_token {
        Some(expected) => token.text().is_some_and(|t| same_token(expected, t)),
        None => true,
    }
}

fn check_token(app: &FeishuApp, token: &Scalar<'_>, trust: Trust) -> Result<(), FeishuError> {
    if trust == Trust::Connection || token_ok(app, token) {
        Ok(())
    } else {
        Err(FeishuError::BadToken)
    }
}

/// The payload that is stored and forwarded: the document without its verification tokens
/// (`header.token` in schema 2.0, `token` at the top).
fn payload(json: &[u8], tokens: &[&Token<'_>]) -> Result<Bytes, FeishuError> {
    // The parse skipped what it does not read without checking its text: JSON is UTF-8, and
    // what is stored and forwarded must be JSON.
    if std::str::from_utf8(json).is_err() {
        return Err(FeishuError::NotJson(
            "the document is not UTF-8 text".into(),
        ));
    }
    json::without_tokens(json, tokens)
        .map(Bytes::from)
        .map_err(|_| {
            FeishuError::NotJson("a verification token is not a member of its document".into())
        })
}

fn decode(
    app: &FeishuApp,
    doc: Doc<'_>,
    json: &[u8],
    trust: Trust,
) -> Result<Inbound, FeishuError> {
    if doc.kind.text() == Some("url_verification") {
        check_token(app, &doc.token.value, trust)?;
        let challenge = doc.challenge.text().ok_or_else(|| {
            FeishuError::UnknownEnvelope("url_verification without a challenge".into())
        })?;
        return Ok(Inbound::Challenge {
            challenge: challenge.to_owned(),
        });
    }
    let event = doc.event.unwrap_or_default();
    if let Some(header) = &doc.header {
        check_token(app, &header.token.value, trust)?;
        let event_id = header.event_id.text().ok_or_else(|| {
            FeishuError::UnknownEnvelope("schema 2.0 envelope without header.event_id".into())
        })?;
        let event_type = header.event_type.text().ok_or_else(|| {
            FeishuError::UnknownEnvelope("schema 2.0 envelope without header.event_type".into())
        })?;
        check_app(app, &header.app_id, "header.app_id")?;
        let message = event.message.unwrap_or_default();
        let order_key = message
            .chat_id
            .text()
            .or_else(|| event.context.as_ref().and_then(|c| c.open_chat_id.text()))
            .or_else(|| event.chat_id.text())
            .or_else(|| event.open_chat_id.text());
        let mut keys = Keys::new(key_for(&app.platform, &app.app_id, "event_id", event_id));
        if let Some(message_id) = message
            .message_id
            .text()
            .filter(|_| event_type == "im.message.receive_v1")
        {
            keys = keys.with(key_for(
                &app.platform,
                &app.app_id,
                "message_id",
                message_id,
            ));
        }
        let verified = Verified {
            event: Event {
                platform: app.platform.clone(),
                app: app.app_id.clone(),
                tenant: header.tenant_key.text().map(Arc::from),
                event_id: Arc::from(event_id),
                event_type: Arc::from(event_type),
                created_at_ms: lenient_ms(&header.create_time),
                order_key: order_key.map(Arc::from),
                payload: payload(json, &[&doc.token, &header.token])?,
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
    if doc.schema.text().is_some() {
        return Err(FeishuError::UnknownEnvelope(
            "schema 2.0 envelope without a header".into(),
        ));
    }
    if let Some(uuid) = doc.uuid.text() {
        check_token(app, &doc.token.value, trust)?;
        let event_type = event
            .kind
            .text()
            .ok_or_else(|| FeishuError::UnknownEnvelope("v1 envelope without event.type".into()))?;
        check_app(app, &event.app_id, "event.app_id")?;
        let order_key = event.open_chat_id.text().or_else(|| event.chat_id.text());
        return Ok(Inbound::Event(Verified {
            event: Event {
                platform: app.platform.clone(),
                app: app.app_id.clone(),
                tenant: event.tenant_key.text().map(Arc::from),
                event_id: Arc::from(uuid),
                event_type: Arc::from(event_type),
                created_at_ms: lenient_ms(&doc.ts),
                order_key: order_key.map(Arc::from),
                payload: payload(json, &[&doc.token])?,
            },
            keys: Keys::new(key_for(&app.platform, &app.app_id, "event_id", uuid)),
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

/// The event must name this source's app: an event without an app id could be any app's.
fn check_app(app: &FeishuApp, got: &Scalar<'_>, field: &'static str) -> Result<(), FeishuError> {
    match got.text() {
        Some(got) if got == &*app.app_id => Ok(()),
        Some(got) => Err(FeishuError::WrongApp {
            expected: app.app_id.to_string(),
            got: got.to_owned(),
        }),
        None => Err(FeishuError::MissingApp(field)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SignedHeaders;
    use crate::crypto::signature;

    fn app(key: Option<&str>) -> FeishuApp {
        FeishuApp::new(
            crate::Cloud::Feishu,
            "cli_test",
            key.map(str::to_owned),
            Some("vtoken".into()),
        )
        .expect("app")
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
    fn a_document_that_is_not_utf8_is_refused() {
        let app = app(Some("ekey"));
        let mut plain = message("ev1", "om_1", "oc_chat").into_bytes();
        // Inside a value nothing reads (the message's content): the parse skips it without
        // looking at its text.
        let at = plain
            .windows(2)
            .position(|w| w == b"hi")
            .expect("the message's text");
        plain[at] = 0xff;
        let (body, sig) = app.seal(&plain, "1700000000", "nonce-1", [3; 16]);
        let sig = sig.expect("signed");
        let refused = app.open(headers(&sig), &body);
        assert!(
            matches!(&refused, Err(FeishuError::NotJson(why)) if why.contains("UTF-8")),
            "{refused:?}"
        );
    }

    #[test]
    fn an_encrypted_signed_message_decodes_with_both_keys() {
        let app = app(Some("ekey"));
        let (body, sig) = sealed(&app, &message("ev1", "om_1", "oc_chat"));
        let Inbound::Event(verified) = app.open(headers(&sig), &body).expect("open") else {
            panic!("event")
        };
        assert_eq!(&*verified.event.event_id, "ev1");
        assert_eq!(&*verified.event.event_type, "im.message.receive_v1");
        assert_eq!(verified.event.order_key.as_deref(), Some("oc_chat"));
        assert_eq!(verified.event.created_at_ms, 1_608_725_989_000);
        assert_eq!(verified.event.tenant.as_deref(), Some("t1"));
        assert_eq!(
            verified.keys.as_slice(),
            [
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
            Err(FeishuError::Unsigned)
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
            crate::Cloud::Feishu,
            "cli_test",
            Some("ekey".into()),
            Some("other-token".into()),
        )
        .expect("app");
        assert_eq!(other.open(headers(&sig), &body), Err(FeishuError::BadToken));
        let wrong_key = FeishuApp::new(crate::Cloud::Feishu, "cli_test", Some("nope".into()), None)
            .expect("app");
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
        // The signature is checked before the body is read at all.
        assert_eq!(
            app.open(headers("x"), b"not json"),
            Err(FeishuError::BadSignature)
        );
        let sig = signature("1700000000", "nonce-1", "ekey", b"not json");
        assert!(matches!(
            app.open(headers(&sig), b"not json"),
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
        assert_eq!(&*v.event.event_id, "bc447199585340d1f3728d26b1c0297a");
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
        assert_eq!(c.keys.as_slice().len(), 1);
    }

    #[test]
    fn every_unsigned_failure_looks_the_same_and_only_the_challenge_passes() {
        let app = app(Some("ekey"));
        let challenge = r#"{"challenge":"c1","token":"vtoken","type":"url_verification"}"#;
        let seal = |plain: &[u8]| {
            serde_json::json!({"encrypt": crate::encrypt("ekey", plain, [5; 16])}).to_string()
        };
        assert_eq!(
            app.open(
                SignedHeaders::default(),
                seal(challenge.as_bytes()).as_bytes()
            ),
            Ok(Inbound::Challenge {
                challenge: "c1".into()
            })
        );
        // A captured event body, and the tampered variants a padding-oracle attack sends.
        let (event_body, _) = sealed(&app, &message("ev1", "om_1", "oc"));
        let mut bad_padding = event_body.clone();
        let last = bad_padding.len() - 4;
        bad_padding[last] = if bad_padding[last] == b'A' {
            b'B'
        } else {
            b'A'
        };
        let not_json = seal(b"not json at all");
        let wrong_token = seal(challenge.replace("vtoken", "x").as_bytes());
        let big = seal(
            format!(
                "{{\"type\":\"url_verification\",\"challenge\":\"{}\",\"token\":\"vtoken\"}}",
                "c".repeat(UNSIGNED_LIMIT)
            )
            .as_bytes(),
        );
        for body in [
            event_body.clone(),
            bad_padding,
            not_json.into_bytes(),
            wrong_token.into_bytes(),
            big.into_bytes(),
            b"{\"encrypt\":\"***\"}".to_vec(),
            b"{".to_vec(),
            challenge.as_bytes().to_vec(),
        ] {
            let refused = app.open(SignedHeaders::default(), &body);
            assert_eq!(
                refused,
                Err(FeishuError::Unsigned),
                "{}",
                String::from_utf8_lossy(&body)
            );
        }
    }

    #[test]
    fn the_verification_token_never_reaches_the_payload() {
        for key in [Some("ekey"), None] {
            let app = app(key);
            let plain = message("ev3", "om_3", "oc");
            let (body, sig) = match key {
                Some(_) => sealed(&app, &plain),
                None => (plain.clone().into_bytes(), String::new()),
            };
            let headers = if key.is_some() {
                headers(&sig)
            } else {
                SignedHeaders::default()
            };
            let Ok(Inbound::Event(v)) = app.open(headers, &body) else {
                panic!("event")
            };
            let payload = std::str::from_utf8(&v.event.payload).expect("utf8");
            assert!(!payload.contains("vtoken"), "{payload}");
            assert!(payload.contains("\"event_id\":\"ev3\""), "{payload}");
        }
        let v1 = r#"{"ts":"1502199207","uuid":"u1","token":"vtoken","type":"event_callback","event":{"type":"t","app_id":"cli_test"}}"#;
        let Ok(Inbound::Event(v)) = app(None).open(SignedHeaders::default(), v1.as_bytes()) else {
            panic!("v1")
        };
        assert!(!v.event.payload.windows(6).any(|w| w == b"vtoken"));
    }

    #[test]
    fn debug_output_never_shows_the_secrets() {
        let shown = format!("{:?}", app(Some("ekey")));
        assert!(shown.contains("cli_test"), "{shown}");
        assert!(
            !shown.contains("ekey") && !shown.contains("vtoken"),
            "{shown}"
        );
    }

    #[test]
    fn an_event_without_an_app_id_is_refused() {
        let app = app(None);
        let body = message("ev4", "om_4", "oc").replace("\"app_id\":\"cli_test\",", "");
        assert!(!body.contains("app_id"), "{body}");
        assert_eq!(
            app.open(SignedHeaders::default(), body.as_bytes()),
            Err(FeishuError::MissingApp("header.app_id"))
        );
        assert_eq!(
            FeishuApp::new(crate::Cloud::Feishu, "a", Some(" ".into()), None).err(),
            Some(FeishuError::EmptySecret("encrypt key"))
        );
    }
}
