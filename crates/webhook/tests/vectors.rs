//! The presets against the platforms' published vectors (sources: shared/protocols/sources.md):
//! Slack's signing example (slack_sdk's test), GitHub's "Testing the webhook payload validation",
//! the Standard Webhooks specification's example. A forged, stale-less or re-signed request is
//! refused with the reason; handshakes are answered; an event's fields are read.

use std::collections::HashMap;

use oncegate_core::{Callback, Decoded, Headers, Method, Refusal, RefusalKind, WebhookSource};
use oncegate_webhook::{Location, WebhookApp, preset};

struct Map(HashMap<String, String>);

impl Headers for Map {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

fn headers(pairs: &[(&str, &str)]) -> Map {
    Map(pairs
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned()))
        .collect())
}

fn decode(app: &WebhookApp, headers: &Map, body: &[u8]) -> Result<Decoded, Refusal> {
    app.decode(&Callback {
        method: Method::Post,
        query: None,
        headers,
        body,
        tenant: None,
    })
}

const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const SLACK_BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
const SLACK_SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

fn slack(secrets: &[&str]) -> WebhookApp {
    WebhookApp::new(
        preset("slack").expect("preset"),
        "A0SLACK",
        secrets.iter().map(|s| (*s).to_owned()).collect(),
    )
    .expect("slack")
}

#[test]
fn slacks_published_request_passes_its_signature() {
    let signed = headers(&[
        ("X-Slack-Request-Timestamp", "1531420618"),
        ("X-Slack-Signature", SLACK_SIGNATURE),
    ]);
    // The example is a slash command (a form): verified, then refused as not the Events API's
    // JSON — not as unauthenticated.
    let refused =
        decode(&slack(&[SLACK_SECRET]), &signed, SLACK_BODY.as_bytes()).expect_err("a form");
    assert_eq!(refused.kind, RefusalKind::BadInput, "{refused}");
    // The previous secret of a rotation still verifies it.
    let rotated = decode(
        &slack(&["new-secret", SLACK_SECRET]),
        &signed,
        SLACK_BODY.as_bytes(),
    )
    .expect_err("a form");
    assert_eq!(rotated.kind, RefusalKind::BadInput, "{rotated}");
    // Another secret, a changed body, a changed timestamp: unauthenticated.
    for (secret, body, ts) in [
        ("another", SLACK_BODY.to_owned(), "1531420618"),
        (
            SLACK_SECRET,
            SLACK_BODY.replace("foobar", "foobaz"),
            "1531420618",
        ),
        (SLACK_SECRET, SLACK_BODY.to_owned(), "1531420619"),
    ] {
        let forged = headers(&[
            ("X-Slack-Request-Timestamp", ts),
            ("X-Slack-Signature", SLACK_SIGNATURE),
        ]);
        let refused = decode(&slack(&[secret]), &forged, body.as_bytes()).expect_err("forged");
        assert_eq!(refused.kind, RefusalKind::Unauthenticated, "{refused}");
        assert_eq!(refused.label, "bad_signature");
    }
    // No signature, no timestamp.
    let none = decode(
        &slack(&[SLACK_SECRET]),
        &headers(&[]),
        SLACK_BODY.as_bytes(),
    )
    .expect_err("bare");
    assert_eq!(none.kind, RefusalKind::Unauthenticated);
}

/// HMAC-SHA256 hex, as the vectors above make it (checked against them first).
fn hmac_hex(secret: &[u8], message: &[u8]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("key");
    mac.update(message);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_helper_signs_as_slack_does() {
    let message = format!("v0:1531420618:{SLACK_BODY}");
    assert_eq!(
        format!(
            "v0={}",
            hmac_hex(SLACK_SECRET.as_bytes(), message.as_bytes())
        ),
        SLACK_SIGNATURE
    );
}

#[test]
fn a_slack_event_is_read_and_its_url_check_answered() {
    let app = slack(&[SLACK_SECRET]);
    let sign = |ts: &str, body: &str| {
        headers(&[
            ("X-Slack-Request-Timestamp", ts),
            (
                "X-Slack-Signature",
                &format!(
                    "v0={}",
                    hmac_hex(
                        SLACK_SECRET.as_bytes(),
                        format!("v0:{ts}:{body}").as_bytes()
                    )
                ),
            ),
        ])
    };
    let event = r#"{"token":"x","team_id":"T1DC2JH3J","api_app_id":"A0SLACK","event":{"type":"message","channel":"C024BE91L","user":"U2147483697","text":"hi","ts":"1355517523.000005"},"type":"event_callback","event_id":"Ev0PV52K21","event_time":1355517523}"#;
    let Decoded::Admit { admit, stamp } =
        decode(&app, &sign("1355517524", event), event.as_bytes()).expect("admitted")
    else {
        panic!("an event");
    };
    assert_eq!(&*admit.event.event_id, "Ev0PV52K21");
    assert_eq!(&*admit.event.event_type, "message");
    assert_eq!(admit.event.order_key.as_deref(), Some("C024BE91L"));
    assert_eq!(admit.event.tenant.as_deref(), Some("T1DC2JH3J"));
    assert_eq!(admit.event.created_at_ms, 1_355_517_523_000);
    assert_eq!(&*admit.event.platform, "slack");
    let stamp = stamp.expect("a signed timestamp is checked against the window");
    assert_eq!(stamp.timestamp_secs, 1_355_517_524);
    // A retry (new timestamp, new signature) has the same key.
    let Decoded::Admit { admit: again, .. } =
        decode(&app, &sign("1355517584", event), event.as_bytes()).expect("again")
    else {
        panic!("an event");
    };
    assert_eq!(again.keys, admit.keys);

    let check = r#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    match decode(&app, &sign("1355517524", check), check.as_bytes()).expect("answered") {
        Decoded::SignedChallenge {
            answer,
            timestamp_secs,
        } => {
            assert_eq!(
                &answer.body[..],
                b"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
            );
            assert!(answer.content_type.starts_with("text/plain"));
            assert_eq!(timestamp_secs, 1_355_517_524);
        }
        other => panic!("{other:?}"),
    }
    // An unsigned url_verification is refused like any request.
    let refused = decode(&app, &headers(&[]), check.as_bytes()).expect_err("unsigned");
    assert_eq!(refused.kind, RefusalKind::Unauthenticated);
}

#[test]
fn githubs_published_vector_and_its_delivery_key() {
    let secret = "It's a Secret to Everybody";
    let app = WebhookApp::new(
        preset("github").expect("preset"),
        "octo",
        vec![secret.into()],
    )
    .expect("github");
    let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    // The vector's payload is not JSON: verified, then refused as input.
    let signed = headers(&[
        ("X-Hub-Signature-256", signature),
        ("X-GitHub-Event", "issues"),
        ("X-GitHub-Delivery", "d1"),
        ("X-GitHub-Hook-ID", "42"),
    ]);
    let refused = decode(&app, &signed, b"Hello, World!").expect_err("not JSON");
    assert_eq!(refused.kind, RefusalKind::BadInput, "{refused}");
    let forged = decode(&app, &signed, b"Hello, World?").expect_err("forged");
    assert_eq!(forged.kind, RefusalKind::Unauthenticated);

    let body = br#"{"action":"opened","issue":{"number":1},"repository":{"id":1296269},"installation":{"id":7}}"#;
    let sign = |event: &str, delivery: &str, hook: &str| {
        headers(&[
            (
                "X-Hub-Signature-256",
                &format!("sha256={}", hmac_hex(secret.as_bytes(), body)),
            ),
            ("X-GitHub-Event", event),
            ("X-GitHub-Delivery", delivery),
            ("X-GitHub-Hook-ID", hook),
        ])
    };
    let Decoded::Admit { admit, stamp } =
        decode(&app, &sign("issues", "72d3162e", "42"), body).expect("event")
    else {
        panic!("an event")
    };
    assert!(stamp.is_none(), "GitHub signs no timestamp");
    assert_eq!(&*admit.event.event_type, "issues.opened");
    assert_eq!(&*admit.event.event_id, "42:72d3162e");
    assert_eq!(admit.event.order_key.as_deref(), Some("1296269"));
    // One delivery id reaching two hooks (github/docs#32822) is two events.
    let Decoded::Admit {
        admit: other_hook, ..
    } = decode(&app, &sign("issues", "72d3162e", "43"), body).expect("event")
    else {
        panic!("an event")
    };
    assert_ne!(other_hook.keys, admit.keys);
    // A ping is answered, not admitted.
    assert!(matches!(
        decode(&app, &sign("ping", "p1", "42"), body),
        Ok(Decoded::Challenge(_))
    ));
}

#[test]
fn the_standard_webhooks_example() {
    let app = WebhookApp::new(
        preset("standard-webhooks").expect("preset"),
        "svix",
        vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
    )
    .expect("standard webhooks");
    let body = br#"{"test": 2432232314}"#;
    let example = |signature: &str, id: &str| {
        headers(&[
            ("webhook-id", id),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", signature),
        ])
    };
    // Rotation: the list holds an old signature and the current one.
    let listed = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    let Decoded::Admit { admit, stamp } =
        decode(&app, &example(listed, "msg_p5jXN8AQM9LWM0D4loKWxJek"), body).expect("the example")
    else {
        panic!("an event")
    };
    assert_eq!(&*admit.event.event_id, "msg_p5jXN8AQM9LWM0D4loKWxJek");
    assert_eq!(stamp.expect("stamp").timestamp_secs, 1_614_265_330);
    // The id is signed: another id with the same signature is refused.
    let refused = decode(&app, &example(listed, "msg_other"), body).expect_err("another id");
    assert_eq!(refused.kind, RefusalKind::Unauthenticated);
    // Without the id the signature covers: unauthenticated, as any request failing its check.
    let no_id = headers(&[
        ("webhook-timestamp", "1614265330"),
        ("webhook-signature", listed),
    ]);
    let refused = decode(&app, &no_id, body).expect_err("no id");
    assert_eq!(refused.kind, RefusalKind::Unauthenticated, "{refused}");
    // A secret that is not base64 is refused when the source is built.
    let bad = WebhookApp::new(
        preset("standard-webhooks").expect("preset"),
        "svix",
        vec!["whsec_!!".into()],
    );
    assert!(bad.is_err());
}

#[test]
fn telegrams_token_and_an_update() {
    let app = WebhookApp::new(
        preset("telegram").expect("preset"),
        "bot123",
        vec!["s3cr3t_token-1".into()],
    )
    .expect("telegram");
    let body = br#"{"update_id":10000,"message":{"message_id":1365,"date":1441645532,"chat":{"id":-1001234,"type":"supergroup"},"from":{"id":1111111},"text":"/start"}}"#;
    let Decoded::Admit { admit, .. } = decode(
        &app,
        &headers(&[("X-Telegram-Bot-Api-Secret-Token", "s3cr3t_token-1")]),
        body,
    )
    .expect("update") else {
        panic!("an event")
    };
    assert_eq!(&*admit.event.event_id, "10000");
    assert_eq!(admit.event.order_key.as_deref(), Some("-1001234"));
    assert_eq!(admit.event.created_at_ms, 1_441_645_532_000);
    for token in ["s3cr3t_token-2", ""] {
        let refused = decode(
            &app,
            &headers(&[("X-Telegram-Bot-Api-Secret-Token", token)]),
            body,
        )
        .expect_err("forged");
        assert_eq!(refused.kind, RefusalKind::Unauthenticated);
    }
}

/// The seeds' payloads: seed 004's wkteam callback and seed 002's xingyapi callback.
#[test]
fn the_seeds_gateways_payloads() {
    let wkteam =
        WebhookApp::new(preset("wkteam").expect("preset"), "wk", Vec::new()).expect("wkteam");
    assert!(wkteam.is_unsigned());
    let body = br#"{"account":"1","messageType":"80001","wcId":"wxid_bot","data":{"wId":"0000016e-63eb","fromUser":"wxid_a","fromGroup":"123@chatroom","toUser":"wxid_bot","content":"hi","msgId":1,"newMsgId":7343011937658390000,"timestamp":1700000000,"self":false}}"#;
    let Decoded::Admit { admit, .. } = decode(&wkteam, &headers(&[]), body).expect("wkteam") else {
        panic!("an event")
    };
    assert_eq!(&*admit.event.event_id, "0000016e-63eb:7343011937658390000");
    assert_eq!(admit.event.order_key.as_deref(), Some("123@chatroom"));
    assert_eq!(&*admit.event.event_type, "80001");

    let xingyapi =
        WebhookApp::new(preset("xingyapi").expect("preset"), "xy", Vec::new()).expect("xingyapi");
    let body = br#"{"MsgType":"text","roomType":2,"ChatId":"wr_abc","FromUserName":"wm_def","Content":"hello","MsgId":"19283746"}"#;
    let Decoded::Admit { admit, .. } = decode(&xingyapi, &headers(&[]), body).expect("xingyapi")
    else {
        panic!("an event")
    };
    assert_eq!(&*admit.event.event_id, "19283746");
    assert_eq!(admit.event.order_key.as_deref(), Some("wr_abc"));
    // No time in the callback: the time it arrived, not 1970 (which a watermark route would
    // take for older than anything it applied).
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis() as u64;
    assert!(
        admit.event.created_at_ms.abs_diff(now_ms) < 60_000,
        "{}",
        admit.event.created_at_ms
    );
}

#[test]
fn an_event_without_an_id_is_keyed_by_its_fingerprint_or_refused() {
    let mut spec = preset("xingyapi").expect("preset");
    let body = br#"{"MsgType":"text","ChatId":"wr_abc","Content":"hello"}"#;
    let refused = decode(
        &WebhookApp::new(spec.clone(), "xy", Vec::new()).expect("app"),
        &headers(&[]),
        body,
    )
    .expect_err("no id");
    assert_eq!(refused.label, "no_event_id");
    spec.fields.fingerprint = vec![
        Location::parse("/ChatId").expect("l"),
        Location::parse("/Content").expect("l"),
    ];
    let app = WebhookApp::new(spec, "xy", Vec::new()).expect("app");
    let key = |body: &[u8]| match decode(&app, &headers(&[]), body).expect("admitted") {
        Decoded::Admit { admit, .. } => admit.keys,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        key(body),
        key(br#"{"Content":"hello","ChatId":"wr_abc","MsgType":"text"}"#)
    );
    assert_ne!(
        key(body),
        key(br#"{"MsgType":"text","ChatId":"wr_abc","Content":"hello!"}"#)
    );
}

#[test]
fn specs_that_do_not_fit_are_refused_with_what_to_set() {
    let said = |result: Result<WebhookApp, oncegate_webhook::SpecError>| {
        result.expect_err("refused").to_string()
    };
    assert!(
        said(WebhookApp::new(
            preset("slack").expect("p"),
            "a",
            Vec::new()
        ))
        .contains("needs its secret")
    );
    assert!(
        said(WebhookApp::new(
            preset("wkteam").expect("p"),
            "a",
            vec!["x".into()]
        ))
        .contains("nothing checks it")
    );
    assert!(Location::parse("event_id").is_err());
    assert!(oncegate_webhook::Template::parse("{body}{nonce}").is_err());
}

/// Discord's interactions: Ed25519 over `{timestamp}{body}` with RFC 8032's first key (its
/// published pair), a PING answered PONG, an interaction admitted and answered "deferred".
#[test]
fn discords_interactions() {
    use ring::signature::{Ed25519KeyPair, KeyPair};
    let seed = [
        0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec, 0x2c,
        0xc4, 0x44, 0x49, 0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03, 0x1c, 0xae,
        0x7f, 0x60,
    ];
    let pair = Ed25519KeyPair::from_seed_unchecked(&seed).expect("seed");
    let public: String = pair
        .public_key()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        public,
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    );
    let app =
        WebhookApp::new(preset("discord").expect("preset"), "app1", vec![public]).expect("discord");
    let sign = |ts: &str, body: &str| {
        let signature: String = pair
            .sign(format!("{ts}{body}").as_bytes())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        headers(&[
            ("X-Signature-Ed25519", &signature),
            ("X-Signature-Timestamp", ts),
        ])
    };
    let ping = r#"{"type":1,"id":"1","application_id":"app1"}"#;
    match decode(&app, &sign("1700000000", ping), ping.as_bytes()).expect("ping") {
        Decoded::SignedChallenge { answer, .. } => assert_eq!(&answer.body[..], br#"{"type":1}"#),
        other => panic!("{other:?}"),
    }
    let command = r#"{"type":2,"id":"1179185358553571410","application_id":"app1","guild_id":"G1","channel_id":"C9","data":{"name":"blep"}}"#;
    let Decoded::Admit { admit, .. } =
        decode(&app, &sign("1700000001", command), command.as_bytes()).expect("command")
    else {
        panic!("an interaction")
    };
    assert_eq!(&*admit.event.event_id, "1179185358553571410");
    assert_eq!(&*admit.event.event_type, "2.blep");
    assert_eq!(admit.event.order_key.as_deref(), Some("C9"));
    assert_eq!(
        &app.accepted(oncegate_core::Accepted::Admitted).body[..],
        br#"{"type":5}"#
    );
    // Discord's own checks send bad signatures: each refused.
    let mut forged = sign("1700000001", command);
    forged
        .0
        .insert("x-signature-timestamp".into(), "1700000002".into());
    assert_eq!(
        decode(&app, &forged, command.as_bytes())
            .expect_err("forged")
            .kind,
        RefusalKind::Unauthenticated
    );
    // A key that is not 32 bytes of hex is refused when the source is built.
    assert!(
        WebhookApp::new(
            preset("discord").expect("preset"),
            "app1",
            vec!["abcd".into()]
        )
        .is_err()
    );
}

/// DingTalk's robot callback over HTTP: `sign` is the base64 HMAC-SHA256 (the app secret as
/// key) of `{timestamp}\n{secret}` — the sheet's vector, computed as the platform's own
/// snippet does (`hmac.new(secret, f"{ts}\n{secret}", sha256)`, base64).
#[test]
fn dingtalks_robot_sign_and_a_robot_message() {
    let app = WebhookApp::new(
        preset("dingtalk-robot").expect("preset"),
        "dingrobot",
        vec!["SECtest".into()],
    )
    .expect("dingtalk-robot");
    let signed = headers(&[
        ("timestamp", "1700000000000"),
        ("sign", "aZLLrriXgn05YbwaGR7knYsLeJADjr9NwLaNNKpxh4g="),
    ]);
    let body = br#"{"msgId":"msgAbC=","conversationId":"cid9","conversationType":"2","senderStaffId":"staff1","chatbotCorpId":"ding_corp","robotCode":"dingrobot","createAt":1700000000123,"msgtype":"text","text":{"content":"hi"}}"#;
    let Decoded::Admit { admit, stamp } = decode(&app, &signed, body).expect("signed") else {
        panic!("an event")
    };
    assert_eq!(&*admit.event.platform, "dingtalk");
    assert_eq!(&*admit.event.event_id, "msgAbC=");
    assert_eq!(
        &*admit.event.event_type, "bot_message",
        "as Stream mode types them"
    );
    assert_eq!(admit.event.order_key.as_deref(), Some("cid9"));
    assert_eq!(admit.event.tenant.as_deref(), Some("ding_corp"));
    assert_eq!(admit.event.created_at_ms, 1_700_000_000_123);
    assert!(
        stamp.is_some(),
        "the signed timestamp goes to the replay window"
    );
    // Another secret, another timestamp, no headers: refused as unauthenticated.
    for forged in [
        headers(&[
            ("timestamp", "1700000000001"),
            ("sign", "aZLLrriXgn05YbwaGR7knYsLeJADjr9NwLaNNKpxh4g="),
        ]),
        headers(&[
            ("timestamp", "1700000000000"),
            ("sign", "bZLLrriXgn05YbwaGR7knYsLeJADjr9NwLaNNKpxh4g="),
        ]),
        headers(&[("timestamp", "1700000000000")]),
        headers(&[]),
    ] {
        let refused = decode(&app, &forged, body).expect_err("forged");
        assert_eq!(refused.kind, RefusalKind::Unauthenticated, "{refused}");
    }
    // What DingTalk's scheme cannot catch: the body is not signed (check-config says so; the
    // replay guard takes each signature once).
    assert!(
        decode(
            &app,
            &signed,
            br#"{"msgId":"other","conversationId":"cid9"}"#
        )
        .is_ok()
    );
    // A message without an id is keyed by what it is.
    let key = |body: &[u8]| match decode(&app, &signed, body).expect("admitted") {
        Decoded::Admit { admit, .. } => admit.event.event_id.to_string(),
        other => panic!("{other:?}"),
    };
    let bare =
        br#"{"conversationId":"cid9","senderStaffId":"s","createAt":5,"text":{"content":"hi"}}"#;
    assert!(key(bare).starts_with("fp-"), "{}", key(bare));
    assert_eq!(key(bare), key(bare));
    assert_ne!(
        key(bare),
        key(br#"{"conversationId":"cid9","senderStaffId":"s","createAt":5,"text":{"content":"ho"}}"#)
    );
}
