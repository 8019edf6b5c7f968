//! Log lines for what happens often: refused requests and repeated failures are counted per
//! kind and written as one summary per interval, never one line per request, so that an attack
//! leaves a trace and an outage does not flood the log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The longest message kept per kind; messages may quote what a client sent.
const MAX_MESSAGE: usize = 300;

/// `message` within [`MAX_MESSAGE`] characters: cut after its last whole word, marked `…`.
fn kept(message: &str) -> std::borrow::Cow<'_, str> {
    let Some((end, _)) = message.char_indices().nth(MAX_MESSAGE) else {
        return message.into();
    };
    let head = &message[..end];
    let cut = head.rfind(' ').filter(|at| *at > end / 2).unwrap_or(end);
    format!("{}…", head[..cut].trim_end()).into()
}

#[derive(Debug, Default)]
struct Entry {
    count: u64,
    last_peer: Option<SocketAddr>,
    last_message: String,
}

/// Counts of refusals and failures since the last summary, by kind.
#[derive(Debug)]
pub struct Summaries {
    interval: Duration,
    pending: Mutex<BTreeMap<&'static str, Entry>>,
}

impl Summaries {
    /// Summaries written every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            pending: Mutex::default(),
        }
    }

    /// Counts one occurrence of `kind`; `message` says what was wrong (never a payload or a
    /// secret).
    pub fn note(&self, kind: &'static str, peer: Option<SocketAddr>, message: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let entry = pending.entry(kind).or_default();
        entry.count += 1;
        if peer.is_some() {
            entry.last_peer = peer;
        }
        // Most refusals repeat their message: compare what is kept, copy only what changed.
        let kept = kept(message);
        if entry.last_message != kept {
            entry.last_message.clear();
            entry.last_message.push_str(&kept);
        }
    }

    /// Writes one line per kind seen since the last call and forgets them.
    pub fn flush(&self) {
        let drained = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for (kind, entry) in drained {
            let peer = entry
                .last_peer
                .map_or_else(|| "-".to_owned(), |peer| peer.to_string());
            tracing::warn!(
                kind,
                count = entry.count,
                last_from = %peer,
                last = ?entry.last_message,
                "{} × {kind} in the last {:?}",
                entry.count,
                self.interval
            );
        }
    }

    /// Flushes every interval until `shutdown`, and once more then.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => self.flush(),
                _ = shutdown.cancelled() => break,
            }
        }
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_after_a_whole_word_and_marked() {
        let reason = "cannot reach http://127.0.0.1:9/in: error sending request: ".repeat(8);
        let cut = kept(&reason);
        assert!(cut.chars().count() <= MAX_MESSAGE + 1, "{cut}");
        assert!(cut.ends_with('…'), "{cut}");
        let words = cut.trim_end_matches('…');
        assert!(reason.starts_with(words), "{cut}");
        assert_eq!(
            reason[words.len()..].chars().next(),
            Some(' '),
            "cut at a word's end: {cut}"
        );
        assert_eq!(kept("short"), "short");
        // One long word is cut where it must be.
        let word = "x".repeat(MAX_MESSAGE * 2);
        assert_eq!(kept(&word).chars().count(), MAX_MESSAGE + 1);
    }
}
