//! A replying route's handler that answers 410 (the Standard Webhooks "gone"): its answer is
//! kept for the event, so WeCom's retries of the callback do not call it again, and the route
//! stops — later callbacks do not reach the handler either — as the dispatcher does for a
//! route that delivers from the queue. `/admin/routes` shows it gone, with the public key its
//! receivers verify `v1a` signatures with.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use oncegate_core::{Sealer, SyntheticMessage};
use oncegate_wecom::WecomApp;
use support::{Serve, client};

const CORP: &str = "wwreplygone01";
const TOKEN: &str = "reply-gone-token";
const KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";

/// A handler that answers every call 410, counting them.
async fn gone_handler(calls: Arc<AtomicUsize>) -> String {
    let app = axum::Router::new().route(
        "/bot",
        axum::routing::post(move || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                (axum::http::StatusCode::GONE, "this bot was retired")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/bot", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn post(gateway: &Serve, id: &str) -> u16 {
    let sealer = WecomApp::new(CORP, TOKEN, KEY).expect("sealer");
    let now = support::suite::now();
    let plain = sealer.message(&SyntheticMessage {
        id: id.to_owned(),
        chat: "chat".into(),
        sender: "zhangsan".into(),
        text: "hello".into(),
        created_ms: now * 1000,
    });
    // WeCom's retries repeat the request byte for byte.
    let sealed = sealer.seal(&plain, now, &format!("nonce-{id}"), [4; 16]);
    client()
        .post(format!(
            "{}/webhook/corp?{}",
            gateway.base,
            sealed.query.as_deref().unwrap_or_default()
        ))
        .body(sealed.body)
        .send()
        .await
        .expect("post")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_reply_handler_is_called_once_and_its_route_stops() {
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = gone_handler(calls.clone()).await;
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        r#"[store]
backend = "memory"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[[source]]
name = "corp"
platform = "wecom"
corp_id = "{CORP}"
token = "{TOKEN}"
encoding_aes_key = "{KEY}"
[[route]]
events = ["message.*"]
sink = "http"
url = "{handler}"
reply = true
signing_key = "whsk_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
"#
    );
    let gateway = Serve::start_with(dir.path(), &config);
    // The first call and WeCom's three retries: the handler is called once.
    let first = post(&gateway, "m1").await;
    assert_ne!(first, 200);
    for _ in 0..3 {
        assert_eq!(post(&gateway, "m1").await, first);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The route is gone: another message does not reach the handler, and readiness says so.
    assert_ne!(post(&gateway, "m2").await, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let routes: serde_json::Value = client()
        .get(format!("{}/admin/routes", gateway.admin))
        .send()
        .await
        .expect("routes")
        .json()
        .await
        .expect("json");
    let reason = routes["routes"][0]["gone"]["reason"].to_string();
    assert!(reason.contains("410"), "{routes}");
    // The route's v1a public key is shown, as its receivers need it.
    let public_key = routes["routes"][0]["public_key"]
        .as_str()
        .unwrap_or_default();
    assert!(
        public_key.starts_with("whpk_") && public_key.len() > 40,
        "{routes}"
    );
}
