//! One open socket: the subscribe, then callbacks in and commands out. Pings go out on the
//! writer's own task, so that a slow store never delays them; pings left unanswered end the
//! connection. One chat's callbacks are admitted in the order they came, other chats' alongside.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use oncegate_core::{Admit, RefusalKind};
use oncegate_wecom::AiBot;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;

use crate::frame::{self, Incoming};
use crate::reply::{self, Pending};
use crate::{Inlet, Settings, Status};

/// Commands waiting for the socket.
const OUTBOX: usize = 1024;
/// A write that takes longer is a dead connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Replies being answered at once per bot.
const REPLIES_AT_ONCE: usize = 64;
/// The bytes of callbacks read from the bot's sockets and not yet admitted or answered: the
/// reader reads on (pongs, other chats' messages) while handlers and the store are slow, and
/// waits only past this.
pub(crate) const HELD_BYTES: usize = 64 << 20;
/// Attempts at admitting a callback while the store is unavailable: WeCom is not known to send
/// a callback again, so one that is not admitted is lost.
const ADMIT_ATTEMPTS: u32 = 8;
/// The largest frame taken: callbacks are a few kilobytes. A larger one is read, counted and
/// dropped; the connection goes on.
pub(crate) const MAX_FRAME: usize = 1 << 20;
/// How long a connection this side closes is still read: WeCom sent what is in flight once,
/// and never sends it again, so frames that arrive before its close answer are taken.
const DRAIN: Duration = Duration::from_secs(2);

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// Shutdown was asked for.
    Shutdown,
    /// WeCom said another subscribe took the bot over (`disconnected_event`).
    Kicked,
    /// WeCom refused the subscribe for the bot's credentials.
    Refused(String),
    /// The server closed it, or the socket failed; `reason` is a metric label.
    Lost {
        reason: &'static str,
        detail: String,
    },
}

/// What one bot's connections share with their lanes and replies (which outlive the
/// connection their callback came on).
pub(crate) struct Context<I> {
    pub(crate) bot: AiBot,
    pub(crate) settings: Settings,
    pub(crate) inlet: Arc<I>,
    pub(crate) status: Arc<Status>,
    pub(crate) outbound: Arc<crate::Outbound>,
    pub(crate) replies: Replies,
    /// Bytes of callbacks held ([`HELD_BYTES`]).
    pub(crate) held: Arc<tokio::sync::Semaphore>,
}

impl<I: Inlet> Context<I> {
    fn count(&self, kind: &'static str) {
        oncegate_longconn::count_frame(&self.settings.source, kind);
    }

    /// A frame that cannot be used: counted, and summarized in the log.
    fn garbage(&self, label: &'static str, detail: &str) {
        oncegate_longconn::bad_frame(&*self.inlet, &self.settings.source, label, detail);
    }
}

/// Subscribes on `socket` and runs it until it ends. Callbacks already taken from it are still
/// admitted after it ended.
pub(crate) async fn run<I: Inlet, S>(
    context: Arc<Context<I>>,
    socket: S,
    shutdown: &CancellationToken,
) -> End
where
    S: futures_util::Stream<Item = Result<Message, tungstenite::Error>>
        + futures_util::Sink<Message, Error = tungstenite::Error>
        + Send
        + Unpin
        + 'static,
{
    let (mut sink, mut stream) = socket.split();
    if let Err(end) = subscribe(&context, &mut sink, &mut stream).await {
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
        return end;
    }
    context.status.opened();
    let (outbox, letters) = mpsc::channel::<String>(OUTBOX);
    let watchdog = Arc::new(Watchdog::default());
    let ended = CancellationToken::new();
    let writer = tokio::spawn(write(
        sink,
        letters,
        context.settings.clone(),
        watchdog.clone(),
        ended.clone(),
    ));
    let pending = Arc::new(Pending::default());
    let held = context.outbound.hold(outbox.clone(), pending.clone());
    // Bounded by the bytes they hold (`held`), not by a count the reader would wait on.
    let lanes: Vec<mpsc::UnboundedSender<Taken>> = (0..context.settings.lanes.max(1))
        .map(|_| {
            let (lane, work) = mpsc::unbounded_channel();
            tokio::spawn(admit_in_order(context.clone(), work));
            lane
        })
        .collect();
    let end = loop {
        let message = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break End::Shutdown,
            message = stream.next() => message,
            _ = ended.cancelled() => break End::Lost {
                reason: "write_failed",
                detail: "a write failed or timed out".into(),
            },
        };
        if let Some(Ok(_)) = &message {
            // Any frame read shows the connection alive, a pong or not.
            watchdog.alive();
        }
        let text = match message {
            None => break lost("closed", "the server ended the stream".into()),
            Some(Err(error)) => break lost("socket_error", error.to_string()),
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(close))) => {
                break lost(
                    "closed",
                    format!(
                        "the server closed the connection: {}",
                        close.map_or_else(String::new, |c| format!("{} {}", c.code, c.reason))
                    ),
                );
            }
            // Answered by tungstenite itself.
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Binary(_) | Message::Frame(_))) => {
                context.garbage("binary_message", "a binary message; WeCom sends JSON text");
                continue;
            }
        };
        if let Some(end) = on_text(&context, &text, &lanes, &watchdog, &pending).await {
            break end;
        }
    };
    context.outbound.release(held);
    ended.cancel();
    drop(outbox);
    // Closed from this side (the writer sends the close): what WeCom sent before it saw the
    // close is still read and taken, until its close answer, for `DRAIN` at most.
    if !matches!(
        &end,
        End::Lost {
            reason: "closed" | "socket_error",
            ..
        }
    ) {
        let until = tokio::time::Instant::now() + DRAIN;
        while let Ok(Some(Ok(message))) = tokio::time::timeout_at(until, stream.next()).await {
            match message {
                Message::Text(text) => {
                    let taken = on_text(&context, &text, &lanes, &watchdog, &pending);
                    if tokio::time::timeout_at(until, taken).await.is_err() {
                        break;
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    }
    // Commands awaiting an answer on this connection will get none: told at once, so that a
    // reply goes out again on the next connection instead of waiting out its answer time.
    reply::lock(&pending).clear();
    let end = match writer.await {
        Ok(Some(why)) if matches!(end, End::Lost { .. }) => why,
        _ => end,
    };
    context.status.closed();
    end
}

/// One text frame: a callback taken, an answer matched, a takeover or garbage told. `Some`
/// when the connection ends with it.
async fn on_text<I: Inlet>(
    context: &Arc<Context<I>>,
    text: &str,
    lanes: &[mpsc::UnboundedSender<Taken>],
    watchdog: &Watchdog,
    pending: &Arc<Pending>,
) -> Option<End> {
    if text.len() > MAX_FRAME {
        context.garbage(
            "frame_too_large",
            &format!(
                "a frame of {} bytes (at most {MAX_FRAME} are taken)",
                text.len()
            ),
        );
        return None;
    }
    context.status.frame_at(oncegate_longconn::unix_ms());
    let frame = match Incoming::parse(text) {
        Ok(frame) => frame,
        Err(error) => {
            context.garbage(error.label(), &error.to_string());
            return None;
        }
    };
    if frame.is_takeover() {
        context.count("disconnected_event");
        return Some(End::Kicked);
    }
    if frame.is_callback() {
        callback(context, &frame, lanes, watchdog).await;
        return None;
    }
    if frame.cmd.is_none() {
        if let Some(end) = answered(context, frame, pending) {
            return Some(end);
        }
        return None;
    }
    context.garbage(
        "unknown_command",
        &format!("a frame with cmd {:?}", frame.cmd.as_deref().unwrap_or("")),
    );
    None
}

fn lost(reason: &'static str, detail: String) -> End {
    End::Lost { reason, detail }
}

/// Sends the subscribe and waits for its answer.
async fn subscribe<I: Inlet, W, R>(
    context: &Context<I>,
    sink: &mut W,
    stream: &mut R,
) -> Result<(), End>
where
    W: futures_util::Sink<Message, Error = tungstenite::Error> + Unpin,
    R: futures_util::Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    let req_id = frame::req_id(frame::SUBSCRIBE);
    let body =
        serde_json::json!({"bot_id": context.bot.bot_id(), "secret": context.settings.secret});
    let text = frame::command(frame::SUBSCRIBE, &req_id, Some(body));
    let deadline = context.settings.connect_timeout;
    match tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::text(text))).await {
        Ok(Ok(())) => {}
        _ => {
            return Err(lost(
                "write_failed",
                "the subscribe could not be sent".into(),
            ));
        }
    }
    let answer = async {
        while let Some(message) = stream.next().await {
            let text = match message {
                Ok(Message::Text(text)) => text,
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            match Incoming::parse(&text) {
                Ok(frame) if frame.cmd.is_none() && frame.headers.req_id == req_id => {
                    return Ok(frame);
                }
                Ok(_) => context.garbage(
                    "before_subscribe",
                    "a frame before the subscribe was answered",
                ),
                Err(error) => context.garbage(error.label(), &error.to_string()),
            }
        }
        Err(lost(
            "closed",
            "the server closed the connection before answering the subscribe".into(),
        ))
    };
    let frame = tokio::time::timeout(deadline, answer).await.map_err(|_| {
        lost(
            "subscribe_timeout",
            format!("the subscribe was not answered within {deadline:?}"),
        )
    })??;
    match frame.errcode {
        Some(0) => Ok(()),
        Some(code) if CREDENTIAL_ERRORS.contains(&code) => Err(End::Refused(format!(
            "the subscribe was refused: errcode {code}, {:?}; check bot_id and secret (智能机器人 → API 模式 → 长连接)",
            frame.errmsg.unwrap_or_default()
        ))),
        // A rate limit, a busy server, a code not known to be about the credentials: backed
        // off and tried again, never a reason to stop for good.
        code => Err(lost(
            "subscribe_refused",
            format!(
                "the subscribe was refused: errcode {}, {:?}; subscribing again after the backoff",
                code.map_or_else(|| "missing".to_owned(), |c| c.to_string()),
                frame.errmsg.unwrap_or_default()
            ),
        )),
    }
}

/// The subscribe's answers that say the bot's id or secret is wrong (WeCom's invalid
/// credential, corp and token codes; 600017 as seen for a wrong bot secret): a few in a row
/// stop the connection until the configuration is fixed. Every other refusal is retried.
const CREDENTIAL_ERRORS: [i64; 4] = [40_001, 40_013, 40_014, 600_017];

/// Replies of one bot in flight: bounded in number, one conversation's in the order its
/// messages came, on whichever connection is subscribed when they are answered.
pub(crate) struct Replies {
    permits: Arc<tokio::sync::Semaphore>,
    /// Per conversation, when its latest reply is done: the next one waits for it, so that one
    /// conversation's answers go out in the order its messages came.
    turns: std::sync::Mutex<std::collections::HashMap<u64, tokio::sync::oneshot::Receiver<()>>>,
}

impl Default for Replies {
    fn default() -> Self {
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(REPLIES_AT_ONCE)),
            turns: std::sync::Mutex::default(),
        }
    }
}

/// Conversations whose turns are remembered before finished ones are swept.
const TURNS: usize = 4_096;

impl Replies {
    /// The turn of a new reply in conversation `chat`: what to wait for (the reply before it),
    /// and what to drop when done.
    fn turn(
        &self,
        chat: u64,
    ) -> (
        Option<tokio::sync::oneshot::Receiver<()>>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (done, next) = tokio::sync::oneshot::channel();
        let mut turns = self
            .turns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if turns.len() >= TURNS {
            turns.retain(|_, turn| {
                matches!(
                    turn.try_recv(),
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty)
                )
            });
        }
        (turns.insert(chat, next), done)
    }
}

/// Whether the connection is alive: pings unanswered since the last frame read, and whether
/// the reader is waiting on this gateway (the bytes it holds) rather than on the socket, when
/// silence is no sign of a dead connection.
#[derive(Default)]
struct Watchdog {
    missed: AtomicU32,
    paused: std::sync::atomic::AtomicBool,
}

impl Watchdog {
    fn alive(&self) {
        self.missed.store(0, Ordering::Relaxed);
    }

    /// A ping goes out: the pings unanswered before it (none while the reader is paused).
    fn ping(&self) -> u32 {
        if self.paused.load(Ordering::Relaxed) {
            self.missed.store(0, Ordering::Relaxed);
            return 0;
        }
        self.missed.fetch_add(1, Ordering::Relaxed)
    }
}

/// A callback taken from the socket, with the bytes it holds.
type Taken = (Admit, tokio::sync::OwnedSemaphorePermit);

/// An answer to a command of ours: a ping's clears the watchdog, a reply's goes to the reply
/// waiting for it; "not subscribed" ends the connection, so that it is dialled and subscribed
/// anew.
fn answered<I: Inlet>(context: &Context<I>, frame: Incoming, pending: &Pending) -> Option<End> {
    let waiting = pending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(&frame.headers.req_id);
    if let Some(waiting) = waiting {
        context.count("reply_answer");
        let _ = waiting.send((
            frame.errcode.unwrap_or(-1),
            frame.errmsg.unwrap_or_default(),
        ));
        return None;
    }
    if frame.errcode == Some(frame::NOT_SUBSCRIBED) {
        return Some(lost(
            "not_subscribed",
            format!(
                "WeCom answered {} (not subscribed) while the socket was open: subscribing anew",
                frame::NOT_SUBSCRIBED
            ),
        ));
    }
    if frame.headers.req_id.starts_with(frame::PING) {
        context.count("pong");
        return None;
    }
    context.count("answer");
    None
}

/// Parses a callback and hands it on without waiting for handlers or the store: to its
/// chat's lane, or to a reply task of its own. The reader waits only when the callbacks held
/// reach [`HELD_BYTES`], and the watchdog knows it.
async fn callback<I: Inlet>(
    context: &Arc<Context<I>>,
    frame: &Incoming,
    lanes: &[mpsc::UnboundedSender<Taken>],
    watchdog: &Watchdog,
) {
    context.count(if frame.cmd.as_deref() == Some(frame::MESSAGE) {
        "message"
    } else {
        "event"
    });
    let body = match frame.body() {
        Ok(body) => body,
        Err(error) => return context.garbage(error.label(), &error.to_string()),
    };
    let admit = match context.bot.admit(Bytes::copy_from_slice(body.as_bytes())) {
        Ok(admit) => admit,
        Err(error) => return context.garbage("bad_callback", &error.to_string()),
    };
    let size = u32::try_from(body.len().clamp(1, HELD_BYTES)).unwrap_or(u32::MAX);
    let bytes = match context.held.clone().try_acquire_many_owned(size) {
        Ok(bytes) => bytes,
        Err(_) => {
            watchdog.paused.store(true, Ordering::Relaxed);
            let bytes = context.held.clone().acquire_many_owned(size).await;
            watchdog.paused.store(false, Ordering::Relaxed);
            watchdog.alive();
            match bytes {
                Ok(bytes) => bytes,
                Err(_) => return,
            }
        }
    };
    if context.inlet.replies(&admit.event) {
        // Answered by its handler, which may take minutes: beside the lanes, bounded, and
        // after the conversation's reply before it.
        let context = context.clone();
        let req_id = frame.headers.req_id.clone();
        let (before, done) = context.replies.turn(admit.event.order_hash());
        tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            let Ok(permit) = context.replies.permits.clone().acquire_owned().await else {
                return;
            };
            reply::answer(context, admit, req_id).await;
            drop((done, permit, bytes));
        });
    } else {
        let lane = (admit.event.order_hash() % lanes.len() as u64) as usize;
        let _ = lanes[lane].send((admit, bytes));
    }
}

/// Admits one lane's callbacks one after another. The store's outage is waited out for a while
/// (the gateway spools what it cannot admit); a callback still refused is counted and said.
async fn admit_in_order<I: Inlet>(
    context: Arc<Context<I>>,
    mut work: mpsc::UnboundedReceiver<Taken>,
) {
    let source = context.settings.source.clone();
    let admitted =
        metrics::counter!("oncegate_ws_acks_total", "source" => source.clone(), "code" => "200");
    while let Some((admit, _bytes)) = work.recv().await {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match context.inlet.admit(admit.clone()).await {
                Ok(_) => {
                    admitted.increment(1);
                    break;
                }
                Err(refusal)
                    if refusal.kind == RefusalKind::Unavailable && attempt < ADMIT_ATTEMPTS =>
                {
                    tokio::time::sleep(oncegate_longconn::backoff(Duration::ZERO, attempt)).await;
                }
                Err(refusal) => {
                    metrics::counter!("oncegate_ws_refused_total", "source" => source.clone(), "reason" => refusal.label)
                        .increment(1);
                    context.inlet.note(
                        "ws_admit_failed",
                        &format!(
                            "long connection {source}: callback {} not admitted ({}): {}; WeCom \
                             is not known to send it again",
                            admit.event.event_id, refusal.label, refusal.message
                        ),
                    );
                    break;
                }
            }
        }
    }
}

/// Writes commands as they come and a ping every interval; stops on a failed write, on pings
/// left unanswered, or at the end of the connection, saying why when it was not asked to.
async fn write<W>(
    mut sink: W,
    mut letters: mpsc::Receiver<String>,
    settings: Settings,
    watchdog: Arc<Watchdog>,
    ended: CancellationToken,
) -> Option<End>
where
    W: futures_util::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    let mut next_ping = tokio::time::Instant::now() + settings.ping_every;
    let why = loop {
        let text = tokio::select! {
            _ = ended.cancelled() => break None,
            letter = letters.recv() => match letter {
                Some(text) => text,
                None => break None,
            },
            _ = tokio::time::sleep_until(next_ping) => {
                next_ping = tokio::time::Instant::now() + settings.ping_every;
                let unanswered = watchdog.ping();
                if unanswered >= settings.missed_pings {
                    break Some(lost("silent", format!(
                        "{unanswered} pings in a row unanswered: taken for half-open"
                    )));
                }
                frame::command(frame::PING, &frame::req_id(frame::PING), None)
            }
        };
        match tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::text(text))).await {
            Ok(Ok(())) => {}
            _ => break Some(lost("write_failed", "a write failed or timed out".into())),
        }
    };
    ended.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    why
}
