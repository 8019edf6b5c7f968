//! Expiry in O(expired records): keys sit in FIFO chunks by the order of magnitude of their
//! lifetime, and a chunk is dropped once the latest deadline in it has passed.
//!
//! Within one class, deadlines pushed later are at most about twice as far as those pushed
//! earlier, so a chunk's latest deadline is close to all of its deadlines: a record lingers at
//! most about its own lifetime past its deadline, and lookups check the deadline anyway.

use std::collections::VecDeque;

/// Keys per chunk: small enough that a chunk is always nearly full, large enough that the
/// per-chunk header costs nothing per key.
const CHUNK: usize = 256;
/// Lifetime classes: class `k` holds keys whose lifetime is below `2^(k+1)` seconds.
const CLASSES: usize = 32;

#[derive(Debug)]
struct Chunk<K> {
    latest_secs: u32,
    keys: VecDeque<K>,
}

/// The deadline index of one shard.
#[derive(Debug)]
pub(crate) struct ExpiryIndex<K> {
    classes: Vec<VecDeque<Chunk<K>>>,
}

impl<K: Copy> ExpiryIndex<K> {
    pub(crate) fn new() -> Self {
        Self {
            classes: (0..CLASSES).map(|_| VecDeque::new()).collect(),
        }
    }

    /// Notes that `key` may be forgotten at `deadline_secs`.
    pub(crate) fn push(&mut self, key: K, now_secs: u32, deadline_secs: u32) {
        let lifetime = deadline_secs.saturating_sub(now_secs).max(1);
        let class = (31 - lifetime.leading_zeros()) as usize;
        let queue = &mut self.classes[class.min(CLASSES - 1)];
        match queue.back_mut() {
            Some(chunk) if chunk.keys.len() < CHUNK => {
                chunk.keys.push_back(key);
                chunk.latest_secs = chunk.latest_secs.max(deadline_secs);
            }
            _ => {
                let mut keys = VecDeque::with_capacity(CHUNK);
                keys.push_back(key);
                queue.push_back(Chunk {
                    latest_secs: deadline_secs,
                    keys,
                });
            }
        }
    }

    /// Takes every chunk whose deadlines have all passed at `now_secs`, up to about `budget`
    /// keys, and hands each key to `visit`. Returns whether more passed chunks remain.
    pub(crate) fn drain_passed(
        &mut self,
        now_secs: u32,
        budget: usize,
        mut visit: impl FnMut(K),
    ) -> bool {
        let mut spent = 0;
        for queue in &mut self.classes {
            while let Some(front) = queue.front() {
                if front.latest_secs > now_secs {
                    break;
                }
                if spent >= budget {
                    return true;
                }
                if let Some(chunk) = queue.pop_front() {
                    spent += chunk.keys.len();
                    chunk.keys.into_iter().for_each(&mut visit);
                }
            }
        }
        false
    }

    /// Takes the key that is due soonest in the shortest-lived class, for eviction.
    pub(crate) fn pop_oldest(&mut self) -> Option<K> {
        for queue in &mut self.classes {
            while let Some(front) = queue.front_mut() {
                if front.keys.is_empty() {
                    queue.pop_front();
                    continue;
                }
                // Chunks are filled at the back, so the front key is the oldest.
                return front.keys.pop_front();
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_only_passed_chunks() {
        let mut index = ExpiryIndex::new();
        for k in 0..300u32 {
            index.push(k, 0, 10);
        }
        index.push(1000, 0, 100_000);
        let mut seen = Vec::new();
        assert!(!index.drain_passed(9, usize::MAX, |k| seen.push(k)));
        assert!(seen.is_empty());
        assert!(!index.drain_passed(10, usize::MAX, |k| seen.push(k)));
        assert_eq!(seen.len(), 300);
        assert!(!index.drain_passed(99_999, usize::MAX, |k| seen.push(k)));
        assert_eq!(seen.len(), 300);
        assert!(!index.drain_passed(100_000, usize::MAX, |k| seen.push(k)));
        assert_eq!(seen.last(), Some(&1000));
    }

    #[test]
    fn budget_leaves_work_for_later() {
        let mut index = ExpiryIndex::new();
        for k in 0..(CHUNK as u32 * 4) {
            index.push(k, 0, 5);
        }
        let mut seen = 0;
        assert!(index.drain_passed(5, CHUNK, |_| seen += 1));
        assert_eq!(seen, CHUNK);
        assert!(!index.drain_passed(5, usize::MAX, |_| seen += 1));
        assert_eq!(seen, CHUNK * 4);
        assert_eq!(index.pop_oldest(), None);
    }
}
