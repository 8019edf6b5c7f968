//! One request's values by [`Location`]: headers, query parameters and the JSON body (parsed
//! once, when a location first reads it).

use std::borrow::Cow;
use std::cell::OnceCell;

use oncegate_core::{Callback, Refusal, RefusalKind};
use serde_json::Value;

use crate::spec::{Location, Place};

/// A callback with its body parsed on demand.
pub(crate) struct Request<'a> {
    callback: &'a Callback<'a>,
    json: OnceCell<Option<Value>>,
}

impl<'a> Request<'a> {
    pub(crate) fn new(callback: &'a Callback<'a>) -> Self {
        Self {
            callback,
            json: OnceCell::new(),
        }
    }

    pub(crate) fn body(&self) -> &[u8] {
        self.callback.body
    }

    /// The body as JSON: refused when a field must be read from a body that is not.
    pub(crate) fn json(&self) -> Result<&Value, Refusal> {
        self.json
            .get_or_init(|| serde_json::from_slice(self.callback.body).ok())
            .as_ref()
            .ok_or_else(|| {
                Refusal::new(
                    RefusalKind::BadInput,
                    "not_json",
                    "the body is not JSON, and this source reads its fields from JSON",
                )
            })
    }

    /// The value at `location` (its first place that has one), as text: a number or a
    /// boolean as written, an object, array or null as absent.
    pub(crate) fn get<'r>(
        &'r self,
        location: &'r Location,
    ) -> Result<Option<Cow<'r, str>>, Refusal> {
        for place in &location.0 {
            let found = match place {
                Place::Header(name) => self.callback.headers.get(name).map(Cow::Borrowed),
                Place::Query(name) => self.query(name),
                Place::Pointer(pointer) => match self.json()?.pointer(pointer) {
                    Some(Value::String(text)) => Some(Cow::Borrowed(text.as_str())),
                    Some(Value::Number(number)) => Some(Cow::Owned(number.to_string())),
                    Some(Value::Bool(flag)) => Some(Cow::Owned(flag.to_string())),
                    _ => None,
                },
                Place::Fixed(value) => Some(Cow::Borrowed(value.as_str())),
            };
            if let Some(found) = found.filter(|value| !value.is_empty()) {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// A query parameter, percent-decoded (`+` a space, as forms write it).
    fn query(&self, name: &str) -> Option<Cow<'_, str>> {
        self.callback.query?.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key) == name).then(|| Cow::Owned(decode(value)))
        })
    }
}

fn decode(text: &str) -> String {
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}
