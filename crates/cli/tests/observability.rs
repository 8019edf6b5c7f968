//! The shipped Prometheus rules and Grafana dashboard against a real gateway: every metric
//! they name is in its `/metrics` after traffic on every layer (webhooks with retries and
//! replays, a refused request, the long connection with a reconnect, a Redis store); the
//! rules treat missing data as an alert.

use crate::support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use oncegate_feishu_ws::ClientConfig;
use oncegate_feishu_ws::local::{self, LocalFeishu, PartOrder};
use support::{Serve, client, file_route, oncegate, wait_until};

const WS_APP: &str = "cli_obs_ws";
const WS_SECRET: &str = "obs-app-secret";

fn config(dir: &Path, redis: &str, domain: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{redis}"
prefix = "obs{prefix}"
partitions = 4

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[[api.caller]]
name = "shop"
token = "obs-caller-token"

[[source]]
name = "bot"
platform = "feishu"
app_id = "cli_obs"
encrypt_key = "feishu-key"
verification_token = "feishu-token"

[[source]]
name = "ws"
platform = "feishu"
app_id = "{WS_APP}"
transport = "websocket"
app_secret = "{WS_SECRET}"
domain = "{domain}"

{route}
"#,
        prefix = fastrand::u32(..),
        route = file_route(dir, "")
    )
}

/// Metric names in a Prometheus text exposition.
fn exposed(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// Every `oncegate_…` metric a rules file or dashboard names.
fn named(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("oncegate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn example(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rules_and_dashboard_name_only_metrics_the_gateway_exports() {
    let Ok(redis) = std::env::var("ONCEGATE_TEST_REDIS_URL") else {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    };
    let quick = ClientConfig {
        reconnect_count: -1,
        reconnect_interval: 1,
        reconnect_nonce: 1,
        ping_interval: 2,
    };
    let server = LocalFeishu::start(WS_APP, WS_SECRET, quick)
        .await
        .expect("local feishu");
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &redis, &server.domain()));
    assert!(
        server
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "{}",
        gateway.stderr()
    );
    // Webhooks with platform retries and replays.
    let simulated = oncegate()
        .args([
            "simulate",
            "--quiet",
            "--events",
            "200",
            "--concurrency",
            "8",
        ])
        .args(["--source", "bot", "--replays", "0.1"])
        .arg("--config")
        .arg(dir.path().join("oncegate.toml"))
        .args(["--url", &gateway.base, "--admin", &gateway.admin])
        .output()
        .expect("simulate");
    assert!(
        simulated.status.success(),
        "{}",
        String::from_utf8_lossy(&simulated.stderr)
    );
    // A refused request, and the long connection: events, a drop and a reconnect.
    let refused = client()
        .post(gateway.url().replace("/main", "/bot"))
        .body("not a callback")
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), 401, "unsigned");
    let first = server.connections()[0];
    for i in 0..3 {
        let event = local::message_event(
            WS_APP,
            &format!("obs-ws-{i}"),
            "oc_obs",
            1_700_000_000_000 + i,
        );
        server.push(first, &format!("obs{i}"), &event, 1, PartOrder::InOrder);
    }
    assert!(server.wait_all_acked(Duration::from_secs(15)).await);
    server.drop_connection(first);
    wait_until("a reconnect", Duration::from_secs(15), || {
        server.connections().iter().any(|c| *c != first)
    })
    .await;
    let metrics = gateway
        .admin_until("/metrics", |m| {
            m.contains("oncegate_ws_reconnects_total")
                && m.contains("oncegate_handler_seconds_bucket")
        })
        .await;
    let exported = exposed(&metrics);

    let rules = example("prometheus/oncegate-alerts.yml");
    let dashboard = example("grafana/oncegate.json");
    let scrape = example("prometheus/prometheus.yml");
    assert!(
        scrape.contains("oncegate-alerts.yml"),
        "the scrape config loads the rules"
    );
    for (file, text) in [("alert rules", &rules), ("dashboard", &dashboard)] {
        let names = named(text);
        assert!(names.len() >= 8, "{file} names metrics: {names:?}");
        let missing: Vec<_> = names.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} names metrics the gateway does not export: {missing:?}\nexported: {exported:?}"
        );
    }
    // Each rule is complete, and a gateway that vanishes is an alert, not silence.
    let alerts = rules.matches("- alert:").count();
    assert!(alerts >= 8, "{alerts} alerts");
    for field in ["expr:", "severity:", "summary:", "description:"] {
        assert_eq!(
            rules.matches(field).count(),
            alerts,
            "every alert has {field}"
        );
    }
    assert!(rules.contains("absent(up{job=\"oncegate\"})"));
    for needed in [
        "oncegate_dead_letters_total",
        "oncegate_dispatch_lag_seconds_bucket",
        "oncegate_ws_last_frame_age_seconds",
        "oncegate_store_circuit_open",
        "oncegate_requests_total",
        "oncegate_queue_oldest_age_seconds",
        "oncegate_store_errors_total",
    ] {
        assert!(rules.contains(needed), "an alert on {needed}");
    }
    // The sends and the business keys have their panels, and their series exist before the
    // first call (the source "ws" can send, "shop" is a caller).
    for needed in [
        "oncegate_sends_total",
        "oncegate_keys_total",
        "oncegate_dead_letters_kept",
    ] {
        assert!(dashboard.contains(needed), "a panel on {needed}");
    }
    assert!(
        metrics.contains(r#"oncegate_keys_total{caller="shop",op="claim",outcome="acquired"} 0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"oncegate_sends_total{source="ws",outcome="sent"} 0"#),
        "{metrics}"
    );
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            assert!(
                target["expr"]
                    .as_str()
                    .is_some_and(|e| e.contains("oncegate_"))
            );
        }
    }
    // Labels stay bounded: no event, chat or message ids among them.
    for id in ["oc_obs", "obs-ws-", "om_"] {
        assert!(!metrics.contains(id), "{id} in /metrics");
    }
}

/// Before any traffic, the counters a rate or an alert reads are there at 0 (`increase()` over
/// a series that appears at its first increment misses that increment), and a long connection
/// that never got a frame reports its silence since the start, not a fresh 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_there_from_the_start_and_a_silent_connection_ages() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), "", &format!("http://127.0.0.1:{closed}"));
    // The same sources on a memory store.
    let store_end = config.find("[server]").expect("server");
    let config = format!("[store]\nbackend = \"memory\"\n\n{}", &config[store_end..]);
    let gateway = Serve::start_with(dir.path(), &config);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let metrics = support::metrics_text(&gateway.admin).await;
    let value = |series: &str| -> Option<f64> {
        metrics
            .lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    };
    for series in [
        "oncegate_future_creation_times_total ",
        "oncegate_set_aside_total ",
        "oncegate_tenant_queue_full_total ",
        "oncegate_reloads_total{outcome=\"applied\"}",
        "oncegate_reloads_total{outcome=\"refused\"}",
        "oncegate_connections_refused_total{listener=\"webhooks\"}",
    ] {
        assert_eq!(value(series), Some(0.0), "{series} at 0 in:\n{metrics}");
    }
    let callbacks = metrics
        .lines()
        .find(|l| {
            l.starts_with("oncegate_callbacks_total{")
                && l.contains("source=\"bot\"")
                && l.contains("status=\"200\"")
        })
        .unwrap_or_else(|| panic!("the bot's 200s at 0: {metrics}"));
    assert!(callbacks.ends_with(" 0"), "{callbacks}");
    let age = value("oncegate_ws_last_frame_age_seconds{source=\"ws\"}")
        .unwrap_or_else(|| panic!("the silent connection's age: {metrics}"));
    assert!(age >= 1.0, "never a frame, yet {age} s old");
}
