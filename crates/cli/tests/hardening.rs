//! The security rules at the process edge, through the real `oncegate` binary: secrets, the
//! unsigned path, slow and many sockets, signals, what is logged, stored and forwarded, and the
//! files it creates.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use oncegate_feishu::FeishuApp;

const APP_ID: &str = "cli_hard";
const KEY: &str = "hardening-key";
const TOKEN: &str = "hardening-token";

use crate::support;

use support::{Serve, client, file_route, lines, oncegate, refused_start, wait_until};

impl Serve {
    /// Starts the gateway on `sections` and a Feishu source; the `[server]` section gets
    /// loopback listeners on free ports before `server`'s lines.
    fn start(dir: &Path, server: &str, sections: &str) -> Self {
        Self::start_with(
            dir,
            &format!(
                r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
{server}

[[source]]
name = "main"
platform = "feishu"
app_id = "{APP_ID}"
encrypt_key = "{KEY}"
verification_token = "{TOKEN}"

{sections}
"#
            ),
        )
    }
}

fn app() -> FeishuApp {
    FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        APP_ID,
        Some(KEY.into()),
        Some(TOKEN.into()),
    )
    .expect("app")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn message(event_id: &str, chat: &str, create_time: &str) -> String {
    serde_json::json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "token": TOKEN, "create_time": create_time,
                   "event_type": "im.message.receive_v1", "tenant_key": "t", "app_id": APP_ID},
        "event": {"message": {"message_id": format!("om_{event_id}"), "chat_id": chat}}
    })
    .to_string()
}

/// Posts `plain` signed and encrypted as Feishu would; the status and body.
async fn post_signed(client: &reqwest::Client, url: &str, plain: &str) -> (u16, String) {
    try_post_signed(client, url, plain).await.expect("post")
}

/// `post_signed`, with a gateway that may be gone.
async fn try_post_signed(
    client: &reqwest::Client,
    url: &str,
    plain: &str,
) -> Result<(u16, String), reqwest::Error> {
    let timestamp = now_secs().to_string();
    let nonce = format!("{:016x}", fastrand::u64(..));
    let mut iv = [0u8; 16];
    fastrand::fill(&mut iv);
    let (body, signature) = app().seal(plain.as_bytes(), &timestamp, &nonce, iv);
    let response = client
        .post(url)
        .header("x-lark-request-timestamp", &timestamp)
        .header("x-lark-request-nonce", &nonce)
        .header("x-lark-signature", signature.expect("signed"))
        .body(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await.unwrap_or_default()))
}

async fn post_unsigned(client: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, String) {
    let response = client.post(url).body(body).send().await.expect("post");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[test]
fn an_empty_secret_stops_check_config_and_serve_naming_source_and_setting() {
    let dir = tempfile::tempdir().expect("dir");
    let blank = dir.path().join("blank");
    std::fs::write(&blank, "\n").expect("write");
    let config = dir.path().join("oncegate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[[source]]
name = "main"
platform = "feishu"
app_id = "cli_x"
encrypt_key = {{ env = "ONCEGATE_TEST_BLANK_KEY" }}
verification_token = {{ file = "{}" }}
"#,
            blank.display()
        ),
    )
    .expect("config");
    let checked = oncegate()
        .arg("check-config")
        .arg(&config)
        .env("ONCEGATE_TEST_BLANK_KEY", "")
        .output()
        .expect("check-config");
    let out = String::from_utf8_lossy(&checked.stdout);
    assert_eq!(checked.status.code(), Some(1), "{out}");
    assert!(
        out.contains("source[main].encrypt_key")
            && out.contains("ONCEGATE_TEST_BLANK_KEY is empty")
            && out.contains("source[main].verification_token"),
        "{out}"
    );
    let served = oncegate()
        .args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .env("ONCEGATE_TEST_BLANK_KEY", "")
        .output()
        .expect("serve");
    let err = String::from_utf8_lossy(&served.stderr);
    assert!(!served.status.success(), "serve started: {err}");
    assert!(
        err.contains("source[main].encrypt_key") && err.contains("empty"),
        "{err}"
    );
    assert!(served.stdout.is_empty(), "serve must not listen");

    // No secret at all: refused without the explicit opt-in.
    std::fs::write(
        &config,
        "[[source]]\nname = \"main\"\nplatform = \"feishu\"\napp_id = \"cli_x\"\n",
    )
    .expect("config");
    let checked = oncegate()
        .arg("check-config")
        .arg(&config)
        .output()
        .expect("run");
    let out = String::from_utf8_lossy(&checked.stdout);
    assert_eq!(checked.status.code(), Some(1), "{out}");
    assert!(out.contains("allow_unsigned = true"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unsigned_failure_gets_one_answer_and_a_summary_line() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start(
        dir.path(),
        "log_interval = \"500ms\"",
        &file_route(dir.path(), ""),
    );
    let client = client();
    let seal = |plain: &[u8]| {
        serde_json::json!({"encrypt": oncegate_feishu::encrypt(KEY, plain, [9; 16])})
            .to_string()
            .into_bytes()
    };
    let challenge =
        format!(r#"{{"challenge":"ch-1","token":"{TOKEN}","type":"url_verification"}}"#);
    let (status, body) = post_unsigned(&client, &gateway.url(), seal(challenge.as_bytes())).await;
    assert_eq!((status, body.as_str()), (200, r#"{"challenge":"ch-1"}"#));
    // What a padding-oracle attacker sends: a captured event, tampered ciphertexts, garbage.
    let captured = seal(message("ev1", "oc", "1").as_bytes());
    let mut tampered = captured.clone();
    let at = tampered.len() - 5;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    let bodies = [
        captured,
        tampered,
        seal(b"not json"),
        seal(challenge.replace(TOKEN, "wrong").as_bytes()),
        b"{\"encrypt\":\"!!!\"}".to_vec(),
        b"not json".to_vec(),
        message("ev2", "oc", "1").into_bytes(),
        vec![b'{'; 5000],
    ];
    let mut answers = std::collections::HashSet::new();
    for body in &bodies {
        for _ in 0..5 {
            answers.insert(post_unsigned(&client, &gateway.url(), body.clone()).await);
        }
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    let (status, body) = answers.into_iter().next().expect("one");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("unsigned request"), "{body}");
    // Nothing was admitted, and the log has one summary for the 40 refusals, not 40 lines.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(lines(dir.path()).is_empty());
    let log = gateway.stderr();
    let summaries: Vec<&str> = log.lines().filter(|l| l.contains("unsigned")).collect();
    assert_eq!(summaries.len(), 1, "{log}");
    assert!(summaries[0].contains("40 × unsigned"), "{log}");
    assert!(
        summaries[0].contains("127.0.0.1"),
        "the last address: {log}"
    );
    assert!(!log.contains(KEY) && !log.contains(TOKEN), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_sockets_are_cut_off_and_connections_are_bounded() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start(
        dir.path(),
        "header_timeout = \"700ms\"\nbody_timeout = \"700ms\"\nmax_connections = 8\nbody_limit = 65536",
        &file_route(dir.path(), ""),
    );
    let addr = gateway.addr();
    let connect = || {
        let stream = TcpStream::connect(&addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream
    };
    // Reads until the gateway closes; what it sent and how long it took.
    let until_closed = |mut stream: TcpStream| {
        let start = Instant::now();
        let mut got = Vec::new();
        let _ = stream.read_to_end(&mut got);
        (String::from_utf8_lossy(&got).into_owned(), start.elapsed())
    };
    // An idle connection, and one that stops halfway through its headers.
    let idle = connect();
    let mut half_headers = connect();
    half_headers
        .write_all(b"POST /webhook/main HTTP/1.1\r\nHost: x\r\nX-Slow: aaaa")
        .expect("write");
    for stream in [idle, half_headers] {
        let (_, took) = until_closed(stream);
        assert!(took < Duration::from_secs(3), "held for {took:?}");
    }
    // A body that stops halfway: 408 after the body deadline.
    let mut half_body = connect();
    half_body
        .write_all(b"POST /webhook/main HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"a\":")
        .expect("write");
    let (answer, took) = until_closed(half_body);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(3), "held for {took:?}");
    // A declared length over the limit: 413 at once, before any body is sent.
    let mut declared = connect();
    declared
        .write_all(b"POST /webhook/main HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
        .expect("write");
    let mut head = [0u8; 12];
    let start = Instant::now();
    declared.read_exact(&mut head).expect("answer");
    assert_eq!(&head, b"HTTP/1.1 413");
    assert!(start.elapsed() < Duration::from_millis(500));
    drop(declared);
    // Twelve connections at once: eight are held open, the others closed at once and counted.
    let held: Vec<TcpStream> = (0..12)
        .map(|_| {
            let mut stream = connect();
            stream
                .write_all(b"POST /webhook/main HTTP/1.1\r\n")
                .expect("write");
            stream
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let closed = held
        .iter()
        .filter(|stream| {
            let mut stream: &TcpStream = stream;
            stream
                .set_read_timeout(Some(Duration::from_millis(20)))
                .expect("timeout");
            // Closed: an end of stream, or a reset (the request line was never read).
            match stream.read(&mut [0u8; 1]) {
                Ok(n) => n == 0,
                Err(error) => !matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            }
        })
        .count();
    // A slot of a connection above may still be closing: then one more is closed.
    assert!((4..=5).contains(&closed), "{closed} of 12 closed at once");
    // Once the slots are free again a real event gets through.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let (status, body) = post_signed(&client(), &gateway.url(), &message("ok", "oc", "1")).await;
    assert_eq!(status, 200, "{body}");
    let refused = format!("oncegate_connections_refused_total{{listener=\"webhooks\"}} {closed}");
    let (_, metrics) = gateway.admin_get("/metrics").await;
    assert!(metrics.contains(&refused), "{refused}: {metrics}");
}

/// A gateway with `grace` and a client that sent its headers and trickles nothing more of its
/// body.
async fn with_a_stuck_client(dir: &Path, grace: &str) -> (Serve, TcpStream) {
    let sections = format!(
        "[dispatcher]\nshutdown_grace = \"{grace}\"\n\n{}",
        file_route(dir, "")
    );
    let gateway = Serve::start(dir, "body_timeout = \"60s\"", &sections);
    let mut stuck = TcpStream::connect(gateway.addr()).expect("connect");
    stuck
        .write_all(b"POST /webhook/main HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    (gateway, stuck)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_within_its_grace_and_a_second_signal_exits_at_once() {
    let dir = tempfile::tempdir().expect("dir");
    let (mut gateway, _stuck) = with_a_stuck_client(dir.path(), "1s").await;
    gateway.signal("TERM");
    let (status, took) = gateway.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}: {}", gateway.stderr());
    assert!(took < Duration::from_secs(4), "shutdown took {took:?}");

    // A second signal while the first shutdown waits: the process exits at once.
    let dir = tempfile::tempdir().expect("dir");
    let (mut gateway, _stuck) = with_a_stuck_client(dir.path(), "60s").await;
    gateway.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        gateway.child.try_wait().expect("wait").is_none(),
        "waits for the grace"
    );
    gateway.signal("INT");
    let (status, took) = gateway.wait_exit(Duration::from_secs(5));
    assert!(!status.success(), "{status:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        gateway.stderr().contains("second signal"),
        "{}",
        gateway.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_credentials_are_never_stored_forwarded_or_logged() {
    let dir = tempfile::tempdir().expect("dir");
    // An HTTP route whose URL carries credentials and points nowhere (port 9), so its events
    // are dead-lettered with a reason; a file route for the rest.
    let sections = format!(
        r#"[dispatcher]
max_attempts = 1

[[route]]
events = ["im.chat.*"]
sink = "http"
url = "http://user:hunter2@127.0.0.1:9/in?api_key=s3cr3t"
timeout = "1s"

{}"#,
        file_route(dir.path(), "")
    );
    let gateway = Serve::start(dir.path(), "", &sections);
    let client = client();
    let (status, body) = post_signed(&client, &gateway.url(), &message("m1", "oc", "1")).await;
    assert_eq!(status, 200, "{body}");
    let chat = message("c1", "oc", "1").replace("im.message.receive_v1", "im.chat.updated_v1");
    let (status, body) = post_signed(&client, &gateway.url(), &chat).await;
    assert_eq!(status, 200, "{body}");
    wait_until("a line", Duration::from_secs(10), || {
        !lines(dir.path()).is_empty()
    })
    .await;
    let written = std::fs::read_to_string(dir.path().join("out/events.jsonl")).expect("read");
    assert!(written.contains("\"event_id\":\"m1\""), "{written}");
    assert!(
        !written.contains(TOKEN),
        "the token is forwarded: {written}"
    );
    let letters = gateway
        .admin_until("/admin/dead-letters", |letters| letters.contains("c1"))
        .await;
    assert!(letters.contains("127.0.0.1:9/in"), "{letters}");
    for leak in ["hunter2", "s3cr3t", "user:"] {
        assert!(!letters.contains(leak), "{leak} in {letters}");
        assert!(
            !gateway.stderr().contains(leak),
            "{leak} in {}",
            gateway.stderr()
        );
    }
}

/// The default skew the creation times are bounded by (the replay guard's).
const SKEW_MS: u64 = 300_000;

/// A far-future creation time lifts its chat's watermark to the skew's edge at most: an event
/// created after that edge is applied (it lifted the mark to 1e308 once, every later event
/// stale for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_future_creation_time_does_not_poison_the_watermark() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start(dir.path(), "", &file_route(dir.path(), "watermark = true"));
    let client = client();
    let now_ms = now_secs() * 1000;
    for (id, created) in [
        ("far", "1e308".to_owned()),
        ("next", (now_ms + SKEW_MS + 2_000).to_string()),
    ] {
        let (status, body) =
            post_signed(&client, &gateway.url(), &message(id, "oc_w", &created)).await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until("both events", Duration::from_secs(10), || {
        lines(dir.path()).len() == 2
    })
    .await;
    let written = lines(dir.path());
    let far = written[0]["created_at_ms"].as_u64().expect("ms");
    assert!(far <= now_ms + SKEW_MS + 60_000, "{far}");
}

/// An event from a clock ahead by more than the skew, after one that came within it: taken at
/// the skew's edge it is not behind the first, so it is applied (taken as now, it was dropped
/// as stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_time_beyond_the_skew_is_not_dropped_behind_one_within_it() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start(dir.path(), "", &file_route(dir.path(), "watermark = true"));
    let client = client();
    let now_ms = now_secs() * 1000;
    for (id, created) in [
        ("within", now_ms + SKEW_MS - 5_000),
        ("beyond", now_ms + SKEW_MS + 60_000),
    ] {
        let (status, body) = post_signed(
            &client,
            &gateway.url(),
            &message(id, "oc_edge", &created.to_string()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_until("both events", Duration::from_secs(10), || {
        lines(dir.path()).len() == 2
    })
    .await;
    let (_, stats) = gateway.admin_get("/admin/stats").await;
    assert!(stats.contains("\"stale_dropped\":0"), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_and_records_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    // A downstream that never answers within the test: every event stays queued.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hung_addr = hung.local_addr().expect("addr");
    let sections = format!(
        "[dispatcher]\nmax_queued = 3\n\n[[route]]\nevents = [\"*\"]\nsink = \"http\"\nurl = \"http://{hung_addr}/\"\ntimeout = \"5m\"\n"
    );
    let gateway = Serve::start(dir.path(), "", &sections);
    let client = client();
    let mut statuses = Vec::new();
    for i in 0..6 {
        let (status, _) = post_signed(
            &client,
            &gateway.url(),
            &message(&format!("q{i}"), &format!("oc{i}"), "1"),
        )
        .await;
        statuses.push(status);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(statuses, [200, 200, 200, 503, 503, 503]);
    let (status, ready) = gateway.admin_get("/readyz").await;
    assert_eq!(status, 503);
    assert!(ready.contains("max_queued"), "{ready}");
    let (_, stats) = gateway.admin_get("/admin/stats").await;
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("json");
    assert_eq!(stats["gateway"]["admitted"], 3, "{stats}");
    drop(hung);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_created_for_the_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let sections = format!(
        "[store]\npath = \"{}\"\n\n{}",
        dir.path().join("state/oncegate").display(),
        file_route(dir.path(), "")
    );
    let gateway = Serve::start(dir.path(), "", &sections);
    let (status, _) = post_signed(&client(), &gateway.url(), &message("f1", "oc", "1")).await;
    assert_eq!(status, 200);
    wait_until("a line", Duration::from_secs(10), || {
        !lines(dir.path()).is_empty()
    })
    .await;
    let mode = |p: &str| {
        std::fs::metadata(dir.path().join(p))
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(
        [
            mode("state"),
            mode("state/oncegate"),
            mode("out"),
            mode("out/events.jsonl")
        ],
        [0o700, 0o700, 0o700, 0o600]
    );
    // Every journal file in the store's folder: segments, snapshots, the lock.
    let journal: Vec<(String, u32)> = std::fs::read_dir(dir.path().join("state/oncegate"))
        .expect("list")
        .map(|entry| {
            let entry = entry.expect("entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            (name.clone(), mode(&format!("state/oncegate/{name}")))
        })
        .collect();
    assert!(
        journal.iter().any(|(name, _)| name.ends_with(".log")),
        "{journal:?}"
    );
    assert!(
        journal.iter().all(|(_, mode)| *mode == 0o600),
        "{journal:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_is_checked_first_in_constant_time_and_any_case() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start(
        dir.path(),
        "admin_token = \"adm1n-t0ken\"",
        &file_route(dir.path(), ""),
    );
    let client = client();
    let get = |path: &str, auth: Option<&str>| {
        let mut request = client.get(format!("{}{path}", gateway.admin));
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        async move {
            let response = request.send().await.expect("get");
            (
                response.status().as_u16(),
                response.text().await.unwrap_or_default(),
            )
        }
    };
    // Unauthenticated: 401 before the query is even read.
    assert_eq!(get("/admin/record?nonsense", None).await.0, 401);
    assert_eq!(get("/admin/stats", Some("Bearer wrong")).await.0, 401);
    assert_eq!(get("/admin/stats", Some("bearer adm1n-t0ken")).await.0, 200);
    assert_eq!(get("/admin/stats", Some("BEARER adm1n-t0ken")).await.0, 200);
    let (status, body) = get(
        &format!("/admin/record?key=+0{}", "0".repeat(30)),
        Some("Bearer adm1n-t0ken"),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = get("/admin/record", Some("Bearer adm1n-t0ken")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("key="), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_downstream_answer_is_not_kept() {
    // A downstream that answers every event with 200 KiB.
    let app = axum::Router::new().route(
        "/in",
        axum::routing::post(|| async { vec![b'a'; 200 * 1024] }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().expect("dir");
    let sections = format!(
        "[[route]]\nevents = [\"*\"]\nsink = \"http\"\nurl = \"http://{addr}/in\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"
    );
    let gateway = Serve::start(dir.path(), "", &sections);
    let client = client();
    let (status, _) = post_signed(&client, &gateway.url(), &message("big", "oc", "1")).await;
    assert_eq!(status, 200);
    let key = oncegate_core::key_for("feishu", APP_ID, "event_id", "big");
    let found = gateway
        .admin_until(&format!("/admin/record?key={key}"), |body| {
            body.contains("\"completed\"")
        })
        .await;
    let found: serde_json::Value = serde_json::from_str(&found).expect("json");
    assert_eq!(
        found["record"]["outcome_bytes"],
        serde_json::Value::Null,
        "{found}"
    );
}

#[test]
fn a_redis_password_never_reaches_the_startup_error() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("oncegate.toml");
    // Nothing listens on port 1: the connection fails at start.
    std::fs::write(
        &config,
        "[store]\nbackend = \"redis\"\nurl = \"redis://:hunter2@127.0.0.1:1/0\"\n\n[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n",
    )
    .expect("config");
    let served = oncegate()
        .args(["serve", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .output()
        .expect("serve");
    let err = String::from_utf8_lossy(&served.stderr);
    assert!(!served.status.success(), "{err}");
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// A tmpfs of `size` mounted at `at` for the test's life (root only: `None` where mounting is
/// not allowed, and the test says it did not run).
struct SmallDisk {
    at: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).expect("mount point");
        let mounted = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .is_ok_and(|status| status.success());
        mounted.then(|| Self { at: at.to_owned() })
    }

    fn grow(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.at)
            .status()
            .expect("mount");
        assert!(status.success(), "remount {}", self.at.display());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .status();
    }
}

/// The embedded store on a disk that fills up: the gateway answers 503 for what it cannot
/// keep, then stops with an error line and a non-zero exit (a supervisor restarts it) instead of
/// answering 503 forever; started again once there is room, it delivers every event it had
/// acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_gateway_and_a_restart_delivers_what_was_acknowledged() {
    let dir = tempfile::tempdir().expect("dir");
    let Some(disk) = SmallDisk::mount(&dir.path().join("disk"), "2m") else {
        eprintln!("NOT RUN: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let sections = format!(
        "[store]\npath = \"{}\"\n\n{}",
        disk.at.join("store").display(),
        file_route(dir.path(), "")
    );
    let mut gateway = Serve::start(dir.path(), "", &sections);
    let client = client();
    let padding = "x".repeat(8 * 1024);
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for i in 0..2000 {
        let id = format!("disk-{i}");
        let mut plain: serde_json::Value =
            serde_json::from_str(&message(&id, &format!("oc_{}", i % 7), "1")).expect("json");
        plain["event"]["message"]["content"] = serde_json::Value::String(padding.clone());
        match tokio::time::timeout(
            Duration::from_secs(5),
            try_post_signed(&client, &gateway.url(), &plain.to_string()),
        )
        .await
        {
            Ok(Ok((200, _))) => acknowledged.push(id),
            Ok(Ok((503, _))) => refused += 1,
            Ok(Ok((status, body))) => panic!("{status} {body}"),
            // Gone (it stopped) or not answering.
            Ok(Err(_)) | Err(_) => break,
        }
        if refused > 0 && gateway.child.try_wait().expect("wait").is_some() {
            break;
        }
    }
    eprintln!(
        "full disk: {} acknowledged, {refused} refused (503) before the gateway stopped",
        acknowledged.len()
    );
    assert!(refused > 0, "the disk never filled");
    assert!(!acknowledged.is_empty());
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = gateway.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the gateway did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{status:?}");
    let log = gateway.stderr();
    assert!(
        log.contains("ERROR") && log.contains("stopping, for the supervisor"),
        "{log}"
    );
    // Room again: the same store, started again, delivers every acknowledged event (some may
    // come twice, with the same id: delivered before the disk filled, their completion not
    // written).
    disk.grow("256m");
    let _again = Serve::start(dir.path(), "", &sections);
    wait_until(
        "every acknowledged event delivered",
        Duration::from_secs(30),
        || {
            let delivered: std::collections::HashSet<String> = lines(dir.path())
                .iter()
                .filter_map(|line| line["event_id"].as_str().map(str::to_owned))
                .collect();
            acknowledged.iter().all(|id| delivered.contains(id))
        },
    )
    .await;
    let delivered = lines(dir.path()).len();
    eprintln!(
        "full disk: after the restart all {} delivered ({delivered} lines: {} again, same ids)",
        acknowledged.len(),
        delivered.saturating_sub(acknowledged.len())
    );
}

/// A crash between the file sink's write and its sync can leave the last line half-written.
/// The next start cuts it off (its events were never acknowledged, so they come again), and the
/// next line starts on a line of its own; before, it was appended to the torn bytes and the
/// two made one line no reader could parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_torn_by_a_crash_is_cut_off_at_the_next_start() {
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    std::fs::write(
        out.join("events.jsonl"),
        "{\"kept\":1}\n{\"id\":\"msg_torn\",\"platform\":\"fei",
    )
    .expect("seed");
    let gateway = Serve::start(dir.path(), "", &file_route(dir.path(), ""));
    let (status, body) = post_signed(&client(), &gateway.url(), &message("m1", "oc", "1")).await;
    assert_eq!(status, 200, "{body}");
    wait_until("the event's line", Duration::from_secs(10), || {
        lines(dir.path()).len() == 2
    })
    .await;
    let written = std::fs::read_to_string(out.join("events.jsonl")).expect("read");
    assert!(written.ends_with('\n'), "{written}");
    let parsed: Vec<serde_json::Value> = written
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert_eq!(parsed[0]["kept"], 1);
    assert!(!written.contains("msg_torn"), "{written}");
    assert_eq!(parsed[1]["event_id"], "m1", "{written}");
    drop(gateway);

    // A path that names some other file (its end no line of this sink): not cut, not written;
    // serve refuses to start, saying why.
    let other = "#!/bin/sh\necho hi";
    std::fs::write(out.join("events.jsonl"), other).expect("seed");
    let config = dir.path().join("other.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"memory\"\n[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{}",
            file_route(dir.path(), "")
        ),
    )
    .expect("config");
    let said = refused_start(&config, &[]);
    assert!(said.contains("is this the events file?"), "{said}");
    assert_eq!(
        std::fs::read_to_string(out.join("events.jsonl")).expect("read"),
        other
    );
}
