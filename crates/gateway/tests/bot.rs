//! The library's bot, as its examples use it: two handlers on one event type and a business
//! key, on the memory store and on Redis; and the claims behind them.

use std::sync::atomic::Ordering;

#[path = "../examples/feishu_bot.rs"]
mod feishu_bot;

#[path = "../examples/readme.rs"]
mod readme;

#[path = "../examples/send_once.rs"]
mod send_once;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_send_example_sends_once_for_all_its_callers() -> anyhow::Result<()> {
    let (messages, replayed) = send_once::run(6).await?;
    assert_eq!((messages, replayed), (1, 5));
    Ok(())
}

fn redis_url() -> String {
    std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_creates_the_order_once_on_memory() -> anyhow::Result<()> {
    let seen = feishu_bot::run(oncegate_memory::MemoryStore::new()).await?;
    // Two messages (the retry is the first one again): audited twice, one order.
    assert_eq!(seen.audited.load(Ordering::SeqCst), 2);
    assert_eq!(seen.orders.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_creates_the_order_once_on_redis() -> anyhow::Result<()> {
    let config = oncegate_redis::RedisConfig {
        prefix: format!("bot{}", std::process::id()),
        ..oncegate_redis::RedisConfig::at(&redis_url())
    };
    let store = oncegate_redis::RedisStore::connect_async(config).await?;
    let seen = feishu_bot::run(store).await?;
    assert_eq!(seen.audited.load(Ordering::SeqCst), 2);
    assert_eq!(seen.orders.load(Ordering::SeqCst), 1);
    Ok(())
}

/// The README's library section shows `examples/readme.rs` as it is, and it runs: a message,
/// Feishu's retry of it, and another message with the same text create one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_is_the_one_that_runs() -> anyhow::Result<()> {
    let source = include_str!("../examples/readme.rs");
    let start = source.find("// README:start\n").expect("start marker") + 16;
    let end = source.find("// README:end").expect("end marker");
    let readme = include_str!("../../../README.md");
    assert!(
        readme.contains(&format!("```rust\n{}```", &source[start..end])),
        "the README's library section must show crates/gateway/examples/readme.rs between its markers"
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhook/bot", listener.local_addr()?);
    let stop = tokio_util::sync::CancellationToken::new();
    let served = tokio::spawn(readme::serve(listener, "readme-key".into(), stop.clone()));
    let app = oncegate_feishu::FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        "cli_a1",
        Some("readme-key".into()),
        None,
    )?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let message = |event: &str, id: &str| {
        format!(
            r#"{{"schema":"2.0","header":{{"event_id":"{event}","event_type":"im.message.receive_v1","create_time":"1700000000000","app_id":"cli_a1"}},"event":{{"sender":{{"sender_id":{{"open_id":"ou_1"}}}},"message":{{"message_id":"{id}","chat_id":"oc_{id}","chat_type":"p2p","message_type":"text","content":"{{\"text\":\"order 42\"}}"}}}}}}"#
        )
    };
    for (nonce, document) in [
        ("a", message("e1", "om_1")),
        ("b", message("e1", "om_1")),
        ("c", message("e2", "om_2")),
    ] {
        feishu_bot::post_signed(&client, &url, &app, nonce, &document).await?;
    }
    for _ in 0..100 {
        if readme::ORDERS.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.cancel();
    served.await??;
    assert_eq!(readme::ORDERS.load(Ordering::SeqCst), 1);
    Ok(())
}

mod handlers {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use bytes::Bytes;
    use oncegate_feishu::events::MessageReceived;
    use oncegate_feishu::{Cloud, FeishuApp};
    use oncegate_gateway::SinkError;
    use oncegate_gateway::bot::{Bot, BotBuilder, BoxFuture, Ctx, EventHandler, HandlerError};
    use oncegate_memory::MemoryStore;
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    const TOKEN: &str = "verification-token";

    fn builder() -> BotBuilder<MemoryStore> {
        let app = FeishuApp::new(Cloud::Feishu, "cli_t", None, Some(TOKEN.into())).expect("app");
        Bot::builder(MemoryStore::new())
            .source("bot", app)
            .parts(|parts| {
                parts.timing.dispatcher.backoff_base = Duration::from_millis(10);
                parts.timing.dispatcher.backoff_max = Duration::from_millis(50);
                parts.timing.dispatcher.max_attempts = 5;
            })
    }

    /// A plain (unencrypted) Feishu message, as an app without an encrypt key gets it.
    fn message(event: &str, message: &str, text: &str) -> String {
        format!(
            r#"{{"schema":"2.0","header":{{"event_id":"{event}","token":"{TOKEN}","event_type":"im.message.receive_v1","create_time":"1700000000000","app_id":"cli_t"}},"event":{{"sender":{{"sender_id":{{"open_id":"ou_1"}},"sender_type":"user"}},"message":{{"message_id":"{message}","chat_id":"oc_{event}","chat_type":"p2p","message_type":"text","content":"{{\"text\":\"{text}\"}}"}}}}}}"#
        )
    }

    /// Posts `documents` to `bot`, runs it until `done` holds (or 5 s), then stops it.
    async fn run_until(
        bot: Bot<MemoryStore>,
        documents: &[String],
        done: impl Fn(&Bot<MemoryStore>) -> bool,
    ) -> Bot<MemoryStore> {
        for document in documents {
            let answer = bot
                .router()
                .oneshot(
                    Request::post("/webhook/bot")
                        .header("content-type", "application/json")
                        .body(Body::from(document.clone()))
                        .expect("request"),
                )
                .await
                .expect("answered");
            assert!(answer.status().is_success(), "{}", answer.status());
        }
        let shutdown = CancellationToken::new();
        let bot = Arc::new(bot);
        let running = {
            let (bot, shutdown) = (bot.clone(), shutdown.clone());
            tokio::spawn(async move { bot.run(shutdown).await })
        };
        for _ in 0..200 {
            if done(&bot) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        shutdown.cancel();
        running.await.expect("joined").expect("ran");
        Arc::into_inner(bot).expect("the only handle")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_runs_only_the_handlers_that_did_not_finish() {
        let (first, second) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (a, b) = (first.clone(), second.clone());
        let bot = builder()
            .on("im.message.receive_v1", move |_| {
                let a = a.clone();
                async move {
                    a.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .on("im.message.*", move |_| {
                let b = b.clone();
                async move {
                    // Fails on its first two runs: the event is retried.
                    if b.fetch_add(1, Ordering::SeqCst) < 2 {
                        return Err(SinkError::Transient("not yet".into()));
                    }
                    Ok(())
                }
            })
            .build()
            .expect("bot");
        let bot = run_until(bot, &[message("e1", "om_1", "hi")], |bot| {
            bot.gateway().stats().delivered >= 1
        })
        .await;
        assert_eq!(second.load(Ordering::SeqCst), 3, "failed twice, then ran");
        assert_eq!(
            first.load(Ordering::SeqCst),
            1,
            "not run again on the retries"
        );
        let stats = bot.gateway().stats();
        assert_eq!((stats.delivered, stats.retries), (1, 2));
    }

    /// Seed 000's `IdempotentFeishuEventHandler`: the handler names a business key.
    struct CreateOrder(Arc<AtomicU32>);

    impl EventHandler for CreateOrder {
        fn handle(&self, ctx: Ctx) -> BoxFuture<'static, Result<Option<Bytes>, HandlerError>> {
            let created = self.0.clone();
            Box::pin(async move {
                let _ = ctx
                    .typed::<MessageReceived>()
                    .map_err(|e| SinkError::Permanent(e.to_string()))?;
                created.fetch_add(1, Ordering::SeqCst);
                Ok(None)
            })
        }

        fn business_key(&self, ctx: &Ctx) -> Option<String> {
            let message = ctx.typed::<MessageReceived>().ok()?;
            let text = message.message.text()?;
            let order = text.split_whitespace().find(|w| w.parse::<u32>().is_ok())?;
            Some(format!("order:{order}"))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_that_names_a_business_key_runs_once_per_key() {
        let created = Arc::new(AtomicU32::new(0));
        let bot = builder()
            .handler("im.message.receive_v1", CreateOrder(created.clone()))
            .build()
            .expect("bot");
        // Five different messages, in different chats (run concurrently): three mean order 7.
        let documents = [
            message("e1", "om_1", "order 7"),
            message("e2", "om_2", "7 please"),
            message("e3", "om_3", "order 8"),
            message("e4", "om_4", "again order 7"),
            message("e5", "om_5", "no order"),
        ];
        let bot = run_until(bot, &documents, |bot| bot.gateway().stats().delivered >= 5).await;
        // Order 7 once, order 8 once; a message naming no order is handled with no key.
        assert_eq!(created.load(Ordering::SeqCst), 3);
        assert_eq!(bot.gateway().stats().delivered, 5);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_event_that_does_not_read_as_its_type_is_dead_lettered_with_the_reason() {
        let ran = Arc::new(AtomicU32::new(0));
        let seen = ran.clone();
        let bot = builder()
            .on_typed(move |_: MessageReceived, _| {
                let seen = seen.clone();
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .build()
            .expect("bot");
        let broken = message("e1", "om_1", "hi").replace("\"chat_type\":\"p2p\",", "");
        let bot = run_until(bot, &[broken], |bot| {
            bot.gateway().stats().dead_letters >= 1
        })
        .await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        let letters = oncegate_core::EventQueue::dead_letters(bot.gateway().store(), 10)
            .await
            .expect("letters");
        assert_eq!(letters.len(), 1);
        assert!(
            letters[0].reason.contains("chat_type"),
            "{}",
            letters[0].reason
        );
    }
}

/// A handler that hangs is stopped at its timeout: the event is retried, and a handler that
/// hangs every time leaves a dead letter, its chat moving on to the next event.
mod timeouts {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use oncegate_feishu::{Cloud, FeishuApp};
    use oncegate_gateway::bot::Bot;
    use oncegate_memory::MemoryStore;
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    const TOKEN: &str = "verification-token";

    /// A plain Feishu message `event` in the chat `oc_same`.
    fn message(event: &str) -> String {
        format!(
            r#"{{"schema":"2.0","header":{{"event_id":"{event}","token":"{TOKEN}","event_type":"im.message.receive_v1","create_time":"1700000000000","app_id":"cli_t"}},"event":{{"sender":{{"sender_id":{{"open_id":"ou_1"}},"sender_type":"user"}},"message":{{"message_id":"om_{event}","chat_id":"oc_same","chat_type":"group","message_type":"text","content":"{{\"text\":\"hi\"}}"}}}}}}"#
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_over_its_timeout_is_retried_and_its_chat_moves_on() {
        let app = FeishuApp::new(Cloud::Feishu, "cli_t", None, Some(TOKEN.into())).expect("app");
        // Every start of a run, and every run that finished, in order.
        let started = Arc::new(Mutex::new(Vec::<String>::new()));
        let finished = Arc::new(Mutex::new(Vec::<String>::new()));
        let (runs, done) = (started.clone(), finished.clone());
        let bot = Bot::builder(MemoryStore::new())
            .source("bot", app)
            .parts(|parts| {
                parts.timing.dispatcher.backoff_base = Duration::from_millis(10);
                parts.timing.dispatcher.backoff_max = Duration::from_millis(50);
                parts.timing.dispatcher.max_attempts = 3;
            })
            .handler_timeout(Duration::from_millis(300))
            .on("im.message.receive_v1", move |ctx| {
                let (runs, done) = (runs.clone(), done.clone());
                async move {
                    let id = ctx.event().event_id.to_string();
                    let attempt = {
                        let mut runs = runs.lock().expect("lock");
                        runs.push(id.clone());
                        runs.iter().filter(|r| **r == id).count()
                    };
                    // e1 hangs on its first run; e3 on every run.
                    if (id == "e1" && attempt == 1) || id == "e3" {
                        std::future::pending::<()>().await;
                    }
                    done.lock().expect("lock").push(id);
                    Ok(())
                }
            })
            .build()
            .expect("bot");
        for event in ["e1", "e2", "e3", "e4"] {
            let answer = bot
                .router()
                .oneshot(
                    Request::post("/webhook/bot")
                        .header("content-type", "application/json")
                        .body(Body::from(message(event)))
                        .expect("request"),
                )
                .await
                .expect("answered");
            assert!(answer.status().is_success(), "{}", answer.status());
        }
        let shutdown = CancellationToken::new();
        let bot = Arc::new(bot);
        let running = {
            let (bot, shutdown) = (bot.clone(), shutdown.clone());
            tokio::spawn(async move { bot.run(shutdown).await })
        };
        let until = std::time::Instant::now() + Duration::from_secs(15);
        while finished.lock().expect("lock").len() < 3 || bot.gateway().stats().dead_letters < 1 {
            assert!(
                std::time::Instant::now() < until,
                "stuck: started {:?}, finished {:?}",
                started.lock().expect("lock"),
                finished.lock().expect("lock")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
        running.await.expect("joined").expect("ran");
        // The chat's events in order: e1 after its retry, e3 given up, e4 after it.
        assert_eq!(*finished.lock().expect("lock"), ["e1", "e2", "e4"]);
        let runs = started.lock().expect("lock").clone();
        assert_eq!(runs.iter().filter(|r| *r == "e1").count(), 2, "{runs:?}");
        assert_eq!(
            runs.iter().filter(|r| *r == "e3").count(),
            3,
            "all its attempts: {runs:?}"
        );
        let letters = oncegate_core::EventQueue::dead_letters(bot.gateway().store(), 10)
            .await
            .expect("letters");
        assert_eq!(letters.len(), 1);
        assert!(
            letters[0].reason.contains("timeout"),
            "{}",
            letters[0].reason
        );
        assert!(
            Bot::builder(MemoryStore::new())
                .source(
                    "bot",
                    FeishuApp::new(Cloud::Feishu, "cli_t", None, Some(TOKEN.into())).expect("app")
                )
                .handler_timeout(Duration::ZERO)
                .build()
                .is_err()
        );
    }
}

/// A bot on DingTalk's Stream mode (a long connection, no HTTP source): each message handled
/// once, a re-push caught.
mod long_connection {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use oncegate_dingtalk_stream::local::LocalDingtalk;
    use oncegate_dingtalk_stream::{Settings, StreamTransport};
    use oncegate_gateway::bot::{Bot, Instances};
    use oncegate_memory::MemoryStore;
    use tokio_util::sync::CancellationToken;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bot_serves_a_long_connection_source() {
        let server = LocalDingtalk::start("dingbot", "bot-secret")
            .await
            .expect("server");
        let transport = StreamTransport::new(Settings::new(
            "ding",
            &server.domain(),
            "dingbot",
            "bot-secret",
        ));
        let handled = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = handled.clone();
        let bot = Bot::builder(MemoryStore::new())
            .long_connection("ding", transport, Instances::All)
            .on("bot_message", move |ctx| {
                let seen = seen.clone();
                async move {
                    seen.lock()
                        .expect("lock")
                        .push(ctx.event().event_id.to_string());
                    Ok(())
                }
            })
            .build()
            .expect("a bot with only a long connection");
        let shutdown = CancellationToken::new();
        let bot = Arc::new(bot);
        let running = {
            let (bot, shutdown) = (bot.clone(), shutdown.clone());
            tokio::spawn(async move { bot.run(shutdown).await })
        };
        assert!(
            server
                .wait_for_connections(1, Duration::from_secs(10))
                .await
        );
        let connection = server.connections()[0];
        for i in 0..10 {
            let data = serde_json::json!({
                "msgId": format!("msg{i}"), "conversationId": "cid1",
                "createAt": 1_700_000_000_000u64 + i, "text": {"content": "hi"},
            });
            assert!(server.push_bot_message(connection, &format!("d{i}"), &data));
        }
        assert!(server.wait_all_acked(Duration::from_secs(10)).await);
        for i in (0..10).step_by(3) {
            assert!(server.repush(connection, &format!("d{i}")));
        }
        assert!(server.wait_all_acked(Duration::from_secs(10)).await);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while handled.lock().expect("lock").len() < 10 {
            assert!(
                std::time::Instant::now() < until,
                "{:?}",
                handled.lock().expect("lock")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        shutdown.cancel();
        running.await.expect("joined").expect("ran");
        let handled = handled.lock().expect("lock").clone();
        let expected: Vec<String> = (0..10).map(|i| format!("msg{i}")).collect();
        assert_eq!(handled, expected, "each once, in the conversation's order");
    }
}

/// Sending once from Rust, against the local Feishu-like API server: from the bot, from two
/// instances on Redis, and from a handler that is retried after it sent.
mod sends {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use oncegate_core::Store;
    use oncegate_feishu::{Cloud, FeishuApp};
    use oncegate_gateway::SinkError;
    use oncegate_gateway::bot::{Bot, Ctx, NotSent, SendOptions};
    use oncegate_send::local::LocalFeishuApi;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    const APP: &str = "cli_sender";
    const SECRET: &str = "sender-secret";
    const TOKEN: &str = "verification-token";

    fn api(platform: &LocalFeishuApi) -> oncegate_send::Api {
        oncegate_send::Api::Feishu(
            oncegate_send::FeishuApi::new(&platform.domain(), APP, SECRET, Duration::from_secs(5))
                .expect("api"),
        )
    }

    fn bot<S: Store>(store: S, platform: &LocalFeishuApi) -> oncegate_gateway::bot::BotBuilder<S> {
        let app = FeishuApp::new(Cloud::Feishu, APP, None, Some(TOKEN.into())).expect("app");
        Bot::builder(store)
            .source("bot", app)
            .sender("bot", api(platform))
    }

    fn text(chat: &str, text: &str) -> serde_json::Value {
        json!({"receive_id": chat, "msg_type": "text", "content": {"text": text}})
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_send_from_rust_goes_out_once_however_many_callers_retry_it() {
        let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
            .await
            .expect("platform");
        let bot = Arc::new(
            bot(oncegate_memory::MemoryStore::new(), &platform)
                .on("*", |_| async { Ok(()) })
                .build()
                .expect("bot"),
        );
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let bot = bot.clone();
                tokio::spawn(async move {
                    bot.send(
                        "bot",
                        "order-42-confirmed",
                        text("oc_1", "order 42 confirmed"),
                        SendOptions::default(),
                    )
                    .await
                })
            })
            .collect();
        let mut first = 0;
        let mut bodies = Vec::new();
        for caller in callers {
            let sent = caller.await.expect("joined").expect("sent");
            assert_eq!(sent.status, 200);
            first += usize::from(!sent.replayed);
            bodies.push(sent.body);
        }
        // One call to the platform; every other caller got its answer from the key.
        assert_eq!(first, 1);
        assert!(
            bodies.windows(2).all(|pair| pair[0] == pair[1]),
            "{bodies:?}"
        );
        assert_eq!(platform.sent().len(), 1);
        // Another message under the same key is the caller's mistake, not a second send.
        let other = bot
            .send(
                "bot",
                "order-42-confirmed",
                text("oc_1", "order 43"),
                SendOptions::default(),
            )
            .await;
        assert_eq!(other, Err(NotSent::Conflict));
        let unknown = bot
            .send("nobody", "k", text("oc_1", "x"), SendOptions::default())
            .await;
        assert_eq!(unknown, Err(NotSent::NoSuchSource));
        // The key's bounds are the outbox's, for Rust and `/send` alike.
        let long = bot
            .send(
                "bot",
                &"k".repeat(256),
                text("oc_1", "x"),
                SendOptions::default(),
            )
            .await;
        assert!(matches!(long, Err(NotSent::BadRequest(_))), "{long:?}");
        assert_eq!(platform.sent().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_instances_on_redis_send_a_key_once() {
        let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
            .await
            .expect("platform");
        let config = oncegate_redis::RedisConfig {
            prefix: format!("botsend{}", std::process::id()),
            ..oncegate_redis::RedisConfig::at(&super::redis_url())
        };
        let mut instances = Vec::new();
        for _ in 0..2 {
            let store = oncegate_redis::RedisStore::connect_async(config.clone())
                .await
                .expect("redis");
            instances.push(Arc::new(
                bot(store, &platform)
                    .on("*", |_| async { Ok(()) })
                    .build()
                    .expect("bot"),
            ));
        }
        for round in 0..10 {
            let key = format!("notice-{round}");
            let callers: Vec<_> = (0..6)
                .map(|i| {
                    let (bot, key) = (instances[i % 2].clone(), key.clone());
                    tokio::spawn(async move {
                        bot.send("bot", &key, text("oc_2", &key), SendOptions::default())
                            .await
                    })
                })
                .collect();
            let mut first = 0;
            for caller in callers {
                let sent = caller.await.expect("joined").expect("sent");
                first += usize::from(!sent.replayed);
            }
            assert_eq!(first, 1, "round {round}");
        }
        assert_eq!(platform.sent().len(), 10);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_retried_after_it_sent_does_not_send_again() {
        let platform = LocalFeishuApi::start(APP, SECRET, Duration::from_secs(7200))
            .await
            .expect("platform");
        let runs = Arc::new(AtomicU32::new(0));
        let seen = runs.clone();
        let replays = Arc::new(std::sync::Mutex::new(Vec::new()));
        let replayed = replays.clone();
        let bot = bot(oncegate_memory::MemoryStore::new(), &platform)
            .parts(|parts| {
                parts.timing.dispatcher.backoff_base = Duration::from_millis(10);
                parts.timing.dispatcher.backoff_max = Duration::from_millis(20);
            })
            .on("im.message.receive_v1", move |ctx: Ctx| {
                let (seen, replayed) = (seen.clone(), replayed.clone());
                async move {
                    // The reply's key is the event's: a retry of the handler sends nothing new.
                    let key = format!("reply-{}", ctx.idempotency_key());
                    let sent = ctx
                        .send("bot", &key, text("oc_3", "got it"), SendOptions::default())
                        .await
                        .map_err(|error| SinkError::Transient(error.to_string()))?;
                    replayed.lock().expect("replays").push(sent.replayed);
                    // Fails after sending, twice: the dispatcher retries the handler.
                    if seen.fetch_add(1, Ordering::SeqCst) < 2 {
                        return Err(SinkError::Transient("the database is away".into()));
                    }
                    Ok(())
                }
            })
            .build()
            .expect("bot");
        let document = format!(
            r#"{{"schema":"2.0","header":{{"event_id":"e1","token":"{TOKEN}","event_type":"im.message.receive_v1","create_time":"1700000000000","app_id":"{APP}"}},"event":{{"message":{{"message_id":"om_1","chat_id":"oc_3","chat_type":"p2p","message_type":"text","content":"{{\"text\":\"hi\"}}"}}}}}}"#
        );
        let answer = bot
            .router()
            .oneshot(
                Request::post("/webhook/bot")
                    .header("content-type", "application/json")
                    .body(Body::from(document))
                    .expect("request"),
            )
            .await
            .expect("answered");
        assert!(answer.status().is_success());
        let stop = CancellationToken::new();
        let bot = Arc::new(bot);
        let running = {
            let (bot, stop) = (bot.clone(), stop.clone());
            tokio::spawn(async move { bot.run(stop).await })
        };
        for _ in 0..200 {
            if bot.gateway().stats().delivered >= 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        stop.cancel();
        running.await.expect("joined").expect("ran");
        assert_eq!(runs.load(Ordering::SeqCst), 3, "ran three times");
        // The platform was called once: the retries got the first send's answer from its key.
        assert_eq!(*replays.lock().expect("replays"), [false, true, true]);
        assert_eq!(platform.sent().len(), 1, "sent once");
    }
}
