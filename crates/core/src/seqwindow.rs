//! A per-connection sequence-id window: a sliding bitmap, as IPsec and DTLS anti-replay windows
//! keep, so memory is fixed however long the connection lives.

/// What the window says about a sequence id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqVerdict {
    /// Not seen before; now marked.
    New,
    /// Seen before inside the window: a resent frame. Ack it, do not process it again.
    Duplicate,
    /// Older than the window reaches: the window cannot tell. Pass it on; the event-id dedup
    /// decides.
    TooOld,
}

/// A sliding window of `WORDS * 64` sequence ids below the highest seen.
#[derive(Debug, Clone)]
pub struct SeqWindow<const WORDS: usize = 16> {
    highest: Option<u64>,
    /// Bit `i` (word `i / 64`, bit `i % 64`) stands for `highest - i`.
    bits: [u64; WORDS],
}

impl<const WORDS: usize> Default for SeqWindow<WORDS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const WORDS: usize> SeqWindow<WORDS> {
    /// How many ids the window covers.
    pub const WIDTH: u64 = (WORDS as u64) * 64;

    /// An empty window.
    pub const fn new() -> Self {
        const { assert!(WORDS > 0, "a sequence window needs at least one word") };
        Self {
            highest: None,
            bits: [0; WORDS],
        }
    }

    /// Checks `seq` and marks it seen.
    pub fn check_and_mark(&mut self, seq: u64) -> SeqVerdict {
        let verdict = self.check(seq);
        if verdict != SeqVerdict::New {
            return verdict;
        }
        match self.highest {
            Some(highest) if seq <= highest => {
                let offset = highest - seq;
                self.bits[(offset / 64) as usize] |= 1 << (offset % 64);
            }
            Some(highest) => {
                self.shift(seq - highest);
                self.highest = Some(seq);
                self.bits[0] |= 1;
            }
            None => {
                self.highest = Some(seq);
                self.bits = [0; WORDS];
                self.bits[0] = 1;
            }
        }
        SeqVerdict::New
    }

    /// What `check_and_mark` would say of `seq`, without marking it: a frame is looked up when
    /// it arrives and marked only once it was handled, so a resend of one that failed is
    /// handled again.
    pub fn check(&self, seq: u64) -> SeqVerdict {
        let Some(highest) = self.highest else {
            return SeqVerdict::New;
        };
        if seq > highest {
            return SeqVerdict::New;
        }
        let offset = highest - seq;
        if offset >= Self::WIDTH {
            return SeqVerdict::TooOld;
        }
        let (word, bit) = ((offset / 64) as usize, offset % 64);
        if self.bits[word] & (1 << bit) != 0 {
            SeqVerdict::Duplicate
        } else {
            SeqVerdict::New
        }
    }

    /// Moves every mark `by` places further from the top.
    fn shift(&mut self, by: u64) {
        if by >= Self::WIDTH {
            self.bits = [0; WORDS];
            return;
        }
        let words = (by / 64) as usize;
        let bits = (by % 64) as u32;
        for i in (0..WORDS).rev() {
            let from_whole = i.checked_sub(words).map_or(0, |j| self.bits[j]);
            let carry = if bits == 0 {
                0
            } else {
                i.checked_sub(words + 1)
                    .map_or(0, |j| self.bits[j] >> (64 - bits))
            };
            self.bits[i] = if bits == 0 {
                from_whole
            } else {
                (from_whole << bits) | carry
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn resends_are_duplicates_and_old_ids_are_unknown() {
        let mut window = SeqWindow::<1>::new();
        assert_eq!(window.check_and_mark(100), SeqVerdict::New);
        assert_eq!(window.check_and_mark(100), SeqVerdict::Duplicate);
        assert_eq!(window.check_and_mark(99), SeqVerdict::New);
        assert_eq!(window.check_and_mark(37), SeqVerdict::New);
        assert_eq!(window.check_and_mark(36), SeqVerdict::TooOld);
        assert_eq!(window.check_and_mark(200), SeqVerdict::New);
        assert_eq!(window.check_and_mark(100), SeqVerdict::TooOld);
        assert_eq!(window.check_and_mark(199), SeqVerdict::New);
        assert_eq!(window.check_and_mark(199), SeqVerdict::Duplicate);
    }

    proptest! {
        /// Against a set of everything seen: inside the window the bitmap answers exactly as the
        /// set does, and it never calls a new id a duplicate.
        #[test]
        fn matches_an_unbounded_set(ops in proptest::collection::vec((0u64..600, any::<bool>()), 1..400)) {
            let mut window = SeqWindow::<4>::new();
            let mut seen = HashSet::new();
            let mut highest: Option<u64> = None;
            let mut base = 0u64;
            for (step, jump) in ops {
                // Mostly near the top, sometimes a jump ahead.
                base += if jump { step } else { 0 };
                let seq = base.saturating_sub(step % 300);
                let peeked = window.check(seq);
                let verdict = window.check_and_mark(seq);
                prop_assert_eq!(peeked, verdict, "check and check_and_mark disagree on {}", seq);
                let inside = highest.is_none_or(|h| seq > h || h - seq < SeqWindow::<4>::WIDTH);
                if inside {
                    let expected = if seen.contains(&seq) { SeqVerdict::Duplicate } else { SeqVerdict::New };
                    prop_assert_eq!(verdict, expected, "seq {} highest {:?}", seq, highest);
                    seen.insert(seq);
                    highest = Some(highest.map_or(seq, |h| h.max(seq)));
                } else {
                    prop_assert_eq!(verdict, SeqVerdict::TooOld);
                }
            }
        }
    }
}
