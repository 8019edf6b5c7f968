//! What a generic source is made of: where each value is in a request ([`Location`]), the
//! bytes a signature covers ([`Template`]), how a request is verified ([`Verify`]), which
//! fields make the event ([`Fields`]), and how handshakes and admitted events are answered.

use std::fmt;

use crate::SpecError;

/// Where a value is: a header, a query parameter or a JSON pointer into the body; with
/// alternatives (`/message/chat/id | /edited_message/chat/id`), the first present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location(pub(crate) Vec<Place>);

/// One place a value may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// A header, by its lowercase name.
    Header(String),
    /// A query parameter.
    Query(String),
    /// A JSON pointer (RFC 6901) into the body.
    Pointer(String),
    /// A fixed value (`text:bot_message`): what every event of the source has, such as a type
    /// its platform does not send.
    Fixed(String),
}

impl Location {
    /// Reads `header:Name`, `query:name`, `/json/pointer` or a fixed `text:value`,
    /// alternatives joined by `|` (a fixed value last: it is always present).
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let places = text
            .split('|')
            .map(|part| {
                let part = part.trim();
                if let Some(name) = part.strip_prefix("header:") {
                    let name = name.trim();
                    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
                        return Err(SpecError::location(
                            text,
                            "a header's name is empty or not a token",
                        ));
                    }
                    Ok(Place::Header(name.to_ascii_lowercase()))
                } else if let Some(name) = part.strip_prefix("query:") {
                    let name = name.trim();
                    if name.is_empty() {
                        return Err(SpecError::location(
                            text,
                            "a query parameter's name is empty",
                        ));
                    }
                    Ok(Place::Query(name.to_owned()))
                } else if part.starts_with('/') {
                    Ok(Place::Pointer(part.to_owned()))
                } else if let Some(value) = part.strip_prefix("text:") {
                    let value = value.trim();
                    if value.is_empty() {
                        return Err(SpecError::location(text, "a fixed value (text:) is empty"));
                    }
                    Ok(Place::Fixed(value.to_owned()))
                } else {
                    Err(SpecError::location(
                        text,
                        "write header:Name, query:name, a JSON pointer (/event/id) or a fixed \
                         text:value",
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(places))
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, place) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            match place {
                Place::Header(name) => write!(f, "header:{name}")?,
                Place::Query(name) => write!(f, "query:{name}")?,
                Place::Pointer(pointer) => f.write_str(pointer)?,
                Place::Fixed(value) => write!(f, "text:{value}")?,
            }
        }
        Ok(())
    }
}

/// The bytes a signature covers: text with `{body}`, `{timestamp}`, `{id}` and `{secret}` in
/// it (Slack: `v0:{timestamp}:{body}`; Standard Webhooks: `{id}.{timestamp}.{body}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub(crate) Vec<Part>);

/// One part of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Text(String),
    Body,
    Timestamp,
    Id,
    Secret,
}

impl Template {
    /// Reads a template; an unknown `{name}` is an error.
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let close = rest[open..].find('}').ok_or_else(|| SpecError::Template {
                template: text.to_owned(),
                reason: "a { is not closed".into(),
            })? + open;
            parts.push(match &rest[open + 1..close] {
                "body" => Part::Body,
                "timestamp" => Part::Timestamp,
                "id" => Part::Id,
                "secret" => Part::Secret,
                other => {
                    return Err(SpecError::Template {
                        template: text.to_owned(),
                        reason: format!(
                            "{{{other}}} is not one of {{body}}, {{timestamp}}, {{id}}, {{secret}}"
                        ),
                    });
                }
            });
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Self(parts))
    }

    /// The body alone (GitHub's signature).
    pub fn body() -> Self {
        Self(vec![Part::Body])
    }

    pub(crate) fn uses(&self, part: &Part) -> bool {
        self.0.contains(part)
    }
}

/// A MAC's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    /// HMAC-SHA1 (GitHub's legacy header, DingTalk-era schemes).
    Sha1,
    /// HMAC-SHA256.
    Sha256,
    /// HMAC-SHA512.
    Sha512,
}

/// How signature bytes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hexadecimal, either case.
    Hex,
    /// Standard base64.
    Base64,
}

/// How the configured secret becomes the MAC key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyEncoding {
    /// The secret's bytes as written.
    Text,
    /// Base64, after a `whsec_` prefix if there is one (Standard Webhooks).
    Base64,
}

/// How a request proves it comes from the platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    /// Nothing: anyone who knows the URL can send events. Only when configured as such.
    Nothing,
    /// A shared token equal to one of the secrets (Telegram's secret-token header, a URL
    /// secret in the query).
    Token {
        /// Where the token is.
        at: Location,
    },
    /// A MAC over the template's bytes with one of the secrets.
    Hmac(Hmac),
    /// An Ed25519 signature over the template's bytes by the key whose public half is one of
    /// the secrets (hex; Discord's interactions and webhook events).
    Ed25519(Ed25519),
}

impl Verify {
    /// The bytes its signature covers, when it has one.
    pub(crate) fn signed(&self) -> Option<&Template> {
        match self {
            Verify::Hmac(hmac) => Some(&hmac.signed),
            Verify::Ed25519(ed25519) => Some(&ed25519.signed),
            Verify::Nothing | Verify::Token { .. } => None,
        }
    }
}

/// An Ed25519 signature's settings (written in hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ed25519 {
    /// Where the signature is.
    pub signature: Location,
    /// What it covers (Discord: `{timestamp}{body}`).
    pub signed: Template,
}

/// A MAC signature's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hmac {
    /// The hash.
    pub hash: Hash,
    /// Where the signature is.
    pub signature: Location,
    /// What it covers.
    pub signed: Template,
    /// How it is written.
    pub encoding: Encoding,
    /// What precedes it (`v0=`, `sha256=`, `v1,`), removed before decoding.
    pub prefix: String,
    /// Several signatures in one value split by this (Standard Webhooks: a space), any of
    /// which may match.
    pub separator: Option<char>,
    /// How the secret becomes the key.
    pub key: KeyEncoding,
}

/// A time's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Unix seconds (fractions allowed: Slack's `ts`).
    Seconds,
    /// Unix milliseconds.
    Milliseconds,
}

/// A time in the request: where, and in which unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Time {
    /// Where it is.
    pub at: Location,
    /// Its unit.
    pub unit: TimeUnit,
}

/// The fields an event is made of.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fields {
    /// The event's id: each part required, joined by `:` (a scope and an id: GitHub's hook and
    /// delivery).
    pub id: Vec<Location>,
    /// Without an id: the event is keyed by a digest of these values (each may be absent).
    pub fingerprint: Vec<Location>,
    /// The event's type: the parts present joined by `.` (GitHub's event and action).
    pub event_type: Vec<Location>,
    /// The chat whose events run in order.
    pub chat: Option<Location>,
    /// The tenant inside the app.
    pub tenant: Option<Location>,
    /// When the platform created the event.
    pub created_at: Option<Time>,
}

/// How a handshake is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A value of the request, as plain text (Slack's `challenge`).
    Echo(Location),
    /// A fixed JSON body (Discord's `{"type":1}`).
    Json(String),
    /// A fixed text body (empty: a bare 200).
    Text(String),
}

/// A request that is a handshake, not an event: when the value at `when` equals `equals`,
/// it is answered with `answer` and nothing is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The value that tells it.
    pub when: Location,
    /// What it equals.
    pub equals: String,
    /// The answer.
    pub answer: Answer,
}

/// A whole generic source, before its secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The platform's name in events, keys and metrics (`slack`, `github`, `webhook`).
    pub platform: String,
    /// How requests are verified.
    pub verify: Verify,
    /// The signed timestamp, when the platform signs one: checked against the replay window.
    pub timestamp: Option<Time>,
    /// The event's fields.
    pub fields: Fields,
    /// Handshakes, tried in order after verification.
    pub handshakes: Vec<Handshake>,
    /// The answer to an admitted (or repeated) event.
    pub success: Answer,
}
