//! What an acknowledged event survives on Redis, through the binary on real processes: a
//! `fsync` Redis killed with -9 and restarted, a primary killed under Sentinel with the
//! `replicas` guarantee, a Redis without persistence refused by `fsync` and allowed (and said)
//! by `memory`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::e2e;
use crate::support;
use e2e::*;
use support::refused_start;

/// Deliveries per event id at the receiver.
fn deliveries(downstream: &Downstream) -> HashMap<String, Vec<String>> {
    let mut by_event: HashMap<String, Vec<String>> = HashMap::new();
    for got in downstream.got() {
        by_event
            .entry(got.event_id)
            .or_default()
            .push(got.idempotency_key);
    }
    by_event
}

async fn readyz(gateway: &Gateway) -> (u16, serde_json::Value) {
    let response = client()
        .get(format!("{}/readyz", gateway.admin))
        .send()
        .await
        .expect("readyz");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

/// The `durability` entry of a `/readyz` answer.
fn durability_check(ready: &serde_json::Value) -> serde_json::Value {
    ready["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["check"] == "durability"))
        .cloned()
        .unwrap_or_else(|| panic!("no durability check in {ready}"))
}

/// `oncegate check-config config`: its exit status and output.
fn check_config(config: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["check-config"])
        .arg(config)
        .output()
        .expect("check-config");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_persistence_is_refused_by_fsync_and_said_by_memory() {
    let redis = OwnRedis::start_with(&["--appendonly", "no"]);
    let (_downstream, addr) = Downstream::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\npartitions = 4",
        redis.url()
    );

    // The default, fsync: refused at start and by check-config, naming what to change.
    let config = write_config(dir.path(), addr, false, &store, "30s", "5s");
    let out = refused_start(&config, &[]);
    assert!(
        out.contains("appendonly yes and appendfsync always") && out.contains("appendonly no"),
        "{out}"
    );
    let (ok, out) = check_config(&config);
    assert!(!ok, "check-config must fail: {out}");
    assert!(
        out.contains("error: store.durability") && out.contains("appendfsync always"),
        "{out}"
    );

    // memory: allowed, and what it can lose is said by check-config, /readyz and a gauge.
    let memory = format!("{store}\ndurability = \"memory\"");
    let config = write_config(dir.path(), addr, false, &memory, "30s", "5s");
    let (ok, out) = check_config(&config);
    assert!(ok, "{out}");
    assert!(
        out.contains("warning: store.durability") && out.contains("persistence is off"),
        "{out}"
    );
    let gateway = Gateway::run(&config);
    let (status, ready) = readyz(&gateway).await;
    assert_eq!(status, 200, "{ready}");
    let check = durability_check(&ready);
    assert_eq!(check["mode"], "memory", "{check}");
    assert!(
        check["at_risk"]
            .as_str()
            .is_some_and(|r| r.contains("persistence is off")),
        "{check}"
    );
    let metrics = support::metrics_text(&gateway.admin).await;
    assert!(
        metrics.contains("oncegate_store_durability_at_risk{mode=\"memory\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_is_checked_while_running_and_refuses_what_it_cannot_keep() {
    let redis = OwnRedis::start();
    let (downstream, addr) = Downstream::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\npartitions = 4",
        redis.url()
    );
    let config = write_config(dir.path(), addr, false, &store, "30s", "5s");
    let (ok, out) = check_config(&config);
    assert!(ok, "{out}");
    assert!(
        out.contains("durability = \"fsync\" in force") && out.contains("appendfsync always"),
        "{out}"
    );
    let gateway = Gateway::run(&config);
    let client = client();
    let (status, ready) = readyz(&gateway).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(durability_check(&ready)["ok"], true, "{ready}");

    // Someone relaxes the server: within the check period, not ready and no acknowledgement.
    redis.cli(&["CONFIG", "SET", "appendfsync", "everysec"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, ready) = readyz(&gateway).await;
        if status == 503 {
            let check = durability_check(&ready);
            assert_eq!(check["ok"], false, "{ready}");
            assert!(
                check["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("appendfsync everysec")),
                "{check}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "still ready: {ready}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let plain = message("fs-1", "oc_fs", 1);
    let (status, body) = post(&client, &gateway.url, &sign(&plain))
        .await
        .expect("post");
    assert_eq!(status, 503, "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(downstream.count("fs-1"), 0, "refused, so not admitted");

    // Back to always: the platform's retry is admitted (once).
    redis.cli(&["CONFIG", "SET", "appendfsync", "always"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, _) = post(&client, &gateway.url, &sign(&plain))
            .await
            .expect("post");
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    downstream
        .wait_for("the retried event", |got| {
            got.iter().any(|g| g.event_id == "fs-1")
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(downstream.count("fs-1"), 1);
}

/// The default durability through a Redis crash: kill -9 under a burst with a slow downstream,
/// not ready while it is down, ready again without a gateway restart once it is back; every
/// acknowledged event delivered, admitted once (the platform's retries of the 503s are
/// duplicates), delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_loses_nothing_and_delivers_nothing_twice_across_a_kill_9() {
    const EVENTS: usize = 400;
    let mut redis = OwnRedis::start();
    let (downstream, addr) = Downstream::start().await;
    // A slow downstream: acknowledged events wait in Redis when it dies.
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(20);
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\npartitions = 4",
        redis.url()
    );
    let gateway = Gateway::start_with_lease(dir.path(), addr, false, &store, "10s", "2s");
    let burst = Burst::start(&gateway.url, "kill", EVENTS);
    burst.wait_acked(EVENTS / 2).await;
    redis.kill9();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        readyz(&gateway).await.0,
        503,
        "not ready while the store is down"
    );
    redis.run();
    let refused = burst.finish().await;
    assert!(refused > 0, "the outage should have been seen as 503s");
    let twice = each_acknowledged_event_once(&downstream, &gateway, EVENTS).await;
    assert_eq!(twice, 0, "delivered twice");
    assert_eq!(
        readyz(&gateway).await.0,
        200,
        "ready again without a restart"
    );
    eprintln!("fsync, redis kill -9: {EVENTS} acknowledged, 0 lost, 0 twice; {refused} 503s");
}

/// Waits until each of the `events` acknowledged events reached the receiver and checks, for
/// an idempotent receiver: none lost, every delivery of an event under one Idempotency-Key,
/// each admitted once (admitted + duplicates = events) with one completed record. Answers how
/// many deliveries were repeats.
async fn each_acknowledged_event_once(
    downstream: &Downstream,
    gateway: &Gateway,
    events: usize,
) -> usize {
    downstream
        .wait_for("every acknowledged event", |got| {
            deliveries_of(got) == events
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let by_event = deliveries(downstream);
    assert_eq!(by_event.len(), events, "0 acknowledged events lost");
    let mut twice = 0;
    for (event, keys) in &by_event {
        twice += keys.len() - 1;
        assert!(
            keys.iter().all(|k| k == &keys[0]),
            "{event}: one Idempotency-Key, got {keys:?}"
        );
    }
    // An admission the store applied but answered with an error (it died, or the replicas did
    // not confirm in time) was a 503; the platform's retry then found it a duplicate.
    let stats = gateway.stats().await;
    let admitted = stats["gateway"]["admitted"].as_u64().unwrap_or(0);
    let duplicates = stats["gateway"]["duplicates"].as_u64().unwrap_or(0);
    assert_eq!(
        admitted + duplicates,
        events as u64,
        "each event admitted once, the retries of the 503s as duplicates: {stats}"
    );
    // The counts' stated error (README, "How Redis counts"): a completion Redis applied but
    // whose answer died with it is tallied by nobody (its retry is fenced or finds it done).
    let completed = stats["store"]["completed"].as_u64().unwrap_or(0);
    let unanswered = stats["gateway"]["fenced"].as_u64().unwrap_or(0)
        + stats["gateway"]["already_done"].as_u64().unwrap_or(0);
    assert!(
        completed <= events as u64 && completed + unanswered >= events as u64,
        "one completed record per event, but for completions whose answer was lost: {stats}"
    );
    twice
}

fn deliveries_of(got: &[Got]) -> usize {
    got.iter()
        .map(|g| g.event_id.as_str())
        .collect::<std::collections::HashSet<_>>()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_follow_a_sentinel_failover_and_lose_nothing() {
    const EVENTS: usize = 400;
    let mut redis = Replicated::start();
    let url = redis.url();
    // Fencing tokens before the failover, from a store of the test's own on the same URL.
    let tokens = tokio::task::block_in_place(|| {
        oncegate_redis::RedisStore::connect(oncegate_redis::RedisConfig {
            partitions: 4,
            durability: oncegate_redis::RedisDurability::Replicas {
                min: 1,
                wait: Duration::from_millis(500),
            },
            ..oncegate_redis::RedisConfig::at(&url)
        })
    })
    .expect("a store through the sentinels");
    let before = claim_token(&tokens, "before").await;

    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(10);
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\npartitions = 4\ndurability = \"replicas\"\n\
         min_replicas = 1\nreplica_wait = \"500ms\""
    );
    let gateway = Gateway::start_with_lease(dir.path(), addr, false, &store, "10s", "2s");
    let (status, ready) = readyz(&gateway).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(durability_check(&ready)["mode"], "replicas", "{ready}");

    let burst = Burst::start(&gateway.url, "fo", EVENTS);
    burst.wait_acked(EVENTS / 3).await;
    // The sentinels promote the replica; the old primary comes back as its replica, so that
    // min_replicas = 1 can hold again.
    redis.fail_over().await;
    let refused = burst.finish().await;
    let twice = each_acknowledged_event_once(&downstream, &gateway, EVENTS).await;
    let after = claim_token(&tokens, "after").await;
    assert!(
        after > before,
        "fencing tokens grow across the failover: {before} then {after}"
    );
    eprintln!(
        "replicas, sentinel failover: {EVENTS} acknowledged, 0 lost, {twice} delivered again under their key; {refused} 503s"
    );
}

/// A claim's fencing token on a fresh key in partition 0.
async fn claim_token(store: &oncegate_redis::RedisStore, name: &str) -> u64 {
    use oncegate_core::DedupStore;
    let key = oncegate_core::key_for("test", "app", "t", name);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match store.claim(&key, 0, Duration::from_secs(5)).await {
            Ok(oncegate_core::Claim::Acquired(lease)) => return lease.token.0,
            Ok(other) => panic!("unexpected claim answer {other:?}"),
            Err(error) => {
                assert!(Instant::now() < deadline, "no claim: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The README's Redis example ("What Redis keeps"): the server it starts and the store section
/// it shows pass `check-config` under the default durability.
#[test]
fn the_readme_redis_example_keeps_what_it_acknowledges() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let example = readme
        .split_once("To try it on one machine")
        .expect("the README's Redis example")
        .1;
    let command = example
        .lines()
        .find(|l| l.starts_with("redis-server "))
        .expect("its redis-server line");
    // Its flags, but in the foreground (the test stops it).
    let words: Vec<&str> = command.split_whitespace().skip(1).collect();
    let args: Vec<&str> = words
        .chunks(2)
        .filter(|flag| flag.first() != Some(&"--daemonize"))
        .flatten()
        .copied()
        .collect();
    let store = example
        .split_once("```toml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("its toml block")
        .0;
    let redis = OwnRedis::start_with(&args);
    let dir = tempfile::tempdir().expect("dir");
    let store = store
        .replace("redis://127.0.0.1:6379", &redis.url())
        .replace("[store]\n", "");
    let config = write_config(
        dir.path(),
        "127.0.0.1:9".parse().expect("addr"),
        false,
        &store,
        "30s",
        "5s",
    );
    let (ok, out) = check_config(&config);
    assert!(ok, "{out}");
    assert!(out.contains("durability = \"fsync\" in force"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_a_cluster_survive_a_primary_failover() {
    const EVENTS: usize = 300;
    let cluster_args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1000",
        "--appendonly",
        "no",
    ];
    let mut nodes: Vec<OwnRedis> = (0..6)
        .map(|_| OwnRedis::start_with(&cluster_args))
        .collect();
    let addresses: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(created.status.success(), "{created:?}");
    // Every primary with an online replica.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = nodes[0]
            .cli(&["CLUSTER", "INFO"])
            .contains("cluster_state:ok")
            && primaries(&nodes).len() == 3
            && primaries(&nodes).iter().all(|&i| {
                nodes[i]
                    .cli(&["INFO", "replication"])
                    .contains("state=online")
            });
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the cluster did not come up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(5);
    let dir = tempfile::tempdir().expect("dir");
    let urls: Vec<String> = addresses.iter().map(|a| format!("redis://{a}")).collect();
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\ncluster = true\npartitions = 8\n\
         durability = \"replicas\"\nmin_replicas = 1\nreplica_wait = \"500ms\"",
        urls.join(",")
    );
    let gateway = Gateway::start_with_lease(dir.path(), addr, false, &store, "10s", "2s");
    let (status, ready) = readyz(&gateway).await;
    assert_eq!(status, 200, "{ready}");
    let burst = Burst::start(&gateway.url, "cl", EVENTS);
    burst.wait_acked(EVENTS / 3).await;
    let victim = primaries(&nodes)[0];
    nodes[victim].kill9();
    // Its replica is promoted; the old primary comes back as the new one's replica.
    let deadline = Instant::now() + Duration::from_secs(30);
    let survivor = (victim + 1) % nodes.len();
    while !nodes[survivor]
        .cli(&["CLUSTER", "INFO"])
        .contains("cluster_state:ok")
        || primaries(&nodes).len() < 3
    {
        assert!(Instant::now() < deadline, "no cluster failover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    nodes[victim].run();
    let refused = burst.finish().await;
    let twice = each_acknowledged_event_once(&downstream, &gateway, EVENTS).await;
    eprintln!(
        "replicas, cluster failover: {EVENTS} acknowledged, 0 lost, {twice} delivered again under their key; {refused} 503s"
    );
}

/// The nodes that are primaries now.
fn primaries(nodes: &[OwnRedis]) -> Vec<usize> {
    (0..nodes.len())
        .filter(|&i| nodes[i].cli(&["ROLE"]).starts_with("master"))
        .collect()
}

/// What a configuration can lose or expose beyond the store (a platform domain, a route and a
/// source in clear, a route anyone could forge) is said by check-config, at start and in
/// `/readyz`, each by its setting; the same gateway configured safely says none. Nothing is sent
/// to the `.invalid` hosts: no event is posted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_configuration_exposes_is_said_by_check_config_and_readyz() {
    let dir = tempfile::tempdir().expect("dir");
    let write = |safe: bool| {
        let (domain, aes_key, url, secret) = if safe {
            (
                "https://open.feishu.cn",
                "encoding_aes_key = \"jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C\"",
                "https://hooks.invalid/events",
                "secret = \"whsec_c2VjcmV0\"",
            )
        } else {
            (
                "http://open.feishu.invalid",
                "",
                "http://hooks.invalid:9/events",
                "",
            )
        };
        let config = dir.path().join(format!("risk-{safe}.toml"));
        std::fs::write(
            &config,
            format!(
                r#"
[store]
path = "{store}"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token = "admin-t0ken"

[[source]]
name = "main"
platform = "feishu"
app_id = "{APP_ID}"
encrypt_key = "{ENCRYPT_KEY}"
verification_token = "{TOKEN}"
domain = "{domain}"

[[source]]
name = "oa"
platform = "wechat"
app_id = "wx0123456789abcdef"
token = "oa-token"
{aes_key}

[[route]]
events = ["*"]
sink = "http"
url = "{url}"
{secret}
"#,
                store = dir.path().join(format!("store-{safe}")).display(),
            ),
        )
        .expect("write config");
        config
    };
    let exposed = [
        "source[main].domain",
        "source[oa].encoding_aes_key",
        "route[0].url",
        "route[0].secret",
    ];
    let risky = write(false);
    let (ok, out) = check_config(&risky);
    assert!(ok, "a risk is said, not refused: {out}");
    for setting in exposed {
        assert!(
            out.contains(&format!("at risk: {setting}: ")),
            "{setting}: {out}"
        );
    }
    let gateway = Gateway::run(&risky);
    let configuration = |ready: &serde_json::Value| -> Vec<String> {
        ready["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .filter(|check| check["check"] == "configuration")
            .filter_map(|check| check["at_risk"].as_str().map(str::to_owned))
            .collect()
    };
    // A probe without the admin token learns that there are findings, not what is open.
    let (status, ready) = readyz(&gateway).await;
    assert_eq!(status, 200, "{ready}");
    let told = configuration(&ready);
    assert_eq!(told.len(), 1, "{told:#?}");
    assert!(told[0].starts_with("4 settings can lose"), "{}", told[0]);
    for setting in exposed {
        assert!(!ready.to_string().contains(setting), "{setting}: {ready}");
    }
    // With it, each finding by its setting.
    let ready: serde_json::Value = client()
        .get(format!("{}/readyz", gateway.admin))
        .bearer_auth("admin-t0ken")
        .send()
        .await
        .expect("readyz")
        .json()
        .await
        .expect("json");
    let said = configuration(&ready);
    assert_eq!(said.len(), exposed.len(), "{said:#?}");
    for (setting, risk) in exposed.iter().zip(&said) {
        assert!(risk.starts_with(&format!("{setting}: ")), "{risk}");
    }
    assert!(said[2].contains("unencrypted"), "{}", said[2]);
    drop(gateway);

    let safe = write(true);
    let (ok, out) = check_config(&safe);
    assert!(ok && !out.contains("at risk"), "{out}");
    let gateway = Gateway::run(&safe);
    let (status, ready) = readyz(&gateway).await;
    assert_eq!(status, 200, "{ready}");
    assert!(
        !ready["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .any(|check| check["check"] == "configuration"),
        "{ready}"
    );
}
