//! `oncegate simulate`: signed, encrypted platform traffic (through the source's sealer) with
//! duplicates and replays, against a running gateway; the demo and the load generator.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use oncegate_core::{SealedRequest, Sealer, SyntheticMembership, SyntheticMessage};
use tokio::sync::Mutex;

use crate::simulate_counts::{counts, print_admitted, print_delivered, settled, undelivered};

/// Options of `oncegate simulate`.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// The gateway's configuration (for the source's app id and secrets, and the addresses).
    #[arg(
        long,
        env = "ONCEGATE_CONFIG",
        default_value = "examples/oncegate.toml"
    )]
    config: std::path::PathBuf,
    /// Which sources to send as, comma-separated: events are spread over them, so several
    /// corps or apps with the same chat ids get traffic at once (default: the first source).
    #[arg(long, value_delimiter = ',')]
    source: Vec<String>,
    /// The gateway's base URL (default: from server.listen).
    #[arg(long)]
    url: Option<String>,
    /// The admin base URL, to read delivered counts (default: from server.admin_listen).
    #[arg(long)]
    admin: Option<String>,
    /// Distinct events to send.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) events: usize,
    /// Share of extra sends that repeat an earlier event with a fresh signature (platform retries).
    #[arg(long, default_value_t = 0.2)]
    pub(crate) duplicates: f64,
    /// Share of extra sends that replay an earlier request byte for byte (same nonce).
    #[arg(long, default_value_t = 0.02)]
    replays: f64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub(crate) concurrency: usize,
    /// Chats the events are spread over.
    #[arg(long, default_value_t = 100)]
    pub(crate) chats: usize,
    /// Send group member changes instead of messages (platforms that report them): each
    /// member joins and leaves within one second, and half the pairs arrive leave first.
    #[arg(long)]
    membership: bool,
    /// Requests per second at most, to watch a steady stream (0: as fast as the gateway takes them).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) rate: f64,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Play the platform's open API instead (Feishu, Lark or WeCom, at the source's `domain`):
    /// the gateway's `/send/<source>` sends to it, and every message it really sent is printed,
    /// until Ctrl-C.
    #[arg(long)]
    platform_api: bool,
}

enum Send {
    New(usize),
    Retry(usize),
    Replay(usize),
}

#[derive(Default)]
struct Tally {
    accepted: usize,
    replays_rejected: usize,
    other: std::collections::BTreeMap<u16, usize>,
    failed: usize,
    latencies_us: Vec<u64>,
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn message(run: u64, i: usize, chats: usize) -> SyntheticMessage {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    SyntheticMessage {
        id: format!("sim{run}-{i}"),
        chat: format!("oc_sim{}", i % chats.max(1)),
        sender: format!("ou_{}", i % 997),
        text: format!("simulated message {i}"),
        created_ms: now_ms + i as u64,
    }
}

/// Change `i` of `events`: events 2k and 2k+1 are member k joining and leaving chat k mod
/// `chats`, in one second, each moving the chat's version one step along its chain. Pair k is
/// stamped k seconds after the first, the last one second before the run began: none in the
/// future (a gateway takes a time beyond its skew as a forgery).
fn membership(run: u64, i: usize, chats: usize, events: usize) -> SyntheticMembership {
    let chats = chats.max(1);
    let pair = i / 2;
    let pairs = events.div_ceil(2).max(1) as u64;
    let chat = pair % chats;
    let step = (pair / chats) * 2 + i % 2;
    SyntheticMembership {
        chat: format!("wr_sim{chat}"),
        member: format!("wm_sim{run}_{pair}"),
        joined: i.is_multiple_of(2),
        created_ms: (run / 1000)
            .saturating_sub(pairs)
            .saturating_add(pair as u64)
            * 1000,
        before: format!("{run:x}{chat}v{step}"),
        after: format!("{run:x}{chat}v{}", step + 1),
    }
}

/// Where events go: a source's sealer and its webhook URL.
struct Target {
    sealer: Arc<dyn Sealer>,
    url: String,
}

/// What one run sends: messages, or member changes.
#[derive(Clone, Copy)]
struct Traffic {
    run: u64,
    chats: usize,
    /// Events in the run.
    events: usize,
    membership: bool,
}

impl Traffic {
    /// Event `i`'s plaintext.
    fn plaintext(self, sealer: &dyn Sealer, i: usize) -> Vec<u8> {
        let change = self
            .membership
            .then(|| sealer.membership(&membership(self.run, i, self.chats, self.events)))
            .flatten();
        change.unwrap_or_else(|| sealer.message(&message(self.run, i, self.chats)))
    }
}

/// A fresh request for event `i`: a new timestamp and nonce every time, as a platform retry.
fn seal(sealer: &dyn Sealer, traffic: Traffic, i: usize) -> SealedRequest {
    let nonce = format!("{:016x}", fastrand::u64(..));
    let mut iv = [0u8; 16];
    fastrand::fill(&mut iv);
    sealer.seal(&traffic.plaintext(sealer, i), unix_secs(), &nonce, iv)
}

pub(crate) async fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = crate::load(Some(&args.config))?;
    let sources: Vec<&oncegate_config::SourceConfig> = if args.source.is_empty() {
        config.sources.first().into_iter().collect()
    } else {
        args.source
            .iter()
            .map(|name| {
                config
                    .sources
                    .iter()
                    .find(|s| &s.name == name)
                    .with_context(|| format!("no source {name:?} in {}", args.config.display()))
            })
            .collect::<anyhow::Result<_>>()?
    };
    if sources.is_empty() {
        bail!("no source in {}", args.config.display());
    }
    if args.platform_api {
        let [source] = sources.as_slice() else {
            bail!("--platform-api plays one source's API: name it with --source");
        };
        return crate::simulate_api::serve(source).await;
    }
    let secret = |s: &Option<oncegate_config::Secret>| -> anyhow::Result<Option<String>> {
        s.as_ref()
            .map(|s| s.resolve().map_err(anyhow::Error::msg))
            .transpose()
    };
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.server.listen));
    let admin = args
        .admin
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.server.admin_listen));
    let admin_token = secret(&config.server.admin_token)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(30))
        .build()?;
    if let [source] = sources.as_slice()
        && oncegate_gateway::registry::is_long_connection(source)
    {
        return crate::simulate_ws::simulate(
            &args,
            source,
            &client,
            &admin,
            admin_token.as_deref(),
        )
        .await;
    }
    if let Some(source) = sources
        .iter()
        .find(|source| oncegate_gateway::registry::is_long_connection(source))
    {
        bail!(
            "source {:?} is on the long connection: simulate it on its own (--source {})",
            source.name,
            source.name
        );
    }
    let targets: Vec<Target> = sources
        .iter()
        .map(|source| {
            Ok(Target {
                sealer: oncegate_gateway::registry::sealer(source)?,
                url: format!("{base}/webhook/{}", source.name),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let targets = Arc::new(targets);

    // The plan: every event once, plus retries and replays of earlier ones, shuffled a little.
    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let traffic = Traffic {
        run,
        chats: args.chats,
        events: args.events,
        membership: args.membership,
    };
    for (source, target) in sources.iter().zip(targets.iter()) {
        if args.membership
            && target
                .sealer
                .membership(&membership(run, 0, args.chats, args.events))
                .is_none()
        {
            bail!(
                "source {:?}: its platform reports no member changes",
                source.name
            );
        }
    }
    let mut plan = Vec::with_capacity(args.events * 2);
    let mut swapped = false;
    for i in 0..args.events {
        // Out of order: half the pairs leave before they join.
        let i = if !args.membership {
            i
        } else if i.is_multiple_of(2) {
            swapped = i + 1 < args.events && fastrand::bool();
            if swapped { i + 1 } else { i }
        } else if swapped {
            i - 1
        } else {
            i
        };
        plan.push(Send::New(i));
        if i > 0 && fastrand::f64() < args.duplicates {
            plan.push(Send::Retry(fastrand::usize(..i)));
        }
        if i > 0 && fastrand::f64() < args.replays {
            plan.push(Send::Replay(fastrand::usize(..i)));
        }
    }
    let total = plan.len();
    let plan = Arc::new(plan);
    let sent: Arc<Vec<Mutex<Option<SealedRequest>>>> =
        Arc::new((0..args.events).map(|_| Mutex::new(None)).collect());
    let before = counts(&client, &admin, admin_token.as_deref()).await;
    let progress = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(total as u64)
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} requests  {per_sec}  eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let rate = args.rate;
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (plan, sent, next, tally, client, targets, progress) = (
            plan.clone(),
            sent.clone(),
            next.clone(),
            tally.clone(),
            client.clone(),
            targets.clone(),
            progress.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(step) = plan.get(index) else { break };
                if rate > 0.0 {
                    let at = started + Duration::from_secs_f64(index as f64 / rate);
                    tokio::time::sleep_until(at.into()).await;
                }
                let (Send::New(i) | Send::Retry(i) | Send::Replay(i)) = *step;
                // A member's join and leave go to one source, so that they share its chain.
                let Target { sealer, url } = &targets[(i / 2) % targets.len()];
                let request = match *step {
                    Send::New(i) => {
                        let request = seal(sealer.as_ref(), traffic, i);
                        *sent[i].lock().await = Some(request.clone());
                        request
                    }
                    Send::Retry(i) => match sent[i].lock().await.as_ref() {
                        // A platform retry: the same event, signed again.
                        Some(_) => seal(sealer.as_ref(), traffic, i),
                        None => continue,
                    },
                    Send::Replay(i) => match sent[i].lock().await.clone() {
                        Some(request) => request,
                        None => continue,
                    },
                };
                let target = match &request.query {
                    Some(query) => format!("{url}?{query}"),
                    None => url.clone(),
                };
                let mut builder = match request.method {
                    oncegate_core::Method::Get => client.get(target),
                    oncegate_core::Method::Post => client.post(target),
                };
                for (name, value) in &request.headers {
                    builder = builder.header(*name, value);
                }
                let at = Instant::now();
                let outcome = builder.body(request.body).send().await;
                let micros = at.elapsed().as_micros() as u64;
                let mut tally = tally.lock().await;
                tally.latencies_us.push(micros);
                match outcome {
                    Ok(response) => {
                        // How an accepted event was taken (new, duplicate, spooled) comes from
                        // the gateway's counters: not every platform's answer says.
                        match response.status().as_u16() {
                            200 => tally.accepted += 1,
                            409 => tally.replays_rejected += 1,
                            other => *tally.other.entry(other).or_default() += 1,
                        }
                        let _ = response.bytes().await;
                    }
                    Err(_) => tally.failed += 1,
                }
                progress.inc(1);
            }
        }));
    }
    for worker in workers {
        worker.await?;
    }
    let elapsed = started.elapsed();
    progress.finish_and_clear();
    let mut tally = Arc::try_unwrap(tally)
        .map_err(|_| anyhow::anyhow!("workers still running"))?
        .into_inner();
    if tally.latencies_us.is_empty() {
        bail!("nothing was sent");
    }
    tally.latencies_us.sort_unstable();
    let pct = |p: f64| {
        tally.latencies_us[((tally.latencies_us.len() - 1) as f64 * p) as usize] as f64 / 1000.0
    };
    // A webhook's answer comes after its admission: nothing more to wait for.
    let now = settled(&client, &admin, admin_token.as_deref(), before, 0).await;
    let sent_count = tally.latencies_us.len();
    println!(
        "sent               {sent_count} requests ({} events, {} retries, {} replays planned)",
        args.events,
        plan.iter().filter(|s| matches!(s, Send::Retry(_))).count(),
        plan.iter().filter(|s| matches!(s, Send::Replay(_))).count()
    );
    println!("accepted (200)     {}", tally.accepted);
    print_admitted(before, now);
    // The gateway's own count: WeCom and WeChat answer a replay as a duplicate (200), so the
    // answers alone undercount it.
    match (before, now) {
        (Some(before), Some(now)) => println!(
            "replays rejected   {}",
            now.replays_rejected.saturating_sub(before.replays_rejected)
        ),
        _ => println!(
            "replays rejected   {} (answered 409)",
            tally.replays_rejected
        ),
    }
    for (status, count) in &tally.other {
        println!("answered {status}       {count}");
    }
    if tally.failed > 0 {
        println!("failed to send     {}", tally.failed);
    }
    print_delivered(before, now, &client, &admin, admin_token.as_deref()).await;
    println!(
        "throughput         {:.0} requests/s over {:.2} s, {} in flight",
        sent_count as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64(),
        args.concurrency
    );
    println!(
        "latency            p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    );
    // A demo that reached nothing must not look like a success to a script.
    let refused = tally.other.get(&401).copied().unwrap_or(0);
    if sent_count > 0
        && tally.accepted == 0
        && refused > 0
        && refused + tally.replays_rejected == sent_count
    {
        anyhow::bail!(
            "every request was refused 401 (a signature or token the gateway does not take): \
             the source's secrets in this file are not the gateway's; start the gateway with \
             the same file, or point --config at the gateway's"
        );
    }
    if sent_count > 0 && tally.accepted == 0 {
        anyhow::bail!(
            "no request was accepted ({} failed to send, {} answered otherwise): is the gateway \
             running and listening where server.listen says?",
            tally.failed,
            tally.other.values().sum::<usize>()
        );
    }
    undelivered(before, now)
}
