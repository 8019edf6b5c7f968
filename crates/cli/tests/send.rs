//! `/send/<source>` through the binary, against the local Feishu-like API that counts what it
//! really sent: concurrent repeats, a restart between a send and its retry, a timeout and its
//! retry, conflicts, and a burst to one chat within Feishu's 5 per second.

use crate::support;

use std::path::Path;
use std::time::Duration;

use oncegate_send::local::LocalFeishuApi;
use serde_json::{Value, json};
use support::{Serve, client};

const APP: &str = "cli_e2e_send";
const SECRET: &str = "e2e-send-secret";
const TOKEN: &str = "bot-token";

fn config(dir: &Path, domain: &str, send_timeout: &str) -> String {
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.join("store.redb").display()
    );
    config_on(&store, domain, send_timeout)
}

fn config_on(store: &str, domain: &str, send_timeout: &str) -> String {
    format!(
        r#"
[store]
{store}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"
send_timeout = "{send_timeout}"

[[api.caller]]
name = "bot"
token = "{TOKEN}"

[[source]]
name = "feishu"
platform = "feishu"
app_id = "{APP}"
verification_token = "t"
app_secret = "{SECRET}"
domain = "{domain}"
"#
    )
}

/// A send with `key` as its Idempotency-Key, taken as UTF-8 bytes (callers send non-ASCII keys).
async fn send(api: &str, key: &str, body: &Value) -> (u16, Value, bool) {
    let key = reqwest::header::HeaderValue::from_bytes(key.as_bytes()).expect("a header value");
    let response = client()
        .post(format!("{api}/send/feishu"))
        .bearer_auth(TOKEN)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (
        status,
        response.json().await.unwrap_or(Value::Null),
        replayed,
    )
}

fn hello(chat: &str) -> Value {
    json!({"receive_id": chat, "msg_type": "text", "content": {"text": "hello"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_repeats_and_a_restart_send_once() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), &platform.domain(), "5s");
    let mut gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    let sends: Vec<_> = (0..20)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { send(&api, "order-42", &hello("oc_1")).await })
        })
        .collect();
    let mut ids = std::collections::HashSet::new();
    for sent in sends {
        let (status, answer, _) = sent.await.expect("join");
        assert_eq!(status, 200, "{answer}");
        ids.insert(
            answer["data"]["message_id"]
                .as_str()
                .expect("id")
                .to_owned(),
        );
    }
    assert_eq!(ids.len(), 1, "every caller got the one message: {ids:?}");
    assert_eq!(platform.sent().len(), 1, "one platform message");
    // The gateway restarts; the caller retries: the stored answer, no second message.
    gateway.signal("TERM");
    gateway.wait_exit(Duration::from_secs(15));
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    let (status, answer, replayed) = send(&api, "order-42", &hello("oc_1")).await;
    assert_eq!((status, replayed), (200, true), "{answer}");
    assert!(ids.contains(answer["data"]["message_id"].as_str().expect("id")));
    assert_eq!(platform.sent().len(), 1);
    // The same key for another message: a conflict, nothing sent.
    let (status, answer, _) = send(&api, "order-42", &hello("oc_other")).await;
    assert_eq!(status, 409, "{answer}");
    // Named as `/keys` names it: a client need not read the words.
    assert_eq!(answer["state"], "conflict", "{answer}");
    assert_eq!(platform.sent().len(), 1);
    assert_eq!(
        platform.token_requests(),
        1,
        "the restarted gateway answered from the store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_then_a_retry_send_once() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &platform.domain(), "500ms"));
    let api = gateway.api.clone().expect("api");
    // The token first, so that only the send is slow.
    assert_eq!(send(&api, "warm-up", &hello("oc_w")).await.0, 200);
    platform.answer_after(Some(Duration::from_secs(2)));
    let (status, answer, _) = send(&api, "refund-7", &hello("oc_1")).await;
    assert_eq!(status, 504, "an unknown outcome: {answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("same idempotency key")),
        "{answer}"
    );
    platform.answer_after(None);
    let (status, answer, _) = send(&api, "refund-7", &hello("oc_1")).await;
    assert_eq!(status, 200, "{answer}");
    let to_chat: Vec<_> = platform
        .sent()
        .into_iter()
        .filter(|s| s.receive_id == "oc_1")
        .collect();
    assert_eq!(
        to_chat.len(),
        1,
        "the message went out once: the platform's uuid caught the retry"
    );
    assert_eq!(answer["data"]["message_id"], "om_local_2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_to_one_chat_stays_within_its_rate_and_loses_nothing() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    // 500 sends at 4.5 per second take 111 s: the sends may wait that long.
    let config = config(dir.path(), &platform.domain(), "5s")
        .replace("[api]\n", "[api]\nmax_wait = \"5m\"\n");
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    const BURST: usize = 500;
    let sends: Vec<_> = (0..BURST)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                let body = json!({"receive_id": "oc_busy", "msg_type": "text",
                                  "content": {"text": format!("n{i}")}, "wait_ms": 200000});
                send(&api, &format!("burst-{i}"), &body).await
            })
        })
        .collect();
    for sent in sends {
        let (status, answer, _) = sent.await.expect("join");
        assert_eq!(status, 200, "{answer}");
    }
    let sent = platform.sent();
    assert_eq!(sent.len(), BURST, "none lost, none twice");
    // One chat's sends start a fifth of a second after the previous answer: they arrive that
    // far apart however starved the machine, so the platform never refuses one.
    assert_eq!(
        platform.limited(),
        0,
        "{} refused of {BURST}",
        platform.limited()
    );
    let mut times: Vec<_> = sent.iter().map(|s| s.at).collect();
    times.sort();
    for (i, start) in times.iter().enumerate() {
        let inside = times[i..]
            .iter()
            .take_while(|t| t.duration_since(*start) < Duration::from_secs(1))
            .count();
        assert!(inside <= 5, "{inside} messages within one second");
    }
    let (_, metrics) = gateway.admin_get("/metrics").await;
    assert!(
        metrics.contains("oncegate_send_rate_waits_total"),
        "waits are counted"
    );
}

/// An `Idempotency-Key` in UTF-8 (an order title, a user's name) is a key like any other: the
/// send goes out once and its repeat gets the stored answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_utf8_idempotency_key_sends_once() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &platform.domain(), "5s"));
    let api = gateway.api.clone().expect("api");
    let mut answers = Vec::new();
    for _ in 0..2 {
        let (status, body, replayed) = send(&api, "退款-订单 42", &hello("oc_utf8")).await;
        assert_eq!(status, 200, "{body}");
        answers.push((body, replayed));
    }
    assert_eq!(
        answers[0].0, answers[1].0,
        "the repeat gets the stored answer"
    );
    assert!(!answers[0].1 && answers[1].1, "the second is the replay");
    let sent = platform
        .sent()
        .into_iter()
        .filter(|s| s.receive_id == "oc_utf8")
        .count();
    assert_eq!(sent, 1, "one message out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_are_refused_clearly() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &platform.domain(), "5s"));
    let api = gateway.api.clone().expect("api");
    let anonymous = client()
        .post(format!("{api}/send/feishu"))
        .header("idempotency-key", "k")
        .json(&hello("oc"))
        .send()
        .await
        .expect("sent");
    assert_eq!(anonymous.status().as_u16(), 401);
    let keyless = client()
        .post(format!("{api}/send/feishu"))
        .bearer_auth(TOKEN)
        .json(&hello("oc"))
        .send()
        .await
        .expect("sent");
    assert_eq!(keyless.status().as_u16(), 400);
    let (status, _, _) = send(&api, "k", &json!({"msg_type": "text"})).await;
    assert_eq!(status, 400, "no content");
    let nowhere = client()
        .post(format!("{api}/send/nowhere"))
        .bearer_auth(TOKEN)
        .header("idempotency-key", "k")
        .json(&hello("oc"))
        .send()
        .await
        .expect("sent");
    assert_eq!(nowhere.status().as_u16(), 404);
    // Ids that go into Feishu's URL are what they say (issue 36): a path to another API is a
    // 400 naming the field, and nothing reaches Feishu.
    let traversal = "../../../contact/v3/users/batch_get_id?user_id_type=open_id#";
    for (key, body, field) in [
        (
            "t1",
            json!({"reply_to": traversal, "msg_type": "text", "content": {"text": "x"}}),
            "reply_to",
        ),
        (
            "t2",
            json!({"update": "om_x/../../../contact/v3/users/ou_1", "content": {}}),
            "update",
        ),
        (
            "t3",
            json!({"receive_id_type": "open_id&x=1", "receive_id": "ou_1", "msg_type": "text", "content": {"text": "x"}}),
            "receive_id_type",
        ),
    ] {
        let (status, answer, _) = send(&api, key, &body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.to_string().contains(field), "{field}: {answer}");
    }
    assert_eq!(platform.token_requests(), 0, "nothing reached Feishu");
    // A permanent refusal is the key's answer: the repeat gets it without a second call.
    let (status, answer, replayed) = send(&api, "gone", &hello("oc_gone_1")).await;
    assert_eq!(
        (status, replayed, answer["code"].as_i64()),
        (422, false, Some(230002)),
        "{answer}"
    );
    let (status, _, replayed) = send(&api, "gone", &hello("oc_gone_1")).await;
    assert_eq!((status, replayed), (422, true));
    assert_eq!(platform.refused(), 1, "not retried");
    assert!(platform.sent().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_share_a_chats_rate() {
    let Ok(url) = std::env::var("ONCEGATE_TEST_REDIS_URL") else {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    };
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"send{}\"\npartitions = 4",
        fastrand::u32(..)
    );
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let config = config_on(&store, &platform.domain(), "5s");
    let first = Serve::start_with(a.path(), &config);
    let second = Serve::start_with(b.path(), &config);
    let apis = [
        first.api.clone().expect("api"),
        second.api.clone().expect("api"),
    ];
    const BURST: usize = 30;
    let sends: Vec<_> = (0..BURST)
        .map(|i| {
            let api = apis[i % 2].clone();
            tokio::spawn(async move {
                let body = json!({"receive_id": "oc_shared", "msg_type": "text",
                                  "content": {"text": format!("n{i}")}, "wait_ms": 30000});
                send(&api, &format!("shared-{i}"), &body).await
            })
        })
        .collect();
    for sent in sends {
        let (status, answer, _) = sent.await.expect("join");
        assert_eq!(status, 200, "{answer}");
    }
    assert_eq!(platform.sent().len(), BURST);
    assert_eq!(
        platform.limited(),
        0,
        "two gateways, one budget: the platform never refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wecom_sends_to_one_member_stay_under_the_silent_drop() {
    use oncegate_send::local_wecom::LocalWecomApi;
    let platform = LocalWecomApi::start("ww_e2e", "wecom-secret", 8)
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        r#"
[store]
backend = "memory"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[[api.caller]]
name = "bot"
token = "{TOKEN}"
[[source]]
name = "corp"
platform = "wecom"
corp_id = "ww_e2e"
agent_id = "1000002"
token = "t"
encoding_aes_key = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C"
secret = "wecom-secret"
domain = "{domain}"
"#,
        domain = platform.domain()
    );
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    // WeCom drops, without an error, what passes 30 per minute to one member: the gateway's
    // budget (burst 5, then one every 2.5 s: 28 in any minute, see send/tests/limits.rs) keeps
    // every message under it.
    const SENDS: usize = 9;
    let sends: Vec<_> = (0..SENDS)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                let body = json!({"touser": "zhangsan", "msgtype": "text",
                                  "text": {"content": format!("n{i}")}, "wait_ms": 30000});
                let response = client()
                    .post(format!("{api}/send/corp"))
                    .bearer_auth(TOKEN)
                    .header("idempotency-key", format!("w{i}"))
                    .json(&body)
                    .send()
                    .await
                    .expect("send");
                (
                    response.status().as_u16(),
                    response.json::<Value>().await.unwrap_or(Value::Null),
                )
            })
        })
        .collect();
    for sent in sends {
        let (status, answer) = sent.await.expect("join");
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["errcode"], 0);
    }
    assert_eq!(
        platform.delivered_to("zhangsan"),
        SENDS,
        "every one delivered"
    );
    assert_eq!(platform.dropped(), 0, "none silently dropped");
    let (status, _) = {
        let response = client()
            .post(format!("{api}/send/corp"))
            .bearer_auth(TOKEN)
            .header("idempotency-key", "bad")
            .json(&json!({"msgtype": "text"}))
            .send()
            .await
            .expect("send");
        (response.status().as_u16(), ())
    };
    assert_eq!(status, 400, "a WeCom send names its receiver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_goes_before_waiting_notifications_and_the_waiting_are_bounded() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), &platform.domain(), "5s").replace(
        "send_timeout = \"5s\"",
        "send_timeout = \"5s\"\nmax_waiting_sends = 14",
    );
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    let notify = |i: usize| {
        let api = api.clone();
        tokio::spawn(async move {
            let body = json!({"receive_id": "oc_prio", "msg_type": "text",
                              "content": {"text": format!("notice {i}")}, "wait_ms": 30000});
            send(&api, &format!("notice-{i}"), &body).await
        })
    };
    let notices: Vec<_> = (0..12).map(notify).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A reply in the same chat, while most notices still wait for the chat's budget.
    let body = json!({"reply_to": "om_question", "receive_id": "oc_prio", "msg_type": "text",
                      "content": {"text": "the answer"}, "wait_ms": 30000});
    let reply = {
        let api = api.clone();
        tokio::spawn(async move { send(&api, "reply-1", &body).await })
    };
    // Past the bound of waiting sends: told at once, nothing sent.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let crowded: Vec<_> = (100..106).map(notify).collect();
    let mut refused = 0;
    for sent in crowded {
        let (status, answer, _) = sent.await.expect("join");
        if status == 503 {
            assert!(
                answer["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("max_waiting_sends")),
                "{answer}"
            );
            refused += 1;
        }
    }
    assert!(refused >= 1, "the bound of 14 waiting sends answers 503");
    assert_eq!(reply.await.expect("join").0, 200);
    for sent in notices {
        assert_eq!(sent.await.expect("join").0, 200);
    }
    let order: Vec<String> = platform.sent().into_iter().map(|s| s.receive_id).collect();
    let position = order
        .iter()
        .position(|to| to == "om_question")
        .expect("the reply was sent");
    // The chat's sends go one at a time: the reply right after the one or two notices that
    // went before it arrived (12 with the lane removed).
    assert!(
        position <= 3,
        "the reply went before the waiting notices: position {position} of {order:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_of_one_card_go_one_at_a_time_and_the_latest_wins() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &platform.domain(), "5s"));
    let api = gateway.api.clone().expect("api");
    // A streaming card: 25 edits of one message, 10 ms apart, each its own key.
    let edits: Vec<_> = (0..25)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 10)).await;
                let body = json!({"update": "om_card", "content": {"elements": [{"tag": "markdown", "content": format!("v{i}")}]}, "wait_ms": 30000});
                send(&api, &format!("edit-{i}"), &body).await
            })
        })
        .collect();
    let mut superseded = 0;
    for edit in edits {
        let (status, answer, _) = edit.await.expect("join");
        assert_eq!(status, 200, "{answer}");
        if answer["superseded"] == true {
            superseded += 1;
        }
    }
    let applied = platform.updates("om_card");
    assert_eq!(platform.most_updates_at_once(), 1, "one at a time");
    assert!(
        applied.last().is_some_and(|last| last.contains("v24")),
        "the latest wins: {applied:?}"
    );
    assert!(
        superseded > 0 && applied.len() + superseded == 25,
        "{} applied, {superseded} superseded",
        applied.len()
    );
    let versions: Vec<u32> = applied
        .iter()
        .filter_map(|c| c.split("\"v").nth(1)?.split('"').next()?.parse().ok())
        .collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "never an older edit after a newer one: {versions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_own_budget_gets_429_at_once() {
    let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("api");
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), &platform.domain(), "5s").replace(
        "token = \"bot-token\"\n",
        "token = \"bot-token\"\nsends_per_second = 2\n",
    );
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    let mut statuses = Vec::new();
    for i in 0..4 {
        let response = client()
            .post(format!("{api}/send/feishu"))
            .bearer_auth(TOKEN)
            .header("idempotency-key", format!("budget-{i}"))
            .json(&hello(&format!("oc_{i}")))
            .send()
            .await
            .expect("send");
        let retry_after = response.headers().get("retry-after").is_some();
        statuses.push((response.status().as_u16(), retry_after));
    }
    assert_eq!(statuses[..2], [(200, false), (200, false)], "{statuses:?}");
    assert_eq!(statuses[2], (429, true), "{statuses:?}");
    assert_eq!(
        platform.sent().len(),
        statuses.iter().filter(|(s, _)| *s == 200).count()
    );
}

/// `oncegate simulate --platform-api` as a new user runs it: the platform's API at the
/// source's domain, for Feishu and for WeCom; a send and its repeat reach it once, printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_plays_the_platform_api_for_send() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
    };
    let feishu = free();
    let wecom = free();
    let dir = tempfile::tempdir().expect("dir");
    let config = format!(
        r#"
[store]
backend = "memory"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:0"
[[api.caller]]
name = "bot"
token = "{TOKEN}"
[[source]]
name = "feishu"
platform = "feishu"
app_id = "{APP}"
verification_token = "t"
app_secret = "{SECRET}"
domain = "http://{feishu}"
[[source]]
name = "corp"
platform = "wecom"
corp_id = "ww_sim"
agent_id = "1000002"
token = "t"
encoding_aes_key = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C"
secret = "wecom-secret"
domain = "http://{wecom}"
"#
    );
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    // The README's example body, as written.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let example = readme
        .split("**Try it without an account.**")
        .nth(1)
        .and_then(|rest| rest.split("-d '").nth(1))
        .and_then(|rest| rest.split('\'').next())
        .expect("the README's simulate example");
    let example: Value = serde_json::from_str(example).expect("the example's body is JSON");
    for (source, body, printed, text) in [
        ("feishu", example, "sent to oc_demo", "hi"),
        (
            "corp",
            json!({"touser": "zhangsan", "msgtype": "text", "text": {"content": "hello"}}),
            "sent: {",
            "hello",
        ),
    ] {
        let mut simulate = support::oncegate()
            .args(["simulate", "--platform-api", "--source", source, "--config"])
            .arg(dir.path().join("oncegate.toml"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("simulate");
        let mut lines = BufReader::new(simulate.stdout.take().expect("stdout")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(first.starts_with("local "), "{first}");
        for attempt in 0..2 {
            let response = client()
                .post(format!("{api}/send/{source}"))
                .bearer_auth(TOKEN)
                .header("idempotency-key", format!("{source}-once"))
                .json(&body)
                .send()
                .await
                .expect("send");
            let status = response.status().as_u16();
            let replayed = response.headers().contains_key("idempotent-replayed");
            assert_eq!((status, replayed), (200, attempt == 1), "{source}");
        }
        // Give simulate a print round, then stop it as Ctrl-C would.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pid = simulate.id().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(killed.success());
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = simulate.wait().expect("wait");
        assert!(status.success(), "{status} {rest:?}");
        let sent: Vec<_> = rest.iter().filter(|l| l.starts_with(printed)).collect();
        assert_eq!(sent.len(), 1, "sent once: {rest:?}");
        assert!(sent[0].contains(text), "{sent:?}");
        assert!(
            rest.last().is_some_and(|l| l.starts_with("1 message sent")),
            "{rest:?}"
        );
    }
}
