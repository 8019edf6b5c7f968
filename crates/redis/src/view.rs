//! The queue as operators see it: per-partition summaries and listings, read from the server
//! (any gateway can answer), with what only the partition's owner knows (which events its
//! handlers hold) from this gateway's index.

use super::*;

/// `partition`'s summary: depth and oldest entry from the stream, its memory from the server,
/// handed-out events from this gateway's index (another gateway's handlers are not counted).
pub(super) async fn summary<C: Clock>(
    inner: &Inner<C>,
    conn: &mut Conn,
    partition: u16,
) -> Result<QueueSummary, StoreError> {
    let stream = inner.stream(partition);
    let (events, bytes, first): (u64, Option<u64>, Value) = redis::pipe()
        .cmd("XLEN")
        .arg(&stream)
        .cmd("MEMORY")
        .arg("USAGE")
        .arg(&stream)
        .cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await
        .map_err(from_redis)?;
    let oldest_created_ms = match array(first)?.into_iter().next().and_then(parse_entry) {
        Some((_, _, _, stored)) => Some(decode::<Stored>(&stored)?.event.created_at_ms),
        None => None,
    };
    let handed_out = inner.queues[usize::from(partition)]
        .lock()
        .await
        .order
        .in_flight() as u64;
    Ok(QueueSummary {
        partition,
        events,
        handed_out,
        bytes: if events == 0 { 0 } else { bytes.unwrap_or(0) },
        oldest_created_ms,
    })
}

/// Up to `limit` entries of `partition`'s stream after seq `after`, each with its attempts and
/// where it stands (handed out: as far as this gateway's index knows).
pub(super) async fn entries<C: Clock>(
    inner: &Inner<C>,
    conn: &mut Conn,
    partition: u16,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<QueuedEvent>, StoreError> {
    let start = match after {
        Some(after) => format!("(0-{after}"),
        None => "-".to_owned(),
    };
    let listed: Value = redis::cmd("XRANGE")
        .arg(inner.stream(partition))
        .arg(start)
        .arg("+")
        .arg("COUNT")
        .arg(limit.max(1))
        .query_async(conn)
        .await
        .map_err(from_redis)?;
    let mut parsed = Vec::new();
    for entry in array(listed)? {
        if is_deleted(&entry) {
            continue;
        }
        let Some(entry) = parse_entry(entry) else {
            return Err(StoreError::Corrupt("a stream entry lacks k, o or e".into()));
        };
        parsed.push(entry);
    }
    parsed.truncate(limit);
    if parsed.is_empty() {
        return Ok(Vec::new());
    }
    let fields: Vec<String> = parsed.iter().map(|(seq, ..)| seq.to_string()).collect();
    let attempts: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(inner.attempts(partition))
        .arg(&fields)
        .query_async(conn)
        .await
        .map_err(from_redis)?;
    let now_ms = inner.clock.now_ms();
    let queue = inner.queues[usize::from(partition)].lock().await;
    let mut out = Vec::with_capacity(parsed.len());
    for ((seq, key, _, stored), field) in parsed.into_iter().zip(attempts) {
        let (attempt, not_before) = attempts_of(field.as_deref());
        let state = if queue.order.is_in_flight(seq) {
            QueuedState::HandedOut
        } else if not_before > now_ms {
            QueuedState::Delayed {
                until_ms: not_before,
            }
        } else {
            QueuedState::Waiting
        };
        out.push(QueuedEvent {
            id: QueueId { partition, seq },
            key,
            event: decode::<Stored>(&stored)?.event,
            attempt,
            state,
        });
    }
    Ok(out)
}
