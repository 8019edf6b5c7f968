//! The script benchmark runs whole on a real Redis: every admit admits, every claim is granted,
//! every completion applies, the stream ends empty and the store reads the records it expects
//! (the binary checks each and fails otherwise), and it refuses a Redis that holds keys.

use std::process::Command;

/// An empty database of the test Redis (`scripts/test` starts one): number 15, which no other
/// test uses.
fn empty_database() -> String {
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    });
    let url = format!("{}/15", url.trim_end_matches('/'));
    let mut con = redis::Client::open(url.as_str())
        .expect("url")
        .get_connection()
        .expect("connect to the test Redis");
    let () = redis::cmd("FLUSHDB")
        .query(&mut con)
        .expect("flush database 15");
    url
}

fn run(url: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oncegate-redis-scripts"))
        .args([
            "--url",
            url,
            "--events",
            "401",
            "--batch",
            "4",
            "--payload",
            "300",
        ])
        .output()
        .expect("run oncegate-redis-scripts")
}

#[test]
fn every_step_runs_and_is_checked_then_a_used_redis_is_refused() {
    let url = empty_database();
    let first = run(&url);
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    for step in [
        "admit, a new event",
        "admit, a re-delivery",
        "hand-out: XREADGROUP",
        "claim, in batches",
        "complete and ack, in batches",
        "per delivered event",
    ] {
        let line = text
            .lines()
            .find(|line| line.starts_with(step))
            .unwrap_or_else(|| panic!("no row for {step:?} in {text}"));
        let figure: f64 = line[46..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no figure in {line:?}"));
        // A figure, not a timing to judge: tests never fail on speed.
        assert!(figure.is_finite() && figure >= 0.0, "{line}");
    }
    // The first run left its records: a second one would measure on top of them.
    let second = run(&url);
    assert!(!second.status.success());
    let error = String::from_utf8_lossy(&second.stderr);
    assert!(error.contains("needs an empty Redis"), "{error}");
}
