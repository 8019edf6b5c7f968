//! One write transaction's tables, and the changes the writer makes to them.

use oncegate_core::{
    DeadLetter, KeyHash, QueueId, Record, StoreError, WatermarkOutcome, transition,
};
use redb::{ReadableTable, Table};

use crate::codec::{self, Queued, decode, encode};
use crate::unavailable;

/// Expired keys removed per batch, so that a backlog of expiries never delays a commit much.
pub(crate) const SWEEP_BUDGET: usize = 512;

/// A replayed dead letter's place: its id, where it joins the order and its payload bytes.
pub(crate) type Replayed = (QueueId, oncegate_core::Place, usize);

pub(crate) struct Tables<'t> {
    /// Records gained (+) or lost (-) per state in this batch: pending, processing, completed.
    pub(crate) deltas: [i64; 3],
    pub(crate) records: Table<'t, &'static [u8; 16], &'static [u8]>,
    pub(crate) expiry: Table<'t, (u64, &'static [u8; 16]), ()>,
    pub(crate) queue: Table<'t, u64, &'static [u8]>,
    pub(crate) dead: Table<'t, u64, &'static [u8]>,
    pub(crate) marks: Table<'t, &'static [u8; 16], (u64, u64)>,
}

/// Reads a stored record; the outer error is a storage failure, the inner one a corrupt value.
pub(crate) fn load(
    records: &Table<'_, &'static [u8; 16], &'static [u8]>,
    key: &KeyHash,
) -> Result<Result<Option<Record>, StoreError>, StoreError> {
    let stored = records.get(&key.0).map_err(unavailable)?;
    Ok(stored
        .map(|value| codec::decode_record(value.value()))
        .transpose())
}

/// Writes a record and keeps its single expiry-index entry in step.
pub(crate) fn put(
    tables: &mut Tables<'_>,
    key: &KeyHash,
    before: Option<&Record>,
    record: &Record,
) -> Result<(), StoreError> {
    let deadline = record.forget_after_ms();
    let previous = before.map(Record::forget_after_ms);
    if previous != Some(deadline) {
        if let Some(previous) = previous {
            tables
                .expiry
                .remove((previous, &key.0))
                .map_err(unavailable)?;
        }
        tables
            .expiry
            .insert((deadline, &key.0), ())
            .map_err(unavailable)?;
    }
    let bytes = codec::encode_record(record)?;
    tables
        .records
        .insert(&key.0, bytes.as_slice())
        .map_err(unavailable)?;
    if let Some(before) = before {
        tables.deltas[crate::state_index(&before.state)] -= 1;
    }
    tables.deltas[crate::state_index(&record.state)] += 1;
    Ok(())
}

pub(crate) fn with_record<T>(
    tables: &mut Tables<'_>,
    key: &KeyHash,
    step: impl FnOnce(Option<&Record>) -> (T, Option<Record>),
) -> Result<Result<T, StoreError>, StoreError> {
    let record = match load(&tables.records, key)? {
        Ok(record) => record,
        Err(corrupt) => return Ok(Err(corrupt)),
    };
    let (result, next) = step(record.as_ref());
    if let Some(next) = next {
        put(tables, key, record.as_ref(), &next)?;
    }
    Ok(Ok(result))
}

pub(crate) fn retry(
    tables: &mut Tables<'_>,
    id: QueueId,
    not_before_ms: u64,
) -> Result<Result<bool, StoreError>, StoreError> {
    let Some(bytes) = tables
        .queue
        .get(id.seq)
        .map_err(unavailable)?
        .map(|v| v.value().to_vec())
    else {
        return Ok(Ok(false));
    };
    let mut queued: Queued = match decode(&bytes) {
        Ok(queued) => queued,
        Err(corrupt) => return Ok(Err(corrupt)),
    };
    queued.attempt += 1;
    queued.not_before_ms = not_before_ms;
    let bytes = encode(&queued)?;
    tables
        .queue
        .insert(id.seq, bytes.as_slice())
        .map_err(unavailable)?;
    Ok(Ok(true))
}

pub(crate) fn dead_letter(
    tables: &mut Tables<'_>,
    id: QueueId,
    reason: String,
    now_ms: u64,
) -> Result<Result<bool, StoreError>, StoreError> {
    let Some(bytes) = tables
        .queue
        .remove(id.seq)
        .map_err(unavailable)?
        .map(|v| v.value().to_vec())
    else {
        return Ok(Ok(false));
    };
    let queued: Queued = match decode(&bytes) {
        Ok(queued) => queued,
        Err(corrupt) => return Ok(Err(corrupt)),
    };
    let letter = DeadLetter {
        id,
        key: queued.key,
        event: queued.event,
        attempts: queued.attempt + 1,
        reason,
        at_ms: now_ms,
    };
    let bytes = encode(&letter)?;
    tables
        .dead
        .insert(id.seq, bytes.as_slice())
        .map_err(unavailable)?;
    Ok(Ok(true))
}

/// Dead letter `id` (kept under its queue seq, which no other entry ever had).
pub(crate) fn find_dead(
    tables: &Tables<'_>,
    id: QueueId,
) -> Result<Result<Option<DeadLetter>, StoreError>, StoreError> {
    let Some(stored) = tables.dead.get(id.seq).map_err(unavailable)? else {
        return Ok(Ok(None));
    };
    Ok(decode::<DeadLetter>(stored.value()).map(|letter| (letter.id == id).then_some(letter)))
}

/// Moves dead letter `id` to the end of the queue: the new entry and its order hash.
pub(crate) fn replay_dead(
    tables: &mut Tables<'_>,
    id: QueueId,
    next_seq: &mut u64,
    rule: &oncegate_core::FirstRule,
) -> Result<Result<Option<Replayed>, StoreError>, StoreError> {
    let letter = match find_dead(tables, id)? {
        Ok(Some(letter)) => letter,
        Ok(None) => return Ok(Ok(None)),
        Err(corrupt) => return Ok(Err(corrupt)),
    };
    let placed = oncegate_core::Place::of(&letter.event, rule);
    let order_hash = placed.order_hash;
    let payload_bytes = letter.event.payload.len();
    let queued = Queued {
        key: letter.key,
        order_hash,
        attempt: 0,
        not_before_ms: 0,
        event: letter.event,
    };
    let bytes = match encode(&queued) {
        Ok(bytes) => bytes,
        Err(error) => return Ok(Err(error)),
    };
    let seq = *next_seq;
    *next_seq += 1;
    tables.dead.remove(id.seq).map_err(unavailable)?;
    tables
        .queue
        .insert(seq, bytes.as_slice())
        .map_err(unavailable)?;
    Ok(Ok(Some((
        QueueId {
            partition: id.partition,
            seq,
        },
        placed,
        payload_bytes,
    ))))
}

pub(crate) fn watermark(
    tables: &mut Tables<'_>,
    scope: &KeyHash,
    value: u64,
    retention_ms: u64,
    now_ms: u64,
) -> Result<Result<WatermarkOutcome, StoreError>, StoreError> {
    let stored = tables
        .marks
        .get(&scope.0)
        .map_err(unavailable)?
        .map(|v| v.value());
    let current = stored
        .filter(|(_, forget)| *forget > now_ms)
        .map(|(mark, _)| mark);
    let (outcome, next) = transition::watermark(current, value);
    if let Some(mark) = next {
        let deadline = now_ms.saturating_add(retention_ms);
        if let Some((_, previous)) = stored {
            tables
                .expiry
                .remove((previous, &scope.0))
                .map_err(unavailable)?;
        }
        tables
            .expiry
            .insert((deadline, &scope.0), ())
            .map_err(unavailable)?;
        tables
            .marks
            .insert(&scope.0, (mark, deadline))
            .map_err(unavailable)?;
    }
    Ok(Ok(outcome))
}

/// Forgets records and marks whose deadline has passed, oldest first, within the budget.
pub(crate) fn sweep(tables: &mut Tables<'_>, now_ms: u64) -> Result<(), StoreError> {
    let mut due = Vec::new();
    for entry in tables
        .expiry
        .range((0u64, &[0u8; 16])..=(now_ms, &[0xffu8; 16]))
        .map_err(unavailable)?
        .take(SWEEP_BUDGET)
    {
        let (position, _) = entry.map_err(unavailable)?;
        let (deadline, key) = position.value();
        due.push((deadline, *key));
    }
    for (deadline, key) in due {
        tables
            .expiry
            .remove((deadline, &key))
            .map_err(unavailable)?;
        let record = tables
            .records
            .get(&key)
            .map_err(unavailable)?
            .map(|v| codec::decode_record(v.value()));
        // A record that does not decode is dropped with its index entry: it can never be used.
        match record {
            Some(Ok(record)) if record.forget_after_ms() <= now_ms => {
                tables.records.remove(&key).map_err(unavailable)?;
                tables.deltas[crate::state_index(&record.state)] -= 1;
            }
            Some(Err(_)) => {
                tables.records.remove(&key).map_err(unavailable)?;
            }
            _ => {}
        }
        let mark = tables
            .marks
            .get(&key)
            .map_err(unavailable)?
            .map(|v| v.value());
        if mark.is_some_and(|(_, forget)| forget <= now_ms) {
            tables.marks.remove(&key).map_err(unavailable)?;
        }
    }
    Ok(())
}
