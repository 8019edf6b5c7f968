//! Reassembly of messages Feishu splits over several frames (`message_id`, `sum`, `seq`), in
//! any order, within bounds on how many wait, how many bytes they hold and how long.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

/// The bounds of one connection's pending fragments.
#[derive(Debug, Clone, Copy)]
pub struct FragmentLimits {
    /// Messages waiting for parts at once.
    pub max_messages: usize,
    /// Bytes held by waiting parts, over all messages.
    pub max_bytes: usize,
    /// Parts one message may have.
    pub max_parts: u64,
    /// How long a message may wait for its last part.
    pub max_age: Duration,
}

impl Default for FragmentLimits {
    fn default() -> Self {
        Self {
            max_messages: 256,
            max_bytes: 8 << 20,
            max_parts: 64,
            // The SDKs keep parts for 5 s (Go, Python) to 5 min (Java); a part later than half
            // a minute belongs to a message Feishu resends anyway.
            max_age: Duration::from_secs(30),
        }
    }
}

/// What one part did.
#[derive(Debug, PartialEq, Eq)]
pub enum Part {
    /// The message is whole: its parts in order.
    Complete(Bytes),
    /// More parts are due.
    Pending,
    /// The part cannot be used; the message (if any) is not kept.
    Refused(&'static str),
}

struct Partial {
    parts: Vec<Option<Bytes>>,
    missing: usize,
    bytes: usize,
    since: Instant,
}

/// The pending messages of one connection.
pub struct Fragments {
    limits: FragmentLimits,
    pending: HashMap<String, Partial>,
    bytes: usize,
    dropped: u64,
}

impl Fragments {
    /// No message pending.
    pub fn new(limits: FragmentLimits) -> Self {
        Self {
            limits,
            pending: HashMap::new(),
            bytes: 0,
            dropped: 0,
        }
    }

    /// Incomplete messages given up so far (too old, or pushed out by the bounds).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Messages waiting for parts.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes part `seq` of `sum` of message `id`.
    pub fn add(&mut self, id: &str, sum: u64, seq: u64, part: Bytes, now: Instant) -> Part {
        if sum == 0 || sum > self.limits.max_parts {
            return Part::Refused("bad_sum");
        }
        if seq >= sum {
            return Part::Refused("bad_seq");
        }
        if sum == 1 {
            return Part::Complete(part);
        }
        self.expire(now);
        if part.len() > self.limits.max_bytes {
            self.forget(id);
            return Part::Refused("too_large");
        }
        if !self.pending.contains_key(id) {
            if self.pending.len() >= self.limits.max_messages {
                self.drop_oldest();
            }
            self.pending.insert(
                id.to_owned(),
                Partial {
                    parts: vec![None; sum as usize],
                    missing: sum as usize,
                    bytes: 0,
                    since: now,
                },
            );
        }
        while self.bytes + part.len() > self.limits.max_bytes {
            if !self.drop_oldest_except(id) {
                self.forget(id);
                return Part::Refused("too_large");
            }
        }
        let Some(partial) = self.pending.get_mut(id) else {
            return Part::Refused("bad_seq");
        };
        if partial.parts.len() as u64 != sum {
            // Parts of one message that disagree on their number: keep nothing of it.
            self.forget(id);
            return Part::Refused("inconsistent_sum");
        }
        let slot = &mut partial.parts[seq as usize];
        if slot.is_none() {
            partial.missing -= 1;
            partial.bytes += part.len();
            self.bytes += part.len();
        } else {
            // A repeated part: the later copy replaces the earlier one.
            let old = slot.as_ref().map_or(0, Bytes::len);
            partial.bytes = partial.bytes - old + part.len();
            self.bytes = self.bytes - old + part.len();
        }
        *slot = Some(part);
        if partial.missing > 0 {
            return Part::Pending;
        }
        let Some(partial) = self.pending.remove(id) else {
            return Part::Pending;
        };
        self.bytes -= partial.bytes;
        let mut whole = BytesMut::with_capacity(partial.bytes);
        for part in partial.parts.into_iter().flatten() {
            whole.extend_from_slice(&part);
        }
        Part::Complete(whole.freeze())
    }

    /// Gives up messages older than the age bound; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let max_age = self.limits.max_age;
        let before = self.pending.len();
        let mut freed = 0;
        self.pending.retain(|_, partial| {
            let keep = now.saturating_duration_since(partial.since) < max_age;
            if !keep {
                freed += partial.bytes;
            }
            keep
        });
        self.bytes -= freed;
        let expired = before - self.pending.len();
        self.dropped += expired as u64;
        expired
    }

    fn forget(&mut self, id: &str) {
        if let Some(partial) = self.pending.remove(id) {
            self.bytes -= partial.bytes;
            self.dropped += 1;
        }
    }

    fn drop_oldest(&mut self) {
        self.drop_oldest_except("");
    }

    /// Drops the oldest message but `keep`; false when there is none.
    fn drop_oldest_except(&mut self, keep: &str) -> bool {
        let oldest = self
            .pending
            .iter()
            .filter(|(id, _)| id.as_str() != keep || keep.is_empty())
            .min_by_key(|(_, partial)| partial.since)
            .map(|(id, _)| id.clone());
        match oldest {
            Some(id) => {
                self.forget(&id);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn limits() -> FragmentLimits {
        FragmentLimits {
            max_messages: 3,
            max_bytes: 64,
            max_parts: 8,
            max_age: Duration::from_secs(5),
        }
    }

    #[test]
    fn parts_in_any_order_make_the_message() {
        let now = Instant::now();
        let mut fragments = Fragments::new(limits());
        let part = |s: &'static str| Bytes::from_static(s.as_bytes());
        assert_eq!(fragments.add("m", 3, 2, part("c"), now), Part::Pending);
        assert_eq!(fragments.add("m", 3, 0, part("a"), now), Part::Pending);
        assert_eq!(fragments.add("m", 3, 0, part("a"), now), Part::Pending);
        assert_eq!(
            fragments.add("m", 3, 1, part("b"), now),
            Part::Complete(part("abc"))
        );
        assert_eq!(fragments.pending(), 0);
        assert_eq!(
            fragments.add("w", 1, 0, part("whole"), now),
            Part::Complete(part("whole"))
        );
        assert_eq!(
            fragments.add("x", 0, 0, part(""), now),
            Part::Refused("bad_sum")
        );
        assert_eq!(
            fragments.add("x", 9, 0, part(""), now),
            Part::Refused("bad_sum")
        );
        assert_eq!(
            fragments.add("x", 2, 2, part(""), now),
            Part::Refused("bad_seq")
        );
        assert_eq!(fragments.dropped(), 0);
    }

    #[test]
    fn old_and_excess_messages_are_dropped_and_counted() {
        let now = Instant::now();
        let mut fragments = Fragments::new(limits());
        let part = Bytes::from_static(b"0123456789");
        for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
            let at = now + Duration::from_millis(i as u64);
            assert_eq!(fragments.add(id, 2, 0, part.clone(), at), Part::Pending);
        }
        assert_eq!(
            (fragments.pending(), fragments.dropped()),
            (3, 1),
            "a made way for d"
        );
        // a's late part starts a again, and another message makes way for it.
        let at = now + Duration::from_millis(5);
        assert_eq!(fragments.add("a", 2, 1, part.clone(), at), Part::Pending);
        assert_eq!((fragments.pending(), fragments.dropped()), (3, 2));
        let later = now + Duration::from_secs(6);
        assert_eq!(fragments.expire(later), 3);
        assert_eq!((fragments.pending(), fragments.dropped()), (0, 5));
        // Bytes: 7 parts of 10 do not fit in 64 at once; the oldest messages make way.
        for (i, id) in ["p", "q", "r"].iter().enumerate() {
            fragments.add(
                id,
                3,
                0,
                part.clone(),
                later + Duration::from_millis(i as u64),
            );
            fragments.add(
                id,
                3,
                1,
                part.clone(),
                later + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(fragments.pending(), 3);
        // p's last part needs room: q, the oldest but p, makes way; p completes.
        let whole = fragments.add("p", 3, 2, part.clone(), later);
        assert_eq!(whole, Part::Complete(Bytes::from(part.repeat(3))));
        assert_eq!((fragments.pending(), fragments.dropped()), (1, 6));
        let huge = Bytes::from(vec![0; 65]);
        assert_eq!(
            fragments.add("h", 2, 0, huge, later),
            Part::Refused("too_large")
        );
    }

    proptest! {
        /// Whatever order and repeats the parts come in, the message is its parts in order,
        /// completed exactly when the last missing part arrives.
        #[test]
        fn any_order_and_repeats(
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..6), 1..8),
            order in proptest::collection::vec(0usize..64, 1..40),
        ) {
            let now = Instant::now();
            let mut fragments = Fragments::new(FragmentLimits { max_parts: 8, ..FragmentLimits::default() });
            let sum = parts.len() as u64;
            let mut seen = std::collections::HashSet::new();
            let sequence: Vec<usize> = order.iter().map(|i| i % parts.len()).chain(0..parts.len()).collect();
            let mut completed = false;
            for i in sequence {
                if completed { break; }
                seen.insert(i);
                let got = fragments.add("m", sum, i as u64, Bytes::from(parts[i].clone()), now);
                if seen.len() == parts.len() {
                    let whole: Vec<u8> = parts.concat();
                    prop_assert_eq!(got, Part::Complete(Bytes::from(whole)));
                    completed = true;
                } else {
                    prop_assert_eq!(got, Part::Pending);
                }
            }
            prop_assert!(completed);
            prop_assert_eq!(fragments.pending(), 0);
        }
    }
}
