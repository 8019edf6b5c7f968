//! A plain reference model of the dedup state machine, written without the core's transition
//! functions, and the property check that drives a store and the model with the same random
//! operations.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{
    Admission, Claim, FenceCheck, Fingerprint, Lease, ManualClock, RecordState, Store,
};
use proptest::prelude::*;

use crate::{block_on, event, key};

/// One step of a random run. Times are whole seconds so that every backend is exact.
#[derive(Debug, Clone)]
pub enum Op {
    /// Admit event `event` with the keys picked by the `keys` bit mask (of four).
    Admit {
        /// Event number.
        event: u8,
        /// Bit mask over the four keys; never zero.
        keys: u8,
        /// Retention, seconds.
        retention: u64,
    },
    /// Claim key number `key`, for payload number `payload` when there is one.
    Claim {
        /// Key number.
        key: u8,
        /// Lease, seconds.
        lease: u64,
        /// Which of two payloads the claim names, or none.
        payload: Option<u8>,
    },
    /// Renew the `lease`-th lease granted so far (modulo their number).
    Renew {
        /// Which lease.
        lease: usize,
        /// Extension, seconds.
        extend: u64,
    },
    /// Complete the `lease`-th lease.
    Complete {
        /// Which lease.
        lease: usize,
        /// Retention, seconds.
        retention: u64,
        /// Whether to store an outcome.
        outcome: bool,
    },
    /// Release the `lease`-th lease.
    Release {
        /// Which lease.
        lease: usize,
    },
    /// Move the clock.
    Advance {
        /// Seconds.
        secs: u64,
    },
    /// Read one key's record.
    Lookup {
        /// Key number.
        key: u8,
    },
}

/// The strategy for a run of operations.
pub fn operations() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0u8..6, 1u8..16, 1u64..40).prop_map(|(event, keys, retention)| Op::Admit { event, keys, retention }),
        3 => (0u8..4, 1u64..20, proptest::option::of(0u8..2)).prop_map(|(key, lease, payload)| Op::Claim { key, lease, payload }),
        1 => (any::<usize>(), 1u64..20).prop_map(|(lease, extend)| Op::Renew { lease, extend }),
        2 => (any::<usize>(), 1u64..40, any::<bool>()).prop_map(|(lease, retention, outcome)| Op::Complete { lease, retention, outcome }),
        1 => any::<usize>().prop_map(|lease| Op::Release { lease }),
        2 => (1u64..25).prop_map(|secs| Op::Advance { secs }),
        1 => (0u8..4).prop_map(|key| Op::Lookup { key }),
    ];
    proptest::collection::vec(op, 1..60)
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Pending,
    Processing { holder: usize, until: u64 },
    Completed { outcome: Option<Bytes> },
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    expires: u64,
    /// The payload the key was first claimed for.
    payload: Option<u8>,
}

impl Entry {
    fn live(&self, now: u64) -> bool {
        now < self.expires || matches!(self.state, State::Processing { until, .. } if now < until)
    }
}

/// The model: keys by number, leases by the order they were granted.
#[derive(Debug, Default)]
struct Model {
    entries: HashMap<u8, Entry>,
}

/// The order key of every model event.
const MODEL_CHAT: &str = "model-chat";

fn key_name(k: u8) -> String {
    format!("model-key-{k}")
}

/// Drives `store` and the model through `ops` and panics at the first disagreement.
pub fn check<S: Store>(store: &S, clock: &ManualClock, ops: &[Op]) {
    let mut model = Model::default();
    // Leases granted so far: the store's lease and the key number.
    let mut leases: Vec<(Lease, u8)> = Vec::new();
    let ms = |secs: u64| secs * 1000;
    // Every model event is in one chat, so that all model keys share one partition.
    let partition = event("model-event-0", Some(MODEL_CHAT)).partition(store.partitions());
    block_on(async {
        for (step, op) in ops.iter().enumerate() {
            let now = clock_now(clock);
            match op {
                Op::Admit {
                    event: n,
                    keys,
                    retention,
                } => {
                    let picked: Vec<u8> = (0..4).filter(|k| keys & (1 << k) != 0).collect();
                    let hashes: Vec<_> = picked.iter().map(|k| key(&key_name(*k))).collect();
                    let expected = match picked
                        .iter()
                        .position(|k| model.entries.get(k).is_some_and(|e| e.live(now)))
                    {
                        Some(key_index) => Admission::Duplicate { key_index },
                        None => {
                            for k in &picked {
                                model.entries.insert(
                                    *k,
                                    Entry {
                                        state: State::Pending,
                                        expires: now + ms(*retention),
                                        payload: None,
                                    },
                                );
                            }
                            Admission::Admitted {
                                id: oncegate_core::QueueId {
                                    partition: 0,
                                    seq: 0,
                                },
                            }
                        }
                    };
                    let got = store
                        .admit(
                            event(&format!("model-event-{n}"), Some(MODEL_CHAT)),
                            &hashes,
                            Duration::from_secs(*retention),
                        )
                        .await
                        .expect("admit");
                    match (expected, got) {
                        (Admission::Admitted { .. }, Admission::Admitted { .. }) => {}
                        (expected, got) => assert_eq!(got, expected, "step {step}: {op:?}"),
                    }
                }
                Op::Claim {
                    key: k,
                    lease,
                    payload,
                } => {
                    let until = now + ms(*lease);
                    let holder = leases.len();
                    let live = model.entries.get(k).filter(|e| e.live(now));
                    let kept = live.and_then(|entry| entry.payload);
                    let (expected, grant) = match live {
                        Some(Entry {
                            payload: Some(first),
                            ..
                        }) if payload.is_some_and(|given| given != *first) => ("conflict", None),
                        Some(Entry {
                            state: State::Processing { until: held, .. },
                            ..
                        }) if now < *held => ("inflight", None),
                        Some(Entry {
                            state: State::Completed { .. },
                            ..
                        }) => ("done", None),
                        Some(Entry {
                            state: State::Processing { .. },
                            expires,
                            ..
                        }) => ("took_over", Some(*expires)),
                        Some(entry) => ("acquired", Some(entry.expires)),
                        None => ("acquired", Some(now)),
                    };
                    let got = store
                        .claim_with_fingerprint(
                            &key(&key_name(*k)),
                            partition,
                            Duration::from_secs(*lease),
                            payload.map(payload_fingerprint),
                        )
                        .await
                        .expect("claim");
                    match (&got, expected) {
                        (Claim::Acquired(lease), "acquired")
                        | (Claim::TookOver(lease), "took_over") => {
                            assert_eq!(lease.until_ms, until, "step {step}");
                            model.entries.insert(
                                *k,
                                Entry {
                                    state: State::Processing { holder, until },
                                    expires: grant.unwrap_or(now),
                                    payload: kept.or(*payload),
                                },
                            );
                            leases.push((*lease, *k));
                        }
                        (Claim::InFlight { until_ms }, "inflight") => {
                            let Some(Entry {
                                state: State::Processing { until: held, .. },
                                ..
                            }) = model.entries.get(k)
                            else {
                                unreachable!()
                            };
                            assert_eq!(until_ms, held, "step {step}");
                        }
                        (Claim::Done { outcome }, "done") => {
                            let Some(Entry {
                                state: State::Completed { outcome: stored },
                                ..
                            }) = model.entries.get(k)
                            else {
                                unreachable!()
                            };
                            assert_eq!(outcome, stored, "step {step}");
                        }
                        (Claim::Conflict, "conflict") => {}
                        _ => panic!("step {step}: {op:?}: store said {got:?}, model {expected}"),
                    }
                }
                Op::Renew { lease, extend }
                | Op::Complete {
                    lease,
                    retention: extend,
                    ..
                } if leases.is_empty() => {
                    let _ = (lease, extend);
                }
                Op::Release { .. } if leases.is_empty() => {}
                Op::Renew { lease, extend } => {
                    let index = lease % leases.len();
                    let (lease, k) = leases[index];
                    let holds = holds(&model, k, index, now);
                    let got = store
                        .renew(&lease, Duration::from_secs(*extend))
                        .await
                        .expect("renew");
                    assert_eq!(got == FenceCheck::Accepted, holds, "step {step}: {op:?}");
                    if holds && let Some(entry) = model.entries.get_mut(&k) {
                        entry.state = State::Processing {
                            holder: index,
                            until: now + ms(*extend),
                        };
                    }
                }
                Op::Complete {
                    lease,
                    retention,
                    outcome,
                } => {
                    let index = lease % leases.len();
                    let (lease, k) = leases[index];
                    let holds = holds(&model, k, index, now);
                    let stored = outcome.then(|| Bytes::from(format!("outcome-{step}")));
                    let got = store
                        .complete(&lease, Duration::from_secs(*retention), stored.clone())
                        .await
                        .expect("complete");
                    assert_eq!(got == FenceCheck::Accepted, holds, "step {step}: {op:?}");
                    if holds && let Some(entry) = model.entries.get_mut(&k) {
                        entry.state = State::Completed { outcome: stored };
                        entry.expires = now + ms(*retention);
                    }
                }
                Op::Release { lease } => {
                    let index = lease % leases.len();
                    let (lease, k) = leases[index];
                    let holds = holds(&model, k, index, now);
                    let got = store.release(&lease).await.expect("release");
                    assert_eq!(got == FenceCheck::Accepted, holds, "step {step}: {op:?}");
                    if holds && let Some(entry) = model.entries.get_mut(&k) {
                        entry.state = State::Pending;
                    }
                }
                Op::Advance { secs } => clock.advance_ms(ms(*secs)),
                Op::Lookup { key: k } => {
                    let got = store
                        .record(&key(&key_name(*k)), partition)
                        .await
                        .expect("record");
                    let expected = model.entries.get(k).filter(|e| e.live(now));
                    match (got, expected) {
                        (None, None) => {}
                        (Some(record), Some(entry)) => {
                            assert_eq!(
                                record.expires_at_ms, entry.expires,
                                "step {step}: expiry of key {k}"
                            );
                            assert_eq!(
                                record.fingerprint,
                                entry.payload.map(payload_fingerprint),
                                "step {step}: fingerprint of key {k}"
                            );
                            match (&record.state, &entry.state) {
                                (RecordState::Pending, State::Pending) => {}
                                (
                                    RecordState::Processing {
                                        token,
                                        lease_until_ms,
                                    },
                                    State::Processing { holder, until },
                                ) => {
                                    assert_eq!(*token, leases[*holder].0.token, "step {step}");
                                    assert_eq!(lease_until_ms, until, "step {step}");
                                }
                                (
                                    RecordState::Completed { outcome },
                                    State::Completed { outcome: stored },
                                ) => {
                                    assert_eq!(outcome, stored, "step {step}");
                                }
                                (got, expected) => panic!(
                                    "step {step}: key {k} is {got:?} in the store, {expected:?} in the model"
                                ),
                            }
                        }
                        (got, expected) => {
                            panic!("step {step}: key {k}: store {got:?}, model {expected:?}")
                        }
                    }
                }
            }
        }
    });
}

/// Whether lease number `index` is the current holder of key `k` in the model. The holder stays
/// the holder after its lease ran out until someone takes over (the store decides, not clocks),
/// as long as the record is live at all.
fn holds(model: &Model, k: u8, index: usize, now: u64) -> bool {
    matches!(model.entries.get(&k), Some(entry @ Entry { state: State::Processing { holder, .. }, .. })
        if *holder == index && entry.live(now))
}

/// The fingerprint of model payload number `n`.
fn payload_fingerprint(n: u8) -> Fingerprint {
    Fingerprint::of(format!("model-payload-{n}").as_bytes())
}

fn clock_now(clock: &ManualClock) -> u64 {
    use oncegate_core::Clock;
    clock.now_ms()
}
