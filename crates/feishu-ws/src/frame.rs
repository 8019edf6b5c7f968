//! The `pbbp2` messages the long connection speaks (proto2, written out by hand), and the
//! frames the client sends: pings and acks.

use bytes::Bytes;
use prost::Message;

/// `method` of a control frame (ping, pong).
pub const METHOD_CONTROL: i32 = 0;
/// `method` of a data frame (events, card callbacks).
pub const METHOD_DATA: i32 = 1;

/// One `key = value` header of a frame.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Header {
    /// The header's name: `type`, `message_id`, `sum`, `seq`, `trace_id`, `biz_rt`.
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// Its value, always text.
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `pbbp2.Frame`: every WebSocket binary message is one.
#[derive(Clone, PartialEq, Message)]
pub struct Frame {
    /// The frame's sequence id on its connection.
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    /// The server's log id.
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    /// The `service_id` of the endpoint URL.
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    /// [`METHOD_CONTROL`] or [`METHOD_DATA`].
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    /// The headers, in order.
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<Header>,
    /// Unused by Feishu so far.
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    /// Unused by Feishu so far.
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    /// An event's JSON (or one fragment of it), a pong's client config, an ack's answer.
    #[prost(bytes = "bytes", optional, tag = "8")]
    pub payload: Option<Bytes>,
    /// The server's newer log id.
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not protobuf, or a `pbbp2.Frame` without a required field.
    #[error("not a pbbp2 frame: {0}")]
    Protobuf(String),
    /// A data frame without the header that every data frame has.
    #[error("data frame without the {0:?} header")]
    MissingHeader(&'static str),
    /// A header that must be a number is not one.
    #[error("header {name:?} is {value:?}, not a number")]
    NotNumber {
        /// The header.
        name: &'static str,
        /// What it held (cut to 32 characters).
        value: String,
    },
}

impl FrameError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            FrameError::Protobuf(_) => "bad_protobuf",
            FrameError::MissingHeader(_) => "missing_header",
            FrameError::NotNumber { .. } => "bad_header",
        }
    }
}

impl Frame {
    /// Decodes one binary WebSocket message.
    pub fn decode_bytes(bytes: &[u8]) -> Result<Self, FrameError> {
        Frame::decode(bytes).map_err(|error| FrameError::Protobuf(error.to_string()))
    }

    /// The frame as it goes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    /// The value of header `key`, if present (the first one).
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|header| header.key == key)
            .map(|header| header.value.as_str())
    }

    /// The `type` header: `ping`, `pong`, `event`, `card`, …
    pub fn kind(&self) -> Option<&str> {
        self.header("type")
    }

    /// A number header of a data frame.
    pub fn number(&self, key: &'static str) -> Result<u64, FrameError> {
        let value = self.header(key).ok_or(FrameError::MissingHeader(key))?;
        value
            .trim()
            .parse::<u64>()
            .map_err(|_| FrameError::NotNumber {
                name: key,
                value: value.chars().take(32).collect(),
            })
    }

    /// The client's ping on the connection of `service`.
    pub fn ping(service: i32) -> Self {
        Frame {
            seq_id: 0,
            log_id: 0,
            service,
            method: METHOD_CONTROL,
            headers: vec![Header {
                key: "type".into(),
                value: "ping".into(),
            }],
            payload_encoding: None,
            payload_type: None,
            payload: None,
            log_id_new: None,
        }
    }

    /// The ack of this (data) frame: the frame itself, its headers plus `biz_rt` (how long it
    /// took, in ms), and the answer `{"code":…}` with `data` (base64 of a callback's answer)
    /// when there is one.
    pub fn ack(&self, code: u16, data: Option<&[u8]>, biz_rt_ms: u64) -> Self {
        use base64::Engine;
        let mut answer = serde_json::json!({ "code": code });
        if let Some(data) = data {
            answer["data"] = base64::engine::general_purpose::STANDARD
                .encode(data)
                .into();
        }
        let mut headers: Vec<Header> = self
            .headers
            .iter()
            .filter(|header| header.key != "biz_rt")
            .cloned()
            .collect();
        headers.push(Header {
            key: "biz_rt".into(),
            value: biz_rt_ms.to_string(),
        });
        Frame {
            headers,
            payload: Some(Bytes::from(answer.to_string())),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(key: &str, value: &str) -> Header {
        Header {
            key: key.into(),
            value: value.into(),
        }
    }

    /// Worked out by hand from the proto2 rules: required fields are written even when zero,
    /// fields in tag order, each as (tag << 3 | wire type).
    #[test]
    fn a_ping_is_the_bytes_the_server_expects() {
        let bytes = Frame::ping(7).to_bytes();
        let expected: &[u8] = &[
            0x08, 0x00, // SeqID = 0
            0x10, 0x00, // LogID = 0
            0x18, 0x07, // service = 7
            0x20, 0x00, // method = 0 (control)
            0x2a, 0x0c, // headers[0], 12 bytes
            0x0a, 0x04, b't', b'y', b'p', b'e', //   key
            0x12, 0x04, b'p', b'i', b'n', b'g', //   value
        ];
        assert_eq!(bytes, expected);
        assert_eq!(Frame::decode_bytes(expected), Ok(Frame::ping(7)));
    }

    #[test]
    fn a_data_frame_decodes_from_its_bytes() {
        // SeqID 300 (varint 0xac 0x02), LogID 1, service -1 (ten-byte varint), method 1,
        // headers type=event and sum=1, payload "{}", LogIDNew "x".
        let mut bytes = vec![0x08, 0xac, 0x02, 0x10, 0x01, 0x18];
        bytes.extend([0xff; 9]);
        bytes.extend([0x01, 0x20, 0x01]);
        bytes.extend([0x2a, 0x0d, 0x0a, 0x04]);
        bytes.extend(b"type");
        bytes.extend([0x12, 0x05]);
        bytes.extend(b"event");
        bytes.extend([0x2a, 0x08, 0x0a, 0x03]);
        bytes.extend(b"sum");
        bytes.extend([0x12, 0x01, b'1']);
        bytes.extend([0x42, 0x02, b'{', b'}', 0x4a, 0x01, b'x']);
        let frame = Frame::decode_bytes(&bytes).expect("a frame");
        assert_eq!(frame.seq_id, 300);
        assert_eq!(frame.log_id, 1);
        assert_eq!(frame.service, -1);
        assert_eq!(frame.method, METHOD_DATA);
        assert_eq!(frame.kind(), Some("event"));
        assert_eq!(frame.number("sum"), Ok(1));
        assert_eq!(frame.payload.as_deref(), Some(b"{}".as_slice()));
        assert_eq!(frame.log_id_new.as_deref(), Some("x"));
        assert_eq!(frame.to_bytes(), bytes, "re-encodes to the same bytes");
    }

    #[test]
    fn an_ack_is_the_frame_with_biz_rt_and_the_answer() {
        let frame = Frame {
            seq_id: 9,
            log_id: 4,
            service: 3,
            method: METHOD_DATA,
            headers: vec![header("type", "event"), header("message_id", "m1")],
            payload: Some(Bytes::from_static(b"{\"schema\":\"2.0\"}")),
            ..Frame::ping(3)
        };
        let ack = frame.ack(200, None, 12);
        assert_eq!(
            (ack.seq_id, ack.log_id, ack.service, ack.method),
            (9, 4, 3, 1)
        );
        assert_eq!(
            ack.headers,
            vec![
                header("type", "event"),
                header("message_id", "m1"),
                header("biz_rt", "12")
            ]
        );
        assert_eq!(ack.payload.as_deref(), Some(br#"{"code":200}"#.as_slice()));
        let answered = frame.ack(200, Some(br#"{"toast":{}}"#), 5);
        let body: serde_json::Value =
            serde_json::from_slice(answered.payload.as_deref().unwrap_or_default()).expect("json");
        assert_eq!(body["data"], "eyJ0b2FzdCI6e319");
        assert_eq!(
            frame.ack(500, None, 0).payload.as_deref(),
            Some(br#"{"code":500}"#.as_slice())
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        // prost does not enforce proto2's `required`: a frame without them decodes with zeros
        // and no `type`, which the connection counts as an unknown frame.
        assert_eq!(
            Frame::decode_bytes(b"").map(|f| f.kind().is_none()),
            Ok(true)
        );
        for bytes in [
            &b"\xff\xff\xff"[..],
            b"\x08",
            b"\x2a\x05\x0a",
            b"\x0f",
            b"\x42\x80",
        ] {
            let decoded = Frame::decode_bytes(bytes);
            assert!(
                matches!(decoded, Err(FrameError::Protobuf(_))),
                "{bytes:?}: {decoded:?}"
            );
        }
        let frame = Frame {
            headers: vec![header("sum", "lots")],
            ..Frame::ping(1)
        };
        assert_eq!(
            frame.number("seq").map_err(|e| e.label()),
            Err("missing_header")
        );
        assert_eq!(
            frame.number("sum").map_err(|e| e.label()),
            Err("bad_header")
        );
    }
}
