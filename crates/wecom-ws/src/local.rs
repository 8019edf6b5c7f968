//! An AI-bot server on loopback that speaks WeCom's long connection (doc 101463, the official
//! SDK's frames): it answers a subscribe with the bot's id and secret (and refuses others),
//! answers pings, pushes callbacks to the subscribed connection (holding them while none is),
//! takes a bot over from its older connection with a `disconnected_event` as WeCom does, and
//! acknowledges and records every other command (replies, sends). For tests and
//! `oncegate simulate`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::Message;

use crate::frame::{self, Incoming};

/// What the server does to one connection.
enum Out {
    Text(String),
    Binary(Vec<u8>),
    /// Cut without a close frame.
    Drop,
}

#[derive(Default)]
struct State {
    next_connection: u64,
    /// The connection subscribed now, which callbacks go to.
    current: Option<(u64, mpsc::UnboundedSender<Out>)>,
    subscribes: Vec<(u64, Instant)>,
    refused: u64,
    pings: u64,
    silent: bool,
    takeovers: u64,
    waiting: VecDeque<String>,
    /// Text frames written to a socket.
    written: u64,
    received: Vec<Value>,
    /// Connections whose subscription WeCom lost while their sockets live: every command of
    /// theirs is answered 846609.
    forgotten: std::collections::HashSet<u64>,
    /// The errcode every command but subscribes and pings is answered with, when set.
    refusing: Option<i64>,
    /// Commands but subscribes and pings are recorded and never answered.
    mute: bool,
    /// The errcode every subscribe is refused with, when set (a rate limit, say).
    refusing_subscribes: Option<i64>,
}

struct Inner {
    bot_id: String,
    secret: String,
    state: Mutex<State>,
    changed: Notify,
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A running local AI-bot server; it stops when dropped.
pub struct LocalAiBot {
    url: String,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LocalAiBot {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LocalAiBot {
    /// Listens on a free loopback port for bot `bot_id` with `secret`.
    pub async fn start(bot_id: &str, secret: &str) -> std::io::Result<Self> {
        Self::start_at(
            "127.0.0.1:0".parse().expect("a loopback address"),
            bot_id,
            secret,
        )
        .await
    }

    /// Listens on `address`.
    pub async fn start_at(
        address: SocketAddr,
        bot_id: &str,
        secret: &str,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(address).await?;
        let url = format!("ws://{}", listener.local_addr()?);
        let inner = Arc::new(Inner {
            bot_id: bot_id.to_owned(),
            secret: secret.to_owned(),
            state: Mutex::new(State::default()),
            changed: Notify::new(),
        });
        let serving = inner.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let inner = serving.clone();
                tokio::spawn(async move {
                    if let Ok(socket) = tokio_tungstenite::accept_async(stream).await {
                        serve(inner, socket).await;
                    }
                });
            }
        });
        Ok(Self { url, inner, task })
    }

    /// The address a source's `domain` names (`ws://127.0.0.1:…`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends a callback (`cmd` [`frame::MESSAGE`] or [`frame::EVENT`]) with `body` under a fresh
    /// `req_id` to the subscribed connection, or holds it until one subscribes. Returns the
    /// `req_id`.
    pub fn push(&self, cmd: &str, body: &Value) -> String {
        let req_id = format!("REQ{:016x}", fastrand::u64(..));
        let text = json!({"cmd": cmd, "headers": {"req_id": req_id}, "body": body}).to_string();
        let mut state = self.inner.state();
        let delivered = match &state.current {
            Some((_, out)) => out.send(Out::Text(text.clone())).is_ok(),
            None => false,
        };
        if !delivered {
            state.waiting.push_back(text);
        }
        req_id
    }

    /// Text frames the server has written to a socket (callbacks, raw frames, takeovers; not
    /// answers): what a client must have read.
    pub fn written(&self) -> u64 {
        self.inner.state().written
    }

    /// Sends `text` as it is (a text message) to the subscribed connection; whether one was.
    pub fn send_raw(&self, text: &str) -> bool {
        self.send_out(Out::Text(text.to_owned()))
    }

    /// Sends `bytes` as a binary message to the subscribed connection; whether one was.
    pub fn send_binary(&self, bytes: &[u8]) -> bool {
        self.send_out(Out::Binary(bytes.to_vec()))
    }

    fn send_out(&self, out: Out) -> bool {
        match &self.inner.state().current {
            Some((_, connection)) => connection.send(out).is_ok(),
            None => false,
        }
    }

    /// Subscribes answered with success so far, and when.
    pub fn subscribes(&self) -> Vec<Instant> {
        self.inner
            .state()
            .subscribes
            .iter()
            .map(|(_, at)| *at)
            .collect()
    }

    /// Subscribes refused so far (a wrong bot id or secret).
    pub fn refused(&self) -> u64 {
        self.inner.state().refused
    }

    /// `disconnected_event`s sent so far (each a takeover).
    pub fn takeovers(&self) -> u64 {
        self.inner.state().takeovers
    }

    /// Pings answered so far.
    pub fn pings(&self) -> u64 {
        self.inner.state().pings
    }

    /// Whether a connection is subscribed now.
    pub fn subscribed(&self) -> bool {
        self.inner.state().current.is_some()
    }

    /// Callbacks held for want of a subscribed connection.
    pub fn waiting(&self) -> usize {
        self.inner.state().waiting.len()
    }

    /// Every command other than subscribes and pings, as received (replies, sends).
    pub fn received(&self) -> Vec<Value> {
        self.inner.state().received.clone()
    }

    /// Stops answering pings (a half-open connection), or answers them again.
    pub fn silence(&self, silent: bool) {
        self.inner.state().silent = silent;
    }

    /// Cuts the subscribed connection without a close frame.
    pub fn drop_connection(&self) {
        if let Some((_, out)) = self.inner.state().current.take() {
            let _ = out.send(Out::Drop);
        }
    }

    /// Tells the subscribed connection it was taken over, as if a client elsewhere subscribed
    /// as the bot, and leaves its socket open (answering pings, receiving nothing), as WeCom
    /// was seen to.
    pub fn take_over_from_elsewhere(&self) {
        let mut state = self.inner.state();
        if let Some((_, out)) = state.current.take() {
            let _ = out.send(Out::Text(disconnected(&self.inner.bot_id)));
            state.takeovers += 1;
        }
    }

    /// Loses the subscribed connection's subscription without a word, its socket left open:
    /// every command of it, pings too, is answered 846609 (*not subscribed*), as WeCom was seen
    /// to answer sends.
    pub fn forget_subscription(&self) {
        let mut state = self.inner.state();
        if let Some((id, _)) = state.current.take() {
            state.forgotten.insert(id);
        }
    }

    /// Answers every command but subscribes and pings (replies, sends) with errcode `code`
    /// (recording it all the same), or, with `None`, with success again.
    pub fn refuse_commands(&self, code: Option<i64>) {
        self.inner.state().refusing = code;
    }

    /// Refuses every subscribe with errcode `code` (WeCom protecting its subscribe rate:
    /// 45009), or, with `None`, takes them again.
    pub fn refuse_subscribes(&self, code: Option<i64>) {
        self.inner.state().refusing_subscribes = code;
    }

    /// Records every command but subscribes and pings and leaves it unanswered (WeCom slow
    /// beyond the client's wait), or answers them again.
    pub fn mute_commands(&self, mute: bool) {
        self.inner.state().mute = mute;
    }

    /// Waits until `n` subscribes succeeded in all, or `within` passed.
    pub async fn wait_for_subscribes(&self, n: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.inner.changed.notified();
            if self.inner.state().subscribes.len() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.inner.state().subscribes.len() >= n;
            }
        }
    }
}

/// A user's text message, as doc 101463 shows it.
pub fn text_message(
    bot_id: &str,
    msgid: &str,
    chat: Option<&str>,
    user: &str,
    content: &str,
) -> Value {
    let mut body = json!({
        "msgid": msgid,
        "aibotid": bot_id,
        "chattype": if chat.is_some() { "group" } else { "single" },
        "from": {"userid": user},
        "msgtype": "text",
        "text": {"content": content},
    });
    if let Some(chat) = chat {
        body["chatid"] = json!(chat);
    }
    body
}

/// A user entering the bot's single chat.
pub fn enter_chat(bot_id: &str, msgid: &str, user: &str) -> Value {
    json!({
        "msgid": msgid,
        "create_time": oncegate_longconn::unix_ms() / 1000,
        "aibotid": bot_id,
        "from": {"userid": user},
        "msgtype": "event",
        "event": {"eventtype": "enter_chat"},
    })
}

fn disconnected(bot_id: &str) -> String {
    json!({
        "cmd": frame::EVENT,
        "headers": {"req_id": format!("REQ{:016x}", fastrand::u64(..))},
        "body": {
            "msgid": format!("DISC{:016x}", fastrand::u64(..)),
            "create_time": oncegate_longconn::unix_ms() / 1000,
            "aibotid": bot_id,
            "msgtype": "event",
            "event": {"eventtype": frame::DISCONNECTED},
        },
    })
    .to_string()
}

type ServerSocket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn serve(inner: Arc<Inner>, socket: ServerSocket) {
    let (mut sink, mut stream) = socket.split();
    let (out, mut outgoing) = mpsc::unbounded_channel::<Out>();
    let id = {
        let mut state = inner.state();
        state.next_connection += 1;
        state.next_connection
    };
    loop {
        tokio::select! {
            message = stream.next() => {
                let text = match message {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => continue,
                };
                let Ok(frame) = Incoming::parse(&text) else { continue };
                let answer = command(&inner, id, &out, &frame, &text);
                if let Some(answer) = answer
                    && sink.send(Message::text(answer)).await.is_err()
                {
                    break;
                }
            }
            next = outgoing.recv() => match next {
                Some(Out::Text(text)) => {
                    if sink.send(Message::text(text)).await.is_err() {
                        break;
                    }
                    inner.state().written += 1;
                }
                Some(Out::Binary(bytes)) => {
                    if sink.send(Message::binary(bytes)).await.is_err() {
                        break;
                    }
                }
                Some(Out::Drop) | None => return,
            },
        }
    }
    let mut state = inner.state();
    if state
        .current
        .as_ref()
        .is_some_and(|(current, _)| *current == id)
    {
        state.current = None;
    }
}

/// Handles one command of connection `id`; the answer to send, if any.
fn command(
    inner: &Inner,
    id: u64,
    out: &mpsc::UnboundedSender<Out>,
    frame: &Incoming,
    text: &str,
) -> Option<String> {
    let req_id = frame.headers.req_id.as_str();
    let mut state = inner.state();
    if state.forgotten.contains(&id) && frame.cmd.as_deref() != Some(frame::SUBSCRIBE) {
        return Some(frame::answer(
            req_id,
            frame::NOT_SUBSCRIBED,
            "aibot websocket not subscribed",
        ));
    }
    match frame.cmd.as_deref() {
        Some(frame::SUBSCRIBE) => {
            let body: Value = frame
                .body
                .as_deref()
                .and_then(|body| serde_json::from_str(body.get()).ok())
                .unwrap_or(Value::Null);
            if let Some(code) = state.refusing_subscribes {
                state.refused += 1;
                return Some(frame::answer(req_id, code, "api freq out of limit"));
            }
            if body["bot_id"] != inner.bot_id.as_str() || body["secret"] != inner.secret.as_str() {
                state.refused += 1;
                return Some(frame::answer(req_id, 600_017, "invalid bot_id or secret"));
            }
            // One connection per bot: the older one is told, then cut.
            if let Some((_, older)) = state.current.take() {
                let _ = older.send(Out::Text(disconnected(&inner.bot_id)));
                let _ = older.send(Out::Drop);
                state.takeovers += 1;
            }
            state.current = Some((id, out.clone()));
            state.subscribes.push((id, Instant::now()));
            for waiting in std::mem::take(&mut state.waiting) {
                let _ = out.send(Out::Text(waiting));
            }
            inner.changed.notify_waiters();
            // The answer goes out before the callbacks queued above: it is written at once.
            Some(frame::answer(req_id, 0, "ok"))
        }
        Some(frame::PING) => {
            if state.silent {
                return None;
            }
            state.pings += 1;
            Some(frame::answer(req_id, 0, "ok"))
        }
        Some(_) => {
            let subscribed = state
                .current
                .as_ref()
                .is_some_and(|(current, _)| *current == id);
            if let Ok(value) = serde_json::from_str(text) {
                state.received.push(value);
            }
            inner.changed.notify_waiters();
            if state.mute {
                return None;
            }
            if let Some(code) = state.refusing {
                return Some(frame::answer(req_id, code, "refused by the local server"));
            }
            Some(match subscribed {
                true => frame::answer(req_id, 0, "ok"),
                false => frame::answer(
                    req_id,
                    frame::NOT_SUBSCRIBED,
                    "aibot websocket not subscribed",
                ),
            })
        }
        None => None,
    }
}
