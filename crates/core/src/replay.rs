//! The webhook replay guard: a timestamp within the allowed skew and a nonce not seen within
//! that window, in bounded memory.
//!
//! A nonce only needs remembering while its timestamp would still pass the skew check, so the
//! guard keeps two generations of nonces, each spanning twice the skew, and drops a whole
//! generation at once: no scan, no per-entry timer.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};

use crate::passthrough::BuildPassThrough;

/// Keyed SipHash values of nonces, random to anyone without the key: their own hash in the
/// sets (hashing them again cost more than the lookup).
type Hashes = HashSet<u64, BuildPassThrough>;

/// What the guard says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayVerdict {
    /// Timestamp within the skew and nonce not seen.
    Fresh,
    /// The timestamp is further than the allowed skew from now.
    Stale {
        /// How far off it is, in seconds (negative: in the future).
        skew_secs: i64,
    },
    /// The nonce was seen within the window.
    Replayed,
    /// The guard holds as many nonces as it may; answer 503 so that the sender retries later.
    Saturated,
}

/// Timestamp and nonce checks for signed webhooks.
#[derive(Debug)]
pub struct ReplayGuard {
    skew_secs: u64,
    max_nonces_per_generation: usize,
    hasher: RandomState,
    generation_start_secs: u64,
    current: Hashes,
    previous: Hashes,
}

impl ReplayGuard {
    /// A guard accepting timestamps within `skew_secs` of now and remembering at most
    /// `2 * max_nonces_per_generation` nonces.
    pub fn new(skew_secs: u64, max_nonces_per_generation: usize) -> Self {
        Self {
            skew_secs: skew_secs.max(1),
            max_nonces_per_generation: max_nonces_per_generation.max(1),
            hasher: RandomState::new(),
            generation_start_secs: 0,
            current: Hashes::default(),
            previous: Hashes::default(),
        }
    }

    /// Checks a request without remembering its nonce: call `remember` once the event is
    /// admitted, so that a nonce never makes the gateway drop an event it has not admitted.
    pub fn check(&mut self, timestamp_secs: u64, nonce: &str, now_secs: u64) -> ReplayVerdict {
        let skew = now_secs as i128 - timestamp_secs as i128;
        if skew.unsigned_abs() > u128::from(self.skew_secs) {
            return ReplayVerdict::Stale {
                skew_secs: skew.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
            };
        }
        self.rotate(now_secs);
        let nonce = self.hasher.hash_one(nonce);
        if self.current.contains(&nonce) || self.previous.contains(&nonce) {
            ReplayVerdict::Replayed
        } else if self.current.len() >= self.max_nonces_per_generation {
            ReplayVerdict::Saturated
        } else {
            ReplayVerdict::Fresh
        }
    }

    /// Remembers a nonce of a request that passed `check` and was handled.
    pub fn remember(&mut self, nonce: &str, now_secs: u64) {
        self.rotate(now_secs);
        if self.current.len() < self.max_nonces_per_generation {
            let nonce = self.hasher.hash_one(nonce);
            self.current.insert(nonce);
        }
    }

    /// How many nonces are held now.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether no nonce is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn rotate(&mut self, now_secs: u64) {
        // A nonce must be remembered while its timestamp can still pass: up to 2 * skew after it
        // was first seen. Each generation spans 2 * skew, and the previous one is kept whole.
        let span = 2 * self.skew_secs;
        if now_secs >= self.generation_start_secs + 2 * span {
            self.previous.clear();
            self.current.clear();
            self.generation_start_secs = now_secs;
        } else if now_secs >= self.generation_start_secs + span {
            // The older set's room is kept for the new generation: a steady stream of requests
            // then grows no set anew (growing one is rehashing and zeroing fresh pages).
            std::mem::swap(&mut self.previous, &mut self.current);
            self.current.clear();
            self.generation_start_secs += span;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the gateway does: `check`, and `remember` when fresh (it admits in between).
    fn check_and_remember(
        guard: &mut ReplayGuard,
        timestamp_secs: u64,
        nonce: &str,
        now_secs: u64,
    ) -> ReplayVerdict {
        let verdict = guard.check(timestamp_secs, nonce, now_secs);
        if verdict == ReplayVerdict::Fresh {
            guard.remember(nonce, now_secs);
        }
        verdict
    }

    #[test]
    fn stale_timestamps_are_refused_both_ways() {
        let mut guard = ReplayGuard::new(300, 100);
        assert_eq!(
            guard.check(1_000, "n", 1_301),
            ReplayVerdict::Stale { skew_secs: 301 }
        );
        assert_eq!(
            guard.check(1_602, "n", 1_301),
            ReplayVerdict::Stale { skew_secs: -301 }
        );
        assert_eq!(guard.check(1_001, "n", 1_301), ReplayVerdict::Fresh);
    }

    #[test]
    fn a_nonce_is_refused_for_as_long_as_its_timestamp_could_pass() {
        let mut guard = ReplayGuard::new(300, 100);
        let t0 = 10_000;
        assert_eq!(
            check_and_remember(&mut guard, t0, "abc", t0),
            ReplayVerdict::Fresh
        );
        // Replays at every second while the timestamp still passes the skew check.
        for now in t0..=t0 + 300 {
            assert_eq!(
                guard.check(t0, "abc", now),
                ReplayVerdict::Replayed,
                "at {now}"
            );
        }
        assert_eq!(
            guard.check(t0, "abc", t0 + 301),
            ReplayVerdict::Stale { skew_secs: 301 }
        );
        // A timestamp from the future seen at t0 passes until t0 + 600.
        let mut guard = ReplayGuard::new(300, 100);
        assert_eq!(
            check_and_remember(&mut guard, t0 + 300, "f", t0),
            ReplayVerdict::Fresh
        );
        for now in t0..=t0 + 600 {
            assert_eq!(
                guard.check(t0 + 300, "f", now),
                ReplayVerdict::Replayed,
                "at {now}"
            );
        }
    }

    #[test]
    fn check_alone_does_not_remember() {
        let mut guard = ReplayGuard::new(60, 100);
        assert_eq!(guard.check(100, "n", 100), ReplayVerdict::Fresh);
        assert_eq!(guard.check(100, "n", 100), ReplayVerdict::Fresh);
        guard.remember("n", 100);
        assert_eq!(guard.check(100, "n", 100), ReplayVerdict::Replayed);
    }

    #[test]
    fn memory_is_bounded_and_old_generations_go() {
        let mut guard = ReplayGuard::new(10, 50);
        for i in 0..50 {
            assert_eq!(
                check_and_remember(&mut guard, 1_000, &format!("n{i}"), 1_000),
                ReplayVerdict::Fresh
            );
        }
        assert_eq!(guard.check(1_000, "more", 1_000), ReplayVerdict::Saturated);
        assert_eq!(guard.len(), 50);
        // Two spans later both generations are gone.
        assert_eq!(guard.check(1_041, "more", 1_041), ReplayVerdict::Fresh);
        assert!(guard.is_empty());
    }
}
