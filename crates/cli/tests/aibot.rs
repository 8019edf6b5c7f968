//! A WeCom AI bot's long connection through the binary: a local AI-bot server pushes messages to
//! `oncegate serve`, which admits them into its store and delivers each once in chat order —
//! across repeats and a dropped connection; on Redis only the leader of two gateways ever
//! subscribes, a killed leader is replaced within its lease, and a frozen one that wakes up
//! taken over stands by instead of taking the bot back.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use oncegate_wecom_ws::frame;
use oncegate_wecom_ws::local::{self, LocalAiBot};
use support::{Serve, file_route, lines, redis_store, wait_until};

const BOT: &str = "aibE2EBOTID0000000000000000000000";
const SECRET: &str = "e2e-bot-secret";

fn config(dir: &Path, store: &str, url: &str) -> String {
    format!(
        r#"
[store]
{store}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[lease]
duration = "3s"
renew_every = "1s"

[[source]]
name = "bot"
platform = "wecom-aibot"
bot_id = "{BOT}"
secret = "{SECRET}"
domain = "{url}"

{route}
"#,
        route = file_route(dir, "")
    )
}

/// Delivered envelopes of the sinks in `dirs`: (chat, msgid) in delivery order.
fn delivered(dirs: &[&Path]) -> Vec<(String, String)> {
    dirs.iter()
        .flat_map(|dir| lines(dir))
        .map(|line| {
            (
                line["order_key"].as_str().unwrap_or_default().to_owned(),
                line["event_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn message(i: usize) -> serde_json::Value {
    let chat = format!("wrchat{}", i % 4);
    local::text_message(BOT, &format!("M{i:04}"), Some(&chat), "zhangsan", "hi")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_with_repeats_and_a_dropped_connection_are_delivered_once_in_chat_order() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &store, server.url()));
    assert!(
        server.wait_for_subscribes(1, Duration::from_secs(15)).await,
        "{}",
        gateway.stderr()
    );
    let mut repeats = 0;
    for i in 0..200 {
        server.push(frame::MESSAGE, &message(i));
        if i % 7 == 3 {
            // The same message again under a new req_id, as WeCom was seen to send while a
            // reply was pending; some right away, some long after.
            server.push(frame::MESSAGE, &message(i / 2));
            repeats += 1;
        }
        if i == 120 {
            server.drop_connection();
        }
    }
    wait_until("every message delivered", Duration::from_secs(30), || {
        delivered(&[dir.path()]).len() >= 200
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = delivered(&[dir.path()]);
    assert_eq!(seen.len(), 200, "each once: {}", gateway.stderr());
    let mut by_chat: HashMap<String, Vec<String>> = HashMap::new();
    for (chat, id) in seen {
        by_chat.entry(chat).or_default().push(id);
    }
    for (chat, ids) in &by_chat {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, &sorted, "chat {chat} in order");
        assert_eq!(ids.len(), 50, "chat {chat}");
    }
    assert_eq!(server.subscribes().len(), 2, "dialled again after the drop");
    let (_, stats) = gateway.admin_get("/admin/stats").await;
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats");
    assert_eq!(
        stats["gateway"]["duplicates"].as_u64(),
        Some(repeats),
        "{stats}"
    );
    assert_eq!(stats["long_connections"][0]["open"], 1, "{stats}");
    // A handler gets the message as the HTTP callback mode's JSON: the body, not the frame.
    let first = &lines(dir.path())[0];
    assert_eq!(first["payload"]["aibotid"], BOT, "{first}");
    assert_eq!(first["payload"]["text"]["content"], "hi", "{first}");
    let (ready, answer) = gateway.admin_get("/readyz").await;
    assert_eq!(ready, 200);
    assert!(
        !answer.contains("store.spool"),
        "the embedded store admits on this machine: {answer}"
    );
    // An operator finds a message by the id and sender they have, as inspect does.
    let (status, found) = gateway
        .admin_get(&format!(
            "/admin/record?platform=wecom&app={BOT}&id=M0005&from=zhangsan"
        ))
        .await;
    assert_eq!(status, 200, "{found}");
    let found: serde_json::Value = serde_json::from_str(&found).expect("json");
    assert_eq!(found["record"]["state"], "completed", "{found}");
    let (status, _) = gateway
        .admin_get(&format!(
            "/admin/record?platform=wecom&app={BOT}&id=M0005&from=lisi"
        ))
        .await;
    assert_eq!(status, 404, "another sender's M0005 was never sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_subscribes_and_a_killed_one_is_replaced_within_its_lease() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let store = redis_store("aibot");
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut first = Serve::start_with(a.path(), &config(a.path(), &store, server.url()));
    assert!(server.wait_for_subscribes(1, Duration::from_secs(15)).await);
    let second = Serve::start_with(b.path(), &config(b.path(), &store, server.url()));
    second
        .admin_until("/admin/stats", |body| body.contains("\"standby\""))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(server.subscribes().len(), 1, "only the leader subscribes");
    assert_eq!(server.takeovers(), 0);
    let (ready, answer) = second.admin_get("/readyz").await;
    assert_eq!(ready, 200, "a standby is ready");
    // On Redis without a spool, what an AI bot can lose is said (never silent).
    assert!(
        answer.contains("store.spool") && answer.contains("at_risk"),
        "{answer}"
    );
    for i in 0..20 {
        server.push(frame::MESSAGE, &message(i));
    }
    // Admitted by the leader; delivered by whichever gateway owns each chat's partition.
    wait_until("delivered", Duration::from_secs(15), || {
        delivered(&[a.path(), b.path()]).len() == 20
    })
    .await;
    first.child.kill().expect("kill -9");
    let killed = std::time::Instant::now();
    let _ = first.child.wait();
    assert!(
        server.wait_for_subscribes(2, Duration::from_secs(10)).await,
        "replaced: {}",
        second.stderr()
    );
    // The lease is 3 s; the standby asks every 2 s.
    assert!(
        killed.elapsed() < Duration::from_secs(8),
        "{:?}",
        killed.elapsed()
    );
    for i in 20..40 {
        server.push(frame::MESSAGE, &message(i));
    }
    wait_until(
        "delivered after the takeover",
        Duration::from_secs(15),
        || delivered(&[a.path(), b.path()]).len() == 40,
    )
    .await;
    assert_eq!(server.takeovers(), 0, "nobody was kicked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_that_wakes_up_taken_over_stands_by_without_ping_pong() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let store = redis_store("aibotf");
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let first = Serve::start_with(a.path(), &config(a.path(), &store, server.url()));
    assert!(server.wait_for_subscribes(1, Duration::from_secs(15)).await);
    let second = Serve::start_with(b.path(), &config(b.path(), &store, server.url()));
    second
        .admin_until("/admin/stats", |body| body.contains("\"standby\""))
        .await;
    first.signal("STOP");
    // The frozen leader's lease runs out; the standby subscribes and WeCom tells the frozen
    // connection it was taken over.
    assert!(server.wait_for_subscribes(2, Duration::from_secs(15)).await);
    assert_eq!(server.takeovers(), 1);
    first.signal("CONT");
    first
        .admin_until("/admin/stats", |body| body.contains("\"standby\""))
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        (server.subscribes().len(), server.takeovers()),
        (2, 1),
        "the woken leader took nothing back: {}",
        first.stderr()
    );
    for i in 0..10 {
        server.push(frame::MESSAGE, &message(i));
    }
    wait_until("delivered", Duration::from_secs(15), || {
        delivered(&[a.path(), b.path()]).len() == 10
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut seen: Vec<String> = delivered(&[a.path(), b.path()])
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 10, "each once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_taken_over_twice_from_elsewhere_stops_and_says_why() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(
        dir.path(),
        &config(dir.path(), "backend = \"memory\"", server.url()),
    );
    assert!(server.wait_for_subscribes(1, Duration::from_secs(15)).await);
    // A client outside the gateway subscribes as the bot: the gateway holds the lease, so it
    // dials again once; the second time it stops instead of kicking back for ever.
    server.take_over_from_elsewhere();
    assert!(server.wait_for_subscribes(2, Duration::from_secs(10)).await);
    server.take_over_from_elsewhere();
    let stats = gateway
        .admin_until("/admin/stats", |body| body.contains("taken over twice"))
        .await;
    assert!(!stats.contains(SECRET), "{stats}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.subscribes().len(), 2, "no third subscribe");
    let (ready, why) = gateway.admin_get("/readyz").await;
    assert_eq!(ready, 503);
    assert!(why.contains("outside"), "{why}");
}

/// A takeover, then the connection lost and dialled again (the server restarted: a local test
/// server between two `simulate` runs), then a takeover of that new session: not a fight, the
/// gateway subscribes again. A takeover of the very connection dialled after a takeover is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_of_a_later_session_is_not_counted_with_the_last_one() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(
        dir.path(),
        &config(dir.path(), "backend = \"memory\"", server.url()),
    );
    assert!(server.wait_for_subscribes(1, Duration::from_secs(15)).await);
    server.take_over_from_elsewhere();
    assert!(server.wait_for_subscribes(2, Duration::from_secs(10)).await);
    server.drop_connection();
    assert!(
        server.wait_for_subscribes(3, Duration::from_secs(15)).await,
        "dialled again after the loss: {}",
        gateway.stderr()
    );
    server.take_over_from_elsewhere();
    assert!(
        server.wait_for_subscribes(4, Duration::from_secs(10)).await,
        "a takeover of a later session is dialled again: {}",
        gateway.stderr()
    );
    server.take_over_from_elsewhere();
    gateway
        .admin_until("/admin/stats", |body| body.contains("taken over twice"))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.subscribes().len(), 4, "no fifth subscribe");
}

/// `/readyz` tells a probe without the admin token what fails, not why: WeCom's refusal of a
/// wrong secret, the store's and Redis's details are the token holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_why_only_to_the_admin_tokens_holder() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), "backend = \"memory\"", server.url())
        .replace(SECRET, "a-wrong-secret")
        .replace(
            "admin_listen = \"127.0.0.1:0\"",
            "admin_listen = \"127.0.0.1:0\"\nadmin_token = \"ready-t0ken\"",
        );
    let gateway = Serve::start_with(dir.path(), &config);
    // Refused three times: the connection stops for good, and readiness fails saying why.
    let privy = || async {
        support::client()
            .get(format!("{}/readyz", gateway.admin))
            .bearer_auth("ready-t0ken")
            .send()
            .await
            .expect("readyz")
            .text()
            .await
            .expect("body")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let body = privy().await;
        if body.contains("600017") {
            assert!(!body.contains("a-wrong-secret"), "{body}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, anonymous) = gateway.admin_get("/readyz").await;
    assert_eq!(status, 503, "{anonymous}");
    assert!(anonymous.contains("long_connection bot"), "{anonymous}");
    assert!(
        !anonymous.contains("600017") && !anonymous.contains("bot_id"),
        "no refusal text without the token: {anonymous}"
    );
    assert!(anonymous.contains("admin token"), "{anonymous}");
}

/// The README's AI-bot source, with `oncegate simulate` playing WeCom as the README says, twice
/// in a row against one gateway: each run waits until the gateway admitted and delivered all its
/// messages (it pushes faster than they are read), through a takeover from elsewhere halfway —
/// and the second run's takeover, on another session of the server, is not taken for a fight
/// over the bot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_under_simulate_twice_delivers_each_message_once() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let block = readme
        .split_once("### WeCom AI bots' long connection")
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the README's AI-bot example")
        .0;
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("free port")
            .port()
    };
    let (port, admin_port) = (free_port(), free_port());
    let source = block
        .replace("{ env = \"ASSISTANT_BOT_SECRET\" }", "\"readme-secret\"")
        .replace(
            "# domain = \"wss://openws.work.weixin.qq.com\"",
            &format!("domain = \"ws://127.0.0.1:{port}\""),
        );
    assert!(source.contains("domain = \"ws://127.0.0.1:"), "{source}");
    let dir = tempfile::tempdir().expect("dir");
    // simulate reads the admin address from the configuration: a fixed one, so that it can
    // count what the gateway admitted and delivered.
    let config = format!(
        "[store]\nbackend = \"memory\"\n\n[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n\n{source}\n{}",
        file_route(dir.path(), "")
    );
    std::fs::write(dir.path().join("oncegate.toml"), &config).expect("config");
    let events = 2000;
    let simulate = || {
        support::oncegate()
            .args(["simulate", "--quiet", "--duplicates", "0.3", "--events"])
            .arg(events.to_string())
            .arg("--config")
            .arg(dir.path().join("oncegate.toml"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("simulate")
    };
    let first = simulate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gateway = Serve::start_with(dir.path(), &config);
    for (run, started) in [(1, Some(first)), (2, None)] {
        let simulate = started.unwrap_or_else(simulate);
        let output = tokio::task::spawn_blocking(move || simulate.wait_with_output())
            .await
            .expect("join")
            .expect("simulate ran");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "run {run}: {text} {} {}",
            String::from_utf8_lossy(&output.stderr),
            gateway.stderr()
        );
        assert!(text.contains(&format!("{events} new")), "{text}");
        assert!(text.contains("subscribes         2"), "{text}");
        assert!(
            text.contains(&format!("admitted           {events}\n")),
            "run {run}: simulate waited for every admission: {text}"
        );
        assert!(
            text.contains(&format!("delivered          {events}\n")),
            "run {run}: {text}"
        );
        let seen = delivered(&[dir.path()]);
        let mut ids: Vec<&String> = seen.iter().map(|(_, id)| id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(
            (seen.len(), ids.len()),
            (events * run, events * run),
            "each once"
        );
    }
}

/// A handler that answers a message with 20 server-sent events, 40 ms apart, and a user
/// entering the chat with a welcome message; it counts the calls it got.
async fn streaming_handler(calls: Arc<AtomicUsize>) -> String {
    use axum::body::Body;
    use axum::response::Response;
    let app = axum::Router::new().route(
        "/bot",
        axum::routing::post(move |body: axum::body::Bytes| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if envelope["event_type"] == "event.enter_chat" {
                    let welcome = r#"{"msgtype":"text","text":{"content":"welcome"}}"#;
                    return Response::new(Body::from(welcome));
                }
                let pieces = futures_util::stream::unfold(0, |i| async move {
                    if i == 20 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    let piece = format!("data: p{i:02} \n\n");
                    Some((Ok::<_, std::convert::Infallible>(piece), i + 1))
                });
                let mut response = Response::new(Body::from_stream(pieces));
                response.headers_mut().insert(
                    "content-type",
                    axum::http::HeaderValue::from_static("text/event-stream"),
                );
                response
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

/// The frames the bot sent for `req_id`, by command.
fn sent(server: &LocalAiBot, req_id: &str) -> Vec<serde_json::Value> {
    server
        .received()
        .into_iter()
        .filter(|frame| frame["headers"]["req_id"] == req_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reply_arrives_in_order_under_one_id_and_a_repeat_starts_nothing() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = streaming_handler(calls.clone()).await;
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    // The README's replying route, pointed at the handler.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let reply_route = readme
        .split_once("**Replies, once, over the socket.**")
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the README's replying route")
        .0
        .replace("http://127.0.0.1:9000/bot", &handler);
    assert!(reply_route.contains(&handler), "{reply_route}");
    let config = config(dir.path(), &store, server.url())
        .replace("[[route]]", &format!("{reply_route}\n[[route]]"));
    let gateway = Serve::start_with(dir.path(), &config);
    assert!(
        server.wait_for_subscribes(1, Duration::from_secs(15)).await,
        "{}",
        gateway.stderr()
    );
    let body = message(1);
    let req_id = server.push(frame::MESSAGE, &body);
    // The same message again while its reply streams, under another req_id: nothing starts.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let repeat = server.push(frame::MESSAGE, &body);
    wait_until("the stream finished", Duration::from_secs(20), || {
        sent(&server, &req_id)
            .last()
            .is_some_and(|f| f["body"]["stream"]["finish"] == true)
    })
    .await;
    let frames = sent(&server, &req_id);
    let whole: String = (0..20).map(|i| format!("p{i:02} ")).collect();
    let ids: std::collections::HashSet<String> = frames
        .iter()
        .map(|f| f["body"]["stream"]["id"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(ids.len(), 1, "one stream.id: {frames:?}");
    assert!(frames.iter().all(|f| f["cmd"] == "aibot_respond_msg"));
    let contents: Vec<&str> = frames
        .iter()
        .map(|f| f["body"]["stream"]["content"].as_str().unwrap_or(""))
        .collect();
    assert!(
        contents.windows(2).all(|w| w[1].starts_with(w[0])),
        "each frame carries all before it, in order: {contents:?}"
    );
    assert_eq!(
        contents.last(),
        Some(&whole.as_str()),
        "finished with all 20"
    );
    assert!(
        frames.len() >= 11,
        "streamed as it came, not at the end: {}",
        frames.len()
    );
    assert_eq!(
        frames
            .iter()
            .filter(|f| f["body"]["stream"]["finish"] == true)
            .count(),
        1
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(
        sent(&server, &repeat).is_empty(),
        "the repeat answered nothing"
    );
    // A user entering the chat gets the handler's welcome message as it wrote it.
    let enter = server.push(frame::EVENT, &local::enter_chat(BOT, "E-enter", "lisi"));
    wait_until("the welcome", Duration::from_secs(10), || {
        !sent(&server, &enter).is_empty()
    })
    .await;
    let welcome = &sent(&server, &enter)[0];
    assert_eq!(welcome["cmd"], "aibot_respond_welcome_msg");
    assert_eq!(welcome["body"]["text"]["content"], "welcome");
    let (_, metrics) = gateway.admin_get("/metrics").await;
    assert!(
        metrics.lines().any(|l| l.starts_with("oncegate_ws_replies_total{")
            && l.contains("result=\"repeat\"")),
        "{metrics}"
    );
}

/// A reply WeCom refused never reached the user: its event is left retryable, not completed,
/// so that a repeat of the message runs the handler again and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_never_reached_wecom_leaves_its_message_retryable() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = streaming_handler(calls.clone()).await;
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let route = format!(
        "[[route]]\nevents = [\"message.*\"]\nsink = \"http\"\nurl = \"{handler}\"\nreply = true\ntimeout = \"30s\"\n"
    );
    let config = config(dir.path(), &store, server.url())
        .replace("[[route]]", &format!("{route}\n[[route]]"));
    let gateway = Serve::start_with(dir.path(), &config);
    assert!(
        server.wait_for_subscribes(1, Duration::from_secs(15)).await,
        "{}",
        gateway.stderr()
    );
    server.refuse_commands(Some(846_605));
    let body = message(7);
    let first = server.push(frame::MESSAGE, &body);
    wait_until("the refused reply", Duration::from_secs(20), || {
        !sent(&server, &first).is_empty() && calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // The handler's run ends (its stream refused at the first frame) and its event is settled.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.refuse_commands(None);
    let repeat = server.push(frame::MESSAGE, &body);
    wait_until("the repeat answered", Duration::from_secs(20), || {
        sent(&server, &repeat)
            .last()
            .is_some_and(|f| f["body"]["stream"]["finish"] == true)
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "{}", gateway.stderr());
    let (_, metrics) = gateway.admin_get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("oncegate_ws_replies_total{")
                && l.contains("result=\"reply_not_sent\"")),
        "{metrics}"
    );
}

const CALLER_TOKEN: &str = "e2e-caller-token";

/// `POST /send/bot` with `key`: the status, the answer and whether it was a stored one.
async fn send(
    gateway: &Serve,
    key: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value, bool) {
    let response = support::client()
        .post(format!("{}/send/bot", gateway.api.clone().expect("api")))
        .bearer_auth(CALLER_TOKEN)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (status, response.json().await.unwrap_or_default(), replayed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proactive_send_goes_out_once_over_the_leaders_connection() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let store = redis_store("aibots");
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let caller = format!(
        "[api]\nlisten = \"127.0.0.1:0\"\n\n[[api.caller]]\nname = \"ops\"\ntoken = \"{CALLER_TOKEN}\"\n"
    );
    let with_caller = |dir: &Path| format!("{caller}{}", config(dir, &store, server.url()));
    let leader = Serve::start_with(a.path(), &with_caller(a.path()));
    assert!(server.wait_for_subscribes(1, Duration::from_secs(15)).await);
    let standby = Serve::start_with(b.path(), &with_caller(b.path()));
    standby
        .admin_until("/admin/stats", |body| body.contains("\"standby\""))
        .await;
    let body = serde_json::json!({
        "chatid": "wrchat1",
        "chat_type": 2,
        "msgtype": "markdown",
        "markdown": {"content": "build **green**"},
    });
    let (status, answer, replayed) = send(&leader, "deploy-42", &body).await;
    assert_eq!(
        (status, replayed),
        (200, false),
        "{answer} {}",
        leader.stderr()
    );
    // The caller retries, through the other gateway too: a stored answer, nothing sent again.
    let (status, _, replayed) = send(&leader, "deploy-42", &body).await;
    assert_eq!((status, replayed), (200, true));
    let (status, _, replayed) = send(&standby, "deploy-42", &body).await;
    assert_eq!((status, replayed), (200, true));
    let sends: Vec<serde_json::Value> = server
        .received()
        .into_iter()
        .filter(|frame| frame["cmd"] == "aibot_send_msg")
        .collect();
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert_eq!(sends[0]["body"], body);
    // A new send reaching the standby is refused (after its short wait), nothing sent: 503
    // with Retry-After; the key stays free.
    let body_wait = {
        let mut quick = body.clone();
        quick["wait_ms"] = serde_json::json!(1_500);
        quick
    };
    let (status, answer, _) = send(&standby, "deploy-43", &body_wait).await;
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("holds no subscribed connection")),
        "{answer}"
    );
    let (status, _, replayed) = send(&leader, "deploy-43", &body).await;
    assert_eq!((status, replayed), (200, false));
    // Bad bodies get a precise 400.
    let (status, answer, _) =
        send(&leader, "bad", &serde_json::json!({"msgtype": "markdown"})).await;
    assert_eq!(status, 400);
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("chatid")),
        "{answer}"
    );
}

/// `aibot_send_msg` has no key WeCom would drop a second copy by: a send whose answer never
/// came is settled as unknown, and retries with its key send nothing and say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_of_unknown_outcome_is_never_sent_again_by_its_key() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let caller = format!(
        "[api]\nlisten = \"127.0.0.1:0\"\n\n[[api.caller]]\nname = \"ops\"\ntoken = \"{CALLER_TOKEN}\"\n"
    );
    let gateway = Serve::start_with(
        dir.path(),
        &format!("{caller}{}", config(dir.path(), &store, server.url())),
    );
    assert!(server.wait_for_subscribes(1, Duration::from_secs(15)).await);
    server.mute_commands(true);
    let body = serde_json::json!({
        "chatid": "wrchat1",
        "chat_type": 2,
        "msgtype": "markdown",
        "markdown": {"content": "deploy **done**"},
    });
    let (status, answer, replayed) = send(&gateway, "unknown-1", &body).await;
    assert_eq!((status, replayed), (504, false), "{answer}");
    assert_eq!(answer["outcome"], "unknown", "{answer}");
    server.mute_commands(false);
    for _ in 0..2 {
        let (status, again, replayed) = send(&gateway, "unknown-1", &body).await;
        assert_eq!((status, replayed), (504, true), "{again}");
        assert!(
            again["error"]
                .as_str()
                .is_some_and(|e| e.contains("never sends it again")),
            "{again}"
        );
    }
    let sends = server
        .received()
        .into_iter()
        .filter(|frame| frame["cmd"] == "aibot_send_msg")
        .count();
    assert_eq!(sends, 1, "one message on the wire");
}

/// WeCom never sends an AI bot's callback again: with the queue at `dispatcher.max_queued`
/// (its handler stuck), the bot's callbacks are admitted over the bound — counted — rather than
/// refused and lost, and each is delivered once when the handler comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_never_loses_an_ai_bots_callbacks() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let open = Arc::new(tokio::sync::watch::channel(false).0);
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let handler = {
        let (open, seen) = (open.clone(), seen.clone());
        axum::Router::new().route(
            "/bot",
            axum::routing::post(move |body: axum::body::Bytes| {
                let (open, seen) = (open.clone(), seen.clone());
                async move {
                    let mut opened = open.subscribe();
                    let _ = opened.wait_for(|open| *open).await;
                    let envelope: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or_default();
                    let id = envelope["event_id"].as_str().unwrap_or_default().to_owned();
                    seen.lock().expect("seen").push(id);
                    "ok"
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/bot", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, handler).await });
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let config = config(dir.path(), &store, server.url())
        .replace(&file_route(dir.path(), ""), &format!(
            "[dispatcher]\nmax_queued = 2\nconcurrency = 1\n\n[[route]]\nevents = [\"*\"]\nsink = \"http\"\nurl = \"{url}\"\ntimeout = \"60s\"\n"
        ));
    let gateway = Serve::start_with(dir.path(), &config);
    assert!(server.wait_for_subscribes(1, Duration::from_secs(15)).await);
    for i in 0..12 {
        server.push(frame::MESSAGE, &message(i));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while support::metric(&gateway.admin, "oncegate_admitted_over_bound_total").await < 1.0 {
        assert!(std::time::Instant::now() < deadline, "{}", gateway.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = open.send(true);
    wait_until("every message delivered", Duration::from_secs(20), || {
        seen.lock().expect("seen").len() >= 12
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut ids = seen.lock().expect("seen").clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 12, "each once: {}", gateway.stderr());
    assert_eq!(seen.lock().expect("seen").len(), 12);
}
