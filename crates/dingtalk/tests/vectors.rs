//! DingTalk's two official callback vectors (DingCallbackCrypto3.py's `__main__`, and the
//! suite example of DingTalk's documentation as its SDKs' tests carry it): signature, the
//! receive id, the URL checks answered with an encrypted `success` that decrypts; an event
//! admitted with its keys; forgeries refused.

use oncegate_core::{Callback, Decoded, Headers, Method, RefusalKind, Sealer, WebhookSource};
use oncegate_dingtalk::DingtalkApp;
use oncegate_wecom::{AesKey, crypto};

struct None_;

impl Headers for None_ {
    fn get(&self, _: &str) -> Option<&str> {
        None
    }
}

fn decode(app: &DingtalkApp, query: &str, body: &str) -> Result<Decoded, oncegate_core::Refusal> {
    app.decode(&Callback {
        method: Method::Post,
        query: Some(query),
        headers: &None_,
        body: body.as_bytes(),
        tenant: None,
    })
}

/// The encrypted `success` map: signed with the token, decrypting to `success` for `owner`.
fn assert_success(answer: &[u8], token: &str, aes_key: &str, owner: &str) {
    let map: serde_json::Value = serde_json::from_slice(answer).expect("a JSON map");
    let field = |name: &str| {
        map[name]
            .as_str()
            .unwrap_or_else(|| panic!("{name} in {map}"))
            .to_owned()
    };
    let encrypt = field("encrypt");
    assert!(crypto::verify(
        &field("msg_signature"),
        &[token, &field("timeStamp"), &field("nonce"), &encrypt]
    ));
    let key = AesKey::from_encoding_aes_key(aes_key).expect("key");
    assert_eq!(
        crypto::decrypt(&key, &encrypt, owner).expect("decrypts"),
        b"success"
    );
}

#[test]
fn the_first_official_vector_is_a_url_check() {
    let (token, aes_key, owner) = (
        "mryue",
        "Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7",
        "ding6ccabc44d2c8d38b",
    );
    let app = DingtalkApp::new(token, aes_key, owner).expect("app");
    let encrypt = "0vJiX6vliEpwG3U45CtXqi+m8PXbQRARJ8p8BbDuD1EMTDf0jKpQ79QS93qEk7XHpP6u+oTTrd15NRPvNvmBKyDCYxxOK+HZeKju4yhELOFchzNukR+t8SB/qk4ROMu3";
    let body = format!(r#"{{"encrypt":"{encrypt}"}}"#);
    // Both spellings DingTalk's samples read.
    for query in [
        "msg_signature=03044561471240d4a14bb09372dfcfd4fd0e40cb&timeStamp=1608001896814&nonce=WL4PK6yA",
        "signature=03044561471240d4a14bb09372dfcfd4fd0e40cb&timestamp=1608001896814&nonce=WL4PK6yA",
    ] {
        match decode(&app, query, &body).expect("the check") {
            Decoded::Challenge(answer) => assert_success(&answer.body, token, aes_key, owner),
            other => panic!("{other:?}"),
        }
    }
    let forged = decode(&app, "msg_signature=03044561471240d4a14bb09372dfcfd4fd0e40cc&timeStamp=1608001896814&nonce=WL4PK6yA", &body).expect_err("forged");
    assert_eq!(forged.kind, RefusalKind::Unauthenticated);
    // Encrypted for another app: signed, but refused as not this app's.
    let other = DingtalkApp::new(token, aes_key, "ding_other").expect("app");
    let refused = decode(&other, "msg_signature=03044561471240d4a14bb09372dfcfd4fd0e40cb&timeStamp=1608001896814&nonce=WL4PK6yA", &body).expect_err("another app's");
    assert_eq!(refused.kind, RefusalKind::BadInput, "{refused}");
}

#[test]
fn the_second_official_vector_is_a_suites_check() {
    let (token, aes_key, owner) = (
        "123456",
        "4g5j64qlyl3zvetqxz5jiocdr586fn2zvjpa8zls3ij",
        "suite4xxxxxxxxxxxxxxx",
    );
    let app = DingtalkApp::new(token, aes_key, owner).expect("app");
    let encrypt = "1a3NBxmCFwkCJvfoQ7WhJHB+iX3qHPsc9JbaDznE1i03peOk1LaOQoRz3+nlyGNhwmwJ3vDMG+OzrHMeiZI7gTRWVdUBmfxjZ8Ej23JVYa9VrYeJ5as7XM/ZpulX8NEQis44w53h1qAgnC3PRzM7Zc/D6Ibr0rgUathB6zRHP8PYrfgnNOS9PhSBdHlegK+AGGanfwjXuQ9+0pZcy0w9lQ==";
    let key = AesKey::from_encoding_aes_key(aes_key).expect("key");
    assert_eq!(
        crypto::decrypt(&key, encrypt, owner).expect("the vector decrypts"),
        br#"{"EventType":"check_create_suite_url","Random":"LPIdSnlF","TestSuiteKey":"suite4xxxxxxxxxxxxxxx"}"#
    );
    let body = format!(r#"{{"encrypt":"{encrypt}"}}"#);
    match decode(
        &app,
        "signature=5a65ceeef9aab2d149439f82dc191dd6c5cbe2c0&timestamp=1445827045067&nonce=nEXhMP4r",
        &body,
    )
    .expect("the check")
    {
        Decoded::Challenge(answer) => assert_success(&answer.body, token, aes_key, owner),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_event_is_admitted_by_its_id_and_answered_success() {
    let (token, aes_key, owner) = (
        "mryue",
        "Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7",
        "ding6ccabc44d2c8d38b",
    );
    let app = DingtalkApp::new(token, aes_key, owner).expect("app");
    let plaintext = br#"{"EventType":"chat_update_title","eventId":"e1f2","EventTime":1608001896814,"CorpId":"dingcorp","chatId":"chat9","Title":"t"}"#;
    let sealed = app.seal(plaintext, 1_608_001_896, "WL4PK6yA", [7; 16]);
    let body = String::from_utf8(sealed.body).expect("utf-8");
    let Decoded::Admit { admit, stamp } =
        decode(&app, sealed.query.as_deref().expect("query"), &body).expect("event")
    else {
        panic!("an event")
    };
    assert!(stamp.is_none());
    assert_eq!(&*admit.event.event_id, "e1f2");
    assert_eq!(&*admit.event.event_type, "chat_update_title");
    assert_eq!(admit.event.order_key.as_deref(), Some("chat9"));
    assert_eq!(admit.event.tenant.as_deref(), Some("dingcorp"));
    assert_eq!(admit.event.created_at_ms, 1_608_001_896_814);
    assert_eq!(&admit.event.payload[..], plaintext);
    assert_success(
        &app.accepted(oncegate_core::Accepted::Admitted).body,
        token,
        aes_key,
        owner,
    );
    // Two answers differ (fresh nonce and prefix), both valid.
    assert_ne!(
        app.accepted(oncegate_core::Accepted::Duplicate).body,
        app.accepted(oncegate_core::Accepted::Duplicate).body
    );
    // An older event without an id: keyed by its bytes, the same for a copy.
    let old = br#"{"EventType":"user_add_org","TimeStamp":"1608001896814","CorpId":"dingcorp","UserId":["u1"]}"#;
    let keys = |nonce: &str| {
        let sealed = app.seal(old, 1_608_001_897, nonce, [1; 16]);
        match decode(
            &app,
            sealed.query.as_deref().expect("q"),
            &String::from_utf8(sealed.body).expect("utf-8"),
        )
        .expect("old")
        {
            Decoded::Admit { admit, .. } => admit.keys,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(keys("n1"), keys("n2"));
    // An event without a time: the time it arrived, not 1970.
    let sealed = app.seal(br#"{"EventType":"x","eventId":"t0"}"#, 1, "n", [2; 16]);
    let Decoded::Admit { admit, .. } = decode(
        &app,
        sealed.query.as_deref().expect("q"),
        &String::from_utf8(sealed.body).expect("utf-8"),
    )
    .expect("timeless") else {
        panic!("an event")
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis() as u64;
    assert!(admit.event.created_at_ms.abs_diff(now_ms) < 60_000);
    // Unsigned, or not DingTalk's body: unauthenticated.
    assert_eq!(
        decode(&app, "", &body).expect_err("unsigned").kind,
        RefusalKind::Unauthenticated
    );
    let signed = app.seal(b"{}", 1, "n", [0; 16]).query.expect("query");
    assert_eq!(
        decode(&app, &signed, "not json").expect_err("body").kind,
        RefusalKind::Unauthenticated
    );
    assert!(DingtalkApp::new(token, "short", owner).is_err());
}
