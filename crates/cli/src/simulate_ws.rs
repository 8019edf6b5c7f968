//! `oncegate simulate` for a source on the long connection: simulate is Feishu then. It serves
//! the endpoint at the source's `domain`, waits for the gateway to dial in, and pushes events
//! (with redeliveries of earlier ones) over its connections, counting the acks.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use oncegate_config::{PlatformConfig, SourceConfig};
use oncegate_feishu_ws::ClientConfig;
use oncegate_feishu_ws::local::{self, LocalFeishu};

use crate::simulate::SimulateArgs;
use crate::simulate_counts::{counts, print_admitted, print_delivered, print_end_to_end, settled};

/// How long simulate waits for the gateway to connect.
const CONNECT_WAIT: Duration = Duration::from_secs(180);
/// How long the pushes and their acks may take at most.
const RUN_LIMIT: Duration = Duration::from_secs(600);

/// Serves `source`'s endpoint and pushes the run's events over the gateway's connections.
pub(crate) async fn simulate(
    args: &SimulateArgs,
    source: &SourceConfig,
    client: &reqwest::Client,
    admin: &str,
    admin_token: Option<&str>,
) -> anyhow::Result<()> {
    let (PlatformConfig::Feishu(settings) | PlatformConfig::Lark(settings)) = &source.platform
    else {
        return crate::simulate_aibot::simulate(args, source, client, admin, admin_token).await;
    };
    let address = crate::simulate_api::address(
        source,
        settings.domain.as_deref(),
        "the long connection's endpoint",
        8181,
        "http",
    )?;
    let domain = format!("http://{address}");
    let secret = settings
        .app_secret
        .as_ref()
        .map(|s| s.resolve().map_err(anyhow::Error::msg))
        .transpose()?
        .with_context(|| format!("source {:?} needs app_secret", source.name))?;
    let config = ClientConfig {
        reconnect_count: -1,
        reconnect_interval: 2,
        reconnect_nonce: 1,
        ping_interval: 30,
    };
    let server = LocalFeishu::start_at(address, &settings.app_id, &secret, config)
        .await
        .with_context(|| format!("serve the endpoint at {domain}"))?;
    println!(
        "local Feishu at {domain}: waiting for the gateway's long connection (start `oncegate \
         serve` now; a gateway that is already retrying dials in within 10 s)"
    );
    if !server.wait_for_connections(1, CONNECT_WAIT).await {
        bail!(
            "no long connection came in {CONNECT_WAIT:?}: is `oncegate serve` running with this configuration?"
        );
    }
    // Every connection the gateway holds takes a share: wait for each one it opens.
    let wanted = settings.connections.max(1);
    if !server
        .wait_for_connections(wanted, Duration::from_secs(10))
        .await
    {
        println!(
            "only {} of the {wanted} connections came within 10 s: the run goes over those",
            server.connections().len()
        );
    }
    let connections = server.connections().len();
    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let chats = args.chats.max(1);
    let event = |i: usize| {
        local::message_event(
            &settings.app_id,
            &format!("sim{run}-{i}"),
            &format!("oc_sim{}", i % chats),
            run + i as u64,
        )
    };
    let mut plan = Vec::with_capacity(args.events * 2);
    let mut redeliveries = 0;
    for i in 0..args.events {
        plan.push((format!("m{run}-{i}"), event(i)));
        // A redelivery: the same event again, as Feishu sends one it took for unacked.
        if i > 0 && fastrand::f64() < args.duplicates {
            redeliveries += 1;
            plan.push((format!("m{run}-{i}-again"), event(fastrand::usize(..i))));
        }
    }
    let before = counts(client, admin, admin_token).await;
    let started = Instant::now();
    let window = args.concurrency.max(1) * 16;
    let driven = server.drive_at(plan, window, RUN_LIMIT, args.rate).await;
    let pushed_for = started.elapsed();
    // Acked means admitted: nothing more to wait for.
    let now = settled(client, admin, admin_token, before, 0).await;
    let until_delivered = started.elapsed();
    println!(
        "pushed             {} events ({} new, {redeliveries} redeliveries) over {connections} connection(s)",
        driven.pushed, args.events
    );
    println!("acked (code 200)   {}", driven.acked);
    if driven.failed > 0 {
        println!(
            "answered code 500  {} (not admitted: Feishu would redeliver)",
            driven.failed
        );
    }
    if driven.unacked > 0 {
        println!("never acked        {}", driven.unacked);
    }
    print_admitted(before, now);
    print_delivered(before, now, client, admin, admin_token).await;
    let seconds = driven.elapsed.max(Duration::from_millis(1)).as_secs_f64();
    println!(
        "throughput         {:.0} events/s acked over {:.2} s, {window} unacked at most",
        driven.acked as f64 / seconds,
        pushed_for.as_secs_f64()
    );
    print_end_to_end(before, now, until_delivered);
    let pct = |p: f64| {
        let latencies = &driven.latencies;
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * p) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "push to ack        p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    );
    if driven.acked + driven.failed < driven.pushed {
        bail!(
            "{} pushes were never answered",
            driven.pushed - driven.acked - driven.failed
        );
    }
    crate::simulate_counts::undelivered(before, now)
}
