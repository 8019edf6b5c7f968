//! The specs of platforms whose webhook rules are published, and of the seeds' third-party
//! gateways (facts and sources: `shared/protocols/sources.md`). Each is data over the same
//! engine; a configuration may change any of its settings.

use crate::spec::{
    Answer, Ed25519, Encoding, Fields, Handshake, Hash, Hmac, KeyEncoding, Location, Spec,
    Template, Time, TimeUnit, Verify,
};

/// The presets' names.
pub const PRESETS: &[&str] = &[
    "slack",
    "github",
    "standard-webhooks",
    "telegram",
    "discord",
    "dingtalk-robot",
    "wkteam",
    "xingyapi",
];

fn at(text: &str) -> Location {
    // The presets' locations are written here and parse (a unit test holds it).
    Location::parse(text).unwrap_or(Location(Vec::new()))
}

fn fields(id: &[&str], event_type: &[&str], chat: Option<&str>) -> Fields {
    Fields {
        id: id.iter().map(|l| at(l)).collect(),
        fingerprint: Vec::new(),
        event_type: event_type.iter().map(|l| at(l)).collect(),
        chat: chat.map(at),
        tenant: None,
        created_at: None,
    }
}

fn seconds(text: &str) -> Option<Time> {
    Some(Time {
        at: at(text),
        unit: TimeUnit::Seconds,
    })
}

/// The preset `name`, or `None` for a name not in [`PRESETS`].
pub fn preset(name: &str) -> Option<Spec> {
    Some(match name {
        // Events API: `v0=` + hex HMAC-SHA256 of `v0:{ts}:{body}`, ts in seconds within 5 min;
        // `url_verification` answered with its challenge; retries keep `event_id`.
        "slack" => Spec {
            platform: "slack".into(),
            verify: Verify::Hmac(Hmac {
                hash: Hash::Sha256,
                signature: at("header:X-Slack-Signature"),
                signed: Template(vec![
                    crate::spec::Part::Text("v0:".into()),
                    crate::spec::Part::Timestamp,
                    crate::spec::Part::Text(":".into()),
                    crate::spec::Part::Body,
                ]),
                encoding: Encoding::Hex,
                prefix: "v0=".into(),
                separator: None,
                key: KeyEncoding::Text,
            }),
            timestamp: seconds("header:X-Slack-Request-Timestamp"),
            fields: Fields {
                tenant: Some(at("/team_id")),
                created_at: seconds("/event_time"),
                ..fields(&["/event_id"], &["/event/type"], Some("/event/channel"))
            },
            handshakes: vec![Handshake {
                when: at("/type"),
                equals: "url_verification".into(),
                answer: Answer::Echo(at("/challenge")),
            }],
            success: Answer::Text(String::new()),
        },
        // `sha256=` + hex HMAC-SHA256 of the body; no timestamp; a delivery id that is one per
        // event, not per hook: keyed with the hook's id. A `ping` answers 200.
        "github" => Spec {
            platform: "github".into(),
            verify: Verify::Hmac(Hmac {
                hash: Hash::Sha256,
                signature: at("header:X-Hub-Signature-256"),
                signed: Template::body(),
                encoding: Encoding::Hex,
                prefix: "sha256=".into(),
                separator: None,
                key: KeyEncoding::Text,
            }),
            timestamp: None,
            fields: Fields {
                tenant: Some(at("/installation/id")),
                ..fields(
                    &[
                        "header:X-GitHub-Hook-ID | header:X-GitHub-Hook-Installation-Target-ID",
                        "header:X-GitHub-Delivery",
                    ],
                    &["header:X-GitHub-Event", "/action"],
                    Some("/repository/id | /organization/id"),
                )
            },
            handshakes: vec![Handshake {
                when: at("header:X-GitHub-Event"),
                equals: "ping".into(),
                answer: Answer::Text(String::new()),
            }],
            success: Answer::Text(String::new()),
        },
        // `v1,` + base64 HMAC-SHA256 of `{id}.{ts}.{body}` with the base64 key after `whsec_`,
        // several signatures space-separated (rotation), ts in seconds.
        "standard-webhooks" => Spec {
            platform: "standard-webhooks".into(),
            verify: Verify::Hmac(Hmac {
                hash: Hash::Sha256,
                signature: at("header:webhook-signature"),
                signed: Template(vec![
                    crate::spec::Part::Id,
                    crate::spec::Part::Text(".".into()),
                    crate::spec::Part::Timestamp,
                    crate::spec::Part::Text(".".into()),
                    crate::spec::Part::Body,
                ]),
                encoding: Encoding::Base64,
                prefix: "v1,".into(),
                separator: Some(' '),
                key: KeyEncoding::Base64,
            }),
            timestamp: seconds("header:webhook-timestamp"),
            fields: fields(&["header:webhook-id"], &["/type"], None),
            handshakes: Vec::new(),
            success: Answer::Text(String::new()),
        },
        // The secret token of setWebhook in a header; `update_id` is unique per bot only (the
        // app id scopes it); resent until a 2xx.
        "telegram" => Spec {
            platform: "telegram".into(),
            verify: Verify::Token {
                at: at("header:X-Telegram-Bot-Api-Secret-Token"),
            },
            timestamp: None,
            fields: Fields {
                created_at: seconds(
                    "/message/date | /edited_message/edit_date | /channel_post/date | /callback_query/message/date",
                ),
                ..fields(
                    &["/update_id"],
                    &[],
                    Some(
                        "/message/chat/id | /edited_message/chat/id | /channel_post/chat/id | /callback_query/message/chat/id | /my_chat_member/chat/id",
                    ),
                )
            },
            handshakes: Vec::new(),
            success: Answer::Text(String::new()),
        },
        // Interactions: Ed25519 (the app's public key, hex) over `{timestamp}{body}`; a PING
        // (`type` 1) answered PONG; an admitted interaction answered "deferred" (`type` 5:
        // the bot follows up with its token within 15 minutes).
        "discord" => Spec {
            platform: "discord".into(),
            verify: Verify::Ed25519(Ed25519 {
                signature: at("header:X-Signature-Ed25519"),
                signed: Template(vec![crate::spec::Part::Timestamp, crate::spec::Part::Body]),
            }),
            timestamp: seconds("header:X-Signature-Timestamp"),
            fields: Fields {
                tenant: Some(at("/guild_id")),
                ..fields(
                    &["/id"],
                    &["/type", "/data/name | /data/custom_id"],
                    Some("/channel_id"),
                )
            },
            handshakes: vec![Handshake {
                when: at("/type"),
                equals: "1".into(),
                answer: Answer::Json(r#"{"type":1}"#.into()),
            }],
            success: Answer::Json(r#"{"type":5}"#.into()),
        },
        // DingTalk's robot messages over HTTP (an app robot whose receive mode is HTTP):
        // headers `timestamp` (ms) and `sign`, the base64 HMAC-SHA256 with the app secret of
        // `{timestamp}\n{secret}` — the body is not covered (said at risk). Keyed by `msgId`
        // (without one, a digest of what the message is), typed `bot_message` and ordered by
        // conversation, as Stream mode has them.
        "dingtalk-robot" => Spec {
            platform: "dingtalk".into(),
            verify: Verify::Hmac(Hmac {
                hash: Hash::Sha256,
                signature: at("header:sign"),
                signed: Template(vec![
                    crate::spec::Part::Timestamp,
                    crate::spec::Part::Text("\n".into()),
                    crate::spec::Part::Secret,
                ]),
                encoding: Encoding::Base64,
                prefix: String::new(),
                separator: None,
                key: KeyEncoding::Text,
            }),
            timestamp: Some(Time {
                at: at("header:timestamp"),
                unit: TimeUnit::Milliseconds,
            }),
            fields: Fields {
                fingerprint: [
                    "/robotCode",
                    "/conversationId",
                    "/senderStaffId",
                    "/createAt",
                    "/text/content",
                ]
                .iter()
                .map(|l| at(l))
                .collect(),
                tenant: Some(at("/chatbotCorpId | /senderCorpId")),
                created_at: Some(Time {
                    at: at("/createAt"),
                    unit: TimeUnit::Milliseconds,
                }),
                ..fields(&["/msgId"], &["text:bot_message"], Some("/conversationId"))
            },
            handshakes: Vec::new(),
            success: Answer::Text(String::new()),
        },
        // A personal-WeChat gateway: no signature documented (a URL secret, or none said at
        // risk); `newMsgId` of the instance; groups and private chats.
        "wkteam" => Spec {
            platform: "wkteam".into(),
            verify: Verify::Nothing,
            timestamp: None,
            fields: Fields {
                created_at: seconds("/data/timestamp"),
                ..fields(
                    &["/data/wId | /wcId", "/data/newMsgId"],
                    &["/messageType"],
                    Some("/data/fromGroup | /data/fromUser"),
                )
            },
            handshakes: Vec::new(),
            success: Answer::Text("success".into()),
        },
        // A WeCom external-contact gateway (seed 002's callbacks): `MsgId` per message,
        // `ChatId` the chat; no signature documented.
        "xingyapi" => Spec {
            platform: "xingyapi".into(),
            verify: Verify::Nothing,
            timestamp: None,
            fields: fields(&["/MsgId"], &["/MsgType"], Some("/ChatId | /FromUserName")),
            handshakes: Vec::new(),
            success: Answer::Text("success".into()),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every preset's locations are valid (a typo would make it read nothing).
    #[test]
    fn every_presets_locations_parse() {
        for name in PRESETS {
            let spec = preset(name).expect("a preset");
            let mut all: Vec<&Location> = spec.fields.id.iter().collect();
            all.extend(spec.fields.event_type.iter());
            all.extend(spec.fields.chat.iter());
            all.extend(spec.fields.tenant.iter());
            all.extend(spec.fields.created_at.iter().map(|t| &t.at));
            all.extend(spec.timestamp.iter().map(|t| &t.at));
            all.extend(spec.handshakes.iter().map(|h| &h.when));
            for location in all {
                assert!(!location.0.is_empty(), "{name}: an empty location");
            }
        }
        assert!(preset("nope").is_none());
    }
}
