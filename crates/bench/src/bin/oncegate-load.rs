//! `oncegate-load`: a lean load generator that can find the ceiling. Every request is sealed
//! before the clock starts (signed and encrypted by the source's own sealer; platform retries
//! sealed again with a fresh nonce, replays byte for byte) into the very bytes it sends, then
//! replayed over N keep-alive HTTP/1.1 connections from one thread. It prints req/s, latency
//! percentiles, answers by status, the server's CPU per request (from `/proc/<pid>/stat`), its
//! own (the CPU it took from the server, which shares the machine) and how long after the last
//! answer every admitted event was delivered (from the admin API).
//!
//! `oncegate-load --config oncegate.toml --url http://127.0.0.1:8080 --pid $(pidof oncegate)`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use oncegate_core::{Method, SealedRequest, SyntheticMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    /// Polls `GET /admin/stats` this many times a second while the load runs and drains (0:
    /// never), as a dashboard would: what such polling costs the deliveries.
    #[arg(long, default_value_t = 0.0)]
    poll_stats: f64,
}

/// `text`, padded with letters to `bytes` (never cut).
fn padded(mut text: String, bytes: usize) -> String {
    let letters = b"abcdefghijklmnopqrstuvwxyz ";
    while text.len() < bytes {
        text.push(char::from(letters[text.len() % letters.len()]));
    }
    text
}

/// A request ready to go, as the bytes sent: nothing is computed once the clock runs.
struct Prepared {
    wire: Bytes,
}

/// `sealed` as one HTTP/1.1 request to `path` on `authority`, keep-alive.
fn prepare(authority: &str, path: &str, sealed: SealedRequest) -> Prepared {
    let method = match sealed.method {
        Method::Get => "GET",
        Method::Post => "POST",
    };
    let target = match &sealed.query {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut head = format!("{method} {target} HTTP/1.1\r\nhost: {authority}\r\n");
    for (name, value) in &sealed.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", sealed.body.len()));
    let mut wire = head.into_bytes();
    wire.extend_from_slice(&sealed.body);
    Prepared {
        wire: Bytes::from(wire),
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
    /// Why the first failed connection failed.
    why: Option<String>,
}

/// The server's CPU time so far, in clock ticks (utime + stime).
fn cpu_ticks(pid: u32) -> Option<u64> {
    cpu_split(pid).map(|(user, system)| user + system)
}

/// The server's CPU time so far in clock ticks, in user space and in the kernel apart: a cost
/// that grows in the kernel (page faults, memory management) is the machine's, not the code's.
fn cpu_split(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces: fields count from the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((
        fields.get(11)?.parse::<u64>().ok()?,
        fields.get(12)?.parse::<u64>().ok()?,
    ))
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
/// admin API does not answer within the request timeout (`/admin/live` reads no store: the
/// figures measured are the load's, `--poll-stats` adds a dashboard's).
async fn counts(admin: &str) -> Option<(u64, u64, u64)> {
    tokio::time::timeout(REQUEST_TIMEOUT, stats_once(admin))
        .await
        .ok()
        .flatten()
}

async fn stats_once(admin: &str) -> Option<(u64, u64, u64)> {
    let stats = get_json(admin, "/admin/live").await?;
    let gateway = &stats["gateway"];
    Some((
        gateway["delivered"].as_u64()?,
        gateway["stale_dropped"].as_u64()?,
        gateway["admitted"].as_u64()?,
    ))
}

/// `GET {admin}{path}`'s JSON answer.
async fn get_json(admin: &str, path: &str) -> Option<serde_json::Value> {
    let authority = admin.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", authority)
        .body(Full::new(Bytes::new()))
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let body = response.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&body).ok()
}

/// Polls `/admin/stats` every `every` until `stop`, on schedule whether or not the last poll
/// was answered (as a dashboard's timer does): each answered poll's time in microseconds, and
/// how many were still unanswered at the stop (given up then).
async fn poll_stats(admin: String, every: Duration, stop: Arc<AtomicBool>) -> (Vec<u32>, usize) {
    let mut polls = tokio::task::JoinSet::new();
    let mut took = Vec::new();
    let mut tick = tokio::time::interval(every);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let admin = admin.clone();
        polls.spawn(async move {
            let at = Instant::now();
            get_json(&admin, "/admin/stats")
                .await
                .map(|_| u32::try_from(at.elapsed().as_micros()).unwrap_or(u32::MAX))
        });
        while let Some(done) = polls.try_join_next() {
            took.extend(done.ok().flatten());
        }
    }
    let unanswered = polls.len();
    polls.abort_all();
    (took, unanswered)
}

/// One keep-alive connection taking requests from the shared plan until it is done. It writes
/// each prepared request as it is and reads the answer's head and `content-length` body itself:
/// a client library's request building and body plumbing cost this process about as much CPU
/// as the bare server spent answering, CPU the server under test then did not get.
async fn connection(
    authority: String,
    plan: Arc<Vec<Prepared>>,
    next: Arc<AtomicUsize>,
) -> anyhow::Result<Seen> {
    let mut stream = tokio::net::TcpStream::connect(&authority).await?;
    stream.set_nodelay(true)?;
    let mut seen = Seen::default();
    let mut buffer = Vec::with_capacity(ANSWER_BUFFER);
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(prepared) = plan.get(index) else {
            return Ok(seen);
        };
        let started = Instant::now();
        // A server that stops answering ends this connection instead of the run.
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            stream.write_all(&prepared.wire).await?;
            read_answer(&mut stream, &mut buffer).await
        });
        match answer.await {
            Ok(Ok(Answer { status, close })) => {
                seen.latencies_us
                    .push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
                *seen.statuses.entry(status).or_default() += 1;
                if close {
                    stream = tokio::net::TcpStream::connect(&authority).await?;
                    stream.set_nodelay(true)?;
                }
            }
            Ok(Err(error)) => {
                seen.failed += 1;
                seen.why.get_or_insert_with(|| error.to_string());
                return Ok(seen);
            }
            Err(_) => {
                seen.failed += 1;
                seen.why
                    .get_or_insert_with(|| "no answer within 30 s".into());
                return Ok(seen);
            }
        }
    }
}

/// The answer buffer's first size; it grows for a larger head or body.
const ANSWER_BUFFER: usize = 4096;
/// The largest answer read (head and body).
const ANSWER_MAX: usize = 1 << 20;

/// What one answer said.
struct Answer {
    status: u16,
    /// The server closes the connection after it.
    close: bool,
}

/// Reads one answer (head, then a `content-length` body) from `stream`; `buffer` may hold the
/// start of it and keeps nothing after.
async fn read_answer(
    stream: &mut tokio::net::TcpStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Answer> {
    let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    buffer.clear();
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(buffer) {
            Ok(httparse::Status::Complete(head)) => {
                let status = response.code.unwrap_or(0);
                let mut length = None;
                let mut close = false;
                for header in response.headers.iter() {
                    if header.name.eq_ignore_ascii_case("content-length") {
                        length = std::str::from_utf8(header.value)
                            .ok()
                            .and_then(|v| v.trim().parse::<usize>().ok());
                    } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                        return Err(invalid(format!(
                            "a {status} answer with transfer-encoding: only content-length bodies are read"
                        )));
                    } else if header.name.eq_ignore_ascii_case("connection") {
                        close = header.value.eq_ignore_ascii_case(b"close");
                    }
                }
                let length = length
                    .ok_or_else(|| invalid(format!("a {status} answer without content-length")))?;
                let total = head
                    .checked_add(length)
                    .filter(|total| *total <= ANSWER_MAX)
                    .ok_or_else(|| {
                        invalid(format!("a {status} answer with a {length}-byte body"))
                    })?;
                while buffer.len() < total {
                    read_more(stream, buffer).await?;
                }
                if buffer.len() > total {
                    return Err(invalid(
                        "bytes after the answer: the server sent more than asked".into(),
                    ));
                }
                return Ok(Answer { status, close });
            }
            Ok(httparse::Status::Partial) if buffer.len() < ANSWER_MAX => {
                read_more(stream, buffer).await?;
            }
            Ok(httparse::Status::Partial) => {
                return Err(invalid(format!("an answer head over {ANSWER_MAX} bytes")));
            }
            Err(error) => return Err(invalid(format!("an answer that is not HTTP/1.1: {error}"))),
        }
    }
}

/// Appends what the stream has to `buffer`; the end of the stream is an error.
async fn read_more(
    stream: &mut tokio::net::TcpStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<()> {
    if buffer.capacity() - buffer.len() < 1024 {
        buffer.reserve(buffer.capacity().max(ANSWER_BUFFER));
    }
    if stream.read_buf(buffer).await? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    Ok(())
}

/// How long one request may take before its connection is given up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

// One thread: it keeps up with the bare server (about 150 k req/s here) at a third of the CPU
// per request that two worker threads handing connections to each other took.
#[tokio::main(flavor = "current_thread")]
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
    if authority.contains('/') || base.starts_with("https://") {
        bail!("--url takes http://host:port and nothing after it (not {base})");
    }
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
        plan.push(prepare(&authority, &path, sealed));
        if i > 0 && fastrand::f64() < args.duplicates {
            plan.push(prepare(&authority, &path, seal(fastrand::usize(..i))));
        }
        if i > 0 && fastrand::f64() < args.replays {
            plan.push(prepare(
                &authority,
                &path,
                first[fastrand::usize(..i)].clone(),
            ));
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
    let split_before = args.pid.and_then(cpu_split);
    let own_before = cpu_ticks(std::process::id());
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicUsize::new(0));
    let polls_stop = Arc::new(AtomicBool::new(false));
    let polls = match &admin {
        Some(admin) if args.poll_stats > 0.0 => Some(tokio::spawn(poll_stats(
            admin.clone(),
            Duration::from_secs_f64(1.0 / args.poll_stats),
            polls_stop.clone(),
        ))),
        _ => None,
    };
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
        if seen.why.is_none() {
            seen.why = part.why;
        }
    }
    let elapsed = started.elapsed();
    let cpu_after = args.pid.and_then(cpu_ticks);
    let own_after = cpu_ticks(std::process::id());
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
                    args.pid.and_then(cpu_split),
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    polls_stop.store(true, Ordering::Relaxed);
    let polls = match polls {
        Some(polls) => Some(polls.await?),
        None => None,
    };

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
        println!(
            "failed             {} ({})",
            seen.failed,
            seen.why.as_deref().unwrap_or("unknown")
        );
    }
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        let micros = after.saturating_sub(before) as f64 * 1e6 / hz as f64 / answered as f64;
        println!("server cpu         {micros:.1} us/request");
    }
    if let (Some(before), Some(after)) = (own_before, own_after) {
        // The machine's CPU this load generator took from the server under test.
        let micros = after.saturating_sub(before) as f64 * 1e6 / hz as f64 / answered as f64;
        println!("client cpu         {micros:.1} us/request");
    }
    match drained {
        Some((after, admitted, cpu_drained)) => {
            println!(
                "delivered          {admitted} admitted events, the last {:.2} s after the last answer ({:.0} events/s end to end)",
                after.as_secs_f64(),
                admitted as f64 / (elapsed + after).as_secs_f64()
            );
            if let (Some(before), Some(drained)) = (split_before, cpu_drained) {
                let per_event =
                    |ticks: u64| ticks as f64 * 1e6 / hz as f64 / admitted.max(1) as f64;
                let user = per_event(drained.0.saturating_sub(before.0));
                let system = per_event(drained.1.saturating_sub(before.1));
                println!(
                    "server cpu         {:.1} us/event until delivered (user {user:.1}, system {system:.1})",
                    user + system
                );
            }
        }
        None if admin.is_some() => println!("delivered          unknown (admin API not reachable)"),
        None => {}
    }
    if let Some((mut polls, unanswered)) = polls {
        polls.sort_unstable();
        let at = |p: f64| {
            polls
                .get(((polls.len().max(1) - 1) as f64 * p) as usize)
                .map_or(f64::NAN, |us| f64::from(*us) / 1000.0)
        };
        println!(
            "polled /admin/stats {} times: p50 {:.2} ms  max {:.2} ms  ({unanswered} unanswered at the end)",
            polls.len() + unanswered,
            at(0.5),
            at(1.0)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that writes `chunks` one by one (with a pause between, so that the client reads
    /// them apart), then closes the connection, or with `hold` keeps it open a while.
    async fn answering(chunks: Vec<&'static [u8]>, hold: bool) -> tokio::net::TcpStream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            for chunk in chunks {
                socket.write_all(chunk).await.expect("write");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if hold {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        tokio::net::TcpStream::connect(address)
            .await
            .expect("connect")
    }

    #[tokio::test]
    async fn answers_split_anywhere_are_read_whole_and_one_at_a_time() {
        let mut stream = answering(
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-le",
                b"ngth: 5\r\n\r\nab",
                b"c",
                b"de",
                b"HTTP/1.1 409 Conflict\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            ],
            true,
        )
        .await;
        let mut buffer = Vec::new();
        let first = read_answer(&mut stream, &mut buffer).await.expect("first");
        assert_eq!((first.status, first.close), (200, false));
        assert_eq!(&buffer[buffer.len() - 5..], b"abcde");
        let second = read_answer(&mut stream, &mut buffer).await.expect("second");
        assert_eq!((second.status, second.close), (409, true));
    }

    #[tokio::test]
    async fn answers_it_cannot_frame_are_refused_with_the_reason() {
        for (answer, why) in [
            (
                &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"[..],
                "transfer-encoding",
            ),
            (&b"HTTP/1.1 200 OK\r\n\r\n"[..], "without content-length"),
            (&b"SMTP ready\r\n\r\n"[..], "not HTTP/1.1"),
            (
                &b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\n"[..],
                "18446744073709551615-byte body",
            ),
            (
                &b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc"[..],
                "closed",
            ),
        ] {
            let mut stream = answering(vec![answer], false).await;
            let mut buffer = Vec::new();
            let error = read_answer(&mut stream, &mut buffer)
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains(why), "{answer:?}: {error}");
        }
    }
}
