//! The normalized event every platform decoder produces.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::key::{KeyHash, key_for};

/// One platform event after verification and decoding.
///
/// Strings that repeat across events (source, app, type) are `Arc<str>` so that a decoder can
/// intern them and a clone costs no allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The platform: `feishu`, `lark`, `wecom`, `wechat`.
    pub source: Arc<str>,
    /// The app on that platform (Feishu app id, WeCom corp id + agent id, WeChat app id).
    pub app: Arc<str>,
    /// The tenant inside the app, where the platform names one (Feishu `tenant_key`).
    pub tenant: Option<Arc<str>>,
    /// The platform's event id, or one derived from the event where the platform has none.
    pub event_id: String,
    /// The event type, e.g. `im.message.receive_v1`.
    pub event_type: Arc<str>,
    /// When the platform created the event, unix milliseconds.
    pub created_at_ms: u64,
    /// The key whose events must run one at a time in order (a chat id), if any.
    pub order_key: Option<String>,
    /// The decoded payload as the platform sent it (JSON or XML bytes).
    pub payload: Bytes,
}

impl Event {
    /// The event id, namespaced by source and app: orders an event that has no order key.
    fn primary_key(&self) -> KeyHash {
        key_for(&self.source, &self.app, "event_id", &self.event_id)
    }

    /// The hash that decides the partition and the per-key order: the order key's, else the
    /// event's own (an event without an order key is ordered with nothing else).
    pub fn order_hash(&self) -> u64 {
        match &self.order_key {
            Some(order) => key_for(&self.source, &self.app, "order", order).low64(),
            None => self.primary_key().low64(),
        }
    }

    /// The partition of this event among `partitions` (at least one).
    pub fn partition(&self, partitions: u16) -> u16 {
        partition_of(self.order_hash(), partitions)
    }
}

pub use crate::key::partition_of;
