//! A WeCom third-party suite's one source for itself and all its corps, against callbacks made
//! by wechatpy's enterprise crypto (`scripts/fixtures/wechatpy_wecom_suite.py`, wechatpy 1.8.18)
//! from the documentation's sample documents: the suite's pushes encrypted for the SuiteId or for
//! the ISV's own corp id, and corps' messages encrypted for their case-sensitive corp ids.

use oncegate_core::{
    Accepted, Callback, Decoded, Headers, Method, RefusalKind, TenancyChange, TenantSet,
    WebhookSource,
};
use oncegate_wecom::WecomSuite;

struct NoHeaders;

impl Headers for NoHeaders {
    fn get(&self, _: &str) -> Option<&str> {
        None
    }
}

fn call<'a>(method: Method, query: &'a str, body: &'a [u8]) -> Callback<'a> {
    Callback {
        method,
        query: Some(query),
        headers: &NoHeaders,
        body,
        tenant: None,
    }
}

const TOKEN: &str = "suite-fixture-token";
const KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";
const SUITE_ID: &str = "ww4asffe99e54c0f4c";
const PROVIDER_CORP: &str = "wwprovider00000001";
const CORP_A: &str = "wpAbCdEf0123456789ZzYy";
const CORP_B: &str = "wpabcdef0123456789zzyy";

// Printed by scripts/fixtures/wechatpy_wecom_suite.py.
const TICKET_BODY: &str = "<xml><ToUserName><![CDATA[ww4asffe99e54c0f4c]]></ToUserName><Encrypt><![CDATA[8cjUqMcBKUqGlE6qCS+O2NK0NwmsyoEC+/CSaL1NHvkKp4eIJhEi4Gm16SSGANVnjHCEsJxk4vC4AAy2sFNfqUOtB2bAJMY3Kj+FEYexz3CmwibNKllqq2nTbaXu5u+7iB14x46nyA+JIsIHWsxc3jojfpG6HQbp6c4vpj0FNAaPio0uEZ/K4sZzjBO/wN5vKzQhkZOE8W/LGPW6eHOgf3dTNB2T2iYWgOzGOZzjPX31vCj8qeA4a2L+R9Wz6LM9Ov49na4aNY3TVD4BfYa5JoiCuoBI1Te/ouE4tHM1XefNLuLgAIz5bkBtlOB+EA9MDLlNQ8AnkhZZRuplkXMJ4A==]]></Encrypt></xml>";
const TICKET_QUERY: &str =
    "msg_signature=1a3907c751a0b5bdbdced9d342ef86a8fa76b62a&timestamp=1700000000&nonce=1372623149";
const CREATE_AUTH_BODY: &str = "<xml><ToUserName><![CDATA[wwprovider00000001]]></ToUserName><Encrypt><![CDATA[Iy06K90RHqCFwYh5qQ1+3GrdpyGpOU+Pz7YwtQwsQLAaWlXUFekbIDF/XtSi/R0JHK2NFfyk0ZKptWCJlH132GoyGPK6jzRyQBWj3MWbxzHR6Tly8uXZfRlrNGvYQZ0vRb87JKqQNHZN2Fq0MHu4MoYI9hud09KAU7dDvR8Uq/hA9r1lK0UelluV5wPOgiPGiNSsAIs2bFACKpVyOwf44icNxOw8eDwhLlHzVJ0TZn1GhNd270VrYKW1peOiqmdGcfEphTjH6drqt4K8bqK3TPCJu+ViGqFx1MJdOZ/d/IAxlqIT0jxNBYPTy4+Nbut26k77UF1/uaOfVV6cKEnLi0wg1VTe6AUxM6G5ZS5wur2pbJzpoAVxvt8BqKkAYG0j]]></Encrypt></xml>";
const CREATE_AUTH_QUERY: &str =
    "msg_signature=9a8f6db81fc4c3dd0a4c3834e47ac1bf72f2e14a&timestamp=1700000000&nonce=1372623149";
const CANCEL_AUTH_BODY: &str = "<xml><ToUserName><![CDATA[ww4asffe99e54c0f4c]]></ToUserName><Encrypt><![CDATA[P2reb3zff+KmB1E79HyKB6zgsuFPpxzYAkTaAURNRnXXIbloKInAPl0bxwxkcU+lh4dyLgDNCNObdRuHqdYPX9fcV0YlIKDaRh1LjhwQgR7qgOLj8K/JhCE3YC22xKBaS0NncV3edaVIFpXAczenBCipeWbgMHIsF2v9lc5yZ00+5AxJHgQespuT9ozu18bzNsU5SQVTaSm4Hygbges8/h9wLUKqITPW+T5XhnYNZvJaDP1VMAHzFRogvj9bAyNXJMP+I+92J1k7bWqQOAUtJogX0MHVAYjop7Q6p3z/bt+9StEz+8GYwSKlVpLI4//6UPqYoH8NqgjMi574WsKXsg==]]></Encrypt></xml>";
const CANCEL_AUTH_QUERY: &str =
    "msg_signature=602d7c71e9718f207774a6538ca984f491f9df7e&timestamp=1700000000&nonce=1372623149";
const CHANGE_AUTH_BODY: &str = "<xml><ToUserName><![CDATA[ww4asffe99e54c0f4c]]></ToUserName><Encrypt><![CDATA[29msLXlBlxIKuH4yb5RrCVLiB3hdjgD1HdRE9incpAqw5msPVO3/qMaPsbkObupVE9lP1PHKugfUO6MlldT+1yQEjiVXzCwmVOCOX535BtdOaTMBcLiGgdlAn8blS8Xw2hKIGXcIuleFMGWA5ESEYHUkJraNSY8P0bMr51bLdyFW7iuo/LlSvPQZl8xMJ/OLlJAz8rhRhdY12sh//i7yymgjAxk8x3EyXpwrntl6O49RFnGPfLtzbzoSxLKKysgtT2a/Eu8oxK4IqddXYJ50l/tdhod5d4B6VwBAWDDEFM3NBoR5nBJxv9BSIorDeLQ64jwvz9boR5kVnPvPf1e3evF6iw4T9IPRGfIoN2N1n4T3UYeRsKEtAFsz9rq76uumESSRorUA3XSjkYUO2LKXj4DXaotr5hJXzA/FXBdme9Q=]]></Encrypt></xml>";
const CHANGE_AUTH_QUERY: &str =
    "msg_signature=652bedf4d3b5cd24385944f47ee224ce275ac570&timestamp=1700000000&nonce=1372623149";
const CORP_A_BODY: &str = "<xml><ToUserName><![CDATA[wpAbCdEf0123456789ZzYy]]></ToUserName><Encrypt><![CDATA[cXHVRIYRoJNvjKP73MDpFskGEfqrmxWB5o5lvdRdjU6MDUPwfRNHrJ+yrzUUC6jqEBrRsHv3IUA1uRDCubeM1Ndr7c52AYDNy8qXNUNsPhLRNtQ4gCeovUIhYnxcK5AyU/qeXM0EIq5cgKWxcXpRBJfrvXSLlI3xjF1EUyxAGGibO3S/stofebrlK41zKE97aSnQycsCxmp0b0sGUE/hqwftQxP/QhbcYgxgx0eV0Q5zztJOaAsE72/B8gQJKKFfdmCnIk8UhoFs95Dvk9K61zitMCrJ0wnPWaQzqLXePS8C66EYpYZMoS7dUobbjuHMzxBEmKDpYY3zq0ww0ZDoobUdrMa8vX5B/UxgkM2hXL+lIlIew7nWPBDvO0pER1Wb/PtoWmQLxX8yAkAkT1lf2d1woxl+k9QUK6w5Nmx6oxfccMSaIEFIjp6/ygIoyKG2XpM6MUttaHpxyRFTt1QaRw==]]></Encrypt></xml>";
const CORP_A_QUERY: &str =
    "msg_signature=36dcc9fea5d89e50544d40dc5b609b069d59f11d&timestamp=1700000000&nonce=1372623149";
const CORP_B_BODY: &str = "<xml><ToUserName><![CDATA[wpabcdef0123456789zzyy]]></ToUserName><Encrypt><![CDATA[lyihQ+g0xPB3orp0x4MNc99/qQleSbp8Ef4mwsp6Urk/ZoXvruRd4oHqOgkq9quW7XGNVKCSdGzGMBfDEgMCcF32VVfV7reSvc57dpQqZcFSxohJPj4ud0xUX6Ktr70QUGqonBMz+UIRIKZbYHI1P5Tisc+GZFNDB0Q5gCUWwCs1AfWrmGhPxp5I7Xzc2dmrhVTljPIi5Q2jX/Ya/shP5fhe1lH0uAh98+JwgCJmN3JFiy8WCyVdT9D9wDUrbgJq77gH6c7z2E6hv96vPeIkSFK7aw8EEL3Z6a3Uk5ZQhr0OZWpqQ3rm1TY8wu2W2cn5m67cq9kfoyPglhIeyAKHr6hmqldt5x+Nx0y0M0fPjvpP0PzRfxh8oQBmFc/RHouMrma++rSGM1EUh9dt9aGOGmmP1CIRf1gY6lMSYpOQjqRhT79TaaBZ3ITdVnaxJJaEV41IquWsoWkY0/47k587fA==]]></Encrypt></xml>";
const CORP_B_QUERY: &str =
    "msg_signature=84d4a0002cd11eae81f5a990f63c40f5b6431bdf&timestamp=1700000000&nonce=1372623149";
const ECHO_SIGNATURE: &str = "81b129b6d802016b2259fcc0d3a42f9406eb4c42";
const ECHOSTR: &str =
    "/+a+F9Xn15L7x6H5rxbuv8Ov/OkNSM78dwjlDJxVrohWJgxzm+DDTLBtvFjVQpLgDyTcpFTTmaizfpjwQr/4jw==";

fn suite() -> WecomSuite {
    WecomSuite::new(SUITE_ID, Some(PROVIDER_CORP), TOKEN, KEY).expect("suite")
}

fn admitted(source: &WecomSuite, query: &str, body: &str) -> oncegate_core::Admit {
    match source.decode(&call(Method::Post, query, body.as_bytes())) {
        Ok(Decoded::Admit { admit, stamp }) => {
            assert!(stamp.is_some(), "a stamp for the replay guard");
            admit
        }
        other => panic!("expected an admission, got {other:?}"),
    }
}

#[test]
fn the_suites_own_pushes_are_events_answered_success() {
    let source = suite();
    let ticket = admitted(&source, TICKET_QUERY, TICKET_BODY);
    assert_eq!(&*ticket.event.event_type, "suite.suite_ticket");
    assert_eq!(&*ticket.event.app, SUITE_ID);
    assert_eq!(ticket.event.created_at_ms, 1_700_000_000_000);
    assert!(
        String::from_utf8_lossy(&ticket.event.payload).contains("asdfasfdasdfasdf"),
        "the handler gets the ticket"
    );
    // Encrypted for the ISV's own corp id, as seen in production: taken too.
    let create = admitted(&source, CREATE_AUTH_QUERY, CREATE_AUTH_BODY);
    assert_eq!(&*create.event.event_type, "suite.create_auth");
    let cancel = admitted(&source, CANCEL_AUTH_QUERY, CANCEL_AUTH_BODY);
    assert_eq!(&*cancel.event.event_type, "suite.cancel_auth");
    assert_eq!(cancel.event.tenant.as_deref(), Some(CORP_A));
    assert_eq!(cancel.event.order_key.as_deref(), Some(CORP_A));
    // Whose it is, as routes match it: the corp it is about, not the suite that got it.
    assert_eq!(
        oncegate_wecom::owner(&cancel.event),
        oncegate_core::Owner {
            tenant: Some(CORP_A),
            agent: None,
        }
    );
    // Three different pushes, three different keys; a retry of one is the same key.
    let keys = [&ticket, &create, &cancel].map(|a| a.keys.primary());
    assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2]);
    assert_eq!(
        admitted(&source, TICKET_QUERY, TICKET_BODY).keys,
        ticket.keys
    );
    // A replying route on the suite's pushes still answers them `success`, never its own body.
    let routed = source.sync_reply_for(
        Some(bytes::Bytes::from_static(b"{\"x\":1}")),
        None,
        SUITE_ID,
    );
    assert_eq!(&routed.body[..], b"success");
    assert_eq!(&source.sync_reply_for(None, None, CORP_A).body[..], b"");
    // What the gateway keeps of them: the newest ticket, and a corp that left.
    assert_eq!(
        source.tenancy(&ticket.event),
        Some(TenancyChange::Ticket {
            ticket: "asdfasfdasdfasdf".into(),
            issued_secs: 1_700_000_000,
            life: std::time::Duration::from_secs(1800),
        })
    );
    assert_eq!(
        source.tenancy(&cancel.event),
        Some(TenancyChange::Left {
            tenant: CORP_A.into()
        })
    );
    // A change_auth (the documentation's sample, 90642) has the corp's authorisation read
    // again: its own key, about its corp.
    let change = admitted(&source, CHANGE_AUTH_QUERY, CHANGE_AUTH_BODY);
    assert_eq!(&*change.event.event_type, "suite.change_auth");
    assert_eq!(change.event.tenant.as_deref(), Some(CORP_B));
    assert!(keys.iter().all(|key| *key != change.keys.primary()));
    assert_eq!(
        source.tenancy(&change.event),
        Some(TenancyChange::Rescoped {
            tenant: CORP_B.into()
        })
    );
    assert_eq!(source.redacted(&change.event), None, "nothing secret in it");
    // A create_auth's code is what the gateway exchanges for the corp's permanent code.
    assert_eq!(
        source.tenancy(&create.event),
        Some(TenancyChange::Authorised {
            auth_code: "AUTHCODE".into()
        })
    );
    for how in [Accepted::Admitted, Accepted::Duplicate] {
        assert_eq!(
            &source.accepted_as(how, "suite.suite_ticket").body[..],
            b"success"
        );
        assert_eq!(&source.accepted_as(how, "message.text").body[..], b"");
    }
}

#[test]
fn a_corps_callback_is_taken_only_from_a_known_corp_named_exactly() {
    let source = suite();
    let refused = source
        .decode(&call(Method::Post, CORP_A_QUERY, CORP_A_BODY.as_bytes()))
        .expect_err("no corp known yet");
    assert_eq!(
        (refused.kind, refused.label),
        (RefusalKind::Unavailable, "unknown_tenant")
    );
    // Known as its encrypted id, case and all: corp B, the same letters in lower case, is
    // another corp.
    source.tenants().replace(vec![CORP_A.to_owned()]);
    let a = admitted(&source, CORP_A_QUERY, CORP_A_BODY);
    assert_eq!(
        (
            &*a.event.app,
            a.event.tenant.as_deref(),
            &*a.event.event_type
        ),
        (CORP_A, Some("1"), "message.text")
    );
    assert_eq!(
        a.event.order_key.as_deref(),
        Some("1:zhangsan"),
        "corp:agent:chat"
    );
    let b = source
        .decode(&call(Method::Post, CORP_B_QUERY, CORP_B_BODY.as_bytes()))
        .expect_err("corp B is not corp A");
    assert_eq!(b.label, "unknown_tenant");
    source
        .tenants()
        .replace(vec![CORP_A.to_owned(), CORP_B.to_owned()]);
    let b = admitted(&source, CORP_B_QUERY, CORP_B_BODY);
    assert_eq!(&*b.event.app, CORP_B);
    assert_eq!(
        source.tenancy(&b.event),
        None,
        "a corp's message changes no tenancy"
    );
    // The same message text, user and id in two corps: two events, two chats.
    assert_ne!(a.keys.primary(), b.keys.primary());
    assert_ne!(a.event.order_hash(), b.event.order_hash());
    // Removed again: refused again.
    source.tenants().replace(vec![CORP_B.to_owned()]);
    assert!(
        source
            .decode(&call(Method::Post, CORP_A_QUERY, CORP_A_BODY.as_bytes()))
            .is_err()
    );
}

#[test]
fn the_url_verification_decrypts_for_the_isv_and_forgeries_are_refused() {
    let query = format!(
        "msg_signature={ECHO_SIGNATURE}&timestamp=1700000000&nonce=1372623149&echostr={}",
        ECHOSTR
            .replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D")
    );
    match suite().decode(&call(Method::Get, &query, b"")) {
        Ok(Decoded::SignedChallenge { answer: reply, .. }) => {
            assert_eq!(&reply.body[..], b"echo-1700000000")
        }
        other => panic!("expected the challenge, got {other:?}"),
    }
    // Without the ISV's corp id configured, that echostr is not the suite's.
    let bare = WecomSuite::new(SUITE_ID, None, TOKEN, KEY).expect("suite");
    assert!(bare.decode(&call(Method::Get, &query, b"")).is_err());
    // Another suite's token: the signature fails before anything is decrypted.
    let other =
        WecomSuite::new(SUITE_ID, Some(PROVIDER_CORP), "another-token", KEY).expect("suite");
    let refused = other
        .decode(&call(Method::Post, TICKET_QUERY, TICKET_BODY.as_bytes()))
        .expect_err("forged");
    assert_eq!(refused.kind, RefusalKind::Unauthenticated);
    // Another suite's id: its pushes are refused.
    let another = WecomSuite::new("wwanothersuite0000", None, TOKEN, KEY).expect("suite");
    assert!(
        another
            .decode(&call(Method::Post, TICKET_QUERY, TICKET_BODY.as_bytes()))
            .is_err()
    );
    assert!(WecomSuite::new("", None, TOKEN, KEY).is_err());
    assert!(WecomSuite::new(SUITE_ID, None, " ", KEY).is_err());
}

/// Whose an event is comes from the event alone: a corp's callback is its corp's and the agent
/// it names; an Official Account's message is the account's, with no agent.
#[test]
fn an_events_owner_is_its_corp_and_agent_or_its_account() {
    let event = |platform: &str, app: &str, tenant: Option<&str>| oncegate_core::Event {
        platform: platform.into(),
        app: app.into(),
        tenant: tenant.map(Into::into),
        event_id: "1".into(),
        event_type: "message.text".into(),
        created_at_ms: 0,
        order_key: None,
        payload: bytes::Bytes::new(),
    };
    let corp = event("wecom", CORP_A, Some("1000002"));
    assert_eq!(
        oncegate_wecom::owner(&corp),
        oncegate_core::Owner {
            tenant: Some(CORP_A),
            agent: Some("1000002"),
        }
    );
    let account = event("wechat", "wx0123456789abcdef", None);
    assert_eq!(
        oncegate_wecom::owner(&account),
        oncegate_core::Owner {
            tenant: Some("wx0123456789abcdef"),
            agent: None,
        }
    );
}

/// A suite's ticket and authorisation code go to routes as `redacted`: the gateway keeps them;
/// the rest of the push is as it came. Other events are not touched.
#[test]
fn tickets_and_codes_are_redacted_for_routes() {
    use oncegate_core::WebhookSource;
    let suite = oncegate_wecom::WecomSuite::new(SUITE_ID, None, TOKEN, KEY).expect("suite");
    let event = |event_type: &str, app: &str, xml: &str| oncegate_core::Event {
        platform: "wecom".into(),
        app: app.into(),
        tenant: None,
        event_id: "e".into(),
        event_type: event_type.into(),
        created_at_ms: 0,
        order_key: None,
        payload: bytes::Bytes::from(xml.to_owned()),
    };
    let ticket = format!(
        "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><InfoType><![CDATA[suite_ticket]]></InfoType><TimeStamp>1403610513</TimeStamp><SuiteTicket><![CDATA[asdfasfdasdfasdf]]></SuiteTicket></xml>"
    );
    let redacted = suite
        .redacted(&event("suite.suite_ticket", SUITE_ID, &ticket))
        .expect("redacted");
    let text = String::from_utf8(redacted.to_vec()).expect("utf8");
    assert_eq!(
        text,
        ticket.replace("asdfasfdasdfasdf", "redacted"),
        "only the ticket changes"
    );
    let auth = format!(
        "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><AuthCode><![CDATA[AUTHCODE&amp;x]]></AuthCode><InfoType><![CDATA[create_auth]]></InfoType><TimeStamp>1403610513</TimeStamp></xml>"
    );
    let redacted = suite
        .redacted(&event("suite.create_auth", SUITE_ID, &auth))
        .expect("redacted");
    let text = String::from_utf8(redacted.to_vec()).expect("utf8");
    assert!(
        !text.contains("AUTHCODE") && text.contains("create_auth") && text.contains(SUITE_ID),
        "an escaped code leaves only what routes need: {text}"
    );
    let message = "<xml><ToUserName>wpCorp</ToUserName><MsgType>text</MsgType></xml>";
    assert!(
        suite
            .redacted(&event("message.text", "wpCorp", message))
            .is_none()
    );
}

/// The data URL may name its corp (`$CORPID$`, `/webhook/<source>/<corp>`): a callback there is
/// taken only when encrypted for that corp.
#[test]
fn a_data_url_naming_a_corp_takes_that_corps_callbacks_only() {
    let source = suite();
    source
        .tenants()
        .replace(vec![CORP_A.to_owned(), CORP_B.to_owned()]);
    let at = |tenant| Callback {
        tenant: Some(tenant),
        ..call(Method::Post, CORP_A_QUERY, CORP_A_BODY.as_bytes())
    };
    assert!(matches!(
        source.decode(&at(CORP_A)),
        Ok(Decoded::Admit { .. })
    ));
    // Corp ids are case-sensitive: B differs from A only in case.
    let refused = source.decode(&at(CORP_B)).expect_err("another corp's URL");
    assert_eq!(
        (refused.kind, refused.label),
        (RefusalKind::BadInput, "wrong_app")
    );
}
