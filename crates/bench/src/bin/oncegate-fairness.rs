//! `oncegate-fairness`: how long quiet tenants wait while another floods. It serves the slow
//! downstream the gateway's route posts to (each delivery answered after `--downstream-ms`),
//! sends `--quiet` tenants' events at `--rate` each per second (each tenant its own chat), and
//! measures each event's delivery latency (from its creation, stamped when it is sealed, to
//! the downstream's answer). Two phases in one run, side by side: the quiet tenants alone, then
//! the quiet tenants while one tenant floods `--flood` events over `--flood-chats` chats as
//! fast as the gateway takes them. It prints the quiet tenants' p50 and p99 in each phase,
//! their ratio, and how far the flood got.
//!
//! `oncegate-fairness --config bench.toml --downstream 127.0.0.1:9700`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Parser;
use oncegate_core::{Sealer, SyntheticMessage};

/// Options.
#[derive(Debug, Parser)]
struct Args {
    /// The gateway's configuration: the source's secrets, and the address it listens on.
    #[arg(long)]
    config: std::path::PathBuf,
    /// Where to serve the downstream the gateway's route posts to (`host:port`).
    #[arg(long)]
    downstream: String,
    /// How long the downstream takes to answer each delivery.
    #[arg(long, default_value_t = 100)]
    downstream_ms: u64,
    /// Quiet tenants.
    #[arg(long, default_value_t = 99)]
    quiet: usize,
    /// Events per second each quiet tenant sends.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Seconds the quiet tenants send before the first phase, not measured.
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Seconds each phase lasts.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// The flooding tenant's events.
    #[arg(long, default_value_t = 20_000)]
    flood: usize,
    /// The chats the flood is spread over.
    #[arg(long, default_value_t = 200)]
    flood_chats: usize,
    /// Connections the flood is sent over.
    #[arg(long, default_value_t = 16)]
    flood_connections: usize,
    /// Where the gateways listen (`host:port`, repeated: events go to each in turn, as a
    /// platform reaches any instance behind its one URL); the configuration's own address
    /// when none is given.
    #[arg(long = "gateway")]
    gateways: Vec<String>,
    /// How long, at most, to wait for the quiet tenants' last events after the flooded phase
    /// (they may wait behind the whole flood): each one counts, none is left out of the p99.
    #[arg(long, default_value_t = 600)]
    drain_seconds: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What reached the downstream: each event's tenant and latency (ms), by arrival.
#[derive(Default)]
struct Arrivals {
    seen: Vec<(String, u64, u64)>,
}

/// The slow downstream: records each delivery's tenant and latency, then answers late.
async fn downstream(
    listen: &str,
    delay: Duration,
    arrivals: Arc<Mutex<Arrivals>>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let app = axum::Router::new().fallback(move |body: axum::body::Bytes| {
        let arrivals = arrivals.clone();
        async move {
            // Delivered when the downstream is done with it: its own time counts, as a
            // receiver sees it.
            tokio::time::sleep(delay).await;
            let now = unix_ms();
            if let Ok(envelope) = serde_json::from_slice::<serde_json::Value>(&body) {
                let tenant = envelope["owner"]["tenant"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                let created = envelope["created_at_ms"].as_u64().unwrap_or(now);
                arrivals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .seen
                    .push((tenant, now.saturating_sub(created), now));
            }
            axum::http::StatusCode::OK
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(())
}

/// Sends signed events of one source.
struct Sender {
    sealer: Arc<dyn Sealer>,
    urls: Vec<String>,
    next: std::sync::atomic::AtomicUsize,
    client: reqwest::Client,
}

impl Sender {
    /// Seals and posts one event of `tenant` in `chat`, created now: the answer's status, and
    /// how long the answer took (ms).
    async fn send(&self, tenant: &str, chat: &str, id: &str) -> (u16, u64) {
        let asked = Instant::now();
        let status = self.post(tenant, chat, id).await;
        (status, asked.elapsed().as_millis() as u64)
    }

    async fn post(&self, tenant: &str, chat: &str, id: &str) -> u16 {
        let created_ms = unix_ms();
        let message = SyntheticMessage {
            id: id.to_owned(),
            chat: chat.to_owned(),
            sender: format!("ou_{tenant}"),
            text: "hello".into(),
            created_ms,
        };
        let mut document: serde_json::Value =
            match serde_json::from_slice(&self.sealer.message(&message)) {
                Ok(document) => document,
                Err(_) => return 0,
            };
        document["header"]["tenant_key"] = serde_json::Value::String(tenant.to_owned());
        let plain = document.to_string().into_bytes();
        let nonce = format!("{:016x}", fastrand::u64(..));
        let iv: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        let sealed = self.sealer.seal(&plain, created_ms / 1000, &nonce, iv);
        let turn = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut url = self.urls[turn % self.urls.len()].clone();
        if let Some(query) = &sealed.query {
            url = format!("{url}?{query}");
        }
        let mut request = self.client.post(url).body(sealed.body.clone());
        for (name, value) in &sealed.headers {
            request = request.header(*name, value.as_str());
        }
        match request.send().await {
            Ok(answer) => answer.status().as_u16(),
            Err(_) => 0,
        }
    }
}

/// The quiet tenants, each sending at `rate` until `until`, each event in its own chat.
async fn quiet(
    sender: Arc<Sender>,
    tenants: usize,
    rate: f64,
    until: Instant,
    phase: &str,
) -> (usize, Vec<u64>) {
    let every = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..tenants {
        let (sender, phase) = (sender.clone(), phase.to_owned());
        tasks.spawn(async move {
            // Spread over the first interval, so that they do not all send at once.
            tokio::time::sleep(every.mul_f64(t as f64 / tenants.max(1) as f64)).await;
            let mut sent = 0;
            let mut answers = Vec::new();
            let mut tick = tokio::time::interval(every);
            while Instant::now() < until {
                tick.tick().await;
                let id = format!("{phase}-quiet{t}-{sent}");
                let (status, took) = sender
                    .send(&format!("quiet{t:03}"), &format!("oc_quiet{t}"), &id)
                    .await;
                answers.push(took);
                if status == 200 {
                    sent += 1;
                }
            }
            (sent, answers)
        });
    }
    let (mut total, mut answers) = (0, Vec::new());
    while let Some(done) = tasks.join_next().await {
        if let Ok((sent, took)) = done {
            total += sent;
            answers.extend(took);
        }
    }
    (total, answers)
}

/// The flooding tenant: `events` over `chats` chats on `connections` senders, as fast as taken.
async fn flood(sender: Arc<Sender>, events: usize, chats: usize, connections: usize) -> usize {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections.max(1) {
        let (sender, next) = (sender.clone(), next.clone());
        tasks.spawn(async move {
            let mut admitted = 0;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= events {
                    return admitted;
                }
                let chat = format!("oc_flood{}", i % chats.max(1));
                // A 503 (the tenant's queue bound) is sent again, as the platform would.
                loop {
                    match sender.send("flood", &chat, &format!("flood-{i}")).await.0 {
                        200 => {
                            admitted += 1;
                            break;
                        }
                        503 => tokio::time::sleep(Duration::from_millis(50)).await,
                        _ => break,
                    }
                }
            }
        });
    }
    let mut total = 0;
    while let Some(admitted) = tasks.join_next().await {
        total += admitted.unwrap_or(0);
    }
    total
}

/// The `p`th percentile of `values` (sorted here), in ms.
fn percentile(values: &mut [u64], p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}

/// The quiet tenants' latencies among arrivals from `from` on.
fn quiet_latencies(arrivals: &Mutex<Arrivals>, from: usize) -> Vec<u64> {
    arrivals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .seen
        .iter()
        .skip(from)
        .filter(|(tenant, _, _)| tenant.starts_with("quiet"))
        .map(|(_, latency, _)| *latency)
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = oncegate_config::load(Some(&args.config), std::env::vars())
        .context("read the configuration")?;
    let Some(source) = config.sources.first() else {
        bail!("the configuration has no source");
    };
    let sealer = oncegate_gateway::registry::sealer(source)?;
    let sender = Arc::new(Sender {
        sealer,
        urls: if args.gateways.is_empty() {
            vec![config.server.listen.to_string()]
        } else {
            args.gateways.clone()
        }
        .iter()
        .map(|listen| format!("http://{listen}/webhook/{}", source.name))
        .collect(),
        next: std::sync::atomic::AtomicUsize::new(0),
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(30))
            .build()?,
    });
    let arrivals = Arc::new(Mutex::new(Arrivals::default()));
    downstream(
        &args.downstream,
        Duration::from_millis(args.downstream_ms),
        arrivals.clone(),
    )
    .await?;
    let phase = Duration::from_secs(args.seconds);

    // Unmeasured: connections opened, the gateway's first events.
    quiet(
        sender.clone(),
        args.quiet,
        args.rate,
        Instant::now() + Duration::from_secs(args.warmup),
        "warmup",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first_from = arrivals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .seen
        .len();

    // Phase 1: the quiet tenants alone.
    let (sent_alone, mut answers_alone) = quiet(
        sender.clone(),
        args.quiet,
        args.rate,
        Instant::now() + phase,
        "alone",
    )
    .await;
    // What was sent arrives within the downstream's delay and the dispatch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut alone = quiet_latencies(&arrivals, first_from);
    let second_from = arrivals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .seen
        .len();

    // Phase 2: the same, while one tenant floods.
    let started = Instant::now();
    let flooding = tokio::spawn(flood(
        sender.clone(),
        args.flood,
        args.flood_chats,
        args.flood_connections,
    ));
    let (sent_flooded, mut answers_flooded) = quiet(
        sender.clone(),
        args.quiet,
        args.rate,
        started + phase,
        "flooded",
    )
    .await;
    // Every quiet event counts, the last ones too: wait for them (they may wait behind the
    // whole flood), noting how far the flood got by the phase's end.
    let flood_in_phase = arrivals.lock().unwrap_or_else(|p| p.into_inner()).seen[second_from..]
        .iter()
        .filter(|(tenant, _, _)| tenant == "flood")
        .count();
    let in_phase = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(args.drain_seconds);
    while quiet_latencies(&arrivals, second_from).len() < sent_flooded && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut flooded = quiet_latencies(&arrivals, second_from);
    flooding.abort();

    let (alone_p50, alone_p99) = (percentile(&mut alone, 50.0), percentile(&mut alone, 99.0));
    let (flooded_p50, flooded_p99) = (
        percentile(&mut flooded, 50.0),
        percentile(&mut flooded, 99.0),
    );
    println!(
        "quiet alone:    {} tenants, {sent_alone} sent, {} delivered, p50 {alone_p50} ms, p99 {alone_p99} ms",
        args.quiet,
        alone.len()
    );
    println!(
        "quiet flooded:  {sent_flooded} sent, {} delivered, p50 {flooded_p50} ms, p99 {flooded_p99} ms",
        flooded.len()
    );
    println!(
        "quiet answers:  p50 {} / p99 {} ms alone, p50 {} / p99 {} ms flooded (ingress's share of the latency)",
        percentile(&mut answers_alone, 50.0),
        percentile(&mut answers_alone, 99.0),
        percentile(&mut answers_flooded, 50.0),
        percentile(&mut answers_flooded, 99.0),
    );
    println!(
        "flood:          {} delivered of {} in the phase's {:.1} s",
        flood_in_phase,
        args.flood,
        in_phase.as_secs_f64()
    );
    println!(
        "ratio (p99 flooded / alone): {:.1}",
        flooded_p99 as f64 / alone_p99.max(1) as f64
    );
    if flooded.len() < sent_flooded {
        println!(
            "NOT MEASURED: {} quiet events not delivered within --drain-seconds",
            sent_flooded - flooded.len()
        );
    }
    Ok(())
}
