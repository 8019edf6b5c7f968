//! `oncegate simulate --platform-api`: simulate is the platform's open API then. It serves
//! Feishu's (token, messages, replies, edits) or WeCom's (token, message/send) at the source's
//! `domain`, with their rate limits, and prints every message the gateway really sent — so
//! that `/send` can be tried, repeats and all, without an account.

use std::time::Duration;

use anyhow::{Context, bail};
use oncegate_config::{PlatformConfig, Secret, SourceConfig};
use oncegate_send::local::LocalFeishuApi;
use oncegate_send::local_wecom::LocalWecomApi;

/// How long a token of the local Feishu lives: Feishu's two hours.
const TOKEN_LIFETIME: Duration = Duration::from_secs(7200);
/// WeCom's calls in flight at once before 45033.
const WECOM_IN_FLIGHT: usize = 20;
/// What simulate serves here, for messages.
const API: &str = "the platform's API (and the gateway to send to it)";
/// How often new messages are printed.
const PRINT_EVERY: Duration = Duration::from_millis(100);

/// The loopback address in the source's `domain`, where simulate serves `what` (and the
/// gateway finds it); `example` is a port to suggest, `scheme` the one served (`http`, `ws`).
pub(crate) fn address<'a>(
    source: &SourceConfig,
    domain: Option<&'a str>,
    what: &str,
    example: u16,
    scheme: &str,
) -> anyhow::Result<&'a str> {
    let domain = domain.with_context(|| {
        format!(
            "source {:?}: set domain = \"{scheme}://127.0.0.1:{example}\" for simulate to serve \
             {what} there",
            source.name
        )
    })?;
    match domain
        .strip_prefix(scheme)
        .and_then(|rest| rest.strip_prefix("://"))
    {
        Some(address) => Ok(address.trim_end_matches('/')),
        None => bail!(
            "source {:?}: domain {domain:?} is not a local {scheme}:// address; simulate serves \
             plain {scheme} on loopback (e.g. {scheme}://127.0.0.1:{example})",
            source.name
        ),
    }
}

fn secret(source: &SourceConfig, secret: &Option<Secret>, field: &str) -> anyhow::Result<String> {
    secret
        .as_ref()
        .map(|s| s.resolve().map_err(anyhow::Error::msg))
        .transpose()?
        .with_context(|| format!("source {:?} sends with its {field}: set it", source.name))
}

/// Serves `source`'s platform API until SIGINT or SIGTERM, printing each message sent.
pub(crate) async fn serve(source: &SourceConfig) -> anyhow::Result<()> {
    let mut printed = 0usize;
    match &source.platform {
        PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings) => {
            let address = address(source, settings.domain.as_deref(), API, 8282, "http")?;
            let secret = secret(source, &settings.app_secret, "app_secret")?;
            let api = LocalFeishuApi::start_at(address, &settings.app_id, &secret, TOKEN_LIFETIME)
                .await
                .with_context(|| format!("serve Feishu's API at {address}"))?;
            println!(
                "local Feishu API at {}: messages sent through /send/{} are printed here \
                 (5 per second per receiver, as Feishu); Ctrl-C stops",
                api.domain(),
                source.name
            );
            let print = |printed: &mut usize| {
                let sent = api.sent();
                for message in sent.iter().skip(*printed) {
                    println!(
                        "sent to {} (uuid {}): {}",
                        message.receive_id,
                        if message.uuid.is_empty() {
                            "-"
                        } else {
                            &message.uuid
                        },
                        message.content
                    );
                }
                *printed = sent.len().max(*printed);
            };
            run(|| print(&mut printed)).await?;
            println!(
                "{printed} message{} sent; {} answered 429 (rate), {} refused",
                if printed == 1 { "" } else { "s" },
                api.limited(),
                api.refused()
            );
        }
        PlatformConfig::Wecom(settings) => {
            let address = address(source, settings.domain.as_deref(), API, 8282, "http")?;
            let secret = secret(source, &settings.secret, "secret")?;
            let api = LocalWecomApi::start_at(address, &settings.corp_id, &secret, WECOM_IN_FLIGHT)
                .await
                .with_context(|| format!("serve WeCom's API at {address}"))?;
            println!(
                "local WeCom API at {}: messages sent through /send/{} are printed here (30 per \
                 minute per member, as WeCom: beyond, WeCom answers ok and drops them); Ctrl-C \
                 stops",
                api.domain(),
                source.name
            );
            let print = |printed: &mut usize| {
                let bodies = api.bodies_from(*printed);
                for body in &bodies {
                    println!("sent: {body}");
                }
                *printed += bodies.len();
            };
            run(|| print(&mut printed)).await?;
            println!(
                "{printed} message{} sent; {} dropped by the per-member limit, {} answered 45033 \
                 (busy)",
                if printed == 1 { "" } else { "s" },
                api.dropped(),
                api.busy()
            );
        }
        PlatformConfig::Wechat(_)
        | PlatformConfig::WecomAibot(_)
        | PlatformConfig::WecomSuite(_)
        | PlatformConfig::Webhook(_)
        | PlatformConfig::Dingtalk(_) => bail!(
            "source {:?}: /send sends as Feishu, Lark and WeCom apps only",
            source.name
        ),
    }
    Ok(())
}

/// Calls `print` every [`PRINT_EVERY`] until SIGINT or SIGTERM, and once more at the end.
async fn run(mut print: impl FnMut()) -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listen for SIGTERM")?;
    let mut tick = tokio::time::interval(PRINT_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => print(),
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    print();
    Ok(())
}
