//! Typed WeCom and WeChat events, read from what the platforms' documentation publishes: WeCom's
//! official encrypted sample message (its own ciphertext, decrypted by the app), the
//! `change_external_chat` sample of the customer-group page, an Official Account text message
//! (`gh_` receiver) and an AI bot's JSON text callback.

use oncegate_core::{Callback, Decoded, Event, FromEvent, Headers, Method, Sealer, WebhookSource};
use oncegate_wecom::events::{CallbackEvent, ExternalChatChange, Text};
use oncegate_wecom::{WechatApp, WecomApp};

struct NoHeaders;

impl Headers for NoHeaders {
    fn get(&self, _: &str) -> Option<&str> {
        None
    }
}

fn decode(source: &dyn WebhookSource, query: &str, body: &[u8]) -> Event {
    let decoded = source.decode(&Callback {
        method: Method::Post,
        query: Some(query),
        headers: &NoHeaders,
        body,
        tenant: None,
    });
    match decoded {
        Ok(Decoded::Admit { admit, .. }) => admit.event,
        Ok(_) => panic!("not an admission"),
        Err(refusal) => panic!("refused: {refusal:?}"),
    }
}

/// Seals `plain` as the platform would (for documented plaintexts that come without a
/// published ciphertext) and decodes it.
fn sealed(source: &(impl WebhookSource + Sealer), plain: &str) -> Event {
    let request = source.seal(plain.as_bytes(), 1_700_000_000, "nonce", [3; 16]);
    decode(
        source,
        request.query.as_deref().unwrap_or_default(),
        &request.body,
    )
}

const CORP: &str = "wx5823bf96d3bd56c7";

fn wecom() -> WecomApp {
    WecomApp::new(
        CORP,
        "QDG6eK",
        "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C",
    )
    .expect("app")
}

#[test]
fn the_official_sample_message_reads_as_text() {
    let body = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><Encrypt><![CDATA[RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q==]]></Encrypt><AgentID><![CDATA[218]]></AgentID></xml>";
    let query = "msg_signature=477715d11cdb4164915debcba66cb864d751f3e6&timestamp=1409659813&nonce=1372623149";
    let event = decode(&wecom(), query, body.as_bytes());
    let text = Text::from_event(&event).expect("a text message");
    assert_eq!(text.from, "mycreate");
    assert_eq!(text.to.as_deref(), Some(CORP));
    assert_eq!(text.content, "hello");
    assert_eq!(text.msg_id.as_deref(), Some("4561255354251345929"));
    assert_eq!(text.agent_id.as_deref(), Some("218"));
    assert_eq!(text.create_time, Some(1_409_659_813));
}

#[test]
fn a_customer_group_change_reads_its_members_and_versions() {
    // The customer-group change page's sample.
    let plain = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><FromUserName><![CDATA[sys]]></FromUserName><CreateTime>1403610513</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[change_external_chat]]></Event><ChatId><![CDATA[CHAT_ID]]></ChatId><ChangeType><![CDATA[update]]></ChangeType><UpdateDetail><![CDATA[add_member]]></UpdateDetail><JoinScene>1</JoinScene><QuitScene>0</QuitScene><MemChangeCnt>10</MemChangeCnt><MemChangeList><Item>Jack</Item><Item>Rose</Item></MemChangeList><LastMemVer>9c3f97c2ada667dfb5f6d03308d963e1</LastMemVer><CurMemVer>71217227bbd112ecfe3a49c482195cb4</CurMemVer></xml>";
    let event = sealed(&wecom(), plain);
    assert_eq!(&*event.event_type, "event.change_external_chat.update");
    let change = ExternalChatChange::from_event(&event).expect("a group change");
    assert_eq!(change.chat_id, "CHAT_ID");
    assert_eq!(change.update_detail.as_deref(), Some("add_member"));
    assert_eq!(change.join_scene, Some(1));
    assert_eq!(change.members, ["Jack", "Rose"]);
    assert_eq!(
        change.cur_mem_ver.as_deref(),
        Some("71217227bbd112ecfe3a49c482195cb4")
    );
    // The same event is also a callback event, with every field.
    let generic = CallbackEvent::from_event(&event).expect("an event");
    assert_eq!(generic.event, "change_external_chat");
    assert_eq!(generic.change_type.as_deref(), Some("update"));
    assert_eq!(
        generic.field("LastMemVer"),
        Some("9c3f97c2ada667dfb5f6d03308d963e1")
    );
    assert!(Text::from_event(&event).is_err());
}

#[test]
fn an_official_account_text_message_reads_as_text() {
    let app = WechatApp::new(
        "wx_app",
        "token",
        Some("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"),
    )
    .expect("app")
    .with_original_id("gh_account");
    let plain = "<xml><ToUserName><![CDATA[gh_account]]></ToUserName><FromUserName><![CDATA[oUser123]]></FromUserName><CreateTime>1348831860</CreateTime><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[this is a test]]></Content><MsgId>1234567890123456</MsgId></xml>";
    let event = sealed(&app, plain);
    let text = Text::from_event(&event).expect("a text message");
    assert_eq!(
        (text.from.as_str(), text.to.as_deref()),
        ("oUser123", Some("gh_account"))
    );
    assert_eq!(text.content, "this is a test");
    assert_eq!(text.agent_id, None);
}

#[test]
fn an_ai_bots_json_text_reads_as_text_and_other_platforms_do_not() {
    let event = Event {
        platform: "wecom".into(),
        app: "aib_bot".into(),
        tenant: None,
        event_id: "m1".into(),
        event_type: "message.text".into(),
        created_at_ms: 0,
        order_key: None,
        payload: r#"{"msgid":"m1","aibotid":"aib_bot","chatid":"wrk_group","chattype":"group","from":{"userid":"zhangsan"},"msgtype":"text","text":{"content":"@bot hi"}}"#.into(),
    };
    let text = Text::from_event(&event).expect("a text message");
    assert_eq!(text.from, "zhangsan");
    assert_eq!(text.content, "@bot hi");
    assert_eq!(text.chat_id.as_deref(), Some("wrk_group"));
    let mut feishu = event.clone();
    feishu.platform = "feishu".into();
    let error = Text::from_event(&feishu).expect_err("not WeCom");
    assert!(
        error.to_string().contains("not a WeCom or WeChat event"),
        "{error}"
    );
}

#[test]
fn messages_address_the_bot_and_callback_events_do_not() {
    use oncegate_wecom::events::addresses_bot;
    // WeCom's official sample message to an app, and an Official Account's text message.
    let body = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><Encrypt><![CDATA[RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q==]]></Encrypt><AgentID><![CDATA[218]]></AgentID></xml>";
    let query = "msg_signature=477715d11cdb4164915debcba66cb864d751f3e6&timestamp=1409659813&nonce=1372623149";
    assert!(addresses_bot(&decode(&wecom(), query, body.as_bytes())));
    // A customer-group change is an event, not a message to the bot.
    let change = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><FromUserName><![CDATA[sys]]></FromUserName><CreateTime>1403610513</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[change_external_chat]]></Event><ChatId><![CDATA[CHAT_ID]]></ChatId><ChangeType><![CDATA[update]]></ChangeType></xml>";
    assert!(!addresses_bot(&sealed(&wecom(), change)));
    // An AI bot's group text (doc 101463's sample: sent to it only when @-mentioned), and its
    // enter_chat event.
    let bot = oncegate_wecom::AiBot::new("AIBOTID").expect("bot");
    let group = br#"{"msgid":"CAIQ16HMjQYY\/NGagIOAgAMgq4KM0AI=","aibotid":"AIBOTID","chatid":"CHATID","chattype":"group","from":{"userid":"USERID"},"msgtype":"text","text":{"content":"@RobotA hello robot"}}"#;
    let admitted = bot
        .admit(bytes::Bytes::from_static(group))
        .expect("admitted");
    assert!(addresses_bot(&admitted.event));
    let enter = br#"{"msgid":"CAIQ2","aibotid":"AIBOTID","chattype":"single","from":{"userid":"lisi"},"msgtype":"event","event":{"eventtype":"enter_chat"}}"#;
    let admitted = bot
        .admit(bytes::Bytes::from_static(enter))
        .expect("admitted");
    assert!(!addresses_bot(&admitted.event));
    // Another platform's message is not WeCom's to judge.
    let mut feishu = admitted.event.clone();
    feishu.platform = "feishu".into();
    feishu.event_type = "message.text".into();
    assert!(!addresses_bot(&feishu));
}
