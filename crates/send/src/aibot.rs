//! A WeCom AI bot's proactive messages (`aibot_send_msg`), over the bot's long connection held
//! by this gateway: to a conversation whose user has written to the bot, within the
//! conversation's budget that replies share.

use std::sync::Arc;
use std::time::Duration;

use oncegate_wecom_ws::{Outbound, OutboundError, SEND, conversation_budgets};
use serde_json::Value;

use crate::wecom::{BUSY, CONCURRENCY, FREQUENCY};
use crate::{Budget, SendError};

/// "aibot websocket not subscribed": the socket looks alive but WeCom no longer counts it as
/// subscribed (it resubscribes); nothing was sent.
const NOT_SUBSCRIBED: i64 = 846_609;

/// What WeCom's refusal of a send means for a retry: only a refusal that a retry would meet
/// again is kept as the key's answer; nothing was sent in any case.
fn refusal(code: i64, message: String) -> SendError {
    match code {
        FREQUENCY => SendError::RetryAfter {
            after: Duration::from_secs(60),
            code,
            limit: crate::Limit::Receiver,
        },
        CONCURRENCY => SendError::RetryAfter {
            after: Duration::from_secs(1),
            code,
            limit: crate::Limit::Concurrency,
        },
        NOT_SUBSCRIBED | BUSY => {
            SendError::Transient(format!("WeCom answered errcode {code}: {message}"))
        }
        code => SendError::Permanent { code, message },
    }
}

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
            Err(OutboundError::Refused { code, message }) => Err(refusal(code, message)),
            Err(OutboundError::Unknown(why)) => Err(SendError::Unknown(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rate limits wait, an unsubscribed socket and a busy WeCom are tried again (nothing was
    /// sent); only the rest is kept as the key's answer.
    #[test]
    fn only_refusals_a_retry_would_meet_again_are_permanent() {
        let class = |code| refusal(code, "m".into()).label();
        assert_eq!(class(45009), "rate_limited");
        assert_eq!(class(45033), "rate_limited");
        assert_eq!(class(846_609), "transient");
        assert_eq!(class(-1), "transient");
        assert_eq!(class(40008), "permanent");
        assert_eq!(class(846_605), "permanent");
    }
}
