//! `/send` through a generic sender (`[source.send]` of a `platform = "webhook"` source): the
//! seeds' third-party gateways take `client_msg_id` and drop a second call carrying one they
//! have seen. A local gateway API written that way answers the first call too late: the
//! caller's retry carries the same `client_msg_id`, and the message goes out once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::{Value, json};

use crate::support::{Serve, client};

const TOKEN: &str = "caller-token";

/// What the local gateway API saw.
#[derive(Default)]
struct Seen {
    /// Every call: its `client_msg_id` and `Authorization`.
    calls: Vec<(String, String)>,
    /// Messages really sent, by `client_msg_id`: their id.
    sent: HashMap<String, String>,
    /// Answer the next call this late.
    slow: Option<Duration>,
}

type Shared = Arc<Mutex<Seen>>;

/// `POST /api/send`: sends once per `client_msg_id` (a repeat answers the first's id).
async fn api_send(
    State(seen): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    let key = body["client_msg_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if body["conversationId"] == "wr_gone" {
        return Json(json!({"code": 40004, "msg": "no such conversation"}));
    }
    let (id, slow) = {
        let mut seen = seen.lock().expect("lock");
        seen.calls.push((key.clone(), auth));
        let next = format!("m-{}", seen.sent.len() + 1);
        let id = seen.sent.entry(key).or_insert(next).clone();
        (id, seen.slow.take())
    };
    if let Some(slow) = slow {
        tokio::time::sleep(slow).await;
    }
    Json(json!({"code": 0, "data": {"msg_id": id}}))
}

async fn local_api() -> (String, Shared) {
    let seen = Shared::default();
    let router = axum::Router::new()
        .route("/api/send", axum::routing::post(api_send))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{address}/api/send"), seen)
}

fn config(dir: &std::path::Path, url: &str) -> String {
    format!(
        r#"
[store]
backend = "embedded"
path = "{store}"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"
send_timeout = "500ms"

[[api.caller]]
name = "bot"
token = "{TOKEN}"

[[source]]
name = "xy"
platform = "webhook"
preset = "xingyapi"
verify = "token"
signature = "query:key"
secret = "url-secret"

[source.send]
url = "{url}"
headers = {{ Authorization = "Bearer gateway-api-token" }}
key = ["/client_msg_id"]
ok = "/code"
receiver = "/conversationId"
per_receiver_per_minute = 600
"#,
        store = dir.join("store").display()
    )
}

async fn send(api: &str, key: &str, body: &Value) -> (u16, Value) {
    let response = client()
        .post(format!("{api}/send/xy"))
        .bearer_auth(TOKEN)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn text(conversation: &str, words: &str) -> Value {
    json!({"conversationId": conversation, "msgtype": "text", "text": {"content": words}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_send_carries_the_same_client_msg_id_and_goes_out_once() {
    let (url, seen) = local_api().await;
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &url));
    let api = gateway.api.clone().expect("api");

    // The gateway API answers after the send's deadline: the outcome is unknown.
    seen.lock().expect("lock").slow = Some(Duration::from_secs(2));
    let (status, answer) = send(&api, "reply-1", &text("wr_abc", "hello")).await;
    assert_eq!(status, 504, "an unknown outcome: {answer}");
    // The caller retries under its key: the same client_msg_id, and the API's dedup.
    let (status, answer) = send(&api, "reply-1", &text("wr_abc", "hello")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"]["msg_id"], "m-1", "{answer}");
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.calls.len(), 2, "{:?}", seen.calls);
        assert_eq!(
            seen.calls[0].0, seen.calls[1].0,
            "one client_msg_id for both calls"
        );
        assert_eq!(seen.calls[0].0.len(), 32);
        assert!(
            seen.calls
                .iter()
                .all(|(_, auth)| auth == "Bearer gateway-api-token")
        );
        assert_eq!(seen.sent.len(), 1, "sent once");
    }
    // Ten callers at once under another key: one call.
    let sends: Vec<_> = (0..10)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { send(&api, "reply-2", &text("wr_abc", "again")).await })
        })
        .collect();
    for sent in sends {
        let (status, answer) = sent.await.expect("join");
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["data"]["msg_id"], "m-2");
    }
    assert_eq!(seen.lock().expect("lock").calls.len(), 3);
    // A refusal by the API's own code is not retried and sends nothing.
    let (status, answer) = send(&api, "reply-3", &text("wr_gone", "x")).await;
    assert!(
        (400..500).contains(&status) || status == 502,
        "{status} {answer}"
    );
    assert_eq!(seen.lock().expect("lock").sent.len(), 2, "nothing new sent");
    // A body without the receiver the budget needs is refused before any call.
    let calls = seen.lock().expect("lock").calls.len();
    let (status, answer) = send(&api, "reply-4", &json!({"msgtype": "text"})).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(seen.lock().expect("lock").calls.len(), calls);
}
