//! The normalized event every platform decoder produces.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::key::{KeyHash, key_for};

/// One platform event after verification and decoding.
///
/// Its strings are `Arc<str>`: a store that keeps an event while a handler runs hands out a
/// clone, which then costs no allocation; the ones that repeat across events (source, app,
/// type) a decoder can intern. They are read back with one allocation each (serde's own
/// `Arc<str>` makes a `Box<str>` first and copies it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The platform: `feishu`, `lark`, `wecom`, `wechat`. (Its JSON of earlier versions
    /// called it `source`, the word for a configured source since.)
    #[serde(alias = "source", deserialize_with = "text::one")]
    pub platform: Arc<str>,
    /// The app on that platform (Feishu app id, WeCom corp id + agent id, WeChat app id).
    #[serde(deserialize_with = "text::one")]
    pub app: Arc<str>,
    /// The tenant inside the app, where the platform names one (Feishu `tenant_key`).
    #[serde(default, deserialize_with = "text::maybe")]
    pub tenant: Option<Arc<str>>,
    /// The platform's event id, or one derived from the event where the platform has none.
    #[serde(deserialize_with = "text::one")]
    pub event_id: Arc<str>,
    /// The event type, e.g. `im.message.receive_v1`.
    #[serde(deserialize_with = "text::one")]
    pub event_type: Arc<str>,
    /// When the platform created the event, unix milliseconds.
    pub created_at_ms: u64,
    /// The key whose events must run one at a time in order (a chat id), if any.
    #[serde(default, deserialize_with = "text::maybe")]
    pub order_key: Option<Arc<str>>,
    /// The decoded payload as the platform sent it (JSON or XML bytes).
    pub payload: Bytes,
}

/// `Arc<str>` fields read with one allocation.
mod text {
    use std::fmt;
    use std::sync::Arc;

    use serde::Deserializer;
    use serde::de::{Error, Visitor};

    struct Text;

    impl<'de> Visitor<'de> for Text {
        type Value = Arc<str>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: Error>(self, text: &str) -> Result<Arc<str>, E> {
            Ok(Arc::from(text))
        }
    }

    struct MaybeText;

    impl<'de> Visitor<'de> for MaybeText {
        type Value = Option<Arc<str>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or nothing")
        }

        fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
            one(inner).map(Some)
        }
    }

    pub(super) fn one<'de, D: Deserializer<'de>>(from: D) -> Result<Arc<str>, D::Error> {
        from.deserialize_str(Text)
    }

    pub(super) fn maybe<'de, D: Deserializer<'de>>(from: D) -> Result<Option<Arc<str>>, D::Error> {
        from.deserialize_option(MaybeText)
    }
}

impl Event {
    /// The event id, namespaced by source and app: orders an event that has no order key.
    fn primary_key(&self) -> KeyHash {
        key_for(&self.platform, &self.app, "event_id", &self.event_id)
    }

    /// The hash that decides the partition and the per-key order: the order key's, else the
    /// event's own (an event without an order key is ordered with nothing else).
    pub fn order_hash(&self) -> u64 {
        match &self.order_key {
            Some(order) => key_for(&self.platform, &self.app, "order", order).low64(),
            None => self.primary_key().low64(),
        }
    }

    /// The hash of whose event this is, for fairness between tenants: its platform, app and
    /// tenant (a Feishu `tenant_key`, a WeCom agent of its corp). The queue hands out to the
    /// group with the fewest events out first, so that one tenant's backlog delays no other's.
    pub fn group_hash(&self) -> u64 {
        group_of(&self.platform, &self.app, self.tenant.as_deref())
    }

    /// The partition of this event among `partitions` (at least one).
    pub fn partition(&self, partitions: u16) -> u16 {
        partition_of(self.order_hash(), partitions)
    }
}

pub use crate::key::partition_of;

/// The group hash of an event of `platform`, `app` and `tenant` ([`Event::group_hash`]), for a
/// store that reads those fields alone.
pub fn group_of(platform: &str, app: &str, tenant: Option<&str>) -> u64 {
    key_for(platform, app, "group", tenant.unwrap_or("")).low64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(tenant: Option<&str>, order: Option<&str>) -> Event {
        Event {
            platform: Arc::from("feishu"),
            app: Arc::from("cli_a"),
            tenant: tenant.map(Arc::from),
            event_id: Arc::from("ev_\"1\"\u{4e2d}"),
            event_type: Arc::from("im.message.receive_v1"),
            created_at_ms: 1_700_000_000_000,
            order_key: order.map(Arc::from),
            payload: Bytes::from_static(br#"{"a":1}"#),
        }
    }

    /// The stores keep events as postcard (journal, spool, Redis streams) and JSON reads
    /// them too: each field comes back as it went, with and without its optional parts.
    #[test]
    fn events_read_back_as_they_were_written() {
        for (tenant, order) in [
            (None, None),
            (Some("t"), None),
            (None, Some("oc_1")),
            (Some(""), Some("c")),
        ] {
            let event = event(tenant, order);
            let bytes = postcard::to_stdvec(&event).expect("postcard");
            assert_eq!(postcard::from_bytes::<Event>(&bytes).expect("read"), event);
            let json = serde_json::to_vec(&event).expect("json");
            assert_eq!(serde_json::from_slice::<Event>(&json).expect("read"), event);
        }
        // As before the fields had a reader of their own, a document without the optional
        // ones means none.
        let without = br#"{"source":"s","app":"a","event_id":"e","event_type":"t","created_at_ms":1,"payload":[]}"#;
        let read = serde_json::from_slice::<Event>(without).expect("optional fields");
        assert_eq!((read.tenant, read.order_key), (None, None));
        // Text where text belongs: a number is refused with the field's expectation.
        let wrong = br#"{"source":1,"app":"a","tenant":null,"event_id":"e","event_type":"t","created_at_ms":1,"order_key":null,"payload":[]}"#;
        let error = serde_json::from_slice::<Event>(wrong).expect_err("a number is no source");
        assert!(error.to_string().contains("a string"), "{error}");
    }
}
