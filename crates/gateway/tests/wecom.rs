//! WeCom and WeChat through the gateway, in process: the router called directly, a real memory
//! store, requests sealed by the platforms' own sealers.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use oncegate_core::{ManualClock, SealedRequest, Sealer, SyntheticMessage};
use oncegate_gateway::{Gateway, GatewayParts, SharedSource};
use oncegate_memory::{MemoryConfig, MemoryStore};
use oncegate_wecom::{WechatApp, WecomApp};
use tower::ServiceExt;

const START_MS: u64 = 1_700_000_000_000;
const KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";

type Memory = MemoryStore<Arc<ManualClock>>;

fn corp(id: &str) -> WecomApp {
    WecomApp::new(id, "corp-token", KEY).expect("app")
}

fn gateway(sources: Vec<(&str, SharedSource)>) -> Gateway<Memory> {
    gateway_at(sources, START_MS)
}

/// A gateway whose clock reads `now_ms`.
fn gateway_at(sources: Vec<(&str, SharedSource)>, now_ms: u64) -> Gateway<Memory> {
    let clock = Arc::new(ManualClock::new(now_ms));
    Gateway::new(
        MemoryStore::with_clock(MemoryConfig::default(), clock.clone()),
        GatewayParts {
            sources: sources
                .into_iter()
                .map(|(name, source)| (name.to_owned(), source))
                .collect(),
            clock,
            ..GatewayParts::default()
        },
    )
}

fn message(id: &str, user: &str) -> SyntheticMessage {
    SyntheticMessage {
        id: id.into(),
        chat: user.into(),
        sender: user.into(),
        text: "你好".into(),
        created_ms: START_MS,
    }
}

/// `message` sealed by `sealer` with a fresh nonce and IV, as a request to `/webhook/<source>`.
fn sealed(sealer: &dyn Sealer, source: &str, message: &SyntheticMessage) -> Request<Body> {
    let plain = sealer.message(message);
    let nonce = format!("{:016x}", fastrand::u64(..));
    let iv: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
    to_request(source, sealer.seal(&plain, START_MS / 1000, &nonce, iv))
}

fn to_request(source: &str, sealed: SealedRequest) -> Request<Body> {
    let mut uri = format!("/webhook/{source}");
    if let Some(query) = &sealed.query {
        uri = format!("{uri}?{query}");
    }
    let mut builder = match sealed.method {
        oncegate_core::Method::Get => Request::get(uri),
        oncegate_core::Method::Post => Request::post(uri),
    };
    for (name, value) in &sealed.headers {
        builder = builder.header(*name, value);
    }
    builder.body(Body::from(sealed.body)).expect("request")
}

async fn call(gateway: &Gateway<Memory>, request: Request<Body>) -> (StatusCode, Vec<u8>) {
    let response = gateway
        .webhooks_router()
        .oneshot(request)
        .await
        .expect("infallible");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, body.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_copies_of_one_message_are_delivered_once() {
    let app = Arc::new(corp("ww_a"));
    let (gateway, seen) = collecting(app.clone(), &["*"], oncegate_gateway::StaleEvents::Deliver);
    for round in 0..10 {
        let copy = message(&format!("{}", 7_000_000 + round), "zhangsan");
        let copies: Vec<_> = (0..10)
            .map(|_| {
                let (gateway, request) = (gateway.clone(), sealed(&*app, "a", &copy));
                tokio::spawn(async move { call(&gateway, request).await })
            })
            .collect();
        for copy in copies {
            let (status, body) = copy.await.expect("joined");
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
            assert!(body.is_empty(), "WeCom takes an empty 200");
        }
        let stats = gateway.stats();
        assert_eq!(
            (stats.admitted, stats.duplicates),
            (round + 1, 9 * (round + 1)),
            "round {round}"
        );
    }
    dispatch_until_settled(&gateway, 10).await;
    let ids: Vec<String> = seen
        .0
        .lock()
        .expect("log")
        .iter()
        .map(|e| e.event_id.to_string())
        .collect();
    let expected: Vec<String> = (0..10)
        .map(|round| format!("{}", 7_000_000 + round))
        .collect();
    assert_eq!(ids, expected, "each message handled once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_colliding_events_are_each_delivered() {
    let app = Arc::new(corp("ww_a"));
    let (gateway, seen) = collecting(app.clone(), &["*"], oncegate_gateway::StaleEvents::Deliver);
    let second = START_MS / 1000 - 5;
    let mut documents = Vec::new();
    for user in 0..5 {
        documents.push(format!("<xml><ToUserName>ww_a</ToUserName><FromUserName>user{user}</FromUserName><CreateTime>{second}</CreateTime><MsgType>voice</MsgType><MediaId>m{user}</MediaId><MsgId>7000000000000000001</MsgId><AgentID>1000002</AgentID></xml>"));
    }
    for n in 0..5 {
        documents.push(format!("<xml><ToUserName>ww_a</ToUserName><FromUserName>sys</FromUserName><CreateTime>{second}</CreateTime><MsgType>event</MsgType><Event>sys_approval_change</Event><AgentID>3010040</AgentID><ApprovalInfo><SpNo>20230101{n:04}</SpNo></ApprovalInfo></xml>"));
        documents.push(format!("<xml><ToUserName>ww_a</ToUserName><FromUserName>sys</FromUserName><CreateTime>{second}</CreateTime><MsgType>event</MsgType><Event>change_external_contact</Event><ChangeType>add_external_contact</ChangeType><UserID>zhangsan</UserID><ExternalUserID>wmEXT{n}</ExternalUserID></xml>"));
    }
    documents.push(membership("add_member", "wm_z", second));
    documents.push(membership("del_member", "wm_z", second));
    for document in &documents {
        let nonce = format!("{:016x}", fastrand::u64(..));
        let request = to_request(
            "a",
            app.seal(document.as_bytes(), START_MS / 1000, &nonce, [2; 16]),
        );
        assert_eq!(call(&gateway, request).await.0, StatusCode::OK);
    }
    let count = documents.len() as u64;
    assert_eq!(
        gateway.stats().admitted,
        count,
        "no two of them share a key"
    );
    dispatch_until_settled(&gateway, count).await;
    assert_eq!(seen.0.lock().expect("log").len() as u64, count);
}

#[tokio::test]
async fn two_corps_with_identical_chats_and_ids_stay_apart() {
    let (a, b) = (Arc::new(corp("ww_a")), Arc::new(corp("ww_b")));
    let gateway = gateway(vec![("a", a.clone()), ("b", b.clone())]);
    let same = message("42", "lisi");
    assert_eq!(
        call(&gateway, sealed(&*a, "a", &same)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&gateway, sealed(&*b, "b", &same)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        gateway.stats().admitted,
        2,
        "one corp's event is not another's duplicate"
    );
    // Corp b's request sent to corp a's path: same token and key, wrong corp.
    let (status, body) = call(&gateway, sealed(&*b, "a", &message("43", "lisi"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("ww_b"));
    assert_eq!(gateway.stats().admitted, 2);
}

#[tokio::test]
async fn the_official_url_verification_through_the_router() {
    const VERIFICATION: &str = "/webhook/v1?msg_signature=5c45ff5e21c57e6ad56bac8758b79b1d9ac89fd3&timestamp=1409659589&nonce=263014780&echostr=P9nAzCzyDtyTWESHep1vC5X9xho%2FqYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp%2B4RPcs8TgAE7OaBO%2BFZXvnaqQ%3D%3D";
    let app = || -> SharedSource {
        Arc::new(WecomApp::new("wx5823bf96d3bd56c7", "QDG6eK", KEY).expect("app"))
    };
    // Replayed years after it was signed, the captured verification is refused as stale.
    let later = gateway(vec![("v1", app())]);
    let request = Request::get(VERIFICATION)
        .body(Body::empty())
        .expect("request");
    let (status, body) = call(&later, request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(String::from_utf8_lossy(&body).contains("skew"), "{body:?}");
    // When it was signed, it is answered.
    let gateway = gateway_at(vec![("v1", app())], 1_409_659_589_000);
    let request = Request::get(VERIFICATION)
        .body(Body::empty())
        .expect("request");
    let response = gateway
        .webhooks_router()
        .oneshot(request)
        .await
        .expect("infallible");
    // The echo is text, and is never sniffed as anything else.
    assert_eq!(
        response
            .headers()
            .get("x-content-type-options")
            .map(|v| v.as_bytes()),
        Some(&b"nosniff"[..])
    );
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"1616140317555161061"[..])
    );
    // Forged: one refusal, 401.
    let request = Request::get("/webhook/v1?msg_signature=00&timestamp=1&nonce=2&echostr=AAAA")
        .body(Body::empty())
        .expect("request");
    assert_eq!(call(&gateway, request).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn official_accounts_answer_success_and_a_repeated_request_is_a_duplicate() {
    let oa = Arc::new(WechatApp::new("wx_oa", "oa-token", Some(KEY)).expect("app"));
    let gateway = gateway(vec![("oa", oa.clone())]);
    let first = oa.seal(
        &oa.message(&message("9", "openid-1")),
        START_MS / 1000,
        "n-1",
        [3; 16],
    );
    let (status, body) = call(&gateway, to_request("oa", first.clone())).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"success"[..]));
    // The same signed request again — how these platforms retry: nothing is admitted twice,
    // and the answer is the duplicate's, so the platform stops retrying.
    let (status, body) = call(&gateway, to_request("oa", first)).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"success"[..]));
    let stats = gateway.stats();
    assert_eq!((stats.admitted, stats.replays_rejected), (1, 1));
}

/// A safe-mode Official Account message made by wechatpy (`scripts/fixtures/
/// wechatpy_official_account.py`, WeChatCrypto of wechatpy 1.8.18), addressed as every real one
/// is to the account's original id `gh_…` and posted as the platform posts it: admitted once,
/// its repeat a duplicate. It was refused with 400 ("for another app") before.
#[tokio::test]
async fn a_wechatpy_made_message_to_the_original_id_is_admitted_once() {
    const BODY: &str = "<xml><ToUserName><![CDATA[gh_7f083739789a]]></ToUserName><Encrypt><![CDATA[EnuJd1atIZgoQz41lyi+2ZystsyLSlJmwa0iYeG1hth1rSsHqycqc++AisO504Wv4mV2NCwpJ/ILmIIYaQw02ZlvuovdndLazYP2bMDH+gNxNvm1moDAy6TXCTDaXY8ZP+9S5vP27r0b8VAZndR0tB6PM62FEWm6255EZKYo0rdX+IBN4hW26iAy3Oq+WcYG6RSiL8UfMur2Pd/AcKMe/HRLISKFIBiVRl1yrn5CuMuLN9JQiKkmIy526bPP48+AuomQ+oKVdyzvkzvoNFFR+b/UbjDEABS7u8NxFc0meCfFZit8kIwPjqZrxEj3FUd3Ul0LPFAut2usvVMWQxSP8o46IQm7h9VFvNpVTPnmHyqKgy3ZXMhTFqy9A7Y7OEUJvwOtlToGaGfJN4M62+9CZF0k95/EEhMC33GYGI+WfMWTNBF7BluLJ7XkIAgIg63jzxZWe1SLDfiVeCILzJMFeg==]]></Encrypt></xml>";
    const QUERY: &str = "signature=1846d12c59a7f754f0d39408af52580719c8f317&timestamp=1700000000&nonce=1320562132&openid=oia2TjuEGTNoeX76QEjQNrcURxG8&encrypt_type=aes&msg_signature=386044f398060e669837c80e98e7cbb064b89fc0";
    let request = || {
        Request::post(format!("/webhook/oa?{QUERY}"))
            .body(Body::from(BODY))
            .expect("request")
    };
    for original_id in [None, Some("gh_7f083739789a")] {
        let mut app =
            WechatApp::new("wx5823bf96d3bd56c7", "oa-fixture-token", Some(KEY)).expect("app");
        if let Some(original_id) = original_id {
            app = app.with_original_id(original_id);
        }
        let gateway = gateway(vec![("oa", Arc::new(app))]);
        let (status, body) = call(&gateway, request()).await;
        assert_eq!(
            (status, String::from_utf8_lossy(&body).as_ref()),
            (StatusCode::OK, "success"),
            "{original_id:?}"
        );
        let (status, _) = call(&gateway, request()).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "the repeat is a duplicate, answered 200"
        );
        let stats = gateway.stats();
        assert_eq!(stats.admitted, 1, "{original_id:?}");
    }
    // Configured for another account, the message is refused.
    let other = WechatApp::new("wx5823bf96d3bd56c7", "oa-fixture-token", Some(KEY))
        .expect("app")
        .with_original_id("gh_000000000000");
    let gateway = gateway(vec![("oa", Arc::new(other))]);
    let (status, _) = call(&gateway, request()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(gateway.stats().admitted, 0);
}

/// WeCom's and WeChat's nonces are not unique per request: another event that carries a nonce
/// seen before (a new timestamp, its own signature) is admitted, never answered 200 and dropped
/// as a replay; the byte-for-byte repeat stays a duplicate. Safe mode and plain mode alike.
#[tokio::test]
async fn a_reused_nonce_with_another_event_is_admitted_not_taken_for_a_replay() {
    let sealers: Vec<(&str, Arc<dyn Sealer + Send + Sync>, SharedSource)> = {
        let corp = Arc::new(corp("ww_nonce"));
        let oa = Arc::new(WechatApp::new("wx_oa", "oa-token", Some(KEY)).expect("app"));
        let plain = Arc::new(WechatApp::new("wx_plain", "plain-token", None).expect("app"));
        vec![
            ("corp", corp.clone(), corp),
            ("oa", oa.clone(), oa),
            ("plain", plain.clone(), plain),
        ]
    };
    let gateway = gateway(
        sealers
            .iter()
            .map(|(name, _, source)| (*name, source.clone()))
            .collect(),
    );
    for (name, sealer, _) in &sealers {
        let first = sealer.seal(
            &sealer.message(&message(&format!("{name}-1"), "user-1")),
            START_MS / 1000,
            "same-nonce",
            [5; 16],
        );
        let (status, _) = call(&gateway, to_request(name, first.clone())).await;
        assert_eq!(status, StatusCode::OK, "{name}");
        let second = sealer.seal(
            &sealer.message(&message(&format!("{name}-2"), "user-1")),
            START_MS / 1000 + 1,
            "same-nonce",
            [6; 16],
        );
        let (status, _) = call(&gateway, to_request(name, second)).await;
        assert_eq!(status, StatusCode::OK, "{name}");
        // The platform's retry of the first: the duplicate, admitted once.
        let (status, _) = call(&gateway, to_request(name, first)).await;
        assert_eq!(status, StatusCode::OK, "{name}");
    }
    let stats = gateway.stats();
    assert_eq!(
        (stats.admitted, stats.replays_rejected),
        (6, 3),
        "two events per source admitted, each source's repeat refused as a replay"
    );
}

/// Plain mode signs the query, not the body: a captured query posted again with another
/// message is a replay, answered as WeChat's duplicates are and never admitted; the account's
/// own retry of the first (the same query and body) stays the duplicate it is.
#[tokio::test]
async fn a_captured_plain_mode_query_admits_no_forged_message() {
    let plain = Arc::new(WechatApp::new("wx_plain", "plain-token", None).expect("app"));
    let gateway = gateway(vec![("plain", plain.clone())]);
    let first = plain.seal(
        &plain.message(&message("genuine", "user-1")),
        START_MS / 1000,
        "captured-nonce",
        [5; 16],
    );
    let (status, _) = call(&gateway, to_request("plain", first.clone())).await;
    assert_eq!(status, StatusCode::OK);
    for forged in ["forged-1", "forged-2", "forged-3"] {
        let mut request = first.clone();
        request.body = plain.message(&message(forged, "user-1"));
        let (status, body) = call(&gateway, to_request("plain", request)).await;
        assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"success"[..]));
    }
    let (status, _) = call(&gateway, to_request("plain", first)).await;
    assert_eq!(status, StatusCode::OK);
    let stats = gateway.stats();
    assert_eq!(
        (stats.admitted, stats.replays_rejected),
        (1, 4),
        "only the genuine message admitted"
    );
}

/// Collects what the dispatcher hands over.
#[derive(Clone, Default)]
struct Collect(Arc<std::sync::Mutex<Vec<oncegate_core::Event>>>);

impl oncegate_gateway::Handler for Collect {
    async fn handle(
        &self,
        event: &oncegate_core::Event,
        _key: &str,
        _attempt: u32,
    ) -> Result<Option<bytes::Bytes>, oncegate_gateway::SinkError> {
        self.0.lock().expect("log").push(event.clone());
        Ok(None)
    }
}

/// A gateway whose events of `patterns` go to the returned collector.
fn collecting(
    app: Arc<WecomApp>,
    patterns: &[&str],
    stale: oncegate_gateway::StaleEvents,
) -> (Arc<Gateway<Memory>>, Collect) {
    let seen = Collect::default();
    let gateway = gateway(vec![("a", app)])
        .route(
            patterns,
            Arc::new(oncegate_gateway::HandlerSink(seen.clone())),
            stale,
        )
        .expect("route");
    (Arc::new(gateway), seen)
}

/// A gateway whose membership events go, watermarked, to the returned collector.
fn membership_gateway(app: Arc<WecomApp>) -> (Arc<Gateway<Memory>>, Collect) {
    collecting(
        app,
        &["event.change_external_chat*"],
        oncegate_gateway::StaleEvents::Drop,
    )
}

/// Runs the dispatcher until `events` were delivered or dropped as stale (at most 2 s).
async fn dispatch_until_settled(gateway: &Arc<Gateway<Memory>>, events: u64) {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let dispatcher = {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.dispatch(shutdown).await })
    };
    for _ in 0..200 {
        let stats = gateway.stats();
        if stats.delivered + stats.stale_dropped >= events {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    dispatcher.await.expect("joined").expect("dispatch");
}

fn membership(detail: &str, member: &str, created_secs: u64) -> String {
    format!(
        "<xml><ToUserName><![CDATA[ww_a]]></ToUserName><FromUserName><![CDATA[sys]]></FromUserName><CreateTime>{created_secs}</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[change_external_chat]]></Event><ChatId><![CDATA[wr_group]]></ChatId><ChangeType><![CDATA[update]]></ChangeType><UpdateDetail><![CDATA[{detail}]]></UpdateDetail><JoinScene>0</JoinScene><MemChangeCnt>1</MemChangeCnt><MemChangeList><Item><![CDATA[{member}]]></Item></MemChangeList></xml>"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_in_one_second_are_both_delivered_and_an_older_join_is_stale() {
    let app = Arc::new(corp("ww_a"));
    let (gateway, seen) = membership_gateway(app.clone());
    let at = START_MS / 1000 - 60;
    let send = |plain: String| {
        let nonce = format!("{:016x}", fastrand::u64(..));
        to_request(
            "a",
            app.seal(plain.as_bytes(), START_MS / 1000, &nonce, [4; 16]),
        )
    };
    // A member leaves at `at + 5`; the join from `at` arrives after it.
    for plain in [
        membership("del_member", "wm_x", at + 5),
        membership("add_member", "wm_x", at),
        // Another member joins and leaves within one second: two events, not one.
        membership("add_member", "wm_y", at + 10),
        membership("del_member", "wm_y", at + 10),
    ] {
        assert_eq!(call(&gateway, send(plain)).await.0, StatusCode::OK);
    }
    assert_eq!(
        gateway.stats().admitted,
        4,
        "four distinct events, no collision"
    );
    dispatch_until_settled(&gateway, 4).await;
    let delivered: Vec<(String, u64)> = seen
        .0
        .lock()
        .expect("log")
        .iter()
        .map(|event| {
            let text = String::from_utf8_lossy(&event.payload).into_owned();
            let detail = if text.contains("add_member") {
                "add"
            } else {
                "del"
            };
            let member = if text.contains("wm_x") { "x" } else { "y" };
            (
                format!("{detail} {member}"),
                event.created_at_ms / 1000 - at,
            )
        })
        .collect();
    assert_eq!(
        delivered,
        [
            ("del x".to_owned(), 5),
            ("add y".to_owned(), 10),
            ("del y".to_owned(), 10)
        ],
        "the older join is dropped as stale; the same-second pair both count, in order"
    );
}

/// One corp's two agents talk with the same user: agent 1's message applied first does not
/// make agent 2's earlier one stale (order and watermarks are corp:agent:chat), while agent
/// 1's own earlier message still is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_messages_to_two_agents_keep_their_own_watermarks() {
    let app = Arc::new(corp("ww_a"));
    let (gateway, seen) = collecting(
        app.clone(),
        &["message.*"],
        oncegate_gateway::StaleEvents::Drop,
    );
    let at = START_MS / 1000 - 60;
    let text = |id: u64, agent: u32, created_secs: u64| {
        let plain = format!(
            "<xml><ToUserName><![CDATA[ww_a]]></ToUserName><FromUserName><![CDATA[zhangsan]]></FromUserName><CreateTime>{created_secs}</CreateTime><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[m{id}]]></Content><MsgId>{id}</MsgId><AgentID>{agent}</AgentID></xml>"
        );
        let nonce = format!("{:016x}", fastrand::u64(..));
        to_request(
            "a",
            app.seal(plain.as_bytes(), START_MS / 1000, &nonce, [5; 16]),
        )
    };
    for request in [text(11, 1, at + 5), text(21, 2, at), text(12, 1, at)] {
        assert_eq!(call(&gateway, request).await.0, StatusCode::OK);
        // One at a time: each is applied before the next is admitted.
        let admitted = gateway.stats().admitted;
        dispatch_until_settled(&gateway, admitted).await;
    }
    let delivered: Vec<String> = seen
        .0
        .lock()
        .expect("log")
        .iter()
        .map(|event| event.event_id.to_string())
        .collect();
    assert_eq!(
        delivered,
        ["11", "21"],
        "agent 2's message is its own conversation; agent 1's older one is stale"
    );
    assert_eq!(gateway.stats().stale_dropped, 1);
}

/// A downstream that answers every event with a reply XML naming how often it was called.
async fn replier(calls: Arc<std::sync::atomic::AtomicUsize>) -> String {
    let app = axum::Router::new().route(
        "/reply",
        axum::routing::post(move || {
            let calls = calls.clone();
            async move {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                format!("<xml><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[reply {n}]]></Content></xml>")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/reply")
}

/// A field of an encrypted reply envelope.
fn field<'a>(xml: &'a str, name: &str) -> &'a str {
    let open = format!("<{name}>");
    let start = xml.find(&open).map(|at| at + open.len()).expect("field");
    let rest = &xml[start..];
    let text = &rest[..rest.find(&format!("</{name}>")).expect("end")];
    text.trim_start_matches("<![CDATA[").trim_end_matches("]]>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replying_route_answers_with_the_encrypted_reply_once() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = replier(calls.clone()).await;
    let sink = oncegate_gateway::HttpSink::new(&url, None, std::time::Duration::from_secs(3))
        .expect("sink");
    let app = Arc::new(corp("ww_a"));
    let gateway = Arc::new(
        gateway(vec![("a", app.clone())])
            .replying_route(&["message.text"], Arc::new(sink))
            .expect("route"),
    );
    let request = app.seal(
        &app.message(&message("501", "zhangsan")),
        START_MS / 1000,
        "reply-nonce",
        [6; 16],
    );
    // The first call and a platform retry of it, byte for byte, while the first still runs.
    let (first, retry) = tokio::join!(call(&gateway, to_request("a", request.clone())), async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        call(&gateway, to_request("a", request.clone())).await
    });
    for (status, body) in [&first, &retry] {
        assert_eq!(*status, StatusCode::OK, "{}", String::from_utf8_lossy(body));
    }
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one call downstream"
    );
    let key = oncegate_wecom::AesKey::from_encoding_aes_key(KEY).expect("key");
    let timestamp = (START_MS / 1000).to_string();
    let mut replies = Vec::new();
    for (_, body) in [first, retry] {
        let envelope = String::from_utf8(body).expect("utf8");
        let encrypt = field(&envelope, "Encrypt");
        assert_eq!(field(&envelope, "TimeStamp"), timestamp);
        assert_eq!(field(&envelope, "Nonce"), "reply-nonce");
        assert!(oncegate_wecom::crypto::verify(
            field(&envelope, "MsgSignature"),
            &["corp-token", &timestamp, "reply-nonce", encrypt]
        ));
        let reply = oncegate_wecom::crypto::decrypt(&key, encrypt, "ww_a").expect("decrypts");
        replies.push(String::from_utf8(reply).expect("utf8"));
    }
    assert!(replies[0].contains("reply 1"), "{}", replies[0]);
    assert_eq!(replies[0], replies[1], "the retry gets the stored reply");
    // Replied events are not queued.
    assert_eq!(gateway.stats().admitted, 0);
}

/// After a reload changed the app's token and key, a callback still sealed with the old ones
/// (within `server.secret_overlap`) is taken, and its passive reply is sealed with the secrets
/// it came with: WeCom, which has not switched yet, can read it. The new secrets' callbacks get
/// replies sealed with the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_to_a_callback_with_the_old_secrets_is_sealed_with_them() {
    const NEW_KEY: &str = "Zq8pLm3nB7vC1xR5tY9uI2oP4aS6dF0gH8jK3lQ7wEA";
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = replier(calls.clone()).await;
    let file = |token: &str, key: &str| {
        let text = format!(
            "[store]\nbackend = \"memory\"\n\n[replay]\nenabled = false\n\n[[source]]\nname = \"a\"\n\
             platform = \"wecom\"\ncorp_id = \"ww_a\"\ntoken = \"{token}\"\n\
             encoding_aes_key = \"{key}\"\n\n[[route]]\nevents = [\"message.text\"]\n\
             sink = \"http\"\nurl = \"{url}\"\nreply = true\n"
        );
        oncegate_config::load_str(&text, std::path::Path::new("test.toml"), [])
            .expect("configuration")
    };
    let gateway = Gateway::from_config(&file("corp-token", KEY), MemoryStore::new())
        .await
        .expect("gateway");
    let reloaded = gateway
        .reload_with(&file("corp-token-new", NEW_KEY))
        .await
        .expect("reload");
    assert_eq!(reloaded.sources.changed, ["a"]);
    for (token, key, nonce) in [
        ("corp-token", KEY, "old-n"),
        ("corp-token-new", NEW_KEY, "new-n"),
    ] {
        let app = WecomApp::new("ww_a", token, key).expect("app");
        let plain = app.message(&message(nonce, "zhangsan"));
        let request = app.seal(&plain, START_MS / 1000, nonce, [6; 16]);
        let response = gateway
            .webhooks_router()
            .oneshot(to_request("a", request))
            .await
            .expect("answer");
        assert_eq!(response.status(), StatusCode::OK, "sealed with {token}");
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        let envelope = String::from_utf8(body.to_vec()).expect("utf8");
        let encrypt = field(&envelope, "Encrypt");
        let timestamp = field(&envelope, "TimeStamp");
        assert!(
            oncegate_wecom::crypto::verify(
                field(&envelope, "MsgSignature"),
                &[token, timestamp, nonce, encrypt]
            ),
            "the reply is signed with the token the callback came with ({token})"
        );
        let aes = oncegate_wecom::AesKey::from_encoding_aes_key(key).expect("key");
        oncegate_wecom::crypto::decrypt(&aes, encrypt, "ww_a")
            .expect("the reply is encrypted with the key the callback came with");
    }
}

/// WeCom's published message (wechatpy's fixture: corp `wx5823bf96d3bd56c7`, token `QDG6eK`),
/// posted byte for byte after a reload changed the app's token and key: taken while
/// `server.secret_overlap` lasts, refused (401) by a gateway whose reload set no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_published_message_with_the_replaced_secrets_is_taken_only_within_the_overlap() {
    const BODY: &str = "<xml><ToUserName><![CDATA[wx5823bf96d3bd56c7]]></ToUserName><Encrypt><![CDATA[RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q==]]></Encrypt><AgentID><![CDATA[218]]></AgentID></xml>";
    const QUERY: &str = "msg_signature=477715d11cdb4164915debcba66cb864d751f3e6&timestamp=1409659813&nonce=1372623149";
    let file = |token: &str, key: &str, overlap: &str| {
        let text = format!(
            "[store]\nbackend = \"memory\"\n\n[server]\nsecret_overlap = \"{overlap}\"\n\n\
             [replay]\nenabled = false\n\n[[source]]\nname = \"a\"\nplatform = \"wecom\"\n\
             corp_id = \"wx5823bf96d3bd56c7\"\ntoken = \"{token}\"\nencoding_aes_key = \"{key}\"\n"
        );
        oncegate_config::load_str(&text, std::path::Path::new("test.toml"), [])
            .expect("configuration")
    };
    let published = || {
        Request::post(format!("/webhook/a?{QUERY}"))
            .body(Body::from(BODY))
            .expect("request")
    };
    for (overlap, status) in [("1h", StatusCode::OK), ("0s", StatusCode::UNAUTHORIZED)] {
        let gateway = Gateway::from_config(&file("QDG6eK", KEY, overlap), MemoryStore::new())
            .await
            .expect("gateway");
        gateway
            .reload_with(&file(
                "new-token",
                "Zq8pLm3nB7vC1xR5tY9uI2oP4aS6dF0gH8jK3lQ7wEA",
                overlap,
            ))
            .await
            .expect("reload");
        let answer = gateway
            .webhooks_router()
            .oneshot(published())
            .await
            .expect("answer");
        assert_eq!(answer.status(), status, "overlap {overlap}");
        assert_eq!(
            gateway.stats().admitted,
            u64::from(status == StatusCode::OK)
        );
    }
}

/// A suite serves many corps at one URL: a corp's passive reply is encrypted for that corp
/// (with the suite's token and key), as a self-built app's is for its own — another corp of
/// the same suite could not read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suite_corps_passive_reply_is_sealed_for_that_corp() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = replier(calls.clone()).await;
    let sink = oncegate_gateway::HttpSink::new(&url, None, std::time::Duration::from_secs(3))
        .expect("sink");
    let suite = Arc::new(
        oncegate_wecom::WecomSuite::new("ww4asffe99e54c0f4c", None, "suite-token", KEY)
            .expect("suite"),
    );
    oncegate_core::WebhookSource::tenants(suite.as_ref())
        .expect("a registry")
        .replace(vec!["wpCorpA".to_owned(), "wpCorpB".to_owned()]);
    let gateway = gateway(vec![("suite", suite)])
        .replying_route(&["message.text"], Arc::new(sink))
        .expect("route");
    let corp_a = WecomApp::new("wpCorpA", "suite-token", KEY).expect("sealer");
    let request = corp_a.seal(
        &corp_a.message(&message("801", "zhangsan")),
        START_MS / 1000,
        "suite-reply",
        [7; 16],
    );
    let (status, body) = call(&gateway, to_request("suite", request)).await;
    assert_eq!(status, StatusCode::OK);
    let envelope = String::from_utf8(body).expect("utf8");
    let encrypt = field(&envelope, "Encrypt");
    let timestamp = (START_MS / 1000).to_string();
    assert!(oncegate_wecom::crypto::verify(
        field(&envelope, "MsgSignature"),
        &["suite-token", &timestamp, "suite-reply", encrypt]
    ));
    let key = oncegate_wecom::AesKey::from_encoding_aes_key(KEY).expect("key");
    let reply = oncegate_wecom::crypto::decrypt(&key, encrypt, "wpCorpA").expect("for corp A");
    assert!(String::from_utf8_lossy(&reply).contains("reply 1"));
    assert!(oncegate_wecom::crypto::decrypt(&key, encrypt, "wpCorpB").is_err());
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A replying route that takes every event does not take a suite's `suite_ticket` as a
/// synchronous call: the push is queued (answered `success`), so that the dispatcher keeps the
/// ticket before any route sees it; the replying downstream is not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suites_ticket_is_queued_even_where_a_replying_route_takes_every_event() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let url = replier(calls.clone()).await;
    let sink = oncegate_gateway::HttpSink::new(&url, None, std::time::Duration::from_secs(3))
        .expect("sink");
    let suite = Arc::new(
        oncegate_wecom::WecomSuite::new("ww4asffe99e54c0f4c", None, "suite-token", KEY)
            .expect("suite"),
    );
    let gateway = gateway(vec![("suite", suite)])
        .replying_route(&["*"], Arc::new(sink))
        .expect("route");
    let sealer = WecomApp::new("ww4asffe99e54c0f4c", "suite-token", KEY).expect("sealer");
    let ticket = "<xml><SuiteId><![CDATA[ww4asffe99e54c0f4c]]></SuiteId><InfoType><![CDATA[suite_ticket]]></InfoType><TimeStamp>1700000000</TimeStamp><SuiteTicket><![CDATA[t-1]]></SuiteTicket></xml>";
    let request = sealer.seal(ticket.as_bytes(), START_MS / 1000, "ticket-n", [8; 16]);
    let (status, body) = call(&gateway, to_request("suite", request)).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"success"[..]));
    assert_eq!(gateway.stats().admitted, 1, "queued for the dispatcher");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// A downstream that has nothing to reply answers 204 or an empty 200: WeCom gets the empty
/// 200 and an Official Account `success`, as the README says, never an encrypted `{}`; a retry
/// gets the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_reply_is_the_platforms_empty_answer() {
    for status in [204u16, 200] {
        let app = axum::Router::new().route(
            "/reply",
            axum::routing::post(move || async move {
                axum::http::StatusCode::from_u16(status).expect("status")
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let sink = Arc::new(
            oncegate_gateway::HttpSink::new(
                &format!("http://{addr}/reply"),
                None,
                std::time::Duration::from_secs(3),
            )
            .expect("sink"),
        );
        let corp = Arc::new(corp("ww_a"));
        let oa = Arc::new(WechatApp::new("wx_oa", "oa-token", Some(KEY)).expect("app"));
        let gateway = gateway(vec![("a", corp.clone()), ("oa", oa.clone())])
            .replying_route(&["message.text"], sink)
            .expect("route");
        let expected: [(&str, &dyn Sealer, &[u8]); 2] =
            [("a", corp.as_ref(), b""), ("oa", oa.as_ref(), b"success")];
        for (name, sealer, answer) in expected {
            let request = sealer.seal(
                &sealer.message(&message(&format!("e-{name}-{status}"), "zhangsan")),
                START_MS / 1000,
                "empty-nonce",
                [7; 16],
            );
            for attempt in ["first", "retry"] {
                let (got, body) = call(&gateway, to_request(name, request.clone())).await;
                assert_eq!(
                    (got, body.as_slice()),
                    (StatusCode::OK, answer),
                    "{name}, downstream {status}, {attempt}: {}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
    }
}

fn versioned(detail: &str, member: &str, created_secs: u64, last: &str, cur: &str) -> String {
    membership(detail, member, created_secs).replace(
        "</xml>",
        &format!("<LastMemVer>{last}</LastMemVer><CurMemVer>{cur}</CurMemVer></xml>"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_versions_order_changes_within_one_second() {
    let app = Arc::new(corp("ww_a"));
    let (gateway, seen) = membership_gateway(app.clone());
    let second = START_MS / 1000 - 30;
    // One second, two chains: x joins then leaves, arriving backwards (the join is older by
    // its version, not by its time); y joins then leaves, arriving in order.
    for plain in [
        versioned("del_member", "wm_x", second, "v2", "v3"),
        versioned("add_member", "wm_x", second, "v1", "v2"),
        versioned("add_member", "wm_y", second, "v3", "v4"),
        versioned("del_member", "wm_y", second, "v4", "v5"),
    ] {
        let nonce = format!("{:016x}", fastrand::u64(..));
        let request = to_request(
            "a",
            app.seal(plain.as_bytes(), START_MS / 1000, &nonce, [4; 16]),
        );
        assert_eq!(call(&gateway, request).await.0, StatusCode::OK);
    }
    dispatch_until_settled(&gateway, 4).await;
    let delivered: Vec<String> = seen
        .0
        .lock()
        .expect("log")
        .iter()
        .map(|event| {
            let text = String::from_utf8_lossy(&event.payload);
            let cur = text
                .split("<CurMemVer>")
                .nth(1)
                .and_then(|rest| rest.split('<').next());
            cur.unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(
        delivered,
        ["v3", "v4", "v5"],
        "the join that the delivered leave superseded is dropped; the in-order pair is not"
    );
    assert_eq!(gateway.stats().stale_dropped, 1);
}
