//! What every long connection oncegate holds shares, whatever its platform: the [`Status`] the
//! gateway reads for readiness and the status page, the reconnect [`backoff`] with jitter, so
//! that many gateways never dial in step, and the frame counters ([`count_frame`],
//! [`bad_frame`]) their dashboards read alike; and the [`Transport`] seam a platform's long
//! connection implements for the gateway to hold it.

mod transport;

pub use transport::{Ended, Held, Transport};

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The longest wait the backoff adds.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// The wait before attempt number `failures + 1` after `failures` failed attempts in a row: the
/// server's `asked` wait, but at least one second doubled per failure (capped at a minute),
/// taken at random in its upper half so that many gateways do not dial in step.
pub fn backoff(asked: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return asked;
    }
    let floor =
        (Duration::from_secs(1) * 2u32.saturating_pow(failures.min(16) - 1)).min(BACKOFF_MAX);
    let half = floor.as_millis() as u64 / 2;
    let jittered = Duration::from_millis(half + fastrand::u64(0..=half));
    asked.max(jittered)
}

/// Counts a frame of `kind` on `source`'s connection (`oncegate_ws_frames_total`).
pub fn count_frame(source: &str, kind: &'static str) {
    metrics::counter!("oncegate_ws_frames_total", "source" => source.to_owned(), "type" => kind)
        .increment(1);
}

/// A frame that cannot be used: counted (`oncegate_ws_bad_frames_total{reason}`) and summarized
/// in the log through `inlet`, never a line per frame.
pub fn bad_frame(
    inlet: &impl oncegate_core::Inlet,
    source: &str,
    label: &'static str,
    detail: &str,
) {
    metrics::counter!("oncegate_ws_bad_frames_total", "source" => source.to_owned(), "reason" => label)
        .increment(1);
    inlet.note(label, &format!("long connection {source}: {detail}"));
}

/// How one connection of a long connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Shutdown was asked for.
    Shutdown,
    /// The server closed it or asked for a new one, or the socket failed; `reason` is a metric
    /// label, `detail` what the log says.
    Lost {
        /// The metric label (`closed`, `silent`, `socket_error`, …).
        reason: &'static str,
        /// What happened, for the log.
        detail: String,
    },
}

/// An event the gateway did not admit: counted (`oncegate_ws_refused_total{reason}`) and
/// summarized in the log through `inlet`, saying how the platform was `answered` (it pushes
/// the event again).
pub fn refused(
    inlet: &impl oncegate_core::Inlet,
    source: &str,
    refusal: &oncegate_core::Refusal,
    answered: &str,
) {
    metrics::counter!("oncegate_ws_refused_total", "source" => source.to_owned(), "reason" => refusal.label)
        .increment(1);
    let label = match refusal.kind {
        oncegate_core::RefusalKind::Unavailable => "ws_admit_failed",
        _ => "ws_refused",
    };
    inlet.note(
        label,
        &format!(
            "long connection {source}: {answered} ({}): {}",
            refusal.label, refusal.message
        ),
    );
}

/// Waits until `done` holds, looking every 10 ms; false once `within` passed. For local
/// servers' and tests' waits on what a connection did.
pub async fn wait_for(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a running long connection is doing, for readiness and the status page.
#[derive(Debug, Default)]
pub struct Status {
    open: AtomicUsize,
    last_frame_ms: AtomicU64,
    reconnects: AtomicU64,
    fatal: Mutex<Option<String>>,
}

impl Status {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// When the last frame arrived (unix ms), 0 before any.
    pub fn last_frame_ms(&self) -> u64 {
        self.last_frame_ms.load(Ordering::Relaxed)
    }

    /// Connections lost and dialled again so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Why the connections stopped for good (a fatal handshake or endpoint answer), if they did.
    pub fn fatal(&self) -> Option<String> {
        self.fatal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Stops the connections for good, saying why.
    pub fn set_fatal(&self, reason: String) {
        *self
            .fatal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(reason);
    }

    /// A connection opened.
    pub fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed.
    pub fn closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A frame arrived at `now_ms` (unix ms).
    pub fn frame_at(&self, now_ms: u64) {
        self.last_frame_ms.store(now_ms, Ordering::Relaxed);
    }

    /// A connection was lost and is dialled again.
    pub fn reconnected(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }
}

/// Unix time in ms.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_a_second_with_jitter_and_keeps_longer_server_waits() {
        assert_eq!(backoff(Duration::ZERO, 0), Duration::ZERO);
        for failures in 1..12u32 {
            let full = (Duration::from_secs(1) * 2u32.pow(failures - 1)).min(BACKOFF_MAX);
            for _ in 0..50 {
                let wait = backoff(Duration::ZERO, failures);
                assert!(wait >= full / 2 && wait <= full, "{failures}: {wait:?}");
            }
        }
        assert_eq!(
            backoff(Duration::from_secs(300), 2),
            Duration::from_secs(300),
            "the server's longer wait stands"
        );
        assert!(backoff(Duration::ZERO, u32::MAX) <= BACKOFF_MAX);
    }
}
