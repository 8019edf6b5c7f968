//! The order of one queue partition: a FIFO chain per order key, the chains' heads sorted by
//! queue position, and the heads again by the group they belong to (a tenant), so that a hand-out
//! goes first to the group with the fewest events handed out — the quiet before the noisy, and
//! between groups equally busy the oldest head first. Handing out, acking and retrying cost
//! O(log n) however long the chains are and however many groups wait, and only a chain's head
//! can ever be handed out, so per-key order holds by construction, whatever the groups.
//!
//! Within a group, heads marked first ([`mark_first`](PartitionIndex::mark_first): an event
//! that @-mentions the bot) go before the group's other waiting heads, oldest first among
//! them; a marked event that is not its chain's head still waits for the events before it.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::passthrough::BuildPassThrough;
use crate::record::QueuedState;

#[derive(Debug, Default)]
struct Chain {
    /// Each event, in queue order.
    seqs: VecDeque<Entry>,
    /// The head may not go out before this time (a retry's backoff).
    not_before_ms: u64,
    /// The head is handed out.
    in_flight: bool,
    /// The group its events belong to.
    group: u64,
}

/// One event of a chain.
#[derive(Debug, Clone, Copy)]
struct Entry {
    seq: u64,
    /// Its payload's bytes.
    bytes: u32,
    /// It goes before its group's other waiting heads once it is its chain's head.
    first: bool,
}

/// One group's chains: the heads waiting, and how many are handed out.
#[derive(Debug, Default)]
struct Group {
    /// (head seq, order hash) of the group's chains whose head is not handed out.
    waiting: BTreeSet<(u64, u64)>,
    /// The part of `waiting` whose heads are marked first.
    first: BTreeSet<(u64, u64)>,
    /// Heads handed out.
    in_flight: u32,
    /// Events of the group in the partition, handed out or not.
    events: u64,
}

/// The hand-out order of one partition.
#[derive(Debug, Default)]
pub struct PartitionIndex {
    chains: HashMap<u64, Chain, BuildPassThrough>,
    /// (head seq, order hash) of every chain whose head is not handed out.
    waiting: BTreeSet<(u64, u64)>,
    /// seq → order hash of handed-out heads.
    in_flight: HashMap<u64, u64, BuildPassThrough>,
    /// The groups with events, by group hash.
    groups: HashMap<u64, Group, BuildPassThrough>,
    /// (heads handed out, oldest waiting head, group) of every group with a waiting head: the
    /// order in which groups are offered a hand-out.
    turns: BTreeSet<(u32, u64, u64)>,
    /// Events in every chain.
    events: u64,
    /// Their payloads' bytes.
    bytes: u64,
}

impl PartitionIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `seq` (larger than every seq pushed before), whose payload has `bytes`, to the
    /// chain of `order_hash`, a chain of its own group: hand-outs in queue order.
    pub fn push(&mut self, seq: u64, order_hash: u64, not_before_ms: u64, bytes: usize) {
        self.push_in(seq, order_hash, order_hash, not_before_ms, bytes);
    }

    /// Appends `seq` (larger than every seq pushed before), whose payload has `bytes`, to the
    /// chain of `order_hash` in `group` (a tenant: every event of a chain is of one group).
    pub fn push_in(
        &mut self,
        seq: u64,
        order_hash: u64,
        group: u64,
        not_before_ms: u64,
        bytes: usize,
    ) {
        let place = Place {
            order_hash,
            group,
            first: false,
        };
        self.push_at(seq, place, not_before_ms, bytes);
    }

    /// Appends `seq` (larger than every seq pushed before), whose payload has `bytes`, where
    /// `place` says: its chain, its group, and whether it goes before the group's other waiting
    /// heads (as [`mark_first`](Self::mark_first) marks it).
    pub fn push_at(&mut self, seq: u64, place: Place, not_before_ms: u64, bytes: usize) {
        let Place {
            order_hash,
            group,
            first,
        } = place;
        let chain = self.chains.entry(order_hash).or_insert_with(|| Chain {
            group,
            ..Chain::default()
        });
        let head = chain.seqs.is_empty();
        if head {
            chain.not_before_ms = not_before_ms;
            chain.group = group;
        }
        let group = chain.group;
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        chain.seqs.push_back(Entry { seq, bytes, first });
        self.events += 1;
        self.bytes += u64::from(bytes);
        if head {
            self.wait(group, seq, order_hash);
        }
        // The group exists now: its chain has this event. Its turn does not count events.
        if let Some(state) = self.groups.get_mut(&group) {
            state.events += 1;
        }
    }

    /// Marks the event `seq` of the chain `order_hash` to go before its group's other waiting
    /// heads (once it is its chain's head: never before an earlier event of its chain);
    /// `false` when the index does not hold it.
    pub fn mark_first(&mut self, seq: u64, order_hash: u64) -> bool {
        let Some(chain) = self.chains.get_mut(&order_hash) else {
            return false;
        };
        // A chain's seqs ascend: found in O(log n), whether the event just joined (a new
        // admission) or waits deep in a long chat (ranked again at start).
        let Ok(at) = chain.seqs.binary_search_by_key(&seq, |entry| entry.seq) else {
            return false;
        };
        if let Some(entry) = chain.seqs.get_mut(at) {
            entry.first = true;
        }
        if at == 0 && !chain.in_flight {
            let group = chain.group;
            if let Some(state) = self.groups.get_mut(&group) {
                state.first.insert((seq, order_hash));
            }
        }
        true
    }

    /// Events of `group` in the partition, handed out or not: a tenant's share of the queue.
    pub fn group_events(&self, group: u64) -> u64 {
        self.groups.get(&group).map_or(0, |state| state.events)
    }

    /// Each group with events in the partition, and how many (handed out or not): what a
    /// shared store publishes for the gateways that do not own the partition.
    pub fn group_counts(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.groups
            .iter()
            .filter(|(_, state)| state.events > 0)
            .map(|(group, state)| (*group, state.events))
    }

    /// The key of `group`'s turn as it stands, if it has a waiting head.
    fn turn(&self, group: u64) -> Option<(u32, u64, u64)> {
        let state = self.groups.get(&group)?;
        let &(head, _) = state.waiting.first()?;
        Some((state.in_flight, head, group))
    }

    /// Changes `group` by `change`, keeping its turn and the group table current.
    fn change_group(&mut self, group: u64, change: impl FnOnce(&mut Group)) {
        if let Some(turn) = self.turn(group) {
            self.turns.remove(&turn);
        }
        let state = self.groups.entry(group).or_default();
        change(state);
        if state.waiting.is_empty() && state.in_flight == 0 && state.events == 0 {
            self.groups.remove(&group);
        } else if let Some(turn) = self.turn(group) {
            self.turns.insert(turn);
        }
    }

    /// The head `seq` of chain `order` waits (again) in `group`.
    fn wait(&mut self, group: u64, seq: u64, order: u64) {
        let first = self
            .chains
            .get(&order)
            .and_then(|chain| chain.seqs.front())
            .is_some_and(|entry| entry.seq == seq && entry.first);
        self.waiting.insert((seq, order));
        self.change_group(group, |state| {
            state.waiting.insert((seq, order));
            if first {
                state.first.insert((seq, order));
            }
        });
    }

    /// Marks up to `max` heads that may go out at `now_ms` as handed out: each to the group
    /// with the fewest handed out (the oldest head first among equals), its oldest ready head.
    pub fn take_ready(&mut self, now_ms: u64, max: usize) -> Vec<u64> {
        self.take_ranked(now_ms, max, &Unranked)
    }

    /// [`take_ready`](Self::take_ready), each hand-out to the group `load` finds least busy
    /// across the whole dispatcher (a partition sees only its own share of a tenant's events
    /// out): the group with the lowest load among those with a head ready (this partition's
    /// least busy, then its oldest head, first among equals), never one `load` holds back.
    pub fn take_ranked(&mut self, now_ms: u64, max: usize, load: &dyn GroupLoad) -> Vec<u64> {
        let mut out = Vec::new();
        // What this call handed out already, by group: part of each group's load.
        let mut taken: Vec<(u64, u32)> = Vec::new();
        while out.len() < max {
            let extra = |group: u64| {
                taken
                    .iter()
                    .find(|(g, _)| *g == group)
                    .map_or(0, |(_, n)| *n)
            };
            let Some((group, seq, order)) = self.best(now_ms, load, extra) else {
                break;
            };
            self.change_group(group, |state| {
                state.waiting.remove(&(seq, order));
                state.first.remove(&(seq, order));
                state.in_flight += 1;
            });
            self.waiting.remove(&(seq, order));
            self.in_flight.insert(seq, order);
            if let Some(chain) = self.chains.get_mut(&order) {
                chain.in_flight = true;
            }
            match taken.iter_mut().find(|(g, _)| *g == group) {
                Some((_, n)) => *n += 1,
                None => taken.push((group, 1)),
            }
            out.push(seq);
        }
        out
    }

    /// The group whose head [`take_ranked`](Self::take_ranked) would hand out next at
    /// `now_ms`, and whether that head is marked first, without handing it out: what a
    /// dispatcher ranks a partition by.
    pub fn next_group(&self, now_ms: u64, load: &dyn GroupLoad) -> Option<Next> {
        self.best(now_ms, load, |_| 0)
            .map(|(group, seq, order)| Next {
                group,
                first: self
                    .groups
                    .get(&group)
                    .is_some_and(|state| state.first.contains(&(seq, order))),
            })
    }

    /// The group, head seq and chain of the best ready head at `now_ms`: groups are visited in
    /// their turn order (fewest out here, oldest head); a group's `load` (plus `extra`) is at
    /// least its count out here, so the visit ends at the first group whose count out here
    /// reaches the best load found, or after `RANK_SCAN` groups once one is found.
    fn best(
        &self,
        now_ms: u64,
        load: &dyn GroupLoad,
        extra: impl Fn(u64) -> u32,
    ) -> Option<(u64, u64, u64)> {
        let mut best: Option<(u32, u64, (u64, u64))> = None;
        for (visited, &(here, _, group)) in self.turns.iter().enumerate() {
            if let Some((rank, ..)) = best
                && (here >= rank || visited >= RANK_SCAN)
            {
                break;
            }
            let Some(rank) = load.load(group) else {
                continue;
            };
            let rank = rank.saturating_add(extra(group));
            if load.cap().is_some_and(|cap| rank >= cap) {
                continue;
            }
            let rank = rank.max(here);
            let Some(head) = self.ready_head(group, now_ms) else {
                continue;
            };
            if best.is_none_or(|(known, ..)| rank < known) {
                best = Some((rank, group, head));
            }
        }
        best.map(|(_, group, (seq, order))| (group, seq, order))
    }

    /// `group`'s oldest waiting head that may go out at `now_ms` (not waiting for a retry),
    /// the oldest marked first before every other.
    fn ready_head(&self, group: u64, now_ms: u64) -> Option<(u64, u64)> {
        let state = self.groups.get(&group)?;
        let ready = |&(_, order): &(u64, u64)| {
            self.chains
                .get(&order)
                .is_some_and(|chain| chain.not_before_ms <= now_ms)
        };
        let first = state.first.iter().copied().find(ready);
        first.or_else(|| state.waiting.iter().copied().find(ready))
    }

    /// Whether `seq` is handed out.
    pub fn is_in_flight(&self, seq: u64) -> bool {
        self.in_flight.contains_key(&seq)
    }

    /// Puts a handed-out head back, to go out again at `not_before_ms`.
    pub fn retry(&mut self, seq: u64, not_before_ms: u64) -> bool {
        let Some(order) = self.in_flight.remove(&seq) else {
            return false;
        };
        let Some(chain) = self.chains.get_mut(&order) else {
            return true;
        };
        chain.in_flight = false;
        chain.not_before_ms = not_before_ms;
        let group = chain.group;
        self.change_group(group, |state| {
            state.in_flight = state.in_flight.saturating_sub(1)
        });
        self.wait(group, seq, order);
        true
    }

    /// Removes a handed-out head (acked or dead-lettered); the next of its chain may go out.
    pub fn remove(&mut self, seq: u64) -> bool {
        let Some(order) = self.in_flight.remove(&seq) else {
            return false;
        };
        let Some(chain) = self.chains.get_mut(&order) else {
            return true;
        };
        let popped = chain.seqs.pop_front().map(|entry| {
            self.events -= 1;
            self.bytes -= u64::from(entry.bytes);
        });
        chain.in_flight = false;
        chain.not_before_ms = 0;
        let group = chain.group;
        let next = chain.seqs.front().map(|entry| entry.seq);
        if next.is_none() {
            self.chains.remove(&order);
        }
        self.change_group(group, |state| {
            state.in_flight = state.in_flight.saturating_sub(1);
            if popped.is_some() {
                state.events = state.events.saturating_sub(1);
            }
        });
        if let Some(next) = next {
            self.wait(group, next, order);
        }
        true
    }

    /// Events in the partition, handed out or not.
    pub fn len(&self) -> usize {
        usize::try_from(self.events).unwrap_or(usize::MAX)
    }

    /// The payload bytes of the partition's events.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The smallest seq in the partition (the oldest event), handed out or not.
    pub fn oldest(&self) -> Option<u64> {
        let waiting = self.waiting.first().map(|&(seq, _)| seq);
        let handed_out = self.in_flight.keys().copied().min();
        match (waiting, handed_out) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The first `limit` seqs above `after` (all when `None`), in queue order: O(events), for
    /// operators' listings.
    pub fn seqs_after(&self, after: Option<u64>, limit: usize) -> Vec<u64> {
        let mut seqs: Vec<u64> = self
            .chains
            .values()
            .flat_map(|chain| chain.seqs.iter().map(|entry| entry.seq))
            .filter(|&seq| after.is_none_or(|after| seq > after))
            .collect();
        if seqs.len() > limit {
            seqs.select_nth_unstable(limit);
            seqs.truncate(limit);
        }
        seqs.sort_unstable();
        seqs
    }

    /// Where event `seq` of the chain `order_hash` stands at `now_ms`; `None` when the index
    /// does not hold it.
    pub fn state(&self, seq: u64, order_hash: u64, now_ms: u64) -> Option<QueuedState> {
        if self.in_flight.contains_key(&seq) {
            return Some(QueuedState::HandedOut);
        }
        let chain = self.chains.get(&order_hash)?;
        match chain.seqs.front() {
            Some(entry) if entry.seq == seq && chain.not_before_ms > now_ms => {
                Some(QueuedState::Delayed {
                    until_ms: chain.not_before_ms,
                })
            }
            Some(_) => Some(QueuedState::Waiting),
            None => None,
        }
    }

    /// Whether the partition is empty.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// Handed-out events.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

/// Where an event joins a partition's hand-out order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Its chain ([`Event::order_hash`](crate::Event::order_hash)).
    pub order_hash: u64,
    /// Its group ([`Event::group_hash`](crate::Event::group_hash)).
    pub group: u64,
    /// It goes before its group's other waiting heads once it is its chain's head.
    pub first: bool,
}

impl Place {
    /// Where `event` joins, ranked by `rule`.
    pub fn of(event: &crate::Event, rule: &crate::FirstRule) -> Self {
        Self {
            order_hash: event.order_hash(),
            group: event.group_hash(),
            first: rule.first(event),
        }
    }
}

/// What a ranked hand-out of a partition would serve next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next {
    /// The group (tenant) of the event.
    pub group: u64,
    /// The event is marked to go before its group's other waiting events
    /// ([`PartitionIndex::mark_first`]): a dispatcher serves it before the group's other
    /// partitions.
    pub first: bool,
}

impl Next {
    /// Something of `group`, not marked first.
    pub fn of(group: u64) -> Self {
        Self {
            group,
            first: false,
        }
    }
}

/// How busy each group (tenant) is across a whole dispatcher, which a partition's own count of
/// events out does not see: a tenant flooding every partition has a few out in each.
pub trait GroupLoad: Send + Sync {
    /// The handlers running now for `group` (at least the events of it handed out and not yet
    /// settled), or `None` while the group may have no more (it is at its cap).
    fn load(&self, group: u64) -> Option<u32>;

    /// The most handlers one group may have (`None`: no cap): a pull hands a group out no
    /// more events than its load leaves room for.
    fn cap(&self) -> Option<u32> {
        None
    }
}

/// No load beyond each partition's own: each partition's least busy group first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unranked;

impl GroupLoad for Unranked {
    fn load(&self, _group: u64) -> Option<u32> {
        Some(0)
    }
}

/// Groups visited at most, once a ready one is found, to pick the least loaded: a partition
/// with thousands of tenants waiting costs a bounded scan per hand-out.
const RANK_SCAN: usize = 64;

#[cfg(test)]
mod tests;
