//! The Feishu client against the local Feishu-like API: one token for every caller, one
//! refresh for all of them, a uuid that sends once, a timeout that is an unknown outcome, rate
//! limits and permanent refusals classed.

use std::sync::Arc;
use std::time::Duration;

use oncegate_send::local::LocalFeishuApi;
use oncegate_send::{FeishuApi, Message, SendError, platform_key};

const APP: &str = "cli_send";
const SECRET: &str = "send-secret";

fn text(chat: &str, key: &str) -> Message {
    Message {
        receive_id_type: "chat_id".into(),
        receive_id: chat.into(),
        msg_type: "text".into(),
        content: r#"{"text":"hello"}"#.into(),
        reply_to: None,
        update_of: None,
        uuid: platform_key("test", key),
    }
}

async fn setup(timeout: Duration) -> (LocalFeishuApi, Arc<FeishuApi>) {
    let server = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
        .await
        .expect("server");
    let api = FeishuApi::new(&server.domain(), APP, SECRET, timeout).expect("client");
    (server, Arc::new(api))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_for_all_callers_and_one_refresh_when_it_is_refused() {
    let (server, api) = setup(Duration::from_secs(5)).await;
    let sends = (0..40).map(|i| {
        let api = api.clone();
        tokio::spawn(async move { api.send(&text(&format!("oc_{i}"), &format!("k{i}"))).await })
    });
    for send in sends.collect::<Vec<_>>() {
        send.await.expect("join").expect("sent");
    }
    assert_eq!(server.token_requests(), 1, "single flight");
    server.expire_token();
    let sends = (0..40).map(|i| {
        let api = api.clone();
        tokio::spawn(async move { api.send(&text(&format!("oc_b{i}"), &format!("b{i}"))).await })
    });
    for send in sends.collect::<Vec<_>>() {
        send.await.expect("join").expect("sent after the refresh");
    }
    assert_eq!(
        server.token_requests(),
        2,
        "refreshed once for all waiting callers"
    );
    assert_eq!(server.sent().len(), 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_and_a_retry_after_a_timeout_send_once() {
    let (server, api) = setup(Duration::from_millis(400)).await;
    let first = api.send(&text("oc_1", "order-42")).await.expect("sent");
    let again = api.send(&text("oc_1", "order-42")).await.expect("repeat");
    assert_eq!(first["data"]["message_id"], again["data"]["message_id"]);
    assert_eq!(server.sent().len(), 1);
    // The message goes out, the answer is late: the client cannot tell, and says so.
    server.answer_after(Some(Duration::from_secs(2)));
    let late = api.send(&text("oc_1", "order-43")).await;
    assert!(matches!(late, Err(SendError::Unknown(_))), "{late:?}");
    server.answer_after(None);
    let retried = api.send(&text("oc_1", "order-43")).await.expect("retry");
    assert_eq!(
        server.sent().len(),
        2,
        "the retry with the same key did not send again"
    );
    assert_eq!(retried["data"]["message_id"], "om_local_2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_and_refusals_are_classed() {
    let (server, api) = setup(Duration::from_secs(5)).await;
    let mut limited = 0;
    for i in 0..8 {
        match api.send(&text("oc_busy", &format!("burst{i}"))).await {
            Ok(_) => {}
            Err(SendError::RetryAfter { after, code, limit }) => {
                assert_eq!(code, 99991400);
                assert_eq!(
                    limit,
                    oncegate_send::Limit::Receiver,
                    "x-ogw-ratelimit-limit: 5 is a receiver's"
                );
                assert!(after >= Duration::from_secs(1));
                limited += 1;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(
        (server.sent().len(), limited),
        (5, 3),
        "5 per second per chat"
    );
    let refused = api.send(&text("", "nobody")).await;
    assert!(
        matches!(refused, Err(SendError::Permanent { code: 230001, .. })),
        "{refused:?}"
    );
    let wrong =
        FeishuApi::new(&server.domain(), APP, "wrong", Duration::from_secs(5)).expect("client");
    let denied = wrong.send(&text("oc_1", "x")).await;
    assert!(
        matches!(denied, Err(SendError::Permanent { code: 10014, .. })),
        "{denied:?}"
    );
    let nowhere =
        FeishuApi::new("http://127.0.0.1:9", APP, SECRET, Duration::from_secs(1)).expect("client");
    assert!(matches!(
        nowhere.send(&text("oc_1", "y")).await,
        Err(SendError::Transient(_))
    ));
}

/// Ids that go into Feishu's URL are checked before anything is sent (issue 36): a path
/// pointing at another API never leaves with the bot's token, and a well-formed id still goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_would_leave_the_message_api_are_refused_before_any_call() {
    let (server, api) = setup(Duration::from_secs(5)).await;
    let traversal = "../../../contact/v3/users/batch_get_id?user_id_type=open_id#";
    let reply = Message {
        reply_to: Some(traversal.into()),
        ..text("oc_x", "r")
    };
    let update = Message {
        update_of: Some("om_a/../../../contact/v3/users/ou_1".into()),
        ..text("oc_x", "u")
    };
    let kind = Message {
        receive_id_type: "open_id&user_id_type=union_id".into(),
        ..text("oc_x", "k")
    };
    let dots = Message {
        update_of: Some("%2e%2e".into()),
        ..text("oc_x", "d")
    };
    for message in [reply, update, kind, dots] {
        match api.send(&message).await {
            Err(SendError::Permanent { message: why, .. }) => {
                assert!(
                    why.contains("reply_to")
                        || why.contains("update")
                        || why.contains("receive_id_type"),
                    "{why}"
                )
            }
            other => panic!("{message:?} was not refused: {other:?}"),
        }
    }
    assert_eq!(server.token_requests(), 0, "not even a token was asked for");
    assert!(server.sent().is_empty());
    // A real message id and every receiver type Feishu names still go.
    let fine = Message {
        reply_to: Some("om_dc13264520392913993dd051dba21dcf".into()),
        ..text("oc_x", "fine")
    };
    api.send(&fine).await.expect("a reply to a message id");
    for kind in oncegate_send::RECEIVE_ID_TYPES {
        let message = Message {
            receive_id_type: kind.into(),
            ..text("oc_y", kind)
        };
        assert_eq!(message.check(), Ok(()), "{kind}");
    }
}
