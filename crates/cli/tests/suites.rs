//! A WeCom suite end to end against a local ISV API (`shared/protocols/tenants.md` §1.3): two
//! gateways on one Redis; the ticket pushed to one is the one both fetch the suite token with;
//! a `create_auth` pushed to either is answered `success` at once and its code exchanged from the
//! queue, so that the corp's first message is taken within 2 s without a restart; `/send` as
//! each corp carries that corp's token and no other's, the suite and corp tokens fetched once
//! for both gateways; `change_auth` has the corp's authorisation read again, so that every
//! gateway sends as the agent it authorised now; `cancel_auth` stops the corp's callbacks and
//! sends.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use oncegate_core::SealedRequest;
use oncegate_send::local_wecom::LocalWecomApi;
use serde_json::json;
use support::suite::{SUITE_ID, corp_message, now, post, readme_source, suite_push, ticket};
use support::{Serve, client, file_route, lines, redis_store, wait_until};

const SUITE_SECRET: &str = "suite-secret-e2e";
const CALLER: &str = "caller-token-e2e-0123456789";

/// The README's suite source (tests/tenants.rs checks its registry commands), its secrets given
/// inline, pointed at the local ISV API, with an API caller and a file route.
fn config(dir: &Path, store: &str, domain: &str) -> String {
    let source = readme_source().replace(
        r#"{ env = "SUITE_SECRET" }"#,
        &format!("\"{SUITE_SECRET}\""),
    );
    assert!(
        source.contains(SUITE_ID) && source.contains(SUITE_SECRET),
        "{source}"
    );
    format!(
        "{}\n{source}domain = \"{domain}\"\n\n{}",
        support::with_api_caller(store, "isv", CALLER),
        file_route(dir, "")
    )
}

fn ticket_push(value: &str) -> SealedRequest {
    suite_push(&ticket(value, now()), &format!("t-{value}"))
}

/// `create_auth` as WeCom documents it (path 90642): SuiteId, AuthCode, InfoType, TimeStamp.
fn create_auth(code: &str) -> SealedRequest {
    let now = now();
    suite_push(
        &format!(
            "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><AuthCode><![CDATA[{code}]]></AuthCode><InfoType><![CDATA[create_auth]]></InfoType><TimeStamp>{now}</TimeStamp><State><![CDATA[]]></State></xml>"
        ),
        &format!("a-{code}"),
    )
}

fn cancel_auth(corp: &str) -> SealedRequest {
    let now = now();
    suite_push(
        &format!(
            "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><InfoType><![CDATA[cancel_auth]]></InfoType><TimeStamp>{now}</TimeStamp><AuthCorpId><![CDATA[{corp}]]></AuthCorpId></xml>"
        ),
        &format!("c-{corp}"),
    )
}

/// `change_auth` as WeCom documents it (path 90642): SuiteId, InfoType, TimeStamp, AuthCorpId.
fn change_auth(corp: &str) -> SealedRequest {
    let now = now();
    suite_push(
        &format!(
            "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><InfoType><![CDATA[change_auth]]></InfoType><TimeStamp>{now}</TimeStamp><AuthCorpId><![CDATA[{corp}]]></AuthCorpId><State><![CDATA[]]></State><ExtraInfo><![CDATA[]]></ExtraInfo></xml>"
        ),
        &format!("ch-{corp}"),
    )
}

async fn send(gateway: &Serve, path: &str, key: &str, to: &str) -> (u16, serde_json::Value) {
    let body = json!({"touser": to, "msgtype": "text", "text": {"content": key}, "wait_ms": 20000});
    let response = client()
        .post(format!(
            "{}/send/{path}",
            gateway.api.as_deref().expect("api")
        ))
        .bearer_auth(CALLER)
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// Posts `sealed` to the suite until it is answered `status`, `limit` at most.
async fn until_answered(
    gateway: &Serve,
    sealed: &SealedRequest,
    status: u16,
    limit: Duration,
) -> Duration {
    support::until_answered(gateway, "suite", sealed, status, limit).await
}

/// A local ISV API answering 45033 past `in_flight` calls at once, and two gateways on one
/// Redis (keys under `prefix`) serving its suite, the ticket pushed to the first.
async fn suite_on_two_gateways(
    prefix: &str,
    in_flight: usize,
) -> (LocalWecomApi, [(tempfile::TempDir, Serve); 2]) {
    let platform = LocalWecomApi::start("wwisvcorp", "unused-secret", in_flight)
        .await
        .expect("api");
    platform.serve_suite(SUITE_ID, SUITE_SECRET);
    let store = redis_store(prefix);
    let gateways = support::start_in_dirs(|dir| config(dir, &store, &platform.domain()));
    let (status, body) = post(&gateways[0].1, &ticket_push(&platform.issue_ticket())).await;
    assert_eq!((status, body.as_str()), (200, "success"));
    (platform, gateways)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corp_authorised_through_create_auth_is_served_and_sent_as_with_its_own_token() {
    // The ticket reaches A; B fetches the suite token with it.
    let (platform, [(a_dir, a), (b_dir, b)]) = suite_on_two_gateways("suites", 64).await;

    // Corp 0 authorises; its create_auth reaches B, answered `success` within WeCom's 1000 ms.
    let corps: Vec<String> = (0..50).map(|i| format!("wpCorp{i:02}Xy")).collect();
    let code = platform.authorise(&corps[0], 1_000_002);
    let authorised = Instant::now();
    let (status, body) = post(&b, &create_auth(&code)).await;
    let answered = authorised.elapsed();
    assert_eq!((status, body.as_str()), (200, "success"), "{}", b.stderr());
    assert!(answered < Duration::from_millis(1000), "{answered:?}");
    // Its first message is taken by A within 2 s of the authorisation, without a restart.
    let first = corp_message(&corps[0], "first");
    until_answered(&a, &first, 200, Duration::from_secs(2)).await;
    eprintln!(
        "create_auth answered in {answered:?}; the corp's first message taken {:?} after it",
        authorised.elapsed()
    );
    // The other 49 authorise, half through each gateway.
    for (i, corp) in corps.iter().enumerate().skip(1) {
        let code = platform.authorise(corp, 1_000_000 + i64::try_from(i).expect("i"));
        let gateway = if i % 2 == 0 { &a } else { &b };
        let (status, body) = post(gateway, &create_auth(&code)).await;
        assert_eq!((status, body.as_str()), (200, "success"));
    }
    for corp in &corps {
        until_answered(
            &b,
            &corp_message(corp, &format!("hello-{corp}")),
            200,
            Duration::from_secs(10),
        )
        .await;
    }

    // 200 concurrent sends across the 50 corps, on both gateways, by path and by header.
    let mut sends = Vec::new();
    for i in 0..200 {
        let corp = corps[i % 50].clone();
        let gateway = if i % 2 == 0 {
            a.api.clone()
        } else {
            b.api.clone()
        };
        sends.push(tokio::spawn(async move {
            let key = format!("k{i}-{corp}");
            let body = json!({"touser": format!("member{i}"), "msgtype": "text",
                              "text": {"content": key}, "wait_ms": 20000});
            let api = gateway.expect("api");
            let request = if i % 4 < 2 {
                client().post(format!("{api}/send/suite/{corp}"))
            } else {
                client()
                    .post(format!("{api}/send/suite"))
                    .header("oncegate-tenant", &corp)
            };
            let response = request
                .bearer_auth(CALLER)
                .header("idempotency-key", &key)
                .json(&body)
                .send()
                .await
                .expect("send");
            (response.status().as_u16(), key, corp)
        }));
    }
    let mut expected: HashMap<String, String> = HashMap::new();
    for sent in sends {
        let (status, key, corp) = sent.await.expect("task");
        assert_eq!(status, 200, "{key}: {}", a.stderr());
        expected.insert(key, corp);
    }
    // Each message went out once, with its own corp's token.
    let delivered = platform.sends();
    assert_eq!(delivered.len(), 200, "{delivered:?}");
    for (corp, body) in &delivered {
        let body: serde_json::Value = serde_json::from_str(body).expect("body");
        let key = body["text"]["content"].as_str().expect("content");
        assert_eq!(
            expected.get(key),
            Some(corp),
            "{key} went out with {corp}'s token"
        );
    }
    // One suite token and one token per corp, for both gateways.
    assert_eq!(platform.suite_calls("get_suite_token"), 1);
    assert_eq!(platform.suite_calls("get_permanent_code"), 50);
    assert_eq!(platform.suite_calls("get_corp_token"), 50);

    // A key is the tenant's own: the same key for another corp is another send.
    let (status, _) = send(&a, &format!("suite/{}", corps[1]), "shared-key", "u").await;
    assert_eq!(status, 200);
    let (status, _) = send(&a, &format!("suite/{}", corps[2]), "shared-key", "u").await;
    assert_eq!(status, 200);
    assert_eq!(platform.sends().len(), 202);

    // Sends that name no tenant, or one the suite does not serve, are refused clearly.
    let (status, body) = send(&a, "suite", "no-tenant", "u").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("name the one"), "{body}");
    let (status, body) = send(&a, "suite/wpNobody", "nobody", "u").await;
    assert_eq!(status, 404, "{body}");

    // Corp 5 changes what it authorised: the suite's agent in it is another. Until its
    // change_auth is taken, WeCom refuses a send as the old agent.
    platform.change_agent(&corps[5], 2_000_005);
    let path = format!("suite/{}", corps[5]);
    let (status, body) = send(&a, &path, "before-change", "u").await;
    assert_ne!(status, 200, "{body}");
    let (status, body) = post(&b, &change_auth(&corps[5])).await;
    assert_eq!((status, body.as_str()), (200, "success"));
    // B takes it and reads the corp's authorisation again; A, which holds a sender for the old
    // agent, sends as the new one within a second or two.
    let changed = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let (status, body) = send(&a, &path, &format!("after-change-{tries}"), "u").await;
        if status == 200 {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(3),
            "{status} {body}; {}",
            b.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "change_auth: sent as the new agent {:?} after it",
        changed.elapsed()
    );
    let (corp, body) = platform.sends().pop().expect("a send");
    let body: serde_json::Value = serde_json::from_str(&body).expect("body");
    assert_eq!(
        (corp.as_str(), body["agentid"].as_i64()),
        (corps[5].as_str(), Some(2_000_005))
    );
    assert_eq!(
        platform.suite_calls("get_auth_info"),
        1,
        "the change read once"
    );
    let sent_before_cancel = platform.sends().len();

    // Corp 3 cancels: its callbacks are refused and nothing is sent as it, on both gateways.
    let (status, body) = post(&a, &cancel_auth(&corps[3])).await;
    assert_eq!((status, body.as_str()), (200, "success"));
    // B may take it while the cancellation reaches it (within a second): then it is delivered,
    // as every admitted event is.
    let late = corp_message(&corps[3], "after-cancel");
    let mut taken_meanwhile = 0;
    let cancelled = Instant::now();
    loop {
        match post(&b, &late).await {
            (503, _) => break,
            (200, _) => taken_meanwhile = 1,
            (status, body) => panic!("{status} {body}"),
        }
        assert!(
            cancelled.elapsed() < Duration::from_secs(1),
            "{}",
            b.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = send(&b, &format!("suite/{}", corps[3]), "after-cancel", "u").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(platform.sends().len(), sent_before_cancel);

    // Every corp message admitted was delivered once, as its corp's.
    wait_until(
        "the corps' messages delivered",
        Duration::from_secs(15),
        || {
            lines(a_dir.path())
                .iter()
                .chain(lines(b_dir.path()).iter())
                .filter(|line| {
                    line["event_type"]
                        .as_str()
                        .is_some_and(|t| !t.starts_with("suite."))
                })
                .count()
                >= 51 + taken_meanwhile
        },
    )
    .await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in lines(a_dir.path()).iter().chain(lines(b_dir.path()).iter()) {
        if line["event_type"]
            .as_str()
            .is_some_and(|t| t.starts_with("suite."))
        {
            continue;
        }
        *seen.entry(line["event_id"].to_string()).or_default() += 1;
        assert!(
            corps.iter().any(|corp| line["app"] == corp.as_str()),
            "{line}"
        );
    }
    assert_eq!(seen.len(), 51 + taken_meanwhile, "{seen:?}");
    assert!(seen.values().all(|count| *count == 1), "{seen:?}");
}

/// A hundred corps of one suite burst at once on two gateways sharing a Redis, against a local
/// WeCom that allows each corp 2 calls in flight (45033 beyond) and whose quota for one corp is
/// spent by another system (45009): every other corp's messages go out once each; the spent corp's
/// sends are told to come back later, and after WeCom's first 45009 neither gateway calls for
/// it again until WeCom's minute is over; both answers are seen in `/admin/send-budgets` and
/// the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corp_whose_quota_is_spent_holds_back_no_other_corp_and_is_not_called_again() {
    let (platform, [(_a_dir, a), (_b_dir, b)]) = suite_on_two_gateways("suitelimits", 4096).await;
    platform.limit_corp_in_flight(2);
    let corps: Vec<String> = (0..100).map(|i| format!("wpLimit{i:03}Zz")).collect();
    for (i, corp) in corps.iter().enumerate() {
        let code = platform.authorise(corp, 1_000_000 + i64::try_from(i).expect("i"));
        let gateway = if i % 2 == 0 { &a } else { &b };
        let (status, body) = post(gateway, &create_auth(&code)).await;
        assert_eq!((status, body.as_str()), (200, "success"));
    }
    for corp in &corps {
        let hello = corp_message(corp, &format!("hello-{corp}"));
        until_answered(&b, &hello, 200, Duration::from_secs(10)).await;
    }
    let spent = corps[0].clone();
    platform.block(&spent);

    // Five sends per corp, all at once, half through each gateway.
    let mut sends = Vec::new();
    for (c, corp) in corps.iter().enumerate() {
        for m in 0..5 {
            let gateway = if (c + m) % 2 == 0 { &a } else { &b };
            let (api, corp) = (gateway.api.clone().expect("api"), corp.clone());
            sends.push(tokio::spawn(async move {
                let key = format!("burst-{corp}-{m}");
                let body = json!({"touser": format!("member{m}"), "msgtype": "text",
                                  "text": {"content": key}, "wait_ms": 15000});
                let response = client()
                    .post(format!("{api}/send/suite/{corp}"))
                    .bearer_auth(CALLER)
                    .header("idempotency-key", &key)
                    .json(&body)
                    .send()
                    .await
                    .expect("send");
                let after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                (response.status().as_u16(), after, key, corp)
            }));
        }
    }
    let mut expected: HashMap<String, String> = HashMap::new();
    for sent in sends {
        let (status, after, key, corp) = sent.await.expect("task");
        if corp == spent {
            assert_eq!(status, 429, "{key}");
            assert!(
                after.is_some_and(|s| s >= 30),
                "{key}: Retry-After {after:?}"
            );
        } else {
            assert_eq!(status, 200, "{key}: {}", a.stderr());
            expected.insert(key, corp);
        }
    }
    assert!(
        platform.busy() > 0,
        "WeCom's cap on calls in flight was met"
    );
    // Each of the other corps' messages went out once, with its own token.
    let delivered = platform.sends();
    assert_eq!(delivered.len(), 99 * 5);
    for (corp, body) in &delivered {
        let body: serde_json::Value = serde_json::from_str(body).expect("body");
        let key = body["text"]["content"].as_str().expect("content");
        assert_eq!(
            expected.remove(key).as_deref(),
            Some(corp.as_str()),
            "{key}"
        );
    }
    assert!(expected.is_empty(), "{expected:?}");

    // WeCom blocks the spent corp for a minute: neither gateway calls for it again meanwhile,
    // and another corp is sent at once.
    let refused = platform.blocked_calls(&spent);
    assert!((1..=5).contains(&refused), "{refused} calls answered 45009");
    for gateway in [&a, &b] {
        let (status, body) = send(gateway, &format!("suite/{spent}"), "after-block", "u").await;
        assert_eq!(status, 429, "{body}");
        let (status, body) = send(gateway, &format!("suite/{}", corps[7]), "x", "u").await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(
        platform.blocked_calls(&spent),
        refused,
        "no call while WeCom blocks"
    );

    // Both answers are in the gateways' views and metrics.
    let (mut budgets, mut capped) = (Vec::new(), 0);
    let mut lowered = 0.0;
    for gateway in [&a, &b] {
        let (status, body) = gateway.admin_get("/admin/send-budgets").await;
        assert_eq!(status, 200, "{body}");
        let view: serde_json::Value = serde_json::from_str(&body).expect("json");
        for budget in view["lowered"].as_array().expect("lowered") {
            budgets.push(budget["budget"].as_str().expect("budget").to_owned());
        }
        capped += view["capped"].as_array().expect("capped").len();
        lowered += support::metric_sum(
            &gateway.admin,
            "oncegate_send_budget_lowered_total",
            "limit=\"app\"",
        )
        .await;
    }
    assert!(
        budgets
            .iter()
            .all(|b| b.starts_with(&format!("{spent}/")) && b.ends_with(" app")),
        "the spent corp's budget, no other: {budgets:?}"
    );
    assert!(!budgets.is_empty(), "the spent corp's budget is lowered");
    assert!(capped > 0, "a sender capped after 45033");
    assert_eq!(lowered, refused as f64, "each 45009 counted");
}
