//! Reading Redis replies.

use super::*;

pub(super) fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis: {error}"))
}

/// A connection's failure as an operator reads it: an answer that is not the Redis protocol
/// (an HTTP server, a proxy on the wrong port) says so instead of the parser's complaint.
pub(super) fn connect_message(error: &redis::RedisError) -> String {
    match error.kind() {
        redis::ErrorKind::Parse => format!(
            "the server answered something that is not the Redis protocol ({error}): is the URL's host and port a Redis server's?"
        ),
        _ => error.to_string(),
    }
}

/// Marks the errors `lua/record.lua` raises for a key it cannot read as a record.
const UNREADABLE_RECORD: &str = "oncegate: record ";

/// A failed Redis call: a record our scripts cannot read is corrupt data, not an outage (it
/// must not open the circuit breaker for every other key); anything else is unavailable.
pub(super) fn from_redis(error: impl std::fmt::Display) -> StoreError {
    let text = error.to_string();
    if text.contains(UNREADABLE_RECORD) {
        StoreError::Corrupt(format!("redis: {text}"))
    } else {
        StoreError::Unavailable(format!("redis: {text}"))
    }
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

/// Parses a record string as `lua/record.lua` lays it out; `None` for anything else.
pub(super) fn parse_record(raw: &[u8]) -> Option<Record> {
    let (&state, rest) = raw.split_first()?;
    let mut numbers = rest.splitn(4, |&b| b == b',');
    let mut number = || -> Option<Option<u64>> {
        let digits = numbers.next()?;
        if digits.is_empty() {
            return Some(None);
        }
        std::str::from_utf8(digits).ok()?.parse().ok().map(Some)
    };
    let expires_at_ms = number()??;
    let (token, until) = (number()?, number()?);
    let tail = numbers.next()?;
    let (fingerprint, tail) = match tail.split_first()? {
        (b'f', rest) if rest.len() >= 16 => {
            let (bytes, rest) = rest.split_at(16);
            (Some(Fingerprint(bytes.try_into().ok()?)), rest)
        }
        (b'-', rest) => (None, rest),
        _ => return None,
    };
    let outcome = match tail.split_first() {
        Some((b'o', outcome)) => Some(Bytes::copy_from_slice(outcome)),
        None => None,
        Some(_) => return None,
    };
    let state = match state {
        b'p' => RecordState::Pending,
        b'r' => RecordState::Processing {
            token: FencingToken(token?),
            lease_until_ms: until?,
        },
        b'c' => RecordState::Completed { outcome },
        _ => return None,
    };
    Some(Record {
        state,
        expires_at_ms,
        fingerprint,
    })
}

/// Parses what `lua/records.lua` answers for one key: `Ok(None)` when there is no record.
pub(super) fn record_of(value: &Value) -> Result<Option<Record>, StoreError> {
    match value {
        Value::Nil => Ok(None),
        // Not the bytes: an outcome is the handler's, not the log's.
        Value::BulkString(raw) => parse_record(raw).map(Some).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "a record of {} bytes does not parse; delete the key if nothing wrote it",
                raw.len()
            ))
        }),
        other => Err(StoreError::Corrupt(format!(
            "expected a record string from redis, got {other:?}"
        ))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_as_the_scripts_write_them() {
        let pending = parse_record(b"p1700000000000,,,-").expect("pending");
        assert_eq!(pending.state, RecordState::Pending);
        assert_eq!(pending.expires_at_ms, 1_700_000_000_000);
        assert_eq!(pending.fingerprint, None);

        let mut running = b"r10,77,9,f".to_vec();
        running.extend_from_slice(&[b','; 16]);
        let running = parse_record(&running).expect("processing");
        assert_eq!(
            running.state,
            RecordState::Processing {
                token: FencingToken(77),
                lease_until_ms: 9
            }
        );
        assert_eq!(running.fingerprint, Some(Fingerprint([b','; 16])));

        let done = parse_record(b"c10,,,-o,a,\xffb").expect("completed");
        assert_eq!(
            done.state,
            RecordState::Completed {
                outcome: Some(Bytes::from_static(b",a,\xffb"))
            }
        );
        let empty = parse_record(b"c10,,,-o").expect("empty outcome");
        assert_eq!(
            empty.state,
            RecordState::Completed {
                outcome: Some(Bytes::new())
            }
        );
        let none = parse_record(b"c10,,,-").expect("no outcome");
        assert_eq!(none.state, RecordState::Completed { outcome: None });
    }

    #[test]
    fn anything_else_is_no_record() {
        for raw in [
            &b""[..],
            b"p",
            b"x1,,,-",
            b"p,,,-",
            b"p1,,-",
            b"p1,,,",
            b"p1,,,f0123",
            b"p1,,,-x",
            b"r1,,,-",
            b"r1,2,,-",
            b"p99999999999999999999999,,,-",
        ] {
            assert_eq!(
                parse_record(raw),
                None,
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }
}
