//! Routes by tenant, through the binary: a WeCom suite serving 100 corps at one URL, their
//! callbacks sealed for each corp (as WeCom posts them to the data URL, with the agent they name):
//! a route narrowed to one corp takes that corp's events only, one narrowed to a corp's agent
//! that agent's only, and the catch-all posts each event to a URL that names its corp and agent
//! (`{tenant}`, `{agent}`), with `Oncegate-Tenant` and `Oncegate-Agent` headers — a corp's event
//! never reaches another corp's place.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncegate_core::{SealedRequest, Sealer};
use oncegate_wecom::WecomApp;
use support::suite::{KEY, TOKEN, now, post, readme_source_by_hand};
use support::{Serve, client, wait_until};

/// What the catch-all's receiver got: (corp in the path, agent in the path, the tenant and
/// agent headers, the envelope's app).
type Received = Arc<Mutex<Vec<(String, String, String, String, String)>>>;

async fn receiver() -> (Received, String) {
    use axum::extract::{Path as UrlPath, State};
    use axum::http::HeaderMap;
    let got: Received = Arc::default();
    let app = axum::Router::new()
        .route(
            "/tenants/{tenant}/agents/{agent}",
            axum::routing::post(
                |State(got): State<Received>,
                 UrlPath((tenant, agent)): UrlPath<(String, String)>,
                 headers: HeaderMap,
                 body: axum::body::Bytes| async move {
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned()
                    };
                    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    got.lock().expect("got").push((
                        tenant,
                        agent,
                        header("oncegate-tenant"),
                        header("oncegate-agent"),
                        doc["app"].as_str().unwrap_or_default().to_owned(),
                    ));
                    axum::http::StatusCode::NO_CONTENT
                },
            ),
        )
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (got, url)
}

/// A corp's text message as WeCom documents it (the app message's XML, naming its AgentID),
/// sealed for the corp with the suite's token and key.
fn corp_message(corp: &str, agent: u32, msg_id: u64) -> SealedRequest {
    let sealer = WecomApp::new(corp, TOKEN, KEY).expect("sealer");
    let now = now();
    let plain = format!(
        "<xml><ToUserName><![CDATA[{corp}]]></ToUserName><FromUserName><![CDATA[zhangsan]]></FromUserName><CreateTime>{now}</CreateTime><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[hello]]></Content><MsgId>{msg_id}</MsgId><AgentID>{agent}</AgentID></xml>"
    );
    sealer.seal(plain.as_bytes(), now, &format!("n{msg_id}"), [7; 16])
}

/// The README's example of routes by tenant, for `corp` and posting to `receiver`.
fn readme_routes(corp: &str, file: &str, receiver: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let block = readme
        .split_once("**Routes by tenant.**")
        .and_then(|(_, section)| section.split_once("```toml\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the README's example of routes by tenant")
        .0;
    let replaced = block
        .replace("wpAbCdEf0123456789ZzYy", corp)
        .replace("acme-helpdesk.jsonl", file)
        .replace("https://hooks.example.com", receiver);
    assert!(
        replaced.contains(corp) && replaced.contains(receiver),
        "{replaced}"
    );
    replaced
}

fn config(dir: &Path, receiver: &str, corp0: &str, corp1: &str) -> String {
    let file = |name: &str| {
        dir.join(format!("{name}/events.jsonl"))
            .display()
            .to_string()
    };
    format!(
        r#"[store]
backend = "embedded"
path = "{store}"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

{source}
[[route]]
events = ["message.*"]
tenants = ["{corp0}"]
sink = "file"
path = "{first}"

{readme}"#,
        store = dir.join("store").display(),
        source = readme_source_by_hand(),
        first = file("corp0"),
        readme = readme_routes(corp1, &file("corp1agent"), receiver),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_corps_events_reach_only_the_routes_and_urls_of_their_tenant() {
    let (got, receiver_url) = receiver().await;
    let dir = tempfile::tempdir().expect("dir");
    // Corp ids as WeCom gives an ISV: opaque, case-sensitive; one with characters a URL must
    // not take raw.
    let mut corps: Vec<String> = (0..99).map(|i| format!("wpCorp{i:03}Xy")).collect();
    corps.push("wp Odd?Corp#1&x".to_owned());
    let gateway = Serve::start_with(
        dir.path(),
        &config(dir.path(), &receiver_url, &corps[0], &corps[1]),
    );
    for corp in &corps {
        let encoded: String = corp
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let response = client()
            .put(format!("{}/admin/tenants/suite/{encoded}", gateway.admin))
            .send()
            .await
            .expect("put");
        assert!(response.status().is_success(), "{corp}: {response:?}");
    }
    // Every corp sends from two agents; corp 1's agent 1000002 has its own route.
    let mut sent = 0;
    for (i, corp) in corps.iter().enumerate() {
        for (j, agent) in [1_000_002, 1_000_003].into_iter().enumerate() {
            let msg_id = 7_000_000 + (i * 2 + j) as u64;
            let (status, body) = post(&gateway, &corp_message(corp, agent, msg_id)).await;
            assert_eq!(status, 200, "{corp}: {body}; {}", gateway.stderr());
            sent += 1;
        }
    }
    // Corp 0's two, and corp 1's agent 1000002, go to their routes; the rest to the catch-all.
    wait_until("every event delivered", Duration::from_secs(30), || {
        got.lock().expect("got").len() >= sent - 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let read = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join(format!("{name}/events.jsonl")))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("json"))
            .collect()
    };
    let corp0 = read("corp0");
    assert_eq!(corp0.len(), 2, "{corp0:?}");
    assert!(corp0.iter().all(|line| line["app"] == corps[0].as_str()));
    let corp1 = read("corp1agent");
    assert_eq!(corp1.len(), 1, "{corp1:?}");
    assert_eq!(corp1[0]["app"], corps[1].as_str());
    assert_eq!(corp1[0]["tenant"], "1000002");
    assert_eq!(corp1[0]["owner"]["tenant"], corps[1].as_str());
    assert_eq!(corp1[0]["owner"]["agent"], "1000002");
    let got = got.lock().expect("got").clone();
    assert_eq!(got.len(), sent - 3, "each once");
    let mut per_corp: HashMap<&str, usize> = HashMap::new();
    for (path_tenant, path_agent, header_tenant, header_agent, app) in &got {
        assert_eq!(path_tenant, app, "the URL names the event's own corp");
        assert_eq!(header_tenant, app);
        assert_eq!(path_agent, header_agent);
        assert!(path_agent == "1000002" || path_agent == "1000003");
        assert_ne!(app, &corps[0], "corp 0's events have their own route");
        *per_corp.entry(app.as_str()).or_default() += 1;
    }
    assert_eq!(per_corp.len(), 99);
    assert_eq!(per_corp.get(corps[1].as_str()), Some(&1));
    assert_eq!(
        per_corp.get("wp Odd?Corp#1&x"),
        Some(&2),
        "encoded, not split"
    );
}
