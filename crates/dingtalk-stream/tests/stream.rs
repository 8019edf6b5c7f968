//! The Stream client against the local DingTalk server written from the protocol sheet:
//! acks only after admission, pings echoed, a refused event acked `LATER` and admitted when
//! pushed again, a `disconnect` answered with a connection on a new ticket, and credentials
//! DingTalk refuses stopping the connection with a reason.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncegate_core::{Accepted, Admit, Inlet, Refusal, RefusalKind};
use oncegate_dingtalk_stream::local::LocalDingtalk;
use oncegate_dingtalk_stream::{Settings, StreamConnection};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const APP: &str = "dingappkey_local";
const SECRET: &str = "local-client-secret";

/// Records every admission (event id, chat); refuses the next `refuse` ones.
#[derive(Default)]
struct Recording {
    admitted: Mutex<Vec<(String, Option<String>)>>,
    refuse: Mutex<usize>,
}

impl Inlet for Recording {
    async fn admit(&self, admit: Admit) -> Result<Accepted, Refusal> {
        {
            let mut refuse = self.refuse.lock().expect("lock");
            if *refuse > 0 {
                *refuse -= 1;
                return Err(Refusal::new(
                    RefusalKind::Unavailable,
                    "store",
                    "the store is down",
                ));
            }
        }
        // An admission takes a moment: acks must wait for it.
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.admitted.lock().expect("lock").push((
            admit.event.event_id.to_string(),
            admit.event.order_key.as_deref().map(str::to_owned),
        ));
        Ok(Accepted::Admitted)
    }

    async fn call(&self, _: Admit, _: Duration) -> Result<Option<bytes::Bytes>, Refusal> {
        Ok(None)
    }

    fn note(&self, _: &'static str, _: &str) {}
}

fn settings(server: &LocalDingtalk, secret: &str) -> Settings {
    let mut settings = Settings::new("ding", &server.domain(), APP, secret);
    settings.ping_every = Duration::from_millis(300);
    settings.silence = Duration::from_secs(3);
    settings.drain = Duration::from_secs(2);
    settings
}

async fn running(
    server: &LocalDingtalk,
    secret: &str,
) -> (
    Arc<Recording>,
    Arc<oncegate_longconn::Status>,
    CancellationToken,
) {
    let inlet = Arc::new(Recording::default());
    let client = StreamConnection::new(settings(server, secret), inlet.clone()).expect("settings");
    let status = client.status();
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move { client.run(token).await });
    (inlet, status, stop)
}

fn bot_message(i: usize) -> Value {
    json!({
        "msgId": format!("msg{i}"), "conversationId": format!("cid{}", i % 3),
        "conversationType": "2", "senderStaffId": "staff1", "chatbotCorpId": "ding_corp",
        "robotCode": APP, "createAt": 1_700_000_000_000u64 + i as u64, "msgtype": "text",
        "text": {"content": format!("message {i}")},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_robot_messages_are_acked_after_admission_in_chat_order() {
    let server = LocalDingtalk::start(APP, SECRET).await.expect("server");
    let (inlet, status, stop) = running(&server, SECRET).await;
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(10))
            .await
    );
    let connection = server.connections()[0];
    for i in 0..60 {
        if i % 2 == 0 {
            let data = json!({"chatId": format!("cid{}", i % 3), "seq": i});
            assert!(server.push_event(
                connection,
                &format!("d-{i}"),
                &format!("ev{i}"),
                "chat_update_title",
                &data
            ));
        } else {
            assert!(server.push_bot_message(connection, &format!("d-{i}"), &bot_message(i)));
        }
    }
    assert!(server.ping(connection, "opaque-7"));
    assert!(
        server.wait_all_acked(Duration::from_secs(10)).await,
        "{:?}",
        server.unacked()
    );
    let admitted = inlet.admitted.lock().expect("lock").clone();
    assert_eq!(admitted.len(), 60);
    // Each chat's events in the order they were pushed.
    for chat in 0..3 {
        let chat = format!("cid{chat}");
        let order: Vec<usize> = admitted
            .iter()
            .filter(|(_, c)| c.as_deref() == Some(chat.as_str()))
            .map(|(id, _)| {
                id.trim_start_matches(|c: char| c.is_alphabetic())
                    .parse()
                    .expect("n")
            })
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{chat}: {order:?}");
        assert_eq!(order.len(), 20);
    }
    let acks = server.acks();
    let ack = |id: &str| {
        acks.iter()
            .find(|a| a.message_id == id)
            .expect("acked")
            .clone()
    };
    let event: Value = serde_json::from_str(&ack("d-0").data).expect("json");
    assert_eq!(event["status"], "SUCCESS");
    assert_eq!(ack("d-1").data, r#"{"response":null}"#);
    let ping = ack("ping-opaque-7");
    assert_eq!(ping.code, 200);
    assert_eq!(
        ping.data, r#"{"opaque":"opaque-7"}"#,
        "the ping's data echoed"
    );
    assert_eq!(status.open(), 1);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_event_is_acked_later_and_admitted_when_pushed_again() {
    let server = LocalDingtalk::start(APP, SECRET).await.expect("server");
    let (inlet, _, stop) = running(&server, SECRET).await;
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(10))
            .await
    );
    let connection = server.connections()[0];
    *inlet.refuse.lock().expect("lock") = 2;
    server.push_event(connection, "d-a", "ev-a", "t", &json!({"chatId": "c"}));
    server.push_bot_message(connection, "d-b", &bot_message(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acks = server.acks();
    assert_eq!(acks.len(), 2, "{acks:?}");
    let later = acks
        .iter()
        .find(|a| a.message_id == "d-a")
        .expect("event acked");
    assert_eq!(later.code, 200);
    assert!(later.data.contains("LATER"), "{later:?}");
    let failed = acks
        .iter()
        .find(|a| a.message_id == "d-b")
        .expect("bot message acked");
    assert_eq!(
        failed.code, 500,
        "a robot message not admitted is not acked as done"
    );
    assert_eq!(server.unacked(), vec!["d-a".to_owned(), "d-b".to_owned()]);
    assert!(inlet.admitted.lock().expect("lock").is_empty());
    // A frame that cannot be used but names its delivery is answered with an error ack, not
    // left unanswered to be pushed again and again.
    let unusable = oncegate_dingtalk_stream::local::frame(
        "EVENT",
        json!({"topic": "*", "messageId": "d-bad"}),
        "{}",
    );
    assert!(server.send(connection, unusable));
    let started = std::time::Instant::now();
    while !server.acks().iter().any(|a| a.message_id == "d-bad") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no ack of the unusable frame"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bad = server
        .acks()
        .into_iter()
        .find(|a| a.message_id == "d-bad")
        .expect("acked");
    assert_eq!(bad.code, 500);
    // DingTalk pushes both again, identical: now they are admitted.
    assert_eq!(server.repush_unacked(connection), 2);
    assert!(server.wait_all_acked(Duration::from_secs(5)).await);
    assert_eq!(inlet.admitted.lock().expect("lock").len(), 2);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_is_acked_and_answered_with_a_connection_on_a_new_ticket() {
    let server = LocalDingtalk::start(APP, SECRET).await.expect("server");
    let (_inlet, status, stop) = running(&server, SECRET).await;
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(10))
            .await
    );
    let first = server.connections()[0];
    assert!(server.disconnect(first, Duration::from_secs(5)));
    // Not the 5 s the server waits before it closes: the client leaves at once.
    let started = std::time::Instant::now();
    while !server.connections().iter().any(|c| *c != first) {
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "no new connection within 4 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.registrations(),
        2,
        "each connection on a ticket of its own"
    );
    assert_eq!(server.refused_tickets(), 0);
    let acks = server.acks();
    assert!(
        acks.iter()
            .any(|a| a.message_id == format!("bye-{first}") && a.code == 200),
        "{acks:?}"
    );
    assert!(status.reconnects() >= 1);
    // A connection dropped without a word is replaced too.
    let second = *server
        .connections()
        .iter()
        .find(|c| **c != first)
        .expect("second");
    server.drop_connection(second);
    let started = std::time::Instant::now();
    while !server.connections().iter().any(|c| *c > second) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no third connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_dingtalk_refuses_stop_the_connection_with_the_reason() {
    let server = LocalDingtalk::start(APP, SECRET).await.expect("server");
    let (_inlet, status, stop) = running(&server, "a-wrong-secret").await;
    let started = std::time::Instant::now();
    while status.fatal().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no fatal status"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fatal = status.fatal().expect("fatal");
    assert!(fatal.contains("app_secret"), "{fatal}");
    assert!(
        !fatal.contains("a-wrong-secret"),
        "the secret is never said: {fatal}"
    );
    assert!(server.connections().is_empty());
    stop.cancel();
}

#[test]
fn empty_credentials_are_refused_before_anything_is_dialled() {
    let settings = Settings::new("ding", "http://127.0.0.1:9", APP, " ");
    let error = StreamConnection::new(settings, Arc::new(Recording::default()))
        .err()
        .expect("refused");
    assert!(error.to_string().contains("app_secret"), "{error}");
}
