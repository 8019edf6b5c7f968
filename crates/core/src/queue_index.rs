//! The order of one queue partition: a FIFO chain per order key, and the chains' heads sorted
//! by queue position. Handing out, acking and retrying cost O(log n) however long the chains
//! are, and only a chain's head can ever be handed out, so per-key order holds by construction.

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::passthrough::BuildPassThrough;
use crate::record::QueuedState;

#[derive(Debug, Default)]
struct Chain {
    /// Seq and payload bytes of each event, in queue order.
    seqs: VecDeque<(u64, u32)>,
    /// The head may not go out before this time (a retry's backoff).
    not_before_ms: u64,
    /// The head is handed out.
    in_flight: bool,
}

/// The hand-out order of one partition.
#[derive(Debug, Default)]
pub struct PartitionIndex {
    chains: HashMap<u64, Chain, BuildPassThrough>,
    /// (head seq, order hash) of every chain whose head is not handed out.
    waiting: BTreeSet<(u64, u64)>,
    /// seq → order hash of handed-out heads.
    in_flight: HashMap<u64, u64, BuildPassThrough>,
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
    /// chain of `order_hash`.
    pub fn push(&mut self, seq: u64, order_hash: u64, not_before_ms: u64, bytes: usize) {
        let chain = self.chains.entry(order_hash).or_default();
        if chain.seqs.is_empty() {
            chain.not_before_ms = not_before_ms;
            self.waiting.insert((seq, order_hash));
        }
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        chain.seqs.push_back((seq, bytes));
        self.events += 1;
        self.bytes += u64::from(bytes);
    }

    /// Marks up to `max` heads that may go out at `now_ms` as handed out, in queue order.
    pub fn take_ready(&mut self, now_ms: u64, max: usize) -> Vec<u64> {
        let mut out = Vec::new();
        for &(seq, order) in &self.waiting {
            if out.len() >= max {
                break;
            }
            if self
                .chains
                .get(&order)
                .is_some_and(|chain| chain.not_before_ms <= now_ms)
            {
                out.push((seq, order));
            }
        }
        for &(seq, order) in &out {
            self.waiting.remove(&(seq, order));
            self.in_flight.insert(seq, order);
            if let Some(chain) = self.chains.get_mut(&order) {
                chain.in_flight = true;
            }
        }
        out.into_iter().map(|(seq, _)| seq).collect()
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
        if let Some(chain) = self.chains.get_mut(&order) {
            chain.in_flight = false;
            chain.not_before_ms = not_before_ms;
        }
        self.waiting.insert((seq, order));
        true
    }

    /// Removes a handed-out head (acked or dead-lettered); the next of its chain may go out.
    pub fn remove(&mut self, seq: u64) -> bool {
        let Some(order) = self.in_flight.remove(&seq) else {
            return false;
        };
        if let Some(chain) = self.chains.get_mut(&order) {
            if let Some((_, bytes)) = chain.seqs.pop_front() {
                self.events -= 1;
                self.bytes -= u64::from(bytes);
            }
            chain.in_flight = false;
            chain.not_before_ms = 0;
            match chain.seqs.front() {
                Some(&(next, _)) => {
                    self.waiting.insert((next, order));
                }
                None => {
                    self.chains.remove(&order);
                }
            }
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
            .flat_map(|chain| chain.seqs.iter().map(|&(seq, _)| seq))
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
            Some(&(head, _)) if head == seq && chain.not_before_ms > now_ms => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_go_out_in_queue_order_and_chains_wait() {
        let mut index = PartitionIndex::new();
        for (seq, order) in [(0, 1), (1, 2), (2, 1), (3, 3), (4, 2)] {
            index.push(seq, order, 0, 10 + seq as usize);
        }
        assert_eq!(
            (index.len(), index.bytes(), index.oldest()),
            (5, 60, Some(0))
        );
        assert_eq!(index.seqs_after(None, 2), vec![0, 1]);
        assert_eq!(index.seqs_after(Some(1), 10), vec![2, 3, 4]);
        assert_eq!(index.seqs_after(Some(4), 10), Vec::<u64>::new());
        assert_eq!(index.take_ready(0, 10), vec![0, 1, 3]);
        assert_eq!(index.take_ready(0, 10), Vec::<u64>::new());
        assert!(index.remove(1));
        assert!(!index.remove(1));
        assert_eq!(index.take_ready(0, 10), vec![4]);
        assert_eq!(
            (index.len(), index.bytes(), index.oldest()),
            (4, 49, Some(0))
        );
        assert!(index.retry(0, 50));
        assert_eq!(
            index.state(0, 1, 10),
            Some(QueuedState::Delayed { until_ms: 50 })
        );
        assert_eq!(index.state(2, 1, 10), Some(QueuedState::Waiting));
        assert_eq!(index.state(4, 2, 10), Some(QueuedState::HandedOut));
        assert_eq!(index.take_ready(49, 10), Vec::<u64>::new());
        assert_eq!(index.take_ready(50, 10), vec![0]);
        assert!(index.remove(0));
        assert_eq!(index.take_ready(50, 10), vec![2]);
        assert_eq!(
            (index.len(), index.bytes(), index.oldest()),
            (3, 39, Some(2))
        );
    }
}
