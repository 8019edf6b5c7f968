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
    pub(crate) token: Token<'a>,
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
    pub(crate) token: Token<'a>,
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

/// A verification token member: its reading, and its value's text inside the document, so
/// that the stored payload leaves it out by position instead of parsing the document again.
#[derive(Debug, Default)]
pub(crate) struct Token<'a> {
    /// The token as read.
    pub(crate) value: Scalar<'a>,
    /// The value's text, a slice of the document it was read from.
    raw: Option<&'a str>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Token<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(deserializer)?;
        let value = serde_json::from_str(raw.get()).map_err(de::Error::custom)?;
        Ok(Token {
            value,
            raw: Some(raw.get()),
        })
    }
}

/// Why a member could not be cut out (a value that is not a member's of this document).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotAMember;

/// `json` without the members whose values the `tokens` were read from (each cut with its name
/// and one comma), so that the token is never stored or forwarded. Everything else is kept
/// byte for byte, in order.
pub(crate) fn without_tokens(json: &[u8], tokens: &[&Token<'_>]) -> Result<Vec<u8>, NotAMember> {
    let mut cuts = Vec::with_capacity(tokens.len());
    for raw in tokens.iter().filter_map(|token| token.raw) {
        cuts.push(member_span(json, raw)?);
    }
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(json.len());
    let mut at = 0;
    for (start, end) in cuts {
        if start < at {
            return Err(NotAMember);
        }
        out.extend_from_slice(&json[at..start]);
        at = end;
    }
    out.extend_from_slice(&json[at..]);
    Ok(out)
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The bytes of the member whose value is `raw` (a slice of `json`): from its name's opening
/// quote to its value's end, with the comma after it, or else the one before it.
fn member_span(json: &[u8], raw: &str) -> Result<(usize, usize), NotAMember> {
    let start = (raw.as_ptr() as usize)
        .checked_sub(json.as_ptr() as usize)
        .ok_or(NotAMember)?;
    let end = start.checked_add(raw.len()).ok_or(NotAMember)?;
    if end > json.len() {
        return Err(NotAMember);
    }
    let before = |mut i: usize| {
        while i > 0 && is_space(json[i - 1]) {
            i -= 1;
        }
        i
    };
    // Back over `"token" :`; a name that reads as `token` holds no quote, escaped or not.
    let colon = before(start);
    if colon == 0 || json[colon - 1] != b':' {
        return Err(NotAMember);
    }
    let quote = before(colon - 1);
    if quote == 0 || json[quote - 1] != b'"' {
        return Err(NotAMember);
    }
    let name = json[..quote - 1]
        .iter()
        .rposition(|&b| b == b'"')
        .ok_or(NotAMember)?;
    let mut after = end;
    while after < json.len() && is_space(json[after]) {
        after += 1;
    }
    if json.get(after) == Some(&b',') {
        return Ok((name, after + 1));
    }
    let comma = before(name);
    if comma > 0 && json[comma - 1] == b',' {
        return Ok((comma - 1, end));
    }
    Ok((name, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document `doc` as stored: both tokens cut, read back as a tree.
    fn stored(doc: &str) -> String {
        let read: Doc<'_> = serde_json::from_str(doc).expect("doc");
        let header = read.header.as_ref().map(|h| &h.token);
        let tokens: Vec<&Token<'_>> = std::iter::once(&read.token).chain(header).collect();
        let out = without_tokens(doc.as_bytes(), &tokens).expect("cut");
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn the_token_is_removed_and_everything_else_kept_in_order() {
        let doc = r#"{"schema":"2.0","header":{"event_id":"e","token":"secret-t","x":[1, 2]},"event":{"a":"\u00e9"},"token":"v1-t"}"#;
        assert_eq!(
            stored(doc),
            r#"{"schema":"2.0","header":{"event_id":"e","x":[1, 2]},"event":{"a":"\u00e9"}}"#
        );
    }

    #[test]
    fn a_token_anywhere_goes_with_one_comma() {
        for (doc, expected) in [
            (r#"{"token":"t","a":1}"#, r#"{"a":1}"#),
            (r#"{"a":1,"token":"t"}"#, r#"{"a":1}"#),
            (r#"{"a":1, "token" : "t" , "b":2}"#, r#"{"a":1,  "b":2}"#),
            (r#"{ "token":"t" }"#, r#"{  }"#),
            (
                r#"{"header":{"token":"t"},"token":"u"}"#,
                r#"{"header":{}}"#,
            ),
            (r#"{"tok\u0065n":"t\"\\","a":"token"}"#, r#"{"a":"token"}"#),
            (r#"{"token":{"deep":["t"]},"a":1}"#, r#"{"a":1}"#),
            (r#"{"a":"\"token\":1"}"#, r#"{"a":"\"token\":1"}"#),
            (
                "{\n\t\"a\": 1,\r\n\t\"token\":\t\"t\"\n}",
                "{\n\t\"a\": 1\n}",
            ),
        ] {
            assert_eq!(stored(doc), expected, "{doc}");
        }
    }

    #[test]
    fn a_value_of_another_document_is_not_cut() {
        let other = r#"{"token":"t"}"#;
        let read: Doc<'_> = serde_json::from_str(other).expect("doc");
        let copy = other.as_bytes().to_vec();
        assert_eq!(without_tokens(&copy, &[&read.token]), Err(NotAMember));
    }

    proptest::proptest! {
        /// Any object with tokens among other members, spaced any way: what is stored reads
        /// as the same document without them.
        #[test]
        fn cutting_equals_removing_from_the_tree(
            members in proptest::collection::vec(("[a-z]{1,6}", 0u8..4), 0..6),
            header_members in proptest::collection::vec(("[a-z]{1,6}", 0u8..4), 0..4),
            top_token in proptest::option::of(0usize..7),
            header_token in proptest::option::of(0usize..5),
            spaces in proptest::collection::vec(proptest::sample::select(vec!["", " ", "\n", "\t ", "\r\n"]), 64),
        ) {
            let mut space = spaces.iter().cycle();
            let mut sp = || *space.next().unwrap_or(&"");
            let value = |kind: u8, i: usize| match kind {
                0 => format!("\"v{i},\\\"x\""),
                1 => format!("{i}"),
                2 => format!("[{i}, {{\"token\":\"no\"}}]"),
                _ => "null".to_owned(),
            };
            let object = |members: &[(String, u8)], token: Option<usize>, extra: Option<String>, sp: &mut dyn FnMut() -> &'static str| {
                let mut parts: Vec<String> = members
                    .iter()
                    .enumerate()
                    .filter(|(_, (name, _))| name != "token" && name != "header")
                    .map(|(i, (name, kind))| format!("\"{name}\"{}:{}{}", sp(), sp(), value(*kind, i)))
                    .collect();
                if let Some(extra) = extra {
                    parts.insert(0, extra);
                }
                if let Some(at) = token {
                    parts.insert(at.min(parts.len()), format!("\"token\"{}:{}\"secret\"", sp(), sp()));
                }
                let glue = format!("{},{}", sp(), sp());
                format!("{{{}{}{}}}", sp(), parts.join(&glue), sp())
            };
            let header = object(&header_members, header_token, None, &mut sp);
            let doc = object(&members, top_token, Some(format!("\"header\":{header}")), &mut sp);
            let mut tree: serde_json::Value = serde_json::from_str(&doc).expect("generated JSON");
            if let Some(top) = tree.as_object_mut() {
                top.remove("token");
                if let Some(h) = top.get_mut("header").and_then(|h| h.as_object_mut()) {
                    h.remove("token");
                }
            }
            let out = stored(&doc);
            let read: serde_json::Value = serde_json::from_str(&out).expect("stored JSON");
            proptest::prop_assert_eq!(read, tree, "{} -> {}", doc, out);
            proptest::prop_assert!(!out.contains("secret"), "{}", out);
        }
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
