//! A WeCom AI bot's proactive messages (`aibot_send_msg`), over the bot's long connection held
//! by this gateway: to a conversation whose user has written to the bot, within the
//! conversation's budget that replies share.

use std::sync::Arc;
use std::time::Duration;

use oncegate_wecom_ws::{Outbound, OutboundError, SEND, conversation_budgets};
use serde_json::Value;

use crate::{Budget, SendError};

/// One AI bot, sending over its connection.
#[derive(Debug, Clone)]
pub struct AiBotApi {
    outbound: Arc<Outbound>,
}

/// A checked `aibot_send_msg` body.
#[derive(Debug, Clone)]
pub struct AiBotMessage {
    /// The body as sent.
    pub body: Value,
}

impl AiBotApi {
    /// Sends through `outbound`, the bot's connection when this gateway holds it.
    pub fn new(outbound: Arc<Outbound>) -> Self {
        Self { outbound }
    }

    /// Checks a caller's body: a JSON object naming `chatid` and `msgtype`.
    pub fn prepare(&self, body: Value) -> Result<AiBotMessage, String> {
        let Some(fields) = body.as_object() else {
            return Err("an AI bot's send is a JSON object".into());
        };
        let chat = fields.get("chatid").and_then(Value::as_str);
        if chat.is_none_or(|chat| chat.trim().is_empty()) {
            return Err(
                "name chatid: the conversation (a group's chatid, or the user's userid)".into(),
            );
        }
        if !fields.get("msgtype").is_some_and(Value::is_string) {
            return Err("name msgtype (markdown, template_card, …)".into());
        }
        Ok(AiBotMessage { body })
    }

    /// The budgets a message spends, by bucket name: its conversation's, which replies share.
    pub fn budgets(message: &AiBotMessage) -> Vec<(String, Budget)> {
        let chat = message.body["chatid"].as_str().unwrap_or_default();
        conversation_budgets(chat)
    }

    /// Sends a prepared message.
    pub async fn send(&self, message: &AiBotMessage) -> Result<Value, SendError> {
        match self.outbound.send(SEND, message.body.clone()).await {
            Ok(answer) => Ok(answer),
            Err(OutboundError::NotHeld) => Err(SendError::NotHere {
                reason: OutboundError::NotHeld.to_string(),
                // A connection being dialled again is back within a second or two.
                after: Duration::from_secs(1),
            }),
            Err(OutboundError::Refused { code, message }) => {
                Err(SendError::Permanent { code, message })
            }
            Err(OutboundError::Unknown(why)) => Err(SendError::Unknown(why)),
        }
    }
}
