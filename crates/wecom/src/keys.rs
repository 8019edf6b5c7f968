//! A decrypted callback as oncegate's normalized event: its type, order key, creation time and
//! the dedup keys that never collide and never split.
//!
//! **The key of every event family is all of its fields.** The primary key hashes every leaf
//! field of the decrypted document (path and text, sorted, each length-prefixed), so two
//! callbacks share a key only when they are the same document: a platform retry (the same
//! plaintext, encrypted again) is a duplicate, and no two distinct events can collide, whatever
//! family they belong to — including the ones the SDKs' hand-picked keys merged: many users'
//! voice messages in one second, batch approvals (`ApprovalInfo/SpNo`), several contacts added in
//! one second (`ExternalUserID`), an add and a delete of one chat member in one second
//! (`UpdateDetail`, `MemChangeList/Item`, `CurMemVer`). Messages also get a secondary key from
//! `MsgId` (or `MsgID`) with the sender, so a message resent with a changed envelope field is
//! still one message (off with `dedup.message_id = false`).

use bytes::Bytes;
use oncegate_core::{Event, KeyHash, Keys};

use crate::xml::Fields;

/// What a source knows about the app a callback was for.
pub(crate) struct Origin<'a> {
    /// `wecom` or `wechat`.
    pub(crate) platform: &'a str,
    /// The corp id or the Official Account's app id.
    pub(crate) app: &'a str,
    /// How the document names its fields.
    pub(crate) names: &'static Names,
}

/// Where a document keeps what the normalized event needs: the XML callbacks and WeCom's JSON
/// AI-bot callbacks name the same things differently.
pub(crate) struct Names {
    /// The message id, first match wins.
    message_id: &'static [&'static str],
    /// The sender.
    from: &'static str,
    /// `text`, `event`, …
    kind: &'static str,
    /// The event's name, for kind `event`.
    event: &'static str,
    /// The event's change type, if the dialect has one.
    change: Option<&'static str>,
    /// A third-party suite push's type, if the dialect has them.
    info: Option<&'static str>,
    /// The order key, first match wins (the sender comes last, unless it is `sys`).
    order: &'static [&'static str],
    /// The creation time, unix seconds, first match wins.
    created: &'static [&'static str],
    /// The app within the corp (agent or bot).
    tenant: &'static str,
    /// Whether the order key is the app's within the corp: one corp's agents each talk with
    /// the same users, and agent A's later message must not make agent B's earlier one stale
    /// (corp:agent:chat, the corp being the event's app).
    order_within_tenant: bool,
}

/// The platforms' XML.
pub(crate) const XML: Names = Names {
    message_id: &["MsgId", "MsgID"],
    from: "FromUserName",
    kind: "MsgType",
    event: "Event",
    change: Some("ChangeType"),
    info: Some("InfoType"),
    order: &["ChatId", "ExternalUserID"],
    created: &["CreateTime", "TimeStamp"],
    tenant: "AgentID",
    order_within_tenant: true,
};

/// A third-party suite's own pushes (`InfoType`: tickets, authorisations): they name no
/// message, sender or agent; the corp they concern is `AuthCorpId` (absent from tickets and
/// `create_auth`), which orders one corp's authorisation changes.
pub(crate) const SUITE: Names = Names {
    message_id: &[],
    from: "FromUserName",
    kind: "MsgType",
    event: "Event",
    change: None,
    info: Some("InfoType"),
    order: &["AuthCorpId"],
    created: &["TimeStamp", "CreateTime"],
    tenant: "AuthCorpId",
    order_within_tenant: false,
};

/// WeCom's AI-bot JSON.
pub(crate) const JSON: Names = Names {
    message_id: &["msgid"],
    from: "from/userid",
    kind: "msgtype",
    event: "event/eventtype",
    change: None,
    info: None,
    order: &["chatid"],
    created: &["create_time"],
    tenant: "aibotid",
    // The bot is the app already.
    order_within_tenant: false,
};

impl Names {
    fn first<'f>(&self, fields: &'f Fields, names: &[&str]) -> Option<&'f str> {
        names.iter().find_map(|name| fields.text(name))
    }

    /// The app within the corp that a document names (`AgentID`, `aibotid`).
    pub(crate) fn tenant<'f>(&self, fields: &'f Fields) -> Option<&'f str> {
        fields.text(self.tenant)
    }
}

/// The primary key: every field of the document.
pub(crate) fn fields_key(origin: &Origin<'_>, fields: &Fields) -> KeyHash {
    let mut pairs: Vec<&(String, String)> = fields.pairs().iter().collect();
    pairs.sort_unstable();
    let mut parts: Vec<&str> = Vec::with_capacity(3 + 2 * pairs.len());
    parts.extend([origin.platform, origin.app, "fields"]);
    for (path, text) in pairs {
        parts.push(path);
        parts.push(text.trim());
    }
    KeyHash::of(&parts)
}

/// The event type routes match: `message.<MsgType>`, `event.<Event>[.<ChangeType>]`, or
/// `suite.<InfoType>` for third-party suite pushes.
fn event_type(names: &Names, fields: &Fields) -> String {
    let info = names.info.and_then(|info| fields.text(info));
    match (fields.text(names.kind), info) {
        (Some(kind), _) if kind.eq_ignore_ascii_case("event") => {
            let event = fields.text(names.event).unwrap_or("unknown");
            match names.change.and_then(|change| fields.text(change)) {
                Some(change) => format!("event.{event}.{change}"),
                None => format!("event.{event}"),
            }
        }
        (Some(kind), _) => format!("message.{kind}"),
        (None, Some(info)) => format!("suite.{info}"),
        (None, None) => "unknown".to_owned(),
    }
}

/// The order key: the external group, else the external contact, else the user (not `sys`,
/// which every system event has) — within the agent that names it, where the dialect scopes
/// conversations by agent.
fn order_key(names: &Names, fields: &Fields) -> Option<String> {
    let chat = names
        .first(fields, names.order)
        .or_else(|| fields.text(names.from).filter(|from| *from != "sys"))?;
    match names.tenant(fields).filter(|_| names.order_within_tenant) {
        Some(agent) => Some(format!("{agent}:{chat}")),
        None => Some(chat.to_owned()),
    }
}

/// The normalized event and its keys, from a decrypted document's fields and bytes.
pub(crate) fn normalize(origin: &Origin<'_>, fields: &Fields, document: Bytes) -> (Event, Keys) {
    let names = origin.names;
    let primary = fields_key(origin, fields);
    let mut keys = Keys::new(primary);
    let id = names.first(fields, names.message_id);
    if let Some(id) = id {
        let from = fields.text(names.from).unwrap_or_default();
        keys = keys.with(oncegate_core::sender_key(
            origin.platform,
            origin.app,
            "msg_id",
            id,
            from,
        ));
    }
    let created_secs = names
        .first(fields, names.created)
        .and_then(|secs| secs.parse::<u64>().ok())
        .unwrap_or(0);
    let event = Event {
        platform: origin.platform.into(),
        app: origin.app.into(),
        tenant: names.tenant(fields).map(Into::into),
        event_id: id.map_or_else(|| primary.to_string().into(), std::sync::Arc::from),
        event_type: event_type(names, fields).into(),
        created_at_ms: created_secs.saturating_mul(1000),
        order_key: order_key(names, fields).map(std::sync::Arc::from),
        payload: document,
    };
    (event, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: Origin<'static> = Origin {
        platform: "wecom",
        app: "ww_corp",
        names: &XML,
    };

    fn keys_of(xml: &str) -> Keys {
        let fields = Fields::parse(xml.as_bytes()).expect("xml");
        normalize(&ORIGIN, &fields, Bytes::from(xml.to_owned())).1
    }

    fn event_of(xml: &str) -> Event {
        let fields = Fields::parse(xml.as_bytes()).expect("xml");
        normalize(&ORIGIN, &fields, Bytes::from(xml.to_owned())).0
    }

    /// The primary keys of `documents` are pairwise different.
    #[track_caller]
    fn all_distinct(documents: &[String]) {
        let keys: std::collections::HashSet<KeyHash> =
            documents.iter().map(|doc| keys_of(doc).primary()).collect();
        assert_eq!(
            keys.len(),
            documents.len(),
            "two distinct events share a key"
        );
    }

    #[test]
    fn a_retry_is_the_same_key_whatever_the_field_order_and_spacing() {
        let first = "<xml><ToUserName><![CDATA[ww_corp]]></ToUserName><FromUserName>sys</FromUserName><CreateTime>1700642907</CreateTime><MsgType>event</MsgType><Event>change_external_chat</Event><ChatId>wr1</ChatId><ChangeType>update</ChangeType><UpdateDetail>add_member</UpdateDetail></xml>";
        let again = "<xml>\n  <CreateTime>1700642907</CreateTime>\n  <ToUserName>ww_corp</ToUserName>\n  <MsgType><![CDATA[event]]></MsgType><FromUserName><![CDATA[sys]]></FromUserName><ChangeType>update</ChangeType><Event>change_external_chat</Event><UpdateDetail>add_member</UpdateDetail><ChatId>wr1</ChatId>\n</xml>";
        assert_eq!(keys_of(first), keys_of(again));
        let event = event_of(first);
        assert_eq!(&*event.event_type, "event.change_external_chat.update");
        assert_eq!(event.order_key.as_deref(), Some("wr1"));
        assert_eq!(event.created_at_ms, 1_700_642_907_000);
    }

    #[test]
    fn many_voice_messages_in_one_second_never_collide() {
        // The seeds' bot: many users send voice in the same second; MP voice MsgIds have been
        // seen to repeat across users.
        let voices: Vec<String> = (0..50)
            .map(|user| format!("<xml><ToUserName>ww_corp</ToUserName><FromUserName>user{user}</FromUserName><CreateTime>1700000000</CreateTime><MsgType>voice</MsgType><MediaId>m{user}</MediaId><Format>amr</Format><MsgId>7000000000000000001</MsgId><AgentID>1000002</AgentID></xml>"))
            .collect();
        all_distinct(&voices);
        let secondaries: std::collections::HashSet<KeyHash> = voices
            .iter()
            .map(|doc| keys_of(doc).as_slice()[1])
            .collect();
        assert_eq!(
            secondaries.len(),
            voices.len(),
            "the message key names the sender"
        );
    }

    #[test]
    fn batch_approvals_in_one_second_never_collide() {
        let approvals: Vec<String> = (0..20)
            .map(|n| format!("<xml><ToUserName>ww_corp</ToUserName><FromUserName>sys</FromUserName><CreateTime>1700000000</CreateTime><MsgType>event</MsgType><Event>sys_approval_change</Event><AgentID>3010040</AgentID><ApprovalInfo><SpNo>2023010100{n:02}</SpNo><SpName>leave</SpName><SpStatus>2</SpStatus></ApprovalInfo></xml>"))
            .collect();
        all_distinct(&approvals);
    }

    #[test]
    fn several_contacts_added_in_one_second_never_collide() {
        let adds: Vec<String> = (0..20)
            .map(|n| format!("<xml><ToUserName>ww_corp</ToUserName><FromUserName>sys</FromUserName><CreateTime>1403610513</CreateTime><MsgType>event</MsgType><Event>change_external_contact</Event><ChangeType>add_external_contact</ChangeType><UserID>zhangsan</UserID><ExternalUserID>wmEXT{n}</ExternalUserID><State>qr</State><WelcomeCode>W{n}</WelcomeCode></xml>"))
            .collect();
        all_distinct(&adds);
        assert_eq!(event_of(&adds[0]).order_key.as_deref(), Some("wmEXT0"));
    }

    #[test]
    fn an_add_and_a_delete_of_one_member_in_one_second_both_count() {
        let change = |detail: &str, from: &str, to: &str| {
            format!(
                "<xml><ToUserName>ww_corp</ToUserName><FromUserName>sys</FromUserName><CreateTime>1700642907</CreateTime><MsgType>event</MsgType><Event>change_external_chat</Event><ChatId>wr1</ChatId><ChangeType>update</ChangeType><UpdateDetail>{detail}</UpdateDetail><JoinScene>0</JoinScene><MemChangeCnt>1</MemChangeCnt><MemChangeList><Item>wmA</Item></MemChangeList><LastMemVer>{from}</LastMemVer><CurMemVer>{to}</CurMemVer></xml>"
            )
        };
        all_distinct(&[
            change("add_member", "v1", "v2"),
            change("del_member", "v2", "v3"),
        ]);
        // Even without versions (before late 2023), the update detail tells them apart.
        let bare = |detail: &str| {
            format!(
                "<xml><ToUserName>ww_corp</ToUserName><FromUserName>sys</FromUserName><CreateTime>1700642907</CreateTime><MsgType>event</MsgType><Event>change_external_chat</Event><ChatId>wr1</ChatId><ChangeType>update</ChangeType><UpdateDetail>{detail}</UpdateDetail></xml>"
            )
        };
        all_distinct(&[bare("add_member"), bare("del_member")]);
    }

    #[test]
    fn tenants_never_share_keys() {
        let doc = "<xml><ToUserName>x</ToUserName><FromUserName>u</FromUserName><CreateTime>1</CreateTime><MsgType>text</MsgType><Content>hi</Content><MsgId>1</MsgId></xml>";
        let fields = Fields::parse(doc.as_bytes()).expect("xml");
        let ours = normalize(&ORIGIN, &fields, Bytes::new()).1;
        let theirs = normalize(
            &Origin {
                platform: "wecom",
                app: "ww_other",
                names: &XML,
            },
            &fields,
            Bytes::new(),
        )
        .1;
        for (a, b) in ours.as_slice().iter().zip(theirs.as_slice()) {
            assert_ne!(a, b);
        }
    }

    #[test]
    fn types_ids_and_order_keys() {
        let text = event_of(
            "<xml><FromUserName>zhangsan</FromUserName><CreateTime>5</CreateTime><MsgType>text</MsgType><MsgId>42</MsgId><AgentID>7</AgentID></xml>",
        );
        assert_eq!(&*text.event_type, "message.text");
        assert_eq!(&*text.event_id, "42");
        assert_eq!(text.tenant.as_deref(), Some("7"));
        assert_eq!(
            text.order_key.as_deref(),
            Some("7:zhangsan"),
            "a user's conversation with agent 7, not with every agent of the corp"
        );
        let other_agent = event_of(
            "<xml><FromUserName>zhangsan</FromUserName><CreateTime>4</CreateTime><MsgType>text</MsgType><MsgId>41</MsgId><AgentID>8</AgentID></xml>",
        );
        assert_eq!(other_agent.order_key.as_deref(), Some("8:zhangsan"));
        let job = event_of(
            "<xml><FromUserName>sys</FromUserName><CreateTime>5</CreateTime><MsgType>event</MsgType><Event>MASSSENDJOBFINISH</Event><MsgID>1000001625</MsgID></xml>",
        );
        assert_eq!(
            &*job.event_id, "1000001625",
            "MsgID counts as the message id"
        );
        assert_eq!(job.order_key, None, "sys is nobody's conversation");
        let suite = event_of(
            "<xml><SuiteId>ww_suite</SuiteId><InfoType>suite_ticket</InfoType><TimeStamp>1403610513</TimeStamp><SuiteTicket>t</SuiteTicket></xml>",
        );
        assert_eq!(&*suite.event_type, "suite.suite_ticket");
        assert_eq!(suite.created_at_ms, 1_403_610_513_000);
        assert_eq!(suite.event_id.len(), 32, "no id: the fields key names it");
    }

    #[test]
    fn ai_bot_json_messages_and_events() {
        let origin = Origin {
            names: &JSON,
            ..ORIGIN
        };
        let doc = br#"{"msgid":"CAIQ1","aibotid":"AIBOT1","chatid":"wrGroup","chattype":"group","from":{"userid":"zhangsan"},"msgtype":"text","text":{"content":"@bot hi"}}"#;
        let fields = Fields::from_json(doc).expect("json");
        let (event, keys) = normalize(&origin, &fields, Bytes::from_static(doc));
        assert_eq!(&*event.event_type, "message.text");
        assert_eq!(&*event.event_id, "CAIQ1");
        assert_eq!(event.order_key.as_deref(), Some("wrGroup"));
        assert_eq!(event.tenant.as_deref(), Some("AIBOT1"));
        assert_eq!(keys.as_slice().len(), 2);
        let enter = br#"{"msgid":"CAIQ2","aibotid":"AIBOT1","chattype":"single","from":{"userid":"lisi"},"msgtype":"event","event":{"eventtype":"enter_chat"}}"#;
        let fields = Fields::from_json(enter).expect("json");
        let (event, _) = normalize(&origin, &fields, Bytes::from_static(enter));
        assert_eq!(&*event.event_type, "event.enter_chat");
        assert_eq!(
            event.order_key.as_deref(),
            Some("lisi"),
            "a single chat is its user's"
        );
    }
}
