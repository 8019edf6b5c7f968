//! Borrowed, typed reads of the envelope: no JSON tree is ever built from a request body.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// One JSON value read leniently: a string (borrowed where the body allows), a number, or
/// something else that is skipped without being built.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Scalar<'a> {
    /// A string.
    Text(Cow<'a, str>),
    /// A number.
    Number(f64),
    /// Anything else (null, bool, object, array), or absent.
    #[default]
    Other,
}

impl<'a> Scalar<'a> {
    /// The string, if it is a non-empty one.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Scalar::Text(text) if !text.is_empty() => Some(text),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ScalarVisitor<'a> {
            type Value = Scalar<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Scalar::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Scalar::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Scalar::Text(Cow::Owned(v)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Scalar::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Scalar::Number(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Scalar::Number(v as f64))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other)
            }
        }
        deserializer.deserialize_any(ScalarVisitor(std::marker::PhantomData))
    }
}

/// The fields of every envelope oncegate reads, `encrypt` of an encrypted body among them;
/// everything else is skipped.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Doc<'a> {
    #[serde(borrow)]
    pub(crate) encrypt: Option<Scalar<'a>>,
    #[serde(borrow, rename = "type")]
    pub(crate) kind: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) challenge: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) token: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) schema: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) header: Option<Header<'a>>,
    #[serde(borrow)]
    pub(crate) uuid: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) ts: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) event: Option<EventFields<'a>>,
}

/// Schema 2.0 `header`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Header<'a> {
    #[serde(borrow)]
    pub(crate) event_id: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) event_type: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) token: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) app_id: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) tenant_key: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) create_time: Scalar<'a>,
}

/// The parts of `event` that name its chat, message and (v1) type and app.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct EventFields<'a> {
    #[serde(borrow)]
    pub(crate) message: Option<MessageFields<'a>>,
    #[serde(borrow)]
    pub(crate) context: Option<ContextFields<'a>>,
    #[serde(borrow)]
    pub(crate) chat_id: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) open_chat_id: Scalar<'a>,
    #[serde(borrow, rename = "type")]
    pub(crate) kind: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) app_id: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) tenant_key: Scalar<'a>,
}

/// `event.message`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct MessageFields<'a> {
    #[serde(borrow)]
    pub(crate) message_id: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) chat_id: Scalar<'a>,
}

/// `event.context` (card callbacks).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ContextFields<'a> {
    #[serde(borrow)]
    pub(crate) open_chat_id: Scalar<'a>,
}

/// A JSON object's members in their order, values kept as raw text.
struct Members<'a>(Vec<(Scalar<'a>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<Scalar<'de>, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// Writes `members` as an object, leaving out `token`; `nested` names a member whose object
/// value is written the same way (the schema 2.0 header).
fn write_without_token(
    out: &mut Vec<u8>,
    members: &Members<'_>,
    nested: Option<&str>,
) -> Result<(), serde_json::Error> {
    out.push(b'{');
    let mut first = true;
    for (name, value) in &members.0 {
        let name = name.text().unwrap_or_default();
        if name == "token" {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut *out, name)?;
        out.push(b':');
        let raw = value.get();
        if nested == Some(name) && raw.starts_with('{') {
            write_without_token(out, &serde_json::from_str(raw)?, None)?;
        } else {
            out.extend_from_slice(raw.as_bytes());
        }
    }
    out.push(b'}');
    Ok(())
}

/// The document without its verification token (`header.token` in schema 2.0, `token` at the
/// top in v1 and challenges), so that the token is never stored or forwarded. Every other
/// member is copied byte for byte, in order, straight from the input.
pub(crate) fn without_token(json: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let top: Members<'_> = serde_json::from_slice(json)?;
    let mut out = Vec::with_capacity(json.len());
    write_without_token(&mut out, &top, Some("header"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_removed_and_everything_else_kept_in_order() {
        let doc = br#"{"schema":"2.0","header":{"event_id":"e","token":"secret-t","x":[1, 2]},"event":{"a":"\u00e9"},"token":"v1-t"}"#;
        let out = without_token(doc).expect("strip");
        assert_eq!(
            std::str::from_utf8(&out).expect("utf8"),
            r#"{"schema":"2.0","header":{"event_id":"e","x":[1, 2]},"event":{"a":"\u00e9"}}"#
        );
        assert!(without_token(b"[1]").is_err());
    }

    #[test]
    fn scalars_borrow_strings_and_skip_trees() {
        let doc: Doc<'_> = serde_json::from_str(
            r#"{"type":"x","challenge":{"deep":[[{}]]},"ts":1.5,"uuid":"u","unknown":[1]}"#,
        )
        .expect("doc");
        assert!(matches!(doc.kind, Scalar::Text(Cow::Borrowed("x"))));
        assert_eq!(doc.challenge, Scalar::Other);
        assert_eq!(doc.ts, Scalar::Number(1.5));
        assert_eq!(doc.uuid.text(), Some("u"));
    }
}
