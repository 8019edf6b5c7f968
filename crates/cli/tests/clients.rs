//! The Python and TypeScript clients (`clients/`) run their own tests against a real gateway
//! started here: `/keys` with a caller, `/send` as a Feishu source in front of the local
//! Feishu-like API (which counts what it really sent), and one real delivery of an `http` route,
//! signed with the route's secret, for their webhook verification. The README's client
//! examples are the files `clients/*/examples/`, run here too.
//!
//! scripts/test installs what they need (a venv with the Standard Webhooks library for Python,
//! `npm ci` for TypeScript) and names the Python in `ONCEGATE_TEST_PYTHON`.

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::HeaderMap;
use oncegate_feishu::FeishuApp;
use oncegate_send::local::LocalFeishuApi;
use support::{Serve, client, wait_until};

const TOKEN: &str = "clients-caller-token";
const APP: &str = "cli_clients_app";
const APP_SECRET: &str = "clients-app-secret";
const ENCRYPT_KEY: &str = "clients-encrypt-key";
const VERIFICATION: &str = "clients-verification";
/// The Standard Webhooks specification's example secret.
const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn config(dir: &Path, domain: &str, sink: SocketAddr) -> String {
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

[[api.caller]]
name = "bots"
token = "{TOKEN}"

[[source]]
name = "feishu"
platform = "feishu"
app_id = "{APP}"
encrypt_key = "{ENCRYPT_KEY}"
verification_token = "{VERIFICATION}"
app_secret = "{APP_SECRET}"
domain = "{domain}"

[[route]]
events = ["*"]
sink = "http"
url = "http://{sink}/events"
secret = "{WEBHOOK_SECRET}"
"#,
        store = dir.join("store.redb").display()
    )
}

type Captured = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

/// An endpoint that keeps every delivery it gets, as received.
async fn capture() -> (SocketAddr, Captured) {
    let kept: Captured = Arc::default();
    let store = kept.clone();
    let app = axum::Router::new().route(
        "/events",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let store = store.clone();
            async move {
                store.lock().expect("lock").push((headers, body));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, kept)
}

/// One Feishu message event, encrypted and signed as Feishu sends it.
async fn post_event(gateway: &Serve) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let plain = serde_json::json!({
        "schema": "2.0",
        "header": {"event_id": "ev-clients-1", "token": VERIFICATION, "create_time": format!("{}", now * 1000),
                   "event_type": "im.message.receive_v1", "tenant_key": "t1", "app_id": APP},
        "event": {"message": {"message_id": "om_clients1", "chat_id": "oc_clients", "chat_type": "group"}}
    })
    .to_string();
    let app = FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        APP,
        Some(ENCRYPT_KEY.into()),
        Some(VERIFICATION.into()),
    )
    .expect("app");
    let (timestamp, nonce) = (now.to_string(), "clientsnonce0001");
    let (body, signature) = app.seal(plain.as_bytes(), &timestamp, nonce, [7; 16]);
    let response = client()
        .post(format!("{}/webhook/feishu", gateway.base))
        .header("x-lark-request-timestamp", &timestamp)
        .header("x-lark-request-nonce", nonce)
        .header("x-lark-signature", signature.expect("signed"))
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
}

/// The first delivery, as the clients' tests read it: the secret, the headers they verify, the
/// body as received.
fn write_delivery(dir: &Path, kept: &Captured) -> PathBuf {
    let (headers, body) = kept.lock().expect("lock")[0].clone();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_else(|| panic!("the delivery has no {name}: {headers:?}"))
            .to_owned()
    };
    let fixture = serde_json::json!({
        "secret": WEBHOOK_SECRET,
        "headers": {
            "webhook-id": header("webhook-id"),
            "webhook-timestamp": header("webhook-timestamp"),
            "webhook-signature": header("webhook-signature"),
            "idempotency-key": header("idempotency-key"),
        },
        "body": String::from_utf8(body.to_vec()).expect("a UTF-8 body"),
    });
    let path = dir.join("delivery.json");
    std::fs::write(&path, fixture.to_string()).expect("write the delivery");
    path
}

pub(crate) fn python() -> String {
    std::env::var("ONCEGATE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "ONCEGATE_TEST_PYTHON is not set: run scripts/test (it makes a venv with the client's \
             webhooks extra), or set it to a python3 with `pip install standardwebhooks`"
        )
    })
}

/// The TypeScript package built (tsc: the client, its tests, the example); its folder.
fn typescript() -> PathBuf {
    let folder = root().join("clients/typescript");
    let tsc = folder.join("node_modules/.bin/tsc");
    assert!(
        tsc.exists(),
        "{} is missing: run `npm ci` in clients/typescript (scripts/test does)",
        tsc.display()
    );
    let built = Command::new(&tsc)
        .args(["-p", "."])
        .current_dir(&folder)
        .output()
        .expect("run tsc");
    assert!(
        built.status.success(),
        "tsc: {}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    folder
}

/// Runs `command` with the gateway's coordinates in its environment; panics with its output
/// when it fails.
fn run(mut command: Command, env: &[(&str, String)], what: &str) -> String {
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_and_typescript_clients_pass_their_tests_against_a_real_gateway() {
    let platform = LocalFeishuApi::start(APP, APP_SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let (sink, kept) = capture().await;
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &platform.domain(), sink));
    let api = gateway.api.clone().expect("api");
    post_event(&gateway).await;
    wait_until("a delivery", Duration::from_secs(10), || {
        !kept.lock().expect("lock").is_empty()
    })
    .await;
    let delivery = write_delivery(dir.path(), &kept);
    let env = [
        ("ONCEGATE_API", api),
        ("ONCEGATE_TOKEN", TOKEN.to_owned()),
        ("ONCEGATE_SEND_SOURCE", "feishu".to_owned()),
        ("ONCEGATE_RUN", format!("run {}", std::process::id())),
        ("ONCEGATE_DELIVERY", delivery.display().to_string()),
    ];

    let mut python_tests = Command::new(python());
    python_tests
        .args(["-m", "unittest", "discover", "-v", "-s", "tests"])
        .current_dir(root().join("clients/python"))
        .env("PYTHONPATH", root().join("clients/python"));
    let said = run(python_tests, &env, "the Python client's tests");
    assert!(
        said.contains("Ran 11 tests") && said.contains("OK"),
        "{said}"
    );
    assert_eq!(
        platform.sent().len(),
        1,
        "Python's repeated sends: one message"
    );

    let folder = typescript();
    let mut node_tests = Command::new("node");
    node_tests
        .args(["--test", "dist/test/"])
        .current_dir(&folder);
    let said = run(node_tests, &env, "the TypeScript client's tests");
    assert!(
        said.contains("# pass 9") && said.contains("# fail 0"),
        "{said}"
    );
    assert_eq!(
        platform.sent().len(),
        2,
        "TypeScript's repeated sends: one message"
    );
}

/// The README's client examples are the example files, byte for byte; each creates an order once
/// for 8 concurrent callers and gives every caller the one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_client_examples_are_the_files_and_create_an_order_once() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    for (file, fence) in [
        ("clients/python/examples/orders.py", "```python\n"),
        ("clients/typescript/examples/orders.ts", "```ts\n"),
    ] {
        let text = std::fs::read_to_string(root().join(file)).expect("example");
        assert!(
            readme.contains(&format!("{fence}{text}```")),
            "the README shows {file} as it is, in a {fence:?} block"
        );
    }
    let platform = LocalFeishuApi::start(APP, APP_SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let (sink, _kept) = capture().await;
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &platform.domain(), sink));
    let env = [
        ("ONCEGATE_API", gateway.api.clone().expect("api")),
        ("ORDERS_API_TOKEN", TOKEN.to_owned()),
    ];
    let mut python_example = Command::new(python());
    python_example
        .args(["-c", PYTHON_EIGHT_CALLERS])
        .current_dir(root().join("clients/python"))
        .env("PYTHONPATH", root().join("clients/python"));
    let said = run(python_example, &env, "the Python example");
    assert!(
        said.contains(r#"created 1: [{"order": "order-42"}] x8"#),
        "{said}"
    );
    let folder = typescript();
    let mut node_example = Command::new("node");
    node_example
        .args(["-e", NODE_EIGHT_CALLERS])
        .current_dir(&folder);
    let said = run(node_example, &env, "the TypeScript example");
    assert!(
        said.contains(r#"created 1: [{"order":"order-43"}] x8"#),
        "{said}"
    );
}

const PYTHON_EIGHT_CALLERS: &str = r#"
import json, runpy, threading, time
example = runpy.run_path("examples/orders.py")
class Shop:
    created = 0
    def create_order(self, order_id, body):
        Shop.created += 1
        time.sleep(0.2)
        return {"id": f"order-{order_id}"}
shop, answers = Shop(), []
callers = [threading.Thread(target=lambda: answers.append(
    example["create_order_once"](shop, 42, {"sku": "A-1", "qty": 2}))) for _ in range(8)]
[caller.start() for caller in callers]
[caller.join() for caller in callers]
unique = [json.loads(one) for one in sorted({json.dumps(answer) for answer in answers})]
print(f"created {Shop.created}: {json.dumps(unique)} x{len(answers)}")
"#;

const NODE_EIGHT_CALLERS: &str = r#"
const { createOrderOnce } = require("./dist/examples/orders.js");
let created = 0;
const shop = { async createOrder(id) { created += 1; await new Promise((r) => setTimeout(r, 200)); return { id: `order-${id}` }; } };
Promise.all(Array.from({ length: 8 }, () => createOrderOnce(shop, 43, { sku: "B-2", qty: 1 })))
  .then((answers) => console.log(`created ${created}: ${JSON.stringify([...new Set(answers.map((a) => JSON.stringify(a)))].map(JSON.parse))} x${answers.length}`))
  .catch((error) => { console.error(error); process.exit(1); });
"#;
