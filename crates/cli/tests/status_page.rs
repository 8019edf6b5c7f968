//! The live status page in a real browser: Debian's headless chromium opens it on a gateway
//! under webhook load (`oncegate simulate`) and long-connection frames, the counters show the
//! traffic and the charts move; a screenshot is kept in `target/test-output/status-page.png`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::support;

use oncegate_feishu_ws::local::{self, LocalFeishu};
use support::{Serve, client, file_route, oncegate};

const TOKEN: &str = "status-page-admin-token";

const WS_APP: &str = "cli_status_ws";
const WS_SECRET: &str = "status-ws-secret";

fn config(dir: &Path, domain: &str) -> String {
    format!(
        r#"
[store]
backend = "memory"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "{TOKEN}"

[[source]]
name = "bot"
platform = "feishu"
app_id = "cli_status"
encrypt_key = "feishu-key"
verification_token = "feishu-token"

[[source]]
name = "ws"
platform = "feishu"
app_id = "{WS_APP}"
transport = "websocket"
app_secret = "{WS_SECRET}"
domain = "{domain}"

{}
"#,
        file_route(dir, "")
    )
}

/// Headless chromium with its DevTools endpoint on a free port, killed when dropped.
struct Browser {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn open(url: &str) -> Self {
        let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .expect("chromium is missing: scripts/test installs Debian's chromium package");
        let profile = tempfile::tempdir().expect("profile");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        // The flags keep chromium off the network (this machine's is closed) and sandbox-free
        // (CI runs as root).
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=412,915",
                &format!("--remote-debugging-port={port}"),
                &format!("--user-data-dir={}", profile.path().display()),
                url,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        Self {
            child,
            port,
            _profile: profile,
        }
    }

    /// The page's DevTools WebSocket.
    async fn page(&self) -> Page {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = loop {
            let listed = client()
                .get(format!("http://127.0.0.1:{}/json/list", self.port))
                .send()
                .await;
            if let Ok(listed) = listed
                && let Ok(targets) = listed.json::<Vec<Value>>().await
                && let Some(url) = targets
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            {
                break url.to_owned();
            }
            assert!(Instant::now() < deadline, "chromium never listed its page");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (socket, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("devtools");
        Page { socket, next: 0 }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Page {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next: u64,
}

impl Page {
    /// One DevTools command and its result (events in between are skipped).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let command = json!({"id": id, "method": method, "params": params});
        self.socket
            .send(Message::text(command.to_string()))
            .await
            .expect("send");
        loop {
            let message = tokio::time::timeout(Duration::from_secs(20), self.socket.next())
                .await
                .expect("devtools answers")
                .expect("open")
                .expect("message");
            let Message::Text(text) = message else {
                continue;
            };
            let answer: Value = serde_json::from_str(&text).expect("json");
            if answer["id"] == id {
                assert!(answer["error"].is_null(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// Evaluates `expression` in the page: its JSON value.
    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        result["result"]["value"].clone()
    }

    /// The page's reading of `tile`: its shown value and the samples of its chart.
    async fn tile(&mut self, tile: &str) -> (String, Vec<f64>) {
        let shown = self
            .eval(&format!("document.getElementById('v-{tile}').textContent"))
            .await;
        let series = self
            .eval(&format!("window.oncegate.series['{tile}']"))
            .await;
        (
            shown.as_str().unwrap_or_default().to_owned(),
            series
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default(),
        )
    }
}

fn screenshot_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("test-output/status-page.png")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_a_gateway_under_load_and_its_charts_move() {
    use base64::Engine;
    let dir = tempfile::tempdir().expect("dir");
    // Long-connection traffic beside the webhooks: a local Feishu the gateway dials.
    let quick = oncegate_feishu_ws::ClientConfig {
        reconnect_count: -1,
        reconnect_interval: 1,
        reconnect_nonce: 1,
        ping_interval: 2,
    };
    let feishu = std::sync::Arc::new(
        LocalFeishu::start(WS_APP, WS_SECRET, quick)
            .await
            .expect("local feishu"),
    );
    let serve = Serve::start_with(dir.path(), &config(dir.path(), &feishu.domain()));
    assert!(
        feishu
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "{}",
        serve.stderr()
    );
    // The page without its token asks for it; the data stays closed.
    let (status, _) = serve.admin_get("/admin/live").await;
    assert_eq!(status, 401);
    let (status, html) = serve.admin_get("/status").await;
    assert_eq!(status, 200);
    assert!(html.contains("<canvas"), "{html}");
    // The page first: a browser that starts slowly (a fresh machine, a busy CI) must not miss
    // the traffic it is to show.
    let browser = Browser::open(&format!("{}/status#token={TOKEN}", serve.admin));
    let mut page = browser.page().await;
    // A steady stream for the page to watch: 300 requests a second for about 12 s.
    let mut load = oncegate()
        .args([
            "simulate",
            "--quiet",
            "--events",
            "3000",
            "--rate",
            "300",
            "--concurrency",
            "8",
            "--source",
            "bot",
        ])
        .arg("--config")
        .arg(dir.path().join("oncegate.toml"))
        .args(["--url", &serve.base, "--admin", &serve.admin])
        .env("ONCEGATE_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("simulate");
    const WS_EVENTS: usize = 600;
    let plan: Vec<(String, Vec<u8>)> = (0..WS_EVENTS)
        .map(|i| {
            let event = local::message_event(
                WS_APP,
                &format!("ws-page-{i}"),
                &format!("oc_ws_{}", i % 10),
                1_700_000_000_000 + i as u64,
            );
            (format!("wsm{i}"), event)
        })
        .collect();
    let pushing = {
        let feishu = feishu.clone();
        tokio::spawn(async move {
            feishu
                .drive_at(plan, 16, Duration::from_secs(60), 60.0)
                .await
        })
    };
    // Let the page gather a few seconds of samples while the traffic flows.
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        let (shown, series) = page.tile("requests").await;
        if series.iter().filter(|v| **v > 0.0).count() >= 3 {
            break (shown, series);
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed traffic: {shown} {series:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (shown, series) = page.tile("requests").await;
    assert!(series.len() >= first.1.len() + 2, "new samples: {series:?}");
    let rate: f64 = shown.trim_end_matches('k').parse().unwrap_or(0.0);
    assert!(rate > 0.0, "a request rate is shown: {shown:?}");
    // The chart moves: its samples are rates that differ from second to second, drawn.
    let distinct: std::collections::HashSet<u64> = series.iter().map(|v| v.to_bits()).collect();
    assert!(distinct.len() >= 2, "the chart changes: {series:?}");
    let drawn = page
        .eval("document.getElementById('c-requests').toDataURL().length")
        .await;
    let blank = page
        .eval("(() => { const c = document.createElement('canvas'); const r = document.getElementById('c-requests'); c.width = r.width; c.height = r.height; return c.toDataURL().length; })()")
        .await;
    assert!(
        drawn.as_u64() > blank.as_u64(),
        "a line is drawn: {drawn} vs {blank}"
    );
    let (_, admitted) = page.tile("admitted").await;
    assert!(admitted.iter().any(|v| *v > 0.0), "admitted: {admitted:?}");
    let ready = page
        .eval("document.getElementById('ready').textContent")
        .await;
    assert_eq!(ready, "ready");
    // The memory store keeps nothing across a restart: said on the page, as in /readyz.
    let risk = page
        .eval("(() => { const r = document.getElementById('at-risk'); return r.hidden ? '' : r.textContent; })()")
        .await;
    assert!(
        risk.as_str()
            .is_some_and(|r| r.starts_with("at risk: durability: ")),
        "{risk}"
    );
    let drops = page
        .eval("document.getElementById('drops').textContent")
        .await;
    assert!(
        drops.as_str().unwrap_or_default().contains("event_key"),
        "{drops}"
    );
    // The busiest tenants are listed from /admin/tenants (the file route keeps the queue
    // near empty: none, or the one tenant of the traffic).
    let tenants = page
        .eval("document.getElementById('tenants').textContent")
        .await;
    let tenants = tenants.as_str().unwrap_or_default();
    assert!(
        tenants == "none queued" || tenants.starts_with("feishu "),
        "{tenants}"
    );
    // The queue's age tile reads the per-partition samples.
    let queue_note = page
        .eval("document.getElementById('t-queue_age').textContent")
        .await;
    assert!(
        queue_note
            .as_str()
            .unwrap_or_default()
            .starts_with("deepest partition: ")
            && queue_note.as_str().unwrap_or_default().ends_with(" events"),
        "{queue_note}"
    );
    // One gateway on its own store owns every partition, and says so.
    let partitions_note = page
        .eval("document.getElementById('t-partitions').textContent")
        .await;
    assert_eq!(partitions_note, "one gateway: it owns them all");
    let (partitions_shown, _) = page.tile("partitions").await;
    assert_eq!(partitions_shown, "all");
    // The long connection is on the page while its frames flow: open, a recent frame.
    let cells = page
        .eval("Array.from(document.querySelectorAll('#connections td')).map(td => td.textContent)")
        .await;
    let cells: Vec<&str> = cells
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(cells.first(), Some(&"ws"), "{cells:?}");
    assert!(
        cells.get(2).and_then(|open| open.parse::<u32>().ok()) >= Some(1),
        "open connections: {cells:?}"
    );
    assert!(
        cells
            .get(4)
            .is_some_and(|age| age.ends_with(" s ago") || *age == "just now"),
        "last frame, as people say an age: {cells:?}"
    );
    // Each webhook source on a row of its own, with what it was answered.
    let rows = page
        .eval("Array.from(document.querySelectorAll('#sources tr')).map(tr => Array.from(tr.cells).map(td => td.textContent))")
        .await;
    let rows = rows.as_array().cloned().unwrap_or_default();
    let bot = rows
        .iter()
        .find(|row| row[0] == "bot")
        .unwrap_or_else(|| panic!("the bot's row: {rows:?}"));
    assert_eq!(bot[1], "feishu", "{bot:?}");
    assert!(
        bot[2]
            .as_str()
            .and_then(|n| n.replace(',', "").parse::<f64>().ok())
            > Some(0.0),
        "accepted: {bot:?}"
    );
    // Ages as people say them, not "21.8k ms ago".
    let said = page
        .eval("[ago(400), ago(21800), ago(200000), ago(9000000)].join(' | ')")
        .await;
    assert_eq!(said, "just now | 22 s ago | 3 min ago | 2.5 h ago");
    // Degraded is not the green of all well: the page's own render, given a degraded sample.
    let class = page
        .eval("(() => { const all = window.oncegate.samples; const s = all[all.length - 1]; render({ ...s, ready: true, degraded: ['a long connection is down'] }, null); return document.getElementById('ready').className; })()")
        .await;
    assert_eq!(class, "warn");
    // At a phone's width the page never scrolls sideways: wide tables scroll within themselves.
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 360, "height": 740, "deviceScaleFactor": 1, "mobile": true}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let overflow = page
        .eval("document.documentElement.scrollWidth - window.innerWidth")
        .await;
    assert!(
        overflow.as_f64() <= Some(0.0),
        "{overflow} px sideways at 360 px"
    );
    page.call("Emulation.clearDeviceMetricsOverride", json!({}))
        .await;
    let (_, ages) = page.tile("queue_age").await;
    assert!(ages.iter().all(|a| a.is_finite() && *a >= 0.0), "{ages:?}");
    // What a person would see on a phone.
    let shot = page
        .call("Page.captureScreenshot", json!({"format": "png"}))
        .await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().expect("png"))
        .expect("base64");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let path = screenshot_path();
    std::fs::create_dir_all(path.parent().expect("folder")).expect("folder");
    std::fs::write(&path, &png).expect("screenshot");
    println!("status page screenshot: {}", path.display());
    // The last hour is the gateway's: once it kept a point of this traffic, a page opened
    // now draws it at once.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let history: Value = client()
            .get(format!("{}/admin/history", serve.admin))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("history")
            .json()
            .await
            .expect("json");
        let points = history["points"].as_array().cloned().unwrap_or_default();
        if points.iter().any(|p| p["admitted"].as_f64() > Some(0.0)) {
            assert_eq!(history["step_seconds"], 10);
            break;
        }
        assert!(Instant::now() < deadline, "no point kept: {history}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let later = Browser::open(&format!("{}/status#token={TOKEN}", serve.admin));
    let mut fresh = later.page().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let admitted = loop {
        let series = fresh.eval("window.oncegate.hour['h-admitted']").await;
        let values: Vec<f64> = series
            .as_array()
            .map(|s| s.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        if !values.is_empty() {
            break values;
        }
        assert!(Instant::now() < deadline, "the hour never loaded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(admitted.iter().any(|v| *v > 0.0), "{admitted:?}");
    let p99 = fresh
        .eval("document.getElementById('v-h-ingress').textContent")
        .await;
    assert!(
        p99.as_str()
            .is_some_and(|t| t.parse::<f64>().is_ok_and(|ms| ms > 0.0)),
        "a webhook p99 in ms: {p99}"
    );
    let drawn = fresh
        .eval("document.getElementById('c-h-admitted').toDataURL().length")
        .await;
    let blank = fresh
        .eval("(() => { const c = document.createElement('canvas'); const r = document.getElementById('c-h-admitted'); c.width = r.width; c.height = r.height; return c.toDataURL().length; })()")
        .await;
    assert!(drawn.as_u64() > blank.as_u64(), "the hour is drawn");
    let _ = load.kill();
    let _ = load.wait();
    let driven = pushing.await.expect("pushes");
    assert!(driven.acked >= WS_EVENTS, "{driven:?}");
}

/// After a restart the dead-letters tile shows what the store keeps (the dead letters of the
/// run before), not the new run's count of 0; the note tells this run's apart.
/// A gateway (embedded store in `dir`) whose one route posts to a loopback port nobody listens
/// on, its `[dispatcher]` saying `dispatcher`.
fn closed_downstream(dir: &Path, dispatcher: &str) -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    format!(
        r#"
[store]
backend = "embedded"
path = "{}"

[dispatcher]
{dispatcher}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "{TOKEN}"

[[source]]
name = "bot"
platform = "feishu"
app_id = "cli_status"
encrypt_key = "feishu-key"
verification_token = "feishu-token"

[[route]]
events = ["*"]
sink = "http"
url = "http://{closed}/in"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
timeout = "1s"
"#,
        dir.join("data").display()
    )
}

/// Deliveries that fail show on the page, the latest first: the event, its attempts, the last
/// one's outcome and answer, and when the next is due — then that they were dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_failing_deliveries_with_their_next_attempt() {
    let dir = tempfile::tempdir().expect("dir");
    let config = closed_downstream(
        dir.path(),
        "max_attempts = 2\nbackoff_base = \"8s\"\nbackoff_max = \"8s\"",
    );
    let serve = Serve::start_with(dir.path(), &config);
    let browser = Browser::open(&format!("{}/status#token={TOKEN}", serve.admin));
    let mut page = browser.page().await;
    // Beside the page: simulate waits for the outcome, which comes only after the retries.
    let mut simulate = oncegate()
        .args(["simulate", "--quiet", "--events", "2"])
        .args(["--source", "bot", "--config"])
        .arg(dir.path().join("oncegate.toml"))
        .args(["--url", &serve.base, "--admin", &serve.admin])
        .env("ONCEGATE_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("simulate");
    let rows = "Array.from(document.querySelectorAll('#failing tr')).map(tr => \
                Array.from(tr.querySelectorAll('td')).map(td => td.textContent))";
    let mut wait = async |what: &str, done: &dyn Fn(&[Vec<String>]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let shown: Vec<Vec<String>> =
                serde_json::from_value(page.eval(rows).await).unwrap_or_default();
            if done(&shown) {
                return shown;
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {what}: {shown:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let retrying = wait("two failing deliveries waiting for their retry", &|rows| {
        rows.len() == 2
            && rows
                .iter()
                .all(|row| row.len() == 6 && row[5].contains("(in "))
    })
    .await;
    for row in &retrying {
        assert!(row[0].starts_with("feishu "), "{row:?}");
        assert_eq!(row[1], "im.message.receive_v1", "{row:?}");
        assert!(row[2].starts_with('1'), "{row:?}");
        assert!(row[3].starts_with("retry at "), "{row:?}");
        assert!(!row[4].is_empty(), "the downstream's answer: {row:?}");
        assert!(row[5].contains("(in "), "when the next is due: {row:?}");
    }
    let dead = wait("both dead-lettered after their second attempt", &|rows| {
        rows.len() == 2
            && rows
                .iter()
                .all(|row| row.len() == 6 && row[3].starts_with("dead_letter"))
    })
    .await;
    for row in &dead {
        assert!(row[2].starts_with('2'), "{row:?}");
        assert_eq!(row[5], "–", "{row:?}");
        assert!(row[4].contains("gave up after 2 attempts"), "{row:?}");
    }
    // Each event's every attempt, folded under its count.
    let history: Vec<Vec<String>> = serde_json::from_value(
        page.eval(
            "Array.from(document.querySelectorAll('#failing ol.history')).map(ol => \
             Array.from(ol.querySelectorAll('li')).map(li => li.textContent))",
        )
        .await,
    )
    .unwrap_or_default();
    assert_eq!(history.len(), 2, "{history:?}");
    for attempts in &history {
        assert_eq!(attempts.len(), 2, "{attempts:?}");
        assert!(
            attempts[0].starts_with("attempt 0: retry") && attempts[0].contains(", next at "),
            "{attempts:?}"
        );
        assert!(
            attempts[1].starts_with("attempt 1: dead_letter"),
            "{attempts:?}"
        );
    }
    let _ = simulate.kill();
    let _ = simulate.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_page_shows_the_dead_letters_the_store_keeps() {
    const DEAD: u64 = 5;
    let dir = tempfile::tempdir().expect("dir");
    // A downstream nobody listens on, one attempt each: every event is dead-lettered.
    let config = closed_downstream(dir.path(), "max_attempts = 1");
    let stats = |serve: &Serve| {
        let admin = serve.admin.clone();
        async move {
            let answer = client()
                .get(format!("{admin}/admin/stats"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .expect("stats");
            answer.json::<Value>().await.expect("json")
        }
    };
    {
        let mut serve = Serve::start_with(dir.path(), &config);
        let status = oncegate()
            .args(["simulate", "--quiet", "--events", &DEAD.to_string()])
            .args(["--source", "bot", "--config"])
            .arg(dir.path().join("oncegate.toml"))
            .args(["--url", &serve.base, "--admin", &serve.admin])
            .env("ONCEGATE_ADMIN_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("simulate");
        // Every event dead-lettered: simulate says so and fails.
        assert_eq!(status.code(), Some(2), "simulate: {status}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while stats(&serve).await["store"]["dead_letters"] != DEAD {
            assert!(Instant::now() < deadline, "never dead-lettered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        serve.signal("TERM");
        serve.wait_exit(Duration::from_secs(20));
    }
    let serve = Serve::start_with(dir.path(), &config);
    assert_eq!(stats(&serve).await["gateway"]["dead_letters"], 0);
    let browser = Browser::open(&format!("{}/status#token={TOKEN}", serve.admin));
    let mut page = browser.page().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (shown, series) = page.tile("dead_letters").await;
        if shown == DEAD.to_string() {
            assert_eq!(series.last(), Some(&(DEAD as f64)), "{series:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tile never showed the kept dead letters: {shown:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let note = page
        .eval("document.getElementById('t-dead_letters').textContent")
        .await;
    assert_eq!(note, "0 since this start");
    // Listed when asked; one replayed and one purged from the page, each after a confirmation.
    page.eval("window.confirm = () => true; document.getElementById('dlq-load').click()")
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let ids: Vec<String> = loop {
        let ids: Vec<String> = serde_json::from_value(
            page.eval("Array.from(document.querySelectorAll('#dlq button[data-act=purge]')).map(b => b.dataset.id)")
                .await,
        )
        .unwrap_or_default();
        if ids.len() == DEAD as usize {
            break ids;
        }
        assert!(Instant::now() < deadline, "the listing: {ids:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    page.eval(&format!(
        "document.querySelector('#dlq button[data-act=purge][data-id=\"{}\"]').click()",
        ids[0]
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats(&serve).await["store"]["dead_letters"] != DEAD - 1 {
        assert!(Instant::now() < deadline, "never purged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    page.eval(&format!(
        "document.querySelector('#dlq button[data-act=replay][data-id=\"{}\"]').click()",
        ids[1]
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Replayed into its queue, it meets the closed downstream again: this run's first dead
    // letter.
    while stats(&serve).await["gateway"]["dead_letters"].as_u64() != Some(1) {
        assert!(
            Instant::now() < deadline,
            "never replayed: {}",
            stats(&serve).await["gateway"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
