//! A Feishu-like open API on loopback, for tests: it issues `tenant_access_token`s and refuses
//! stale ones (99991663), limits each receiver to Feishu's 5 messages per second (429, code
//! 99991400, `x-ogw-ratelimit-reset`), sends a `uuid` once per hour, can answer slowly (a
//! client's timeout after the message went out), and counts what it really sent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use oncegate_core::rates::LocalRates;
use oncegate_core::{KeyHash, Rate, RateVerdict};
use serde_json::{Value, json};
use tokio::net::TcpListener;

mod store_app;
pub use store_app::TicketPush;

/// One message the server really sent.
#[derive(Debug, Clone)]
pub struct Sent {
    /// Its receiver (for a reply: the parent message).
    pub receive_id: String,
    /// The uuid it came with.
    pub uuid: String,
    /// Its content.
    pub content: String,
    /// When it was sent.
    pub at: Instant,
    /// The store app's tenant whose token sent it (`None`: the app's own token).
    pub tenant: Option<String>,
}

#[derive(Default)]
struct Inner {
    /// Valid tokens and when each expires: the newest, and the one before it until it runs out.
    tokens: HashMap<String, Instant>,
    newest: Option<String>,
    tokens_issued: u64,
    token_requests: u64,
    by_uuid: HashMap<String, (String, Instant)>,
    sent: Vec<Sent>,
    refused: u64,
    limited: u64,
    delay: Option<Duration>,
    /// Updates applied, by message, in order.
    updates: HashMap<String, Vec<String>>,
    /// Updates of one message running at once, now and at most.
    updating: HashMap<String, usize>,
    most_at_once: usize,
    /// A store app's state: tickets, app tokens, the tenant of each tenant token.
    store: store_app::StoreState,
    /// Tenants whose sends Feishu limits below the published rate (another system spends the
    /// app's quota in them), and the calls answered 429 for each.
    tenant_limits: HashMap<String, (Rate, u64)>,
}

struct Shared {
    app_id: String,
    app_secret: String,
    lifetime: Duration,
    rates: LocalRates,
    started: Instant,
    inner: Mutex<Inner>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The server; it stops when dropped.
pub struct LocalFeishuApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LocalFeishuApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Feishu's limit on one receiver: 5 messages per second.
pub const PER_RECEIVER: Rate = Rate::per_second(5);

impl LocalFeishuApi {
    /// Serves the API for app `app_id` with `app_secret`; tokens live `token_lifetime`.
    pub async fn start(
        app_id: &str,
        app_secret: &str,
        token_lifetime: Duration,
    ) -> std::io::Result<Self> {
        Self::start_at("127.0.0.1:0", app_id, app_secret, token_lifetime).await
    }

    /// `start`, listening on `address` (`oncegate simulate --platform-api` serves a source's
    /// configured domain).
    pub async fn start_at(
        address: &str,
        app_id: &str,
        app_secret: &str,
        token_lifetime: Duration,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(address).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            app_id: app_id.to_owned(),
            app_secret: app_secret.to_owned(),
            lifetime: token_lifetime,
            rates: LocalRates::default(),
            started: Instant::now(),
            inner: Mutex::new(Inner::default()),
        });
        let router = axum::Router::new()
            .route(
                "/open-apis/auth/v3/tenant_access_token/internal",
                post(token),
            )
            .route("/open-apis/im/v1/messages", post(send))
            .route("/open-apis/im/v1/messages/{parent}/reply", post(reply))
            .route(
                "/open-apis/im/v1/messages/{id}",
                axum::routing::patch(update),
            )
            .merge(store_app::routes())
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

    /// Token requests answered so far (a valid token is answered again, not reissued).
    pub fn token_requests(&self) -> u64 {
        self.shared.lock().token_requests
    }

    /// Makes every token invalid, as Feishu does when they run out.
    pub fn expire_token(&self) {
        let mut inner = self.shared.lock();
        inner.tokens.clear();
        inner.newest = None;
    }

    /// Sends are answered only after this long from now on (a client may time out after the
    /// message went out).
    pub fn answer_after(&self, delay: Option<Duration>) {
        self.shared.lock().delay = delay;
    }

    /// Sends refused for good (to a chat whose id starts with `oc_gone`, which the bot left).
    pub fn refused(&self) -> u64 {
        self.shared.lock().refused
    }

    /// Sends answered 429 (over 5 per second to one receiver).
    pub fn limited(&self) -> u64 {
        self.shared.lock().limited
    }

    /// The contents `message` was updated to, in order.
    pub fn updates(&self, message: &str) -> Vec<String> {
        self.shared
            .lock()
            .updates
            .get(message)
            .cloned()
            .unwrap_or_default()
    }

    /// The most updates of one message that ran at once.
    pub fn most_updates_at_once(&self) -> usize {
        self.shared.lock().most_at_once
    }

    /// Every message really sent.
    pub fn sent(&self) -> Vec<Sent> {
        self.shared.lock().sent.clone()
    }

    /// Limits the store app's sends in `tenant` to `rate`, answered past it as Feishu answers
    /// an app's limit: 429, 99991400, `x-ogw-ratelimit-limit` (the rate's count) and
    /// `x-ogw-ratelimit-reset`.
    pub fn limit_tenant(&self, tenant: &str, rate: Rate) {
        let mut inner = self.shared.lock();
        inner.tenant_limits.insert(tenant.to_owned(), (rate, 0));
    }

    /// The calls answered 429 for `tenant`'s limit.
    pub fn limited_in(&self, tenant: &str) -> u64 {
        let inner = self.shared.lock();
        inner
            .tenant_limits
            .get(tenant)
            .map_or(0, |(_, calls)| *calls)
    }
}

/// Feishu's answer to a call over a limit of `limit` a window, free again in `wait`.
fn over_limit(limit: u32, wait: Duration) -> Response {
    let reset = wait.as_secs_f64().ceil().max(1.0) as u64;
    (
        StatusCode::TOO_MANY_REQUESTS,
        [
            ("x-ogw-ratelimit-limit", limit.to_string()),
            ("x-ogw-ratelimit-reset", reset.to_string()),
        ],
        Json(json!({"code": 99991400, "msg": "request trigger frequency limit"})),
    )
        .into_response()
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

async fn token(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    if body["app_id"] != shared.app_id.as_str() || body["app_secret"] != shared.app_secret.as_str()
    {
        return answer(
            StatusCode::OK,
            json!({"code": 10014, "msg": "app secret invalid"}),
        );
    }
    let mut inner = shared.lock();
    inner.token_requests += 1;
    let now = Instant::now();
    inner.tokens.retain(|_, expires| *expires > now);
    // Feishu answers the same token while more than 30 minutes of it remain; after that a new
    // one, and the old one stays valid until it runs out (several clients never evict each
    // other's).
    let current = inner
        .newest
        .as_ref()
        .and_then(|token| Some((token.clone(), *inner.tokens.get(token)?)))
        .filter(|(_, expires)| *expires > now + Duration::from_secs(30 * 60));
    let (token, expires) = match current {
        Some(current) => current,
        None => {
            inner.tokens_issued += 1;
            let token = format!("t-local-{}", inner.tokens_issued);
            let expires = now + shared.lifetime;
            inner.tokens.insert(token.clone(), expires);
            inner.newest = Some(token.clone());
            (token, expires)
        }
    };
    answer(
        StatusCode::OK,
        json!({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": (expires - now).as_secs()}),
    )
}

/// Whether `given` (an `Authorization` header's bearer token) is valid now.
fn valid(inner: &Inner, given: Option<&str>) -> bool {
    given
        .and_then(|token| inner.tokens.get(token))
        .is_some_and(|expires| *expires > Instant::now())
}

async fn send(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !query.contains_key("receive_id_type") {
        return answer(
            StatusCode::BAD_REQUEST,
            json!({"code": 99992402, "msg": "field validation failed: receive_id_type"}),
        );
    }
    let receiver = body["receive_id"].as_str().unwrap_or_default().to_owned();
    deliver(&shared, &headers, receiver, &body).await
}

async fn reply(
    State(shared): State<Arc<Shared>>,
    Path(parent): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    deliver(&shared, &headers, parent, &body).await
}

async fn deliver(shared: &Shared, headers: &HeaderMap, receiver: String, body: &Value) -> Response {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let (answered, delay) = {
        let mut inner = shared.lock();
        if !valid(&inner, given) {
            return answer(
                StatusCode::BAD_REQUEST,
                json!({"code": 99991663, "msg": "Invalid access token for authorization"}),
            );
        }
        if receiver.starts_with("oc_gone") {
            inner.refused += 1;
            return answer(
                StatusCode::BAD_REQUEST,
                json!({"code": 230002, "msg": "The bot can not be outside the group"}),
            );
        }
        if receiver.is_empty() {
            return answer(
                StatusCode::BAD_REQUEST,
                json!({"code": 230001, "msg": "invalid receive_id"}),
            );
        }
        let uuid = body["uuid"].as_str().unwrap_or_default().to_owned();
        let now = Instant::now();
        let known = inner
            .by_uuid
            .get(&uuid)
            .filter(|(_, at)| {
                !uuid.is_empty() && now.duration_since(*at) < Duration::from_secs(3600)
            })
            .map(|(id, _)| id.clone());
        let message_id = match known {
            Some(id) => id,
            None => {
                let now_us = now.duration_since(shared.started).as_micros() as u64;
                let tenant = given.and_then(|token| inner.store.tenant_of(token));
                if let Some((rate, calls)) = tenant
                    .as_ref()
                    .and_then(|tenant| inner.tenant_limits.get_mut(tenant))
                {
                    let bucket = KeyHash::of(&["local tenant", tenant.as_deref().unwrap_or("")]);
                    if let RateVerdict::Wait(wait) = shared.rates.take(&bucket, *rate, now_us) {
                        *calls += 1;
                        return over_limit(rate.count, wait);
                    }
                }
                let bucket = KeyHash::of(&["local", &receiver]);
                if let RateVerdict::Wait(wait) = shared.rates.take(&bucket, PER_RECEIVER, now_us) {
                    inner.limited += 1;
                    return over_limit(PER_RECEIVER.count, wait);
                }
                let id = format!("om_local_{}", inner.sent.len() + 1);
                inner.sent.push(Sent {
                    receive_id: receiver.clone(),
                    uuid: uuid.clone(),
                    content: body["content"].as_str().unwrap_or_default().to_owned(),
                    at: now,
                    tenant,
                });
                if !uuid.is_empty() {
                    inner.by_uuid.insert(uuid, (id.clone(), now));
                }
                id
            }
        };
        let answered = json!({"code": 0, "msg": "success", "data": {"message_id": message_id, "chat_id": receiver}});
        (answered, inner.delay)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    answer(StatusCode::OK, answered)
}

/// `PATCH /open-apis/im/v1/messages/{id}`: a card's new content. Each takes 30 ms, so that
/// updates of one message that overlap show.
async fn update(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    {
        let mut inner = shared.lock();
        if !valid(&inner, given.as_deref()) {
            return answer(
                StatusCode::BAD_REQUEST,
                json!({"code": 99991663, "msg": "Invalid access token for authorization"}),
            );
        }
        let running = inner.updating.entry(id.clone()).or_default();
        *running += 1;
        let now = *running;
        inner.most_at_once = inner.most_at_once.max(now);
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut inner = shared.lock();
    if let Some(running) = inner.updating.get_mut(&id) {
        *running -= 1;
    }
    let content = body["content"].as_str().unwrap_or_default().to_owned();
    inner.updates.entry(id).or_default().push(content);
    answer(
        StatusCode::OK,
        json!({"code": 0, "msg": "success", "data": {}}),
    )
}
