//! The long connection's JSON frames: `{"cmd", "headers": {"req_id"}, "body"}` from either side,
//! and WeCom's answers to our commands, `{"headers": {"req_id"}, "errcode", "errmsg"}`.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Subscribes the connection to a bot's callbacks (the first frame).
pub const SUBSCRIBE: &str = "aibot_subscribe";
/// The heartbeat, every 30 s.
pub const PING: &str = "ping";
/// A user's message.
pub const MESSAGE: &str = "aibot_msg_callback";
/// An event (entering a chat, a card click, feedback, a takeover).
pub const EVENT: &str = "aibot_event_callback";
/// A reply to a callback, naming its `req_id`.
pub const RESPOND: &str = "aibot_respond_msg";
/// The welcome message, answering `enter_chat` within 5 s.
pub const RESPOND_WELCOME: &str = "aibot_respond_welcome_msg";
/// A template card's update, answering `template_card_event` within 5 s.
pub const RESPOND_UPDATE: &str = "aibot_respond_update_msg";
/// The event type WeCom sends to a connection another subscribe has taken over.
pub const DISCONNECTED: &str = "disconnected_event";
/// "aibot websocket not subscribed": the socket lives, the subscription does not.
pub const NOT_SUBSCRIBED: i64 = 846_609;

/// The frame headers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    /// Names a callback (a reply echoes it) or a command of ours (its answer echoes it).
    #[serde(default)]
    pub req_id: String,
}

/// One frame as read: a callback or command (`cmd` set) or an answer (`errcode` set).
#[derive(Debug, Deserialize)]
pub struct Incoming {
    /// The command; absent in answers.
    #[serde(default)]
    pub cmd: Option<String>,
    /// The headers.
    #[serde(default)]
    pub headers: Headers,
    /// The body, kept as its bytes.
    #[serde(default)]
    pub body: Option<Box<RawValue>>,
    /// An answer's code, 0 for success.
    #[serde(default)]
    pub errcode: Option<i64>,
    /// An answer's message.
    #[serde(default)]
    pub errmsg: Option<String>,
}

/// Why a frame cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Not the JSON of a frame.
    #[error("not a frame: {0}")]
    NotJson(String),
    /// A callback without a body.
    #[error("a {0} frame without a body")]
    NoBody(String),
}

impl FrameError {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            FrameError::NotJson(_) => "not_json",
            FrameError::NoBody(_) => "no_body",
        }
    }
}

impl Incoming {
    /// Reads one text message.
    pub fn parse(text: &str) -> Result<Self, FrameError> {
        serde_json::from_str(text).map_err(|error| FrameError::NotJson(error.to_string()))
    }

    /// Whether this is a callback (a message or an event).
    pub fn is_callback(&self) -> bool {
        matches!(self.cmd.as_deref(), Some(MESSAGE | EVENT))
    }

    /// A callback's body.
    pub fn body(&self) -> Result<&str, FrameError> {
        self.body
            .as_deref()
            .map(RawValue::get)
            .ok_or_else(|| FrameError::NoBody(self.cmd.clone().unwrap_or_default()))
    }

    /// Whether this callback tells the connection that another subscribe took it over.
    pub fn is_takeover(&self) -> bool {
        #[derive(Deserialize)]
        struct Body {
            #[serde(default)]
            event: Option<EventPart>,
        }
        #[derive(Deserialize)]
        struct EventPart {
            #[serde(default)]
            eventtype: String,
        }
        self.cmd.as_deref() == Some(EVENT)
            && self
                .body
                .as_deref()
                .and_then(|body| serde_json::from_str::<Body>(body.get()).ok())
                .and_then(|body| body.event)
                .is_some_and(|event| event.eventtype == DISCONNECTED)
    }
}

/// A command of ours, as its text: `cmd`, a `req_id`, and the body if any.
pub fn command(cmd: &str, req_id: &str, body: Option<serde_json::Value>) -> String {
    let mut frame = serde_json::json!({"cmd": cmd, "headers": {"req_id": req_id}});
    if let Some(body) = body {
        frame["body"] = body;
    }
    frame.to_string()
}

/// A fresh `req_id` for a command of ours: the command, the time and a random part (the
/// official SDK's shape), so that its answer is told from others.
pub fn req_id(cmd: &str) -> String {
    format!(
        "{cmd}_{}_{:08x}",
        oncegate_longconn::unix_ms(),
        fastrand::u32(..)
    )
}

/// An answer to a command of ours, as WeCom writes it.
pub fn answer(req_id: &str, errcode: i64, errmsg: &str) -> String {
    serde_json::json!({"headers": {"req_id": req_id}, "errcode": errcode, "errmsg": errmsg})
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_of_the_official_sdk_and_doc_101463_are_read() {
        let callback = r#"{"cmd":"aibot_msg_callback","headers":{"req_id":"REQUEST_ID"},"body":{"msgid":"CAIQ16HMjQYY","aibotid":"AIBOTID","chatid":"CHATID","chattype":"group","from":{"userid":"USERID"},"msgtype":"text","text":{"content":"@RobotA hello robot"}}}"#;
        let frame = Incoming::parse(callback).expect("frame");
        assert!(frame.is_callback());
        assert!(!frame.is_takeover());
        assert_eq!(frame.headers.req_id, "REQUEST_ID");
        assert!(frame.body().expect("body").starts_with("{\"msgid\""));
        let kicked = r#"{"cmd":"aibot_event_callback","headers":{"req_id":"R2"},"body":{"msgid":"M","create_time":1700000000,"aibotid":"AIBOTID","from":{"corpid":"wpCORP"},"msgtype":"event","event":{"eventtype":"disconnected_event"}}}"#;
        assert!(Incoming::parse(kicked).expect("frame").is_takeover());
        let answer = Incoming::parse(&answer("ping_1_a", 0, "ok")).expect("answer");
        assert_eq!(answer.errcode, Some(0));
        assert!(answer.cmd.is_none());
        assert!(Incoming::parse("1").is_err());
        assert!(Incoming::parse("{\"cmd\":").is_err());
        assert!(
            Incoming::parse(r#"{"cmd":"aibot_msg_callback"}"#)
                .expect("frame")
                .body()
                .is_err()
        );
    }

    #[test]
    fn commands_carry_their_req_id_and_body() {
        let id = req_id(SUBSCRIBE);
        assert!(id.starts_with("aibot_subscribe_"));
        assert_ne!(id, req_id(SUBSCRIBE));
        let text = command(
            SUBSCRIBE,
            &id,
            Some(serde_json::json!({"bot_id": "B", "secret": "S"})),
        );
        let frame = Incoming::parse(&text).expect("frame");
        assert_eq!(frame.cmd.as_deref(), Some(SUBSCRIBE));
        assert_eq!(frame.headers.req_id, id);
        let ping = Incoming::parse(&command(PING, "ping_1", None)).expect("ping");
        assert!(ping.body.is_none());
    }
}
