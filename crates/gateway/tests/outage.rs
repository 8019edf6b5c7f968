//! When the store cannot admit, the gateway answers 503 and records nothing; the platform's
//! retry after the outage is admitted once. When the dispatcher dies, the gateway says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{
    Admission, Claim, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck, Fingerprint,
    KeyHash, Lease, QueueId, Record, StoreError, StoreStats, SystemClock, WatermarkOutcome,
    WatermarkStore,
};
use oncegate_feishu::FeishuApp;
use oncegate_gateway::{Gateway, GatewayParts, Handler, HandlerSink, SinkError, Timing};
use oncegate_memory::{MemoryConfig, MemoryStore};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A real memory store whose admits can be switched off, as an unreachable store would refuse.
struct Switchable {
    inner: MemoryStore,
    down: AtomicBool,
    /// Makes `pull` panic: a bug in the dispatcher's path, as a test can cause it.
    panic_pull: AtomicBool,
}

impl DedupStore for Switchable {
    async fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> Result<Admission, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("switched off by the test".into()));
        }
        self.inner.admit(event, keys, retention).await
    }
    async fn claim_with_fingerprint(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
        fingerprint: Option<Fingerprint>,
    ) -> Result<Claim, StoreError> {
        self.inner
            .claim_with_fingerprint(key, partition, lease, fingerprint)
            .await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<FenceCheck, StoreError> {
        self.inner.renew(lease, extend).await
    }
    async fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        self.inner.complete(lease, retention, outcome).await
    }
    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.inner.release(lease).await
    }
    async fn record(&self, key: &KeyHash, partition: u16) -> Result<Option<Record>, StoreError> {
        self.inner.record(key, partition).await
    }
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        self.inner.stats().await
    }
}

impl EventQueue for Switchable {
    fn partitions(&self) -> u16 {
        self.inner.partitions()
    }
    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        assert!(
            !self.panic_pull.load(Ordering::SeqCst),
            "pull panics, as the test asked"
        );
        self.inner.pull(partition, max).await
    }
    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        self.inner.ack(id).await
    }
    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        self.inner.retry(id, not_before_ms).await
    }
    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        self.inner.dead_letter(id, reason).await
    }
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.inner.dead_letters(limit).await
    }
    async fn dead_letter_count(&self) -> Result<u64, StoreError> {
        self.inner.dead_letter_count().await
    }
    async fn replay_dead_letter(&self, id: QueueId) -> Result<Option<QueueId>, StoreError> {
        self.inner.replay_dead_letter(id).await
    }
    async fn purge_dead_letter(&self, id: QueueId) -> Result<bool, StoreError> {
        self.inner.purge_dead_letter(id).await
    }
    async fn queue_summary(
        &self,
        partition: u16,
    ) -> Result<oncegate_core::QueueSummary, StoreError> {
        self.inner.queue_summary(partition).await
    }
    async fn queued_events(
        &self,
        partition: u16,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<oncegate_core::QueuedEvent>, StoreError> {
        self.inner.queued_events(partition, after, limit).await
    }
}

impl WatermarkStore for Switchable {
    async fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> Result<WatermarkOutcome, StoreError> {
        self.inner.advance_watermark(scope, value, retention).await
    }
}

impl oncegate_core::RateStore for Switchable {
    async fn take_rate(
        &self,
        bucket: &KeyHash,
        rate: oncegate_core::Rate,
    ) -> Result<oncegate_core::RateVerdict, StoreError> {
        self.inner.take_rate(bucket, rate).await
    }

    async fn adjust_rate(
        &self,
        bucket: &KeyHash,
        adjust: oncegate_core::RateAdjust,
    ) -> Result<(), StoreError> {
        self.inner.adjust_rate(bucket, adjust).await
    }
}

impl oncegate_core::StateStore for Switchable {
    async fn state_get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<oncegate_core::Versioned>, StoreError> {
        self.inner.state_get(namespace, name).await
    }
    async fn state_put(
        &self,
        namespace: &str,
        name: &str,
        value: bytes::Bytes,
        expect: oncegate_core::Expect,
        ttl: Option<Duration>,
    ) -> Result<oncegate_core::Changed, StoreError> {
        self.inner
            .state_put(namespace, name, value, expect, ttl)
            .await
    }
    async fn state_remove(
        &self,
        namespace: &str,
        name: &str,
        expect: oncegate_core::Expect,
    ) -> Result<oncegate_core::Changed, StoreError> {
        self.inner.state_remove(namespace, name, expect).await
    }
    async fn state_list(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, oncegate_core::Versioned)>, StoreError> {
        self.inner.state_list(namespace, after, limit).await
    }
    async fn state_generation(&self, namespace: &str) -> Result<u64, StoreError> {
        self.inner.state_generation(namespace).await
    }
}

/// A gateway serving and dispatching on loopback, until `shutdown`.
struct Running {
    webhooks: String,
    admin: String,
    shutdown: CancellationToken,
    serving: tokio::task::JoinHandle<Result<(), oncegate_gateway::GatewayError>>,
    dispatching: tokio::task::JoinHandle<Result<(), oncegate_gateway::GatewayError>>,
}

async fn run(gateway: &Gateway<Switchable>) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let webhooks = format!("http://{}", listener.local_addr().expect("addr"));
    let admin_url = format!("http://{}", admin.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let serving = {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.serve(listener, admin, shutdown).await })
    };
    let dispatching = {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.dispatch(shutdown).await })
    };
    Running {
        webhooks,
        admin: admin_url,
        shutdown,
        serving,
        dispatching,
    }
}

struct Count(Arc<AtomicUsize>);

impl Handler for Count {
    async fn handle(&self, _: &Event, _: &str, _: u32) -> Result<Option<Bytes>, SinkError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_store_gets_503_and_the_retry_is_admitted_once() {
    let app = FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        "cli_outage",
        Some("k".into()),
        None,
    )
    .expect("app");
    let store = Switchable {
        inner: MemoryStore::with_clock(MemoryConfig::default(), SystemClock),
        down: AtomicBool::new(true),
        panic_pull: AtomicBool::new(false),
    };
    let handled = Arc::new(AtomicUsize::new(0));
    let gateway = Gateway::new(
        store,
        GatewayParts {
            sources: vec![("s".into(), Arc::new(app.clone()))],
            replay: Some(oncegate_gateway::ReplayLimits {
                max_skew: Duration::from_secs(300),
                max_nonces: 1000,
                shared_nonces: true,
            }),
            timing: Timing::default(),
            body_limit: 1 << 16,
            admin_token: None,
            ..GatewayParts::default()
        },
    )
    .route(
        &["*"],
        Arc::new(HandlerSink(Count(handled.clone()))),
        oncegate_gateway::StaleEvents::Deliver,
    )
    .expect("route");
    let Running {
        webhooks,
        admin: _,
        shutdown,
        serving,
        dispatching,
    } = run(&gateway).await;
    let url = format!("{webhooks}/webhook/s");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let message = r#"{"schema":"2.0","header":{"event_id":"ev_outage","event_type":"im.chat.updated_v1","create_time":"1700000000000","app_id":"cli_outage"},"event":{"chat_id":"oc_1"}}"#;
    let send = |nonce: &'static str| {
        let (client, url, app) = (client.clone(), url.clone(), app.clone());
        async move {
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("time")
                .as_secs()
                .to_string();
            let (body, signature) = app.seal(message.as_bytes(), &timestamp, nonce, [1; 16]);
            let response = client
                .post(&url)
                .header("x-lark-request-timestamp", &timestamp)
                .header("x-lark-request-nonce", nonce)
                .header("x-lark-signature", signature.expect("signed"))
                .body(body)
                .send()
                .await
                .expect("send");
            (
                response.status().as_u16(),
                response.text().await.expect("text"),
            )
        }
    };
    let (status, body) = send("n1").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("retry later"), "{body}");
    assert_eq!(gateway.stats().store_unavailable, 1);
    // Nothing was recorded: not even the nonce, so the platform's retry with it is not a replay.
    gateway.store().down.store(false, Ordering::SeqCst);
    let (status, body) = send("n1").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send("n2").await;
    assert_eq!((status, body.contains("duplicate")), (200, true), "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(handled.load(Ordering::SeqCst), 1);
    shutdown.cancel();
    serving.await.expect("join").expect("serve");
    dispatching.await.expect("join").expect("dispatcher");
}

struct Panics;

impl Handler for Panics {
    async fn handle(&self, _: &Event, _: &str, _: u32) -> Result<Option<Bytes>, SinkError> {
        panic!("a handler bug")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dying_dispatcher_fails_readiness_and_stops_the_gateway_and_a_panicking_handler_does_not()
{
    let store = Switchable {
        inner: MemoryStore::with_clock(
            MemoryConfig {
                partitions: 2,
                ..MemoryConfig::default()
            },
            SystemClock,
        ),
        down: AtomicBool::new(false),
        panic_pull: AtomicBool::new(false),
    };
    let mut timing = Timing::default();
    timing.dispatcher.max_attempts = 2;
    timing.dispatcher.backoff_base = Duration::from_millis(10);
    timing.dispatcher.backoff_max = Duration::from_millis(10);
    let gateway = Gateway::new(
        store,
        GatewayParts {
            timing,
            ..GatewayParts::default()
        },
    )
    .route(
        &["*"],
        Arc::new(HandlerSink(Panics)),
        oncegate_gateway::StaleEvents::Deliver,
    )
    .expect("route");
    let Running {
        webhooks: _,
        admin,
        shutdown,
        serving,
        dispatching,
    } = run(&gateway).await;
    let ready = format!("{admin}/readyz");
    let event = Event {
        platform: "feishu".into(),
        app: "cli_x".into(),
        tenant: None,
        event_id: "e1".into(),
        event_type: "t".into(),
        created_at_ms: 1,
        order_key: Some("oc".into()),
        payload: Bytes::from_static(b"{}"),
    };
    let key = oncegate_core::key_for("feishu", "cli_x", "event_id", "e1");
    let store = gateway.store();
    store
        .admit(event, &[key], Duration::from_secs(3600))
        .await
        .expect("admit");
    // The panicking handler fails its attempts and is dead-lettered; the dispatcher lives on.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store
        .dead_letters(10)
        .await
        .expect("dead letters")
        .is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let letters = store.dead_letters(10).await.expect("dead letters");
    assert!(
        letters[0].reason.contains("panicked"),
        "{}",
        letters[0].reason
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let status = client.get(&ready).send().await.expect("readyz").status();
    assert_eq!(status, 200);
    assert!(!dispatching.is_finished());

    store.panic_pull.store(true, Ordering::SeqCst);
    let ended = tokio::time::timeout(Duration::from_secs(10), dispatching)
        .await
        .expect("the dispatcher stops")
        .expect("join");
    let error = ended
        .expect_err("a dead dispatcher is an error")
        .to_string();
    assert!(error.contains("dispatcher"), "{error}");
    // Serving stopped too (the shutdown was cancelled), so a supervisor restarts the process.
    tokio::time::timeout(Duration::from_secs(15), serving)
        .await
        .expect("serving stops")
        .expect("join")
        .expect("serve");
    assert!(shutdown.is_cancelled());
}
