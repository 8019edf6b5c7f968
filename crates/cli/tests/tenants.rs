//! Many tenants on one gateway URL: a WeCom suite source takes callbacks only from the corps of
//! its tenant registry, which lives in the store. Added or removed with `oncegate tenants` on
//! one gateway, a corp's callbacks are taken or refused by every gateway on the same Redis
//! within a second, without a restart — while a burst runs, nothing lost or delivered twice;
//! disabled and enabled the same way; corps are named exactly (case-sensitive); the suite's own
//! pushes are answered `success`.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use oncegate_core::{SealedRequest, Sealer};
use oncegate_wecom::WecomApp;
use support::suite::{
    KEY, SUITE_ID, TOKEN, corp_message, post, readme_block, readme_source_by_hand, suite_push,
    ticket,
};
use support::{Serve, file_route, lines, redis_store, run, wait_until};

const PROVIDER: &str = "wwprovider00000001";
/// An encrypted corp id, and another corp whose id differs only in case.
const CORP_A: &str = "wpAbCdEf0123456789ZzYy";
const CORP_B: &str = "wpabcdef0123456789zzyy";

/// The README's suite source, its secrets given inline, with a file route.
fn config(dir: &Path, store: &str) -> String {
    // Corps added by hand here: no secret, so nothing calls WeCom (tests/suites.rs does, on
    // loopback).
    let source = readme_source_by_hand();
    assert!(
        source.contains(SUITE_ID) && source.contains(PROVIDER) && source.contains(TOKEN),
        "{source}"
    );
    format!(
        "[store]\n{store}\n\n[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n{source}\n{}",
        file_route(dir, "")
    )
}

/// The README's `oncegate tenants …` command that starts with `oncegate tenants <what>`, as
/// arguments (single quotes kept together, the comment dropped), pointed at `admin`.
fn readme_command(what: &str, admin: &str) -> Vec<String> {
    let block = readme_block("sh");
    let line = block
        .lines()
        .find(|line| line.starts_with(&format!("oncegate tenants {what} ")))
        .unwrap_or_else(|| panic!("the README's `oncegate tenants {what}`"));
    let line = line.split(" #").next().unwrap_or(line);
    let mut args = Vec::new();
    let mut quoted = false;
    let mut current = String::new();
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        args.push(current);
    }
    args.into_iter()
        .skip(1)
        .map(|arg| arg.replace("http://127.0.0.1:9090", admin))
        .collect()
}

/// `oncegate tenants …` against `gateway`'s admin listener: its output, or why it failed.
fn tenants(gateway: &Serve, args: &[&str]) -> Result<String, String> {
    let mut all: Vec<String> = std::iter::once("tenants".to_owned())
        .chain(args.iter().map(|arg| (*arg).to_owned()))
        .collect();
    all.extend(["--admin".to_owned(), gateway.admin.clone()]);
    run(&all)
}

/// Posts `sealed` to `gateway` until it is answered `status` (a second at most): how long the
/// change took to reach it.
async fn until_answered(gateway: &Serve, sealed: &SealedRequest, status: u16) -> Duration {
    support::until_answered(gateway, "suite", sealed, status, Duration::from_secs(1)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_added_and_removed_reach_every_gateway_within_a_second() {
    let store = redis_store("tenants");
    let [(a_dir, a), (b_dir, b)] = support::start_in_dirs(|dir| config(dir, &store));
    // No corp yet: authentic, but refused for WeCom to retry (503), on both.
    let first = corp_message(CORP_A, "m1");
    for gateway in [&a, &b] {
        let (status, body) = post(gateway, &first).await;
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("unknown_tenant") || body.contains("has not authorised"),
            "{body}"
        );
    }
    // Added on A: B takes the corp's callbacks within a second, no restart.
    let add = readme_command("add", &a.admin);
    assert!(add.contains(&CORP_A.to_owned()), "{add:?}");
    let said = run(&add).expect("the README's tenants add");
    assert!(said.contains(CORP_A), "{said}");
    let took = until_answered(&b, &first, 200).await;
    eprintln!("a tenant added on one gateway reached the other in {took:?}");
    let (status, _) = post(&a, &corp_message(CORP_A, "m2")).await;
    assert_eq!(status, 200);
    // The same letters in lower case are another corp: still refused.
    let (status, _) = post(&b, &corp_message(CORP_B, "m3")).await;
    assert_eq!(status, 503);
    // Each message once, as the corp's event (its corp id the app).
    wait_until("both delivered", Duration::from_secs(10), || {
        lines(a_dir.path()).len() + lines(b_dir.path()).len() >= 2
    })
    .await;
    let mut delivered: Vec<serde_json::Value> = lines(a_dir.path());
    delivered.extend(lines(b_dir.path()));
    assert_eq!(delivered.len(), 2, "{delivered:?}");
    for line in &delivered {
        assert_eq!(line["app"], CORP_A, "{line}");
    }
    let listed = run(&readme_command("list", &b.admin)).expect("the README's tenants list");
    assert!(
        listed.contains(CORP_A) && listed.contains("Acme") && listed.contains("1 tenant"),
        "{listed}"
    );
    // Disabled on A (the README's command): B refuses its callbacks within a second, its
    // settings kept; enabled on B, A takes them again.
    let disabled = run(&readme_command("disable", &a.admin)).expect("the README's tenants disable");
    assert!(disabled.contains("disabled"), "{disabled}");
    until_answered(&b, &corp_message(CORP_A, "m5"), 503).await;
    let listed = tenants(&a, &["list", "suite"]).expect("list");
    assert!(
        listed.contains("Acme") && listed.contains("\"disabled\":true"),
        "{listed}"
    );
    let again = tenants(&b, &["disable", "suite", "wpNoSuchCorp"]).expect_err("no tenant");
    assert!(again.contains("404"), "{again}");
    run(&readme_command("enable", &b.admin)).expect("the README's tenants enable");
    until_answered(&a, &corp_message(CORP_A, "m6"), 200).await;
    let listed = tenants(&a, &["list", "suite"]).expect("list");
    assert!(
        listed.contains("Acme") && !listed.contains("disabled"),
        "{listed}"
    );
    // Removed on B: A refuses the corp within a second.
    tenants(&b, &["remove", "suite", CORP_A]).expect("tenants remove");
    until_answered(&a, &corp_message(CORP_A, "m4"), 503).await;
    // Removing it again, or a bad id, or a source that serves one tenant: refused clearly.
    let again = tenants(&b, &["remove", "suite", CORP_A]).expect_err("gone already");
    assert!(again.contains("404"), "{again}");
    let bad = tenants(&a, &["add", "suite", " wpSpaced"]).expect_err("spaces");
    assert!(bad.contains("400"), "{bad}");
    let nothing = tenants(&a, &["list", "nosuch"]).expect_err("no source");
    assert!(nothing.contains("404"), "{nothing}");
}

/// The suite's own pushes (here a `suite_ticket`, encrypted for the SuiteId) are answered the
/// plain `success` WeCom wants, and admitted once: a retry is a duplicate, answered the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suites_own_pushes_are_answered_success_and_admitted_once() {
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let gateway = Serve::start_with(dir.path(), &config(dir.path(), &store));
    let sealer = WecomApp::new(SUITE_ID, TOKEN, KEY).expect("sealer");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let ticket = format!(
        "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><InfoType><![CDATA[suite_ticket]]></InfoType><TimeStamp>{now}</TimeStamp><SuiteTicket><![CDATA[t-{now}]]></SuiteTicket></xml>"
    );
    let sealed = sealer.seal(ticket.as_bytes(), now, "ticket-nonce", [3; 16]);
    for _ in 0..2 {
        let (status, body) = post(&gateway, &sealed).await;
        assert_eq!((status, body.as_str()), (200, "success"));
    }
    wait_until("the ticket delivered", Duration::from_secs(10), || {
        !lines(dir.path()).is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered = lines(dir.path());
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0]["event_type"], "suite.suite_ticket");
    assert_eq!(delivered[0]["app"], SUITE_ID);
    // The route learns a ticket came, never the ticket: the gateway alone uses it.
    let payload = delivered[0]["payload"].to_string();
    assert!(
        payload.contains("suite_ticket")
            && payload.contains("redacted")
            && !payload.contains(&format!("t-{now}")),
        "{payload}"
    );
}

/// The suite's pushes change the shared state before they go to their route: the newest
/// `suite_ticket` is kept in the store for every gateway (an older one pushed later does not
/// replace it), and a `cancel_auth` takes its corp out of the registry — every gateway refuses
/// it within a second — while the pushes themselves are delivered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_are_shared_newest_first_and_a_cancelled_corp_is_refused_everywhere() {
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").expect("scripts/test starts redis-server");
    let prefix = format!("suites{}", fastrand::u32(..));
    let store =
        format!("backend = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}\"\npartitions = 4");
    let [(a_dir, a), (b_dir, b)] = support::start_in_dirs(|dir| config(dir, &store));
    tenants(&a, &["add", "suite", CORP_A]).expect("tenants add");
    until_answered(&b, &corp_message(CORP_A, "c1"), 200).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    for (gateway, value, issued, nonce) in [
        (&a, "ticket-older", now - 600, "t1"),
        (&b, "ticket-newest", now, "t2"),
        (&a, "ticket-oldest", now - 1200, "t3"),
    ] {
        let (status, body) = post(gateway, &suite_push(&ticket(value, issued), nonce)).await;
        assert_eq!((status, body.as_str()), (200, "success"));
        // Each applied before the next comes: the dispatcher takes them in turn.
        wait_until("the push delivered", Duration::from_secs(10), || {
            lines(a_dir.path())
                .iter()
                .chain(lines(b_dir.path()).iter())
                .filter(|line| line["event_type"] == "suite.suite_ticket")
                .count()
                >= usize::from(nonce.as_bytes()[1] - b'0')
        })
        .await;
    }
    let shared = oncegate_redis::RedisStore::connect_async(oncegate_redis::RedisConfig {
        prefix: prefix.clone(),
        partitions: 4,
        ..oncegate_redis::RedisConfig::at(&url)
    })
    .await
    .expect("the gateways' Redis");
    let kept = oncegate_core::StateStore::state_get(&shared, "tickets:suite", "ticket")
        .await
        .expect("read")
        .expect("a ticket kept");
    let doc: serde_json::Value = serde_json::from_slice(&kept.value).expect("json");
    assert_eq!(doc["ticket"], "ticket-newest", "{doc}");
    let left_ms = kept.expires_at_ms.expect("a ticket expires") as i64
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
    assert!(
        (25 * 60_000..=30 * 60_000).contains(&left_ms),
        "{left_ms} ms left"
    );
    // The corp cancels on A: B refuses it within a second; what was admitted was delivered.
    let cancel = format!(
        "<xml><SuiteId><![CDATA[{SUITE_ID}]]></SuiteId><InfoType><![CDATA[cancel_auth]]></InfoType><TimeStamp>{now}</TimeStamp><AuthCorpId><![CDATA[{CORP_A}]]></AuthCorpId></xml>"
    );
    let (status, body) = post(&a, &suite_push(&cancel, "cancel")).await;
    assert_eq!((status, body.as_str()), (200, "success"));
    until_answered(&b, &corp_message(CORP_A, "c2"), 503).await;
    let listed = tenants(&b, &["list", "suite"]).expect("list");
    assert!(listed.contains("0 tenants"), "{listed}");
    let delivered: Vec<serde_json::Value> = lines(a_dir.path())
        .into_iter()
        .chain(lines(b_dir.path()))
        .collect();
    assert!(
        delivered
            .iter()
            .any(|line| line["event_id"].is_string() && line["app"] == CORP_A),
        "the corp's message admitted before was delivered: {delivered:?}"
    );
}

/// A corp added while a burst runs: two senders per corp post their messages to both gateways,
/// each retried as WeCom retries (the same request, until it is answered 200), one corp known
/// from the start and one added on gateway B a third of the way in. The added corp's callbacks
/// are refused (503) until then and taken by both gateways within a second after; the known
/// corp's never stop; every message of both is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corp_added_while_a_burst_runs_loses_nothing_and_is_delivered_once() {
    const PER_CORP: usize = 150;
    const ADDED: &str = "wpBurstAddedCorp0123Zz";
    let store = redis_store("tenantburst");
    let [(a_dir, a), (b_dir, b)] = support::start_in_dirs(|dir| config(dir, &store));
    let (a, b) = (std::sync::Arc::new(a), std::sync::Arc::new(b));
    tenants(&a, &["add", "suite", CORP_A]).expect("tenants add");
    until_answered(&b, &corp_message(CORP_A, "warm"), 200).await;
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut senders = Vec::new();
    for corp in [CORP_A, ADDED] {
        for half in 0..2 {
            let (a, b, refused, sent) = (a.clone(), b.clone(), refused.clone(), sent.clone());
            senders.push(tokio::spawn(async move {
                for i in (half..PER_CORP).step_by(2) {
                    let message = corp_message(corp, &format!("{corp}-{i}"));
                    let deadline = Instant::now() + Duration::from_secs(30);
                    let mut to_a = i % 2 == 0;
                    loop {
                        let gateway = if to_a { &a } else { &b };
                        let (status, body) = post(gateway, &message).await;
                        if status == 200 {
                            break;
                        }
                        assert_eq!(status, 503, "{corp}-{i}: {body}");
                        if corp == CORP_A {
                            panic!("a known corp's callback was refused: {body}");
                        }
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        assert!(Instant::now() < deadline, "{corp}-{i} never taken");
                        to_a = !to_a;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
    }
    // A third of the known corp's burst in, the other corp is added on B.
    wait_until("a third of the burst", Duration::from_secs(20), || {
        sent.load(std::sync::atomic::Ordering::Relaxed) >= PER_CORP / 3
    })
    .await;
    let added_at = Instant::now();
    tenants(&b, &["add", "suite", ADDED]).expect("tenants add");
    let took = until_answered(&a, &corp_message(ADDED, "probe"), 200).await;
    eprintln!(
        "added while the burst ran: taken by the other gateway {took:?} after the command returned ({:?} after it started)",
        added_at.elapsed()
    );
    for sender in senders {
        sender.await.expect("sender");
    }
    assert!(
        refused.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the added corp was refused before it was added: the change happened mid-burst"
    );
    // Each message once: 2 × PER_CORP, the warm-up and the probe.
    let total = 2 * PER_CORP + 2;
    wait_until("every message delivered", Duration::from_secs(20), || {
        lines(a_dir.path()).len() + lines(b_dir.path()).len() >= total
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut delivered: Vec<serde_json::Value> = lines(a_dir.path());
    delivered.extend(lines(b_dir.path()));
    let mut ids: Vec<String> = delivered
        .iter()
        .map(|line| {
            format!(
                "{}/{}",
                line["app"].as_str().unwrap_or_default(),
                line["event_id"].as_str().unwrap_or_default()
            )
        })
        .collect();
    ids.sort();
    let unique = {
        let mut unique = ids.clone();
        unique.dedup();
        unique
    };
    assert_eq!(unique.len(), total, "nothing lost");
    assert_eq!(ids.len(), total, "nothing delivered twice");
}
