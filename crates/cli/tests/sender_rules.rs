//! The Standard Webhooks sender rules, each against a downstream that answers it: a 429's
//! `Retry-After` is waited for, a 410 stops the route until an operator resumes it, a route's
//! retry schedule sets the waits and the attempts, and an event that keeps failing holds its
//! chat's later events no longer than its route allows.

use std::time::{Duration, Instant};

use crate::e2e;
use e2e::*;

/// A downstream that answers 429 with `Retry-After` gets its wait, not the backoff's 50 ms
/// (issue 36): `Retry-After: 3` is a retry 3 s later or more, and the event is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_answer_is_waited_for() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream
        .behavior
        .lock()
        .expect("behavior")
        .retry_after
        .insert("ra-1".into(), 3);
    let gateway = Gateway::start(dir.path(), addr, false);
    let client = client();
    let (status, _) = post(
        &client,
        &gateway.url,
        &sign(&message("ra-1", "oc_ra", 1_000)),
    )
    .await
    .expect("post");
    assert_eq!(status, 200);
    downstream
        .wait_for("the retried delivery", |got| {
            got.iter().any(|g| g.event_id == "ra-1")
        })
        .await;
    let attempts = downstream.behavior.lock().expect("behavior").attempts["ra-1"].clone();
    assert_eq!(attempts.len(), 2, "one 429, then the delivery");
    let waited = attempts[1] - attempts[0];
    assert!(
        waited >= Duration::from_secs(3),
        "retried after {waited:?}, before the 3 s the downstream asked for"
    );
    assert_eq!(downstream.count("ra-1"), 1);
    // Its history: the 429 with when the next attempt was due, then the delivery (issue 38).
    let record: serde_json::Value = client
        .get(format!(
            "{}/admin/record?platform=feishu&app={APP_ID}&id=ra-1",
            gateway.admin
        ))
        .send()
        .await
        .expect("record")
        .json()
        .await
        .expect("json");
    let attempts = record["attempts"].as_array().cloned().unwrap_or_default();
    let outcomes: Vec<&str> = attempts
        .iter()
        .map(|a| a["outcome"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(outcomes, ["retry", "delivered"], "{record}");
    assert!(
        attempts[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("429")),
        "{record}"
    );
    let (at, next) = (
        attempts[0]["at_ms"].as_u64().unwrap_or(0),
        attempts[0]["next_at_ms"].as_u64().unwrap_or(0),
    );
    assert!(
        next >= at + 3_000,
        "the Retry-After shows in the next attempt's time: {record}"
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args([
            "inspect",
            "--admin",
            &gateway.admin,
            "record",
            "--platform",
            "feishu",
        ])
        .args(["--app", APP_ID, "--id", "ra-1"])
        .output()
        .expect("inspect");
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("attempt 0") && shown.contains("429") && shown.contains("delivered"),
        "{shown}"
    );
}

/// An endpoint that answers 410 Gone stops its route (the Standard Webhooks rule): what comes
/// for it is dead-lettered with the reason, without another call to the endpoint, until the
/// admin call resumes the route; the dead letters replayed then are delivered once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_endpoint_stops_its_route_until_it_is_resumed() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream.behavior.lock().expect("behavior").gone = true;
    let gateway = Gateway::start(dir.path(), addr, false);
    let client = client();
    let began_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let ids: Vec<String> = (0..4).map(|i| format!("gone-{i}")).collect();
    for id in &ids {
        let (status, _) = post(&client, &gateway.url, &sign(&message(id, "oc_gone", 1_000)))
            .await
            .expect("post");
        assert_eq!(
            status, 200,
            "admitted: the ingress does not depend on the endpoint"
        );
    }
    let admin = |path: &str| format!("{}{path}", gateway.admin);
    // The admin answer to `request`, as JSON.
    let json = |request: reqwest::RequestBuilder| async move {
        let response = request.send().await.expect("admin call");
        response.json::<serde_json::Value>().await.expect("json")
    };
    let dead_letters = || async {
        let listed = json(client.get(admin("/admin/dead-letters"))).await;
        listed["dead_letters"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while dead_letters().await.len() < ids.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "not all dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempts: usize = downstream
        .behavior
        .lock()
        .expect("behavior")
        .attempts
        .values()
        .map(Vec::len)
        .sum();
    assert_eq!(attempts, 1, "one 410, then no call to the endpoint");
    let letters = dead_letters().await;
    assert!(
        letters
            .iter()
            .all(|l| l["reason"].as_str().is_some_and(|r| r.contains("410"))),
        "{letters:?}"
    );
    let routes = json(client.get(admin("/admin/routes"))).await;
    // The events' route (the card route beside it is untouched).
    let index = routes["routes"]
        .as_array()
        .and_then(|routes| routes.iter().position(|r| r["events"][0] == "*"))
        .expect("the events' route");
    assert!(
        routes["routes"][index]["gone"]["reason"].is_string(),
        "{routes}"
    );
    assert!(routes["routes"][1 - index]["gone"].is_null(), "{routes}");
    let metrics = client
        .get(admin("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(&format!("oncegate_route_gone{{route=\"{index}\"}} 1")),
        "{metrics}"
    );
    // The gateway stays ready (it still takes every event) and says what it dead-letters.
    let ready = json(client.get(admin("/readyz"))).await;
    assert_eq!(ready["ready"], true, "{ready}");
    assert!(
        ready["degraded"][0]
            .as_str()
            .is_some_and(|d| d.contains("gone") && d.contains("resume")),
        "{ready}"
    );
    // The endpoint is back; the operator resumes the route and replays what died meanwhile.
    downstream.behavior.lock().expect("behavior").gone = false;
    let resumed = json(client.post(admin(&format!("/admin/routes/{index}/resume")))).await;
    assert_eq!(resumed["resumed"], true, "{resumed}");
    let missing = client
        .post(admin("/admin/routes/7/resume"))
        .send()
        .await
        .expect("resume");
    assert_eq!(missing.status().as_u16(), 404);
    // `oncegate dlq list` picks them by when they died too.
    let listed = |span: &str| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
            .args([
                "dlq",
                "--admin",
                &gateway.admin,
                "--json",
                "list",
                span,
                "1h",
            ])
            .output()
            .expect("dlq list");
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        answer["dead_letters"].as_array().map_or(0, Vec::len)
    };
    assert_eq!((listed("--since"), listed("--until")), (ids.len(), 0));
    // Replays pick letters by when they died and by event type (issue 38): none died before
    // the test began, all of them since.
    let none = json(
        client
            .post(admin("/admin/dead-letters/replay"))
            .json(&serde_json::json!({"all": true, "until_ms": began_ms})),
    )
    .await;
    assert_eq!(none["replayed"].as_array().map(Vec::len), Some(0), "{none}");
    let replayed = json(client.post(admin("/admin/dead-letters/replay")).json(
        &serde_json::json!({
            "all": true,
            "since_ms": began_ms,
            "event_type": "im.message.receive_v1",
        }),
    ))
    .await;
    assert_eq!(
        replayed["replayed"].as_array().map(Vec::len),
        Some(ids.len()),
        "{replayed}"
    );
    downstream
        .wait_for("every event after the resume", |got| got.len() >= ids.len())
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in &ids {
        assert_eq!(downstream.count(id), 1, "{id}");
    }
}

/// The gateway of `dir` whose events' route has `extra` settings (appended to its table).
fn start_with_route(
    dir: &std::path::Path,
    downstream: std::net::SocketAddr,
    extra: &str,
) -> Gateway {
    let store = format!("path = \"{}\"\npartitions = 8", dir.join("store").display());
    let config = write_config(dir, downstream, false, &store, "30s", "5s");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(extra);
    std::fs::write(&config, text).expect("config");
    Gateway::run(&config)
}

/// The gaps between `event_id`'s delivery attempts.
fn gaps(downstream: &Downstream, event_id: &str) -> Vec<Duration> {
    let behavior = downstream.behavior.lock().expect("behavior");
    let attempts = behavior.attempts.get(event_id).cloned().unwrap_or_default();
    attempts.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

/// A route's `retry_schedule` sets the wait after each failure (not the dispatcher's 50 ms
/// backoff) and the number of attempts (one more than its waits, not `max_attempts = 3`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_schedule_sets_its_waits_and_attempts() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    {
        let mut behavior = downstream.behavior.lock().expect("behavior");
        behavior.transient.insert("sched-late".into(), 3);
        behavior.transient.insert("sched-never".into(), 100);
    }
    let gateway = start_with_route(
        dir.path(),
        addr,
        "retry_schedule = [\"300ms\", \"600ms\", \"900ms\"]\n",
    );
    let client = client();
    for (id, chat) in [("sched-late", "oc_s1"), ("sched-never", "oc_s2")] {
        let (status, _) = post(&client, &gateway.url, &sign(&message(id, chat, 1_000)))
            .await
            .expect("post");
        assert_eq!(status, 200);
    }
    downstream
        .wait_for("the fourth attempt's delivery", |got| {
            got.iter().any(|g| g.event_id == "sched-late")
        })
        .await;
    let waits = gaps(&downstream, "sched-late");
    assert_eq!(
        waits.len(),
        3,
        "three failures, then the delivery: {waits:?}"
    );
    for (wait, least) in waits.iter().zip([270, 540, 810]) {
        assert!(
            *wait >= Duration::from_millis(least),
            "waited {wait:?}, the schedule says at least {least} ms: {waits:?}"
        );
    }
    assert_eq!(downstream.count("sched-late"), 1);
    let letter = wait_for_dead_letter(&client, &gateway, "sched-never").await;
    assert!(
        letter["reason"]
            .as_str()
            .is_some_and(|r| r.contains("gave up after 4 attempts")),
        "{letter}"
    );
    assert_eq!(gaps(&downstream, "sched-never").len(), 3);
}

/// The dead letter of `event_id`, once there is one.
async fn wait_for_dead_letter(
    client: &reqwest::Client,
    gateway: &Gateway,
    event_id: &str,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed: serde_json::Value = client
            .get(format!("{}/admin/dead-letters", gateway.admin))
            .send()
            .await
            .expect("dead letters")
            .json()
            .await
            .expect("json");
        let letters = listed["dead_letters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if let Some(letter) = letters.into_iter().find(|l| l["event_id"] == event_id) {
            return letter;
        }
        assert!(
            Instant::now() < deadline,
            "{event_id} was not dead-lettered: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An event that keeps failing holds its chat's later events back no longer than the route's
/// `hold_chat`: one last attempt when the bound comes, then it is set aside in the dead letters
/// with the reason and the chat goes on, in order; another chat never waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_event_holds_its_chat_no_longer_than_the_route_allows() {
    let dir = tempfile::tempdir().expect("dir");
    let (downstream, addr) = Downstream::start().await;
    downstream
        .behavior
        .lock()
        .expect("behavior")
        .transient
        .insert("hold-1".into(), 1_000);
    let gateway = start_with_route(
        dir.path(),
        addr,
        "retry_schedule = [\"400ms\", \"400ms\", \"400ms\", \"400ms\", \"400ms\", \"400ms\"]\n\
         hold_chat = \"1s\"\n",
    );
    let client = client();
    let posted = Instant::now();
    for (id, chat, at) in [
        ("hold-1", "oc_held", 1_000),
        ("hold-2", "oc_held", 2_000),
        ("hold-3", "oc_held", 3_000),
        ("free-1", "oc_free", 1_000),
    ] {
        let (status, _) = post(&client, &gateway.url, &sign(&message(id, chat, at)))
            .await
            .expect("post");
        assert_eq!(status, 200);
    }
    downstream
        .wait_for("the held chat's later events", |got| {
            got.iter().any(|g| g.event_id == "hold-3")
        })
        .await;
    let got = downstream.got();
    let held: Vec<&str> = got
        .iter()
        .filter(|g| g.order_key.as_deref() == Some("oc_held"))
        .map(|g| g.event_id.as_str())
        .collect();
    assert_eq!(held, ["hold-2", "hold-3"], "the chat went on, in order");
    let first_try = downstream.behavior.lock().expect("behavior").attempts["hold-1"][0];
    let later = downstream.behavior.lock().expect("behavior").attempts["hold-2"][0];
    assert!(
        later - first_try >= Duration::from_millis(950),
        "the chat's next event waited only {:?} of the 1 s hold",
        later - first_try
    );
    assert!(
        later - posted < Duration::from_secs(5),
        "and not its schedule's 2.4 s more"
    );
    let waits = gaps(&downstream, "hold-1");
    let total: Duration = waits.iter().sum();
    assert!(
        waits.len() == 3
            && total >= Duration::from_millis(950)
            && total < Duration::from_millis(1_500),
        "attempts at 0, 0.4, 0.8 and the last at the 1 s bound: {waits:?}"
    );
    let letter = wait_for_dead_letter(&client, &gateway, "hold-1").await;
    assert!(
        letter["reason"]
            .as_str()
            .is_some_and(|r| r.contains("hold_chat") && r.contains("503")),
        "{letter}"
    );
    assert_eq!(downstream.count("free-1"), 1);
    let metrics = client
        .get(format!("{}/metrics", gateway.admin))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("oncegate_set_aside_total 1"), "{metrics}");
}

/// The README's route with the standard schedule and a chat bound passes `check-config`, and
/// the settings it names are the ones the gateway reads (a misspelt one would be refused).
#[test]
fn the_readme_retry_example_is_a_valid_route() {
    let route = readme_block("**Retries over hours", &[("ROUTE_SECRET", SECRET)]);
    assert!(
        route.contains("retry_schedule = \"standard-webhooks\""),
        "{route}"
    );
    assert!(route.contains("hold_chat"), "{route}");
}
