//! The gateway's log as configured: JSON lines, each with the instance name, and the lines
//! about an event with its key, platform, app and tenant; secrets never in it.

mod support;

use std::time::Duration;

use support::{Serve, oncegate, wait_until};

const ENCRYPT_KEY: &str = "log-test-encrypt-key";
const VERIFICATION: &str = "log-test-verification-token";
const ADMIN: &str = "log-test-admin-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_carry_the_instance_and_each_events_key_platform_and_app() {
    let dir = tempfile::tempdir().expect("dir");
    // A sink that is never there: every event is retried once and dead-lettered.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let config = format!(
        r#"
[log]
format = "json"
instance = "gw-7"

[store]
backend = "memory"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "{ADMIN}"

[dispatcher]
max_attempts = 2
backoff_base = "10ms"
backoff_max = "20ms"

[[source]]
name = "bot"
platform = "feishu"
app_id = "cli_logs"
encrypt_key = "{ENCRYPT_KEY}"
verification_token = "{VERIFICATION}"

[[route]]
events = ["*"]
sink = "http"
url = "http://127.0.0.1:{closed}/in"
timeout = "1s"
"#
    );
    let gateway = Serve::start_with(dir.path(), &config);
    let simulated = oncegate()
        .args(["simulate", "--quiet", "--events", "3", "--duplicates", "0"])
        .args(["--replays", "0", "--source", "bot"])
        .arg("--config")
        .arg(dir.path().join("oncegate.toml"))
        .args(["--url", &gateway.base, "--admin", &gateway.admin])
        .env("ONCEGATE_ADMIN_TOKEN", ADMIN)
        .output()
        .expect("simulate");
    assert!(simulated.status.success());
    wait_until("three dead letters logged", Duration::from_secs(20), || {
        gateway.stderr().matches("dead-lettered").count() >= 3
    })
    .await;
    let log = gateway.stderr();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
        })
        .collect();
    assert!(lines.len() >= 3, "{log}");
    for line in &lines {
        assert_eq!(line["instance"], "gw-7", "{line}");
        assert!(
            line["level"].is_string() && line["message"].is_string(),
            "{line}"
        );
    }
    let about_events: Vec<_> = lines
        .iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("dead-lettered") || m.contains("retrying"))
        })
        .collect();
    // The harness logs at warn: the dead letters (the retries are info lines).
    assert!(about_events.len() >= 3, "a dead letter each: {log}");
    for line in about_events {
        assert_eq!(line["platform"], "feishu", "{line}");
        assert_eq!(line["app"], "cli_logs", "{line}");
        assert!(line["tenant"].is_string(), "{line}");
        assert_eq!(line["key"].as_str().map(str::len), Some(32), "{line}");
        assert!(line["event_id"].is_string(), "{line}");
    }
    for secret in [ENCRYPT_KEY, VERIFICATION, ADMIN] {
        assert!(!log.contains(secret), "a secret in the log");
    }
}

/// The human log written to a pipe (a file, journald) has no colour codes; and the admin
/// listener's front door leads to the status page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_log_has_no_colour_codes_and_the_admin_root_leads_to_the_status_page() {
    let dir = tempfile::tempdir().expect("dir");
    let config = r#"
[store]
backend = "memory"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[[source]]
name = "bot"
platform = "feishu"
app_id = "cli_logs"
encrypt_key = "log-test-encrypt-key"
"#;
    let gateway = Serve::start_with(dir.path(), config);
    wait_until("the start lines", Duration::from_secs(10), || {
        gateway.stderr().contains("memory store")
    })
    .await;
    let log = gateway.stderr();
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log: {log:?}"
    );
    // The crypto provider, as every client of the tests installs it.
    let _ = support::client();
    let response = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .get(format!("{}/", gateway.admin))
        .send()
        .await
        .expect("admin root");
    assert_eq!(response.status().as_u16(), 307);
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some("/status")
    );
}
