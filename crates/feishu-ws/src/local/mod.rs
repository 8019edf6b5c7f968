//! A Feishu-like endpoint and WebSocket server on loopback, for tests and `oncegate simulate`:
//! it hands out client configs, pushes events whole or in fragments in any order, repeats
//! frames, resends what was not acked (on the same or another connection), refuses handshakes
//! as Feishu does, goes silent without closing, and records every ack.

mod frames;
mod server;

pub use frames::*;
use server::*;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

use crate::ClientConfig;
use crate::frame::{Frame, Header, METHOD_CONTROL, METHOD_DATA};

/// One ack the server received.
#[derive(Debug, Clone)]
pub struct AckRecord {
    /// The connection it came on.
    pub connection: u64,
    /// The frame's SeqID.
    pub seq_id: u64,
    /// Its `message_id` header.
    pub message_id: String,
    /// The answer's `code`.
    pub code: i64,
    /// The answer's `data`, base64-decoded.
    pub data: Option<Vec<u8>>,
    /// Its `biz_rt` header, if any.
    pub biz_rt: Option<String>,
    /// When it came.
    pub at: Instant,
    /// How long after its event was (last) pushed.
    pub after: Option<Duration>,
}

/// What [`LocalFeishu::drive`] saw.
#[derive(Debug, Clone, Default)]
pub struct Driven {
    /// Events pushed (redeliveries included).
    pub pushed: usize,
    /// Acks with code 200.
    pub acked: usize,
    /// Acks with another code.
    pub failed: usize,
    /// Events still unacked when the run ended.
    pub unacked: usize,
    /// From the first push to the last ack.
    pub elapsed: Duration,
    /// Push-to-ack time of every ack with code 200, sorted.
    pub latencies: Vec<Duration>,
}

/// How the parts of a fragmented event are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartOrder {
    /// 0, 1, 2, …
    InOrder,
    /// Last first.
    Reversed,
}

enum Command {
    Send(Vec<u8>),
    Close,
}

struct Connection {
    commands: mpsc::UnboundedSender<Command>,
    silent: Arc<AtomicBool>,
    next_seq: u64,
}

#[derive(Default)]
struct Inner {
    connections: BTreeMap<u64, Connection>,
    next_connection: u64,
    /// Every event pushed, by message id.
    payloads: HashMap<String, Bytes>,
    /// Events pushed and not yet acked with code 200, with when they were last pushed.
    unacked: HashMap<String, Instant>,
    acks: Vec<AckRecord>,
    handshakes: Vec<Instant>,
    refusals: VecDeque<(u16, Option<String>)>,
    endpoint_code: i64,
    endpoint_calls: u64,
    pings: u64,
    pong_config: Option<ClientConfig>,
}

struct Shared {
    app_id: String,
    app_secret: String,
    config: Mutex<ClientConfig>,
    inner: Mutex<Inner>,
    ws_addr: SocketAddr,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The server; it stops when dropped.
pub struct LocalFeishu {
    shared: Arc<Shared>,
    http_addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for LocalFeishu {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for connection in self.shared.lock().connections.values() {
            let _ = connection.commands.send(Command::Close);
        }
    }
}

impl LocalFeishu {
    /// Starts both listeners on loopback ports of their own for the app `app_id` with
    /// `app_secret`.
    pub async fn start(
        app_id: &str,
        app_secret: &str,
        config: ClientConfig,
    ) -> std::io::Result<Self> {
        Self::start_at("127.0.0.1:0", app_id, app_secret, config).await
    }

    /// Starts the endpoint on `http_addr` (what a gateway's `domain` names) and the socket on
    /// a free port beside it.
    pub async fn start_at(
        http_addr: &str,
        app_id: &str,
        app_secret: &str,
        config: ClientConfig,
    ) -> std::io::Result<Self> {
        let http = TcpListener::bind(http_addr).await?;
        let ws = TcpListener::bind((http.local_addr()?.ip(), 0)).await?;
        let shared = Arc::new(Shared {
            app_id: app_id.to_owned(),
            app_secret: app_secret.to_owned(),
            config: Mutex::new(config),
            inner: Mutex::new(Inner::default()),
            ws_addr: ws.local_addr()?,
        });
        let http_addr = http.local_addr()?;
        let router = axum::Router::new()
            .route("/callback/ws/endpoint", post(endpoint))
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

    /// The client config the endpoint hands out from now on.
    pub fn set_config(&self, config: ClientConfig) {
        *self.shared.config.lock().unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// A client config sent in every pong from now on.
    pub fn pong_with(&self, config: ClientConfig) {
        self.shared.lock().pong_config = Some(config);
    }

    /// The endpoint answers `code` from now on (0: a URL).
    pub fn endpoint_code(&self, code: i64) {
        self.shared.lock().endpoint_code = code;
    }

    /// The next handshake is refused with `status` and, if given, `Handshake-Autherrcode`.
    pub fn refuse_handshake(&self, status: u16, auth_code: Option<&str>) {
        self.shared
            .lock()
            .refusals
            .push_back((status, auth_code.map(str::to_owned)));
    }

    /// Connections open now (not counting silent ones), lowest id first.
    pub fn connections(&self) -> Vec<u64> {
        let inner = self.shared.lock();
        inner
            .connections
            .iter()
            .filter(|(_, c)| !c.silent.load(Ordering::Relaxed))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Waits until `n` connections are open; false after `within`.
    pub async fn wait_for_connections(&self, n: usize, within: Duration) -> bool {
        oncegate_longconn::wait_for(within, || self.connections().len() >= n).await
    }

    /// When each handshake (refused or not) came.
    pub fn handshakes(&self) -> Vec<Instant> {
        self.shared.lock().handshakes.clone()
    }

    /// Endpoint requests so far.
    pub fn endpoint_calls(&self) -> u64 {
        self.shared.lock().endpoint_calls
    }

    /// Pings received so far.
    pub fn pings(&self) -> u64 {
        self.shared.lock().pings
    }

    /// Every ack so far.
    pub fn acks(&self) -> Vec<AckRecord> {
        self.shared.lock().acks.clone()
    }

    /// Message ids pushed and not acked with code 200.
    pub fn unacked(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.shared.lock().unacked.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Waits until no event waits for its ack; false after `within`.
    pub async fn wait_all_acked(&self, within: Duration) -> bool {
        oncegate_longconn::wait_for(within, || self.shared.lock().unacked.is_empty()).await
    }

    /// Pushes `payload` as message `message_id` on `connection`, in `parts` fragments sent in
    /// `order`; returns the SeqIDs used. False if there is no such connection.
    pub fn push(
        &self,
        connection: u64,
        message_id: &str,
        payload: &[u8],
        parts: usize,
        order: PartOrder,
    ) -> Option<Vec<u64>> {
        let mut inner = self.shared.lock();
        let conn = inner.connections.get_mut(&connection)?;
        let parts = parts.clamp(1, payload.len().max(1));
        let chunk = payload.len().div_ceil(parts).max(1);
        let mut frames: Vec<(u64, Vec<u8>)> = payload
            .chunks(chunk)
            .enumerate()
            .map(|(seq, bytes)| {
                conn.next_seq += 1;
                let sum = payload.len().div_ceil(chunk).max(1);
                (
                    conn.next_seq,
                    data_frame(conn.next_seq, message_id, sum, seq, bytes),
                )
            })
            .collect();
        if payload.is_empty() {
            conn.next_seq += 1;
            frames.push((
                conn.next_seq,
                data_frame(conn.next_seq, message_id, 1, 0, b""),
            ));
        }
        if order == PartOrder::Reversed {
            frames.reverse();
        }
        for (_, frame) in &frames {
            let _ = conn.commands.send(Command::Send(frame.clone()));
        }
        inner
            .payloads
            .insert(message_id.to_owned(), Bytes::copy_from_slice(payload));
        inner.unacked.insert(message_id.to_owned(), Instant::now());
        Some(frames.into_iter().map(|(seq, _)| seq).collect())
    }

    /// Sends the same frame (same SeqID) again: a resend on one connection.
    pub fn repeat(&self, connection: u64, seq_id: u64, message_id: &str) -> bool {
        let inner = self.shared.lock();
        let (Some(payload), Some(conn)) = (
            inner.payloads.get(message_id),
            inner.connections.get(&connection),
        ) else {
            return false;
        };
        let frame = data_frame(seq_id, message_id, 1, 0, payload);
        conn.commands.send(Command::Send(frame)).is_ok()
    }

    /// Pushes every event not acked with code 200 again, whole, on `connection`.
    pub fn resend_unacked(&self, connection: u64) -> usize {
        let pending: Vec<(String, Bytes)> = {
            let inner = self.shared.lock();
            inner
                .unacked
                .keys()
                .filter_map(|id| Some((id.clone(), inner.payloads.get(id)?.clone())))
                .collect()
        };
        pending
            .iter()
            .filter(|(id, payload)| {
                self.push(connection, id, payload, 1, PartOrder::InOrder)
                    .is_some()
            })
            .count()
    }

    /// Pushes `plan` (message id, event) over the open connections in turn, with at most
    /// `window` unacked at once, and waits for the acks until `within` has passed.
    pub async fn drive(
        &self,
        plan: Vec<(String, Vec<u8>)>,
        window: usize,
        within: Duration,
    ) -> Driven {
        self.drive_at(plan, window, within, 0.0).await
    }

    /// `drive`, pushing at most `rate` frames a second (0: as fast as the window allows).
    pub async fn drive_at(
        &self,
        plan: Vec<(String, Vec<u8>)>,
        window: usize,
        within: Duration,
        rate: f64,
    ) -> Driven {
        let started = Instant::now();
        let acks_before = self.shared.lock().acks.len();
        let mut pushed = 0;
        let mut turn = 0usize;
        for (index, (message_id, payload)) in plan.iter().enumerate() {
            if rate > 0.0 {
                let due = started + Duration::from_secs_f64(index as f64 / rate);
                if due > started + within {
                    break;
                }
                tokio::time::sleep_until(due.into()).await;
            }
            loop {
                let (open, waiting) = {
                    let inner = self.shared.lock();
                    let open: Vec<u64> = inner
                        .connections
                        .iter()
                        .filter(|(_, c)| !c.silent.load(Ordering::Relaxed))
                        .map(|(id, _)| *id)
                        .collect();
                    (open, inner.unacked.len())
                };
                if started.elapsed() > within {
                    break;
                }
                if open.is_empty() || waiting >= window {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    continue;
                }
                turn += 1;
                if self
                    .push(
                        open[turn % open.len()],
                        message_id,
                        payload,
                        1,
                        PartOrder::InOrder,
                    )
                    .is_some()
                {
                    pushed += 1;
                    break;
                }
            }
        }
        let remaining = within.saturating_sub(started.elapsed());
        self.wait_all_acked(remaining).await;
        let inner = self.shared.lock();
        let acks = &inner.acks[acks_before..];
        let mut latencies: Vec<Duration> = acks
            .iter()
            .filter(|ack| ack.code == 200)
            .filter_map(|ack| ack.after)
            .collect();
        latencies.sort_unstable();
        let last = acks.iter().map(|ack| ack.at).max().unwrap_or(started);
        Driven {
            pushed,
            acked: acks.iter().filter(|ack| ack.code == 200).count(),
            failed: acks.iter().filter(|ack| ack.code != 200).count(),
            unacked: inner.unacked.len(),
            elapsed: last.saturating_duration_since(started),
            latencies,
        }
    }

    /// Sends raw bytes as one binary message (garbage frames).
    pub fn send_raw(&self, connection: u64, bytes: Vec<u8>) -> bool {
        let inner = self.shared.lock();
        inner
            .connections
            .get(&connection)
            .is_some_and(|conn| conn.commands.send(Command::Send(bytes)).is_ok())
    }

    /// Closes a connection (the client sees the socket end).
    pub fn drop_connection(&self, connection: u64) {
        if let Some(conn) = self.shared.lock().connections.remove(&connection) {
            let _ = conn.commands.send(Command::Close);
        }
    }

    /// Stops answering on a connection without closing it: half-open, as far as the client
    /// can tell.
    pub fn silence(&self, connection: u64) {
        if let Some(conn) = self.shared.lock().connections.get(&connection) {
            conn.silent.store(true, Ordering::Relaxed);
        }
    }
}
