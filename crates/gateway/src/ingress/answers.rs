//! What each webhook source answered: counted into `oncegate_callbacks_total` and kept
//! readable for the status page.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::Shared;

/// The answers a callback usually gets, each with its counter registered once per source: a
/// labelled counter looked up by its labels on every request costs more than the count.
const USUAL_ANSWERS: [StatusCode; 11] = [
    StatusCode::OK,
    StatusCode::BAD_REQUEST,
    StatusCode::UNAUTHORIZED,
    StatusCode::METHOD_NOT_ALLOWED,
    StatusCode::REQUEST_TIMEOUT,
    StatusCode::CONFLICT,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::INTERNAL_SERVER_ERROR,
    StatusCode::BAD_GATEWAY,
    StatusCode::SERVICE_UNAVAILABLE,
    StatusCode::GATEWAY_TIMEOUT,
];

/// One source's `oncegate_callbacks_total{source,platform,status}`: by source and answer, so
/// each corp, account or app is seen apart (the sources are configured: the labels are bounded).
/// The same counts are kept readable here for the status page's table of sources.
#[derive(Default)]
pub(crate) struct AnswerCounters {
    usual: [std::sync::OnceLock<metrics::Counter>; USUAL_ANSWERS.len()],
    totals: [AtomicU64; USUAL_ANSWERS.len()],
    other: AtomicU64,
}

impl AnswerCounters {
    pub(crate) fn count(&self, source: &str, platform: &str, status: StatusCode) {
        let register = || {
            metrics::counter!(
                "oncegate_callbacks_total",
                "source" => source.to_owned(),
                "platform" => platform.to_owned(),
                "status" => status.as_str().to_owned()
            )
        };
        match USUAL_ANSWERS.iter().position(|usual| *usual == status) {
            Some(slot) => {
                self.usual[slot].get_or_init(register).increment(1);
                self.totals[slot].fetch_add(1, Ordering::Relaxed);
            }
            None => {
                register().increment(1);
                self.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The answers given so far: accepted (200), refused (4xx) and failed (5xx, the other
    /// statuses among them).
    fn split(&self) -> (u64, u64, u64) {
        let mut split = (0, 0, self.other.load(Ordering::Relaxed));
        for (status, total) in USUAL_ANSWERS.iter().zip(&self.totals) {
            let n = total.load(Ordering::Relaxed);
            match status.as_u16() {
                200 => split.0 += n,
                400..=499 => split.1 += n,
                _ => split.2 += n,
            }
        }
        split
    }
}

/// Each webhook source's answers since the start, by name: the status page's table of sources.
pub(crate) fn sources_json<S>(shared: &Shared<S>) -> Value {
    let sources = shared.ingress.sources.load();
    let mut names: Vec<&String> = sources.by_name.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let source = &sources.by_name[name];
            let (accepted, refused, failed) = source.answers.split();
            json!({
                "source": name,
                "platform": source.decoder.platform(),
                "accepted": accepted,
                "refused": refused,
                "failed": failed,
            })
        })
        .collect()
}
