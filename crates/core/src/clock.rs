//! Wall-clock time in unix milliseconds, injectable so that expiry can be tested without sleeping.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of unix time in milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock that takes its time from a reference read now and then — the Redis server's `TIME`,
/// which every gateway on that Redis then shares — and runs on the machine's monotonic clock in
/// between: a step of the machine's own wall clock never moves it, and gateways whose machines
/// disagree still judge leases, ownership and replay windows alike. Clones share one time.
#[derive(Debug, Clone)]
pub struct SteadyClock {
    /// The reference time minus the monotonic milliseconds since [`process_start`].
    offset_ms: Arc<AtomicI64>,
}

/// The monotonic origin every [`SteadyClock`] counts from.
fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn monotonic_ms(at: Instant) -> i64 {
    at.saturating_duration_since(process_start()).as_millis() as i64
}

impl SteadyClock {
    /// A clock at `reference_ms` now.
    pub fn new(reference_ms: u64) -> Self {
        let clock = Self {
            offset_ms: Arc::new(AtomicI64::new(0)),
        };
        clock.sync(reference_ms, Instant::now());
        clock
    }

    /// A clock at the machine's wall time now, until the first [`SteadyClock::sync`].
    pub fn from_system() -> Self {
        Self::new(SystemClock.now_ms())
    }

    /// Takes `reference_ms`, read at `read_at` (the middle of the round trip that read it), as
    /// the time from now on.
    pub fn sync(&self, reference_ms: u64, read_at: Instant) {
        let offset = (reference_ms as i64).saturating_sub(monotonic_ms(read_at));
        self.offset_ms.store(offset, Ordering::Relaxed);
    }
}

impl Clock for SteadyClock {
    fn now_ms(&self) -> u64 {
        let now = self
            .offset_ms
            .load(Ordering::Relaxed)
            .saturating_add(monotonic_ms(Instant::now()));
        u64::try_from(now).unwrap_or(0)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_steady_clock_runs_from_its_reference_and_takes_a_new_one() {
        let clock = SteadyClock::new(1_000_000);
        let first = clock.now_ms();
        assert!((1_000_000..1_000_050).contains(&first), "{first}");
        std::thread::sleep(Duration::from_millis(30));
        let later = clock.now_ms();
        assert!(
            later >= first + 30 && later < first + 200,
            "{first} {later}"
        );
        // A reference read 10 ms ago at 5_000_000: now is 10 ms past it.
        let read_at = Instant::now() - Duration::from_millis(10);
        clock.sync(5_000_000, read_at);
        let synced = clock.now_ms();
        assert!((5_000_010..5_000_060).contains(&synced), "{synced}");
        // Clones share the time.
        let clone = clock.clone();
        clock.sync(42, Instant::now());
        assert!(clone.now_ms() < 1_000, "{}", clone.now_ms());
    }
}
