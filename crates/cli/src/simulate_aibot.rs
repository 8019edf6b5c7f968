//! `oncegate simulate` for a WeCom AI bot: simulate is WeCom's long-connection server then. It
//! serves at the source's `domain`, waits for the gateway to subscribe, and pushes messages
//! (with repeats of earlier ones under new `req_id`s, as WeCom was seen to send while a reply was
//! pending); halfway through it takes the bot over as if a client elsewhere had subscribed, and
//! the gateway, holding the bot's lease, subscribes again.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use oncegate_config::{PlatformConfig, SourceConfig};
use oncegate_wecom_ws::frame;
use oncegate_wecom_ws::local::{self, LocalAiBot};

use crate::simulate::SimulateArgs;
use crate::simulate_counts::{counts, print_admitted, print_delivered, print_end_to_end, settled};

/// How long simulate waits for the gateway to subscribe.
const CONNECT_WAIT: Duration = Duration::from_secs(180);
/// How long the gateway may take to subscribe again after the takeover.
const RESUBSCRIBE_WAIT: Duration = Duration::from_secs(30);

/// Serves the bot's long connection and pushes the run's messages to the gateway.
pub(crate) async fn simulate(
    args: &SimulateArgs,
    source: &SourceConfig,
    client: &reqwest::Client,
    admin: &str,
    admin_token: Option<&str>,
) -> anyhow::Result<()> {
    let PlatformConfig::WecomAibot(settings) = &source.platform else {
        bail!(
            "source {:?}: simulate plays the long connections of Feishu, Lark and WeCom AI \
             bots, not DingTalk's Stream mode; simulate the app's HTTP event subscription \
             instead (a source with transport = \"webhook\")",
            source.name
        );
    };
    let address = crate::simulate_api::address(
        source,
        settings.domain.as_deref(),
        "the AI bot's long connection",
        8181,
        "ws",
    )?;
    let secret = settings
        .secret
        .as_ref()
        .map(|s| s.resolve().map_err(anyhow::Error::msg))
        .transpose()?
        .with_context(|| format!("source {:?} needs secret", source.name))?;
    let at = address
        .parse()
        .with_context(|| format!("domain ws://{address}: not an IP address and port"))?;
    let server = LocalAiBot::start_at(at, &settings.bot_id, &secret)
        .await
        .with_context(|| format!("serve the long connection at ws://{address}"))?;
    println!(
        "local WeCom AI-bot server at {}: waiting for the gateway to subscribe (start `oncegate \
         serve` now; a gateway that is already retrying subscribes within 30 s)",
        server.url()
    );
    if !server.wait_for_subscribes(1, CONNECT_WAIT).await {
        bail!(
            "no subscribe came in {CONNECT_WAIT:?}: is `oncegate serve` running with this configuration?"
        );
    }
    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let chats = args.chats.max(1);
    let message = |i: usize| {
        local::text_message(
            &settings.bot_id,
            &format!("sim{run}-{i}"),
            Some(&format!("wrsim{}", i % chats)),
            &format!("user{}", i % 7),
            &format!("message {i}"),
        )
    };
    let before = counts(client, admin, admin_token).await;
    let started = Instant::now();
    let mut repeats = 0;
    let pause = (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate));
    for i in 0..args.events {
        server.push(frame::MESSAGE, &message(i));
        if i > 0 && fastrand::f64() < args.duplicates {
            repeats += 1;
            server.push(frame::MESSAGE, &message(fastrand::usize(..i)));
        }
        if i == args.events / 2 {
            server.take_over_from_elsewhere();
            if !server.wait_for_subscribes(2, RESUBSCRIBE_WAIT).await {
                bail!(
                    "the gateway did not subscribe again within {RESUBSCRIBE_WAIT:?} of a takeover"
                );
            }
        }
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
    }
    // Pushed is not admitted yet: the gateway reads the frames after simulate wrote them.
    let now = settled(client, admin, admin_token, before, args.events as u64).await;
    let elapsed = started.elapsed();
    println!(
        "pushed             {} messages ({} new, {repeats} repeats under new req_ids)",
        args.events + repeats,
        args.events
    );
    println!(
        "subscribes         {} (one takeover halfway; the gateway held the bot's lease and subscribed again)",
        server.subscribes().len()
    );
    if server.waiting() > 0 {
        println!(
            "never delivered    {} (no subscribed connection)",
            server.waiting()
        );
    }
    print_admitted(before, now);
    print_delivered(before, now, client, admin, admin_token).await;
    print_end_to_end(before, now, elapsed);
    // A demo whose messages did not all arrive must not look like a success to a script.
    if let (Some(before), Some(now)) = (before, now) {
        let (admitted, _, _) = now.since(&before);
        if admitted < args.events as u64 {
            bail!(
                "{admitted} of {} new messages admitted when nothing had moved for 10 s: see the \
                 gateway's log and GET /admin/stats",
                args.events
            );
        }
    }
    crate::simulate_counts::undelivered(before, now)
}
