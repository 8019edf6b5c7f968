//! Reading Redis replies.

use super::*;

pub(super) fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis: {error}"))
}

pub(super) fn int(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

pub(super) fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

pub(super) fn array(value: Value) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(StoreError::Corrupt(format!(
            "expected an array from redis, got {other:?}"
        ))),
    }
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes)
        .map_err(|e| StoreError::Corrupt(format!("a stored value does not decode: {e}")))
}

/// Parses HMGET s e t u o f into a record (stats ask for the first four only).
pub(super) fn parse_record(fields: Vec<Value>) -> Option<Record> {
    let state = text(fields.first()?)?.to_owned();
    let expires_at_ms = int(fields.get(1)?)?;
    let state = match state.as_str() {
        "p" => RecordState::Pending,
        "r" => RecordState::Processing {
            token: FencingToken(int(fields.get(2)?)?),
            lease_until_ms: int(fields.get(3)?)?,
        },
        "c" => RecordState::Completed {
            outcome: match fields.get(4) {
                Some(Value::BulkString(bytes)) => Some(Bytes::from(bytes.clone())),
                _ => None,
            },
        },
        _ => return None,
    };
    let fingerprint = match fields.get(5) {
        Some(Value::BulkString(bytes)) => Some(Fingerprint(bytes.as_slice().try_into().ok()?)),
        _ => None,
    };
    Some(Record {
        state,
        expires_at_ms,
        fingerprint,
    })
}

/// The id of a stream entry (also of one that is gone).
pub(super) fn entry_id(entry: &Value) -> Option<String> {
    match entry {
        Value::Array(parts) => parts.first().and_then(text).map(str::to_owned),
        _ => None,
    }
}

/// Whether a stream reply stands for an entry that is gone.
pub(super) fn is_deleted(entry: &Value) -> bool {
    match entry {
        Value::Nil => true,
        Value::Array(parts) => matches!(parts.get(1), None | Some(Value::Nil)),
        _ => false,
    }
}

/// Fields of one stream entry: (seq, key, order hash, event bytes).
pub(super) fn parse_entry(entry: Value) -> Option<(u64, KeyHash, u64, Vec<u8>)> {
    let mut parts = array(entry).ok()?.into_iter();
    let id = parts.next()?;
    let seq = text(&id)?.strip_prefix("0-")?.parse().ok()?;
    let fields = array(parts.next()?).ok()?;
    let (mut key, mut order, mut event) = (None, None, None);
    let mut it = fields.into_iter();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        match text(&name)? {
            "k" => key = KeyHash::from_hex(text(&value)?),
            "o" => order = int(&value),
            "e" => {
                if let Value::BulkString(bytes) = value {
                    event = Some(bytes);
                }
            }
            _ => {}
        }
    }
    Some((seq, key?, order?, event?))
}

/// One entry of a dead-letter stream.
pub(super) fn parse_dead_letter(entry: Value) -> Result<DeadLetter, StoreError> {
    let mut parts = array(entry)?.into_iter().skip(1);
    let fields = array(parts.next().unwrap_or(Value::Nil))?;
    let mut map = std::collections::HashMap::new();
    let mut it = fields.into_iter();
    while let (Some(Value::BulkString(name)), Some(value)) = (it.next(), it.next()) {
        map.insert(name, value);
    }
    let get_int = |name: &[u8]| map.get(name).and_then(int).unwrap_or(0);
    let event = match map.get(b"e".as_slice()) {
        Some(Value::BulkString(bytes)) => decode::<Stored>(bytes)?.event,
        _ => return Err(StoreError::Corrupt("a dead letter lacks its event".into())),
    };
    Ok(DeadLetter {
        id: QueueId {
            partition: get_int(b"p") as u16,
            seq: get_int(b"s"),
        },
        key: map
            .get(b"k".as_slice())
            .and_then(text)
            .and_then(KeyHash::from_hex)
            .unwrap_or(KeyHash([0; 16])),
        event,
        attempts: get_int(b"a") as u32,
        reason: map
            .get(b"r".as_slice())
            .and_then(text)
            .unwrap_or_default()
            .to_owned(),
        at_ms: get_int(b"t"),
    })
}

/// The attempt count and retry time an entry's attempts field holds (`attempts:not_before`).
pub(super) fn attempts_of(field: Option<&str>) -> (u32, u64) {
    let mut parts = field.unwrap_or("").split(':');
    let attempt = parts.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let not_before = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    (attempt, not_before)
}
