//! `/keys` through the binary: business keys claimed by several processes at once, across one
//! gateway and across two gateways on one Redis; fences, conflicts, namespaces, refusals.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Serve, client};

const TOKEN_A: &str = "caller-a-token";
const TOKEN_B: &str = "caller-b-token";
const TOKEN_OTHER: &str = "other-namespace-token";

fn config(store: &str) -> String {
    format!(
        r#"
[store]
{store}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[[api.caller]]
name = "python"
token = "{TOKEN_A}"
namespace = "shop"

[[api.caller]]
name = "node"
token = "{TOKEN_B}"
namespace = "shop"

[[api.caller]]
name = "elsewhere"
token = "{TOKEN_OTHER}"
"#
    )
}

async fn call(api: &str, token: &str, op: &str, body: Value) -> (u16, Value) {
    let response = client()
        .post(format!("{api}/keys/{op}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("api request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// One worker process: claims every key of the run (waiting for another holder's result),
/// and for each it acquired applies the side effect (a line in the effects file) and
/// completes with a result. Prints what it saw, one JSON line per key.
#[tokio::test]
async fn keys_worker() {
    let (Ok(apis), Ok(keys), Ok(effects)) = (
        std::env::var("KEYS_WORKER_APIS"),
        std::env::var("KEYS_WORKER_KEYS"),
        std::env::var("KEYS_WORKER_EFFECTS"),
    ) else {
        return; // only a worker when the test below starts it
    };
    let apis: Vec<&str> = apis.split(',').collect();
    let keys: usize = keys.parse().expect("keys");
    let me = std::process::id();
    let token = if me.is_multiple_of(2) {
        TOKEN_A
    } else {
        TOKEN_B
    };
    let mut order: Vec<usize> = (0..keys).collect();
    fastrand::shuffle(&mut order);
    for (n, k) in order.into_iter().enumerate() {
        let api = apis[n % apis.len()];
        let key = format!("create order {k}");
        let body =
            json!({"key": key, "wait_ms": 10_000, "lease_ms": 10_000, "payload": "order body"});
        let (status, claimed) = call(api, token, "claim", body).await;
        assert_eq!(status, 200, "{claimed}");
        let seen = match claimed["state"].as_str() {
            Some("acquired") => {
                use std::io::Write;
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&effects)
                    .expect("effects");
                // One write of the whole line: O_APPEND keeps it whole among the processes'
                // (`writeln!` may split it in two writes, which interleave).
                file.write_all(format!("{key}\n").as_bytes())
                    .expect("effect");
                let result = json!({"order": k, "by": me});
                let done = json!({"key": key, "lease": claimed["lease"], "result": result});
                let (status, answer) = call(api, token, "complete", done).await;
                assert_eq!(status, 200, "{answer}");
                json!({"key": key, "acquired": true, "result": result})
            }
            Some("done") => json!({"key": key, "acquired": false, "result": claimed["result"]}),
            other => panic!("{key}: {other:?} {claimed}"),
        };
        println!("WORKER {seen}");
    }
}

/// Starts `workers` worker processes against `apis` and checks that each key was acquired
/// once, applied once, and that everyone else got the acquirer's result.
async fn race(apis: &[String], workers: usize, keys: usize, dir: &Path) {
    let effects = dir.join("effects.txt");
    let children: Vec<_> = (0..workers)
        .map(|_| {
            support::oncegate(); // the binary is built; the worker is this test binary
            std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args([
                    "--exact",
                    "keys::keys_worker",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("KEYS_WORKER_APIS", apis.join(","))
                .env("KEYS_WORKER_KEYS", keys.to_string())
                .env("KEYS_WORKER_EFFECTS", &effects)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("worker")
        })
        .collect();
    let mut seen: Vec<Value> = Vec::new();
    for child in children {
        let output = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .expect("join")
            .expect("worker ran");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "worker: {text} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        seen.extend(
            text.lines()
                // libtest may print its own words before the first line.
                .filter_map(|l| l.split_once("WORKER ").map(|(_, seen)| seen))
                .map(|l| serde_json::from_str::<Value>(l).expect("json")),
        );
    }
    assert_eq!(seen.len(), workers * keys, "every worker saw every key");
    let mut acquired: HashMap<String, Value> = HashMap::new();
    for line in seen.iter().filter(|l| l["acquired"] == true) {
        let key = line["key"].as_str().expect("key").to_owned();
        assert!(
            acquired
                .insert(key.clone(), line["result"].clone())
                .is_none(),
            "{key} acquired twice"
        );
    }
    assert_eq!(acquired.len(), keys, "each key acquired once");
    for line in seen.iter().filter(|l| l["acquired"] == false) {
        assert_eq!(
            line["result"],
            acquired[line["key"].as_str().expect("key")],
            "the stored result"
        );
    }
    let effects = std::fs::read_to_string(effects).expect("effects");
    let mut applied: HashMap<&str, usize> = HashMap::new();
    for line in effects.lines() {
        *applied.entry(line).or_default() += 1;
    }
    assert_eq!(applied.len(), keys, "each side effect applied: {effects}");
    assert!(
        applied.values().all(|n| *n == 1),
        "each side effect once: {effects}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_processes_acquire_each_key_once_and_the_rest_get_its_result() {
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let gateway = Serve::start_with(dir.path(), &config(&store));
    let api = gateway.api.clone().expect("an api listener");
    race(&[api], 6, 40, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_share_the_keys() {
    let Ok(url) = std::env::var("ONCEGATE_TEST_REDIS_URL") else {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    };
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"keys{}\"\npartitions = 4",
        fastrand::u32(..)
    );
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let first = Serve::start_with(a.path(), &config(&store));
    let second = Serve::start_with(b.path(), &config(&store));
    let apis = [
        first.api.clone().expect("api"),
        second.api.clone().expect("api"),
    ];
    race(&apis, 6, 30, a.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_conflicts_namespaces_and_refusals() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config("backend = \"memory\""));
    let api = gateway.api.clone().expect("api");
    // A short lease runs out; another caller takes the key; the first one's completion is fenced.
    let claim = json!({"key": "refund 7", "lease_ms": 150, "payload": "p"});
    let (_, first) = call(&api, TOKEN_A, "claim", claim.clone()).await;
    assert_eq!(first["state"], "acquired", "{first}");
    let (status, busy) = call(&api, TOKEN_B, "claim", claim.clone()).await;
    assert_eq!(
        (status, busy["state"].as_str()),
        (409, Some("in_flight")),
        "{busy}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, second) = call(&api, TOKEN_B, "claim", claim.clone()).await;
    assert_eq!(second["state"], "acquired", "{second}");
    let late = json!({"key": "refund 7", "lease": first["lease"], "result": {"by": "first"}});
    let (status, fenced) = call(&api, TOKEN_A, "complete", late).await;
    assert_eq!(
        (status, fenced["state"].as_str()),
        (409, Some("fenced")),
        "{fenced}"
    );
    let renewed = json!({"key": "refund 7", "lease": second["lease"], "lease_ms": 5000});
    let (status, _) = call(&api, TOKEN_B, "renew", renewed).await;
    assert_eq!(status, 200);
    let done = json!({"key": "refund 7", "lease": second["lease"], "result": {"by": "second"}});
    assert_eq!(call(&api, TOKEN_B, "complete", done).await.0, 200);
    let (_, stored) = call(&api, TOKEN_A, "claim", claim.clone()).await;
    assert_eq!(stored, json!({"state": "done", "result": {"by": "second"}}));
    // The same key for another payload: a conflict, never the other payload's result.
    let other = json!({"key": "refund 7", "payload": "another body"});
    let (status, conflict) = call(&api, TOKEN_A, "claim", other).await;
    assert_eq!(
        (status, conflict["state"].as_str()),
        (409, Some("conflict")),
        "{conflict}"
    );
    // Another namespace has keys of its own.
    let (_, elsewhere) = call(&api, TOKEN_OTHER, "claim", claim.clone()).await;
    assert_eq!(elsewhere["state"], "acquired", "{elsewhere}");
    // Released, the key is free again.
    let release = json!({"key": "refund 7", "lease": elsewhere["lease"]});
    assert_eq!(call(&api, TOKEN_OTHER, "release", release).await.0, 200);
    let (_, again) = call(&api, TOKEN_OTHER, "claim", claim.clone()).await;
    assert_eq!(again["state"], "acquired");
    // Refusals.
    assert_eq!(
        call(&api, "wrong token", "claim", claim.clone()).await.0,
        401
    );
    let response = client()
        .post(format!("{api}/keys/claim"))
        .json(&claim)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 401, "no token");
    let (status, bad) = call(&api, TOKEN_A, "claim", json!({"key": ""})).await;
    assert_eq!(status, 400, "{bad}");
    let (status, bad) = call(&api, TOKEN_A, "claim", json!({"key": "x".repeat(600)})).await;
    assert_eq!(status, 400, "{bad}");
    let (status, bad) = call(
        &api,
        TOKEN_A,
        "complete",
        json!({"key": "k", "lease": "not a lease"}),
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    let (status, bad) = call(&api, TOKEN_A, "claim", json!({"key": "k", "typo": 1})).await;
    assert!(
        status == 400 && bad["error"].as_str().is_some_and(|e| e.contains("typo")),
        "{bad}"
    );
    let huge = json!({"key": "big", "lease": "1", "result": "x".repeat(70_000)});
    assert_eq!(call(&api, TOKEN_A, "complete", huge).await.0, 413);
    // Without callers there is no API at all.
    let bare = tempfile::tempdir().expect("dir");
    let plain = "[store]\nbackend = \"memory\"\n[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n";
    let without = Serve::start_with(bare.path(), plain);
    assert!(without.api.is_none(), "never open by default");
}

/// A body that never arrives holds a connection of the API or the admin listener for
/// `server.body_timeout` at most (408), and an unauthenticated one not at all (401 before the
/// body is read): partial bodies cannot fill the listeners and lock callers out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_bodies_are_cut_off_and_unauthenticated_ones_refused_first() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    let dir = tempfile::tempdir().expect("dir");
    let config = config("backend = \"memory\"").replace(
        "admin_listen = \"127.0.0.1:0\"",
        "admin_listen = \"127.0.0.1:0\"\nbody_timeout = \"700ms\"\nadmin_token = \"admin-secret-token\"",
    );
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    // Sends `head` (a request that announces 100 bytes of body) and no body; the answer and
    // how long it took.
    let partial = |base: &str, head: String| {
        let addr = base.trim_start_matches("http://").to_owned();
        let mut stream = TcpStream::connect(&addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream.write_all(head.as_bytes()).expect("write");
        let start = Instant::now();
        let mut answer = [0u8; 12];
        let _ = stream.read_exact(&mut answer);
        (
            String::from_utf8_lossy(&answer).into_owned(),
            start.elapsed(),
        )
    };
    let head = |path: &str, token: Option<&str>| {
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"key\":"
        )
    };
    for (base, path, token) in [
        (&api, "/keys/claim", TOKEN_A),
        (&api, "/send/main", TOKEN_A),
        (
            &gateway.admin,
            "/admin/dead-letters/purge",
            "admin-secret-token",
        ),
    ] {
        let (answer, took) = partial(base, head(path, None));
        assert_eq!(answer, "HTTP/1.1 401", "{path} without a token");
        assert!(
            took < Duration::from_millis(500),
            "{path}: 401 at once, took {took:?}"
        );
        let (answer, took) = partial(base, head(path, Some(token)));
        assert_eq!(answer, "HTTP/1.1 408", "{path}: the body never came");
        assert!(
            took >= Duration::from_millis(600) && took < Duration::from_secs(3),
            "{path}: held {took:?}"
        );
    }
    // And a whole call still works.
    let (status, body) = call(&api, TOKEN_A, "claim", json!({"key": "order-1"})).await;
    assert_eq!(status, 200, "{body}");
}

/// The README's Python example as it sends its calls: `payload` the order's body (a JSON
/// object), the claim's `lease` handed back, a result object; the same body with its keys in
/// another order is the same payload, another body a conflict; a lease handed back as a number
/// is taken; a `lease_ms` over `api.max_lease` is refused, not cut without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_runs_as_written() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config("backend = \"memory\""));
    let api = gateway.api.clone().expect("api");
    let body = json!({"sku": "A-1", "qty": 2});
    let (status, claim) = call(
        &api,
        TOKEN_A,
        "claim",
        json!({"key": "create order 42", "lease_ms": 30000, "wait_ms": 5000, "payload": body}),
    )
    .await;
    assert_eq!(
        (status, claim["state"].as_str()),
        (200, Some("acquired")),
        "{claim}"
    );
    let lease = claim["lease"].clone();
    assert!(lease.is_string(), "{claim}");
    let (status, done) = call(
        &api,
        TOKEN_A,
        "complete",
        json!({"key": "create order 42", "lease": lease, "result": {"order": 7}}),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    // The same body, its keys in another order: done, with the stored result.
    let (status, again) = call(
        &api,
        TOKEN_B,
        "claim",
        json!({"key": "create order 42", "payload": {"qty": 2, "sku": "A-1"}}),
    )
    .await;
    assert_eq!(
        (status, again["state"].as_str()),
        (200, Some("done")),
        "{again}"
    );
    assert_eq!(again["result"], json!({"order": 7}));
    let (status, other) = call(
        &api,
        TOKEN_B,
        "claim",
        json!({"key": "create order 42", "payload": {"sku": "A-1", "qty": 3}}),
    )
    .await;
    assert_eq!(
        (status, other["state"].as_str()),
        (409, Some("conflict")),
        "{other}"
    );
    // A lease handed back as a number.
    let (_, claim) = call(&api, TOKEN_A, "claim", json!({"key": "number lease"})).await;
    let number: u64 = claim["lease"]
        .as_str()
        .and_then(|l| l.parse().ok())
        .expect("lease digits");
    let (status, released) = call(
        &api,
        TOKEN_A,
        "release",
        json!({"key": "number lease", "lease": number}),
    )
    .await;
    assert_eq!(status, 200, "{released}");
    // Longer than api.max_lease (1 h by default): refused, saying the bound.
    let (status, refused) = call(
        &api,
        TOKEN_A,
        "claim",
        json!({"key": "too long", "lease_ms": 7_200_000}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("api.max_lease")),
        "{refused}"
    );
}

/// A caller's results are kept for the retention: beyond its budget (here 2 results, 64
/// bytes) a result is refused with 429 and when room comes back, a completion without a result
/// still goes through, and other callers keep their own budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_beyond_a_callers_budget_are_refused_clearly() {
    let dir = tempfile::tempdir().expect("dir");
    let config = config("backend = \"memory\"").replace(
        "namespace = \"shop\"\n\n[[api.caller]]\nname = \"node\"",
        "namespace = \"shop\"\nresults_max = 2\nresult_bytes_max = 64\n\n[[api.caller]]\nname = \"node\"",
    );
    assert!(config.contains("results_max = 2"), "{config}");
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    let claim = |key: &'static str, token: &'static str| {
        let api = api.clone();
        async move {
            let (status, claimed) = call(&api, token, "claim", json!({"key": key})).await;
            assert_eq!(status, 200, "{claimed}");
            claimed["lease"].clone()
        }
    };
    let result = json!({"order": "o-1"});
    for key in ["r1", "r2"] {
        let lease = claim(key, TOKEN_A).await;
        let (status, done) = call(
            &api,
            TOKEN_A,
            "complete",
            json!({"key": key, "lease": lease, "result": result}),
        )
        .await;
        assert_eq!(status, 200, "{done}");
    }
    // The third result is over the count.
    let lease = claim("r3", TOKEN_A).await;
    let response = client()
        .post(format!("{api}/keys/complete"))
        .bearer_auth(TOKEN_A)
        .json(&json!({"key": "r3", "lease": lease, "result": result}))
        .send()
        .await
        .expect("complete");
    assert_eq!(response.status().as_u16(), 429);
    let retry: u64 = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!(
        retry > 3600,
        "room only when a result's retention ends: {retry}"
    );
    let refused: Value = response.json().await.expect("json");
    assert_eq!(refused["state"], "result_budget_spent", "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("\"python\" keeps 2 results") && e.contains("results_max")),
        "{refused}"
    );
    // The lease is still held: completing without a result goes through, and the key is done.
    let (status, done) = call(
        &api,
        TOKEN_A,
        "complete",
        json!({"key": "r3", "lease": lease}),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let (status, again) = call(&api, TOKEN_A, "claim", json!({"key": "r3"})).await;
    assert_eq!(
        (status, again["state"].as_str()),
        (200, Some("done")),
        "{again}"
    );
    // Another caller has its own budget (the default: 70 bytes are nothing to it).
    let lease = claim("r4", TOKEN_B).await;
    let (status, done) = call(
        &api,
        TOKEN_B,
        "complete",
        json!({"key": "r4", "lease": lease, "result": "x".repeat(70)}),
    )
    .await;
    assert_eq!(status, 200, "node has its own budget: {done}");
}

/// The API's OpenAPI document is served (behind a caller's token, as every API call) and names
/// exactly the routes the router has; each of them answers, and says 401 without a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_document_describes_exactly_the_served_routes() {
    let dir = tempfile::tempdir().expect("dir");
    let gateway = Serve::start_with(dir.path(), &config("backend = \"memory\""));
    let api = gateway.api.clone().expect("api");
    let get = |token: Option<&'static str>| {
        let request = client().get(format!("{api}/openapi.json"));
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
        .send()
    };
    assert_eq!(get(None).await.expect("get").status().as_u16(), 401);
    let answer = get(Some(TOKEN_A)).await.expect("get");
    assert_eq!(answer.status().as_u16(), 200);
    let doc: Value = answer.json().await.expect("json");
    assert_eq!(doc["openapi"], "3.1.0");
    // The routes as the router's source names them.
    let source = include_str!("../../gateway/src/api/mod.rs");
    let mut routed = std::collections::BTreeSet::new();
    for piece in source.split(".route(").skip(1) {
        let Some(piece) = piece.trim_start().strip_prefix('"') else {
            continue;
        };
        let (path, rest) = piece.split_once('"').expect("a path");
        let method = rest
            .trim_start_matches(',')
            .trim_start()
            .split('(')
            .next()
            .unwrap_or("");
        routed.insert((method.to_owned(), path.to_owned()));
    }
    let mut documented = std::collections::BTreeSet::new();
    for (path, methods) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in methods.as_object().expect("methods") {
            assert!(operation["summary"].is_string(), "{method} {path}");
            assert!(
                operation["responses"]["401"].is_object(),
                "{method} {path} says 401"
            );
            documented.insert((method.clone(), path.clone()));
            if method != "post" {
                continue;
            }
            let url = format!("{api}{}", path.replace("{source}", "nope"));
            let unauthenticated = client()
                .post(&url)
                .json(&json!({}))
                .send()
                .await
                .expect("post");
            assert_eq!(unauthenticated.status().as_u16(), 401, "{path}");
            let answer = client()
                .post(&url)
                .bearer_auth(TOKEN_A)
                .header("idempotency-key", "doc-check")
                .json(&json!({}))
                .send()
                .await
                .expect("post");
            let status = answer.status().as_u16();
            let text = answer.text().await.unwrap_or_default();
            assert!(
                status != 405 && !text.contains("describes them"),
                "{path}: {status} {text}"
            );
        }
    }
    assert!(routed.len() >= 6, "{routed:?}");
    assert_eq!(
        documented, routed,
        "the document and the router name the same routes"
    );
}

/// Two gateways on one Redis, one on a machine whose clock is an hour ahead (`faketime`): a key
/// one caller holds through the first is not taken over through the second — every gateway
/// judges leases by the server's clock. (Judged by its own clock, the second found the lease an
/// hour expired and handed the key to a second worker while the first still worked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_clock_is_an_hour_ahead_does_not_take_over_a_held_lease() {
    let Ok(url) = std::env::var("ONCEGATE_TEST_REDIS_URL") else {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    };
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"clock{}\"\npartitions = 4",
        fastrand::u32(..)
    );
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let right = Serve::start_with(a.path(), &config(&store));
    let mut ahead = std::process::Command::new("faketime");
    ahead
        .args(["-f", "+1h"])
        .arg(env!("CARGO_BIN_EXE_oncegate"))
        // The timers keep the machine's monotonic clock; only the wall clock is off.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    let ahead = Serve::start_command(b.path(), &config(&store), "warn", ahead);
    assert!(
        ahead.stderr().contains("off the Redis server's") || {
            tokio::time::sleep(Duration::from_millis(500)).await;
            ahead.stderr().contains("off the Redis server's")
        },
        "faketime did not move the second gateway's clock: {}",
        ahead.stderr()
    );
    let claim = json!({"key": "charge 9", "lease_ms": 60000, "payload": "p"});
    let (_, held) = call(
        &right.api.clone().expect("api"),
        TOKEN_A,
        "claim",
        claim.clone(),
    )
    .await;
    assert_eq!(held["state"], "acquired", "{held}");
    let (status, other) = call(&ahead.api.clone().expect("api"), TOKEN_B, "claim", claim).await;
    assert_eq!(
        (status, other["state"].as_str()),
        (409, Some("in_flight")),
        "taken over through the gateway an hour ahead: {other}"
    );
}

/// What a caller's results keep of the store survives a restart: the budget is read back from
/// the store's ledger, so restarting does not hand out a fresh budget over what is still kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_result_budget_survives_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"embedded\"\npath = \"{}\"",
        dir.path().join("store").display()
    );
    let config = config(&store).replace(
        "namespace = \"shop\"\n\n[[api.caller]]\nname = \"node\"",
        "namespace = \"shop\"\nresults_max = 2\n\n[[api.caller]]\nname = \"node\"",
    );
    let complete = |api: String, key: &'static str| async move {
        let (status, claimed) = call(&api, TOKEN_A, "claim", json!({"key": key})).await;
        assert_eq!(status, 200, "{claimed}");
        let done = json!({"key": key, "lease": claimed["lease"], "result": {"k": key}});
        call(&api, TOKEN_A, "complete", done).await.0
    };
    {
        let gateway = Serve::start_with(dir.path(), &config);
        let api = gateway.api.clone().expect("api");
        assert_eq!(complete(api.clone(), "k1").await, 200);
        assert_eq!(complete(api, "k2").await, 200);
        // The ledger is written within a second.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let gateway = Serve::start_with(dir.path(), &config);
    let api = gateway.api.clone().expect("api");
    assert_eq!(complete(api, "k3").await, 429, "{}", gateway.stderr());
}
