//! Shared values ([`StateStore`]) on Redis: per namespace a hash of values, a counter (the
//! generation) and a sorted set of names (listing in order), all under one hash tag so that a
//! Redis Cluster keeps a namespace in one slot; every change is one script.

use oncegate_core::state::{self, MAX_LIST};
use oncegate_core::{Changed, Expect, StateStore, Versioned};

use super::*;

/// The most values one namespace holds.
const MAX_VALUES: u64 = 1_000_000;

/// A namespace's keys: values, generation, names.
fn keys<C>(inner: &Inner<C>, namespace: &str) -> [String; 3] {
    let tag = format!("{{{}:state:{namespace}}}", inner.prefix);
    [format!("{tag}:v"), format!("{tag}:g"), format!("{tag}:n")]
}

/// A stored `version|expires_at_ms|value`, read back.
fn parse(raw: &[u8]) -> Result<Versioned, StoreError> {
    let unreadable = || StoreError::Corrupt("redis: an unreadable shared value".into());
    let mut parts = raw.splitn(3, |byte| *byte == b'|');
    let mut number = || -> Result<u64, StoreError> {
        let field = parts.next().ok_or_else(unreadable)?;
        std::str::from_utf8(field)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(unreadable)
    };
    let version = number()?;
    let expires_at_ms = number()?;
    let value = parts.next().ok_or_else(unreadable)?;
    Ok(Versioned {
        version,
        value: Bytes::copy_from_slice(value),
        expires_at_ms: (expires_at_ms != 0).then_some(expires_at_ms),
    })
}

fn bulk(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        _ => None,
    }
}

impl<C: Clock> RedisStore<C> {
    async fn change_state(
        &self,
        namespace: &str,
        name: &str,
        value: Option<(Bytes, Option<Duration>)>,
        expect: Expect,
    ) -> Result<Changed, StoreError> {
        state::check(namespace, name, value.as_ref().map(|(v, _)| v.as_ref()))?;
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let written_at = inner.promise.waits().then(|| conn.primary()).flatten();
            let now_ms = inner.clock.now_ms();
            let (kind, expected) = match expect {
                Expect::Any => ("any", 0),
                Expect::Absent => ("absent", 0),
                Expect::Version(version) => ("version", version),
            };
            let (op, bytes, expires_at_ms) = match &value {
                Some((bytes, ttl)) => ("put", bytes.clone(), state::expiry(now_ms, *ttl)),
                None => ("remove", Bytes::new(), None),
            };
            let mut call = inner.scripts.state_change.prepare_invoke();
            for key in keys(&inner, &namespace) {
                call.key(key);
            }
            let reply: Value = call
                .arg(op)
                .arg(&name)
                .arg(kind)
                .arg(expected)
                .arg(now_ms)
                .arg(bytes.as_ref())
                .arg(expires_at_ms.unwrap_or(0))
                .arg(MAX_VALUES)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let reply = array(reply)?;
            let changed = match (reply.first().and_then(int), reply.get(1).and_then(int)) {
                (Some(1), Some(generation)) => Changed::Done(generation),
                (Some(0), Some(current)) => Changed::Stale(current),
                (Some(2), _) => {
                    return Err(StoreError::Invalid(format!(
                        "state namespace {namespace} holds {MAX_VALUES} values already"
                    )));
                }
                _ => {
                    return Err(StoreError::Corrupt(format!(
                        "unexpected state reply {reply:?}"
                    )));
                }
            };
            if matches!(changed, Changed::Done(_)) {
                // As durable as an admission. The mark WAIT follows is partition 0's: on a
                // Redis Cluster whose namespace lives on another primary, it waits on the
                // wrong node (a known gap, see the README).
                inner.replicated(0, written_at).await?;
            }
            Ok(changed)
        })
        .await
    }
}

impl<C: Clock> StateStore for RedisStore<C> {
    async fn state_get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Versioned>, StoreError> {
        state::check(namespace, name, None)?;
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let [values, _, _] = keys(&inner, &namespace);
            let raw: Value = redis::cmd("HGET")
                .arg(values)
                .arg(&name)
                .query_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let Some(raw) = bulk(&raw) else {
                return Ok(None);
            };
            let value = parse(raw)?;
            let now_ms = inner.clock.now_ms();
            Ok(value
                .expires_at_ms
                .is_none_or(|at| at > now_ms)
                .then_some(value))
        })
        .await
    }

    async fn state_put(
        &self,
        namespace: &str,
        name: &str,
        value: Bytes,
        expect: Expect,
        ttl: Option<Duration>,
    ) -> Result<Changed, StoreError> {
        self.change_state(namespace, name, Some((value, ttl)), expect)
            .await
    }

    async fn state_remove(
        &self,
        namespace: &str,
        name: &str,
        expect: Expect,
    ) -> Result<Changed, StoreError> {
        self.change_state(namespace, name, None, expect).await
    }

    async fn state_list(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Versioned)>, StoreError> {
        state::check(namespace, "-", None)?;
        if let Some(after) = after {
            state::check(namespace, after, None)?;
        }
        let (namespace, after) = (namespace.to_owned(), after.unwrap_or("").to_owned());
        let limit = limit.min(MAX_LIST);
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let mut call = inner.scripts.state_list.prepare_invoke();
            for key in keys(&inner, &namespace) {
                call.key(key);
            }
            let reply: Value = call
                .arg(after)
                .arg(inner.clock.now_ms())
                .arg(limit)
                .invoke_async(&mut conn)
                .await
                .map_err(from_redis)?;
            let items = array(reply)?;
            items
                .chunks(2)
                .map(|pair| {
                    let (Some(name), Some(raw)) =
                        (pair.first().and_then(bulk), pair.get(1).and_then(bulk))
                    else {
                        return Err(StoreError::Corrupt("unexpected state listing".into()));
                    };
                    let name = String::from_utf8(name.to_vec())
                        .map_err(|_| StoreError::Corrupt("a state name not UTF-8".into()))?;
                    Ok((name, parse(raw)?))
                })
                .collect()
        })
        .await
    }

    async fn state_generation(&self, namespace: &str) -> Result<u64, StoreError> {
        state::check(namespace, "-", None)?;
        let namespace = namespace.to_owned();
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let [_, generation, _] = keys(&inner, &namespace);
            let value: Value = redis::cmd("GET")
                .arg(generation)
                .query_async(&mut conn)
                .await
                .map_err(from_redis)?;
            Ok(match value {
                Value::Nil => 0,
                other => int(&other).ok_or_else(|| {
                    StoreError::Corrupt(format!("unexpected state generation {other:?}"))
                })?,
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_values_read_back_and_garbage_is_corrupt() {
        let value = parse(b"12|0|a|b").expect("parse");
        assert_eq!(
            (value.version, value.value, value.expires_at_ms),
            (12, Bytes::from("a|b"), None)
        );
        assert_eq!(parse(b"3|99|").expect("parse").expires_at_ms, Some(99));
        for garbage in [&b""[..], b"x|0|v", b"12", b"12|", b"12|y|v"] {
            assert!(parse(garbage).is_err(), "{garbage:?}");
        }
    }
}
