//! Typed Feishu/Lark events: the families handlers meet most, read from the schema 2.0
//! document oncegate stores (`{"schema":"2.0","header":{…},"event":{…}}`). Fields Feishu may
//! leave out are `Option`s or empty; everything else stays in the raw payload.

use oncegate_core::{Event, FromEvent, ShapeError};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// A user's ids, as Feishu gives them (each may be missing, depending on the app's scopes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct UserId {
    /// `ou_…`, per app.
    #[serde(default)]
    pub open_id: Option<String>,
    /// `on_…`, per developer.
    #[serde(default)]
    pub union_id: Option<String>,
    /// The tenant's own user id (needs its scope).
    #[serde(default)]
    pub user_id: Option<String>,
}

#[derive(Deserialize)]
struct Document<T> {
    event: T,
}

fn read<T: DeserializeOwned>(family: &'static str, event: &Event) -> Result<T, ShapeError> {
    if !matches!(&*event.platform, "feishu" | "lark") {
        return Err(ShapeError::new(family, event, "not a Feishu/Lark event"));
    }
    serde_json::from_slice::<Document<T>>(&event.payload)
        .map(|document| document.event)
        .map_err(|error| ShapeError::new(family, event, error))
}

fn of_type(family: &'static str, event: &Event, types: &[&str]) -> Result<(), ShapeError> {
    if types.contains(&&*event.event_type) {
        Ok(())
    } else {
        Err(ShapeError::new(family, event, "another event type"))
    }
}

/// `im.message.receive_v1`: a message to the bot (in a 1:1 chat, or a group where it may read).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MessageReceived {
    /// Who sent it.
    pub sender: Sender,
    /// The message.
    pub message: Message,
}

/// The sender of a message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Sender {
    /// The sender's ids.
    #[serde(default)]
    pub sender_id: UserId,
    /// `user` (the only kind Feishu sends today).
    #[serde(default)]
    pub sender_type: String,
    /// The sender's tenant.
    #[serde(default)]
    pub tenant_key: Option<String>,
}

/// A received message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Message {
    /// `om_…`: the id to reply to (and Feishu's own dedup key for messages).
    pub message_id: String,
    /// The chat, `oc_…`.
    pub chat_id: String,
    /// `p2p` or `group`.
    pub chat_type: String,
    /// `text`, `post`, `image`, `interactive`, …
    pub message_type: String,
    /// The content, a JSON document of its own (`{"text":"…"}` for text).
    pub content: String,
    /// The thread's root message, for replies in a thread.
    #[serde(default)]
    pub root_id: Option<String>,
    /// The message replied to.
    #[serde(default)]
    pub parent_id: Option<String>,
    /// When it was sent, unix ms as text.
    #[serde(default)]
    pub create_time: Option<String>,
    /// Who it mentions (`@_user_1` in the content names the first).
    #[serde(default)]
    pub mentions: Vec<Mention>,
}

/// A mention in a message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Mention {
    /// The placeholder in the content, `@_user_1`.
    pub key: String,
    /// Who.
    #[serde(default)]
    pub id: UserId,
    /// Their name.
    #[serde(default)]
    pub name: String,
}

impl MessageReceived {
    /// Whether a person addressed it to the bot whose `open_id` is `bot_open_id`: a direct
    /// (`p2p`) message, or a group message one of whose mentions names the bot — any mention
    /// when the bot's id is not known (a bot that may not read every group message gets only
    /// those that @-mention it).
    pub fn addresses_bot(&self, bot_open_id: Option<&str>) -> bool {
        if self.message.chat_type == "p2p" {
            return true;
        }
        match bot_open_id {
            Some(bot) => self
                .message
                .mentions
                .iter()
                .any(|mention| mention.id.open_id.as_deref() == Some(bot)),
            None => !self.message.mentions.is_empty(),
        }
    }
}

/// Whether `event` is a message a person addressed to the bot ([`MessageReceived::addresses_bot`]);
/// `false` for every other event, and for a message that does not read. A store asks it of
/// every event it queues, so it reads only the fields it needs, borrowed (a quarter of the
/// typed read's cost), and a message that names neither a mention nor `p2p` not at all.
pub fn addresses_bot(event: &Event, bot_open_id: Option<&str>) -> bool {
    use std::borrow::Cow;

    #[derive(Deserialize)]
    struct Document<'a> {
        #[serde(borrow)]
        event: Body<'a>,
    }
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        message: Addressed<'a>,
    }
    #[derive(Deserialize)]
    struct Addressed<'a> {
        #[serde(borrow)]
        chat_type: Cow<'a, str>,
        #[serde(default, borrow)]
        mentions: Vec<Mentioned<'a>>,
    }
    #[derive(Deserialize)]
    struct Mentioned<'a> {
        #[serde(default, borrow)]
        id: Ids<'a>,
    }
    #[derive(Deserialize, Default)]
    struct Ids<'a> {
        #[serde(default, borrow)]
        open_id: Option<Cow<'a, str>>,
    }
    if !matches!(&*event.platform, "feishu" | "lark")
        || !MessageReceived::EVENT_TYPES.contains(&&*event.event_type)
    {
        return false;
    }
    let has = |needle: &[u8]| memchr::memmem::find(&event.payload, needle).is_some();
    if !has(b"\"mentions\"") && !has(b"p2p") {
        return false;
    }
    let Ok(document) = serde_json::from_slice::<Document<'_>>(&event.payload) else {
        return false;
    };
    let message = document.event.message;
    if message.chat_type == "p2p" {
        return true;
    }
    match bot_open_id {
        Some(bot) => message
            .mentions
            .iter()
            .any(|mention| mention.id.open_id.as_deref() == Some(bot)),
        None => !message.mentions.is_empty(),
    }
}

impl Message {
    /// The text of a `text` message (`content`'s `text`), mentions as their placeholders.
    pub fn text(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct Text {
            text: String,
        }
        if self.message_type != "text" {
            return None;
        }
        serde_json::from_str::<Text>(&self.content)
            .ok()
            .map(|content| content.text)
    }
}

impl FromEvent for MessageReceived {
    const EVENT_TYPES: &'static [&'static str] = &["im.message.receive_v1"];

    fn from_event(event: &Event) -> Result<Self, ShapeError> {
        of_type("Feishu message", event, Self::EVENT_TYPES)?;
        read("Feishu message", event)
    }
}

/// `card.action.trigger`: a user clicked or submitted a card (answered synchronously: the
/// handler's result is the callback's answer).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CardAction {
    /// Who acted.
    pub operator: UserId,
    /// The token that updates the card (valid 30 min, at most twice).
    #[serde(default)]
    pub token: Option<String>,
    /// What was acted on.
    pub action: Action,
    /// Where the card is.
    #[serde(default)]
    pub context: CardContext,
}

/// A card's action.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Action {
    /// The value the card gave the component.
    #[serde(default)]
    pub value: serde_json::Value,
    /// `button`, `select_static`, `form`, …
    #[serde(default)]
    pub tag: String,
    /// The component's name.
    #[serde(default)]
    pub name: Option<String>,
    /// A form's values.
    #[serde(default)]
    pub form_value: Option<serde_json::Value>,
    /// An input's value.
    #[serde(default)]
    pub input_value: Option<String>,
    /// A selected option.
    #[serde(default)]
    pub option: Option<String>,
}

/// Where a card is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct CardContext {
    /// The message that carries the card.
    #[serde(default)]
    pub open_message_id: Option<String>,
    /// Its chat.
    #[serde(default)]
    pub open_chat_id: Option<String>,
}

impl FromEvent for CardAction {
    const EVENT_TYPES: &'static [&'static str] = &["card.action.trigger"];

    fn from_event(event: &Event) -> Result<Self, ShapeError> {
        of_type("Feishu card action", event, Self::EVENT_TYPES)?;
        read("Feishu card action", event)
    }
}

/// `im.chat.member.user.added_v1`, `…deleted_v1` and `…withdrawn_v1`: users joined or left a
/// chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMembersChanged {
    /// Added, or deleted / withdrawn.
    pub change: MemberChange,
    /// The chat, `oc_…`.
    pub chat_id: String,
    /// Who made the change.
    pub operator_id: UserId,
    /// The users added or removed.
    pub users: Vec<ChatUser>,
}

/// Which way a chat's members changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberChange {
    /// Users joined (`added_v1`).
    Added,
    /// Users were removed (`deleted_v1`) or left by withdrawing an invitation (`withdrawn_v1`).
    Removed,
}

/// A user in a member change.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChatUser {
    /// Their name.
    #[serde(default)]
    pub name: String,
    /// Their ids.
    #[serde(default)]
    pub user_id: UserId,
}

#[derive(Deserialize)]
struct MembersBody {
    chat_id: String,
    #[serde(default)]
    operator_id: UserId,
    #[serde(default)]
    users: Vec<ChatUser>,
}

impl FromEvent for ChatMembersChanged {
    const EVENT_TYPES: &'static [&'static str] = &[
        "im.chat.member.user.added_v1",
        "im.chat.member.user.deleted_v1",
        "im.chat.member.user.withdrawn_v1",
    ];

    fn from_event(event: &Event) -> Result<Self, ShapeError> {
        const FAMILY: &str = "Feishu chat member change";
        of_type(FAMILY, event, Self::EVENT_TYPES)?;
        let body: MembersBody = read(FAMILY, event)?;
        Ok(Self {
            change: if &*event.event_type == "im.chat.member.user.added_v1" {
                MemberChange::Added
            } else {
                MemberChange::Removed
            },
            chat_id: body.chat_id,
            operator_id: body.operator_id,
            users: body.users,
        })
    }
}
