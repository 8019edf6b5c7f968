//! The gateway's log as configured: JSON lines, each with the instance name, and the lines
//! about an event with its key, platform, app and tenant; secrets never in it.

use crate::support;

use std::time::Duration;

use support::{Serve, oncegate, wait_until};

const ENCRYPT_KEY: &str = "log-test-encrypt-key";
const VERIFICATION: &str = "log-test-verification-token";
const ADMIN: &str = "log-test-admin-token";

/// A gateway configuration whose only route goes to a closed port (every attempt fails),
/// with `log` lines first, `server` lines in [server] and `max_attempts` attempts per event.
fn failing_config(log: &str, server: &str, max_attempts: u32) -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    format!(
        r#"
{log}

[store]
backend = "memory"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "{ADMIN}"
{server}

[dispatcher]
max_attempts = {max_attempts}
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
    )
}

/// `oncegate simulate` sending `events` events as source "bot" of the configuration in `dir`
/// to `gateway`, with the admin token.
fn simulate(dir: &std::path::Path, gateway: &Serve, events: usize) -> std::process::Output {
    oncegate()
        .args(["simulate", "--quiet", "--duplicates", "0", "--replays", "0"])
        .args([
            "--events",
            &events.to_string(),
            "--source",
            "bot",
            "--config",
        ])
        .arg(dir.join("oncegate.toml"))
        .args(["--url", &gateway.base, "--admin", &gateway.admin])
        .env("ONCEGATE_ADMIN_TOKEN", ADMIN)
        .output()
        .expect("simulate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_carry_the_instance_and_each_events_key_platform_and_app() {
    let dir = tempfile::tempdir().expect("dir");
    // A sink that is never there: every event is retried once and dead-lettered.
    let config = failing_config("[log]\nformat = \"json\"\ninstance = \"gw-7\"", "", 2);
    // At debug: each dead letter's own line (at warn they are summarised).
    let gateway = Serve::start_logging(dir.path(), &config, "debug");
    // The banner too is a JSON line, with the addresses and the status page.
    let banner: serde_json::Value = serde_json::from_str(&gateway.banner)
        .unwrap_or_else(|e| panic!("a banner that is not JSON ({e}): {}", gateway.banner));
    assert_eq!(banner["instance"], "gw-7", "{banner}");
    assert_eq!(banner["level"], "INFO", "{banner}");
    assert_eq!(banner["listen"], gateway.base.as_str(), "{banner}");
    assert_eq!(
        banner["status_page"],
        format!("{}/status", gateway.admin).as_str(),
        "{banner}"
    );
    // Every event dead-lettered: simulate says so and fails (a script must not take it for
    // a success).
    let simulated = simulate(dir.path(), &gateway, 3);
    let said = String::from_utf8_lossy(&simulated.stdout).into_owned()
        + &String::from_utf8_lossy(&simulated.stderr);
    assert!(!simulated.status.success(), "{said}");
    assert!(said.contains("dead-lettered      3"), "{said}");
    assert!(
        said.contains("3 admitted but 0 delivered (3 dead-lettered, 0 still waiting"),
        "{said}"
    );
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
                .is_some_and(|m| m == "dead-lettered" || m == "delivery failed; retrying")
        })
        .collect();
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

/// The line a stopping gateway ends with carries its figures as JSON numbers, not a Rust
/// `Debug` struct in a string; a configuration warning is a WARN line that does not say
/// "warning" again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_line_gives_the_figures_as_numbers() {
    let dir = tempfile::tempdir().expect("dir");
    let log = "[log]\nformat = \"json\"\n[dedup]\nbusiness_keys = true";
    let config = failing_config(log, "", 1);
    let mut gateway = Serve::start_logging(dir.path(), &config, "info");
    // Both dead-lettered (the sink is not there): simulate fails, the figures stay.
    assert!(!simulate(dir.path(), &gateway, 2).status.success());
    gateway.signal("TERM");
    let (status, _) = gateway.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    let log = gateway.stderr();
    let stopped = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["message"] == "stopped")
        .unwrap_or_else(|| panic!("no stopped line: {log}"));
    assert_eq!(stopped["admitted"], 2, "{stopped}");
    assert!(
        stopped["requests"].as_u64().is_some_and(|n| n >= 2),
        "{stopped}"
    );
    assert!(stopped["dead_letters"].is_u64(), "{stopped}");
    assert!(!stopped.to_string().contains("StatsSnapshot"), "{stopped}");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let warned = lines
        .iter()
        .find(|line| {
            line["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("dedup.business_keys: has no effect"))
        })
        .unwrap_or_else(|| panic!("no warning for dedup.business_keys: {log}"));
    assert_eq!(warned["level"], "WARN", "{warned}");
    assert!(
        lines.iter().all(|line| !line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("warning:"))),
        "{log}"
    );
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

/// A downstream that fails every attempt: the retries are counted into one summary line per
/// interval, not a line per attempt (20 events × 4 retries were 80 lines); and `simulate`
/// without the admin token says it was refused instead of "not reachable".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_summarised_not_logged_one_by_one() {
    let dir = tempfile::tempdir().expect("dir");
    let config = failing_config("", "log_interval = \"1s\"", 5);
    let gateway = Serve::start_logging(dir.path(), &config, "info");
    let simulated = simulate(dir.path(), &gateway, 20);
    assert!(!simulated.status.success(), "every event dead-lettered");
    // Counted into the summary lines of the intervals they fell in (the last one at most an
    // interval after the last dead letter): the retries, and the dead letters too.
    let summed = |log: &str, kind: &str| -> u64 {
        log.lines()
            .filter(|line| line.contains(kind))
            .filter_map(|line| {
                line.split(" × ")
                    .next()?
                    .rsplit(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let counted = |log: &str| summed(log, "delivery_retried");
    wait_until(
        "twenty dead letters' summaries",
        Duration::from_secs(30),
        || summed(&gateway.stderr(), "dead_lettered") >= 20,
    )
    .await;
    wait_until("the retries' summaries", Duration::from_secs(5), || {
        counted(&gateway.stderr()) >= 80
    })
    .await;
    let log = gateway.stderr();
    assert_eq!(log.matches("delivery failed; retrying").count(), 0, "{log}");
    assert_eq!(
        log.matches("dead-lettered").count(),
        0,
        "no line each: {log}"
    );
    assert_eq!(summed(&log, "dead_lettered"), 20, "{log}");
    let letters = log.lines().filter(|l| l.contains("dead_lettered")).count();
    assert!(letters <= 10, "{letters} lines for 20 dead letters: {log}");
    assert!(log.contains("`oncegate dlq list` shows them"), "{log}");
    let summaries: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("delivery_retried"))
        .collect();
    assert!(summaries.len() <= 10, "{summaries:#?}");
    // The reason names the cause, not only "error sending request".
    assert!(
        summaries
            .iter()
            .any(|line| line.contains("Connection refused")),
        "{summaries:#?}"
    );
    assert_eq!(
        counted(&log),
        80,
        "four retries of each of 20 events: {summaries:#?}"
    );
    // simulate without the admin token says that it was refused, not that nothing answers.
    let tokenless = dir.path().join("tokenless.toml");
    std::fs::write(
        &tokenless,
        config.replace(&format!("admin_token = \"{ADMIN}\"\n"), ""),
    )
    .expect("config");
    let run = oncegate()
        .args([
            "simulate",
            "--events",
            "1",
            "--duplicates",
            "0",
            "--replays",
            "0",
        ])
        .args(["--source", "bot", "--config"])
        .arg(&tokenless)
        .args(["--url", &gateway.base, "--admin", &gateway.admin])
        .env_remove("ONCEGATE_ADMIN_TOKEN")
        .output()
        .expect("simulate");
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(said.contains("refused the admin token"), "{said}");
    assert!(summaries[0].contains("attempt"), "{}", summaries[0]);
}

/// `ONCEGATE_LOG=debug` says what happened to each event — admitted, dropped as a repeat,
/// delivered — with its id; the default level says none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_says_each_events_way_and_info_does_not() {
    for (level, said) in [("debug", true), ("info", false)] {
        let dir = tempfile::tempdir().expect("dir");
        // The failing route swapped for a file route: every event delivered.
        let config = failing_config("", "", 2);
        let route = config.find("[[route]]").expect("route");
        let delivering = format!(
            "{}{}",
            &config[..route],
            support::file_route(dir.path(), "")
        );
        let gateway = Serve::start_logging(dir.path(), &delivering, level);
        let simulated = simulate(dir.path(), &gateway, 3);
        let out = String::from_utf8_lossy(&simulated.stdout).into_owned();
        assert!(simulated.status.success(), "{out}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let log = gateway.stderr();
        let admitted = log
            .lines()
            .filter(|l| l.contains(" admitted ") && l.contains("event_id=sim"))
            .count();
        let delivered = log
            .lines()
            .filter(|l| l.contains(" delivered ") && l.contains("event_id=sim"))
            .count();
        if said {
            assert_eq!((admitted, delivered), (3, 3), "{log}");
        } else {
            assert_eq!((admitted, delivered), (0, 0), "{log}");
        }
    }
}
