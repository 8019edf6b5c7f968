//! `oncegate-load`: a lean load generator that can find the ceiling. Every request is sealed
//! before the clock starts (signed and encrypted by the source's own sealer; platform retries
//! sealed again with a fresh nonce, replays byte for byte), then replayed over N keep-alive
//! HTTP/1.1 connections. It prints req/s, latency percentiles, answers by status, the server's
//! CPU per request (from `/proc/<pid>/stat`) and how long after the last answer every admitted
//! event was delivered (from the admin API).
//!
//! `oncegate-load --config oncegate.toml --url http://127.0.0.1:8080 --pid $(pidof oncegate)`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use oncegate_core::{Method, SealedRequest, SyntheticMessage};

/// Options.
#[derive(Debug, Parser)]
struct Args {
    /// The gateway's configuration: the source's secrets, and the addresses.
    #[arg(long)]
    config: std::path::PathBuf,
    /// The source to send as (default: the first).
    #[arg(long)]
    source: Option<String>,
    /// The base URL (default: from server.listen). A bare server answers any path.
    #[arg(long)]
    url: Option<String>,
    /// The admin base URL for the delivery figures; `none` to skip them (a bare server).
    #[arg(long)]
    admin: Option<String>,
    /// Distinct events.
    #[arg(long, default_value_t = 30_000)]
    events: usize,
    /// Share of extra sends that are platform retries (sealed again, fresh nonce).
    #[arg(long, default_value_t = 0.3)]
    duplicates: f64,
    /// Share of extra sends that replay an earlier request byte for byte.
    #[arg(long, default_value_t = 0.0)]
    replays: f64,
    /// Keep-alive connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Chats the events are spread over.
    #[arg(long, default_value_t = 200)]
    chats: usize,
    /// Each message's text is padded to this many bytes (0: a short text), to see how the cost
    /// grows with the payload's size.
    #[arg(long, default_value_t = 0)]
    text_bytes: usize,
    /// The server's process id, for its CPU per request.
    #[arg(long)]
    pid: Option<u32>,
}

/// `text`, padded with letters to `bytes` (never cut).
fn padded(mut text: String, bytes: usize) -> String {
    let letters = b"abcdefghijklmnopqrstuvwxyz ";
    while text.len() < bytes {
        text.push(char::from(letters[text.len() % letters.len()]));
    }
    text
}

/// A request ready to go: nothing is computed once the clock runs.
struct Prepared {
    method: hyper::Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

fn prepare(path: &str, sealed: SealedRequest) -> Prepared {
    Prepared {
        method: match sealed.method {
            Method::Get => hyper::Method::GET,
            Method::Post => hyper::Method::POST,
        },
        path: match sealed.query {
            Some(query) => format!("{path}?{query}"),
            None => path.to_owned(),
        },
        headers: sealed.headers,
        body: Bytes::from(sealed.body),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What one connection saw.
#[derive(Default)]
struct Seen {
    latencies_us: Vec<u32>,
    statuses: BTreeMap<u16, usize>,
    failed: usize,
}

/// The server's CPU time so far, in clock ticks (utime + stime).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces: fields count from the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
}

/// `GET {admin}/admin/live`: delivered, stale-dropped and admitted counts; `None` when the
/// admin API does not answer within the request timeout. Not `/admin/stats`: that one counts
/// the store's records (a scan of every record on Redis), and polling it while the queue drains
/// would add that cost to the figures measured.
async fn counts(admin: &str) -> Option<(u64, u64, u64)> {
    tokio::time::timeout(REQUEST_TIMEOUT, stats_once(admin))
        .await
        .ok()
        .flatten()
}

async fn stats_once(admin: &str) -> Option<(u64, u64, u64)> {
    let authority = admin.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/admin/live")
        .header("host", authority)
        .body(Full::new(Bytes::new()))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let body = response.into_body().collect().await.ok()?.to_bytes();
    let stats: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let gateway = &stats["gateway"];
    Some((
        gateway["delivered"].as_u64()?,
        gateway["stale_dropped"].as_u64()?,
        gateway["admitted"].as_u64()?,
    ))
}

/// One keep-alive connection taking requests from the shared plan until it is done.
async fn connection(
    authority: String,
    plan: Arc<Vec<Prepared>>,
    next: Arc<AtomicUsize>,
) -> anyhow::Result<Seen> {
    let stream = tokio::net::TcpStream::connect(&authority).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut seen = Seen::default();
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(prepared) = plan.get(index) else {
            return Ok(seen);
        };
        let mut request = hyper::Request::builder()
            .method(prepared.method.clone())
            .uri(&prepared.path)
            .header("host", &authority);
        for (name, value) in &prepared.headers {
            request = request.header(*name, value);
        }
        let request = request.body(Full::new(prepared.body.clone()))?;
        let started = Instant::now();
        // A server that stops answering ends this connection instead of the run.
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            let drained = response.into_body().collect().await.is_ok();
            Ok::<_, hyper::Error>((status, drained))
        });
        match answer.await {
            Ok(Ok((status, drained))) => {
                seen.latencies_us
                    .push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
                *seen.statuses.entry(status).or_default() += 1;
                if !drained {
                    seen.failed += 1;
                }
            }
            Ok(Err(_)) | Err(_) => {
                seen.failed += 1;
                return Ok(seen);
            }
        }
    }
}

/// How long one request may take before its connection is given up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = oncegate_config::load(Some(&args.config), std::env::vars())?;
    let source = match &args.source {
        Some(name) => config.sources.iter().find(|s| &s.name == name),
        None => config.sources.first(),
    }
    .with_context(|| format!("no such source in {}", args.config.display()))?;
    let sealer = oncegate_gateway::registry::sealer(source)?;
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.server.listen));
    let authority = base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let admin = match args.admin.as_deref() {
        Some("none") => None,
        Some(admin) => Some(admin.to_owned()),
        None => Some(format!("http://{}", config.server.admin_listen)),
    };
    let path = format!("/webhook/{}", source.name);

    // Seal everything first.
    let run = unix_ms();
    let now_secs = run / 1000;
    let seal = |i: usize| {
        let message = SyntheticMessage {
            id: format!("load{run}-{i}"),
            chat: format!("oc_load{}", i % args.chats.max(1)),
            sender: format!("ou_{}", i % 997),
            text: padded(format!("load message {i}"), args.text_bytes),
            created_ms: run + i as u64,
        };
        let nonce = format!("{:016x}", fastrand::u64(..));
        let iv: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
        sealer.seal(&sealer.message(&message), now_secs, &nonce, iv)
    };
    let prepare_at = Instant::now();
    let mut plan: Vec<Prepared> = Vec::with_capacity(args.events * 2);
    let mut first: Vec<SealedRequest> = Vec::with_capacity(args.events);
    for i in 0..args.events {
        let sealed = seal(i);
        first.push(sealed.clone());
        plan.push(prepare(&path, sealed));
        if i > 0 && fastrand::f64() < args.duplicates {
            plan.push(prepare(&path, seal(fastrand::usize(..i))));
        }
        if i > 0 && fastrand::f64() < args.replays {
            plan.push(prepare(&path, first[fastrand::usize(..i)].clone()));
        }
    }
    drop(first);
    let prepared_in = prepare_at.elapsed();

    let before = match &admin {
        Some(admin) => counts(admin).await,
        None => None,
    };
    let hz = ticks_per_second();
    let cpu_before = args.pid.and_then(cpu_ticks);
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..args.connections.max(1))
        .map(|_| tokio::spawn(connection(authority.clone(), plan.clone(), next.clone())))
        .collect();
    let mut seen = Seen::default();
    for worker in workers {
        let part = worker.await??;
        seen.latencies_us.extend(part.latencies_us);
        for (status, count) in part.statuses {
            *seen.statuses.entry(status).or_default() += count;
        }
        seen.failed += part.failed;
    }
    let elapsed = started.elapsed();
    let cpu_after = args.pid.and_then(cpu_ticks);
    if seen.latencies_us.is_empty() {
        bail!("no request was answered: is {base} up?");
    }

    // Deliveries trail the answers: wait until every admitted event is delivered or dropped.
    let mut drained = None;
    if let (Some(admin), Some((delivered0, stale0, admitted0))) = (&admin, before) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some((delivered, stale, admitted)) = counts(admin).await
                && (delivered + stale).saturating_sub(delivered0 + stale0)
                    >= admitted.saturating_sub(admitted0)
            {
                drained = Some((
                    started.elapsed().saturating_sub(elapsed),
                    admitted.saturating_sub(admitted0),
                    args.pid.and_then(cpu_ticks),
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    seen.latencies_us.sort_unstable();
    let pct = |p: f64| {
        let at = ((seen.latencies_us.len() - 1) as f64 * p) as usize;
        f64::from(seen.latencies_us[at]) / 1000.0
    };
    let answered = seen.latencies_us.len();
    println!(
        "prepared           {} requests ({} events) in {:.2} s",
        plan.len(),
        args.events,
        prepared_in.as_secs_f64()
    );
    println!(
        "throughput         {:.0} requests/s over {:.2} s, {} connections",
        answered as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64(),
        args.connections
    );
    println!(
        "latency            p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  max {:.2} ms",
        pct(0.5),
        pct(0.99),
        pct(0.999),
        pct(1.0)
    );
    let statuses: Vec<String> = seen
        .statuses
        .iter()
        .map(|(status, count)| format!("{status}: {count}"))
        .collect();
    println!("answers            {}", statuses.join(", "));
    if seen.failed > 0 {
        println!("failed             {}", seen.failed);
    }
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        let micros = after.saturating_sub(before) as f64 * 1e6 / hz as f64 / answered as f64;
        println!("server cpu         {micros:.1} us/request");
    }
    match drained {
        Some((after, admitted, cpu_drained)) => {
            println!(
                "delivered          {admitted} admitted events, the last {:.2} s after the last answer ({:.0} events/s end to end)",
                after.as_secs_f64(),
                admitted as f64 / (elapsed + after).as_secs_f64()
            );
            if let (Some(before), Some(drained)) = (cpu_before, cpu_drained) {
                let micros = (drained - before) as f64 * 1e6 / hz as f64 / admitted.max(1) as f64;
                println!("server cpu         {micros:.1} us/event until delivered");
            }
        }
        None if admin.is_some() => println!("delivered          unknown (admin API not reachable)"),
        None => {}
    }
    Ok(())
}
