//! A configured source as the ingress holds it: its decoder, replay guard and answer counters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncegate_core::replay::ReplayGuard;

use crate::SharedSource;

/// One configured source with its replay guard.
pub(crate) struct Source {
    pub(crate) decoder: SharedSource,
    /// Shared with the source a reload replaces, so that a nonce seen before it is still a
    /// replay after it.
    pub(crate) replay: Option<Arc<Mutex<ReplayGuard>>>,
    pub(crate) answers: Arc<super::answers::AnswerCounters>,
    /// The decoder a reload replaced, with the time until which it still takes what the new
    /// one refuses: a platform that still signs with the old secret for a while is not
    /// refused (`server.secret_overlap`).
    pub(crate) previous: Option<(SharedSource, u64)>,
    /// The `[[source]]` it was built from, its secrets resolved: a reload keeps a source its
    /// file describes the same way. `None` for a source built in code.
    pub(crate) origin: Option<oncegate_config::SourceConfig>,
}

impl Source {
    /// A source decoding with `decoder`, its replay guard as `replay` says.
    pub(crate) fn new(decoder: SharedSource, replay: Option<ReplayLimits>) -> Self {
        Self {
            decoder,
            replay: replay.map(|limits| {
                Arc::new(Mutex::new(ReplayGuard::new(
                    limits.max_skew.as_secs(),
                    limits.max_nonces,
                )))
            }),
            answers: Arc::default(),
            previous: None,
            origin: None,
        }
    }
}

/// Replay-guard limits: requests further than `max_skew` from now are refused, and nonces
/// are remembered for twice that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayLimits {
    /// The largest distance between a request's timestamp and now.
    pub max_skew: Duration,
    /// Nonces remembered per half of the window.
    pub max_nonces: usize,
    /// Whether admissions write their request's nonce to the store too (`replay.shared_nonces`):
    /// gateways sharing the store then refuse each other's replays, not only their own.
    pub shared_nonces: bool,
}

impl ReplayLimits {
    /// How long a nonce must be remembered: while its timestamp still passes the skew check.
    pub(crate) fn nonce_window(self) -> Duration {
        self.max_skew * 2
    }
}
