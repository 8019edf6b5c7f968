//! DingTalk's Stream mode through the binary: a local DingTalk-like server (written from the
//! protocol sheet) pushes events and robot messages to `oncegate serve`, with identical
//! re-pushes of late-acked robot messages, a dropped connection and a `disconnect`; each is
//! delivered once, in its conversation's order. On Redis, one gateway of two holds the
//! connection, and the other takes over when it dies.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use oncegate_dingtalk_stream::local::LocalDingtalk;
use serde_json::{Value, json};
use support::{Serve, file_route, lines, redis_store, wait_until};

const APP: &str = "dingstreame2e";
const SECRET: &str = "e2e-client-secret";
const CHATS: usize = 5;

fn config(dir: &Path, store: &str, domain: &str, extra: &str) -> String {
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
name = "ding"
platform = "dingtalk"
transport = "stream"
app_key = "{APP}"
app_secret = "{SECRET}"
domain = "{domain}"
{extra}

{route}
"#,
        route = file_route(dir, "")
    )
}

/// Message `i`: a robot message (odd) or an event (even) in conversation `i % CHATS`.
fn push(server: &LocalDingtalk, connection: u64, i: usize) -> bool {
    push_as(server, connection, i, "delivery")
}

/// Message `i` pushed as delivery `{delivery}-{i}`: a delivery id of its own, as DingTalk may
/// give a re-push.
fn push_as(server: &LocalDingtalk, connection: u64, i: usize, delivery: &str) -> bool {
    let chat = format!("cid{}", i % CHATS);
    if i % 2 == 1 {
        let data = json!({
            "msgId": format!("msg{i}"), "conversationId": chat, "conversationType": "2",
            "senderStaffId": "staff1", "senderNick": "Li", "chatbotCorpId": "ding_corp",
            "robotCode": APP, "createAt": 1_700_000_000_000u64 + i as u64, "msgtype": "text",
            "text": {"content": format!("message {i}")},
        });
        server.push_bot_message(connection, &format!("{delivery}-{i}"), &data)
    } else {
        let data = json!({"chatId": chat, "title": format!("title {i}")});
        server.push_event(
            connection,
            &format!("delivery-{i}"),
            &format!("ev{i}"),
            "chat_update_title",
            &data,
        )
    }
}

/// The message numbers delivered to the sinks of `dirs`, in the order of each file.
fn delivered(dirs: &[&Path]) -> Vec<usize> {
    dirs.iter()
        .flat_map(|dir| lines(dir))
        .map(|line| {
            let id = line["event_id"].as_str().unwrap_or_default().to_owned();
            id.trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .parse()
                .unwrap_or(usize::MAX)
        })
        .collect()
}

async fn new_connection(server: &LocalDingtalk, old: u64) -> u64 {
    wait_until("a new connection", Duration::from_secs(15), || {
        server.connections().iter().any(|c| *c > old)
    })
    .await;
    *server
        .connections()
        .iter()
        .find(|c| **c > old)
        .expect("new")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_messages_are_delivered_once_in_chat_order_across_repushes_and_reconnects() {
    let server = LocalDingtalk::start(APP, SECRET).await.expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let gateway = Serve::start_with(
        dir.path(),
        &config(dir.path(), &store, &server.domain(), ""),
    );
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "{}",
        gateway.stderr()
    );
    let first = server.connections()[0];
    for i in 0..100 {
        assert!(push(&server, first, i));
    }
    assert!(
        server.wait_all_acked(Duration::from_secs(20)).await,
        "{}",
        gateway.stderr()
    );
    // Late acks: DingTalk pushes robot messages again with identical JSON (and the same
    // delivery), events too.
    for i in (0..100).step_by(3) {
        assert!(server.repush(first, &format!("delivery-{i}")));
    }
    assert!(server.wait_all_acked(Duration::from_secs(20)).await);
    // The connection drops without a word: a new one on a new ticket.
    server.drop_connection(first);
    let second = new_connection(&server, first).await;
    for i in 100..150 {
        assert!(push(&server, second, i));
    }
    assert!(server.wait_all_acked(Duration::from_secs(20)).await);
    // Re-pushes under delivery ids of their own: the message's id says what it is.
    for i in (100..150).step_by(5) {
        assert!(push_as(&server, second, i, "redelivery"));
    }
    assert!(server.wait_all_acked(Duration::from_secs(20)).await);
    // DingTalk asks for a new connection; the old one closes a while later.
    assert!(server.disconnect(second, Duration::from_secs(2)));
    let third = new_connection(&server, second).await;
    for i in 150..200 {
        assert!(push(&server, third, i));
    }
    for i in (101..200).step_by(2) {
        assert!(server.repush(third, &format!("delivery-{i}")), "{i}");
    }
    assert!(
        server.wait_all_acked(Duration::from_secs(20)).await,
        "{}",
        gateway.stderr()
    );
    assert!(server.registrations() >= 3, "a ticket per connection");
    assert_eq!(server.refused_tickets(), 0, "no ticket used twice");

    wait_until("every message delivered", Duration::from_secs(20), || {
        delivered(&[dir.path()]).len() >= 200
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = delivered(&[dir.path()]);
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for i in &seen {
        *counts.entry(*i).or_default() += 1;
    }
    assert_eq!(counts.len(), 200, "none lost: {seen:?}");
    assert!(counts.values().all(|n| *n == 1), "each once: {counts:?}");
    for chat in 0..CHATS {
        let order: Vec<usize> = seen.iter().copied().filter(|i| i % CHATS == chat).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "conversation {chat} in the order it was pushed: {order:?}"
        );
    }
    let acks = server.acks();
    assert!(
        acks.iter().all(|ack| ack.code == 200),
        "every ack a success"
    );
    let robot = acks
        .iter()
        .find(|a| a.message_id == "delivery-1")
        .expect("acked");
    assert_eq!(robot.data, r#"{"response":null}"#);
    let (_, stats) = gateway.admin_get("/admin/stats").await;
    let stats: Value = serde_json::from_str(&stats).expect("stats");
    assert!(
        stats["gateway"]["duplicates"].as_u64() >= Some(34 + 10 + 50),
        "{stats}"
    );
    assert_eq!(stats["long_connections"][0]["open"], 1, "{stats}");
    assert!(
        stats["long_connections"][0]["reconnects"].as_u64() >= Some(2),
        "{stats}"
    );
    let (ready, _) = gateway.admin_get("/readyz").await;
    assert_eq!(ready, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_gateways_holds_the_stream_connection_and_the_other_takes_over() {
    let server = LocalDingtalk::start(APP, SECRET).await.expect("server");
    let store = redis_store("dts");
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let leader = "instances = \"leader\"";
    let mut first = Serve::start_with(
        a.path(),
        &config(a.path(), &store, &server.domain(), leader),
    );
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "{}",
        first.stderr()
    );
    let second = Serve::start_with(
        b.path(),
        &config(b.path(), &store, &server.domain(), leader),
    );
    second
        .admin_until("/admin/stats", |body| body.contains("\"standby\""))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.connections().len(), 1, "only the leader connects");
    assert_eq!(server.registrations(), 1);
    let (ready, _) = second.admin_get("/readyz").await;
    assert_eq!(ready, 200, "a standby is ready");
    let held = server.connections()[0];
    assert!(push(&server, held, 1));
    assert!(server.wait_all_acked(Duration::from_secs(10)).await);
    wait_until("delivered by the leader", Duration::from_secs(15), || {
        delivered(&[a.path()]).contains(&1)
    })
    .await;
    // The leader dies without a word: its lease (3 s) runs out and the standby takes over;
    // DingTalk pushes the message again to the new holder, which knows it.
    first.child.kill().expect("kill -9");
    let _ = first.child.wait();
    server.drop_connection(held);
    second
        .admin_until("/admin/stats", |body| body.contains("\"leading\""))
        .await;
    let taken = new_connection(&server, held).await;
    assert!(server.repush(taken, "delivery-1"));
    assert!(push(&server, taken, 2));
    assert!(server.wait_all_acked(Duration::from_secs(10)).await);
    wait_until("delivered", Duration::from_secs(15), || {
        delivered(&[b.path()]).contains(&2)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut seen = delivered(&[a.path(), b.path()]);
    seen.sort_unstable();
    assert_eq!(seen, vec![1, 2], "each once across both gateways");
    assert_eq!(server.connections().len(), 1, "one holder still");
}
