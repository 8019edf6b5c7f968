//! The frames a connection handled: a frame is taken for a resend, acked and not handled again,
//! only when both its SeqID and its message id are those of a frame handled before. A frame that
//! reuses a SeqID for another message goes on to admission, where event-id dedup decides.

use std::collections::HashMap;

use oncegate_core::seqwindow::{SeqVerdict, SeqWindow};

/// SeqIDs handled (a fixed-size window) and the message id each carried.
#[derive(Debug, Default)]
pub(crate) struct SeenFrames {
    window: SeqWindow<16>,
    ids: HashMap<u64, Box<str>>,
    highest: u64,
}

impl SeenFrames {
    /// Whether the frame `seq` with `message_id` is one handled before.
    pub(crate) fn is_resend(&self, seq: u64, message_id: &str) -> bool {
        self.window.check(seq) == SeqVerdict::Duplicate
            && self.ids.get(&seq).is_some_and(|seen| **seen == *message_id)
    }

    /// Marks the frame handled.
    pub(crate) fn mark(&mut self, seq: u64, message_id: &str) {
        if self.window.check_and_mark(seq) == SeqVerdict::TooOld {
            return;
        }
        self.ids.insert(seq, message_id.into());
        self.highest = self.highest.max(seq);
        // What the window no longer covers is forgotten, so the map stays as small as it.
        let width = SeqWindow::<16>::WIDTH;
        if self.ids.len() as u64 > 2 * width {
            let highest = self.highest;
            self.ids.retain(|&seen, _| highest - seen < width);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_is_the_same_seq_and_message() {
        let mut seen = SeenFrames::default();
        assert!(!seen.is_resend(7, "m1"));
        seen.mark(7, "m1");
        assert!(seen.is_resend(7, "m1"));
        assert!(
            !seen.is_resend(7, "m2"),
            "another message under a reused SeqID"
        );
        assert!(!seen.is_resend(8, "m1"));
        seen.mark(7, "m2");
        assert!(seen.is_resend(7, "m2"));
    }

    #[test]
    fn memory_stays_bounded() {
        let mut seen = SeenFrames::default();
        for seq in 0..100_000 {
            seen.mark(seq, "m");
        }
        assert!(seen.ids.len() as u64 <= 2 * SeqWindow::<16>::WIDTH + 1);
        assert!(seen.is_resend(99_999, "m"));
    }
}
