//! Commands of the bot's own (proactive sends) over whichever connection is subscribed now:
//! the connection registers itself while it lives; a send without one is refused at once, so
//! that the caller retries (with the same key) where the connection is held.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::frame;
use crate::reply::{Pending, send_awaited};

/// Why a command of ours did not go out, or may not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    /// No connection of this gateway is subscribed now (another gateway holds the bot's, or
    /// it is being dialled): nothing was sent.
    #[error(
        "this gateway holds no subscribed connection of the bot now (another gateway may hold it, or it is being dialled): nothing was sent"
    )]
    NotHeld,
    /// WeCom refused it.
    #[error("WeCom answered errcode {code}: {message}")]
    Refused {
        /// WeCom's code.
        code: i64,
        /// WeCom's message.
        message: String,
    },
    /// It went out, but no answer came: it may have been sent.
    #[error("{0}")]
    Unknown(String),
}

#[derive(Clone)]
pub(crate) struct Holder {
    pub(crate) generation: u64,
    pub(crate) outbox: mpsc::Sender<String>,
    pub(crate) pending: Arc<Pending>,
}

/// Where a bot's own commands go: the subscribed connection, if any.
pub struct Outbound {
    holder: watch::Sender<Option<Holder>>,
    generations: std::sync::atomic::AtomicU64,
}

impl Default for Outbound {
    fn default() -> Self {
        Self {
            holder: watch::Sender::new(None),
            generations: std::sync::atomic::AtomicU64::default(),
        }
    }
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("held", &self.is_held())
            .finish()
    }
}

impl Outbound {
    /// Whether a connection is subscribed now.
    pub fn is_held(&self) -> bool {
        self.holder.borrow().is_some()
    }

    /// A subscribed connection takes the commands; the number it returns lets it go.
    pub(crate) fn hold(&self, outbox: mpsc::Sender<String>, pending: Arc<Pending>) -> u64 {
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.holder.send_replace(Some(Holder {
            generation,
            outbox,
            pending,
        }));
        generation
    }

    /// The connection `generation` ended.
    pub(crate) fn release(&self, generation: u64) {
        self.holder.send_if_modified(|holder| {
            let ended = holder.as_ref().is_some_and(|h| h.generation == generation);
            if ended {
                *holder = None;
            }
            ended
        });
    }

    /// The subscribed connection, other than `not` (one a command just failed on), waiting up
    /// to `wait` for one: a reply that outlived its connection goes out on the next.
    pub(crate) async fn current(&self, not: Option<u64>, wait: Duration) -> Option<Holder> {
        let mut watching = self.holder.subscribe();
        let found = tokio::time::timeout(
            wait,
            watching.wait_for(|holder| holder.as_ref().is_some_and(|h| Some(h.generation) != not)),
        )
        .await;
        match found {
            Ok(Ok(holder)) => holder.clone(),
            _ => None,
        }
    }

    /// Sends command `cmd` with `body` and waits for WeCom's answer.
    pub async fn send(&self, cmd: &str, body: Value) -> Result<Value, OutboundError> {
        let Some(Holder {
            outbox, pending, ..
        }) = self.holder.borrow().clone()
        else {
            return Err(OutboundError::NotHeld);
        };
        let req_id = frame::req_id(cmd);
        let text = frame::command(cmd, &req_id, Some(body));
        match send_awaited(&outbox, &pending, &req_id, text).await {
            Ok(()) => Ok(serde_json::json!({"errcode": 0, "errmsg": "ok", "req_id": req_id})),
            Err(crate::reply::NotAnswered::Refused { code, message }) => {
                Err(OutboundError::Refused { code, message })
            }
            Err(crate::reply::NotAnswered::NotSent(_)) => Err(OutboundError::NotHeld),
            Err(crate::reply::NotAnswered::Unknown(why) | crate::reply::NotAnswered::Cut(why)) => {
                Err(OutboundError::Unknown(why))
            }
        }
    }
}
