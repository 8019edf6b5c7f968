//! The writer thread: applies waiting requests in one write transaction, commits once, then
//! answers them all.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use bytes::Bytes;
use oncegate_core::{
    Admission, Claim, Clock, Event, FenceCheck, FencingToken, Fingerprint, KeyHash, Lease, Place,
    QueueId, Record, RecordState, StoreError, WatermarkOutcome, transition,
};
use redb::{ReadableTable, WriteTransaction};
use tokio::sync::oneshot;

use crate::codec::{Queued, encode};
use crate::tables::*;
use crate::{DEAD, EXPIRY, MARKS, META, QUEUE, RECORDS, Shared, lock, unavailable};

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// The longest a batch waits for more requests, and the batch size from which it does.
const GATHER_WAIT: std::time::Duration = std::time::Duration::from_micros(200);
const GATHER_FROM: usize = 8;

/// One request to the writer.
pub(crate) enum Command {
    Admit {
        event: Event,
        /// It goes before its group's other waiting events.
        first: bool,
        keys: Vec<KeyHash>,
        retention_ms: u64,
        reply: Reply<Admission>,
    },
    Claim {
        key: KeyHash,
        partition: u16,
        lease_ms: u64,
        fingerprint: Option<Fingerprint>,
        reply: Reply<Claim>,
    },
    Renew {
        lease: Lease,
        extend_ms: u64,
        reply: Reply<FenceCheck>,
    },
    Complete {
        lease: Lease,
        retention_ms: u64,
        outcome: Option<Bytes>,
        reply: Reply<FenceCheck>,
    },
    Release {
        lease: Lease,
        reply: Reply<FenceCheck>,
    },
    CompleteAck {
        lease: Lease,
        retention_ms: u64,
        outcome: Option<Bytes>,
        id: QueueId,
        reply: Reply<FenceCheck>,
    },
    Ack {
        id: QueueId,
        reply: Reply<bool>,
    },
    Retry {
        id: QueueId,
        not_before_ms: u64,
        reply: Reply<bool>,
    },
    DeadLetter {
        id: QueueId,
        reason: String,
        reply: Reply<bool>,
    },
    ReplayDead {
        id: QueueId,
        reply: Reply<Option<QueueId>>,
    },
    PurgeDead {
        id: QueueId,
        reply: Reply<bool>,
    },
    Watermark {
        scope: KeyHash,
        value: u64,
        retention_ms: u64,
        reply: Reply<WatermarkOutcome>,
    },
}

/// What to do once the batch's commit has succeeded or failed.
type Finish = Box<dyn FnOnce(&Shared, Option<&StoreError>) + Send>;

fn answer<T: Send + 'static>(reply: Reply<T>, result: Result<T, StoreError>) -> Finish {
    Box::new(move |_, failed| {
        let _ = reply.send(match failed {
            Some(error) => Err(unavailable(error)),
            None => result,
        });
    })
}

/// An admit: once committed, the event joins its partition's hand-out order.
fn answer_admit(
    reply: Reply<Admission>,
    result: Result<Admission, StoreError>,
    placed: Place,
    payload_bytes: usize,
) -> Finish {
    Box::new(move |shared, failed| {
        let _ = reply.send(match failed {
            Some(error) => Err(unavailable(error)),
            None => {
                if let Ok(Admission::Admitted { id }) = result
                    && let Some(order) = shared.order.get(usize::from(id.partition))
                {
                    lock(order).push_at(id.seq, placed, 0, payload_bytes);
                }
                result
            }
        });
    })
}

/// A replayed dead letter: once committed, it joins the hand-out order.
fn answer_replay(
    reply: Reply<Option<QueueId>>,
    result: Result<Option<Replayed>, StoreError>,
) -> Finish {
    Box::new(move |shared, failed| {
        let _ = reply.send(match failed {
            Some(error) => Err(unavailable(error)),
            None => result.map(|replayed| {
                replayed.map(|(id, placed, payload_bytes)| {
                    if let Some(order) = shared.order.get(usize::from(id.partition)) {
                        lock(order).push_at(id.seq, placed, 0, payload_bytes);
                    }
                    id
                })
            }),
        });
    })
}

/// A completion with its ack: once committed, the entry leaves the hand-out order.
fn answer_complete_ack(
    reply: Reply<FenceCheck>,
    id: QueueId,
    removed: bool,
    result: Result<FenceCheck, StoreError>,
) -> Finish {
    Box::new(move |shared, failed| {
        let _ = reply.send(match failed {
            Some(error) => Err(unavailable(error)),
            None => {
                if removed && let Some(order) = shared.order.get(usize::from(id.partition)) {
                    lock(order).remove(id.seq);
                }
                result
            }
        });
    })
}

/// What a committed queue change does to the hand-out order.
#[derive(Clone, Copy)]
enum Then {
    Remove,
    Retry { not_before_ms: u64 },
}

/// A queue change: answer after commit, and only then change the hand-out order.
fn answer_queue(
    reply: Reply<bool>,
    id: QueueId,
    then: Then,
    result: Result<bool, StoreError>,
) -> Finish {
    Box::new(move |shared, failed| {
        let _ = reply.send(match failed {
            Some(error) => Err(unavailable(error)),
            None => {
                if let (Ok(true), Some(order)) =
                    (&result, shared.order.get(usize::from(id.partition)))
                {
                    let mut order = lock(order);
                    match then {
                        Then::Remove => order.remove(id.seq),
                        Then::Retry { not_before_ms } => order.retry(id.seq, not_before_ms),
                    };
                }
                result
            }
        });
    })
}

pub(crate) struct Writer<C> {
    shared: Arc<Shared>,
    receiver: Receiver<Command>,
    max_batch: usize,
    clock: C,
}

impl<C: Clock> Writer<C> {
    pub(crate) fn new(
        shared: Arc<Shared>,
        receiver: Receiver<Command>,
        max_batch: usize,
        clock: C,
    ) -> Self {
        Self {
            shared,
            receiver,
            max_batch,
            clock,
        }
    }

    pub(crate) fn run(self) {
        let mut last_batch = 1;
        while let Ok(first) = self.receiver.recv() {
            let mut batch = Vec::with_capacity(last_batch.max(16));
            batch.push(first);
            self.gather(&mut batch, last_batch);
            last_batch = batch.len();
            self.apply(batch);
        }
    }

    /// Takes what is waiting. Under load (the last batch was large) the callers answered by the
    /// last commit are still sending their next requests: wait a moment for them, so that one
    /// fsync serves them all instead of half of them.
    fn gather(&self, batch: &mut Vec<Command>, last_batch: usize) {
        let deadline = std::time::Instant::now() + GATHER_WAIT;
        let want = if last_batch >= GATHER_FROM {
            last_batch
        } else {
            1
        };
        while batch.len() < self.max_batch {
            match self.receiver.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) if batch.len() < want && std::time::Instant::now() < deadline => {
                    std::thread::yield_now();
                }
                Err(_) => break,
            }
        }
    }

    fn apply(&self, batch: Vec<Command>) {
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
        let outcome = self.apply_in_transaction(batch, &mut finishes);
        let failed = outcome.err();
        for finish in finishes {
            finish(&self.shared, failed.as_ref());
        }
    }

    fn apply_in_transaction(
        &self,
        batch: Vec<Command>,
        finishes: &mut Vec<Finish>,
    ) -> Result<(), StoreError> {
        let txn = self.shared.db.begin_write().map_err(unavailable)?;
        let now_ms = self.clock.now_ms();
        let requests = batch.len() as u64;
        let mut deltas = [0i64; 3];
        let applied = self.apply_commands(&txn, batch, now_ms, finishes, &mut deltas);
        match applied {
            Ok(()) => {
                let started = std::time::Instant::now();
                txn.commit().map_err(unavailable)?;
                let shared = &self.shared;
                for (count, delta) in shared.counts.iter().zip(deltas) {
                    count.fetch_add(delta as u64, Ordering::Relaxed);
                }
                shared.commits.fetch_add(1, Ordering::Relaxed);
                shared
                    .committed_requests
                    .fetch_add(requests, Ordering::Relaxed);
                shared
                    .commit_nanos
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                let _ = txn.abort();
                Err(error)
            }
        }
    }

    fn apply_commands(
        &self,
        txn: &WriteTransaction,
        batch: Vec<Command>,
        now_ms: u64,
        finishes: &mut Vec<Finish>,
        deltas: &mut [i64; 3],
    ) -> Result<(), StoreError> {
        let mut meta = txn.open_table(META).map_err(unavailable)?;
        let mut next_seq = meta
            .get("seq")
            .map_err(unavailable)?
            .map_or(0, |v| v.value());
        let seq_before = next_seq;
        let mut tables = Tables {
            deltas: [0; 3],
            records: txn.open_table(RECORDS).map_err(unavailable)?,
            expiry: txn.open_table(EXPIRY).map_err(unavailable)?,
            queue: txn.open_table(QUEUE).map_err(unavailable)?,
            dead: txn.open_table(DEAD).map_err(unavailable)?,
            marks: txn.open_table(MARKS).map_err(unavailable)?,
        };
        for command in batch {
            let finish = match command {
                Command::Admit {
                    event,
                    first,
                    keys,
                    retention_ms,
                    reply,
                } => {
                    let order = Place {
                        order_hash: event.order_hash(),
                        group: event.group_hash(),
                        first,
                    };
                    let payload_bytes = event.payload.len();
                    let result = self.admit(
                        &mut tables,
                        event,
                        &keys,
                        retention_ms,
                        now_ms,
                        &mut next_seq,
                    )?;
                    answer_admit(reply, result, order, payload_bytes)
                }
                Command::Claim {
                    key,
                    partition,
                    lease_ms,
                    fingerprint,
                    reply,
                } => {
                    let next_token = &self.shared.next_token;
                    let run = self.shared.run;
                    let result =
                        with_record(&mut tables, &key.in_partition(partition), |record| {
                            // The file is locked to one process: a lease granted in an earlier run
                            // belongs to a process that is gone, so it is over now, not when its
                            // clock says. A restart resumes at once instead of after the lease.
                            let record = record.map(|record| match record.state {
                                RecordState::Processing { token, .. } if token.run() < run => {
                                    Record {
                                        state: RecordState::Processing {
                                            token,
                                            lease_until_ms: 0,
                                        },
                                        expires_at_ms: record.expires_at_ms,
                                        fingerprint: record.fingerprint,
                                    }
                                }
                                _ => record.clone(),
                            });
                            transition::claim(
                                record.as_ref(),
                                key,
                                partition,
                                now_ms,
                                lease_ms,
                                fingerprint,
                                || FencingToken(next_token.fetch_add(1, Ordering::Relaxed)),
                            )
                        })?;
                    answer(reply, result)
                }
                Command::Renew {
                    lease,
                    extend_ms,
                    reply,
                } => {
                    let result = with_record(&mut tables, &lease.record_id(), |record| {
                        transition::renew(record, &lease, now_ms, extend_ms)
                    })?;
                    answer(reply, result)
                }
                Command::Complete {
                    lease,
                    retention_ms,
                    outcome,
                    reply,
                } => {
                    let result = with_record(&mut tables, &lease.record_id(), |record| {
                        transition::complete(record, &lease, now_ms, retention_ms, outcome)
                    })?;
                    answer(reply, result)
                }
                Command::CompleteAck {
                    lease,
                    retention_ms,
                    outcome,
                    id,
                    reply,
                } => {
                    let result = with_record(&mut tables, &lease.record_id(), |record| {
                        transition::complete(record, &lease, now_ms, retention_ms, outcome)
                    })?;
                    let removed = tables.queue.remove(id.seq).map_err(unavailable)?.is_some();
                    answer_complete_ack(reply, id, removed, result)
                }
                Command::Release { lease, reply } => {
                    let result = with_record(&mut tables, &lease.record_id(), |record| {
                        transition::release(record, &lease, now_ms)
                    })?;
                    answer(reply, result)
                }
                Command::Ack { id, reply } => {
                    let removed = tables.queue.remove(id.seq).map_err(unavailable)?.is_some();
                    answer_queue(reply, id, Then::Remove, Ok(removed))
                }
                Command::Retry {
                    id,
                    not_before_ms,
                    reply,
                } => {
                    let result = retry(&mut tables, id, not_before_ms)?;
                    answer_queue(reply, id, Then::Retry { not_before_ms }, result)
                }
                Command::DeadLetter { id, reason, reply } => {
                    let result = dead_letter(&mut tables, id, reason, now_ms)?;
                    answer_queue(reply, id, Then::Remove, result)
                }
                Command::ReplayDead { id, reply } => {
                    let result = replay_dead(&mut tables, id, &mut next_seq, &self.shared.first)?;
                    answer_replay(reply, result)
                }
                Command::PurgeDead { id, reply } => {
                    let result = match find_dead(&tables, id)? {
                        Ok(Some(_)) => {
                            tables.dead.remove(id.seq).map_err(unavailable)?;
                            Ok(true)
                        }
                        Ok(None) => Ok(false),
                        Err(corrupt) => Err(corrupt),
                    };
                    answer(reply, result)
                }
                Command::Watermark {
                    scope,
                    value,
                    retention_ms,
                    reply,
                } => {
                    let result = watermark(&mut tables, &scope, value, retention_ms, now_ms)?;
                    answer(reply, result)
                }
            };
            finishes.push(finish);
        }
        sweep(&mut tables, now_ms)?;
        *deltas = tables.deltas;
        if next_seq != seq_before {
            meta.insert("seq", next_seq).map_err(unavailable)?;
        }
        Ok(())
    }

    /// Returns `Err` only for storage failures (which abort the batch); a logical refusal is
    /// the inner result.
    #[allow(clippy::type_complexity)]
    fn admit(
        &self,
        tables: &mut Tables<'_>,
        event: Event,
        keys: &[KeyHash],
        retention_ms: u64,
        now_ms: u64,
        next_seq: &mut u64,
    ) -> Result<Result<Admission, StoreError>, StoreError> {
        let order_hash = event.order_hash();
        let partition = oncegate_core::event::partition_of(order_hash, self.shared.partitions);
        let mut stored = Vec::with_capacity(keys.len());
        for (key_index, key) in keys.iter().enumerate() {
            let record = match load(&tables.records, &key.in_partition(partition))? {
                Ok(record) => record,
                Err(corrupt) => return Ok(Err(corrupt)),
            };
            if transition::is_seen(record.as_ref(), now_ms) {
                return Ok(Ok(Admission::Duplicate { key_index }));
            }
            stored.push(record);
        }
        let fresh = transition::admitted(now_ms, retention_ms);
        for (key, before) in keys.iter().zip(&stored) {
            put(
                tables,
                &key.in_partition(partition),
                before.as_ref(),
                &fresh,
            )?;
        }
        let seq = *next_seq;
        *next_seq += 1;
        let queued = Queued {
            key: keys[0],
            order_hash,
            attempt: 0,
            not_before_ms: 0,
            event,
        };
        let bytes = match encode(&queued) {
            Ok(bytes) => bytes,
            Err(error) => return Ok(Err(error)),
        };
        tables
            .queue
            .insert(seq, bytes.as_slice())
            .map_err(unavailable)?;
        Ok(Ok(Admission::Admitted {
            id: QueueId { partition, seq },
        }))
    }
}
