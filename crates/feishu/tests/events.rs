//! Typed events read from the samples of Feishu's documentation (the `im.message.receive_v1`,
//! `card.action.trigger` and `im.chat.member.user.added_v1` pages), decoded as oncegate
//! decodes them: through the app's own decoder, so the typed reader sees the stored payload.

use oncegate_core::{Event, FromEvent};
use oncegate_feishu::events::{CardAction, ChatMembersChanged, MemberChange, MessageReceived};
use oncegate_feishu::{Cloud, FeishuApp, Inbound};

/// The `im.message.receive_v1` page's example.
const MESSAGE: &str = include_str!("fixtures/message_receive_v1.json");

/// The card callback page's example (`card.action.trigger`).
const CARD: &str = r#"{"schema":"2.0","header":{"event_id":"f7984f25108f8137722bb63cee927e66","token":"066zT6pS4QCbgj5Do145GfDbbagCHGgF","create_time":"1603977298000000","event_type":"card.action.trigger","tenant_key":"2df73991750f175c","app_id":"cli_9f5343c580712544"},"event":{"operator":{"tenant_key":"2df73991750f175c","user_id":"867b1b5d","open_id":"ou_3c14f3a59eaf2825dbe25359f15fd2ae","union_id":"on_cad4860e7af114fb4ff6c5d496d1dd76"},"token":"c-295ee57ebc5d5a7e3bc2b5d4d0b6bf0f3f8b1e2a","action":{"value":{"key":"value"},"tag":"button","timezone":"Asia/Shanghai","name":"Button_m4mtle6k"},"host":"im_message","delivery_type":"url_preview","context":{"url":"xxx","preview_token":"xxx","open_message_id":"om_574d639e4a44e4dd646eaf628e2c5a7a","open_chat_id":"oc_e4d2605ca917e695f54f11aaf56f1a6b"}}}"#;

/// The `im.chat.member.user.added_v1` page's example.
const ADDED: &str = r#"{"schema":"2.0","header":{"event_id":"5e3702a84e847582be8db7fb73283c02","event_type":"im.chat.member.user.added_v1","create_time":"1608725989000","token":"rvaYgkR1yz1Xsmd5pHOuSghrDRMDF8Gn","app_id":"cli_9f5343c580712544","tenant_key":"2ca1d211f64f6438"},"event":{"chat_id":"oc_a0553eda9014c201e6969b478895c230","operator_id":{"union_id":"on_8ed6aa67826108097d9ee143816345","user_id":"e33ggbyz","open_id":"ou_84aad35d084aa403a838cf73ee18467"},"external":false,"operator_tenant_key":"86gkfds4aja8","users":[{"name":"user name","tenant_key":"736588c9260f175e","user_id":{"union_id":"on_8ed6aa67826108097d9ee143816345","user_id":"e33ggbyz","open_id":"ou_84aad35d084aa403a838cf73ee18467"}}],"name":"群名称","i18n_names":{"zh_cn":"群名称","en_us":"group name","ja_jp":"グループ名"}}}"#;

fn decoded(document: &str) -> Event {
    let app = FeishuApp::new(
        Cloud::Feishu,
        "cli_9f5343c580712544",
        None,
        Some("rvaYgkR1yz1Xsmd5pHOuSghrDRMDF8Gn".into()),
    )
    .expect("app");
    match app.open_pushed(document.as_bytes()).expect("decoded") {
        Inbound::Event(verified) | Inbound::Card(verified) => verified.event,
        Inbound::Challenge { .. } => panic!("not an event"),
    }
}

#[test]
fn a_received_message_reads_as_the_documentation_describes_it() {
    let event = decoded(MESSAGE);
    let message = MessageReceived::from_event(&event).expect("a message");
    assert_eq!(
        message.sender.sender_id.open_id.as_deref(),
        Some("ou_84aad35d084aa403a838cf73ee18467")
    );
    assert_eq!(
        message.message.message_id,
        "om_5ce6d572455d361153b7cb51da133945"
    );
    assert_eq!(
        message.message.chat_id,
        "oc_5ce6d572455d361153b7xx51da133945"
    );
    assert_eq!(message.message.chat_type, "group");
    assert_eq!(message.message.text().as_deref(), Some("@_user_1 hello"));
    assert_eq!(message.message.mentions[0].name, "Tom");
    // The raw document is still there, its verification token taken out.
    assert!(!String::from_utf8_lossy(&event.payload).contains("rvaYgkR1yz1Xsmd5pHOuSghrDRMDF8Gn"));
}

#[test]
fn a_card_action_reads_its_value_and_context() {
    let event = decoded(CARD);
    let card = CardAction::from_event(&event).expect("a card action");
    assert_eq!(
        card.operator.open_id.as_deref(),
        Some("ou_3c14f3a59eaf2825dbe25359f15fd2ae")
    );
    assert_eq!(card.action.tag, "button");
    assert_eq!(card.action.value, serde_json::json!({"key": "value"}));
    assert_eq!(
        card.context.open_chat_id.as_deref(),
        Some("oc_e4d2605ca917e695f54f11aaf56f1a6b")
    );
}

#[test]
fn members_added_and_removed_read_as_one_family() {
    let added = ChatMembersChanged::from_event(&decoded(ADDED)).expect("a member change");
    assert_eq!(added.change, MemberChange::Added);
    assert_eq!(added.chat_id, "oc_a0553eda9014c201e6969b478895c230");
    assert_eq!(
        added.users[0].user_id.open_id.as_deref(),
        Some("ou_84aad35d084aa403a838cf73ee18467")
    );
    let deleted = decoded(&ADDED.replace("user.added_v1", "user.deleted_v1"));
    let deleted = ChatMembersChanged::from_event(&deleted).expect("a member change");
    assert_eq!(deleted.change, MemberChange::Removed);
}

#[test]
fn another_family_is_a_clear_error_not_a_guess() {
    let message = decoded(MESSAGE);
    let error = CardAction::from_event(&message).expect_err("not a card");
    assert!(
        error.to_string().contains("is not a Feishu card action"),
        "{error}"
    );
    // The right type but not the family's fields.
    let broken = decoded(&MESSAGE.replace("\"message_id\"", "\"message_ix\""));
    let error = MessageReceived::from_event(&broken).expect_err("no message id");
    assert!(error.to_string().contains("message_id"), "{error}");
    // A WeCom event of the same name is not a Feishu message.
    let mut wecom = message.clone();
    wecom.platform = "wecom".into();
    assert!(MessageReceived::from_event(&wecom).is_err());
}

/// The documented group message with its mentions replaced by `mentions` (JSON) and its chat
/// type by `chat_type`.
fn message_with(chat_type: &str, mentions: &str) -> Event {
    let document = MESSAGE
        .replace(r#""chat_type":"group""#, &format!(r#""chat_type":"{chat_type}""#))
        .replace(
            r#""mentions":[{"key":"@_user_1","id":{"union_id":"on_8ed6aa67826108097d9ee143816345","user_id":"e33ggbyz","open_id":"ou_84aad35d084aa403a838cf73ee18467"},"name":"Tom","tenant_key":"736588c9260f175e"}]"#,
            &format!(r#""mentions":{mentions}"#),
        );
    assert!(document.contains(&format!(r#""mentions":{mentions}"#)));
    decoded(&document)
}

#[test]
fn a_message_addresses_the_bot_when_a_mention_names_it_or_it_is_direct() {
    const BOT: &str = "ou_bot00000000000000000000000001";
    // The documented message mentions Tom, a person.
    let tom = decoded(MESSAGE);
    assert!(!oncegate_feishu::events::addresses_bot(&tom, Some(BOT)));
    assert!(oncegate_feishu::events::addresses_bot(
        &tom,
        Some("ou_84aad35d084aa403a838cf73ee18467")
    ));
    // The bot's id unknown: any mention counts (such a bot gets only messages mentioning it).
    assert!(oncegate_feishu::events::addresses_bot(&tom, None));
    // A mention of the bot, as bots have no user_id: with it left out, and given empty.
    for id in [
        format!(r#"{{"open_id":"{BOT}","union_id":"on_b1"}}"#),
        format!(r#"{{"open_id":"{BOT}","union_id":"on_b1","user_id":""}}"#),
    ] {
        let mentions = format!(
            r#"[{{"key":"@_user_1","id":{id},"name":"Bot","tenant_key":"736588c9260f175e"}}]"#
        );
        let event = message_with("group", &mentions);
        assert!(
            oncegate_feishu::events::addresses_bot(&event, Some(BOT)),
            "{id}"
        );
    }
    // A group message mentioning no one addresses nobody; a direct one addresses the bot.
    let plain = message_with("group", "[]");
    assert!(!oncegate_feishu::events::addresses_bot(&plain, None));
    assert!(!oncegate_feishu::events::addresses_bot(&plain, Some(BOT)));
    let direct = message_with("p2p", "[]");
    assert!(oncegate_feishu::events::addresses_bot(&direct, Some(BOT)));
    // Other events are never messages to the bot.
    assert!(!oncegate_feishu::events::addresses_bot(
        &decoded(CARD),
        None
    ));
    assert!(!oncegate_feishu::events::addresses_bot(
        &decoded(ADDED),
        None
    ));
}
