//! Typed WeCom and WeChat events: text messages (the XML of apps and Official Accounts, the
//! JSON of WeCom's AI bots), callback events, and external-chat changes — read with the same
//! bounded reader that keyed them ([`Fields`]). Everything else stays in the raw payload.

use oncegate_core::{Event, FromEvent, ShapeError};

use crate::xml::Fields;

fn fields(family: &'static str, event: &Event) -> Result<Fields, ShapeError> {
    if !matches!(&*event.platform, "wecom" | "wechat") {
        return Err(ShapeError::new(
            family,
            event,
            "not a WeCom or WeChat event",
        ));
    }
    let payload = event.payload.trim_ascii_start();
    let read = if payload.starts_with(b"{") {
        Fields::from_json(payload)
    } else {
        Fields::parse(payload)
    };
    read.map_err(|error| ShapeError::new(family, event, error))
}

fn required(
    family: &'static str,
    event: &Event,
    fields: &Fields,
    paths: &[&str],
) -> Result<String, ShapeError> {
    paths
        .iter()
        .find_map(|path| fields.text(path))
        .map(str::to_owned)
        .ok_or_else(|| ShapeError::new(family, event, format!("no {}", paths.join(" or "))))
}

fn optional(fields: &Fields, paths: &[&str]) -> Option<String> {
    paths
        .iter()
        .find_map(|path| fields.text(path))
        .map(str::to_owned)
}

fn of_type(family: &'static str, event: &Event, prefix: &str) -> Result<(), ShapeError> {
    if event.event_type.starts_with(prefix) {
        Ok(())
    } else {
        Err(ShapeError::new(family, event, "another event type"))
    }
}

/// Whether `event` is a message a person addressed to the bot: every message (`message.*`)
/// is — a WeCom app and a WeChat account only receive the messages sent to them, and a WeCom
/// AI bot receives a group message only when it is @-mentioned (its 1:1 messages are direct).
/// Callback events (`event.*`: contact changes, entering a chat…) are not.
pub fn addresses_bot(event: &Event) -> bool {
    matches!(&*event.platform, "wecom" | "wechat") && event.event_type.starts_with("message.")
}

/// `message.text`: a text message to an app, an Official Account or an AI bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text {
    /// The sender (`FromUserName`; an AI bot's `from/userid`).
    pub from: String,
    /// The receiver (`ToUserName`: the corp id, or the account's `gh_…`); an AI bot's
    /// callbacks name none.
    pub to: Option<String>,
    /// The text.
    pub content: String,
    /// The message id (`MsgId`, `msgid`).
    pub msg_id: Option<String>,
    /// The group chat of an AI bot's message (`chatid`), if it came from one.
    pub chat_id: Option<String>,
    /// The app within the corp (`AgentID`), or the AI bot (`aibotid`).
    pub agent_id: Option<String>,
    /// When it was sent, unix seconds.
    pub create_time: Option<u64>,
}

impl FromEvent for Text {
    const EVENT_TYPES: &'static [&'static str] = &["message.text"];

    fn from_event(event: &Event) -> Result<Self, ShapeError> {
        const FAMILY: &str = "WeCom/WeChat text message";
        if &*event.event_type != "message.text" {
            return Err(ShapeError::new(FAMILY, event, "another event type"));
        }
        let fields = fields(FAMILY, event)?;
        Ok(Self {
            from: required(FAMILY, event, &fields, &["FromUserName", "from/userid"])?,
            to: optional(&fields, &["ToUserName"]),
            content: required(FAMILY, event, &fields, &["Content", "text/content"])?,
            msg_id: optional(&fields, &["MsgId", "MsgID", "msgid"]),
            chat_id: optional(&fields, &["chatid"]),
            agent_id: optional(&fields, &["AgentID", "aibotid"]),
            create_time: optional(&fields, &["CreateTime", "create_time"])
                .and_then(|secs| secs.parse().ok()),
        })
    }
}

/// `event.*`: any callback event (a subscription, a menu click, a contact change…), with its
/// name, its change type where it has one, and every field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackEvent {
    /// `Event` (`subscribe`, `click`, `change_external_contact`, …).
    pub event: String,
    /// `ChangeType`, for events that have one.
    pub change_type: Option<String>,
    /// `FromUserName` (`sys` for system events).
    pub from: Option<String>,
    /// Every leaf field, path and text, in document order.
    pub fields: Vec<(String, String)>,
}

impl CallbackEvent {
    /// The first field at `path` (`ExternalUserID`, `ApprovalInfo/SpNo`), trimmed, if not
    /// empty.
    pub fn field(&self, path: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(at, _)| at == path)
            .map(|(_, text)| text.trim())
            .filter(|text| !text.is_empty())
    }
}

impl FromEvent for CallbackEvent {
    const EVENT_TYPES: &'static [&'static str] = &["event.*"];

    fn from_event(event: &Event) -> Result<Self, ShapeError> {
        const FAMILY: &str = "WeCom/WeChat callback event";
        of_type(FAMILY, event, "event.")?;
        let fields = fields(FAMILY, event)?;
        Ok(Self {
            event: required(FAMILY, event, &fields, &["Event", "event/eventtype"])?,
            change_type: optional(&fields, &["ChangeType"]),
            from: optional(&fields, &["FromUserName", "from/userid"]),
            fields: fields.pairs().to_vec(),
        })
    }
}

/// `event.change_external_chat.*`: a customer group was created, changed or dismissed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalChatChange {
    /// The group, `ChatId`.
    pub chat_id: String,
    /// `create`, `update` or `dismiss`.
    pub change_type: String,
    /// For updates: `add_member`, `del_member`, `change_owner`, `change_name`, `change_notice`.
    pub update_detail: Option<String>,
    /// How members joined (`JoinScene`), for `add_member`.
    pub join_scene: Option<u32>,
    /// How members left (`QuitScene`), for `del_member`.
    pub quit_scene: Option<u32>,
    /// The members who joined or left (`MemChangeList/Item`).
    pub members: Vec<String>,
    /// The member list's version before and after (`LastMemVer`, `CurMemVer`).
    pub last_mem_ver: Option<String>,
    /// See `last_mem_ver`.
    pub cur_mem_ver: Option<String>,
    /// When, unix seconds.
    pub create_time: Option<u64>,
}

impl FromEvent for ExternalChatChange {
    const EVENT_TYPES: &'static [&'static str] = &["event.change_external_chat*"];

    fn from_event(event: &Event) -> Result<Self, ShapeError> {
        const FAMILY: &str = "WeCom external chat change";
        of_type(FAMILY, event, "event.change_external_chat")?;
        let fields = fields(FAMILY, event)?;
        let number = |path: &str| fields.text(path).and_then(|text| text.parse::<u32>().ok());
        Ok(Self {
            chat_id: required(FAMILY, event, &fields, &["ChatId"])?,
            change_type: required(FAMILY, event, &fields, &["ChangeType"])?,
            update_detail: optional(&fields, &["UpdateDetail"]),
            join_scene: number("JoinScene"),
            quit_scene: number("QuitScene"),
            members: fields
                .pairs()
                .iter()
                .filter(|(path, text)| path == "MemChangeList/Item" && !text.trim().is_empty())
                .map(|(_, text)| text.trim().to_owned())
                .collect(),
            last_mem_ver: optional(&fields, &["LastMemVer"]),
            cur_mem_ver: optional(&fields, &["CurMemVer"]),
            create_time: fields.text("CreateTime").and_then(|text| text.parse().ok()),
        })
    }
}
