//! A DingTalk-like registration endpoint and Stream server on loopback, written from the
//! protocol sheet (`shared/protocols/sources.md` §1c), for tests: tickets valid 90 s for one
//! connection, JSON frames, `ping` and `disconnect` system frames, pushes of events and robot
//! messages, identical re-pushes of what was not acked (or acked late), and a record of every
//! ack.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

/// How long a ticket opens a connection.
pub const TICKET_LIFE: Duration = Duration::from_secs(90);

/// One ack the server received.
#[derive(Debug, Clone)]
pub struct AckRecord {
    /// The connection it came on.
    pub connection: u64,
    /// Its `headers.messageId`.
    pub message_id: String,
    /// Its `code`.
    pub code: i64,
    /// Its `data`, the string as sent.
    pub data: String,
    /// When it came.
    pub at: Instant,
}

enum Command {
    Send(String),
    Close,
}

struct Connection {
    commands: mpsc::UnboundedSender<Command>,
}

#[derive(Default)]
struct Inner {
    connections: BTreeMap<u64, Connection>,
    next_connection: u64,
    tickets: HashMap<String, Instant>,
    registrations: u64,
    refused_tickets: u64,
    /// Every frame pushed, by message id, as sent.
    frames: HashMap<String, String>,
    /// Frames pushed and not yet acked as done, with when they were last pushed.
    unacked: HashMap<String, Instant>,
    acks: Vec<AckRecord>,
}

struct Shared {
    client_id: String,
    client_secret: String,
    ws_addr: SocketAddr,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The server; it stops when dropped.
pub struct LocalDingtalk {
    shared: Arc<Shared>,
    http_addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for LocalDingtalk {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for connection in self.shared.lock().connections.values() {
            let _ = connection.commands.send(Command::Close);
        }
    }
}

/// A frame of `kind` with `headers` and `data`, as DingTalk writes it.
pub fn frame(kind: &str, headers: Value, data: &str) -> String {
    serde_json::json!({"specVersion": "1.0", "type": kind, "headers": headers, "data": data})
        .to_string()
}

impl LocalDingtalk {
    /// Starts both listeners on loopback ports of their own for the app `client_id` with
    /// `client_secret`.
    pub async fn start(client_id: &str, client_secret: &str) -> std::io::Result<Self> {
        let http = TcpListener::bind("127.0.0.1:0").await?;
        let ws = TcpListener::bind("127.0.0.1:0").await?;
        let shared = Arc::new(Shared {
            client_id: client_id.to_owned(),
            client_secret: client_secret.to_owned(),
            ws_addr: ws.local_addr()?,
            inner: Mutex::new(Inner::default()),
        });
        let http_addr = http.local_addr()?;
        let router = axum::Router::new()
            .route("/v1.0/gateway/connections/open", post(register))
            .with_state(shared.clone());
        let tasks = vec![
            tokio::spawn(async move {
                let _ = axum::serve(http, router).await;
            }),
            tokio::spawn(accept(ws, shared.clone())),
        ];
        Ok(Self {
            shared,
            http_addr,
            tasks,
        })
    }

    /// The domain to configure: `http://127.0.0.1:<port>`.
    pub fn domain(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// Connections open now, lowest id first.
    pub fn connections(&self) -> Vec<u64> {
        self.shared.lock().connections.keys().copied().collect()
    }

    /// Waits until `n` connections are open; false after `within`.
    pub async fn wait_for_connections(&self, n: usize, within: Duration) -> bool {
        oncegate_longconn::wait_for(within, || self.connections().len() >= n).await
    }

    /// Registrations answered with a ticket so far.
    pub fn registrations(&self) -> u64 {
        self.shared.lock().registrations
    }

    /// Handshakes refused for a missing, used or expired ticket.
    pub fn refused_tickets(&self) -> u64 {
        self.shared.lock().refused_tickets
    }

    /// Sends `text` on `connection` as pushed frame `message_id`, remembered for re-pushes
    /// and waiting for its ack.
    fn push_frame(&self, connection: u64, message_id: &str, text: String) -> bool {
        let mut inner = self.shared.lock();
        let Some(conn) = inner.connections.get(&connection) else {
            return false;
        };
        if conn.commands.send(Command::Send(text.clone())).is_err() {
            return false;
        }
        inner.frames.insert(message_id.to_owned(), text);
        inner.unacked.insert(message_id.to_owned(), Instant::now());
        true
    }

    /// Pushes an `EVENT` with DingTalk's headers and `data` as its payload.
    pub fn push_event(
        &self,
        connection: u64,
        message_id: &str,
        event_id: &str,
        event_type: &str,
        data: &Value,
    ) -> bool {
        let headers = serde_json::json!({
            "topic": "*", "messageId": message_id, "contentType": "application/json",
            "time": now_ms().to_string(), "appId": self.shared.client_id,
            "eventId": event_id, "eventType": event_type, "eventCorpId": "ding_local_corp",
            "eventBornTime": now_ms().to_string(), "eventUnifiedAppId": "local",
        });
        self.push_frame(
            connection,
            message_id,
            frame("EVENT", headers, &data.to_string()),
        )
    }

    /// Pushes a robot message (`CALLBACK` on the robot topic) whose payload is `data`.
    pub fn push_bot_message(&self, connection: u64, message_id: &str, data: &Value) -> bool {
        let headers = serde_json::json!({
            "topic": oncegate_dingtalk::stream::BOT_TOPIC, "messageId": message_id,
            "contentType": "application/json", "time": now_ms().to_string(),
            "appId": self.shared.client_id,
        });
        self.push_frame(
            connection,
            message_id,
            frame("CALLBACK", headers, &data.to_string()),
        )
    }

    /// Pushes the frame `message_id` again, byte for byte, on `connection`: DingTalk's
    /// re-push of a message whose ack was missing or late.
    pub fn repush(&self, connection: u64, message_id: &str) -> bool {
        let text = self.shared.lock().frames.get(message_id).cloned();
        text.is_some_and(|text| self.push_frame(connection, message_id, text))
    }

    /// Pushes every frame not acked as done again, identical, on `connection`.
    pub fn repush_unacked(&self, connection: u64) -> usize {
        let ids: Vec<String> = self.shared.lock().unacked.keys().cloned().collect();
        ids.iter().filter(|id| self.repush(connection, id)).count()
    }

    /// Sends a `ping` with `opaque`; its ack must echo it.
    pub fn ping(&self, connection: u64, opaque: &str) -> bool {
        let headers = serde_json::json!({"topic": "ping", "messageId": format!("ping-{opaque}")});
        let text = frame(
            "SYSTEM",
            headers,
            &serde_json::json!({"opaque": opaque}).to_string(),
        );
        self.send(connection, text)
    }

    /// Sends a `disconnect` and closes the connection `after` it (DingTalk: about 10 s).
    pub fn disconnect(&self, connection: u64, after: Duration) -> bool {
        let headers =
            serde_json::json!({"topic": "disconnect", "messageId": format!("bye-{connection}")});
        let text = frame("SYSTEM", headers, r#"{"reason":"rebalance"}"#);
        if !self.send(connection, text) {
            return false;
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(conn) = shared.lock().connections.remove(&connection) {
                let _ = conn.commands.send(Command::Close);
            }
        });
        true
    }

    /// Sends raw text as one message.
    pub fn send(&self, connection: u64, text: String) -> bool {
        let inner = self.shared.lock();
        inner
            .connections
            .get(&connection)
            .is_some_and(|conn| conn.commands.send(Command::Send(text)).is_ok())
    }

    /// Closes a connection without a word (the client sees the socket end).
    pub fn drop_connection(&self, connection: u64) {
        if let Some(conn) = self.shared.lock().connections.remove(&connection) {
            let _ = conn.commands.send(Command::Close);
        }
    }

    /// Every ack so far.
    pub fn acks(&self) -> Vec<AckRecord> {
        self.shared.lock().acks.clone()
    }

    /// Message ids pushed and not acked as done, sorted.
    pub fn unacked(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.shared.lock().unacked.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Waits until no pushed frame waits for its ack; false after `within`.
    pub async fn wait_all_acked(&self, within: Duration) -> bool {
        oncegate_longconn::wait_for(within, || self.shared.lock().unacked.is_empty()).await
    }
}

fn now_ms() -> u64 {
    oncegate_longconn::unix_ms()
}

/// `POST /v1.0/gateway/connections/open`: a ticket for the app's own credentials.
async fn register(
    State(shared): State<Arc<Shared>>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    if body["clientId"] != shared.client_id.as_str()
        || body["clientSecret"] != shared.client_secret.as_str()
    {
        return (
            StatusCode::UNAUTHORIZED,
            Json(
                serde_json::json!({"code": "InvalidAuthentication", "message": "clientId or clientSecret is wrong"}),
            ),
        );
    }
    let ticket = format!("t-{:016x}/+=", fastrand::u64(..));
    let mut inner = shared.lock();
    inner.registrations += 1;
    inner.tickets.insert(ticket.clone(), Instant::now());
    (
        StatusCode::OK,
        Json(serde_json::json!({
            "endpoint": format!("ws://{}/connect", shared.ws_addr),
            "ticket": ticket,
        })),
    )
}

/// The ticket in a handshake's query, decoded.
fn ticket_of(request: &Request) -> Option<String> {
    request.uri().query()?.split('&').find_map(|pair| {
        let value = pair.strip_prefix("ticket=")?;
        Some(
            percent_encoding::percent_decode_str(value)
                .decode_utf8_lossy()
                .into_owned(),
        )
    })
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            let checked = shared.clone();
            // The signature is tungstenite's.
            #[allow(clippy::result_large_err)]
            let check =
                move |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
                    let mut inner = checked.lock();
                    // One connection per ticket, within its life.
                    let fresh = ticket_of(request)
                        .and_then(|ticket| inner.tickets.remove(&ticket))
                        .is_some_and(|issued| issued.elapsed() < TICKET_LIFE);
                    if fresh {
                        return Ok(response);
                    }
                    inner.refused_tickets += 1;
                    let mut refused = ErrorResponse::new(Some("invalid ticket".into()));
                    *refused.status_mut() = StatusCode::UNAUTHORIZED;
                    Err(refused)
                };
            if let Ok(socket) = tokio_tungstenite::accept_hdr_async(stream, check).await {
                serve(socket, shared).await;
            }
        });
    }
}

async fn serve<S>(socket: tokio_tungstenite::WebSocketStream<S>, shared: Arc<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (commands, mut orders) = mpsc::unbounded_channel();
    let id = {
        let mut inner = shared.lock();
        inner.next_connection += 1;
        let id = inner.next_connection;
        inner.connections.insert(id, Connection { commands });
        id
    };
    let (mut sink, mut stream) = socket.split();
    loop {
        tokio::select! {
            order = orders.recv() => match order {
                Some(Command::Send(text)) => {
                    if sink.send(Message::Text(text.into())).await.is_err() { break; }
                }
                Some(Command::Close) | None => break,
            },
            message = stream.next() => match message {
                Some(Ok(Message::Text(text))) => received(&shared, id, text.as_bytes()),
                Some(Ok(_)) => {}
                _ => break,
            },
        }
    }
    let _ = sink.close().await;
    shared.lock().connections.remove(&id);
}

/// Records an ack; an event's counts as done only with `SUCCESS`.
fn received(shared: &Shared, connection: u64, text: &[u8]) {
    let Ok(ack) = serde_json::from_slice::<Value>(text) else {
        return;
    };
    let message_id = ack["headers"]["messageId"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let code = ack["code"].as_i64().unwrap_or(-1);
    let data = ack["data"].as_str().unwrap_or("").to_owned();
    let later = serde_json::from_str::<Value>(&data).is_ok_and(|data| data["status"] == "LATER");
    let mut inner = shared.lock();
    if code == 200 && !later {
        inner.unacked.remove(&message_id);
    }
    inner.acks.push(AckRecord {
        connection,
        message_id,
        code,
        data,
        at: Instant::now(),
    });
}
