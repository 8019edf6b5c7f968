//! Pacing one receiver's sends from this gateway: one at a time, each started at least a
//! spacing after the previous one's answer, replies and mentions first. A rate budget grants
//! a send at the gateway, but the platform counts arrivals: a send delayed after its grant (a
//! loaded machine, the network) lands next to the one after it and is refused. A send that
//! starts only after the previous one was answered arrives at least a spacing after it,
//! however late either was.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncegate_core::KeyHash;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::api::budget::Lane;

/// Receivers kept beyond which idle ones are forgotten.
const KEPT: usize = 4096;

/// One receiver's turn-taking.
struct Receiver {
    busy: bool,
    /// When the next send may start: a spacing after the last answer.
    next_at: Instant,
    high: VecDeque<oneshot::Sender<Turn>>,
    bulk: VecDeque<oneshot::Sender<Turn>>,
}

impl Receiver {
    fn idle(&self, now: Instant) -> bool {
        !self.busy && self.next_at <= now && self.high.is_empty() && self.bulk.is_empty()
    }
}

/// Every paced receiver of this gateway.
#[derive(Default)]
pub(crate) struct Pacer {
    receivers: Mutex<HashMap<KeyHash, Receiver>>,
}

/// A receiver is this send's until dropped; then the next waiting send's.
pub(crate) struct Turn {
    pacer: Arc<Pacer>,
    receiver: KeyHash,
    spacing: Duration,
    /// False once handed on (or for a turn that came back undelivered).
    armed: bool,
}

/// The turn did not come before the send's deadline.
pub(crate) struct TooLate(pub(crate) Duration);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pacer {
    /// Waits for `receiver`'s turn until `deadline`, in `lane`.
    pub(crate) async fn turn(
        self: &Arc<Self>,
        receiver: KeyHash,
        spacing: Duration,
        lane: Lane,
        deadline: Instant,
    ) -> Result<Turn, TooLate> {
        let (waiting, ahead) = {
            let mut receivers = lock(&self.receivers);
            let now = Instant::now();
            if receivers.len() >= KEPT {
                receivers.retain(|_, r| !r.idle(now));
            }
            let entry = receivers.entry(receiver).or_insert_with(|| Receiver {
                busy: false,
                next_at: now,
                high: VecDeque::new(),
                bulk: VecDeque::new(),
            });
            if !entry.busy && entry.high.is_empty() && entry.bulk.is_empty() {
                entry.busy = true;
                return Ok(Turn {
                    pacer: self.clone(),
                    receiver,
                    spacing,
                    armed: true,
                });
            }
            let (tx, rx) = oneshot::channel();
            let ahead = entry.high.len()
                + if lane == Lane::Bulk {
                    entry.bulk.len()
                } else {
                    0
                };
            match lane {
                Lane::High => entry.high.push_back(tx),
                Lane::Bulk => entry.bulk.push_back(tx),
            }
            (rx, ahead)
        };
        match tokio::time::timeout_at(deadline, waiting).await {
            Ok(Ok(turn)) => Ok(turn),
            // Dropping the receiver hands on a turn that was sent to it meanwhile.
            _ => Err(TooLate(spacing * (ahead as u32 + 1))),
        }
    }
}

impl Turn {
    /// Waits until the receiver may be sent to again, unless that is past `deadline`.
    pub(crate) async fn ready(&self, deadline: Instant) -> Result<(), TooLate> {
        let next_at = lock(&self.pacer.receivers)
            .get(&self.receiver)
            .map_or_else(Instant::now, |r| r.next_at);
        if next_at > deadline {
            return Err(TooLate(next_at - Instant::now()));
        }
        tokio::time::sleep_until(next_at).await;
        Ok(())
    }

    /// The platform answered (or the call ended without one): the next send starts a spacing
    /// from now.
    pub(crate) fn answered(&self) {
        if let Some(receiver) = lock(&self.pacer.receivers).get_mut(&self.receiver) {
            receiver.next_at = Instant::now() + self.spacing;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut receivers = lock(&self.pacer.receivers);
        let Some(receiver) = receivers.get_mut(&self.receiver) else {
            return;
        };
        while let Some(next) = receiver
            .high
            .pop_front()
            .or_else(|| receiver.bulk.pop_front())
        {
            let handed = Turn {
                pacer: self.pacer.clone(),
                receiver: self.receiver,
                spacing: self.spacing,
                armed: true,
            };
            match next.send(handed) {
                Ok(()) => return,
                // That send gave up waiting: the turn comes back unused, to the one after it.
                Err(mut back) => back.armed = false,
            }
        }
        receiver.busy = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const SPACING: Duration = Duration::from_millis(5);

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_at_a_time_each_a_spacing_after_the_last_answer() {
        let pacer = Arc::new(Pacer::default());
        let receiver = KeyHash::of(&["oc_chat"]);
        let running = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..40)
            .map(|n| {
                let (pacer, running, log) = (pacer.clone(), running.clone(), log.clone());
                tokio::spawn(async move {
                    let lane = if n % 3 == 0 { Lane::High } else { Lane::Bulk };
                    let Ok(turn) = pacer.turn(receiver, SPACING, lane, far()).await else {
                        panic!("a far deadline is met");
                    };
                    assert!(turn.ready(far()).await.is_ok());
                    let started = Instant::now();
                    assert_eq!(running.fetch_add(1, Ordering::SeqCst), 0, "one at a time");
                    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..3000))).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    turn.answered();
                    log.lock().expect("log").push((started, Instant::now()));
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        let mut log = log.lock().expect("log").clone();
        log.sort();
        assert_eq!(log.len(), 40);
        for pair in log.windows(2) {
            let (answered, next) = (pair[0].1, pair[1].0);
            assert!(
                next >= answered + SPACING,
                "started {:?} after the previous answer",
                next.saturating_duration_since(answered)
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replies_go_before_waiting_bulk_sends() {
        let pacer = Arc::new(Pacer::default());
        let receiver = KeyHash::of(&["oc_chat"]);
        let first = pacer.turn(receiver, SPACING, Lane::Bulk, far()).await;
        let Ok(first) = first else {
            panic!("an idle receiver's turn is free")
        };
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (n, lane) in [
            (0, Lane::Bulk),
            (1, Lane::Bulk),
            (2, Lane::Bulk),
            (3, Lane::High),
        ] {
            let (pacer, order) = (pacer.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let Ok(turn) = pacer.turn(receiver, SPACING, lane, far()).await else {
                    panic!("a far deadline is met");
                };
                order.lock().expect("order").push(n);
                drop(turn);
            }));
            // Queued in this order.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(first);
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(*order.lock().expect("order"), vec![3, 0, 1, 2]);
    }

    /// A send that gives up waiting at the moment the turn is handed to it must not take the
    /// turn with it: every patient send still gets its turn, over many racing rounds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_send_that_gives_up_never_strands_the_turn() {
        for round in 0..60 {
            let pacer = Arc::new(Pacer::default());
            let receiver = KeyHash::of(&["oc_race", &round.to_string()]);
            let served = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..24)
                .map(|n| {
                    let (pacer, served) = (pacer.clone(), served.clone());
                    tokio::spawn(async move {
                        let patient = n % 4 == 0;
                        let deadline = if patient {
                            far()
                        } else {
                            Instant::now() + Duration::from_micros(fastrand::u64(0..1500))
                        };
                        let lane = if n % 2 == 0 { Lane::High } else { Lane::Bulk };
                        match pacer.turn(receiver, Duration::ZERO, lane, deadline).await {
                            Ok(turn) => {
                                tokio::time::sleep(Duration::from_micros(fastrand::u64(0..300)))
                                    .await;
                                served.fetch_add(1, Ordering::SeqCst);
                                drop(turn);
                                true
                            }
                            Err(TooLate(_)) => {
                                assert!(!patient, "a patient send always gets its turn");
                                false
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                let joined = tokio::time::timeout(Duration::from_secs(10), task).await;
                assert!(joined.is_ok(), "round {round}: a turn was stranded");
            }
            assert!(served.load(Ordering::SeqCst) >= 6, "the patient ones ran");
            let receivers = lock(&pacer.receivers);
            let left = receivers.get(&receiver).expect("kept until idle");
            assert!(!left.busy, "round {round}: the turn came back");
        }
    }
}
