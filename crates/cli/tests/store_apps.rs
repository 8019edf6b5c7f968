//! A Feishu store app end to end against a local Feishu API (`shared/protocols/tenants.md` §2):
//! two gateways on one Redis, the README's store-app source. With no ticket kept, the gateways
//! ask Feishu to push one at start (`app_ticket/resend`); the pushed `app_ticket` (v1, as the
//! documentation shows it) is kept for both; `app_open` adds tenants to the registry; `/send` as
//! each tenant carries that tenant's token and no other's, the app token and each tenant's token
//! fetched once for both gateways; a ticket Feishu refuses (10012) makes a gateway ask again,
//! and the send retried with its key goes out once; `app_uninstalled` stops a tenant's sends.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oncegate_feishu::{Cloud, FeishuApp};
use oncegate_send::local::LocalFeishuApi;
use serde_json::json;
use support::{client, file_route, lines, redis_store, wait_until};

const APP: &str = "cli_9e28cb7ba56a100e";
const ENCRYPT_KEY: &str = "store-e2e-encrypt-key";
const TOKEN: &str = "store-e2e-verification-token";
const APP_SECRET: &str = "store-e2e-app-secret";
const CALLER: &str = "caller-token-store-0123456789";

/// The README's section on store apps: its source, secrets inline.
fn readme_source() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let section = readme
        .split_once("### Many tenants: Feishu and Lark store apps")
        .expect("the README's section on store apps")
        .1;
    let block = section
        .split_once("```toml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a toml block")
        .0;
    block
        .replace(
            r#"{ env = "STORE_ENCRYPT_KEY" }"#,
            &format!("\"{ENCRYPT_KEY}\""),
        )
        .replace(
            r#"{ env = "STORE_VERIFICATION_TOKEN" }"#,
            &format!("\"{TOKEN}\""),
        )
        .replace(
            r#"{ env = "STORE_APP_SECRET" }"#,
            &format!("\"{APP_SECRET}\""),
        )
}

fn config(dir: &Path, store: &str, domain: &str) -> String {
    let source = readme_source();
    assert!(source.contains(APP) && source.contains("store_app = true"));
    format!(
        "{}\n{source}domain = \"{domain}\"\n\n{}",
        support::with_api_caller(store, "vendor", CALLER),
        file_route(dir, "")
    )
}

/// `document` as Feishu posts it: encrypted with the app's key, signed.
async fn post(base: &str, document: &str) -> (u16, String) {
    let app = FeishuApp::new(
        Cloud::Feishu,
        APP,
        Some(ENCRYPT_KEY.into()),
        Some(TOKEN.into()),
    )
    .expect("app");
    let timestamp = support::suite::now().to_string();
    let nonce = format!("n{}", fastrand::u64(..));
    let (body, signature) = app.seal(document.as_bytes(), &timestamp, &nonce, [3; 16]);
    let response = client()
        .post(format!("{base}/webhook/store"))
        .header("content-type", "application/json")
        .header("x-lark-request-timestamp", &timestamp)
        .header("x-lark-request-nonce", &nonce)
        .header("x-lark-signature", signature.expect("signed"))
        .body(body)
        .send()
        .await
        .expect("post");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// The `app_ticket` event as the documentation shows it (v1), with `ticket` and a fresh uuid.
fn app_ticket(ticket: &str) -> String {
    let now = support::suite::now();
    format!(
        r#"{{"ts":"{now}.7171419","uuid":"u-{ticket}","token":"{TOKEN}","type":"event_callback","event":{{"app_id":"{APP}","app_ticket":"{ticket}","type":"app_ticket"}}}}"#
    )
}

/// 首次启用应用 (`app_open`) as documented, for `tenant`.
fn app_open(tenant: &str) -> String {
    format!(
        r#"{{"ts":"1502199207.7171419","uuid":"open-{tenant}","token":"{TOKEN}","type":"event_callback","event":{{"app_id":"{APP}","tenant_key":"{tenant}","type":"app_open","applicants":[{{"open_id":"ou_a"}}],"installer":{{"open_id":"ou_b"}}}}}}"#
    )
}

fn app_uninstalled(tenant: &str) -> String {
    format!(
        r#"{{"ts":"1502199207.7171419","uuid":"gone-{tenant}","token":"{TOKEN}","type":"event_callback","event":{{"app_id":"{APP}","tenant_key":"{tenant}","type":"app_uninstalled"}}}}"#
    )
}

/// A tenant's message (schema 2.0), naming its tenant in the header.
fn message(tenant: &str, id: &str) -> String {
    format!(
        r#"{{"schema":"2.0","header":{{"event_id":"{id}","event_type":"im.message.receive_v1","create_time":"{}000","token":"{TOKEN}","app_id":"{APP}","tenant_key":"{tenant}"}},"event":{{"message":{{"message_id":"om_{id}","chat_id":"oc_{tenant}","chat_type":"group","message_type":"text","content":"{{\"text\":\"hi\"}}"}}}}}}"#,
        support::suite::now()
    )
}

/// `POST /send/store/<tenant>` with `key`, to the tenant's chat.
async fn send(api: &str, tenant: &str, key: &str) -> (u16, serde_json::Value) {
    send_to(api, tenant, &format!("oc_{tenant}"), key).await
}

/// `POST /send/store/<tenant>` with `key`, to `chat`.
async fn send_to(api: &str, tenant: &str, chat: &str, key: &str) -> (u16, serde_json::Value) {
    let response = client()
        .post(format!("{api}/send/store/{tenant}"))
        .bearer_auth(CALLER)
        .header("idempotency-key", key)
        .json(&json!({"receive_id": chat, "msg_type": "text",
                      "content": {"text": key}, "wait_ms": 20000}))
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_app_keeps_its_ticket_and_sends_as_each_tenant_with_its_own_token() {
    let platform = LocalFeishuApi::start(APP, APP_SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    // Feishu pushes each ticket a resend issues to the event URL: here, gateway A's, once it
    // is up.
    let (pushes, mut pushed) = tokio::sync::mpsc::unbounded_channel::<String>();
    platform.push_tickets_to(Arc::new(move |ticket| {
        let _ = pushes.send(ticket);
    }));
    let store = redis_store("storeapps");
    let [(a_dir, a), (b_dir, b)] =
        support::start_in_dirs(|dir| config(dir, &store, &platform.domain()));
    // With no ticket kept, the gateways asked for one at start.
    wait_until("a resend at start", Duration::from_secs(10), || {
        platform.resends() >= 1
    })
    .await;
    let pusher = {
        let base = a.base.clone();
        tokio::spawn(async move {
            while let Some(ticket) = pushed.recv().await {
                let (status, body) = post(&base, &app_ticket(&ticket)).await;
                assert_eq!(status, 200, "{body}");
            }
        })
    };

    // 20 tenants install the app, half through each gateway.
    let tenants: Vec<String> = (0..20).map(|i| format!("2ca1d211f64f{i:04}")).collect();
    for (i, tenant) in tenants.iter().enumerate() {
        let base = if i % 2 == 0 { &a.base } else { &b.base };
        let (status, body) = post(base, &app_open(tenant)).await;
        assert_eq!(status, 200, "{body}");
    }
    let listed = b
        .admin_until("/admin/tenants/store", |body| {
            tenants.iter().all(|tenant| body.contains(tenant.as_str()))
        })
        .await;
    assert!(listed.contains(&tenants[19]), "{listed}");

    // 100 concurrent sends across the 20 tenants, on both gateways.
    let mut sends = Vec::new();
    for i in 0..100 {
        let tenant = tenants[i % 20].clone();
        let api = if i % 2 == 0 {
            a.api.clone()
        } else {
            b.api.clone()
        }
        .expect("api");
        sends.push(tokio::spawn(async move {
            let key = format!("k{i}");
            (tenant.clone(), send(&api, &tenant, &key).await)
        }));
    }
    for joined in sends {
        let (tenant, (status, body)) = joined.await.expect("send");
        assert_eq!(status, 200, "{tenant}: {body}; {}", a.stderr());
    }
    let sent = platform.sent();
    assert_eq!(sent.len(), 100);
    let mut by_tenant: HashMap<String, usize> = HashMap::new();
    for message in &sent {
        let tenant = message.tenant.clone().expect("a tenant's token");
        assert_eq!(
            message.receive_id,
            format!("oc_{tenant}"),
            "a message carried another tenant's token"
        );
        *by_tenant.entry(tenant).or_default() += 1;
    }
    assert_eq!(by_tenant.len(), 20);
    assert!(by_tenant.values().all(|count| *count == 5), "{by_tenant:?}");
    // One app token and one token per tenant, for both gateways.
    assert_eq!(platform.app_token_requests(), 1);
    for tenant in &tenants {
        assert_eq!(platform.tenant_token_requests(tenant), 1, "{tenant}");
    }

    // Another system spends tenant 1's quota: Feishu lets 20 a second through for it and
    // answers the rest 429 (`x-ogw-ratelimit-limit: 20`). A burst of 60 to 60 of its chats goes
    // out once each; the gateways lower tenant 1's app budget, no other; tenant 2's burst
    // meanwhile goes at once.
    platform.limit_tenant(&tenants[1], oncegate_core::Rate::per_second(20));
    let mut bursts = Vec::new();
    for (t, count) in [(1, 60), (2, 20)] {
        for i in 0..count {
            let (tenant, api) = (tenants[t].clone(), if i % 2 == 0 { &a } else { &b });
            let api = api.api.clone().expect("api");
            bursts.push(tokio::spawn(async move {
                let (chat, key) = (format!("oc_burst{t}_{i}"), format!("burst-{t}-{i}"));
                let started = std::time::Instant::now();
                let (status, body) = send_to(&api, &tenant, &chat, &key).await;
                (t, status, body, started.elapsed())
            }));
        }
    }
    for burst in bursts {
        let (t, status, body, took) = burst.await.expect("send");
        assert_eq!(status, 200, "tenant {t}: {body}");
        if t == 2 {
            assert!(took < Duration::from_secs(2), "tenant 2 waited {took:?}");
        }
    }
    let limited = platform.limited_in(&tenants[1]);
    assert!(limited > 0, "Feishu's limit was met");
    let burst: Vec<_> = platform
        .sent()
        .into_iter()
        .filter(|m| m.receive_id.starts_with("oc_burst"))
        .collect();
    assert_eq!(burst.len(), 80, "each once");
    let mut lowered = Vec::new();
    let mut counted = 0.0;
    for gateway in [&a, &b] {
        let (_, body) = gateway.admin_get("/admin/send-budgets").await;
        let view: serde_json::Value = serde_json::from_str(&body).expect("json");
        for budget in view["lowered"].as_array().expect("lowered") {
            lowered.push(budget["budget"].as_str().expect("budget").to_owned());
        }
        counted += support::metric_sum(
            &gateway.admin,
            "oncegate_send_budget_lowered_total",
            "limit=\"app\"",
        )
        .await;
    }
    let own = format!("{APP}:{} app", tenants[1]);
    assert!(
        !lowered.is_empty() && lowered.iter().all(|b| *b == own),
        "{lowered:?}"
    );
    assert_eq!(counted, limited as f64, "every 429 counted");
    eprintln!("tenant 1's burst met {limited} 429s");

    // A tenant's message reaches its route naming its tenant.
    let (status, _) = post(&a.base, &message(&tenants[3], "m-t3")).await;
    assert_eq!(status, 200);
    wait_until(
        "the tenant's message delivered",
        Duration::from_secs(10),
        || {
            lines(a_dir.path())
                .iter()
                .chain(lines(b_dir.path()).iter())
                .any(|line| line["event_id"] == "m-t3" && line["tenant"] == tenants[3].as_str())
        },
    )
    .await;

    // Feishu refuses the kept ticket and the app token: a new tenant's first send finds the
    // ticket refused (10012), the gateway asks for another, and the send retried with its key
    // goes out once, with the new tenant's token.
    let resends = platform.resends();
    platform.revoke_tickets();
    platform.expire_app_tokens();
    let late = "2ca1d211f64fLATE";
    let (status, body) = post(&b.base, &app_open(late)).await;
    assert_eq!(status, 200, "{body}");
    b.admin_until("/admin/tenants/store", |body| body.contains(late))
        .await;
    let mut answers = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = send(b.api.as_deref().expect("api"), late, "late-1").await;
        answers.push(status);
        if status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{answers:?} {body}; {}",
            b.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(platform.resends() > resends, "asked for a ticket again");
    let late_sent: Vec<_> = platform
        .sent()
        .into_iter()
        .filter(|message| message.tenant.as_deref() == Some(late))
        .collect();
    assert_eq!(late_sent.len(), 1, "once: {answers:?}");

    // The app uninstalled by tenant 0: its sends are refused on both gateways, nothing sent.
    let (status, _) = post(&a.base, &app_uninstalled(&tenants[0])).await;
    assert_eq!(status, 200);
    for gateway in [&a, &b] {
        gateway
            .admin_until("/admin/tenants/store", |body| {
                !body.contains(tenants[0].as_str())
            })
            .await;
        let (status, body) = send(gateway.api.as_deref().expect("api"), &tenants[0], "after").await;
        assert_eq!(status, 404, "{body}");
    }
    // A send that names no tenant is refused.
    let response = client()
        .post(format!("{}/send/store", a.api.as_deref().expect("api")))
        .bearer_auth(CALLER)
        .header("idempotency-key", "nameless")
        .json(&json!({"receive_id": "oc_x", "msg_type": "text", "content": {"text": "x"}}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(
        platform.sent().len(),
        181,
        "nothing more was sent: {}",
        a.stderr()
    );
    pusher.abort();
    // The tickets reached the routes as events, their values redacted: the gateway alone
    // uses them.
    let tickets: Vec<serde_json::Value> = lines(a_dir.path())
        .into_iter()
        .chain(lines(b_dir.path()))
        .filter(|line| line["event_type"] == "app_ticket")
        .collect();
    assert!(
        !tickets.is_empty(),
        "the app_ticket events are delivered too"
    );
    for line in &tickets {
        assert_eq!(line["payload"]["event"]["app_ticket"], "redacted", "{line}");
    }
}
