//! Ingress and admission in process: the router called directly (`oneshot`), a real memory
//! store, requests sealed by the platform's own sealer. Fast; the end-to-end tests run the
//! binary.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncegate_core::{ManualClock, Method, Sealer, SyntheticMessage};
use oncegate_feishu::FeishuApp;
use oncegate_gateway::{Gateway, GatewayParts};
use oncegate_memory::{MemoryConfig, MemoryStore};
use tower::ServiceExt;

fn app() -> FeishuApp {
    FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        "cli_ip",
        Some("ip-key".into()),
        Some("ip-token".into()),
    )
    .expect("app")
}

/// Where the tests' clock starts: the gateway and its store share it.
const START_MS: u64 = 1_700_000_000_000;

fn gateway_at(
    clock: Arc<ManualClock>,
    secondary_keys: bool,
) -> Gateway<MemoryStore<Arc<ManualClock>>> {
    let store = MemoryStore::with_clock(MemoryConfig::default(), clock.clone());
    Gateway::new(
        store,
        GatewayParts {
            sources: vec![("s".into(), Arc::new(app()))],
            secondary_keys,
            clock,
            ..GatewayParts::default()
        },
    )
}

fn gateway(secondary_keys: bool) -> Gateway<MemoryStore<Arc<ManualClock>>> {
    gateway_at(Arc::new(ManualClock::new(START_MS)), secondary_keys)
}

/// A message event with `event_id` whose message id is `om_<message>`, sent at the start.
fn request(event_id: &str, message: &str) -> Request<Body> {
    request_at(event_id, message, START_MS / 1000, "")
}

fn request_at(event_id: &str, message: &str, timestamp_secs: u64, nonce: &str) -> Request<Body> {
    let app = app();
    let mut plain = String::from_utf8(app.message(&SyntheticMessage {
        id: message.into(),
        chat: "oc_1".into(),
        sender: "ou_1".into(),
        text: "hi".into(),
        created_ms: 1,
    }))
    .expect("utf8");
    plain = plain.replace(
        &format!("\"event_id\":\"{message}\""),
        &format!("\"event_id\":\"{event_id}\""),
    );
    let nonce = match nonce {
        "" => format!("{:016x}", fastrand::u64(..)),
        given => given.to_owned(),
    };
    let sealed = Sealer::seal(&app, plain.as_bytes(), timestamp_secs, &nonce, [2; 16]);
    assert_eq!(sealed.method, Method::Post);
    let mut builder = Request::post("/webhook/s");
    for (name, value) in &sealed.headers {
        builder = builder.header(*name, value);
    }
    builder.body(Body::from(sealed.body)).expect("request")
}

/// Sends `request` to `router` and reads the whole answer.
async fn exchange(router: axum::Router, request: Request<Body>) -> (StatusCode, Vec<u8>) {
    let response = router.oneshot(request).await.expect("infallible");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, body.to_vec())
}

async fn call(
    gateway: &Gateway<MemoryStore<Arc<ManualClock>>>,
    request: Request<Body>,
) -> (StatusCode, String) {
    let (status, body) = exchange(gateway.webhooks_router(), request).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_message_resent_under_a_new_event_id_is_a_duplicate_unless_message_ids_are_off() {
    for (secondary, second) in [(true, true), (false, false)] {
        let gateway = gateway(secondary);
        let (status, body) = call(&gateway, request("ev_a", "m1")).await;
        assert_eq!(
            (status, body.contains("duplicate")),
            (StatusCode::OK, false),
            "{body}"
        );
        let (status, body) = call(&gateway, request("ev_b", "m1")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body.contains("duplicate"),
            second,
            "message_id = {secondary}: {body}"
        );
        // The same event id is a duplicate either way.
        let (_, body) = call(&gateway, request("ev_a", "m1")).await;
        assert!(body.contains("duplicate"), "{body}");
    }
}

#[tokio::test]
async fn refusals_have_their_status_and_say_nothing_about_the_configuration() {
    let gateway = gateway(true);
    let (status, body) = call(
        &gateway,
        Request::get("/webhook/s")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    let (status, body) = call(
        &gateway,
        Request::post("/webhook/nope")
            .body(Body::from("{}"))
            .expect("request"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!body.contains("\"s\""), "{body}");
    let (status, body) = call(
        &gateway,
        Request::post("/webhook/s")
            .body(Body::from("{}"))
            .expect("request"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let stats = gateway.stats();
    assert_eq!((stats.requests, stats.bad_requests), (3, 3));
}

#[tokio::test]
async fn the_replay_window_follows_the_gateways_clock() {
    let clock = Arc::new(ManualClock::new(START_MS));
    let gateway = gateway_at(clock.clone(), true);
    let at = START_MS / 1000;
    let (status, body) = call(&gateway, request_at("ev_r", "r1", at, "n-1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The same nonce again within the window: a replay.
    let (status, _) = call(&gateway, request_at("ev_r2", "r2", at, "n-1")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Ten minutes later the request's timestamp is outside the 5-minute skew.
    clock.advance_ms(10 * 60 * 1000);
    let (status, body) = call(&gateway, request_at("ev_r3", "r3", at, "n-3")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("skew"), "{body}");
    let (status, _) = call(&gateway, request_at("ev_r3", "r3", at + 600, "n-3")).await;
    assert_eq!(status, StatusCode::OK);
    let stats = gateway.stats();
    assert_eq!(
        (
            stats.replays_rejected,
            stats.stale_timestamps,
            stats.admitted
        ),
        (1, 1, 2)
    );
}

/// A card click sealed at the start, with `value` as the button's value.
fn card_click(event_id: &str, value: &str) -> Request<Body> {
    let plain = serde_json::json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "token": "ip-token", "create_time": "1700000000000000",
                   "event_type": "card.action.trigger", "app_id": "cli_ip"},
        "event": {"action": {"value": {"v": value}},
                  "context": {"open_chat_id": "oc_1", "open_message_id": "om_1"}}
    })
    .to_string();
    let nonce = format!("{:016x}", fastrand::u64(..));
    let sealed = Sealer::seal(&app(), plain.as_bytes(), START_MS / 1000, &nonce, [3; 16]);
    let mut builder = Request::post("/webhook/s");
    for (name, value) in &sealed.headers {
        builder = builder.header(*name, value);
    }
    builder.body(Body::from(sealed.body)).expect("request")
}

/// Serves `app` on a loopback port: its base URL.
async fn serve_local(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// A card handler that answers after 150 ms with the number of calls so far.
async fn slow_card_handler(calls: Arc<std::sync::atomic::AtomicUsize>) -> String {
    use std::sync::atomic::Ordering;
    let app = axum::Router::new().route(
        "/cards",
        axum::routing::post(move || {
            let calls = calls.clone();
            async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(std::time::Duration::from_millis(150)).await;
                format!(r#"{{"toast":{{"content":"answer {n}"}}}}"#)
            }
        }),
    );
    format!("{}/cards", serve_local(app).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_of_a_card_click_that_come_while_it_is_answered_get_its_answer() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = slow_card_handler(calls.clone()).await;
    let sink = oncegate_gateway::HttpSink::new(&url, None, std::time::Duration::from_secs(2))
        .expect("sink");
    let gateway = Arc::new(
        gateway(true)
            .route(
                &["card.action.trigger"],
                Arc::new(sink),
                oncegate_gateway::StaleEvents::Deliver,
            )
            .expect("route"),
    );
    for round in 0..5 {
        let id = format!("card-{round}");
        let clicks: Vec<_> = (0..4)
            .map(|_| {
                let gateway = gateway.clone();
                let request = card_click(&id, "yes");
                tokio::spawn(async move { call(&gateway, request).await })
            })
            .collect();
        let mut answers = Vec::new();
        for click in clicks {
            let (status, body) = click.await.expect("joined");
            assert_eq!(status, StatusCode::OK, "round {round}: {body}");
            answers.push(body);
        }
        assert!(
            answers.iter().all(|answer| *answer == answers[0]),
            "round {round}: every repeat gets the first answer: {answers:?}"
        );
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::SeqCst),
            round + 1,
            "round {round}: one call to the handler"
        );
        // The same card event id with another payload: a conflict, and no call.
        let (status, body) = call(&gateway, card_click(&id, "no")).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.contains("another payload"), "{body}");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), round + 1);
    }
}

/// A card handler that fails permanently (400) and counts its calls.
async fn refusing_card_handler(calls: Arc<std::sync::atomic::AtomicUsize>) -> String {
    use std::sync::atomic::Ordering;
    let app = axum::Router::new().route(
        "/cards",
        axum::routing::post(move || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                (axum::http::StatusCode::BAD_REQUEST, "no such card")
            }
        }),
    );
    format!("{}/cards", serve_local(app).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_handler_that_fails_permanently_is_not_called_again_for_the_retries() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = refusing_card_handler(calls.clone()).await;
    let sink = oncegate_gateway::HttpSink::new(&url, None, std::time::Duration::from_secs(2))
        .expect("sink");
    let gateway = gateway(true)
        .route(
            &["card.action.trigger"],
            Arc::new(sink),
            oncegate_gateway::StaleEvents::Deliver,
        )
        .expect("route");
    let (first, said) = call(&gateway, card_click("card-refused", "yes")).await;
    assert!(first.is_server_error(), "{first} {said}");
    assert!(said.contains("downstream answered 400"), "{said}");
    // The platform's retries of the click get the same refusal, without a second call.
    for _ in 0..3 {
        let (status, body) = call(&gateway, card_click("card-refused", "yes")).await;
        assert_eq!(status, first, "{body}");
        assert!(
            body.contains("earlier call") && body.contains("downstream answered 400"),
            "{body}"
        );
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A gateway whose admin routes want the token `admin-secret`.
fn guarded_gateway() -> Gateway<MemoryStore<Arc<ManualClock>>> {
    let clock = Arc::new(ManualClock::new(START_MS));
    Gateway::new(
        MemoryStore::with_clock(MemoryConfig::default(), clock.clone()),
        GatewayParts {
            sources: vec![("s".into(), Arc::new(app()))],
            admin_token: Some("admin-secret".into()),
            clock,
            ..GatewayParts::default()
        },
    )
}

async fn admin_get(
    gateway: &Gateway<MemoryStore<Arc<ManualClock>>>,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::get(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(Body::empty()).expect("request");
    let (status, body) = exchange(gateway.admin_router(), request).await;
    (status, serde_json::from_slice(&body).expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_router_shows_a_cards_record_with_its_fingerprint_behind_the_token() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = slow_card_handler(calls).await;
    let sink = oncegate_gateway::HttpSink::new(&url, None, std::time::Duration::from_secs(2))
        .expect("sink");
    let store = MemoryStore::with_clock(
        MemoryConfig::default(),
        Arc::new(ManualClock::new(START_MS)),
    );
    let gateway = Gateway::new(
        store,
        GatewayParts {
            sources: vec![("s".into(), Arc::new(app()))],
            admin_token: Some("admin-secret".into()),
            clock: Arc::new(ManualClock::new(START_MS)),
            ..GatewayParts::default()
        },
    )
    .route(
        &["card.action.trigger"],
        Arc::new(sink),
        oncegate_gateway::StaleEvents::Deliver,
    )
    .expect("route");
    let (status, _) = call(&gateway, card_click("card-admin", "yes")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(&gateway, request("ev_admin", "m_admin")).await;
    assert_eq!(status, StatusCode::OK);

    let card = oncegate_core::key_for("feishu", "cli_ip", "event_id", "card-admin");
    let path = format!("/admin/record?key={card}");
    let (status, body) = admin_get(&gateway, &path, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = admin_get(&gateway, &path, Some("admin-secret")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["record"]["state"], "completed", "{body}");
    let fingerprint = body["fingerprint"]
        .as_str()
        .expect("a card names its payload");
    assert_eq!(fingerprint.len(), 32, "{body}");
    assert!(fingerprint.bytes().all(|b| b.is_ascii_hexdigit()), "{body}");

    // An event is claimed for no payload: its record has none.
    let event = oncegate_core::key_for("feishu", "cli_ip", "event_id", "ev_admin");
    let (status, body) = admin_get(
        &gateway,
        &format!("/admin/record?key={event}"),
        Some("admin-secret"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["record"]["state"], "pending", "{body}");
    assert!(body["fingerprint"].is_null(), "{body}");

    let (status, body) = admin_get(&gateway, "/admin/stats", Some("admin-secret")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["gateway"]["admitted"], 1, "{body}");
    assert_eq!(body["gateway"]["cards"], 1, "{body}");
}

/// Every route the OpenAPI document names is served: with the token, no route answers the
/// router's own "no such route"; without it, every `/admin` route but the document says 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_admin_route_is_served_and_guarded() {
    let gateway = guarded_gateway();
    let get = |path: &str| Request::get(path).body(Body::empty()).expect("request");
    let (status, doc) = exchange(gateway.admin_router(), get("/admin/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_slice(&doc).expect("json");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 10);
    for (path, methods) in paths {
        for method in methods.as_object().expect("methods").keys() {
            let request = |token: Option<&str>| {
                let mut request = Request::builder()
                    .method(method.to_uppercase().as_str())
                    .uri(path);
                if let Some(token) = token {
                    request = request.header("authorization", format!("Bearer {token}"));
                }
                let body = if method == "post" {
                    Body::from("{\"ids\": []}")
                } else {
                    Body::empty()
                };
                request
                    .header("content-type", "application/json")
                    .body(body)
                    .expect("request")
            };
            let (status, body) =
                exchange(gateway.admin_router(), request(Some("admin-secret"))).await;
            assert!(
                status != StatusCode::METHOD_NOT_ALLOWED
                    && !(status == StatusCode::NOT_FOUND && body.is_empty()),
                "{method} {path}: {status}"
            );
            if path.starts_with("/admin/") && path != "/admin/openapi.json" {
                let (status, _) = exchange(gateway.admin_router(), request(None)).await;
                assert_eq!(
                    status,
                    StatusCode::UNAUTHORIZED,
                    "{method} {path} without the token"
                );
            }
        }
    }
}

/// `/admin/queue` sums up every partition and lists one partition's events in queue order,
/// page by page; a partition the store lacks, a limit out of range or an unknown field is a
/// 400 that says what to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitions_queue_is_listed_in_order_page_by_page() {
    let gateway = guarded_gateway();
    // No dispatcher runs: what is admitted stays queued.
    for (event, message) in [("ev_q1", "mq1"), ("ev_q2", "mq2"), ("ev_q3", "mq3")] {
        let (status, body) = call(&gateway, request(event, message)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let token = Some("admin-secret");
    let (status, _) = admin_get(&gateway, "/admin/queue", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = admin_get(&gateway, "/admin/queue", token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let partitions = body["partitions"].as_array().expect("partitions");
    assert_eq!(
        partitions.len(),
        usize::from(MemoryConfig::default().partitions)
    );
    let busy: Vec<_> = partitions.iter().filter(|p| p["events"] != 0).collect();
    assert_eq!(busy.len(), 1, "one chat, one partition: {body}");
    assert_eq!(busy[0]["events"], 3, "{body}");
    assert_eq!(busy[0]["handed_out"], 0, "{body}");
    assert!(busy[0]["bytes"].as_u64().expect("bytes") > 0, "{body}");
    assert!(busy[0]["oldest_created_ms"].is_u64(), "{body}");
    let partition = busy[0]["partition"].as_u64().expect("partition");

    let path = format!("/admin/queue?partition={partition}");
    let (status, body) = admin_get(&gateway, &path, token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = body["events"].as_array().expect("events");
    let ids: Vec<_> = events.iter().map(|e| e["event_id"].clone()).collect();
    assert_eq!(ids, ["ev_q1", "ev_q2", "ev_q3"], "{body}");
    for event in events {
        assert_eq!(event["state"]["state"], "waiting", "{body}");
        assert_eq!(
            (event["attempt"].as_u64(), event["platform"].as_str()),
            (Some(0), Some("feishu"))
        );
        assert!(event["payload_bytes"].as_u64().expect("bytes") > 0);
    }
    assert!(body["next_after"].is_null(), "all listed: {body}");
    assert_eq!(body["summary"]["events"], 3);

    let (status, page) = admin_get(&gateway, &format!("{path}&limit=2"), token).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["events"].as_array().map(Vec::len), Some(2));
    let after = page["next_after"].as_u64().expect("a next page");
    assert_eq!(Some(after), page["events"][1]["seq"].as_u64());
    let (_, rest) = admin_get(&gateway, &format!("{path}&limit=2&after={after}"), token).await;
    assert_eq!(rest["events"][0]["event_id"], "ev_q3", "{rest}");
    assert_eq!(rest["events"].as_array().map(Vec::len), Some(1));
    assert!(rest["next_after"].is_null());

    for (bad, says) in [
        ("/admin/queue?partition=999".to_owned(), "no partition 999"),
        (format!("{path}&limit=0"), "limit 0 is out of range"),
        (format!("{path}&limit=5000"), "out of range"),
        ("/admin/queue?limit=5".to_owned(), "?partition=N"),
        ("/admin/queue?partiton=1".to_owned(), "unknown field"),
        ("/admin/queue?partition=x".to_owned(), "partition"),
    ] {
        let (status, body) = admin_get(&gateway, &bad, token).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        let error = body["error"].as_str().expect("an error");
        assert!(error.contains(says), "{bad}: {error}");
    }
}

/// Counts what it is handed.
#[derive(Clone, Default)]
struct Counted(Arc<std::sync::atomic::AtomicU64>);

impl oncegate_gateway::Handler for Counted {
    async fn handle(
        &self,
        _event: &oncegate_core::Event,
        _key: &str,
        _attempt: u32,
    ) -> Result<Option<bytes::Bytes>, oncegate_gateway::SinkError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(None)
    }
}

/// The queued count between two samples of the store (what `dispatcher.max_queued` and the
/// status page read) counts delivered events out as admitted ones in: it showed 442, 846 … while
/// everything was delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_events_leave_the_queued_count_between_samples() {
    let handled = Counted::default();
    let gateway = Arc::new(
        guarded_gateway()
            .route(
                &["*"],
                Arc::new(oncegate_gateway::HandlerSink(handled.clone())),
                oncegate_gateway::StaleEvents::Deliver,
            )
            .expect("route"),
    );
    for i in 0..5 {
        let (status, body) = call(
            &gateway,
            request(&format!("ev_count{i}"), &format!("mc{i}")),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (_, stats) = admin_get(&gateway, "/admin/live", Some("admin-secret")).await;
    assert_eq!(stats["queued"], 5, "{stats}");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let dispatcher = {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.dispatch(shutdown).await })
    };
    for _ in 0..200 {
        if handled.0.load(std::sync::atomic::Ordering::SeqCst) == 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (_, stats) = admin_get(&gateway, "/admin/live", Some("admin-secret")).await;
    shutdown.cancel();
    dispatcher.await.expect("joined").expect("dispatch");
    assert_eq!(handled.0.load(std::sync::atomic::Ordering::SeqCst), 5);
    assert_eq!(stats["queued"], 0, "every event delivered: {stats}");
}

/// `replay.shared_nonces`: two gateways on one Redis, one signed request sent to the first and
/// then, byte for byte, to the second. With the nonces shared, the second refuses it as a
/// replay (409); without, it answers it as the duplicate it is (200) — in both cases the event
/// is admitted once, and the first gateway still refuses its own replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_at_another_gateway_is_refused_with_shared_nonces_and_a_duplicate_without() {
    let Ok(url) = std::env::var("ONCEGATE_TEST_REDIS_URL") else {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    };
    for shared in [true, false] {
        let prefix = format!(
            "nonces{}-{shared}-{}",
            std::process::id(),
            fastrand::u32(..)
        );
        let mut gateways = Vec::new();
        for _ in 0..2 {
            let config = oncegate_redis::RedisConfig {
                prefix: prefix.clone(),
                ..oncegate_redis::RedisConfig::at(&url)
            };
            let store = oncegate_redis::RedisStore::connect_async(config)
                .await
                .expect("redis");
            gateways.push(Gateway::new(
                store,
                GatewayParts {
                    sources: vec![("s".into(), Arc::new(app()))],
                    replay: Some(oncegate_gateway::ReplayLimits {
                        max_skew: std::time::Duration::from_secs(300),
                        max_nonces: 1000,
                        shared_nonces: shared,
                    }),
                    ..GatewayParts::default()
                },
            ));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let send = |at: usize| {
            let router = gateways[at].webhooks_router();
            async move { exchange(router, request_at("ev_n", "n1", now, "nonce-1")).await }
        };
        let (status, body) = send(0).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let (status, body) = send(1).await;
        let body = String::from_utf8_lossy(&body).into_owned();
        if shared {
            assert_eq!(status, StatusCode::CONFLICT, "{body}");
        } else {
            assert_eq!(status, StatusCode::OK, "{body}");
            assert!(body.contains("\"duplicate\":true"), "{body}");
        }
        let (status, _) = send(0).await;
        assert_eq!(status, StatusCode::CONFLICT, "shared {shared}");
        let (first, second) = (gateways[0].stats(), gateways[1].stats());
        assert_eq!((first.admitted, second.admitted), (1, 0), "shared {shared}");
        assert_eq!(
            (second.replays_rejected, second.duplicates),
            (u64::from(shared), u64::from(!shared)),
            "shared {shared}"
        );
    }
}
