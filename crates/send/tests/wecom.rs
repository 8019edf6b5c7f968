//! The WeCom client against the local WeCom-like API: the duplicate check and agent set on
//! every message, a cap on calls in flight that keeps WeCom from answering 45033, one token
//! for all callers and one refresh.

use std::sync::Arc;
use std::time::Duration;

use oncegate_send::local_wecom::LocalWecomApi;
use oncegate_send::wecom::WecomOptions;
use oncegate_send::{SendError, WecomApi};
use serde_json::json;

const CORP: &str = "ww_send";
const SECRET: &str = "wecom-secret";

fn client(domain: &str, max_in_flight: usize) -> Arc<WecomApi> {
    let options = WecomOptions {
        max_in_flight,
        ..WecomOptions::default()
    };
    Arc::new(WecomApi::new(domain, CORP, 1000002, SECRET, options).expect("client"))
}

#[test]
fn a_message_gets_the_agent_and_the_duplicate_check() {
    let api = client("http://127.0.0.1:9", 4);
    let message = api
        .prepare(json!({"touser": "zhangsan|lisi", "msgtype": "text", "text": {"content": "hi"}}))
        .expect("prepared");
    assert_eq!(message.body["agentid"], 1000002);
    assert_eq!(message.body["enable_duplicate_check"], 1);
    assert_eq!(message.body["duplicate_check_interval"], 1800);
    assert_eq!(message.members().collect::<Vec<_>>(), ["zhangsan", "lisi"]);
    let off = api
        .prepare(json!({"touser": "a", "msgtype": "text", "text": {}, "enable_duplicate_check": 0}))
        .expect("prepared");
    assert_eq!(
        off.body["enable_duplicate_check"], 0,
        "the caller's choice stands"
    );
    assert!(api.prepare(json!({"touser": "a"})).is_err(), "no msgtype");
    assert!(
        api.prepare(json!({"msgtype": "text"})).is_err(),
        "no receiver"
    );
    assert!(api.prepare(json!(["not", "an", "object"])).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_cap_keeps_wecom_from_refusing_and_tokens_are_shared() {
    let server = LocalWecomApi::start(CORP, SECRET, 4).await.expect("server");
    let api = client(&server.domain(), 4);
    let sends: Vec<_> = (0..40)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                let message = api
                    .prepare(json!({"touser": format!("m{i}"), "msgtype": "text", "text": {"content": "hi"}}))
                    .expect("prepared");
                api.send(&message).await
            })
        })
        .collect();
    for send in sends {
        send.await.expect("join").expect("sent");
    }
    assert_eq!(server.busy(), 0, "never more in flight than WeCom allows");
    assert_eq!(server.tokens_issued(), 1);
    server.expire_token();
    let message = api
        .prepare(json!({"touser": "m0", "msgtype": "text", "text": {"content": "again"}}))
        .expect("prepared");
    api.send(&message).await.expect("sent after one refresh");
    assert_eq!(server.tokens_issued(), 2);
    // A client that allows more than WeCom does is told so, as a wait.
    let eager = client(&server.domain(), 16);
    let sends: Vec<_> = (0..16)
        .map(|i| {
            let api = eager.clone();
            tokio::spawn(async move {
                let message = api
                    .prepare(json!({"touser": format!("e{i}"), "msgtype": "text", "text": {"content": "hi"}}))
                    .expect("prepared");
                api.send(&message).await
            })
        })
        .collect();
    let mut waits = 0;
    for send in sends {
        match send.await.expect("join") {
            Ok(_) => {}
            Err(SendError::RetryAfter {
                code: 45033,
                after,
                limit,
            }) => {
                assert_eq!(after, Duration::from_secs(1));
                assert_eq!(limit, oncegate_send::Limit::Concurrency, "not a rate");
                waits += 1;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(waits > 0, "45033 is classed as a wait");
}

/// A corp whose quota is spent is answered 45009: a wait of a minute for the app's budget,
/// which may mean the hour's block (WeCom answers both alike); 45033 has no longer window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_quota_waits_a_minute_or_the_hour_and_a_concurrency_refusal_only_a_moment() {
    let server = LocalWecomApi::start(CORP, SECRET, 4).await.expect("server");
    server.block(CORP);
    let api = client(&server.domain(), 4);
    let message = api
        .prepare(json!({"touser": "m0", "msgtype": "text", "text": {"content": "hi"}}))
        .expect("prepared");
    let error = api.send(&message).await.expect_err("blocked");
    assert!(
        matches!(
            error,
            SendError::RetryAfter {
                code: 45009,
                limit: oncegate_send::Limit::App,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.longer_pause(), Some(Duration::from_secs(3600)));
    assert_eq!(server.blocked_calls(CORP), 1);
    let busy = SendError::RetryAfter {
        after: Duration::from_secs(1),
        code: 45033,
        limit: oncegate_send::Limit::Concurrency,
    };
    assert_eq!(busy.longer_pause(), None);
}
