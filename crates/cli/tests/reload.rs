//! Reloading the configuration file without a restart (SIGHUP, `oncegate reload`): a source's
//! secrets and the routes change on every gateway within a second while a burst runs, nothing
//! lost or delivered twice, the old secrets taken for `server.secret_overlap` and then refused;
//! a reload that cannot be applied (unreadable, invalid, a static setting) changes nothing and
//! says why — in the answer, the log and a counter. Callbacks are sealed with the WeCom crypto
//! the platform crate checks against wechatpy's vectors.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use oncegate_core::{SealedRequest, Sealer, SyntheticMessage};
use oncegate_wecom::WecomApp;
use support::{Serve, metric, oncegate, redis_store, wait_until};

const CORP: &str = "wwreload00000000a1";
/// The secrets before and after the rotation: a callback token and a 43-character key each.
const OLD: (&str, &str) = (
    "reload-token-old",
    "kWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2A",
);
const NEW: (&str, &str) = (
    "reload-token-new",
    "Zq8pLm3nB7vC1xR5tY9uI2oP4aS6dF0gH8jK3lQ7wEA",
);

/// A gateway's file: the store, listeners on loopback port 0, `server` lines, the WeCom app
/// with `secrets`, and a file route writing to `dir/out/<file>`.
fn config(dir: &Path, store: &str, server: &str, secrets: (&str, &str), file: &str) -> String {
    format!(
        "[store]\n{store}\n\n[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         {server}\n\n[[source]]\nname = \"main\"\nplatform = \"wecom\"\ncorp_id = \"{CORP}\"\n\
         token = \"{}\"\nencoding_aes_key = \"{}\"\n\n[[route]]\nevents = [\"*\"]\n\
         sink = \"file\"\npath = \"{}\"\n",
        secrets.0,
        secrets.1,
        dir.join("out").join(file).display()
    )
}

/// A message as WeCom posts it, sealed with `secrets`.
fn message(secrets: (&str, &str), id: &str) -> SealedRequest {
    let sealer = WecomApp::new(CORP, secrets.0, secrets.1).expect("sealer");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let plain = sealer.message(&SyntheticMessage {
        id: id.to_owned(),
        chat: format!("chat-{}", id.len() % 7),
        sender: "zhangsan".into(),
        text: id.to_owned(),
        created_ms: now * 1000,
    });
    sealer.seal(&plain, now, &format!("n{id}"), [7; 16])
}

async fn post(gateway: &Serve, sealed: &SealedRequest) -> (u16, String) {
    support::post_sealed(gateway, "main", sealed).await
}

/// Every delivered line of `files` in `dirs`, as the message's text (its id here).
fn delivered(dirs: &[&Path], files: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    for dir in dirs {
        for file in files {
            let text = std::fs::read_to_string(dir.join("out").join(file)).unwrap_or_default();
            let whole = text.rfind('\n').map_or("", |end| &text[..end]);
            ids.extend(whole.lines().map(|line| {
                let doc: serde_json::Value = serde_json::from_str(line).expect("json line");
                let payload = doc["payload"].to_string();
                let text = payload
                    .split("<Content><![CDATA[")
                    .nth(1)
                    .and_then(|rest| rest.split("]]>").next());
                text.unwrap_or_else(|| panic!("a message's text in {payload}"))
                    .to_owned()
            }));
        }
    }
    ids
}

/// Three gateways on one Redis take a burst sealed with the old secrets; a third of the way in,
/// each gets a new file (new secrets, the route writing elsewhere) and a SIGHUP. Each takes
/// the new secrets within a second of its signal, keeps taking the burst's old-sealed
/// callbacks (the overlap), writes what comes after to the new route's file, and every
/// message is delivered once across both files.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_changes_every_gateway_within_a_second_while_a_burst_runs() {
    const PER_GATEWAY: usize = 120;
    let store = redis_store("reload");
    let (dirs, gateways): (Vec<tempfile::TempDir>, Vec<std::sync::Arc<Serve>>) =
        support::start_in_dirs::<3>(|dir| config(dir, &store, "", OLD, "before.jsonl"))
            .into_iter()
            .map(|(dir, gateway)| (dir, std::sync::Arc::new(gateway)))
            .unzip();
    for (i, gateway) in gateways.iter().enumerate() {
        let (status, body) = post(gateway, &message(NEW, &format!("early-{i}"))).await;
        assert_eq!(
            status, 401,
            "the new secrets are refused before the reload: {body}"
        );
    }
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut senders = Vec::new();
    for (g, gateway) in gateways.iter().enumerate() {
        let (gateway, sent) = (gateway.clone(), sent.clone());
        senders.push(tokio::spawn(async move {
            for i in 0..PER_GATEWAY {
                // As WeCom retries: the same request until it is answered 200.
                let sealed = message(OLD, &format!("burst-{g}-{i}"));
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    let (status, body) = post(&gateway, &sealed).await;
                    if status == 200 {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "burst-{g}-{i} never taken: {status} {body}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    wait_until("a third of the burst", Duration::from_secs(30), || {
        sent.load(std::sync::atomic::Ordering::Relaxed) >= PER_GATEWAY
    })
    .await;
    for (dir, gateway) in dirs.iter().zip(&gateways) {
        let file = config(dir.path(), &store, "", NEW, "after.jsonl");
        std::fs::write(dir.path().join("oncegate.toml"), file).expect("new file");
        gateway.signal("HUP");
        let signalled = Instant::now();
        let probe = message(NEW, &format!("probe-{}", gateway.admin));
        loop {
            let (status, body) = post(gateway, &probe).await;
            if status == 200 {
                break;
            }
            assert_eq!(status, 401, "{body}");
            assert!(
                signalled.elapsed() < Duration::from_secs(1),
                "the new secrets were not taken within a second of SIGHUP: {}",
                gateway.stderr()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!("taken {:?} after SIGHUP", signalled.elapsed());
    }
    let at_reload = sent.load(std::sync::atomic::Ordering::Relaxed);
    for sender in senders {
        sender.await.expect("sender");
    }
    assert!(
        at_reload < 3 * PER_GATEWAY,
        "the burst was over before the reload: it must straddle it"
    );
    let total = 3 * PER_GATEWAY + 3;
    let paths: Vec<&Path> = dirs.iter().map(tempfile::TempDir::path).collect();
    let files = ["before.jsonl", "after.jsonl"];
    wait_until("every message delivered", Duration::from_secs(30), || {
        delivered(&paths, &files).len() >= total
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut ids = delivered(&paths, &files);
    ids.sort();
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), total, "nothing lost");
    assert_eq!(ids.len(), total, "nothing delivered twice");
    let after = delivered(&paths, &["after.jsonl"]);
    assert!(
        after.iter().any(|id| id.contains("burst")) && after.iter().any(|id| id.contains("probe")),
        "what came after the reload went to the new route: {after:?}"
    );
    assert!(
        delivered(&paths, &["before.jsonl"])
            .iter()
            .all(|id| !id.contains("probe")),
        "nothing after the reload went to the old route"
    );
    let mut overlap = 0.0;
    for gateway in &gateways {
        overlap += metric(
            &gateway.admin,
            "oncegate_previous_secret_accepted_total{source=\"main\"}",
        )
        .await;
        assert_eq!(
            metric(
                &gateway.admin,
                "oncegate_reloads_total{outcome=\"applied\"}"
            )
            .await,
            1.0
        );
    }
    assert!(
        overlap > 0.0,
        "old-sealed callbacks came after the reload, taken by the overlap"
    );
}

/// The README's `oncegate reload` command, pointed at `gateway`: whether it succeeded, and
/// what it printed.
fn readme_reload(gateway: &Serve) -> (bool, String) {
    let readme = include_str!("../../../README.md");
    let section = readme
        .split("### Reloading without a restart")
        .nth(1)
        .expect("the README's section on reloading");
    let line = section
        .lines()
        .find(|line| line.starts_with("oncegate reload "))
        .expect("the README's `oncegate reload`");
    let line = line.split(" #").next().unwrap_or(line).trim();
    assert!(line.contains("http://127.0.0.1:9090"), "{line}");
    let line = line.replace("http://127.0.0.1:9090", &gateway.admin);
    let args: Vec<&str> = line.split_whitespace().skip(1).collect();
    let out = oncegate().args(&args).output().expect("oncegate reload");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// Whether `gateway` takes a fresh message sealed with `secrets`: its status.
async fn takes(gateway: &Serve, secrets: (&str, &str)) -> u16 {
    let id = format!("check-{}", fastrand::u64(..));
    post(gateway, &message(secrets, &id)).await.0
}

/// A file that cannot be read, one with an error, and one that changes a static setting are
/// each refused by the README's command — exit 1, the reason in its answer and in the log,
/// counted — and change nothing, though each also changes the secrets: the old ones are still
/// taken, the new ones refused, the routes as they were. A good file then applies: the new
/// secrets are taken, the old ones for `server.secret_overlap` (here 2 s) and refused after; a
/// reload that sets the overlap to 0 s (a leaked secret) refuses the replaced one at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_cannot_apply_changes_nothing_and_says_why() {
    let store = redis_store("reloadrefused");
    let dir = tempfile::tempdir().expect("dir");
    let overlap = "secret_overlap = \"2s\"";
    let gateway = Serve::start_logging(
        dir.path(),
        &config(dir.path(), &store, overlap, OLD, "events.jsonl"),
        "info",
    );
    let routes_before = gateway.admin_get("/admin/routes").await.1;
    let path = dir.path().join("oncegate.toml");
    let good = config(dir.path(), &store, overlap, NEW, "events.jsonl");
    let refusals = [
        (good.replace("[[route]]", "[[route]\n"), "cannot be read"),
        (
            good.replace("sink = \"file\"", "sink = \"http\""),
            "has errors",
        ),
        (
            good.replace(overlap, &format!("{overlap}\nbody_limit = 65536")),
            "only a restart changes [server]",
        ),
    ];
    for (n, (file, why)) in refusals.iter().enumerate() {
        std::fs::write(&path, file).expect("file");
        let (ok, said) = readme_reload(&gateway);
        assert!(!ok, "a refused reload exits non-zero: {said}");
        assert!(
            said.contains("not reloaded (400)") && said.contains(why),
            "the answer says why ({why}): {said}"
        );
        assert_eq!(takes(&gateway, OLD).await, 200, "the old secrets stay");
        assert_eq!(
            takes(&gateway, NEW).await,
            401,
            "the new ones are not taken"
        );
        assert_eq!(gateway.admin_get("/admin/routes").await.1, routes_before);
        assert_eq!(
            metric(
                &gateway.admin,
                "oncegate_reloads_total{outcome=\"refused\"}"
            )
            .await,
            (n + 1) as f64
        );
    }
    let log = gateway.stderr();
    for (_, why) in &refusals {
        assert!(
            log.contains("reload refused, the running configuration stays") && log.contains(why),
            "the log says why ({why}): {log}"
        );
    }
    std::fs::write(&path, &good).expect("file");
    let (ok, said) = readme_reload(&gateway);
    assert!(ok && said.contains("changed: [main]"), "{said}");
    let applied = Instant::now();
    assert_eq!(takes(&gateway, NEW).await, 200, "the new secrets are taken");
    assert_eq!(
        takes(&gateway, OLD).await,
        200,
        "the old ones within the overlap"
    );
    assert_eq!(
        metric(
            &gateway.admin,
            "oncegate_previous_secret_accepted_total{source=\"main\"}"
        )
        .await,
        1.0
    );
    tokio::time::sleep(
        Duration::from_secs(2).saturating_sub(applied.elapsed()) + Duration::from_millis(200),
    )
    .await;
    assert_eq!(
        takes(&gateway, OLD).await,
        401,
        "the old ones refused after it"
    );
    assert_eq!(takes(&gateway, NEW).await, 200);
    // The same file again: nothing changes, the route and source are kept as they run.
    let (ok, said) = readme_reload(&gateway);
    assert!(
        ok && said.contains("sources: 1 kept") && said.contains("routes: 1 kept"),
        "{said}"
    );
    assert!(
        gateway
            .stderr()
            .contains("old secrets are still taken for 2s (server.secret_overlap)"),
        "the overlap is said when it starts"
    );
    // A leaked secret rotated back with no overlap, in the same edit: the one it replaces is
    // refused at once.
    let no_overlap = config(
        dir.path(),
        &store,
        "secret_overlap = \"0s\"",
        OLD,
        "events.jsonl",
    );
    std::fs::write(&path, no_overlap).expect("file");
    let (ok, said) = readme_reload(&gateway);
    assert!(ok && said.contains("changed: [main]"), "{said}");
    assert_eq!(takes(&gateway, OLD).await, 200);
    assert_eq!(
        takes(&gateway, NEW).await,
        401,
        "no overlap: refused at once"
    );
}
