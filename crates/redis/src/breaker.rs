//! The circuit breaker in front of every call.

use super::*;

/// Failures in a row that open the circuit, and how long it stays open before one call may
/// try again.
const BREAKER_FAILURES: u32 = 5;
const BREAKER_OPEN: Duration = Duration::from_secs(1);

/// A circuit breaker, so that a dead Redis is not hammered by every request and worker: after
/// a run of failures, calls fail at once for a while; then one call tries again.
#[derive(Default)]
pub(super) struct Breaker {
    failures: std::sync::atomic::AtomicU32,
    open_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Breaker {
    pub(super) fn check(&self) -> Result<(), StoreError> {
        let mut open = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
        match *open {
            Some(until) if std::time::Instant::now() < until => Err(StoreError::Unavailable(
                "redis: circuit open after repeated failures; retrying shortly".into(),
            )),
            Some(_) => {
                // Half open: let this call through; the next failure reopens at once.
                *open = None;
                Ok(())
            }
            None => Ok(()),
        }
    }

    pub(super) fn record(&self, ok: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if ok {
            if self.failures.swap(0, Relaxed) >= BREAKER_FAILURES {
                metrics::gauge!("oncegate_store_circuit_open").set(0.0);
                tracing::info!("redis answers again: circuit closed");
            }
            return;
        }
        let failures = self.failures.fetch_add(1, Relaxed) + 1;
        if failures >= BREAKER_FAILURES {
            *self.open_until.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(std::time::Instant::now() + BREAKER_OPEN);
            metrics::gauge!("oncegate_store_circuit_open").set(1.0);
            if failures == BREAKER_FAILURES {
                tracing::warn!(
                    failures,
                    "redis keeps failing: circuit open, calls fail fast"
                );
            }
        }
    }
}
