//! A Feishu bot as a Rust library: two handlers on one event type, one of them naming a
//! business key, served on the application's own axum app.
//!
//! `cargo run -p oncegate-gateway --example feishu_bot` posts three signed callbacks to the
//! bot: a message asking for order 42, Feishu's retry of it, and a second message about the
//! same order. The audit handler sees two messages; order 42 is created once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use oncegate_core::Store;
use oncegate_feishu::events::MessageReceived;
use oncegate_feishu::{Cloud, FeishuApp};
use oncegate_gateway::bot::{Bot, Ctx};
use tokio_util::sync::CancellationToken;

/// What the bot did.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Messages the audit handler saw.
    pub(crate) audited: AtomicU32,
    /// Orders created.
    pub(crate) orders: AtomicU32,
}

/// Builds the bot on `store`, posts the three callbacks, and answers what it did.
pub(crate) async fn run<S: Store>(store: S) -> anyhow::Result<Arc<Seen>> {
    let app = FeishuApp::new(
        Cloud::Feishu,
        "cli_example",
        Some("encrypt-key".into()),
        None,
    )?;
    let seen = Arc::new(Seen::default());
    let (audit, orders) = (seen.clone(), seen.clone());
    let bot = Bot::builder(store)
        .source("bot", app.clone())
        // Every message, raw.
        .on("im.message.receive_v1", move |ctx: Ctx| {
            let audit = audit.clone();
            async move {
                audit.audited.fetch_add(1, Ordering::SeqCst);
                println!("audit: {} {}", ctx.event().event_type, ctx.event().event_id);
                Ok(())
            }
        })
        // The same messages, typed; the order they name is created once.
        .on_typed(move |message: MessageReceived, ctx: Ctx| {
            let orders = orders.clone();
            async move {
                let text = message.message.text().unwrap_or_default();
                let Some(order) = text.split_whitespace().find(|w| w.parse::<u32>().is_ok()) else {
                    return Ok(());
                };
                let order = order.to_owned();
                ctx.once(&format!("order:{order}"), || async move {
                    orders.orders.fetch_add(1, Ordering::SeqCst);
                    println!("order {order} created");
                    Ok(None)
                })
                .await?;
                Ok(())
            }
        })
        .build()?;

    // The application's own app, with the bot's routes merged in.
    let routes = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .merge(bot.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhook/bot", listener.local_addr()?);
    let shutdown = CancellationToken::new();
    let server = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, routes)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        })
    };
    let running = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { bot.run(shutdown).await })
    };

    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let message = |event: &str, message: &str, text: &str| {
        format!(
            r#"{{"schema":"2.0","header":{{"event_id":"{event}","event_type":"im.message.receive_v1","create_time":"1700000000000","app_id":"cli_example"}},"event":{{"sender":{{"sender_id":{{"open_id":"ou_1"}},"sender_type":"user"}},"message":{{"message_id":"{message}","chat_id":"oc_1","chat_type":"p2p","message_type":"text","content":"{{\"text\":\"{text}\"}}"}}}}}}"#
        )
    };
    let callbacks = [
        ("first", message("ev_1", "om_1", "order 42")),
        ("retry", message("ev_1", "om_1", "order 42")),
        ("again", message("ev_2", "om_2", "about 42 again")),
    ];
    for (nonce, document) in callbacks {
        post_signed(&client, &url, &app, nonce, &document).await?;
        println!("{nonce}: delivered to the bot");
    }
    // Both messages handled by both handlers, or give up after a while.
    for _ in 0..200 {
        if seen.audited.load(Ordering::SeqCst) >= 2 && seen.orders.load(Ordering::SeqCst) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Time for anything that would run twice to show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    server.await??;
    running.await??;
    Ok(seen)
}

/// Posts `document` to `url` as Feishu does: encrypted and signed with `app`'s key, stamped
/// with now and `nonce`; an answer other than 2xx is an error.
pub(crate) async fn post_signed(
    client: &reqwest::Client,
    url: &str,
    app: &FeishuApp,
    nonce: &str,
    document: &str,
) -> anyhow::Result<()> {
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        .to_string();
    let (body, signature) = app.seal(document.as_bytes(), &timestamp, nonce, [9; 16]);
    let answer = client
        .post(url)
        .header("x-lark-request-timestamp", &timestamp)
        .header("x-lark-request-nonce", nonce)
        .header("x-lark-signature", signature.unwrap_or_default())
        .body(body)
        .send()
        .await?;
    anyhow::ensure!(answer.status().is_success(), "{nonce}: {}", answer.status());
    Ok(())
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seen = run(oncegate_memory::MemoryStore::new()).await?;
    println!(
        "audited {} messages, created {} order(s)",
        seen.audited.load(Ordering::SeqCst),
        seen.orders.load(Ordering::SeqCst)
    );
    Ok(())
}
