//! End to end: the real `oncegate serve` binary, real HTTP in and out, a real downstream.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::e2e;
use e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_copies_are_delivered_once() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    let gateway = Gateway::start(dir.path(), addr, false);
    let client = client();
    // The same request bytes ten times at once (replays), and the same event signed ten times
    // (platform retries): one delivery each.
    let replayed = Arc::new(sign(&message("copy-1", "oc_a", 1_000)));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (client, url, replayed) = (client.clone(), gateway.url.clone(), replayed.clone());
        tasks.push(tokio::spawn(async move {
            let request = if i % 2 == 0 {
                (*replayed).clone_signed()
            } else {
                sign(&message("copy-2", "oc_b", 1_000))
            };
            post(&client, &url, &request).await.expect("post")
        }));
    }
    for task in tasks {
        let (status, body) = task.await.expect("task");
        assert!(status == 200 || status == 409, "{status} {body}");
    }
    downstream
        .wait_for("both events", |got| got.len() >= 2)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(downstream.count("copy-1"), 1);
    assert_eq!(downstream.count("copy-2"), 1);
    let got = downstream.got();
    assert!(
        got.iter().all(|g| g.signed),
        "every delivery verifies as a Standard Webhook"
    );
    assert!(got.iter().all(|g| g.idempotency_key.starts_with("msg_")));
    let stats = gateway.stats().await;
    assert_eq!(stats["gateway"]["admitted"], 2);
    assert_eq!(stats["gateway"]["delivered"], 2);
    // The operator's look-up finds the record in whichever partition holds it.
    let key = got[0].idempotency_key.trim_start_matches("msg_");
    let admin = gateway.admin.clone();
    let record = |query: String| {
        let admin = admin.clone();
        async move {
            let response = reqwest::get(format!("{admin}/admin/record?{query}"))
                .await
                .expect("record");
            let status = response.status().as_u16();
            (
                status,
                response.json::<serde_json::Value>().await.expect("json"),
            )
        }
    };
    let (status, found) = record(format!("key={key}")).await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["record"]["state"], "completed", "{found}");
    let partition = found["partition"].as_u64().expect("a partition");
    let (status, _) = record(format!("key={key}&partition={partition}")).await;
    assert_eq!(status, 200);
    let (status, refused) = record(format!("key={key}&partition=9999")).await;
    assert_eq!(status, 400, "{refused}");
    let (status, _) = record(format!("key={}", "0".repeat(32))).await;
    assert_eq!(status, 404);
    // By the platform's own id: the same record.
    let event_id = &got[0].event_id;
    let (status, by_id) = record(format!("platform=feishu&app={APP_ID}&id={event_id}")).await;
    assert_eq!(status, 200, "{by_id}");
    assert_eq!(by_id["key"], key, "{by_id}");
    assert_eq!(by_id["dead_letter"], serde_json::Value::Null);
    let (status, _) = record(format!("platform=feishu&app={APP_ID}&id=never-sent")).await;
    assert_eq!(status, 404);
    let (status, _) = record(format!("platform=feishu&id={event_id}")).await;
    assert_eq!(status, 400, "an app is needed");
}

impl Signed {
    fn clone_signed(&self) -> Signed {
        Signed {
            body: self.body.clone(),
            timestamp: self.timestamp.clone(),
            nonce: self.nonce.clone(),
            signature: self.signature.clone(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_after_a_restart_is_still_dropped() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, false);
    let (status, _) = post(
        &client,
        &gateway.url,
        &sign(&message("restart-1", "oc_r", 1_000)),
    )
    .await
    .expect("post");
    assert_eq!(status, 200);
    downstream
        .wait_for("the first delivery", |got| got.len() == 1)
        .await;
    gateway.stop();
    let gateway = Gateway::start(dir.path(), addr, false);
    let (status, body) = post(
        &client,
        &gateway.url,
        &sign(&message("restart-1", "oc_r", 1_000)),
    )
    .await
    .expect("post");
    assert_eq!(status, 200);
    assert!(body.contains("\"duplicate\":true"), "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(downstream.count("restart-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_under_load_loses_nothing() {
    const EVENTS: usize = 300;
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(15);
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, false);
    let url = gateway.url.clone();
    let acked: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let sender = {
        let (client, acked) = (client.clone(), acked.clone());
        tokio::spawn(async move {
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut workers = Vec::new();
            for _ in 0..16 {
                let (client, url, acked, next) =
                    (client.clone(), url.clone(), acked.clone(), next.clone());
                workers.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= EVENTS {
                            break;
                        }
                        let request = sign(&message(
                            &format!("load-{i}"),
                            &format!("oc_{}", i % 7),
                            1_000 + i as u64,
                        ));
                        if let Ok((200, _)) = post(&client, &url, &request).await {
                            acked.lock().expect("acked").insert(i);
                        }
                    }
                }));
            }
            for worker in workers {
                let _ = worker.await;
            }
        })
    };
    // Kill while requests are arriving and handlers are running.
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().expect("acked").len() < EVENTS / 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gateway.kill9();
    sender.await.expect("sender");
    let acked_before: HashSet<usize> = acked.lock().expect("acked").clone();
    assert!(
        acked_before.len() >= EVENTS / 3 && acked_before.len() < EVENTS,
        "the kill should land mid-run: {}",
        acked_before.len()
    );
    // Restart; the platform retries everything it got no 200 for.
    let gateway = Gateway::start(dir.path(), addr, false);
    for i in 0..EVENTS {
        if !acked_before.contains(&i) {
            let request = sign(&message(
                &format!("load-{i}"),
                &format!("oc_{}", i % 7),
                1_000 + i as u64,
            ));
            let (status, body) = post(&client, &gateway.url, &request).await.expect("post");
            assert_eq!(status, 200, "{body}");
        }
    }
    downstream
        .wait_for("every event", |got| {
            let ids: HashSet<&str> = got.iter().map(|g| &*g.event_id).collect();
            ids.len() == EVENTS
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = downstream.got();
    let mut keys: HashMap<&str, HashSet<&str>> = HashMap::new();
    for g in &got {
        keys.entry(&*g.event_id)
            .or_default()
            .insert(g.idempotency_key.as_str());
    }
    let repeated: Vec<&&str> = keys
        .keys()
        .filter(|id| got.iter().filter(|g| g.event_id == ***id).count() > 1)
        .collect();
    // Only handlers running at the kill, or finished since the journal's last sync (the
    // dispatcher does not wait for its completions' sync), can run twice: a few more than the
    // dispatcher's concurrency at most, with handlers this slow.
    assert!(
        repeated.len() <= 32,
        "{} events delivered twice",
        repeated.len()
    );
    assert!(
        keys.values().all(|k| k.len() == 1),
        "a repeat carries the same Idempotency-Key"
    );
    eprintln!(
        "kill -9: {} acked before the kill, {} deliveries, {} events delivered twice",
        acked_before.len(),
        got.len(),
        repeated.len()
    );
    drop(gateway);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_chat_order_holds_under_concurrency() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(3);
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, false);
    let mut chats = Vec::new();
    for chat in 0..6 {
        let (client, url) = (client.clone(), gateway.url.clone());
        chats.push(tokio::spawn(async move {
            for n in 0..15u64 {
                let request = sign(&message(
                    &format!("order-{chat}-{n}"),
                    &format!("oc_order{chat}"),
                    1_000 + n,
                ));
                let (status, _) = post(&client, &url, &request).await.expect("post");
                assert_eq!(status, 200);
            }
        }));
    }
    for chat in chats {
        chat.await.expect("chat");
    }
    downstream
        .wait_for("90 deliveries", |got| got.len() >= 90)
        .await;
    let got = downstream.got();
    for chat in 0..6 {
        let seen: Vec<String> = got
            .iter()
            .filter(|g| g.order_key.as_deref() == Some(&format!("oc_order{chat}")))
            .map(|g| g.event_id.clone())
            .collect();
        let expected: Vec<String> = (0..15).map(|n| format!("order-{chat}-{n}")).collect();
        assert_eq!(seen, expected, "chat {chat}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_event_is_dropped_where_the_route_says_so() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, true);
    for (id, created) in [("wm-new", 5_000u64), ("wm-old", 1_000), ("wm-newer", 9_000)] {
        let (status, _) = post(&client, &gateway.url, &sign(&message(id, "oc_wm", created)))
            .await
            .expect("post");
        assert_eq!(status, 200);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    downstream
        .wait_for("two deliveries", |got| got.len() >= 2)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids: Vec<String> = downstream
        .got()
        .iter()
        .map(|g| g.event_id.clone())
        .collect();
    assert_eq!(ids, vec!["wm-new", "wm-newer"]);
    assert_eq!(gateway.stats().await["gateway"]["stale_dropped"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_retry_and_permanent_ones_are_dead_lettered() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    {
        let mut behavior = downstream.behavior.lock().expect("behavior");
        behavior.transient.insert("flaky".into(), 2);
        behavior.transient.insert("down".into(), 100);
        behavior.permanent.insert("bad".into());
    }
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, false);
    for (id, chat) in [
        ("flaky", "oc_1"),
        ("bad", "oc_2"),
        ("down", "oc_3"),
        ("after-bad", "oc_2"),
    ] {
        let (status, _) = post(&client, &gateway.url, &sign(&message(id, chat, 1_000)))
            .await
            .expect("post");
        assert_eq!(status, 200);
    }
    downstream
        .wait_for("flaky and after-bad", |got| {
            got.iter().any(|g| g.event_id == "flaky")
                && got.iter().any(|g| g.event_id == "after-bad")
        })
        .await;
    let flaky: Vec<Got> = downstream
        .got()
        .into_iter()
        .filter(|g| g.event_id == "flaky")
        .collect();
    assert_eq!(flaky.len(), 1);
    assert_eq!(flaky[0].attempt, 2, "delivered on the third attempt");
    let deadline = Instant::now() + Duration::from_secs(10);
    let letters = loop {
        let letters: serde_json::Value =
            reqwest::get(format!("{}/admin/dead-letters", gateway.admin))
                .await
                .expect("get")
                .json()
                .await
                .expect("json");
        if letters["dead_letters"]
            .as_array()
            .is_some_and(|l| l.len() >= 2)
            || Instant::now() > deadline
        {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let letters = letters["dead_letters"].as_array().expect("array");
    let reason = |id: &str| {
        letters
            .iter()
            .find(|l| l["event_id"] == id)
            .map(|l| l["reason"].as_str().unwrap_or_default().to_owned())
    };
    assert!(
        reason("bad").expect("bad is dead").contains("422"),
        "{letters:?}"
    );
    let down = reason("down").expect("down is dead");
    assert!(
        down.contains("gave up after 3 attempts") && down.contains("503"),
        "{down}"
    );
    let stats = gateway.stats().await;
    assert_eq!(stats["gateway"]["dead_letters"], 2);
    assert_eq!(downstream.count("bad"), 0);
    // One word for one thing: the platform is `platform`, in the listing and its filter;
    // "source" names a configured source, and as a filter it is refused with the right word.
    for letter in letters {
        assert_eq!(letter["platform"], "feishu", "{letter}");
        assert!(letter.get("source").is_none(), "{letter}");
    }
    let by_platform: serde_json::Value = reqwest::get(format!(
        "{}/admin/dead-letters?platform=feishu",
        gateway.admin
    ))
    .await
    .expect("get")
    .json()
    .await
    .expect("json");
    assert_eq!(
        by_platform["dead_letters"].as_array().map(Vec::len),
        Some(2)
    );
    let old_word = reqwest::get(format!(
        "{}/admin/dead-letters?source=feishu",
        gateway.admin
    ))
    .await
    .expect("get");
    assert_eq!(old_word.status(), 400);
    let refusal = old_word.text().await.expect("text");
    assert!(refusal.contains("platform"), "{refusal}");
    let (ok, listed) = cli(&gateway, &["dlq", "list", "--platform", "wecom"]);
    assert!(ok && listed.contains("0 dead letters"), "{listed}");

    // The operator fixes the receiver and replays "bad" from the command line: delivered once.
    downstream
        .behavior
        .lock()
        .expect("behavior")
        .permanent
        .clear();
    let (ok, listed) = cli(
        &gateway,
        &["dlq", "list", "--event-type", "im.message.receive_v1"],
    );
    assert!(ok, "{listed}");
    assert!(
        listed.contains("bad") && listed.contains("down") && listed.contains("2 dead letters"),
        "{listed}"
    );
    // A listing cut short by its limit says so, and how to see the rest.
    let (ok, first) = cli(&gateway, &["dlq", "list", "--limit", "1"]);
    assert!(
        ok && first.contains("1 of 2 dead letters shown") && first.contains("--limit 2"),
        "{first}"
    );
    // A reader that goes away before the list is written (`oncegate dlq list | head`): no
    // panic, no error, exit 0.
    let mut piped = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["dlq", "list", "--admin", &gateway.admin])
        .env_remove("ONCEGATE_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("oncegate");
    drop(piped.stdout.take());
    let closed = piped.wait_with_output().expect("oncegate");
    let said = String::from_utf8_lossy(&closed.stderr);
    assert!(
        closed.status.success() && said.is_empty(),
        "{:?} {said}",
        closed.status
    );
    // One command tells the whole story of one event: not done, and why it died.
    let (ok, story) = cli(
        &gateway,
        &[
            "inspect",
            "record",
            "--platform",
            "feishu",
            "--app",
            APP_ID,
            "--id",
            "bad",
        ],
    );
    assert!(ok, "{story}");
    assert!(story.contains("state        pending"), "{story}");
    assert!(
        story.contains("dead letter")
            && story.contains("422")
            && story.contains("after 1 attempts"),
        "{story}"
    );
    // Times as spans (kept 23h59m… more, died 0h00m0…s ago), never epoch milliseconds.
    assert!(
        story
            .lines()
            .any(|l| l.starts_with("kept ") && l.ends_with("s more") && l.contains('h'))
            && story.contains("s ago"),
        "{story}"
    );
    assert!(
        !story.contains("kept until") && !story.contains(" ms:"),
        "an epoch time in {story}"
    );
    let (ok, replayed) = cli(&gateway, &["dlq", "replay", "--all", "--event-id", "bad"]);
    assert!(ok, "{replayed}");
    assert!(replayed.contains("replayed 1"), "{replayed}");
    downstream
        .wait_for("the replayed bad", |got| {
            got.iter().any(|g| g.event_id == "bad")
        })
        .await;
    // The same dead letter again: it is not there any more; nothing is delivered twice.
    let bad_id = letters
        .iter()
        .find(|l| l["event_id"] == "bad")
        .and_then(|l| l["id"].as_str())
        .expect("an id")
        .to_owned();
    let (ok, again) = cli(&gateway, &["dlq", "replay", "--id", &bad_id]);
    assert!(!ok, "a second replay of one letter is refused: {again}");
    assert!(again.contains("not a dead letter"), "{again}");
    // The one that will never work is purged; a misspelt filter is refused, not widened.
    let (ok, purged) = cli(
        &gateway,
        &["dlq", "purge", "--all", "--reason", "gave up after 3"],
    );
    assert!(ok && purged.contains("purged 1"), "{purged}");
    let misspelt = client
        .post(format!("{}/admin/dead-letters/replay", gateway.admin))
        .json(&serde_json::json!({"all": true, "event_typ": "x"}))
        .send()
        .await
        .expect("post");
    assert_eq!(misspelt.status(), 400);
    // An id of a partition the store does not have is the caller's mistake: 400, not 503.
    let beyond = client
        .post(format!("{}/admin/dead-letters/replay", gateway.admin))
        .json(&serde_json::json!({"ids": ["999:1"]}))
        .send()
        .await
        .expect("post");
    assert_eq!(beyond.status(), 400);
    let beyond = beyond.text().await.expect("text");
    assert!(beyond.contains("partitions 0 to 7"), "{beyond}");
    let (_, listed) = cli(&gateway, &["dlq", "list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("json");
    assert_eq!(listed["dead_letters"], serde_json::json!([]));
    let (ok, status) = cli(&gateway, &["status"]);
    assert!(ok, "{status}");
    assert!(status.contains("ready        true"), "{status}");
    // The test configuration's first route is unsigned: said, as /readyz says it.
    assert!(
        status.contains(
            "at risk      configuration: route[0].secret: an http route without a secret"
        ),
        "{status}"
    );
    // What the store keeps (both were replayed or purged) beside what this run dead-lettered.
    assert!(status.contains("dead letters kept 0"), "{status}");
    assert!(
        status.contains("dead-lettered 2 since this start"),
        "{status}"
    );
    // The container healthcheck's command: ready, exit 0.
    let (ok, ready) = cli(&gateway, &["ready"]);
    assert!(ok && ready.starts_with("ready"), "{ready}");
    // With --json, /readyz's own answer.
    let (ok, ready) = cli(&gateway, &["ready", "--json"]);
    let ready: serde_json::Value = serde_json::from_str(&ready).expect("JSON");
    assert!(ok && ready["ready"] == true, "{ready}");
    // Keys remembered for dedup are said to be that, not read as a stuck backlog.
    assert!(
        status.contains("remembered") && status.contains("not a backlog"),
        "{status}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(downstream.count("bad"), 1, "replayed once, delivered once");
    let (ok, story) = cli(
        &gateway,
        &[
            "inspect",
            "record",
            "--platform",
            "feishu",
            "--app",
            APP_ID,
            "--id",
            "bad",
        ],
    );
    assert!(ok && story.contains("state        completed"), "{story}");
    assert!(!story.contains("dead letter"), "{story}");
}

/// While a chat's first event is in its handler, `oncegate queue` shows the chat's partition
/// with the two events behind it, in order, and `oncegate status` the queue's line; once
/// delivered the queue is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_command_shows_a_chats_events_in_order_while_its_first_is_handled() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream
        .behavior
        .lock()
        .expect("behavior")
        .slow_once
        .insert("q-held".into(), Duration::from_secs(3));
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, false);
    for id in ["q-held", "q-next", "q-last"] {
        let (status, _) = post(
            &client,
            &gateway.url,
            &sign(&message(id, "oc_queue", 1_000)),
        )
        .await
        .expect("post");
        assert_eq!(status, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while downstream.behavior.lock().expect("behavior").slow_started == 0 {
        assert!(Instant::now() < deadline, "the slow delivery never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (ok, all) = cli(&gateway, &["queue", "--json"]);
    assert!(ok, "{all}");
    let all: serde_json::Value = serde_json::from_str(&all).expect("json");
    let busy: Vec<&serde_json::Value> = all["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .filter(|p| p["events"] != 0)
        .collect();
    assert_eq!(busy.len(), 1, "{all}");
    assert_eq!(
        (&busy[0]["events"], &busy[0]["handed_out"]),
        (&serde_json::json!(3), &serde_json::json!(1)),
        "{all}"
    );
    let partition = busy[0]["partition"].to_string();
    let (ok, listed) = cli(&gateway, &["queue", "--partition", &partition]);
    assert!(ok, "{listed}");
    let lines: Vec<&str> = listed.lines().collect();
    assert!(lines[0].contains("3 events, 1 handed out"), "{listed}");
    let held = lines
        .iter()
        .position(|l| l.contains("q-held") && l.ends_with("handed out"));
    let next = lines
        .iter()
        .position(|l| l.contains("q-next") && l.ends_with("waiting"));
    let last = lines
        .iter()
        .position(|l| l.contains("q-last") && l.ends_with("waiting"));
    assert!(held.is_some() && held < next && next < last, "{listed}");
    let (ok, page) = cli(
        &gateway,
        &["queue", "--partition", &partition, "--limit", "1"],
    );
    assert!(ok && page.contains("more: --after"), "{page}");
    let (ok, status) = cli(&gateway, &["status"]);
    assert!(ok, "{status}");
    assert!(
        status.contains("queue        3 events in 8 partitions (1 handed out)"),
        "{status}"
    );
    let (ok, wrong) = cli(&gateway, &["queue", "--partition", "99"]);
    assert!(!ok && wrong.contains("no partition 99"), "{wrong}");

    downstream
        .wait_for("all three", |got| {
            got.iter().any(|g| g.event_id == "q-last")
        })
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ok, status) = cli(&gateway, &["status"]);
        assert!(ok, "{status}");
        if status.contains("queue        empty (8 partitions)") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the queue should drain: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `oncegate <args> --admin <the gateway's admin listener>`: success, and what it printed.
fn cli(gateway: &Gateway, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(args)
        .args(["--admin", &gateway.admin])
        .env_remove("ONCEGATE_CONFIG")
        .output()
        .expect("oncegate");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_its_status() {
    let dir = tempfile::tempdir().expect("dir");
    let (_downstream, addr) = Downstream::start().await;
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, false);
    let good = sign(&message("good", "oc", 1_000));
    let status = |r: Result<(u16, String), reqwest::Error>| r.expect("post");

    let mut forged = good.clone_signed();
    forged.signature = "0".repeat(64);
    let (code, body) = status(post(&client, &gateway.url, &forged).await);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("signature mismatch"), "{body}");

    let wrong_token = sign(&message("tok", "oc", 1_000).replace(TOKEN, "not-the-token"));
    let (code, body) = status(post(&client, &gateway.url, &wrong_token).await);
    assert_eq!(
        (code, body.contains("verification token")),
        (401, true),
        "{body}"
    );

    let garbage = sign("this is not json");
    let (code, body) = status(post(&client, &gateway.url, &garbage).await);
    assert_eq!((code, body.contains("not JSON")), (400, true), "{body}");

    let unknown = sign(r#"{"hello":"world"}"#);
    let (code, body) = status(post(&client, &gateway.url, &unknown).await);
    assert_eq!(
        (code, body.contains("unknown envelope")),
        (400, true),
        "{body}"
    );

    let huge = sign(&message(&"x".repeat(70_000), "oc", 1_000));
    let (code, body) = status(post(&client, &gateway.url, &huge).await);
    assert_eq!((code, body.contains("body_limit")), (413, true), "{body}");

    let stale = sign_at(&message("stale", "oc", 1_000), now_secs() - 3_600);
    let (code, body) = status(post(&client, &gateway.url, &stale).await);
    assert_eq!((code, body.contains("skew")), (401, true), "{body}");

    let (code, body) = status(post(&client, &gateway.url.replace("/main", "/nope"), &good).await);
    assert_eq!(
        (code, body.contains("no such source"), body.contains("main")),
        (404, true, false),
        "the configured names are not told: {body}"
    );

    let (code, _) = status(post(&client, &gateway.url, &good).await);
    assert_eq!(code, 200);
    let (code, body) = status(post(&client, &gateway.url, &good).await);
    assert_eq!((code, body.contains("replayed")), (409, true), "{body}");

    let stats = gateway.stats().await;
    assert_eq!(stats["gateway"]["bad_requests"], 6);
    assert_eq!(stats["gateway"]["stale_timestamps"], 1);
    assert_eq!(stats["gateway"]["replays_rejected"], 1);
    assert_eq!(stats["gateway"]["admitted"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_card_click_gets_the_first_answer() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    let client = client();
    let gateway = Gateway::start(dir.path(), addr, false);
    let click = serde_json::json!({
        "schema": "2.0",
        "header": {"event_id": "card-1", "token": TOKEN, "create_time": "1603977298000000", "event_type": "card.action.trigger", "app_id": APP_ID},
        "event": {"action": {"value": {"k": "v"}}, "context": {"open_chat_id": "oc_c", "open_message_id": "om_c"}}
    })
    .to_string();
    let (code, first) = post(&client, &gateway.url, &sign(&click))
        .await
        .expect("post");
    assert_eq!(code, 200, "{first}");
    assert!(first.contains("answer 1"), "{first}");
    let (code, second) = post(&client, &gateway.url, &sign(&click))
        .await
        .expect("post");
    assert_eq!(code, 200);
    assert_eq!(second, first, "the stored answer, not a second call");
    assert_eq!(downstream.count("card-1"), 1);
    let other = click.replace("card-1", "card-2");
    let (_, third) = post(&client, &gateway.url, &sign(&other))
        .await
        .expect("post");
    assert!(third.contains("answer 2"), "{third}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_one_redis_deliver_each_event_once_in_chat_order() {
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    });
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"e2e{}\"\npartitions = 8",
        std::process::id()
    );
    three_gateways_deliver_once(&store, 100, 200, "one redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_on_a_redis_cluster_deliver_each_event_once_in_chat_order() {
    let urls = std::env::var("ONCEGATE_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        panic!(
            "ONCEGATE_TEST_REDIS_CLUSTER_URL is not set: run scripts/test, which starts a redis cluster"
        )
    });
    let store = format!(
        "backend = \"redis\"\ncluster = true\nurl = \"{urls}\"\nprefix = \"e2ec{}\"\npartitions = 32",
        std::process::id()
    );
    three_gateways_deliver_once(&store, 40, 50, "a redis cluster").await;
}

/// Three gateways on one shared store; `CHATS` × `PER_CHAT` events sent round-robin, 30 % of
/// them again through another gateway: each delivered once, every chat in order.
async fn three_gateways_deliver_once(store: &str, chats: usize, per_chat: usize, label: &str) {
    let (downstream, addr) = Downstream::start().await;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let gateways: Vec<Gateway> = dirs
        .iter()
        .map(|d| Gateway::start_with(d.path(), addr, false, store))
        .collect();
    let urls: Arc<Vec<String>> = Arc::new(gateways.iter().map(|g| g.url.clone()).collect());
    let client = client();
    let duplicates = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut senders = Vec::new();
    for chat in 0..chats {
        let (client, urls, duplicates) = (client.clone(), urls.clone(), duplicates.clone());
        senders.push(tokio::spawn(async move {
            for n in 0..per_chat {
                let id = format!("multi-{chat}-{n}");
                let plain = message(&id, &format!("oc_multi{chat}"), 1_000 + n as u64);
                let first = (chat + n) % 3;
                let (status, body) = post(&client, &urls[first], &sign(&plain))
                    .await
                    .expect("post");
                assert_eq!(status, 200, "{body}");
                // 30 % of events come again, through another gateway, as a platform retry.
                if fastrand::u8(..10) < 3 {
                    let (status, body) = post(&client, &urls[(first + 1) % 3], &sign(&plain))
                        .await
                        .expect("post");
                    assert_eq!((status, body.contains("duplicate")), (200, true), "{body}");
                    duplicates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for chat in senders {
        chat.await.expect("chat");
    }
    let sent = started.elapsed();
    // A captured request replayed byte for byte to the other gateways: the nonce is in the
    // shared store, so each refuses it as a replay, not only the gateway that saw it.
    let probe = sign(&message("replay-probe", "oc_probe", 1));
    let (status, body) = post(&client, &urls[0], &probe).await.expect("post");
    assert_eq!(status, 200, "{body}");
    for url in &urls[1..] {
        let (status, body) = post(&client, url, &probe).await.expect("post");
        assert_eq!(status, 409, "a replay to another gateway: {body}");
    }
    downstream
        .wait_for("every event", |got| got.len() > chats * per_chat)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = downstream.got();
    assert_eq!(got.len(), chats * per_chat + 1, "each event exactly once");
    let mut by_chat: HashMap<String, Vec<String>> = HashMap::new();
    for g in &got {
        by_chat
            .entry(g.order_key.clone().unwrap_or_default())
            .or_default()
            .push(g.event_id.clone());
    }
    for chat in 0..chats {
        let expected: Vec<String> = (0..per_chat).map(|n| format!("multi-{chat}-{n}")).collect();
        assert_eq!(
            by_chat.get(&format!("oc_multi{chat}")),
            Some(&expected),
            "chat {chat} in order"
        );
    }
    eprintln!(
        "three gateways on {label}: {} events + {} duplicates sent in {:.1} s, delivered once each in {:.1} s",
        chats * per_chat,
        duplicates.load(std::sync::atomic::Ordering::Relaxed),
        sent.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// A Redis store section with a spool beside the gateway's other files.
fn spooling_store(redis: &OwnRedis, dir: &Path) -> String {
    format!(
        "backend = \"redis\"\nurl = \"{}\"\npartitions = 4\nspool = \"{}\"",
        redis.url(),
        dir.join("spool.redb").display()
    )
}

/// Events `<id_prefix><n>` of chats `<chat_prefix><c>` (c < `chats`) arrived in increasing n.
#[track_caller]
fn assert_chats_in_order(got: &[Got], id_prefix: &str, chat_prefix: &str, chats: usize) {
    for chat in 0..chats {
        let order: Vec<usize> = got
            .iter()
            .filter(|g| g.order_key.as_deref() == Some(&format!("{chat_prefix}{chat}")))
            .filter_map(|g| g.event_id.strip_prefix(id_prefix)?.parse().ok())
            .collect();
        assert!(order.is_sorted(), "chat {chat} in order: {order:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_spool_an_outage_is_answered_200_and_nothing_is_lost_or_doubled() {
    const CHATS: usize = 5;
    let mut redis = OwnRedis::start();
    let (downstream, addr) = Downstream::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = spooling_store(&redis, dir.path());
    let gateway = Gateway::start_with_lease(dir.path(), addr, false, &store, "2s", "500ms");
    let client = client();
    let plain = |i: usize| message(&format!("sp-{i}"), &format!("oc_sp{}", i % CHATS), i as u64);
    // Sends `ids` chat by chat, in order within each chat, and returns the answers' bodies.
    let send = |ids: Vec<usize>| {
        let (client, url) = (client.clone(), gateway.url.clone());
        async move {
            let mut chats = Vec::new();
            for chat in 0..CHATS {
                let mine: Vec<usize> = ids.iter().copied().filter(|i| i % CHATS == chat).collect();
                let (client, url) = (client.clone(), url.clone());
                chats.push(tokio::spawn(async move {
                    let mut bodies = Vec::new();
                    for i in mine {
                        let (status, body) =
                            post(&client, &url, &sign(&plain(i))).await.expect("post");
                        assert_eq!(status, 200, "event {i}: {body}");
                        bodies.push(body);
                    }
                    bodies
                }));
            }
            let mut bodies = Vec::new();
            for chat in chats {
                bodies.extend(chat.await.expect("chat"));
            }
            bodies
        }
    };
    send((0..100).collect()).await;
    downstream
        .wait_for("the first hundred", |got| got.len() >= 100)
        .await;
    redis.kill9();
    // The outage: platform retries of admitted events and new events, all answered 200.
    let bodies = send((50..300).collect()).await;
    let spooled = bodies.iter().filter(|b| b.contains("spooled")).count();
    assert_eq!(spooled, 250, "every request during the outage is spooled");
    let ready = reqwest::get(format!("{}/readyz", gateway.admin))
        .await
        .expect("readyz");
    assert_eq!(
        ready.status().as_u16(),
        200,
        "a spooling gateway stays ready"
    );
    assert!(ready.text().await.unwrap_or_default().contains("spooling"));
    redis.run();
    downstream
        .wait_for("every event after the outage", |got| got.len() >= 300)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = downstream.got();
    let ids: Vec<&str> = got.iter().map(|g| &*g.event_id).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(
        (ids.len(), unique.len()),
        (300, 300),
        "each event delivered once"
    );
    assert_chats_in_order(&got, "sp-", "oc_sp", CHATS);
    let stats = gateway.stats().await;
    let counter = |name: &str| stats["gateway"][name].as_u64().unwrap_or(0);
    assert_eq!(
        (counter("spooled"), counter("unspooled")),
        (250, 250),
        "{stats}"
    );
    assert_eq!(counter("admitted"), 300, "{stats}");
    assert_eq!(
        counter("duplicates"),
        50,
        "the retries of admitted events: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_requests_survive_a_kill_nine_and_a_restart_during_the_outage() {
    const EVENTS: usize = 60;
    let mut redis = OwnRedis::start();
    let (downstream, addr) = Downstream::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = spooling_store(&redis, dir.path());
    let gateway = Gateway::start_with_lease(dir.path(), addr, false, &store, "2s", "500ms");
    let client = client();
    redis.kill9();
    for i in 0..EVENTS {
        let plain = message(&format!("kept-{i}"), &format!("oc_kept{}", i % 3), i as u64);
        let (status, body) = post(&client, &gateway.url, &sign(&plain))
            .await
            .expect("post");
        assert_eq!((status, body.contains("spooled")), (200, true), "{body}");
    }
    // Answered 200 means on disk: the process dies before anything reached Redis.
    gateway.kill9();
    // It comes back while Redis is still down (it starts without it, since it has a spool),
    // and keeps taking requests behind the ones it kept.
    let gateway = Gateway::start_with_lease(dir.path(), addr, false, &store, "2s", "500ms");
    let ready = reqwest::get(format!("{}/readyz", gateway.admin))
        .await
        .expect("readyz");
    assert_eq!(ready.status().as_u16(), 200, "ready, spooling");
    for i in EVENTS..EVENTS + 20 {
        let plain = message(&format!("kept-{i}"), &format!("oc_kept{}", i % 3), i as u64);
        let (status, body) = post(&client, &gateway.url, &sign(&plain))
            .await
            .expect("post");
        assert_eq!((status, body.contains("spooled")), (200, true), "{body}");
    }
    redis.run();
    downstream
        .wait_for("every spooled event", |got| got.len() >= EVENTS + 20)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = downstream.got();
    let unique: HashSet<&str> = got.iter().map(|g| &*g.event_id).collect();
    assert_eq!(
        (got.len(), unique.len()),
        (EVENTS + 20, EVENTS + 20),
        "each once"
    );
    assert_chats_in_order(&got, "kept-", "oc_kept", 3);
    let stats = gateway.stats().await;
    assert_eq!(
        stats["gateway"]["unspooled"],
        (EVENTS + 20) as u64,
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_three_gateways_killed_midway_loses_nothing() {
    const CHATS: usize = 30;
    const PER_CHAT: usize = 100;
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    });
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(2);
    // The killed gateway's partitions wait for its ownership to run out, and their entries
    // one ownership more before they go out again: 2 × 4 s, well inside the 20 s the test
    // waits for every event (with the default 10 s, a loaded CI machine missed it once).
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"kill{}\"\npartitions = 8\nownership = \"4s\"",
        std::process::id()
    );
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let mut gateways: Vec<Option<Gateway>> = dirs
        .iter()
        .map(|d| {
            Some(Gateway::start_with_lease(
                d.path(),
                addr,
                false,
                &store,
                "3s",
                "1s",
            ))
        })
        .collect();
    let urls: Arc<Vec<String>> =
        Arc::new(gateways.iter().flatten().map(|g| g.url.clone()).collect());
    let client = client();
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut chats = Vec::new();
    for chat in 0..CHATS {
        let (client, urls, acked) = (client.clone(), urls.clone(), acked.clone());
        chats.push(tokio::spawn(async move {
            for n in 0..PER_CHAT {
                let plain = message(
                    &format!("kill-{chat}-{n}"),
                    &format!("oc_kill{chat}"),
                    1_000 + n as u64,
                );
                // The platform retries elsewhere until some gateway answers 200.
                let mut target = (chat + n) % 3;
                loop {
                    match post(&client, &urls[target], &sign(&plain)).await {
                        Ok((200, _)) => break,
                        _ => {
                            target = (target + 1) % 3;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.load(std::sync::atomic::Ordering::Relaxed) < CHATS * PER_CHAT / 3
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Kill the first started: by now it owns its share of the partitions, about a third.
    if let Some(gateway) = gateways[0].take() {
        gateway.kill9();
    }
    for chat in chats {
        chat.await.expect("chat");
    }
    downstream
        .wait_for("every event", |got| {
            let ids: HashSet<&str> = got.iter().map(|g| &*g.event_id).collect();
            ids.len() == CHATS * PER_CHAT
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = downstream.got();
    let mut per_chat: HashMap<String, Vec<String>> = HashMap::new();
    let mut keys: HashMap<&str, HashSet<&str>> = HashMap::new();
    for g in &got {
        keys.entry(&*g.event_id)
            .or_default()
            .insert(g.idempotency_key.as_str());
        let list = per_chat
            .entry(g.order_key.clone().unwrap_or_default())
            .or_default();
        if list.last() != Some(&g.event_id) {
            list.push(g.event_id.clone());
        }
    }
    assert!(
        keys.values().all(|k| k.len() == 1),
        "a repeat carries the same Idempotency-Key"
    );
    let repeated = got.len() - keys.len();
    // Only handlers running at the kill can run again.
    assert!(repeated <= 64, "{repeated} repeats");
    for chat in 0..CHATS {
        let expected: Vec<String> = (0..PER_CHAT).map(|n| format!("kill-{chat}-{n}")).collect();
        let seen = per_chat
            .get(&format!("oc_kill{chat}"))
            .cloned()
            .unwrap_or_default();
        // A repeat of a running handler may come right after it; apart from that, in order.
        let mut deduped = seen.clone();
        deduped.dedup();
        let mut unique = Vec::new();
        for id in deduped {
            if !unique.contains(&id) {
                unique.push(id);
            }
        }
        assert_eq!(unique, expected, "chat {chat} in order");
    }
    eprintln!(
        "one of three killed: {} deliveries for {} events, {repeated} repeats",
        got.len(),
        CHATS * PER_CHAT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_outlives_its_lease_is_fenced_off() {
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    });
    let (downstream, addr) = Downstream::start().await;
    downstream
        .behavior
        .lock()
        .expect("behavior")
        .slow_once
        .insert("slow-1".into(), Duration::from_secs(3));
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"lease{}\"\npartitions = 1\nownership = \"1s\"",
        std::process::id()
    );
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    // a is alone, owns the partition and starts the slow delivery; then b joins (a keeps the
    // partition while its handler runs, whatever b's share).
    let a = Gateway::start_with_lease(dir_a.path(), addr, false, &store, "1s", "300ms");
    let client = client();
    let (status, _) = post(&client, &a.url, &sign(&message("slow-1", "oc_slow", 1_000)))
        .await
        .expect("post");
    assert_eq!(status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while downstream.behavior.lock().expect("behavior").slow_started == 0 {
        assert!(Instant::now() < deadline, "the slow delivery never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b = Gateway::start_with_lease(dir_b.path(), addr, false, &store, "1s", "300ms");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // a freezes mid-handler: no renewals, no pulls. Its lease and its partition run out; b takes
    // over, claims the event again and delivers it.
    a.signal("STOP");
    downstream
        .wait_for("b's delivery", |got| {
            got.iter().any(|g| g.event_id == "slow-1")
        })
        .await;
    // b's claim took the key over from a's expired lease, and b counts the expiry.
    let metrics = reqwest::get(format!("{}/metrics", b.admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l == "oncegate_lease_expiries_total 1"),
        "{metrics}"
    );
    a.signal("CONT");
    // a's handler ends; its completion carries the old token and is refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stats = a.stats().await;
        if stats["gateway"]["fenced"].as_u64() == Some(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a's completion should be refused and counted: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    downstream
        .wait_for("a's late delivery", |got| {
            got.iter().filter(|g| g.event_id == "slow-1").count() == 2
        })
        .await;
    let keys: HashSet<String> = downstream
        .got()
        .iter()
        .map(|g| g.idempotency_key.clone())
        .collect();
    assert_eq!(keys.len(), 1, "both runs carry the same Idempotency-Key");
    assert_eq!(b.stats().await["gateway"]["delivered"], 1);
    assert_eq!(b.stats().await["gateway"]["fenced"], 0);
    assert_eq!(
        a.stats().await["gateway"]["leases_lost"],
        1,
        "a noticed once and stopped renewing"
    );
}

/// With `[store.encryption]`, what the spool keeps through a Redis outage is sealed too: no
/// byte of a payload in clear in its file (the same run without encryption shows it there), and
/// each event is delivered once, opened, when Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_under_encryption_keeps_no_payload_in_clear() {
    const MARKER: &str = "SpoolAtRestMarker4q";
    for sealed in [false, true] {
        let mut redis = OwnRedis::start();
        let (downstream, addr) = Downstream::start().await;
        let dir = tempfile::tempdir().expect("dir");
        let key = dir.path().join("at-rest.key");
        std::fs::write(&key, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n").expect("key");
        let mut store = spooling_store(&redis, dir.path());
        if sealed {
            store.push_str(&format!(
                "\n[[store.encryption.keys]]\nid = \"k1\"\nkey = {{ file = \"{}\" }}\n",
                key.display()
            ));
        }
        let gateway = Gateway::start_with_lease(dir.path(), addr, false, &store, "2s", "500ms");
        let client = client();
        redis.kill9();
        for i in 0..10 {
            let plain = message(&format!("rest-{i}"), "oc_rest", i as u64)
                .replace("\\\"hi\\\"", &format!("\\\"{MARKER}\\\""));
            assert!(plain.contains(MARKER));
            let (status, body) = post(&client, &gateway.url, &sign(&plain))
                .await
                .expect("post");
            assert_eq!((status, body.contains("spooled")), (200, true), "{body}");
        }
        let spool = std::fs::read(dir.path().join("spool.redb")).expect("spool file");
        let in_clear = spool
            .windows(MARKER.len())
            .any(|window| window == MARKER.as_bytes());
        assert_eq!(in_clear, !sealed, "sealed: {sealed}");
        redis.run();
        downstream
            .wait_for("every spooled event", |got| got.len() >= 10)
            .await;
        let got = downstream.got();
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|g| g.payload.contains(MARKER)), "{got:?}");
    }
}

/// A gateway on the embedded store (8 partitions) whose dispatcher has `dispatcher` for its
/// concurrency, posting to a downstream that answers after `delay_ms`.
async fn slow_gateway(dir: &Path, delay_ms: u64, dispatcher: &str) -> (Downstream, Gateway) {
    let store = format!("path = \"{}\"\npartitions = 8", dir.join("store").display());
    slow_gateway_on(dir, &store, delay_ms, dispatcher).await
}

/// `slow_gateway` on the `[store]` section `store`.
async fn slow_gateway_on(
    dir: &Path,
    store: &str,
    delay_ms: u64,
    dispatcher: &str,
) -> (Downstream, Gateway) {
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(delay_ms);
    let config = write_config(dir, addr, false, store, "30s", "5s");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, text.replace("concurrency = 32", dispatcher)).expect("config");
    (downstream, Gateway::run(&config))
}

/// `message` of Feishu tenant `tenant`.
fn message_of(tenant: &str, event_id: &str, chat: &str) -> String {
    let plain = message(event_id, chat, now_secs() * 1000);
    let mine = plain.replace(
        "\"tenant_key\":\"t\"",
        &format!("\"tenant_key\":\"{tenant}\""),
    );
    assert_ne!(plain, mine, "the message names its tenant");
    mine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tenants_event_goes_before_another_tenants_backlog_in_every_partition() {
    const FLOOD: usize = 48;
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, gateway) = slow_gateway(dir.path(), 100, "concurrency = 2").await;
    let client = client();
    // One tenant's backlog over 24 chats (so over every partition), all admitted first.
    for i in 0..FLOOD {
        let request = sign(&message_of(
            "flood",
            &format!("flood-{i}"),
            &format!("oc_flood{}", i % 24),
        ));
        let (status, _) = post(&client, &gateway.url, &request).await.expect("post");
        assert_eq!(status, 200);
    }
    let request = sign(&message_of("quiet", "quiet-0", "oc_quiet"));
    let (status, _) = post(&client, &gateway.url, &request).await.expect("post");
    assert_eq!(status, 200);
    let admitted_at = downstream.got().len();
    downstream
        .wait_for("the quiet tenant's event", |got| {
            got.iter().any(|g| g.event_id == "quiet-0")
        })
        .await;
    let got = downstream.got();
    let quiet_at = got
        .iter()
        .position(|g| g.event_id == "quiet-0")
        .expect("delivered");
    // The two handlers running when it came end first; the next free handler is its.
    let flood_between = quiet_at.saturating_sub(admitted_at);
    assert!(
        flood_between <= 4,
        "{flood_between} of the backlog went before the quiet tenant's one event \
         ({admitted_at} were delivered before it was admitted)"
    );
    assert!(
        admitted_at + flood_between < FLOOD,
        "the backlog was not drained first"
    );
    downstream
        .wait_for("the whole backlog", |got| got.len() > FLOOD)
        .await;
}

/// The bot's open_id in the priority test's configuration.
const BOT_OPEN_ID: &str = "ou_e2e_bot";

/// A group text message of tenant `tenant` in `chat`, as Feishu documents
/// `im.message.receive_v1`, mentioning `mentions` (open_ids).
fn group_message(tenant: &str, event_id: &str, chat: &str, mentions: &[&str]) -> String {
    let mentions: Vec<serde_json::Value> = mentions
        .iter()
        .enumerate()
        .map(|(at, open_id)| {
            serde_json::json!({"key": format!("@_user_{}", at + 1),
                "id": {"open_id": open_id, "union_id": format!("on_{at}")},
                "name": "someone", "tenant_key": tenant})
        })
        .collect();
    serde_json::json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "token": TOKEN, "create_time": (now_secs() * 1000).to_string(),
                   "event_type": "im.message.receive_v1", "tenant_key": tenant, "app_id": APP_ID},
        "event": {
            "sender": {"sender_id": {"open_id": "ou_person"}, "sender_type": "user", "tenant_key": tenant},
            "message": {"message_id": format!("om_{event_id}"), "chat_id": chat, "chat_type": "group",
                        "message_type": "text", "content": "{\"text\":\"@_user_1 hi\"}",
                        "create_time": (now_secs() * 1000).to_string(), "mentions": mentions}}
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_at_mention_passes_its_tenants_backlog_but_not_its_chats_earlier_events() {
    const BACKLOG: usize = 40;
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, config) = {
        let (downstream, addr) = Downstream::start().await;
        downstream.behavior.lock().expect("behavior").delay = Duration::from_millis(40);
        let store = format!(
            "path = \"{}\"\npartitions = 8",
            dir.path().join("store").display()
        );
        let config = write_config(dir.path(), addr, false, &store, "30s", "5s");
        // The README's route for messages, first, to the downstream.
        let route = readme_block("**Messages to the bot first.**", &[]).replace(
            "https://bot.internal/feishu",
            &format!("http://{addr}/events"),
        ) + &format!("secret = \"{SECRET}\"\n");
        let text = std::fs::read_to_string(&config).expect("config");
        let text = text
            .replace("concurrency = 32", "concurrency = 1")
            .replace(
                &format!("app_id = \"{APP_ID}\""),
                &format!("app_id = \"{APP_ID}\"\nbot_open_id = \"{BOT_OPEN_ID}\""),
            )
            .replacen("[[route]]", &format!("{route}\n[[route]]"), 1);
        assert!(text.contains("bot_open_id") && text.contains("priority = \"mentions\""));
        std::fs::write(&config, text).expect("config");
        (downstream, config)
    };
    let gateway = Gateway::run(&config);
    let client = client();
    let post_ok = |body: String| {
        let client = client.clone();
        let url = gateway.url.clone();
        async move {
            let (status, _) = post(&client, &url, &sign(&body)).await.expect("post");
            assert_eq!(status, 200);
        }
    };
    // One tenant's backlog over 40 chats (every partition), mentioning a person, not the bot;
    // amid it, chat X's first event.
    for i in 0..BACKLOG {
        if i == BACKLOG / 2 {
            post_ok(group_message("busy", "x-plain", "oc_x", &[])).await;
        }
        let chat = format!("oc_backlog{i}");
        post_ok(group_message(
            "busy",
            &format!("backlog-{i}"),
            &chat,
            &["ou_person2"],
        ))
        .await;
    }
    // Then chat X's @-mention of the bot, and chat Y's.
    post_ok(group_message("busy", "x-mention", "oc_x", &[BOT_OPEN_ID])).await;
    let admitted_at = downstream.got().len();
    post_ok(group_message(
        "busy",
        "y-mention",
        "oc_y",
        &["ou_person2", BOT_OPEN_ID],
    ))
    .await;
    downstream
        .wait_for("every event", |got| got.len() >= BACKLOG + 3)
        .await;
    let got = downstream.got();
    let at = |id: &str| {
        got.iter()
            .position(|g| g.event_id == id)
            .unwrap_or_else(|| panic!("{id} delivered"))
    };
    assert_eq!(got.len(), BACKLOG + 3, "each once");
    let (plain, mention) = (at("x-plain"), at("x-mention"));
    eprintln!(
        "delivered before the mentions: {admitted_at}; y-mention {}th, x-plain {plain}th, x-mention {mention}th",
        at("y-mention")
    );
    assert!(
        plain >= admitted_at,
        "x-plain was delivered before x-mention came: nothing to hold it back"
    );
    // Y's mention: at most the handler running when it came, then its turn.
    assert!(
        at("y-mention") <= admitted_at + 2,
        "y-mention delivered {}th, admitted after {admitted_at}",
        at("y-mention")
    );
    assert!(
        at("y-mention") + 10 < BACKLOG,
        "the backlog was not drained first"
    );
    // X's mention waits for X's first event, then passes what remains of the backlog.
    assert!(plain < mention, "x-plain {plain}, x-mention {mention}");
    assert!(
        mention <= plain + 2,
        "x-mention {mention}th, x-plain {plain}th"
    );
    assert!(
        mention + 10 < got.len(),
        "the backlog was drained before x-plain ({plain}th): nothing left to pass"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_queue_bound_gets_503_while_others_are_admitted_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "path = \"{}\"\npartitions = 8",
        dir.path().join("store").display()
    );
    tenant_bound(dir.path(), &store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_queue_bound_on_redis_gets_503_and_nothing_is_lost() {
    let Ok(url) = std::env::var("ONCEGATE_TEST_REDIS_URL") else {
        panic!("ONCEGATE_TEST_REDIS_URL is not set: run scripts/test, which starts redis-server")
    };
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "backend = \"redis\"\nurl = \"{url}\"\nprefix = \"bound{}\"\npartitions = 8",
        fastrand::u32(..)
    );
    tenant_bound(dir.path(), &store).await;
}

/// A tenant flooding a gateway on `store` with `max_queued_per_tenant = 5` is answered 503
/// past its bound while another tenant is admitted; the platform's retries bring every event
/// in, each delivered once.
async fn tenant_bound(dir: &Path, store: &str) {
    const FLOOD: usize = 30;
    let (downstream, gateway) = slow_gateway_on(
        dir,
        store,
        200,
        "concurrency = 1\nmax_queued_per_tenant = 5",
    )
    .await;
    let client = client();
    let flood: Vec<Signed> = (0..FLOOD)
        .map(|i| {
            sign(&message_of(
                "flood",
                &format!("bound-{i}"),
                &format!("oc_bound{}", i % 10),
            ))
        })
        .collect();
    let mut refused = Vec::new();
    for (i, request) in flood.iter().enumerate() {
        let (status, body) = post(&client, &gateway.url, request).await.expect("post");
        match status {
            200 => {}
            503 => {
                assert!(body.contains("max_queued_per_tenant"), "{body}");
                refused.push(i);
            }
            other => panic!("event {i}: {other} {body}"),
        }
    }
    let admitted = FLOOD - refused.len();
    assert!(
        (5..=8).contains(&admitted),
        "{admitted} of the flooding tenant's events were admitted with a bound of 5"
    );
    // Another tenant is admitted while the flooding one is refused.
    let quiet = sign(&message_of("quiet", "bound-quiet", "oc_bound_quiet"));
    assert_eq!(
        post(&client, &gateway.url, &quiet).await.expect("post").0,
        200
    );
    assert_eq!(
        post(&client, &gateway.url, &flood[refused[0]])
            .await
            .expect("post")
            .0,
        503,
        "still full"
    );
    // The platform's retry (signed anew) of one it admitted before gets the success answer,
    // not a 503 it would send again until the queue drains.
    let first_admitted = (0..FLOOD)
        .find(|i| !refused.contains(i))
        .expect("one admitted");
    let retry = sign(&message_of(
        "flood",
        &format!("bound-{first_admitted}"),
        &format!("oc_bound{}", first_admitted % 10),
    ));
    let (status, body) = post(&client, &gateway.url, &retry).await.expect("post");
    assert_eq!(
        status, 200,
        "a retry of an admitted event while its tenant is full: {body}"
    );
    assert!(
        gateway.stats().await["gateway"]["tenant_queue_full"].as_u64()
            >= Some(refused.len() as u64 + 1)
    );
    // The platform sends each refused callback again until it is taken; meanwhile the tenants
    // view names the flooding tenant first, its events queued, its refusals.
    let refusals = refused.len() as u64 + 1;
    let mut seen_first = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !refused.is_empty() {
        let view = tenants_view(&gateway).await;
        let first = &view["tenants"][0];
        if first["tenant"]
            .as_str()
            .is_some_and(|name| name.ends_with(" flood"))
            && first["queued"].as_u64() >= Some(1)
        {
            assert!(first["refused"].as_u64() >= Some(refusals), "{view}");
            assert!(first["in_flight"].as_u64() <= Some(1), "{view}");
            if seen_first.is_none() {
                // The same tenants, by name, in /metrics.
                let name = first["tenant"].as_str().unwrap_or_default();
                let metrics = reqwest::get(format!("{}/metrics", gateway.admin))
                    .await
                    .expect("metrics")
                    .text()
                    .await
                    .expect("text");
                let value = |metric: &str| {
                    let series = format!("{metric}{{tenant=\"{name}\"}} ");
                    metrics
                        .lines()
                        .find_map(|line| line.strip_prefix(&series))
                        .and_then(|value| value.parse::<u64>().ok())
                };
                assert!(value("oncegate_tenant_queued").is_some(), "{metrics}");
                assert!(value("oncegate_tenant_in_flight").is_some(), "{metrics}");
                assert!(
                    value("oncegate_tenant_refused") >= Some(refusals),
                    "{metrics}"
                );
                assert!(metrics.contains("# TYPE oncegate_tenant_queued gauge"));
            }
            seen_first = Some(view);
        }
        assert!(
            Instant::now() < deadline,
            "{} never admitted",
            refused.len()
        );
        let mut left = Vec::new();
        for i in refused {
            match post(&client, &gateway.url, &flood[i])
                .await
                .expect("post")
                .0
            {
                200 => {}
                503 => left.push(i),
                other => panic!("event {i}: {other}"),
            }
        }
        refused = left;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_first.is_some(), "{}", tenants_view(&gateway).await);
    downstream
        .wait_for("every event", |got| got.len() > FLOOD)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..FLOOD {
        assert_eq!(downstream.count(&format!("bound-{i}")), 1, "bound-{i}");
    }
    assert_eq!(downstream.count("bound-quiet"), 1);
}

/// `GET /admin/tenants` of `gateway`.
async fn tenants_view(gateway: &Gateway) -> serde_json::Value {
    reqwest::get(format!("{}/admin/tenants", gateway.admin))
        .await
        .expect("tenants")
        .json()
        .await
        .expect("json")
}

/// The README's WeCom and Official Account sources pass `check-config` as shown: the AgentID as
/// WeCom's console shows it, a number.
#[test]
fn the_readme_wecom_sources_are_valid_with_a_numeric_agent_id() {
    const AES: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";
    let block = readme_block(
        "### WeCom and WeChat Official Accounts",
        &[
            ("CORP_A_TOKEN", "corp-token"),
            ("CORP_A_AES_KEY", AES),
            ("OA_TOKEN", "oa-token"),
            ("OA_AES_KEY", AES),
        ],
    );
    assert!(block.contains("agent_id = 1000002 "), "{block}");
}

/// Every command Redis ran since the last `CONFIG RESETSTAT`, and the `SCAN`s among them.
fn redis_calls(redis: &OwnRedis) -> (u64, u64) {
    let info = redis.cli(&["INFO", "commandstats"]);
    let mut total = 0;
    let mut scans = 0;
    for line in info.lines() {
        // cmdstat_get:calls=12,usec=...
        let Some((name, rest)) = line.split_once(":calls=") else {
            continue;
        };
        let calls: u64 = rest
            .split(',')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if name == "cmdstat_config" || name == "cmdstat_info" {
            continue;
        }
        total += calls;
        if name == "cmdstat_scan" {
            scans += calls;
        }
    }
    (total, scans)
}

/// Redis commands per call of `call` (run `times`), beyond what the idle gateway runs in the
/// same time; the `SCAN`s; the median call's time.
async fn commands_per_call<F, Fut>(redis: &OwnRedis, times: u32, call: F) -> (f64, u64, Duration)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let idle = Instant::now();
    // The gateway's own beats and polls go on meanwhile: their rate, over a second, is taken
    // off (they come in bursts: a shorter window misjudged them by a dozen commands a call).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (background, _) = redis_calls(redis);
    let per_second = background as f64 / idle.elapsed().as_secs_f64();
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let started = Instant::now();
    let mut took = Vec::new();
    for _ in 0..times {
        let at = Instant::now();
        call().await;
        took.push(at.elapsed());
    }
    let (total, scans) = redis_calls(redis);
    let beyond = total as f64 - per_second * started.elapsed().as_secs_f64();
    took.sort_unstable();
    (
        beyond.max(0.0) / f64::from(times),
        scans,
        took[took.len() / 2],
    )
}

/// `/admin/stats` and `oncegate status` answer from counts kept as events move: with a million
/// record keys in Redis they run the same few commands per partition as with none, in well
/// under 50 ms, and still count what the gateway did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_status_cost_the_same_over_a_million_keys_as_over_none() {
    const PARTITIONS: u64 = 8;
    let redis = OwnRedis::start_with(&[]);
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    let store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nprefix = \"cost\"\npartitions = {PARTITIONS}\ndurability = \"memory\"",
        redis.url()
    );
    let gateway = Gateway::start_with(dir.path(), addr, false, &store);
    let client = client();
    for i in 0..20 {
        let (status, body) = post(
            &client,
            &gateway.url,
            &sign(&message(
                &format!("cost-{i}"),
                &format!("oc_{}", i % 5),
                1_000,
            )),
        )
        .await
        .expect("post");
        assert_eq!(status, 200, "{body}");
    }
    downstream
        .wait_for("twenty events", |got| got.len() >= 20)
        .await;
    let stats_call = || async {
        let stats = gateway.stats().await;
        assert_eq!(stats["store"]["completed"], 20, "{stats}");
    };
    let status_call = || async {
        let admin = gateway.admin.clone();
        let (ok, status) = tokio::task::spawn_blocking(move || {
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
                .args(["status", "--admin", &admin])
                .env_remove("ONCEGATE_CONFIG")
                .output()
                .expect("oncegate");
            (
                output.status.success(),
                String::from_utf8_lossy(&output.stdout).into_owned(),
            )
        })
        .await
        .expect("status");
        assert!(ok, "{status}");
    };
    let (empty_stats, _, _) = commands_per_call(&redis, 20, stats_call).await;
    let (empty_status, _, _) = commands_per_call(&redis, 5, status_call).await;

    // A million record keys across the partitions, as 24 hours of traffic leave them.
    let fill = "local n = 0 \
        for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do \
          redis.call('SET', '{cost:' .. (i % 8) .. '}:r:' .. string.format('%032x', i), \
            'c01900000000000,,,-', 'PX', 3600000) \
          n = n + 1 \
        end return n";
    for batch in 0..10u64 {
        let from = (batch * 100_000).to_string();
        let to = (batch * 100_000 + 99_999).to_string();
        let added = redis.cli(&["EVAL", fill, "0", &from, &to]);
        assert_eq!(added.trim(), "100000", "{added}");
    }
    let keys: u64 = redis.cli(&["DBSIZE"]).trim().parse().expect("dbsize");
    assert!(keys >= 1_000_000, "{keys} keys");

    let (full_stats, scans, median) = commands_per_call(&redis, 20, stats_call).await;
    let (full_status, status_scans, _) = commands_per_call(&redis, 5, status_call).await;
    eprintln!(
        "commands a call over none, then 1M keys: /admin/stats {empty_stats:.1}, {full_stats:.1}; \
         oncegate status {empty_status:.1}, {full_status:.1}; /admin/stats's median {median:?}"
    );
    assert_eq!((scans, status_scans), (0, 0), "no SCAN");
    // A few commands per partition, the same with a million keys as with none within what
    // the background's bursts blur (a scan of the keys would be a thousand SCANs and a million
    // reads).
    let bound = 10.0 * PARTITIONS as f64;
    let blur = 2.0 * PARTITIONS as f64;
    assert!(
        full_stats <= bound && full_stats <= empty_stats + blur,
        "/admin/stats: {full_stats:.1} commands a call over 1M keys, {empty_stats:.1} over none"
    );
    assert!(
        full_status <= 2.0 * bound && full_status <= empty_status + 2.0 * blur,
        "oncegate status: {full_status:.1} commands a call over 1M keys, {empty_status:.1} over none"
    );
    assert!(
        median < Duration::from_millis(50),
        "/admin/stats over 1M keys took {median:?}"
    );
}
