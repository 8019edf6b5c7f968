//! The one sending seam: a configured app of any platform, what a caller's body means to it
//! (the message, the rate budgets it spends, the payload a reused key must match), and the
//! call itself.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::aibot::{AiBotApi, AiBotMessage};
use crate::feishu::{FeishuApi, Message};
use crate::limits::{
    FEISHU_APP, FEISHU_APP_MINUTE, FEISHU_PACE, FEISHU_RECEIVER, WECOM_APP, WECOM_APP_HOUR,
    WECOM_MEMBER, WECOM_MEMBER_HOUR,
};
use crate::wecom::{WecomApi, WecomMessage};
use crate::{Budget, SendError};

/// An app that can send.
#[derive(Debug)]
pub enum Api {
    /// A Feishu or Lark app.
    Feishu(FeishuApi),
    /// A WeCom app (one agent of a corp).
    Wecom(WecomApi),
    /// A WeCom AI bot, over its long connection.
    AiBot(AiBotApi),
    /// Any other platform's message API, by configuration.
    Http(crate::HttpApi),
}

/// The name of the budget of the app in its tenant, per API: the one a platform's frequency
/// answer ([`crate::Limit::App`]) lowers.
pub const APP: &str = "app";

/// A caller's send, ready to go.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// What a reuse of the caller's key must match (not how long it may wait).
    pub payload: Value,
    /// The budgets the send spends, each by its bucket's name, the narrowest (the receiver's)
    /// first: a platform's answer about a receiver lowers the first.
    pub budgets: Vec<(String, Budget)>,
    /// The message this send edits, if it is an edit: edits of one message go one at a time
    /// and the latest wins.
    pub edit_of: Option<String>,
    /// The budget (by its bucket's name) whose sends from one gateway go one at a time, each
    /// started at least this long after the previous one's answer, so that they arrive that
    /// far apart however late each was.
    pub pace: Option<(String, std::time::Duration)>,
    /// Whether the platform drops a second copy of this message (Feishu's `uuid`, WeCom's
    /// duplicate check): after an unknown outcome, a retry with the same key may call again.
    /// Without it (an AI bot's `aibot_send_msg` has no such key), an unknown outcome settles
    /// the key: a retry would put a second message on the user's screen.
    pub repeat_safe: bool,
    outgoing: Outgoing,
}

#[derive(Debug, Clone)]
enum Outgoing {
    Feishu(Message),
    Wecom(WecomMessage),
    AiBot(AiBotMessage),
    Http(crate::HttpMessage),
}

#[derive(Deserialize)]
struct FeishuSend {
    #[serde(default = "chat_id")]
    receive_id_type: String,
    #[serde(default)]
    receive_id: String,
    #[serde(default)]
    msg_type: String,
    content: Value,
    reply_to: Option<String>,
    update: Option<String>,
}

fn chat_id() -> String {
    "chat_id".into()
}

impl Api {
    /// The name its rate budgets go by, shared with every other sender of the same app: the
    /// app (Feishu, Lark), the corp and agent (WeCom). An AI bot's sender does not know its bot
    /// (`None`): its budgets are named by the bot's id where the connection is configured.
    pub fn scope(&self) -> Option<String> {
        match self {
            Api::Feishu(api) => Some(api.app_id().to_owned()),
            Api::Wecom(api) => Some(format!("{}/{}", api.corp_id(), api.agent_id())),
            Api::AiBot(_) => None,
            Api::Http(api) => Some(api.scope().to_owned()),
        }
    }

    /// Reads a caller's body (its `wait_ms` already taken out) as this platform's send, with
    /// `platform_key` as the platform's own idempotency key.
    pub fn prepare(&self, body: Value, platform_key: String) -> Result<Prepared, String> {
        match self {
            Api::Feishu(_) => {
                let send: FeishuSend = serde_json::from_value(body)
                    .map_err(|error| format!("not a Feishu send: {error}"))?;
                if send.update.is_none() && send.reply_to.is_none() && send.receive_id.is_empty() {
                    return Err("name receive_id (or reply_to, or update)".into());
                }
                if send.update.is_none() && send.msg_type.is_empty() {
                    return Err("name msg_type (text, post, interactive, …)".into());
                }
                let content = match &send.content {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                // Feishu limits updates per message, and sends per chat: a reply's budget is
                // its chat's when the caller names it, else the parent message's own.
                let message = Message {
                    receive_id_type: send.receive_id_type,
                    receive_id: send.receive_id,
                    msg_type: send.msg_type,
                    content,
                    reply_to: send.reply_to,
                    update_of: send.update,
                    uuid: platform_key,
                };
                message.check()?;
                let bucket = match (
                    &message.update_of,
                    &message.reply_to,
                    message.receive_id.is_empty(),
                ) {
                    (Some(id), _, _) => format!("message:{id}"),
                    (None, Some(parent), true) => format!("receiver:{parent}"),
                    _ => format!("receiver:{}", message.receive_id),
                };
                let payload = json!([
                    message.receive_id_type,
                    message.receive_id,
                    message.msg_type,
                    message.content,
                    message.reply_to,
                    message.update_of
                ]);
                Ok(Prepared {
                    payload,
                    repeat_safe: true,
                    pace: Some((bucket.clone(), FEISHU_PACE)),
                    budgets: vec![
                        (bucket, FEISHU_RECEIVER),
                        (APP.into(), FEISHU_APP),
                        ("app-minute".into(), FEISHU_APP_MINUTE),
                    ],
                    edit_of: message.update_of.clone(),
                    outgoing: Outgoing::Feishu(message),
                })
            }
            Api::Wecom(api) => {
                let message = api.prepare(body)?;
                let mut budgets: Vec<(String, Budget)> = message
                    .members()
                    .flat_map(|member| {
                        [
                            (format!("member:{member}"), WECOM_MEMBER),
                            (format!("member-hour:{member}"), WECOM_MEMBER_HOUR),
                        ]
                    })
                    .collect();
                budgets.push((APP.into(), WECOM_APP));
                budgets.push(("app-hour".into(), WECOM_APP_HOUR));
                let checked = message
                    .body
                    .get("enable_duplicate_check")
                    .is_some_and(|on| on.as_i64() == Some(1) || on.as_bool() == Some(true));
                Ok(Prepared {
                    payload: message.body.clone(),
                    repeat_safe: checked,
                    budgets,
                    edit_of: None,
                    // WeCom counts per minute: the budget's slack covers arrival jitter.
                    pace: None,
                    outgoing: Outgoing::Wecom(message),
                })
            }
            Api::AiBot(api) => {
                let message = api.prepare(body)?;
                Ok(Prepared {
                    payload: message.body.clone(),
                    repeat_safe: false,
                    budgets: AiBotApi::budgets(&message),
                    edit_of: None,
                    pace: None,
                    outgoing: Outgoing::AiBot(message),
                })
            }
            Api::Http(api) => {
                // What a reuse of the key must match: the caller's body, before the key.
                let payload = body.clone();
                let (message, budgets) = api.prepare(body, &platform_key)?;
                Ok(Prepared {
                    payload,
                    repeat_safe: api.repeat_safe(),
                    budgets,
                    edit_of: None,
                    pace: None,
                    outgoing: Outgoing::Http(message),
                })
            }
        }
    }

    /// Sends a prepared message: the platform's answer, or why not.
    pub async fn send(&self, prepared: &Prepared) -> Result<Value, SendError> {
        match (self, &prepared.outgoing) {
            (Api::Feishu(api), Outgoing::Feishu(message)) => api.send(message).await,
            (Api::Wecom(api), Outgoing::Wecom(message)) => api.send(message).await,
            (Api::AiBot(api), Outgoing::AiBot(message)) => api.send(message).await,
            (Api::Http(api), Outgoing::Http(message)) => api.send(message).await,
            _ => Err(SendError::Permanent {
                code: 0,
                message: "prepared for another platform".into(),
            }),
        }
    }
}
