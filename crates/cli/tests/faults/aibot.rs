//! The fault suite's WeCom AI-bot rows: the bot's long connection through the binary, where
//! WeCom never sends a callback again — what the gateway does not take or answer is gone.
//!
//! - Slow replies with a cut connection: more replies waiting on their handlers than run at once
//!   (64), the connection cut while they wait; every callback's handler runs once and its answer
//!   reaches WeCom once, on the connection dialled after the cut.
//! - A flood past `dispatcher.max_queued`: the callbacks are admitted over the bound (counted),
//!   none refused and lost, each delivered once in chat order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oncegate_wecom_ws::frame;
use oncegate_wecom_ws::local::{self, LocalAiBot};

use super::{CHATS, Row, check, per_chat};
use crate::e2e::{Downstream, Gateway, SECRET};

const BOT: &str = "aibFAULTBOTID00000000000000000000";
const BOT_SECRET: &str = "fault-bot-secret";

/// A gateway holding the bot's connection, its events to `sink` (`reply`: the handler's
/// answer is the bot's reply; `extra`: more of the file).
fn config(
    dir: &Path,
    bot: &LocalAiBot,
    sink: std::net::SocketAddr,
    reply: bool,
    extra: &str,
) -> PathBuf {
    let path = dir.join("oncegate.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[store]
backend = "embedded"
path = "{store}"
partitions = 8

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

{extra}

[[source]]
name = "bot"
platform = "wecom-aibot"
bot_id = "{BOT}"
secret = "{BOT_SECRET}"
domain = "{domain}"

[[route]]
events = ["*"]
sink = "http"
url = "http://{sink}/events"
secret = "{SECRET}"
timeout = "30s"
reply = {reply}
"#,
            store = dir.join("store").display(),
            domain = bot.url(),
        ),
    )
    .expect("config");
    path
}

/// Message `i` of chat `chat`: its id names both, as the checker reads them.
fn message(prefix: &str, chat: usize, i: usize) -> serde_json::Value {
    local::text_message(
        BOT,
        &format!("{prefix}-{chat}-{i}"),
        Some(&format!("wr{prefix}{chat}")),
        "zhangsan",
        "hi",
    )
}

/// Finished replies WeCom received, by the `req_id` they answer.
fn finished_by_req(bot: &LocalAiBot) -> HashMap<String, usize> {
    let mut finished = HashMap::new();
    for frame in bot.received() {
        let body = &frame["body"];
        if body["stream"]["finish"] == true {
            let req = frame["headers"]["req_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            *finished.entry(req).or_default() += 1;
        }
    }
    finished
}

/// Adds the replies to the row: a callback handled but never answered on the wire is lost, one
/// answered more than once went out twice.
fn with_replies(mut row: Row, bot: &LocalAiBot, req_ids: &[String]) -> Row {
    let finished = finished_by_req(bot);
    for req_id in req_ids {
        match finished.get(req_id).copied().unwrap_or(0) {
            0 => row.lost += 1,
            1 => {}
            n => row.twice += n - 1,
        }
    }
    row
}

/// 80 chats, two messages each, every handler taking 2 s: 64 run at once, the rest wait; the
/// connection is cut a second in.
pub(super) async fn slow_replies_and_a_cut() -> Row {
    const CHAT_COUNT: usize = 80;
    let bot = LocalAiBot::start(BOT, BOT_SECRET).await.expect("bot");
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    {
        let mut behavior = downstream.behavior.lock().expect("behavior");
        behavior.delay = Duration::from_secs(2);
        behavior.reply = true;
    }
    let _gateway = Gateway::run(&config(dir.path(), &bot, addr, true, ""));
    assert!(bot.wait_for_subscribes(1, Duration::from_secs(15)).await);
    let mut req_ids = Vec::new();
    let mut acked = Vec::new();
    for i in 0..2 {
        for chat in 0..CHAT_COUNT {
            let body = message("ai", chat, i);
            let id = body["msgid"].as_str().unwrap_or_default().to_owned();
            req_ids.push(bot.push(frame::MESSAGE, &body));
            acked.push(id);
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    bot.drop_connection();
    assert!(bot.wait_for_subscribes(2, Duration::from_secs(10)).await);
    let over = Instant::now();
    let row = check(
        "AI bot: 160 replies of 2 s (64 at once), connection cut while they wait",
        |row| row.seen >= 1,
        &downstream,
        &acked,
        0,
        over,
    )
    .await;
    // The answers of the last handlers are on their way when the last one arrived.
    let deadline = Instant::now() + Duration::from_secs(10);
    while finished_by_req(&bot).len() < req_ids.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut row = with_replies(row, &bot, &req_ids);
    row.seen = bot.subscribes().len() - 1;
    row.sent = req_ids.len();
    row
}

/// 720 callbacks at once into a queue bound of 20, the handler 5 ms each: admitted over the
/// bound, never refused.
pub(super) async fn flood_past_the_bound() -> Row {
    let bot = LocalAiBot::start(BOT, BOT_SECRET).await.expect("bot");
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(5);
    let config = config(
        dir.path(),
        &bot,
        addr,
        false,
        "[dispatcher]\nmax_queued = 20\nconcurrency = 4",
    );
    let gateway = Gateway::run(&config);
    assert!(bot.wait_for_subscribes(1, Duration::from_secs(15)).await);
    let mut acked = Vec::new();
    for i in 0..per_chat() {
        for chat in 0..CHATS {
            let body = message("fl", chat, i);
            acked.push(body["msgid"].as_str().unwrap_or_default().to_owned());
            bot.push(frame::MESSAGE, &body);
        }
    }
    let over = Instant::now();
    let mut row = check(
        "AI bot: 720 callbacks at once past max_queued = 20",
        |row| row.seen >= 1,
        &downstream,
        &acked,
        0,
        over,
    )
    .await;
    row.seen =
        crate::support::metric(&gateway.admin, "oncegate_admitted_over_bound_total").await as usize;
    row
}
