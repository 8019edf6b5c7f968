//! The dispatcher's handlers, given out fairly between tenants: a free handler goes to the
//! partition whose next event belongs to the least busy tenant (group) of the whole
//! dispatcher, not to whichever partition asked first. A tenant flooding every partition has
//! many handlers running; a quiet tenant's one event has none, and so it goes first, wherever
//! it is queued. Between groups as busy as each other, the oldest request first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use oncegate_core::{GroupLoad, Next};
use tokio::sync::{Notify, oneshot};

/// The handlers of one dispatcher and the groups they run for.
pub(crate) struct Slots {
    state: Mutex<State>,
    /// Notified whenever a handler ends: a partition whose only ready events belong to groups
    /// at their cap looks again.
    released: Notify,
    /// The most handlers one group may have at once (`None`: all of them).
    cap: Option<u32>,
}

#[derive(Default)]
struct State {
    /// Handlers free now; while any is free, nobody waits.
    free: usize,
    /// Handlers running, by group (no entry: none).
    load: HashMap<u64, u32>,
    /// Partitions waiting for a handler, each for its next event's group.
    waiting: Vec<Waiter>,
    /// The next request's ticket: the order of requests.
    tickets: u64,
}

struct Waiter {
    ticket: u64,
    /// Its next event's group, and whether that event goes first in its group.
    next: Next,
    give: oneshot::Sender<Slot>,
}

impl State {
    fn load(&self, group: u64) -> u32 {
        self.load.get(&group).copied().unwrap_or(0)
    }
}

fn lock(slots: &Slots) -> std::sync::MutexGuard<'_, State> {
    slots
        .state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Slots {
    /// `handlers` handlers (at least one), each group at most `cap` of them.
    pub(crate) fn new(handlers: usize, cap: Option<u32>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: handlers.max(1),
                ..State::default()
            }),
            released: Notify::new(),
            cap: cap.map(|cap| cap.max(1)),
        })
    }

    /// Asks for a handler for the event `next` names: granted at once while one is free, else
    /// when one frees and its group is then the least busy of the groups waiting (within a
    /// group, an event marked first before the others, then the oldest request).
    pub(crate) fn request(self: &Arc<Self>, next: Next) -> Request {
        let group = next.group;
        let mut state = lock(self);
        let ticket = state.tickets;
        state.tickets += 1;
        let (give, take) = oneshot::channel();
        if state.free > 0 && !self.capped(&state, group) {
            state.free -= 1;
            drop(state);
            let _ = give.send(Slot::unassigned(self));
        } else {
            state.waiting.push(Waiter { ticket, next, give });
        }
        Request {
            slots: self.clone(),
            ticket,
            take,
        }
    }

    /// A handler if one is free and nobody waits for it.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let mut state = lock(self);
        if state.free == 0 || !state.waiting.is_empty() {
            return None;
        }
        state.free -= 1;
        Some(Slot::unassigned(self))
    }

    /// Waits until a handler ends.
    pub(crate) async fn released(&self) {
        self.released.notified().await;
    }

    /// Whether groups have a cap (partitions then look again when a handler ends).
    pub(crate) fn capped_groups(&self) -> bool {
        self.cap.is_some()
    }

    fn capped(&self, state: &State, group: u64) -> bool {
        self.cap.is_some_and(|cap| state.load(group) >= cap)
    }

    /// Gives free handlers to the waiting partitions, the least busy group first.
    fn grant(self: &Arc<Self>, state: &mut State) {
        while state.free > 0 {
            let best = state
                .waiting
                .iter()
                .enumerate()
                .filter(|(_, waiter)| !self.capped(state, waiter.next.group))
                .min_by_key(|(_, waiter)| {
                    let Next { group, first } = waiter.next;
                    (state.load(group), !first, waiter.ticket)
                })
                .map(|(at, _)| at);
            let Some(at) = best else { break };
            let waiter = state.waiting.swap_remove(at);
            state.free -= 1;
            if let Err(mut slot) = waiter.give.send(Slot::unassigned(self)) {
                // The partition stopped waiting: the handler is free again (its drop must not
                // run here, under the lock).
                slot.disarm();
                state.free += 1;
            }
        }
    }

    /// A handler ended (of `group`, if it was assigned one).
    fn end(self: &Arc<Self>, group: Option<u64>) {
        {
            let mut state = lock(self);
            if let Some(group) = group
                && let Some(load) = state.load.get_mut(&group)
            {
                *load -= 1;
                if *load == 0 {
                    state.load.remove(&group);
                }
            }
            state.free += 1;
            self.grant(&mut state);
        }
        self.released.notify_waiters();
    }
}

impl GroupLoad for Slots {
    fn load(&self, group: u64) -> Option<u32> {
        let state = lock(self);
        (!self.capped(&state, group)).then(|| state.load(group))
    }

    fn cap(&self) -> Option<u32> {
        self.cap
    }
}

/// A partition's wait for a handler; dropped, it waits no more (a handler granted meanwhile
/// is free again).
pub(crate) struct Request {
    slots: Arc<Slots>,
    ticket: u64,
    take: oneshot::Receiver<Slot>,
}

impl Request {
    /// The handler, once granted.
    pub(crate) async fn granted(&mut self) -> Option<Slot> {
        (&mut self.take).await.ok()
    }

    /// The partition's next event is `next` now: ranked as it from here on, keeping its place
    /// among requests.
    pub(crate) fn regroup(&self, next: Next) {
        let mut state = lock(&self.slots);
        if let Some(waiter) = state
            .waiting
            .iter_mut()
            .find(|waiter| waiter.ticket == self.ticket)
        {
            waiter.next = next;
        }
        // A group that was capped may not be.
        self.slots.grant(&mut state);
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let mut state = lock(&self.slots);
        state.waiting.retain(|waiter| waiter.ticket != self.ticket);
    }
}

/// One handler, given back when dropped.
pub(crate) struct Slot {
    slots: Option<Arc<Slots>>,
    group: Option<u64>,
}

impl Slot {
    fn unassigned(slots: &Arc<Slots>) -> Self {
        Self {
            slots: Some(slots.clone()),
            group: None,
        }
    }

    /// The handler runs an event of `group`: it counts in that group's load. `false` (and
    /// nothing changed) when the group is at its cap — another partition's pull got there
    /// first.
    pub(crate) fn assign(&mut self, group: u64) -> bool {
        let Some(slots) = &self.slots else {
            return false;
        };
        let mut state = lock(slots);
        if self.group != Some(group) && slots.capped(&state, group) {
            return false;
        }
        if let Some(old) = self.group.take()
            && let Some(load) = state.load.get_mut(&old)
        {
            *load -= 1;
            if *load == 0 {
                state.load.remove(&old);
            }
        }
        *state.load.entry(group).or_insert(0) += 1;
        self.group = Some(group);
        true
    }

    fn disarm(&mut self) {
        self.slots = None;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.end(self.group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits for `request`'s grant, failing the test after a second.
    async fn granted(request: &mut Request) -> Slot {
        tokio::time::timeout(std::time::Duration::from_secs(1), request.granted())
            .await
            .expect("granted within a second")
            .expect("a handler")
    }

    /// Whether `request` is still waiting after 20 ms.
    async fn waits(request: &mut Request) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(20), request.granted())
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_freed_handler_goes_to_the_least_busy_group_then_the_oldest_request() {
        let slots = Slots::new(2, None);
        let mut a = granted(&mut slots.request(Next::of(1))).await;
        assert!(a.assign(1));
        let mut b = granted(&mut slots.request(Next::of(1))).await;
        assert!(b.assign(1));
        // Both busy with group 1: group 1 asks first, then 2, then 3.
        let mut noisy = slots.request(Next::of(1));
        let mut quiet = slots.request(Next::of(2));
        let mut later = slots.request(Next::of(3));
        assert_eq!(slots.load(1), Some(2));
        drop(a);
        // Groups 2 and 3 have none running, 1 has one: the older of 2 and 3.
        let mut got = granted(&mut quiet).await;
        assert!(got.assign(2));
        assert!(waits(&mut later).await && waits(&mut noisy).await);
        // Groups 1 and 2 have one running, 3 none: 3 although it asked after 1.
        drop(got);
        let _later = granted(&mut later).await;
        assert!(waits(&mut noisy).await);
        drop(b);
        granted(&mut noisy).await;
    }

    #[tokio::test]
    async fn within_a_group_a_request_for_an_event_marked_first_goes_before_older_ones() {
        let slots = Slots::new(2, None);
        let mut running = granted(&mut slots.request(Next::of(1))).await;
        assert!(running.assign(1));
        let mut busy = granted(&mut slots.request(Next::of(1))).await;
        assert!(busy.assign(1));
        let mut backlog = slots.request(Next::of(1));
        let mut other = slots.request(Next::of(2));
        let mut mention = slots.request(Next {
            group: 1,
            first: true,
        });
        // Group 2 has none running: its turn first, the mention waits like its group.
        drop(running);
        let _busy = busy;
        let mut got = granted(&mut other).await;
        assert!(got.assign(2));
        assert!(waits(&mut mention).await && waits(&mut backlog).await);
        // Then group 1: the mention before the older request of its group.
        drop(got);
        let mut got = granted(&mut mention).await;
        assert!(got.assign(1));
        assert!(waits(&mut backlog).await);
        drop(got);
        granted(&mut backlog).await;
    }

    #[tokio::test]
    async fn a_group_at_its_cap_waits_while_others_pass_and_a_dropped_request_frees_its_grant() {
        let slots = Slots::new(3, Some(1));
        let mut a = granted(&mut slots.request(Next::of(1))).await;
        assert!(a.assign(1));
        assert_eq!(slots.load(1), None, "group 1 is at its cap");
        // A handler pulled for group 1 by another partition meanwhile cannot run it.
        let mut late = slots.try_take().expect("free");
        assert!(!late.assign(1));
        assert!(late.assign(5));
        drop(late);
        let mut capped = slots.request(Next::of(1));
        let mut other = slots.request(Next::of(2));
        let _other = granted(&mut other).await;
        // One handler free, but not for group 1.
        assert_eq!(lock(&slots).free, 1);
        assert!(waits(&mut capped).await);
        // Regrouped to an uncapped group, it is served at once.
        capped.regroup(Next::of(3));
        let third = granted(&mut capped).await;
        assert_eq!(lock(&slots).free, 0);
        // A request granted when a handler frees, then dropped, gives the handler back.
        let gone = slots.request(Next::of(4));
        drop(third);
        assert_eq!(lock(&slots).free, 0, "granted to the waiting request");
        drop(gone);
        assert_eq!(lock(&slots).free, 1);
        assert!(lock(&slots).waiting.is_empty());
        assert!(slots.try_take().is_some());
    }
}
