//! A WeCom AI bot's callbacks as they come over its long connection: plain JSON bodies (the
//! socket is the authentication), read with the field names of the AI-bot JSON of the HTTP
//! callback mode (one normalization for both), under the bot's id: its `msgid` with the sender
//! is the primary key here, as WeCom documents it for dedup.

use bytes::Bytes;
use oncegate_core::{Admit, Keys};

use crate::WecomError;
use crate::keys::{JSON, Origin, normalize};
use crate::xml::Fields;

/// One AI bot (智能机器人), by its bot id.
#[derive(Debug, Clone)]
pub struct AiBot {
    bot_id: String,
}

impl AiBot {
    /// The bot `bot_id` (its `aibotid`); it may not be empty.
    pub fn new(bot_id: &str) -> Result<Self, WecomError> {
        if bot_id.trim().is_empty() {
            return Err(WecomError::EmptySecret("bot id"));
        }
        Ok(Self {
            bot_id: bot_id.to_owned(),
        })
    }

    /// The bot id.
    pub fn bot_id(&self) -> &str {
        &self.bot_id
    }

    /// The event of a callback's `body` (a message or an event), which is also what handlers
    /// receive: the same document as the HTTP callback mode's decrypted JSON. Its primary key
    /// is its `msgid` with the sender (WeCom's documented dedup key, and what an operator looks
    /// a message up by), the body's fields the second: a repeat of the callback under another
    /// `req_id` is the same event. A body naming another bot is refused.
    pub fn admit(&self, body: Bytes) -> Result<Admit, WecomError> {
        let fields = Fields::from_json(&body)?;
        if let Some(got) = JSON.tenant(&fields)
            && got != self.bot_id
        {
            return Err(WecomError::WrongAgent {
                expected: self.bot_id.clone(),
                got: got.to_owned(),
            });
        }
        let origin = Origin {
            platform: "wecom",
            app: &self.bot_id,
            names: &JSON,
        };
        let (mut event, keys) = normalize(&origin, &fields, body);
        let keys = match keys.as_slice() {
            [fields_key, msgid_key] => Keys::new(*msgid_key).with(*fields_key),
            _ => keys,
        };
        event.tenant = Some(self.bot_id.as_str().into());
        Ok(Admit::new(event, keys))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group text message as doc 101463 shows it.
    const BODY: &[u8] = br#"{"msgid":"CAIQ16HMjQYY\/NGagIOAgAMgq4KM0AI=","aibotid":"AIBOTID","chatid":"CHATID","chattype":"group","from":{"userid":"USERID"},"msgtype":"text","text":{"content":"@RobotA hello robot"}}"#;

    #[test]
    fn a_repeat_is_the_same_event_and_another_msgid_another() {
        let bot = AiBot::new("AIBOTID").expect("bot");
        let first = bot.admit(Bytes::from_static(BODY)).expect("admitted");
        // The same body again, as a repeat under another req_id carries it.
        let again = bot.admit(Bytes::copy_from_slice(BODY)).expect("admitted");
        assert_eq!(first.event.payload.as_ref(), BODY, "handlers get the body");
        assert_eq!(first.keys, again.keys);
        assert_eq!(
            first.keys.primary(),
            oncegate_core::sender_key(
                "wecom",
                "AIBOTID",
                "msg_id",
                "CAIQ16HMjQYY/NGagIOAgAMgq4KM0AI=",
                "USERID"
            ),
            "the msgid with its sender, as an operator looks it up"
        );
        assert_eq!(&*first.event.event_id, "CAIQ16HMjQYY/NGagIOAgAMgq4KM0AI=");
        assert_eq!(&*first.event.event_type, "message.text");
        assert_eq!(first.event.order_key.as_deref(), Some("CHATID"));
        assert_eq!(&*first.event.app, "AIBOTID");
        let other = String::from_utf8_lossy(BODY).replace("CAIQ16", "CAIQ17");
        let other = bot.admit(Bytes::from(other)).expect("admitted");
        assert!(
            other
                .keys
                .as_slice()
                .iter()
                .all(|k| !first.keys.as_slice().contains(k)),
            "another msgid is another event"
        );
    }

    #[test]
    fn another_bots_callback_and_garbage_are_refused() {
        let bot = AiBot::new("OTHER").expect("bot");
        assert!(matches!(
            bot.admit(Bytes::from_static(BODY)),
            Err(WecomError::WrongAgent { .. })
        ));
        assert!(bot.admit(Bytes::from_static(b"{not json")).is_err());
        assert!(bot.admit(Bytes::from_static(b"[1,2]")).is_err());
        assert!(AiBot::new(" ").is_err());
    }
}
