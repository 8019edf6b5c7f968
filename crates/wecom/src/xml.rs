//! The platforms' XML, read as a flat list of leaf fields: `ToUserName`, `ApprovalInfo/SpNo`,
//! `MemChangeList/Item`… in document order. Field order, CDATA, whitespace between elements and
//! unknown fields do not matter; a DTD, an unknown entity, a second root or too deep a tree is
//! refused.

use quick_xml::Reader;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::Event;

use crate::WecomError;

/// Deepest element nesting read (the platforms use two or three levels).
const MAX_DEPTH: usize = 8;
/// Most leaf fields read from one document.
const MAX_FIELDS: usize = 512;

/// A document's leaf fields: (path below the root, text).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fields {
    pairs: Vec<(String, String)>,
}

fn bad(why: impl std::fmt::Display) -> WecomError {
    WecomError::BadDocument(why.to_string())
}

impl Fields {
    /// Reads the leaf fields of `xml` (its root's name is not part of the paths).
    pub fn parse(xml: &[u8]) -> Result<Self, WecomError> {
        let text = std::str::from_utf8(xml).map_err(|_| bad("the document is not UTF-8"))?;
        let mut reader = Reader::from_str(text);
        let mut path: Vec<String> = Vec::new();
        // Per open element: its text so far, and whether it has child elements.
        let mut open: Vec<(String, bool)> = Vec::new();
        let mut pairs = Vec::new();
        let mut roots = 0usize;
        loop {
            let event = reader
                .read_event()
                .map_err(|error| bad(format!("malformed XML: {error}")))?;
            match event {
                Event::Start(start) => {
                    let name = element_name(start.local_name().as_ref())?;
                    if open.is_empty() {
                        roots += 1;
                        if roots > 1 {
                            return Err(bad("more than one root element"));
                        }
                    }
                    if let Some(parent) = open.last_mut() {
                        parent.1 = true;
                    }
                    if open.len() >= MAX_DEPTH {
                        return Err(bad(format!("elements nested deeper than {MAX_DEPTH}")));
                    }
                    path.push(name);
                    open.push((String::new(), false));
                }
                Event::Empty(empty) => {
                    let name = element_name(empty.local_name().as_ref())?;
                    match open.last_mut() {
                        Some(parent) => parent.1 = true,
                        None => {
                            roots += 1;
                            if roots > 1 {
                                return Err(bad("more than one root element"));
                            }
                            continue;
                        }
                    }
                    push(&mut pairs, joined(&path[1..], Some(&name)), String::new())?;
                }
                Event::End(_) => {
                    let Some((text, has_children)) = open.pop() else {
                        return Err(bad("an end tag without a start"));
                    };
                    // The root's own path is empty: it is never a field.
                    if !has_children && path.len() > 1 {
                        push(&mut pairs, joined(&path[1..], None), text)?;
                    }
                    path.pop();
                }
                Event::Text(chunk) => {
                    let chunk = chunk.decode().map_err(bad)?;
                    match open.last_mut() {
                        Some((text, _)) => text.push_str(&chunk),
                        None if chunk.trim().is_empty() => {}
                        None => return Err(bad("text outside the root element")),
                    }
                }
                Event::CData(chunk) => {
                    let chunk = chunk.decode().map_err(bad)?;
                    match open.last_mut() {
                        Some((text, _)) => text.push_str(&chunk),
                        None => return Err(bad("CDATA outside the root element")),
                    }
                }
                Event::GeneralRef(reference) => {
                    let resolved = if reference.is_char_ref() {
                        reference.resolve_char_ref().map_err(bad)?.map(String::from)
                    } else {
                        let name = reference.decode().map_err(bad)?;
                        resolve_predefined_entity(&name).map(str::to_owned)
                    };
                    let resolved = resolved.ok_or_else(|| bad("an unknown entity reference"))?;
                    match open.last_mut() {
                        Some((text, _)) => text.push_str(&resolved),
                        None => return Err(bad("text outside the root element")),
                    }
                }
                Event::DocType(_) => return Err(bad("a DTD is not accepted")),
                Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
                Event::Eof => break,
            }
        }
        if roots == 0 {
            return Err(bad("no root element"));
        }
        if !open.is_empty() {
            return Err(bad("the document ends inside an element"));
        }
        Ok(Self { pairs })
    }

    /// Reads the leaf fields of a JSON object (WeCom's AI-bot callbacks): nested objects give
    /// paths (`from/userid`), array items repeat their path, numbers and booleans read as
    /// their text, null as empty.
    pub fn from_json(json: &[u8]) -> Result<Self, WecomError> {
        let value: serde_json::Value =
            serde_json::from_slice(json).map_err(|error| bad(format!("not JSON: {error}")))?;
        if !value.is_object() {
            return Err(bad("the JSON document is not an object"));
        }
        let mut pairs = Vec::new();
        flatten(&value, &mut String::new(), 0, &mut pairs)?;
        Ok(Self { pairs })
    }

    /// The first field at `path` (`MsgId`, `ApprovalInfo/SpNo`).
    pub fn get(&self, path: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(at, _)| at == path)
            .map(|(_, value)| value.as_str())
    }

    /// The first field at `path`, trimmed, if it is not empty.
    pub fn text(&self, path: &str) -> Option<&str> {
        self.get(path)
            .map(str::trim)
            .filter(|value| !value.is_empty())
    }

    /// Every field, in document order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }
}

fn flatten(
    value: &serde_json::Value,
    path: &mut String,
    depth: usize,
    pairs: &mut Vec<(String, String)>,
) -> Result<(), WecomError> {
    use serde_json::Value;
    if depth > MAX_DEPTH {
        return Err(bad(format!("objects nested deeper than {MAX_DEPTH}")));
    }
    match value {
        Value::Object(members) => {
            for (name, member) in members {
                let before = path.len();
                if !path.is_empty() {
                    path.push('/');
                }
                path.push_str(name);
                flatten(member, path, depth + 1, pairs)?;
                path.truncate(before);
            }
            Ok(())
        }
        Value::Array(items) => items
            .iter()
            .try_for_each(|item| flatten(item, path, depth + 1, pairs)),
        Value::String(text) => push(pairs, path.clone(), text.clone()),
        Value::Null => push(pairs, path.clone(), String::new()),
        other => push(pairs, path.clone(), other.to_string()),
    }
}

fn element_name(raw: &[u8]) -> Result<String, WecomError> {
    std::str::from_utf8(raw)
        .map(str::to_owned)
        .map_err(|_| bad("an element name is not UTF-8"))
}

fn joined(path: &[String], leaf: Option<&str>) -> String {
    let mut out = path.join("/");
    if let Some(leaf) = leaf {
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(leaf);
    }
    out
}

fn push(pairs: &mut Vec<(String, String)>, path: String, text: String) -> Result<(), WecomError> {
    if pairs.len() >= MAX_FIELDS {
        return Err(bad(format!("more than {MAX_FIELDS} fields")));
    }
    pairs.push((path, text));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_in_any_order_with_cdata_entities_and_nesting() {
        let fields = Fields::parse(
            br#"<?xml version="1.0"?><xml>
                <CreateTime>1409659813</CreateTime>
                <!-- a comment -->
                <ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName>
                <Content>a &lt;b&gt; &amp; &#x4e2d;<![CDATA[ <raw> ]]></Content>
                <ApprovalInfo><SpNo>202012</SpNo><Unknown><Deep>x</Deep></Unknown></ApprovalInfo>
                <MemChangeList><Item>wm1</Item><Item>wm2</Item></MemChangeList>
                <Empty/>
            </xml>"#,
        )
        .expect("parses");
        assert_eq!(fields.get("ToUserName"), Some("wx5823bf96d3bd56c7"));
        assert_eq!(fields.get("CreateTime"), Some("1409659813"));
        assert_eq!(fields.get("Content"), Some("a <b> & 中 <raw> "));
        assert_eq!(fields.get("ApprovalInfo/SpNo"), Some("202012"));
        assert_eq!(fields.get("ApprovalInfo/Unknown/Deep"), Some("x"));
        assert_eq!(fields.get("Empty"), Some(""));
        let items: Vec<&str> = fields
            .pairs()
            .iter()
            .filter(|(path, _)| path == "MemChangeList/Item")
            .map(|(_, value)| value.as_str())
            .collect();
        assert_eq!(items, ["wm1", "wm2"]);
        assert_eq!(fields.get("xml"), None, "the root is not a field");
    }

    #[test]
    fn json_documents_read_as_the_same_kind_of_fields() {
        let fields = Fields::from_json(
            br#"{"msgid":"m1","aibotid":"bot1","chatid":"c1","chattype":"group","from":{"userid":"zhangsan"},"msgtype":"text","text":{"content":"hi"},"n":3,"ok":true,"none":null,"list":["a","b"]}"#,
        )
        .expect("parses");
        assert_eq!(fields.get("from/userid"), Some("zhangsan"));
        assert_eq!(fields.get("text/content"), Some("hi"));
        assert_eq!(fields.get("n"), Some("3"));
        assert_eq!(fields.get("ok"), Some("true"));
        assert_eq!(fields.get("none"), Some(""));
        assert_eq!(
            fields.pairs().iter().filter(|(p, _)| p == "list").count(),
            2
        );
        let deep = format!("{}1{}", "{\"a\":".repeat(20), "}".repeat(20));
        for bad in [&b"[1]"[..], b"not json", b"", deep.as_bytes()] {
            assert!(matches!(
                Fields::from_json(bad),
                Err(WecomError::BadDocument(_))
            ));
        }
    }

    #[test]
    fn hostile_and_broken_documents_are_refused() {
        let deep = format!("<xml>{}{}</xml>", "<a>".repeat(20), "</a>".repeat(20));
        let many = format!("<xml>{}</xml>", "<a>1</a>".repeat(MAX_FIELDS + 1));
        for doc in [
            &b"<!DOCTYPE xml [<!ENTITY x \"boom\">]><xml><a>&x;</a></xml>"[..],
            b"<xml><a>&unknown;</a></xml>",
            b"<xml><a>1</a></xml><xml/>",
            b"<xml><a>1</a>",
            b"<xml><a>1</b></xml>",
            b"text<xml/>",
            b"",
            b"\xff\xfe",
            deep.as_bytes(),
            many.as_bytes(),
        ] {
            assert!(
                matches!(Fields::parse(doc), Err(WecomError::BadDocument(_))),
                "{:?}",
                String::from_utf8_lossy(doc)
            );
        }
    }
}
