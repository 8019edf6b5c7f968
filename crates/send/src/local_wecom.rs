//! A WeCom-like message API on loopback, for tests: tokens (40014 for a stale one), a cap on
//! calls in flight (45033), WeCom's silent drop past 30 messages per minute to one member, and
//! a count of what it really delivered.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Query, State};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;

#[derive(Default)]
struct Inner {
    token: Option<String>,
    tokens_issued: u64,
    delivered: Vec<(String, Instant)>,
    /// Each accepted call's body, in order.
    bodies: Vec<String>,
    dropped: u64,
    busy: u64,
}

struct Shared {
    corp_id: String,
    secret: String,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The server; it stops when dropped.
pub struct LocalWecomApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LocalWecomApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LocalWecomApi {
    /// Serves corp `corp_id`'s app with `secret`, allowing `max_in_flight` calls at once.
    pub async fn start(corp_id: &str, secret: &str, max_in_flight: usize) -> std::io::Result<Self> {
        Self::start_at("127.0.0.1:0", corp_id, secret, max_in_flight).await
    }

    /// `start`, listening on `address` (`oncegate simulate --platform-api` serves a source's
    /// configured domain).
    pub async fn start_at(
        address: &str,
        corp_id: &str,
        secret: &str,
        max_in_flight: usize,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(address).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            corp_id: corp_id.to_owned(),
            secret: secret.to_owned(),
            max_in_flight,
            in_flight: AtomicUsize::new(0),
            inner: Mutex::new(Inner::default()),
        });
        let router = axum::Router::new()
            .route("/cgi-bin/gettoken", get(token))
            .route("/cgi-bin/message/send", post(send))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self { shared, addr, task })
    }

    /// The domain to configure.
    pub fn domain(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Tokens issued so far.
    pub fn tokens_issued(&self) -> u64 {
        self.shared.lock().tokens_issued
    }

    /// Makes the current token invalid.
    pub fn expire_token(&self) {
        self.shared.lock().token = None;
    }

    /// Messages delivered to `member`.
    pub fn delivered_to(&self, member: &str) -> usize {
        self.shared
            .lock()
            .delivered
            .iter()
            .filter(|(to, _)| to == member)
            .count()
    }

    /// The bodies of the calls answered with success, in order, from the `from`th on.
    pub fn bodies_from(&self, from: usize) -> Vec<String> {
        self.shared
            .lock()
            .bodies
            .iter()
            .skip(from)
            .cloned()
            .collect()
    }

    /// Messages WeCom answered with success and did not deliver (over 30 per minute to one
    /// member).
    pub fn dropped(&self) -> u64 {
        self.shared.lock().dropped
    }

    /// Calls answered 45033 (too many in flight).
    pub fn busy(&self) -> u64 {
        self.shared.lock().busy
    }
}

async fn token(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
) -> Json<Value> {
    if query.get("corpid") != Some(&shared.corp_id)
        || query.get("corpsecret") != Some(&shared.secret)
    {
        return Json(json!({"errcode": 40001, "errmsg": "invalid credential"}));
    }
    let mut inner = shared.lock();
    inner.tokens_issued += 1;
    let token = format!("wecom-token-{}", inner.tokens_issued);
    inner.token = Some(token.clone());
    Json(json!({"errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": 7200}))
}

async fn send(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    let now_in_flight = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let answer = answer(&shared, &query, &body, now_in_flight).await;
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    Json(answer)
}

async fn answer(
    shared: &Shared,
    query: &HashMap<String, String>,
    body: &Value,
    in_flight: usize,
) -> Value {
    if in_flight > shared.max_in_flight {
        shared.lock().busy += 1;
        return json!({"errcode": 45033, "errmsg": "api concurrent out of limit"});
    }
    // Every call takes a little while, so that concurrency shows.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut inner = shared.lock();
    if query.get("access_token").map(String::as_str) != inner.token.as_deref()
        || inner.token.is_none()
    {
        return json!({"errcode": 40014, "errmsg": "invalid access_token"});
    }
    let now = Instant::now();
    inner.bodies.push(body.to_string());
    for member in body["touser"]
        .as_str()
        .unwrap_or("")
        .split('|')
        .filter(|m| !m.is_empty())
    {
        let last_minute = inner
            .delivered
            .iter()
            .filter(|(to, at)| to == member && now.duration_since(*at) < Duration::from_secs(60))
            .count();
        if last_minute >= 30 {
            // WeCom's own behaviour: success, and the message never arrives.
            inner.dropped += 1;
        } else {
            inner.delivered.push((member.to_owned(), now));
        }
    }
    json!({"errcode": 0, "errmsg": "ok", "msgid": format!("wecom-msg-{}", inner.delivered.len())})
}
