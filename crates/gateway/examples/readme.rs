//! The README's library example, whole: `cargo run -p oncegate-gateway --example readme`
//! serves a Feishu bot on 127.0.0.1:8090 (`ONCEGATE_EXAMPLE_LISTEN` for another address; the
//! demo gateway has 8080) until Ctrl-C, printing what its handlers log. The tests run it and
//! check that the README shows it as it is here.

use std::sync::atomic::{AtomicU32, Ordering};

use oncegate_core::Event;

/// Orders created, for the tests.
pub(crate) static ORDERS: AtomicU32 = AtomicU32::new(0);

async fn create_order(text: &str) -> Result<Option<bytes::Bytes>, oncegate_gateway::SinkError> {
    ORDERS.fetch_add(1, Ordering::SeqCst);
    println!("order created for {text:?}");
    Ok(None)
}

async fn audit(event: &Event) -> Result<(), oncegate_gateway::SinkError> {
    println!("{} {}", event.event_type, event.event_id);
    Ok(())
}

// README:start
use oncegate_feishu::{Cloud, FeishuApp, events::MessageReceived};
use oncegate_gateway::bot::{Bot, Ctx};
use oncegate_memory::MemoryStore;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) async fn serve(
    listener: TcpListener,
    key: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let app = FeishuApp::new(Cloud::Feishu, "cli_a1", Some(key), None)?;
    let bot = Bot::builder(MemoryStore::new()) // or an EmbeddedStore, a RedisStore
        .source("bot", app) // POST /webhook/bot
        .on_typed(|message: MessageReceived, ctx: Ctx| async move {
            let text = message.message.text().unwrap_or_default();
            // Two messages meaning the same order create it once, on every instance.
            ctx.once(&format!("order:{text}"), || create_order(&text))
                .await?;
            Ok(())
        })
        .on("im.chat.member.*", |ctx: Ctx| async move {
            audit(ctx.event()).await
        })
        .build()?;
    bot.serve(listener, stop).await?; // or: your_app.merge(bot.router()) beside bot.run(stop)
    Ok(())
}
// README:end

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let ctrl_c = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        ctrl_c.cancel();
    });
    // A handler's failure (an event it could not read, an error it answered) is logged: a
    // library logs through `tracing`, and an application that installs no subscriber sees
    // nothing.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ONCEGATE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    let key = std::env::var("FEISHU_ENCRYPT_KEY").unwrap_or_else(|_| "example-key".into());
    let at = std::env::var("ONCEGATE_EXAMPLE_LISTEN").unwrap_or_else(|_| "127.0.0.1:8090".into());
    let listener = TcpListener::bind(&at).await.map_err(|error| {
        anyhow::anyhow!(
            "cannot listen on {at}: {error}; set ONCEGATE_EXAMPLE_LISTEN to a free address, \
             e.g. ONCEGATE_EXAMPLE_LISTEN=127.0.0.1:8091"
        )
    })?;
    println!("the README's bot: POST http://{at}/webhook/bot (Ctrl-C stops it)");
    serve(listener, key, stop).await
}
