//! Self-built apps of many corps behind one template source, against callbacks made by
//! wechatpy's enterprise crypto (`scripts/fixtures/wechatpy_wecom_corps.py`, wechatpy 1.8.18):
//! each corp's callbacks are checked with its own secrets from the registry only — at the URL
//! that names it or at the one URL for all — and are that corp's events; a corp's secrets
//! never open another's callbacks.

use oncegate_core::{Callback, Decoded, Headers, Method, RefusalKind, TenantSet, WebhookSource};
use oncegate_wecom::WecomCorps;

struct NoHeaders;

impl Headers for NoHeaders {
    fn get(&self, _: &str) -> Option<&str> {
        None
    }
}

fn call<'a>(
    method: Method,
    query: &'a str,
    body: &'a [u8],
    tenant: Option<&'a str>,
) -> Callback<'a> {
    Callback {
        method,
        query: Some(query),
        headers: &NoHeaders,
        body,
        tenant,
    }
}

// Printed by scripts/fixtures/wechatpy_wecom_corps.py.
const CORP_A: &str = "wwcorpa0000000001";
const TOKEN_A: &str = "token-of-corp-a";
const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
const MESSAGE_A: &str = "<xml><ToUserName><![CDATA[wwcorpa0000000001]]></ToUserName><Encrypt><![CDATA[2Vr4NZ2CdaJ1JeowGUOOZD0qdTV7Eb86D0BgYkDnZE7vzUMzd59i7NkvTia49VwwU61Q6By2eNOLU7w9oqrCbuFdpteFL7VHiJKHS9NPAyP5Qg41la6Xb/BS3MggjU4u8pRcbd5T9R1EpzZDlthpxWDeIDyC2wP//fReBFDO8esmzbD9nYyuSR92Rub3PfzV9xFgajj5WIq5DLc/WEBH3FI7VqAUITmfGpROBRKi+r0hz/2nAWkxkiPWJkocpZMETZI78xwHwHGoZT61VE0tvDuaovQL2Xmf++BWvWn98iuj0yJ/f6mTW9xcuL48ik9Z5KBekrBze5iBL8KEEJd27/wiaGvO5wHfBNJGpFGjNBdKQ3d8uqao88dCUdx2Nixr8c+YCR0/UTiFvtmoABN9LLae8KS+HDs/RrLbqGz3DT0=]]></Encrypt><AgentID><![CDATA[1]]></AgentID></xml>";
const MESSAGE_A_QUERY: &str =
    "msg_signature=f5d404dc3b748bac6fba361aec23be29d48148f6&timestamp=1700000000&nonce=1372623149";
const ECHO_A_QUERY: &str = "msg_signature=721515629bd70463b6f867f3e0583b02192723f3&timestamp=1700000000&nonce=1372623149&echostr=CrG3%2Bslis%2Bw6cc%2ByLKJTI3spYsFaklHZUYw4ZW6jKeA1GyrVajhNjis%2FcRdiojV5RebincA%2FFjOpCPYWAB6kKQ%3D%3D";
const CORP_B: &str = "wwcorpb0000000002";
const TOKEN_B: &str = "token-of-corp-b";
const KEY_B: &str = "ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoM";
const MESSAGE_B: &str = "<xml><ToUserName><![CDATA[wwcorpb0000000002]]></ToUserName><Encrypt><![CDATA[6g5wJmskeD5bKXxlkljFwKkLED+V07sFjQwJLpSKcIXuBeiBi08jdUOoBFD0QENbcRFNbSYVdY29y5iJLEReRmsIYVui2cs756WmOGyw0/iur/sfav6E6sfzLZ2eXPKhR6eaPgKAPe2H6TA7fHOdPpeNPu+TDTvQRVfggJEfK5/ae3g6EBf5pRiiwjhDABTUf828q9XZeU7GLzPBqhHfDJtwc2lrfpCUal35AMZDQDmYRQa9HaUBAVBylM6aaXRuaU/ryNbRqNUgQEsAXg2rCGSkQP4mflO3CUhnAK4fCaLdVU6sn5jvV3eAesIiV+Qut5leHh3cri+67di5BSfFEfjcvJuU9TXBjWc1wLjXfGY8q0o/cZgtDQ88HsLYHGEk/d6XoSgczMyj4e3oB+nsWbqMRL7bW+xg/6syQDPBJuI=]]></Encrypt><AgentID><![CDATA[1]]></AgentID></xml>";
const MESSAGE_B_QUERY: &str =
    "msg_signature=d66237b5807b2ebec08185a700cf8b87e3a562c4&timestamp=1700000000&nonce=1372623149";
const ECHO_B_QUERY: &str = "msg_signature=4fcb397b6c6625dfe3da2e1d6e35f8bfb23880c8&timestamp=1700000000&nonce=1372623149&echostr=KE2aCdE1sOTxj8%2B8L6TbkUs%2Fq6r9YYw5Pz5at2pr%2FE8n75xkBT4Fi1hfE97on2COr53rh9s5LcIzF246prVS2A%3D%3D";

/// A corp's settings as the registry keeps them.
fn settings(token: &str, key: &str, agent: serde_json::Value) -> bytes::Bytes {
    bytes::Bytes::from(
        serde_json::json!({"token": token, "encoding_aes_key": key, "agent_id": agent, "name": "x"})
            .to_string(),
    )
}

/// A template serving both corps (agent 1 each; B's written as a string).
fn both() -> WecomCorps {
    let corps = WecomCorps::new();
    let left_out = corps.corps().replace_with_settings(vec![
        (
            CORP_A.into(),
            settings(TOKEN_A, KEY_A, serde_json::json!(1)),
        ),
        (
            CORP_B.into(),
            settings(TOKEN_B, KEY_B, serde_json::json!("1")),
        ),
    ]);
    assert!(left_out.is_empty(), "{left_out:?}");
    corps
}

fn admitted(corps: &WecomCorps, callback: &Callback<'_>) -> oncegate_core::Event {
    match corps.decode(callback) {
        Ok(Decoded::Admit { admit, .. }) => admit.event,
        other => panic!("expected an admission, got {other:?}"),
    }
}

fn refused(corps: &WecomCorps, callback: &Callback<'_>) -> (RefusalKind, &'static str) {
    match corps.decode(callback) {
        Err(refusal) => (refusal.kind, refusal.label),
        Ok(other) => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn each_corps_callbacks_open_with_its_own_secrets_at_either_url() {
    let corps = both();
    for (corp, body, query) in [
        (CORP_A, MESSAGE_A, MESSAGE_A_QUERY),
        (CORP_B, MESSAGE_B, MESSAGE_B_QUERY),
    ] {
        // The one URL for all (the envelope names the corp) and the corp's own URL.
        for tenant in [None, Some(corp)] {
            let event = admitted(&corps, &call(Method::Post, query, body.as_bytes(), tenant));
            assert_eq!(&*event.app, corp, "the corp's own event");
            assert_eq!(
                oncegate_wecom::owner(&event),
                oncegate_core::Owner {
                    tenant: Some(corp),
                    agent: Some("1")
                }
            );
            assert!(String::from_utf8_lossy(&event.payload).contains("this is a test"));
        }
    }
    // A's callback at B's URL is checked with B's token: refused as unsigned, not taken as B's.
    assert_eq!(
        refused(
            &corps,
            &call(
                Method::Post,
                MESSAGE_A_QUERY,
                MESSAGE_A.as_bytes(),
                Some(CORP_B)
            )
        ),
        (RefusalKind::Unauthenticated, "bad_signature")
    );
    // An envelope that names B around A's ciphertext: B's token does not sign it.
    let posing = MESSAGE_A.replace(CORP_A, CORP_B);
    assert_eq!(
        refused(
            &corps,
            &call(Method::Post, MESSAGE_A_QUERY, posing.as_bytes(), None)
        ),
        (RefusalKind::Unauthenticated, "bad_signature")
    );
}

#[test]
fn url_verification_answers_each_corp_at_its_url_or_the_one_for_all() {
    let corps = both();
    for (corp, query, echo) in [
        (CORP_A, ECHO_A_QUERY, "echo-A"),
        (CORP_B, ECHO_B_QUERY, "echo-B"),
    ] {
        for tenant in [None, Some(corp)] {
            match corps.decode(&call(Method::Get, query, b"", tenant)) {
                Ok(Decoded::SignedChallenge { answer, .. }) => {
                    assert_eq!(&answer.body[..], echo.as_bytes(), "{corp} {tenant:?}");
                }
                other => panic!("{corp} {tenant:?}: {other:?}"),
            }
        }
    }
    // A's verification at B's URL: B's token does not sign it.
    assert_eq!(
        refused(&corps, &call(Method::Get, ECHO_A_QUERY, b"", Some(CORP_B))).0,
        RefusalKind::Unauthenticated
    );
    // With no corps yet, nothing verifies: answered as unsigned, counted apart.
    assert_eq!(
        refused(
            &WecomCorps::new(),
            &call(Method::Get, ECHO_A_QUERY, b"", None)
        ),
        (RefusalKind::Unauthenticated, "unknown_tenant")
    );
}

#[test]
fn corps_not_in_the_registry_or_of_another_agent_are_refused() {
    let corps = both();
    // B leaves; A stays. B's callbacks are a stranger's, never opened: answered as any unsigned
    // callback (a prober learns no corp the template serves), counted apart; WeCom retries.
    let left_out = corps
        .corps()
        .replace_with_settings(vec![(CORP_A.into(), settings(TOKEN_A, KEY_A, 1.into()))]);
    assert!(left_out.is_empty());
    assert!(corps.corps().contains(CORP_A) && !corps.corps().contains(CORP_B));
    let stranger = corps
        .decode(&call(
            Method::Post,
            MESSAGE_B_QUERY,
            MESSAGE_B.as_bytes(),
            None,
        ))
        .expect_err("a stranger's");
    let forged = corps
        .decode(&call(
            Method::Post,
            MESSAGE_B_QUERY,
            b"<xml>junk</xml>",
            Some(CORP_A),
        ))
        .expect_err("forged");
    assert_eq!(
        (stranger.kind, stranger.label, &stranger.message),
        (
            RefusalKind::Unauthenticated,
            "unknown_tenant",
            &forged.message
        ),
        "the same answer as a forgery's"
    );
    admitted(
        &corps,
        &call(Method::Post, MESSAGE_A_QUERY, MESSAGE_A.as_bytes(), None),
    );
    // A's app is now agent 2: the message of agent 1 is another app's.
    corps
        .corps()
        .replace_with_settings(vec![(CORP_A.into(), settings(TOKEN_A, KEY_A, 2.into()))]);
    assert_eq!(
        refused(
            &corps,
            &call(Method::Post, MESSAGE_A_QUERY, MESSAGE_A.as_bytes(), None)
        ),
        (RefusalKind::BadInput, "wrong_app")
    );
    // No corp in the envelope and none in the URL: nothing to check it with — unsigned.
    assert_eq!(
        refused(
            &corps,
            &call(
                Method::Post,
                MESSAGE_A_QUERY,
                b"<xml><Encrypt>x</Encrypt></xml>",
                None
            )
        ),
        (RefusalKind::Unauthenticated, "bad_signature")
    );
}

#[test]
fn settings_without_the_corps_secrets_are_refused_and_left_out() {
    let corps = WecomCorps::new();
    let set = corps.corps();
    for bad in [
        serde_json::json!({}),
        serde_json::json!({"token": TOKEN_A}),
        serde_json::json!({"token": TOKEN_A, "encoding_aes_key": "short"}),
        serde_json::json!({"token": "  ", "encoding_aes_key": KEY_A}),
        serde_json::json!(["not", "an", "object"]),
    ] {
        let bytes = bad.to_string();
        assert!(set.check_settings(bytes.as_bytes()).is_err(), "{bad}");
    }
    assert!(
        set.check_settings(&settings(TOKEN_A, KEY_A, 1.into()))
            .is_ok()
    );
    // A value of the wrong type is refused without being quoted: it may be a secret.
    let quoted = set
        .check_settings(br#"{"token": 9876543210123, "encoding_aes_key": "x"}"#)
        .expect_err("a number for a token");
    assert!(!quoted.contains("9876543210123"), "{quoted}");
    let left_out = set.replace_with_settings(vec![
        (CORP_A.into(), settings(TOKEN_A, KEY_A, 1.into())),
        (
            CORP_B.into(),
            bytes::Bytes::from_static(b"{\"name\": \"no secrets\"}"),
        ),
    ]);
    assert_eq!(left_out.len(), 1, "{left_out:?}");
    assert_eq!(left_out[0].0, CORP_B);
    assert!(
        left_out[0].1.contains("encoding_aes_key"),
        "{}",
        left_out[0].1
    );
    assert_eq!(set.len(), 1);
    // Ids alone serve no corp of a template.
    set.replace(vec![CORP_A.into()]);
    assert!(set.is_empty());
}
