//! The script benchmark runs whole on a real Redis: every admit admits, every claim is granted,
//! every completion applies, the stream ends empty and the store reads the records it expects
//! (the binary checks each and fails otherwise), and it refuses a Redis that holds keys.

use std::process::Command;

/// An empty database of the test Redis (`scripts/test` starts one): `db` is 14 or 15, which no
/// other test uses (one per test here, so that they can run at once).
fn empty_database(db: u8) -> String {
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    });
    let url = format!("{}/{db}", url.trim_end_matches('/'));
    let mut con = redis::Client::open(url.as_str())
        .expect("url")
        .get_connection()
        .expect("connect to the test Redis");
    let () = redis::cmd("FLUSHDB")
        .query(&mut con)
        .expect("flush the test's database");
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
    let url = empty_database(15);
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
        "floor: a new event's commands, no script",
        "floor: a re-delivery's commands, no script",
        "floor: one transition's GET and SET, no script",
        "  floor: per delivered event",
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

/// Runs the interleaved comparison of this build's admit script with `against`.
fn compare(url: &str, against: &str) -> std::process::Output {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), against).expect("write the script");
    Command::new(env!("CARGO_BIN_EXE_oncegate-redis-scripts"))
        .args([
            "--url",
            url,
            "--events",
            "400",
            "--rounds",
            "4",
            "--payload",
            "100",
        ])
        .arg("--admit-against")
        .arg(file.path())
        .output()
        .expect("run oncegate-redis-scripts")
}

#[test]
fn admit_scripts_are_compared_in_rounds_and_one_that_answers_otherwise_is_refused() {
    let url = empty_database(14);
    // The same script on both sides: both admit every event and take every re-delivery as a
    // duplicate, each side's figures printed.
    let same = compare(&url, oncegate_redis::ADMIT_LUA);
    let text = String::from_utf8_lossy(&same.stdout);
    assert!(
        same.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&same.stderr)
    );
    assert!(text.contains("4 rounds of 100 events a side"), "{text}");
    for step in ["admit, a new event", "admit, a re-delivery"] {
        let line = text
            .lines()
            .find(|line| line.starts_with(step))
            .unwrap_or_else(|| panic!("no row for {step:?} in {text}"));
        let figures: Vec<f64> = line[46..]
            .split_whitespace()
            .map(|n| n.parse().unwrap_or(f64::NAN))
            .collect();
        assert_eq!(figures.len(), 2, "{line}");
        assert!(figures.iter().all(|f| f.is_finite() && *f >= 0.0), "{line}");
    }
    // A script whose answers are not the admit's is not measured as one.
    let url = empty_database(14);
    let other = compare(&url, "return {2}");
    assert!(!other.status.success());
    let error = String::from_utf8_lossy(&other.stderr);
    assert!(error.contains("admit answered"), "{error}");
}
