//! The end-to-end harness: a real downstream, real `oncegate serve` processes, signed Feishu
//! requests. Each test file compiles its own copy and uses a part of it.
#![allow(dead_code, unreachable_pub)]

pub(crate) mod proxy;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;

use oncegate_feishu::FeishuApp;

pub(crate) const APP_ID: &str = "cli_e2e";
pub(crate) const ENCRYPT_KEY: &str = "e2e-encrypt-key";
pub(crate) const TOKEN: &str = "e2e-token";
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the downstream received.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub(crate) idempotency_key: String,
    pub(crate) event_id: String,
    pub(crate) order_key: Option<String>,
    pub(crate) attempt: u64,
    pub(crate) signed: bool,
    /// The W3C `traceparent` it came with, if any.
    pub(crate) traceparent: String,
    /// The envelope's payload, as JSON text.
    pub(crate) payload: String,
}

/// How the downstream answers.
#[derive(Debug, Default)]
pub(crate) struct Behavior {
    /// event id → transient failures still to give.
    pub(crate) transient: HashMap<String, u32>,
    /// event ids answered 422.
    pub(crate) permanent: HashSet<String>,
    /// Delay before answering.
    pub(crate) delay: Duration,
    /// Card replies given so far.
    pub(crate) cards: u32,
    /// event id → a delay for its first delivery only.
    pub(crate) slow_once: HashMap<String, Duration>,
    /// Slow first deliveries that have arrived.
    pub(crate) slow_started: usize,
    /// event id → seconds: its first delivery is answered 429 with `Retry-After` (once).
    pub(crate) retry_after: HashMap<String, u64>,
    /// event id → when each of its delivery attempts arrived.
    pub(crate) attempts: HashMap<String, Vec<Instant>>,
    /// Applies each delivery at once and answers this much later (a downstream that hangs
    /// after its effect: past the sink's timeout the gateway sends it again).
    pub(crate) answer_late: Duration,
    /// Every delivery is answered 410 Gone (the endpoint was removed).
    pub(crate) gone: bool,
    /// Every applied delivery is answered with a text of its own, `re:<event id>` (a reply
    /// route's handler), rather than an empty 204.
    pub(crate) reply: bool,
}

#[derive(Clone, Default)]
pub(crate) struct Downstream {
    pub(crate) got: Arc<Mutex<Vec<Got>>>,
    pub(crate) behavior: Arc<Mutex<Behavior>>,
}

impl Downstream {
    pub(crate) async fn start() -> (Self, SocketAddr) {
        let downstream = Self::default();
        let state = downstream.clone();
        let app = Router::new()
            .route("/events", axum::routing::post(receive))
            .route("/cards", axum::routing::post(card))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind downstream");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (downstream, addr)
    }

    pub(crate) fn got(&self) -> Vec<Got> {
        self.got.lock().expect("log").clone()
    }

    pub(crate) fn count(&self, event_id: &str) -> usize {
        self.got().iter().filter(|g| g.event_id == event_id).count()
    }

    pub(crate) async fn wait_for(&self, what: &str, done: impl Fn(&[Got]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if done(&self.got()) {
                return;
            }
            if Instant::now() > deadline {
                let got = self.got();
                let ids: Vec<&str> = got.iter().rev().take(10).map(|g| &*g.event_id).collect();
                panic!(
                    "timed out waiting for {what}; downstream has {} deliveries, the last: {ids:?}",
                    got.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

pub(crate) fn verify(headers: &HeaderMap, body: &[u8]) -> bool {
    use base64::Engine;
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let key = base64::engine::general_purpose::STANDARD
        .decode(&SECRET["whsec_".len()..])
        .expect("secret");
    let timestamp: u64 = get("webhook-timestamp").parse().unwrap_or(0);
    oncegate_gateway::HttpSink::sign(&key, &get("webhook-id"), timestamp, body)
        == get("webhook-signature")
}

pub(crate) async fn receive(
    axum::extract::State(state): axum::extract::State<Downstream>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let doc: serde_json::Value = serde_json::from_slice(&body).expect("json envelope");
    let event_id = doc["event_id"].as_str().unwrap_or_default().to_owned();
    {
        let mut behavior = state.behavior.lock().expect("behavior");
        behavior
            .attempts
            .entry(event_id.clone())
            .or_default()
            .push(Instant::now());
        if behavior.gone {
            return StatusCode::GONE.into_response();
        }
        if let Some(seconds) = behavior.retry_after.remove(&event_id) {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(axum::http::header::RETRY_AFTER, seconds.to_string())],
            )
                .into_response();
        }
    }
    let delay = {
        let mut behavior = state.behavior.lock().expect("behavior");
        match behavior.slow_once.remove(&event_id) {
            Some(slow) => {
                behavior.slow_started += 1;
                slow
            }
            None => behavior.delay,
        }
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    {
        let mut behavior = state.behavior.lock().expect("behavior");
        if behavior.permanent.contains(&event_id) {
            return StatusCode::UNPROCESSABLE_ENTITY.into_response();
        }
        if let Some(left) = behavior.transient.get_mut(&event_id)
            && *left > 0
        {
            *left -= 1;
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    }
    state.got.lock().expect("log").push(Got {
        idempotency_key: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        event_id,
        order_key: doc["order_key"].as_str().map(str::to_owned),
        attempt: doc["attempt"].as_u64().unwrap_or(0),
        signed: verify(&headers, &body),
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        payload: doc["payload"].to_string(),
    });
    let (late, reply) = {
        let behavior = state.behavior.lock().expect("behavior");
        (behavior.answer_late, behavior.reply)
    };
    if !late.is_zero() {
        tokio::time::sleep(late).await;
    }
    if reply {
        return format!("re:{}", doc["event_id"].as_str().unwrap_or_default()).into_response();
    }
    StatusCode::NO_CONTENT.into_response()
}

pub(crate) async fn card(
    axum::extract::State(state): axum::extract::State<Downstream>,
    body: axum::body::Bytes,
) -> axum::Json<serde_json::Value> {
    let doc: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let n = {
        let mut behavior = state.behavior.lock().expect("behavior");
        behavior.cards += 1;
        behavior.cards
    };
    state.got.lock().expect("log").push(Got {
        idempotency_key: String::new(),
        event_id: doc["event_id"].as_str().unwrap_or_default().to_owned(),
        order_key: None,
        attempt: 0,
        signed: true,
        traceparent: String::new(),
        payload: doc["payload"].to_string(),
    });
    axum::Json(serde_json::json!({"toast": {"type": "success", "content": format!("answer {n}")}}))
}

/// A running gateway process.
pub(crate) struct Gateway {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) admin: String,
}

impl Gateway {
    pub(crate) fn start(dir: &Path, downstream: SocketAddr, watermark: bool) -> Self {
        let store = format!("path = \"{}\"\npartitions = 8", dir.join("store").display());
        Self::start_with(dir, downstream, watermark, &store)
    }

    pub(crate) fn start_with(
        dir: &Path,
        downstream: SocketAddr,
        watermark: bool,
        store: &str,
    ) -> Self {
        Self::start_with_lease(dir, downstream, watermark, store, "30s", "5s")
    }

    pub(crate) fn start_with_lease(
        dir: &Path,
        downstream: SocketAddr,
        watermark: bool,
        store: &str,
        lease: &str,
        renew: &str,
    ) -> Self {
        let config = write_config(dir, downstream, watermark, store, lease, renew);
        Self::run(&config)
    }

    /// `oncegate serve --config config`, once it says where it listens.
    pub(crate) fn run(config: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncegate"))
            .args(["serve", "--config"])
            .arg(config)
            .env(
                "ONCEGATE_LOG",
                std::env::var("E2E_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start oncegate serve");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        let mut reader = BufReader::new(stdout);
        reader.read_line(&mut line).expect("first line");
        // "oncegate listening on http://A (webhooks ...), admin on http://B"
        let urls: Vec<&str> = line
            .split_whitespace()
            .filter(|w| w.starts_with("http://"))
            .collect();
        assert_eq!(urls.len(), 2, "unexpected first line: {line:?}");
        std::thread::spawn(move || for _ in reader.lines() {});
        Self {
            child,
            url: format!("{}/webhook/main", urls[0]),
            admin: urls[1].to_owned(),
        }
    }

    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub(crate) fn kill9(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    pub(crate) fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "graceful stop: {status:?}");
    }

    pub(crate) async fn stats(&self) -> serde_json::Value {
        reqwest::get(format!("{}/admin/stats", self.admin))
            .await
            .expect("stats")
            .json()
            .await
            .expect("json")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn app() -> FeishuApp {
    FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        APP_ID,
        Some(ENCRYPT_KEY.into()),
        Some(TOKEN.into()),
    )
    .expect("app")
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn message(event_id: &str, chat: &str, create_ms: u64) -> String {
    serde_json::json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "token": TOKEN, "create_time": create_ms.to_string(),
                   "event_type": "im.message.receive_v1", "tenant_key": "t", "app_id": APP_ID},
        "event": {"message": {"message_id": format!("om_{event_id}"), "chat_id": chat, "content": "{\"text\":\"hi\"}"}}
    })
    .to_string()
}

/// A signed request: (body, timestamp, nonce, signature).
pub(crate) struct Signed {
    pub(crate) body: Vec<u8>,
    pub(crate) timestamp: String,
    pub(crate) nonce: String,
    pub(crate) signature: String,
}

pub(crate) fn sign(plain: &str) -> Signed {
    sign_at(plain, now_secs())
}

pub(crate) fn sign_at(plain: &str, timestamp: u64) -> Signed {
    let timestamp = timestamp.to_string();
    let nonce = format!("{:016x}", fastrand::u64(..));
    let mut iv = [0u8; 16];
    fastrand::fill(&mut iv);
    let (body, signature) = app().seal(plain.as_bytes(), &timestamp, &nonce, iv);
    Signed {
        body,
        timestamp,
        nonce,
        signature: signature.expect("signed"),
    }
}

pub(crate) async fn post(
    client: &reqwest::Client,
    url: &str,
    signed: &Signed,
) -> Result<(u16, String), reqwest::Error> {
    let response = client
        .post(url)
        .header("x-lark-request-timestamp", &signed.timestamp)
        .header("x-lark-request-nonce", &signed.nonce)
        .header("x-lark-signature", &signed.signature)
        .body(signed.body.clone())
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await.unwrap_or_default()))
}

pub(crate) fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A free loopback port (bound and let go).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

/// A redis-server of the test's own, that can be killed and restarted on its port with its
/// files.
pub(crate) struct OwnRedis {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl OwnRedis {
    /// With AOF, every change fsynced (what `durability = "fsync"` asks for).
    pub(crate) fn start() -> Self {
        Self::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    }

    /// With `args` after the port, address and folder (`--save ''` unless they say otherwise).
    pub(crate) fn start_with(args: &[&str]) -> Self {
        let mut redis = Self {
            dir: tempfile::tempdir().expect("dir"),
            port: free_port(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            child: None,
        };
        // A port found free may be taken before the server binds it (or, on a cluster, its
        // bus port + 10000): another port then.
        for _ in 0..5 {
            if redis.started() {
                return redis;
            }
            redis.port = free_port();
        }
        panic!("redis-server did not start on five ports");
    }

    /// Starts the server again on its port, with its files.
    pub(crate) fn run(&mut self) {
        assert!(
            self.started(),
            "redis-server did not start again on its port"
        );
    }

    fn started(&mut self) -> bool {
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", ""])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is missing: run the tests with scripts/test, which installs it");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
        true
    }

    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("kill redis");
            child.wait().expect("reap redis");
        }
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) the server: alive, connected, answering nothing.
    pub(crate) fn pause(&self, paused: bool) {
        if let Some(child) = &self.child {
            let signal = if paused { "-STOP" } else { "-CONT" };
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success());
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis-cli -p PORT args…`'s output.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.pause(false);
        self.kill9();
    }
}

/// `redis-cli -p port args…`'s output (empty when it could not run).
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

/// A redis-sentinel of the test's own, watching `primary` as `mymaster` with a quorum of
/// `quorum`, declaring it down after a second.
pub(crate) struct OwnSentinel {
    _dir: tempfile::TempDir,
    pub(crate) port: u16,
    child: Child,
}

impl OwnSentinel {
    pub(crate) fn start(primary: u16, quorum: u32) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let port = free_port();
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {primary} {quorum}\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 5000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir.path().display()
            ),
        )
        .expect("sentinel config");
        let child = Command::new("redis-sentinel")
            .arg(&config)
            .stdout(Stdio::null())
            .spawn()
            .expect(
                "redis-sentinel is missing: run the tests with scripts/test, which installs it",
            );
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-sentinel did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            _dir: dir,
            port,
            child,
        }
    }

    /// Whether this sentinel names `port` as the primary with no failover in progress.
    pub(crate) fn settled_on(&self, port: u16) -> bool {
        let master = redis_cli(self.port, &["SENTINEL", "master", "mymaster"]);
        let fields: Vec<&str> = master.lines().map(str::trim).collect();
        let field = |name: &str| {
            fields
                .iter()
                .position(|f| *f == name)
                .and_then(|i| fields.get(i + 1).copied())
        };
        self.primary() == Some(port) && field("flags") == Some("master")
    }

    /// The port of the primary this sentinel names now.
    pub(crate) fn primary(&self) -> Option<u16> {
        redis_cli(
            self.port,
            &["SENTINEL", "get-master-addr-by-name", "mymaster"],
        )
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
    }
}

impl Drop for OwnSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test gateway's configuration file in `dir`: one Feishu source, events to `downstream`.
pub(crate) fn write_config(
    dir: &Path,
    downstream: SocketAddr,
    watermark: bool,
    store: &str,
    lease: &str,
    renew: &str,
) -> std::path::PathBuf {
    let config = dir.join("oncegate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[store]
{store}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
body_limit = 65536

[dispatcher]
concurrency = 32
max_attempts = 3
backoff_base = "50ms"
backoff_max = "200ms"
shutdown_grace = "2s"

[lease]
duration = "{lease}"
renew_every = "{renew}"

[[source]]
name = "main"
platform = "feishu"
app_id = "{APP_ID}"
encrypt_key = "{ENCRYPT_KEY}"
verification_token = "{TOKEN}"

[[route]]
events = ["card.action.trigger"]
sink = "http"
url = "http://{downstream}/cards"

[[route]]
events = ["*"]
sink = "http"
url = "http://{downstream}/events"
secret = "{SECRET}"
timeout = "5s"
watermark = {watermark}
"#,
        ),
    )
    .expect("write config");
    config
}

/// A burst of `events` signed callbacks `<prefix>-<i>` over 11 chats from 8 senders, each
/// retried as the platform does (every 50 ms) until the gateway answers 200.
pub(crate) struct Burst {
    /// Callbacks answered 200.
    pub(crate) acked: Arc<std::sync::atomic::AtomicUsize>,
    /// 503 answers seen (each then retried).
    pub(crate) refused: Arc<std::sync::atomic::AtomicUsize>,
    senders: tokio::task::JoinHandle<()>,
}

impl Burst {
    pub(crate) fn start(url: &str, prefix: &str, events: usize) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        let acked = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let next = Arc::new(AtomicUsize::new(0));
        let client = client();
        let mut workers = Vec::new();
        for _ in 0..8 {
            let (client, url, acked, refused, next) = (
                client.clone(),
                url.to_owned(),
                acked.clone(),
                refused.clone(),
                next.clone(),
            );
            let prefix = prefix.to_owned();
            workers.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= events {
                        break;
                    }
                    let plain = message(
                        &format!("{prefix}-{i}"),
                        &format!("oc_{prefix}{}", i % 11),
                        1_000 + i as u64,
                    );
                    loop {
                        match post(&client, &url, &sign(&plain)).await {
                            Ok((200, _)) => break,
                            Ok((503, _)) => {
                                refused.fetch_add(1, Relaxed);
                            }
                            Ok((status, body)) => panic!("unexpected {status}: {body}"),
                            Err(error) => panic!("the gateway itself must stay up: {error}"),
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    acked.fetch_add(1, Relaxed);
                }
            }));
        }
        let senders = tokio::spawn(async move {
            for worker in workers {
                worker.await.expect("sender");
            }
        });
        Self {
            acked,
            refused,
            senders,
        }
    }

    /// Waits (at most 30 s) until `count` callbacks were answered 200.
    pub(crate) async fn wait_acked(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.acked.load(std::sync::atomic::Ordering::Relaxed) < count {
            assert!(
                Instant::now() < deadline,
                "{count} callbacks not answered 200 in time"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until every callback was answered 200; the 503s seen on the way.
    pub(crate) async fn finish(self) -> usize {
        self.senders.await.expect("senders");
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A primary, its replica and three sentinels (quorum 2) watching them as `mymaster`.
pub(crate) struct Replicated {
    pub(crate) primary: OwnRedis,
    pub(crate) replica: OwnRedis,
    pub(crate) sentinels: Vec<OwnSentinel>,
}

impl Replicated {
    pub(crate) fn start() -> Self {
        let primary = OwnRedis::start_with(&[]);
        let replica =
            OwnRedis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        let sentinels = (0..3)
            .map(|_| OwnSentinel::start(primary.port, 2))
            .collect();
        Self {
            primary,
            replica,
            sentinels,
        }
    }

    /// The gateways' URL: through the sentinels.
    pub(crate) fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/mymaster",
            self.sentinels
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port))
                .collect::<Vec<_>>()
                .join(",")
        )
    }

    /// Kills the primary (-9), waits until every sentinel settled on the replica as the new
    /// primary, and starts the old one again (it becomes the replica). Only once every sentinel
    /// has settled: an old primary without persistence that comes back empty while the failover
    /// is still in progress is taken back as the primary, and its empty data set replaces the
    /// replica's (Redis's "replication safety when the master has persistence turned off": the
    /// README says not to restart such a primary automatically).
    pub(crate) async fn fail_over(&mut self) {
        self.primary.kill9();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(self
            .sentinels
            .iter()
            .all(|s| s.settled_on(self.replica.port))
            && self.replica.cli(&["ROLE"]).starts_with("master"))
        {
            assert!(Instant::now() < deadline, "no failover");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.primary.run();
    }
}

/// The first TOML block of the README after `marker` (a `[[route]]` or a table): it passes `check-config`
/// beside the test configuration (with `env` set), and the same block with its last setting
/// misspelt is refused naming it — so every setting it shows is one the gateway reads.
pub(crate) fn readme_block(marker: &str, env: &[(&str, &str)]) -> String {
    readme_block_as(marker, env, |block| block.to_owned())
}

/// [`readme_block`], the block first changed by `edit` (a setting this build cannot take
/// swapped for one it can); the block is returned as the README has it.
pub(crate) fn readme_block_as(
    marker: &str,
    env: &[(&str, &str)],
    edit: impl Fn(&str) -> String,
) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let shown = readme
        .split_once(marker)
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("no toml block after {marker:?} in the README"))
        .0
        .to_owned();
    let route = edit(&shown);
    let dir = tempfile::tempdir().expect("dir");
    let store = format!("path = \"{}\"", dir.path().join("store").display());
    let unused: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let config = write_config(dir.path(), unused, false, &store, "30s", "5s");
    let text = std::fs::read_to_string(&config).expect("config") + &route;
    let check = |text: &str| {
        std::fs::write(&config, text).expect("config");
        let output = Command::new(env!("CARGO_BIN_EXE_oncegate"))
            .arg("check-config")
            .arg(&config)
            .envs(env.iter().copied())
            .output()
            .expect("check-config");
        let said = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), said)
    };
    let (ok, said) = check(&text);
    assert!(ok, "the README's route after {marker:?}: {said}");
    let last = route
        .lines()
        .rev()
        .find_map(|line| line.split_once(" = ").map(|(name, _)| name.trim()))
        .expect("a setting");
    let misspelt = text.replacen(&format!("\n{last} = "), &format!("\n{last}_x = "), 1);
    let (ok, said) = check(&misspelt);
    assert!(!ok && said.contains(&format!("{last}_x")), "{said}");
    shown
}
