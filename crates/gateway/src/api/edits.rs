//! Edits of one message (a streaming card edits one message many times) go one at a time, and
//! the latest wins: an edit still waiting when a newer one arrives is not sent at all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One edited message's turn-taking.
#[derive(Default)]
struct Slot {
    newest: AtomicU64,
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// Every message being edited through this gateway.
#[derive(Default)]
pub(crate) struct Edits {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Edits that have taken their place in line, for tests to order arrivals.
    #[cfg(test)]
    arrived: AtomicU64,
}

/// An edit's turn: the message is this edit's until dropped.
pub(crate) struct Turn<'a> {
    edits: &'a Edits,
    message: String,
    slot: Arc<Slot>,
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut slots = self.edits.slots.lock().unwrap_or_else(|p| p.into_inner());
        // Only the map and this turn hold it: nobody waits, the slot can go.
        if Arc::strong_count(&self.slot) == 2 {
            slots.remove(&self.message);
        }
    }
}

impl Edits {
    /// Waits for `message`'s turn; `None` when a newer edit of it arrived meanwhile (this one
    /// is superseded and must not be sent).
    pub(crate) async fn turn(&self, message: &str) -> Option<Turn<'_>> {
        let (slot, mine) = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let slot = slots.entry(message.to_owned()).or_default().clone();
            let mine = slot.newest.fetch_add(1, Ordering::SeqCst) + 1;
            #[cfg(test)]
            self.arrived.fetch_add(1, Ordering::SeqCst);
            (slot, mine)
        };
        let held = slot.turn.clone().lock_owned().await;
        if slot.newest.load(Ordering::SeqCst) > mine {
            drop(held);
            self.release(message, &slot);
            return None;
        }
        Some(Turn {
            edits: self,
            message: message.to_owned(),
            slot,
            _held: held,
        })
    }

    fn release(&self, message: &str, slot: &Arc<Slot>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(slot) == 2 {
            slots.remove(message);
        }
    }

    /// Messages with edits waiting or running.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_at_a_time_and_the_latest_wins() {
        let edits = Arc::new(Edits::default());
        let running = Arc::new(AtomicU64::new(0));
        let applied = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for n in 0..20u64 {
            let (edits_n, running, applied) = (edits.clone(), running.clone(), applied.clone());
            tasks.push(tokio::spawn(async move {
                let Some(turn) = edits_n.turn("om_card").await else {
                    return false;
                };
                assert_eq!(running.fetch_add(1, Ordering::SeqCst), 0, "one at a time");
                tokio::time::sleep(Duration::from_millis(15)).await;
                applied.lock().expect("lock").push(n);
                running.fetch_sub(1, Ordering::SeqCst);
                drop(turn);
                true
            }));
            // Edit n is in line before n + 1 comes, however the machine schedules them, and
            // arrivals fall at varied points of the running edits.
            while edits.arrived.load(Ordering::SeqCst) <= n {
                tokio::task::yield_now().await;
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..6))).await;
        }
        let mut ran = 0;
        for task in tasks {
            if task.await.expect("join") {
                ran += 1;
            }
        }
        let applied = applied.lock().expect("lock").clone();
        assert_eq!(
            applied.last(),
            Some(&19),
            "the latest edit is the last applied"
        );
        assert!(
            applied.windows(2).all(|w| w[0] < w[1]),
            "in order: {applied:?}"
        );
        assert!(ran < 20, "waiting edits were superseded: {applied:?}");
        assert_eq!(edits.len(), 0, "nothing kept once done");
    }
}
