//! The long connection through the binary: a local Feishu-like server pushes events to
//! `oncegate serve`, which admits them into its store and delivers each once — across
//! dropped connections and resends, across two gateways on one Redis, and with one leader.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use oncegate_feishu_ws::ClientConfig;
use oncegate_feishu_ws::local::{self, LocalFeishu, PartOrder};
use support::{Serve, file_route, lines, redis_store, wait_until};

const APP: &str = "cli_e2e_ws";
const SECRET: &str = "e2e-app-secret";

fn quick() -> ClientConfig {
    ClientConfig {
        reconnect_count: -1,
        reconnect_interval: 1,
        reconnect_nonce: 1,
        ping_interval: 2,
    }
}

fn config(dir: &Path, store: &str, domain: &str, extra: &str) -> String {
    format!(
        r#"
[store]
{store}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[lease]
duration = "3s"
renew_every = "1s"

[[source]]
name = "bot"
platform = "feishu"
app_id = "{APP}"
transport = "websocket"
app_secret = "{SECRET}"
domain = "{domain}"
pong_grace = "2s"
{extra}

{route}
"#,
        route = file_route(dir, "")
    )
}

fn event(i: usize) -> Vec<u8> {
    local::message_event(
        APP,
        &format!("ws-e{i}"),
        &format!("oc_{}", i % 5),
        1_700_000_000_000 + i as u64,
    )
}

/// Pushes events `indexes` whole on `connection`, as messages `{prefix}{i}`.
fn push_each(
    server: &LocalFeishu,
    connection: u64,
    prefix: &str,
    indexes: impl Iterator<Item = usize>,
) {
    for i in indexes {
        let message_id = format!("{prefix}{i}");
        server.push(connection, &message_id, &event(i), 1, PartOrder::InOrder);
    }
}

/// Event ids delivered to the sinks of `dirs`, with how often.
fn delivered(dirs: &[&Path]) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for dir in dirs {
        for line in lines(dir) {
            let id = line["event_id"].as_str().unwrap_or_default().to_owned();
            *seen.entry(id).or_insert(0) += 1;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_over_the_long_connection_are_delivered_once_across_drops_and_resends() {
    let server = LocalFeishu::start(APP, SECRET, quick())
        .await
        .expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let gateway = Serve::start_with(
        dir.path(),
        &config(dir.path(), &store, &server.domain(), ""),
    );
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "{}",
        gateway.stderr()
    );
    let first = server.connections()[0];
    for i in 0..40 {
        let parts = if i % 4 == 0 { 3 } else { 1 };
        server.push(
            first,
            &format!("m{i}"),
            &event(i),
            parts,
            PartOrder::Reversed,
        );
    }
    assert!(
        server.wait_all_acked(Duration::from_secs(15)).await,
        "{}",
        gateway.stderr()
    );
    // The connection drops with events in flight; Feishu resends the unacked ones, and some
    // acked ones too (a redelivery the gateway must recognize), on the new connection.
    for i in 40..60 {
        server.push(first, &format!("m{i}"), &event(i), 1, PartOrder::InOrder);
    }
    server.drop_connection(first);
    wait_until("a new connection", Duration::from_secs(15), || {
        server.connections().iter().any(|c| *c != first)
    })
    .await;
    let second = server.connections()[0];
    server.resend_unacked(second);
    push_each(&server, second, "again", (0..60).step_by(7));
    assert!(
        server.wait_all_acked(Duration::from_secs(15)).await,
        "{}",
        gateway.stderr()
    );
    wait_until("every event delivered", Duration::from_secs(15), || {
        delivered(&[dir.path()]).len() == 60
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = delivered(&[dir.path()]);
    assert_eq!(seen.len(), 60);
    assert!(seen.values().all(|n| *n == 1), "each once: {seen:?}");
    assert!(server.acks().iter().all(|ack| ack.code == 200));
    let (_, stats) = gateway.admin_get("/admin/stats").await;
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats");
    assert!(
        stats["gateway"]["duplicates"].as_u64() >= Some(9),
        "{stats}"
    );
    assert_eq!(stats["long_connections"][0]["open"], 1, "{stats}");
    assert!(stats["long_connections"][0]["reconnects"].as_u64() >= Some(1));
    // The last frame as an age (it was printed as "1796421.3M ms ago" from a wall-clock time).
    let age = stats["long_connections"][0]["last_frame_age_ms"].as_u64();
    assert!(age.is_some_and(|age| age < 60_000), "{stats}");
    let (ready, _) = gateway.admin_get("/readyz").await;
    assert_eq!(ready, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_redis_handle_a_redelivery_to_the_other_once() {
    let server = LocalFeishu::start(APP, SECRET, quick())
        .await
        .expect("server");
    let store = redis_store("ws2");
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut first = Serve::start_with(a.path(), &config(a.path(), &store, &server.domain(), ""));
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(15))
            .await
    );
    let conn_a = server.connections()[0];
    let second = Serve::start_with(b.path(), &config(b.path(), &store, &server.domain(), ""));
    assert!(
        server
            .wait_for_connections(2, Duration::from_secs(15))
            .await,
        "{}",
        second.stderr()
    );
    let conn_b = *server
        .connections()
        .iter()
        .find(|c| **c != conn_a)
        .expect("b");
    for i in 0..30 {
        server.push(conn_a, &format!("m{i}"), &event(i), 1, PartOrder::InOrder);
    }
    assert!(server.wait_all_acked(Duration::from_secs(15)).await);
    // Gateway A dies at once with more events sent to it; Feishu redelivers all of them, and
    // the already-acked ones too, to gateway B.
    for i in 30..45 {
        server.push(conn_a, &format!("m{i}"), &event(i), 1, PartOrder::InOrder);
    }
    first.child.kill().expect("kill -9");
    let _ = first.child.wait();
    server.resend_unacked(conn_b);
    push_each(&server, conn_b, "redelivered", 0..30);
    assert!(
        server.wait_all_acked(Duration::from_secs(20)).await,
        "{}",
        second.stderr()
    );
    // B takes A's partitions when their ownership (10 s) runs out, then A's claims (3 s): a
    // deadline against a hang, with room for a loaded machine, not a measure of speed.
    wait_until("every event delivered", Duration::from_secs(45), || {
        delivered(&[a.path(), b.path()]).len() == 45
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = delivered(&[a.path(), b.path()]);
    // A killed gateway may have delivered an event it could not complete: then B delivers it
    // again once A's lease runs out, which is at-least-once to the sink. What it must never do
    // is lose one, or deliver one twice that A completed.
    assert_eq!(seen.len(), 45, "none lost: {seen:?}");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    // In flight at the kill: per-chat order lets A hold one event of each of the 5 chats.
    assert!(
        twice.len() <= 5,
        "at most one per chat, the ones in flight at the kill: {twice:?}"
    );
    let (by_a, by_b) = (delivered(&[a.path()]), delivered(&[b.path()]));
    for (id, _) in &twice {
        assert_eq!(
            (by_a.get(*id), by_b.get(*id)),
            (Some(&1), Some(&1)),
            "{id}: once by the killed gateway, once by the one that took it over"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_holds_the_connection_and_another_takes_over() {
    let server = LocalFeishu::start(APP, SECRET, quick())
        .await
        .expect("server");
    let store = redis_store("wsl");
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let leader = "instances = \"leader\"\nconnections = 2";
    let mut first = Serve::start_with(
        a.path(),
        &config(a.path(), &store, &server.domain(), leader),
    );
    assert!(
        server
            .wait_for_connections(2, Duration::from_secs(15))
            .await
    );
    let second = Serve::start_with(
        b.path(),
        &config(b.path(), &store, &server.domain(), leader),
    );
    second
        .admin_until("/admin/stats", |body| body.contains("\"standby\""))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.connections().len(), 2, "only the leader connects");
    let (ready, _) = second.admin_get("/readyz").await;
    assert_eq!(ready, 200, "a standby is ready");
    // The leader dies without a word: its lease (3 s) runs out and the standby takes over.
    first.child.kill().expect("kill -9");
    let _ = first.child.wait();
    second
        .admin_until("/admin/stats", |body| body.contains("\"leading\""))
        .await;
    wait_until(
        "the new leader's connections",
        Duration::from_secs(15),
        || server.connections().len() == 2,
    )
    .await;
    let conn = server.connections()[0];
    server.push(conn, "m-after", &event(1), 1, PartOrder::InOrder);
    assert!(server.wait_all_acked(Duration::from_secs(10)).await);
    wait_until("delivered", Duration::from_secs(10), || {
        delivered(&[b.path()]).len() == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_handshake_shows_in_readiness_and_stats() {
    let server = LocalFeishu::start(APP, SECRET, quick())
        .await
        .expect("server");
    server.refuse_handshake(514, Some("1000040350"));
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(
        dir.path(),
        &config(dir.path(), "backend = \"memory\"", &server.domain(), ""),
    );
    let stats = gateway
        .admin_until("/admin/stats", |body| body.contains("too many connections"))
        .await;
    assert!(!stats.contains(SECRET), "{stats}");
    let (ready, why) = gateway.admin_get("/readyz").await;
    assert_eq!(ready, 503);
    assert!(why.contains("too many connections"), "{why}");
    assert!(
        gateway.stderr().contains("1000040350"),
        "logged: {}",
        gateway.stderr()
    );
    assert_eq!(server.handshakes().len(), 1);
    // Beside a webhook source the gateway stays ready (the webhooks still come in), and says
    // which long connection is down.
    server.refuse_handshake(514, Some("1000040350"));
    let dir = tempfile::tempdir().expect("dir");
    let hooks = "\n[[source]]\nname = \"hooks\"\nplatform = \"feishu\"\napp_id = \"cli_hooks\"\nencrypt_key = \"hooks-key\"\n";
    let both = Serve::start_with(
        dir.path(),
        &config(dir.path(), "backend = \"memory\"", &server.domain(), hooks),
    );
    both.admin_until("/admin/stats", |body| body.contains("too many connections"))
        .await;
    let (ready, why) = both.admin_get("/readyz").await;
    assert_eq!(ready, 200, "{why}");
    let why: serde_json::Value = serde_json::from_str(&why).expect("json");
    assert_eq!(
        why["degraded"],
        serde_json::json!(["long_connection bot"]),
        "{why}"
    );
    assert!(
        why["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|check| check["check"] == "long_connection bot" && check["ok"] == false)
    );
    // `oncegate status` and `oncegate ready` say the same: ready, one part degraded.
    for (command, said) in [
        ("status", "ready        true, degraded: long_connection bot"),
        ("status", "(webhooks and long connections)"),
        ("ready", "ready, degraded: long_connection bot"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
            .args([command, "--admin", &both.admin])
            .env_remove("ONCEGATE_CONFIG")
            .output()
            .expect("oncegate");
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{command}: {out}");
        assert!(out.contains(said), "{command}: {out}");
    }
    // The status page's feed says the same: ready, with the long connection degraded.
    let (_, live) = both.admin_get("/admin/live").await;
    let live: serde_json::Value = serde_json::from_str(&live).expect("json");
    assert_eq!(live["ready"], true, "{live}");
    assert!(
        live["degraded"][0]
            .as_str()
            .is_some_and(|d| d.contains("too many connections")),
        "{live}"
    );
}

/// A card handler that answers with how often it was called.
async fn card_handler(
    axum::extract::State(calls): axum::extract::State<
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
    >,
) -> axum::Json<serde_json::Value> {
    let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    axum::Json(serde_json::json!({"toast": {"type": "success", "content": format!("answer {n}")}}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_action_over_the_socket_is_answered_in_its_ack_once() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = axum::Router::new()
        .route("/cards", axum::routing::post(card_handler))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let downstream = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, handler).await });
    let server = LocalFeishu::start(APP, SECRET, quick())
        .await
        .expect("server");
    let dir = tempfile::tempdir().expect("dir");
    let cards = format!(
        "[[route]]\nevents = [\"card.action.trigger\"]\nsink = \"http\"\nurl = \"http://{downstream}/cards\"\n"
    );
    let config = config(dir.path(), "backend = \"memory\"", &server.domain(), "")
        .replace("[[route]]", &format!("{cards}\n[[route]]"));
    let gateway = Serve::start_with(dir.path(), &config);
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "{}",
        gateway.stderr()
    );
    let conn = server.connections()[0];
    let click = local::card_action(APP, "card-ws-1", "yes");
    server.push(conn, "m-click", &click, 1, PartOrder::InOrder);
    // The same click again (a second delivery of one callback): the stored answer.
    assert!(
        server.wait_all_acked(Duration::from_secs(10)).await,
        "{}",
        gateway.stderr()
    );
    server.push(conn, "m-click-again", &click, 1, PartOrder::InOrder);
    assert!(server.wait_all_acked(Duration::from_secs(10)).await);
    let acks = server.acks();
    assert_eq!(acks.len(), 2);
    for ack in &acks {
        assert_eq!(ack.code, 200);
        let answer: serde_json::Value =
            serde_json::from_slice(ack.data.as_deref().expect("data")).expect("json");
        assert_eq!(answer["toast"]["content"], "answer 1", "{answer}");
        let biz_rt: u64 = ack.biz_rt.as_deref().expect("biz_rt").parse().expect("ms");
        assert!(biz_rt < 3000, "within Feishu's 3 s: {biz_rt} ms");
    }
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    assert!(
        lines(dir.path()).is_empty(),
        "a card is answered, not queued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_plays_feishu_for_a_long_connection_source() {
    let dir = tempfile::tempdir().expect("dir");
    // A free loopback port for simulate's endpoint: the gateway dials the configured domain.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let domain = format!("http://127.0.0.1:{port}");
    let config = config(
        dir.path(),
        "backend = \"memory\"",
        &domain,
        "connections = 2",
    );
    std::fs::write(dir.path().join("oncegate.toml"), &config).expect("config");
    let simulate = spawn_simulate(dir.path(), &["--events", "300", "--duplicates", "0.3"]);
    // The gateway comes up after simulate listens, as the README says to start them. Its
    // admin port is chosen at start (port 0), so simulate cannot read its counters here: the
    // sink's lines tell what was delivered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gateway = Serve::start_with(dir.path(), &config);
    let output = finished(simulate).await;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text} {} {}",
        String::from_utf8_lossy(&output.stderr),
        gateway.stderr()
    );
    let pushed_line = text
        .lines()
        .find(|l| l.starts_with("pushed"))
        .expect("pushed line");
    assert!(
        pushed_line.contains("300 new") && pushed_line.contains("2 connection(s)"),
        "{text}"
    );
    let acked: usize = text
        .lines()
        .find(|l| l.starts_with("acked (code 200)"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .expect("acked");
    let pushed: usize = pushed_line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("pushed");
    assert_eq!(acked, pushed, "every push acked: {text}");
    wait_until("delivered", Duration::from_secs(10), || {
        lines(dir.path()).len() == 300
    })
    .await;
    let ids: std::collections::HashSet<String> = lines(dir.path())
        .iter()
        .map(|l| l["event_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids.len(), 300, "each event once");
}

/// `simulate --rate` paces a long connection's pushes too (it was ignored there: 40 events went
/// out in milliseconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_paces_a_long_connection_at_its_rate() {
    let dir = tempfile::tempdir().expect("dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let config = config(
        dir.path(),
        "backend = \"memory\"",
        &format!("http://127.0.0.1:{port}"),
        "",
    );
    std::fs::write(dir.path().join("oncegate.toml"), &config).expect("config");
    let simulate = spawn_simulate(
        dir.path(),
        &["--events", "40", "--duplicates", "0", "--rate", "50"],
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _gateway = Serve::start_with(dir.path(), &config);
    let output = finished(simulate).await;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{text}");
    // "throughput … events/s acked over S s": the 40th push is due 39 / 50 s after the first.
    let seconds: f64 = text
        .lines()
        .find(|l| l.starts_with("throughput"))
        .and_then(|l| l.split_once(" over ")?.1.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("throughput line");
    assert!(
        seconds >= 0.75,
        "40 events at 50/s took {seconds} s: {text}"
    );
    assert!(text.contains("acked (code 200)   40"), "{text}");
}

/// `oncegate simulate --quiet` on `dir`'s configuration with `args`, its output piped.
fn spawn_simulate(dir: &Path, args: &[&str]) -> std::process::Child {
    support::oncegate()
        .args(["simulate", "--quiet"])
        .args(args)
        .arg("--config")
        .arg(dir.join("oncegate.toml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("simulate")
}

/// What `simulate` printed once it ended.
async fn finished(simulate: std::process::Child) -> std::process::Output {
    tokio::task::spawn_blocking(move || simulate.wait_with_output())
        .await
        .expect("join")
        .expect("simulate ran")
}

/// A gateway started before its endpoint answers (the demo's other order: `serve`, then
/// `simulate`) dials again within seconds once the endpoint is up, however often it failed:
/// it waited Feishu's default two minutes after the second failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_before_its_endpoint_connects_within_seconds() {
    let dir = tempfile::tempdir().expect("dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let config = config(
        dir.path(),
        "backend = \"memory\"",
        &format!("http://127.0.0.1:{port}"),
        "",
    );
    let gateway = Serve::start_with(dir.path(), &config);
    // Nothing listens yet: let it fail twice (the second failure is where the default interval
    // of 120 s took over).
    let failures = |metrics: &str| -> u64 {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("oncegate_ws_reconnects_total{")
                    && l.contains("reason=\"connect_failed\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .map_or(0, |n| n as u64)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, metrics) = gateway.admin_get("/metrics").await;
        if failures(&metrics) >= 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never failed twice: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let server = LocalFeishu::start_at(&format!("127.0.0.1:{port}"), APP, SECRET, quick())
        .await
        .expect("local feishu");
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "the gateway did not dial in within 15 s of its endpoint: {}",
        gateway.stderr()
    );
}
