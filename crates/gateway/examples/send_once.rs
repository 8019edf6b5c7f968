//! Sending once from Rust: a Feishu message sent by several callers under one key (a job that
//! retries, two workers that raced) goes out once, and every caller gets its answer.
//!
//! `cargo run -p oncegate-gateway --example send_once` runs it against a local Feishu-like API
//! server (the one oncegate's tests use), so it needs no Feishu app.

use std::sync::Arc;
use std::time::Duration;

use oncegate_feishu::{Cloud, FeishuApp};
use oncegate_gateway::bot::{Bot, SendOptions};
use oncegate_memory::MemoryStore;
use oncegate_send::local::LocalFeishuApi;
use oncegate_send::{Api, FeishuApi};
use serde_json::json;

/// Sends one confirmation from `callers` callers at once; answers how many messages the
/// platform got, and how many callers got the first send's answer from its key.
pub(crate) async fn run(callers: usize) -> anyhow::Result<(usize, usize)> {
    let platform =
        LocalFeishuApi::start("cli_shop", "shop-secret", Duration::from_secs(7200)).await?;
    let api = FeishuApi::new(
        &platform.domain(),
        "cli_shop",
        "shop-secret",
        Duration::from_secs(5),
    )?;
    let app = FeishuApp::new(Cloud::Feishu, "cli_shop", Some("encrypt-key".into()), None)?;
    let bot = Arc::new(
        Bot::builder(MemoryStore::new())
            .source("shop", app)
            .sender("shop", Api::Feishu(api))
            .build()?,
    );
    let message = json!({
        "receive_id": "oc_orders",
        "msg_type": "text",
        "content": {"text": "order 42 is confirmed"},
    });
    let mut sends = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (bot, message) = (bot.clone(), message.clone());
        sends.spawn(async move {
            bot.send(
                "shop",
                "order-42-confirmed",
                message,
                SendOptions::default(),
            )
            .await
        });
    }
    let mut replayed = 0;
    while let Some(sent) = sends.join_next().await {
        let sent = sent??;
        anyhow::ensure!(sent.status == 200, "the platform answered {}", sent.status);
        replayed += usize::from(sent.replayed);
    }
    Ok((platform.sent().len(), replayed))
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (messages, replayed) = run(5).await?;
    println!("5 callers: {messages} message sent, {replayed} callers got its answer from the key");
    Ok(())
}
