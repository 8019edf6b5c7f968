//! The WeCom and WeChat sources as the gateway calls them: published requests, sealed round
//! trips, and refusals.

use oncegate_core::{
    Callback, Decoded, Headers, Method, RefusalKind, SealedRequest, Sealer, SyntheticMessage,
    WebhookSource,
};
use oncegate_wecom::{WechatApp, WecomApp};

struct NoHeaders;

impl Headers for NoHeaders {
    fn get(&self, _: &str) -> Option<&str> {
        None
    }
}

fn call(method: Method, query: &str, body: &[u8]) -> Callback<'static> {
    let query: &'static str = Box::leak(query.to_owned().into_boxed_str());
    let body: &'static [u8] = Box::leak(body.to_vec().into_boxed_slice());
    Callback {
        method,
        query: Some(query),
        headers: &NoHeaders,
        body,
        tenant: None,
    }
}

fn replay(
    source: &dyn WebhookSource,
    sealed: &SealedRequest,
) -> Result<Decoded, oncegate_core::Refusal> {
    source.decode(&call(
        sealed.method,
        sealed.query.as_deref().unwrap_or_default(),
        &sealed.body,
    ))
}

const V1_KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";
const V1_CORP: &str = "wx5823bf96d3bd56c7";

fn v1() -> WecomApp {
    WecomApp::new(V1_CORP, "QDG6eK", V1_KEY).expect("app")
}

#[test]
fn the_official_url_verification_answers_the_bare_plaintext() {
    // The query exactly as the sample shows it: echostr percent-encoded.
    let query = "msg_signature=5c45ff5e21c57e6ad56bac8758b79b1d9ac89fd3&timestamp=1409659589&nonce=263014780&echostr=P9nAzCzyDtyTWESHep1vC5X9xho%2FqYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp%2B4RPcs8TgAE7OaBO%2BFZXvnaqQ%3D%3D";
    let Ok(Decoded::SignedChallenge { answer: reply, .. }) =
        v1().decode(&call(Method::Get, query, b""))
    else {
        panic!("a challenge")
    };
    assert_eq!(&reply.body[..], b"1616140317555161061");
    assert!(reply.content_type.starts_with("text/plain"));
}

#[test]
fn the_official_message_is_admitted_with_its_stamp_and_keys() {
    let body = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><Encrypt><![CDATA[RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q==]]></Encrypt><AgentID><![CDATA[218]]></AgentID></xml>";
    let query = "msg_signature=477715d11cdb4164915debcba66cb864d751f3e6&timestamp=1409659813&nonce=1372623149";
    let Ok(Decoded::Admit { admit, stamp }) =
        v1().decode(&call(Method::Post, query, body.as_bytes()))
    else {
        panic!("an admission")
    };
    let stamp = stamp.expect("a stamp");
    assert_eq!(
        (stamp.timestamp_secs, stamp.nonce.as_str()),
        (1_409_659_813, "1372623149")
    );
    let event = &admit.event;
    assert_eq!((&*event.platform, &*event.app), ("wecom", V1_CORP));
    assert_eq!(&*event.event_id, "4561255354251345929");
    assert_eq!(&*event.event_type, "message.text");
    assert_eq!(event.tenant.as_deref(), Some("218"));
    assert_eq!(
        event.order_key.as_deref(),
        Some("218:mycreate"),
        "the user within agent 218"
    );
    assert_eq!(event.created_at_ms, 1_409_659_813_000);
    assert!(
        std::str::from_utf8(&event.payload)
            .expect("utf8")
            .contains("<Content><![CDATA[hello]]>")
    );
    assert_eq!(
        admit.keys.as_slice().len(),
        2,
        "the fields key and the message key"
    );
    assert_eq!(
        v1().accepted(oncegate_core::Accepted::Admitted).body.len(),
        0,
        "WeCom takes an empty 200"
    );
}

fn synthetic(id: &str) -> SyntheticMessage {
    SyntheticMessage {
        id: id.into(),
        chat: "zhangsan".into(),
        sender: "zhangsan".into(),
        text: "hi ]]> there".into(),
        created_ms: 1_700_000_000_000,
    }
}

#[test]
fn sealed_messages_open_and_copies_share_their_keys() {
    let app = v1();
    let plain = app.message(&synthetic("4561255354251345929"));
    let first = replay(&app, &app.seal(&plain, 1_700_000_000, "n 1+2", [1; 16])).expect("opens");
    let again = replay(&app, &app.seal(&plain, 1_700_000_005, "n2", [2; 16])).expect("opens");
    let (Decoded::Admit { admit: a, stamp }, Decoded::Admit { admit: b, .. }) = (first, again)
    else {
        panic!("admissions")
    };
    assert_eq!(stamp.expect("stamp").nonce, "n 1+2");
    assert_eq!(
        a.keys, b.keys,
        "a retry, encrypted again, is the same event"
    );
    assert_eq!(a.event.payload, b.event.payload);
}

#[test]
fn every_failure_before_the_signature_looks_alike() {
    let app = v1();
    let sealed = app.seal(&app.message(&synthetic("1")), 1_700_000_000, "n", [1; 16]);
    let query = sealed.query.clone().expect("query");
    let tampered_body = String::from_utf8(sealed.body.clone())
        .expect("utf8")
        .replacen("<Encrypt><![CDATA[", "<Encrypt><![CDATA[A", 1);
    let cases = [
        call(Method::Post, "", &sealed.body),
        call(
            Method::Post,
            &query.replace("nonce=n", "nonce=m"),
            &sealed.body,
        ),
        call(Method::Post, &query, tampered_body.as_bytes()),
        call(Method::Post, &query, b"<xml><NoEncrypt/></xml>"),
        call(Method::Post, &query, b"not xml <<<"),
        call(Method::Post, &query, b""),
        call(Method::Get, &query, b""),
        call(Method::Get, &format!("{query}&echostr=AAAA"), b""),
    ];
    let mut messages = std::collections::HashSet::new();
    for case in &cases {
        let refusal = app.decode(case).expect_err("refused");
        assert_eq!(refusal.kind, RefusalKind::Unauthenticated, "{refusal:?}");
        assert_eq!(refusal.label, "bad_signature");
        messages.insert(refusal.message);
    }
    assert_eq!(
        messages.len(),
        1,
        "one message for every forgery: {messages:?}"
    );
}

#[test]
fn signed_but_wrong_is_a_clear_bad_request() {
    let app = v1();
    // Signed with the right token, encrypted for another corp.
    let other = WecomApp::new("ww_other", "QDG6eK", V1_KEY).expect("app");
    let plain = other.message(&synthetic("1"));
    let refusal =
        replay(&app, &other.seal(&plain, 1_700_000_000, "n", [1; 16])).expect_err("refused");
    assert_eq!(
        (refusal.kind, refusal.label),
        (RefusalKind::BadInput, "wrong_app")
    );
    assert!(refusal.message.contains("ww_other"), "{}", refusal.message);
    // Encrypted for this corp, but addressed to another in the XML.
    let plain = other.message(&synthetic("2"));
    let refusal =
        replay(&app, &app.seal(&plain, 1_700_000_000, "n", [1; 16])).expect_err("refused");
    assert_eq!(refusal.label, "wrong_app");
    // Malformed XML inside a good envelope.
    let refusal =
        replay(&app, &app.seal(b"<xml><a>", 1_700_000_000, "n", [1; 16])).expect_err("refused");
    assert_eq!(
        (refusal.kind, refusal.label),
        (RefusalKind::BadInput, "bad_xml")
    );
    // A signed timestamp that is not a number.
    let sealed = app.seal(&app.message(&synthetic("3")), 1_700_000_000, "n", [1; 16]);
    let encrypt = String::from_utf8(sealed.body.clone()).expect("utf8");
    let encrypt = encrypt
        .split("<Encrypt><![CDATA[")
        .nth(1)
        .and_then(|rest| rest.split("]]>").next())
        .expect("encrypt");
    let signature = oncegate_wecom::crypto::signature(&["QDG6eK", "soon", "n", encrypt]);
    let refusal = app
        .decode(&call(
            Method::Post,
            &format!("msg_signature={signature}&timestamp=soon&nonce=n"),
            &sealed.body,
        ))
        .expect_err("refused");
    assert_eq!(refusal.label, "bad_timestamp");
}

#[test]
fn secrets_are_required_and_never_printed() {
    assert!(WecomApp::new(V1_CORP, " ", V1_KEY).is_err());
    assert!(WecomApp::new(V1_CORP, "t", "short").is_err());
    assert!(WechatApp::new("wx1", "", None).is_err());
    let printed = format!(
        "{:?} {:?}",
        v1(),
        WechatApp::new("wx1", "tok-secret", Some(V1_KEY)).expect("app")
    );
    assert!(
        !printed.contains("QDG6eK") && !printed.contains("tok-secret") && !printed.contains(V1_KEY),
        "{printed}"
    );
}

#[test]
fn official_accounts_in_plain_mode() {
    let app = WechatApp::new("wx_oa", "test", None).expect("app");
    // wechatpy's vector: token test, timestamp 1410685589, nonce test.
    let query = "signature=f21891de399b4e33a1a93c9a7b8a8fffb5a443ff&timestamp=1410685589&nonce=test&echostr=hello%2Bworld";
    let Ok(Decoded::SignedChallenge { answer: reply, .. }) =
        app.decode(&call(Method::Get, query, b""))
    else {
        panic!("a challenge")
    };
    assert_eq!(
        &reply.body[..],
        b"hello+world",
        "the echostr goes back as it came"
    );
    let plain = app.message(&synthetic("77"));
    let Ok(Decoded::Admit { admit, .. }) =
        replay(&app, &app.seal(&plain, 1_700_000_000, "n", [0; 16]))
    else {
        panic!("an admission")
    };
    assert_eq!(
        (&*admit.event.platform, &*admit.event.event_id),
        ("wechat", "77")
    );
    assert_eq!(
        &app.accepted(oncegate_core::Accepted::Duplicate).body[..],
        b"success"
    );
    let bad = query.replace("nonce=test", "nonce=tesu");
    assert_eq!(
        app.decode(&call(Method::Get, &bad, b""))
            .expect_err("refused")
            .label,
        "bad_signature"
    );
    // Encrypted requests need a key.
    let keyed = WechatApp::new("wx_oa", "test", Some(V1_KEY)).expect("app");
    let sealed = keyed.seal(&plain, 1_700_000_000, "n", [0; 16]);
    assert_eq!(
        replay(&app, &sealed).expect_err("refused").label,
        "wrong_mode"
    );
}

#[test]
fn official_accounts_in_safe_mode_refuse_plain_requests() {
    let app = WechatApp::new(
        "wx_oa",
        "test",
        Some("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"),
    )
    .expect("app");
    let plain = app.message(&synthetic("78"));
    let Ok(Decoded::Admit { admit, .. }) =
        replay(&app, &app.seal(&plain, 1_700_000_000, "n", [5; 16]))
    else {
        panic!("an admission")
    };
    assert_eq!(&*admit.event.event_id, "78");
    let plain_mode = WechatApp::new("wx_oa", "test", None).expect("app");
    let refusal =
        replay(&app, &plain_mode.seal(&plain, 1_700_000_000, "n", [5; 16])).expect_err("refused");
    assert_eq!(refusal.label, "wrong_mode");
    assert!(refusal.message.contains("safe mode"), "{}", refusal.message);
}

#[test]
fn ai_bot_json_callbacks_are_admitted_and_checked_like_xml() {
    let app = v1().for_agent("AIBOT1");
    let key = oncegate_wecom::AesKey::from_encoding_aes_key(V1_KEY).expect("key");
    let post = |doc: &str, receiver: &str| {
        let encrypt = oncegate_wecom::crypto::encrypt(&key, doc.as_bytes(), receiver, [8; 16]);
        let signature =
            oncegate_wecom::crypto::signature(&["QDG6eK", "1700000000", "nb", &encrypt]);
        let body = format!(r#"{{"encrypt":"{encrypt}"}}"#);
        app.decode(&call(
            Method::Post,
            &format!("msg_signature={signature}&timestamp=1700000000&nonce=nb"),
            body.as_bytes(),
        ))
    };
    let doc = r#"{"msgid":"CAIQ9","aibotid":"AIBOT1","chatid":"wrG","chattype":"group","from":{"userid":"zhangsan"},"msgtype":"text","text":{"content":"hi"}}"#;
    let Ok(Decoded::Admit { admit, .. }) = post(doc, "") else {
        panic!("an admission")
    };
    assert_eq!(&*admit.event.event_id, "CAIQ9");
    assert_eq!(admit.event.order_key.as_deref(), Some("wrG"));
    // Another bot's message, or one encrypted for a corp id, is refused.
    let other = doc.replace("AIBOT1", "AIBOT2");
    assert_eq!(post(&other, "").expect_err("refused").label, "wrong_app");
    assert_eq!(post(doc, V1_CORP).expect_err("refused").label, "wrong_app");
    // A JSON envelope without `encrypt` is a forgery like any other.
    let refusal = app
        .decode(&call(
            Method::Post,
            "msg_signature=00&timestamp=1&nonce=2",
            br#"{"x":1}"#,
        ))
        .expect_err("refused");
    assert_eq!(refusal.label, "bad_signature");
}

#[test]
fn passive_replies_are_encrypted_for_the_app_and_signed_with_the_request() {
    use bytes::Bytes;
    let stamp = oncegate_core::Stamp {
        timestamp_secs: 1_411_525_903,
        nonce: "461056294".into(),
        request: None,
    };
    let reply = Bytes::from_static(b"<xml><Content><![CDATA[ok]]></Content></xml>");
    let key = oncegate_wecom::AesKey::from_encoding_aes_key(V1_KEY).expect("key");
    let opened = |body: &[u8], receiver: &str, token: &str| {
        let text = String::from_utf8(body.to_vec()).expect("utf8");
        let pick = |name: &str| {
            let start = text.find(&format!("<{name}>")).expect("field") + name.len() + 2;
            let end = text[start..].find(&format!("</{name}>")).expect("end") + start;
            text[start..end]
                .trim_start_matches("<![CDATA[")
                .trim_end_matches("]]>")
                .to_owned()
        };
        let encrypt = pick("Encrypt");
        assert!(oncegate_wecom::crypto::verify(
            &pick("MsgSignature"),
            &[token, "1411525903", "461056294", &encrypt]
        ));
        oncegate_wecom::crypto::decrypt(&key, &encrypt, receiver).expect("decrypts")
    };
    let corp = v1();
    let answer = corp.sync_reply(Some(reply.clone()), Some(&stamp));
    assert_eq!(opened(&answer.body, V1_CORP, "QDG6eK"), reply);
    assert!(corp.sync_reply(None, Some(&stamp)).body.is_empty());
    let safe = WechatApp::new("wx_oa", "oa", Some(V1_KEY)).expect("app");
    assert_eq!(
        opened(
            &safe.sync_reply(Some(reply.clone()), Some(&stamp)).body,
            "wx_oa",
            "oa"
        ),
        reply
    );
    let plain = WechatApp::new("wx_oa", "oa", None).expect("app");
    assert_eq!(
        plain.sync_reply(Some(reply.clone()), Some(&stamp)).body,
        reply
    );
    assert_eq!(&plain.sync_reply(None, None).body[..], b"success");
    // Two equal replies never encrypt alike.
    assert_ne!(
        corp.sync_reply(Some(reply.clone()), Some(&stamp)).body,
        corp.sync_reply(Some(reply), Some(&stamp)).body
    );
}

/// A safe-mode Official Account message as the platform sends it: addressed (`ToUserName`, in
/// the envelope and the message) to the account's original id `gh_…`, never to its app id —
/// the MP documentation's text message, encrypted for the app id (the receive id). It was
/// refused as "for another app"; now it is admitted, and an `original_id` set in the source is
/// checked instead.
#[test]
fn official_account_messages_are_addressed_to_the_original_id() {
    const APP_ID: &str = "wx5823bf96d3bd56c7";
    let document = "<xml><ToUserName><![CDATA[gh_7f083739789a]]></ToUserName>\
<FromUserName><![CDATA[oia2TjuEGTNoeX76QEjQNrcURxG8]]></FromUserName>\
<CreateTime>1700000000</CreateTime><MsgType><![CDATA[text]]></MsgType>\
<Content><![CDATA[你好]]></Content><MsgId>6000000000000000001</MsgId></xml>";
    let app = WechatApp::new(APP_ID, "test", Some(V1_KEY)).expect("app");
    let sealed = app.seal(document.as_bytes(), 1_700_000_000, "n1", [7; 16]);
    assert!(
        String::from_utf8_lossy(&sealed.body).contains("<ToUserName><![CDATA[gh_"),
        "the envelope is addressed like the message"
    );
    let Ok(Decoded::Admit { admit, .. }) = replay(&app, &sealed) else {
        panic!("a message to the original id is admitted")
    };
    assert_eq!(
        (
            &*admit.event.platform,
            &*admit.event.app,
            &*admit.event.event_id
        ),
        ("wechat", APP_ID, "6000000000000000001")
    );
    // The platform's retry is the same message: the same keys (admitted once by the store).
    let Ok(Decoded::Admit { admit: again, .. }) = replay(
        &app,
        &app.seal(document.as_bytes(), 1_700_000_005, "n2", [9; 16]),
    ) else {
        panic!("the retry decodes")
    };
    assert_eq!(again.keys, admit.keys);
    // With the original id configured, it is checked.
    let checked = WechatApp::new(APP_ID, "test", Some(V1_KEY))
        .expect("app")
        .with_original_id("gh_7f083739789a");
    assert!(matches!(
        replay(&checked, &sealed),
        Ok(Decoded::Admit { .. })
    ));
    let other = WechatApp::new(APP_ID, "test", Some(V1_KEY))
        .expect("app")
        .with_original_id("gh_000000000000");
    assert_eq!(
        replay(&other, &sealed).expect_err("refused").label,
        "wrong_app"
    );
}
