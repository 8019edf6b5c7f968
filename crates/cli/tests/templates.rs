//! Self-built apps of many corps behind one template source, through the binary: the README's
//! template source and its `oncegate tenants add`, two gateways on one Redis. A corp added on
//! one gateway is served by both within a second, at the one URL for all and at its own; each
//! callback is checked with its own corp's secrets (a corp's secrets never open another's); a
//! corp's secrets rotated by adding it again are in force on both within a second; settings a
//! corp cannot be served with are refused when added; secrets never appear in the list.

use crate::support;

use std::path::Path;
use std::time::Duration;

use oncegate_core::SealedRequest;
use support::{Serve, file_route, lines, post_sealed, redis_store, run, wait_until};

/// The README's corp and its settings; a second corp with secrets of its own.
const CORP_A: &str = "ww8e1c5f2a00000001";
const TOKEN_A: &str = "the corp app token";
const KEY_A: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";
const AGENT_A: &str = "1000002";
const CORP_B: &str = "ww8e1c5f2a00000002";
const TOKEN_B: &str = "corp-b-token";
const KEY_B: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

/// The README's section on templates.
fn readme_section() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    readme
        .split_once("### Many tenants: self-built apps of many corps (a source template)")
        .expect("the README's section on templates")
        .1
        .split_once("\n### ")
        .expect("the next section")
        .0
        .to_owned()
}

/// The section's first block in `language`.
fn readme_block(language: &str) -> String {
    readme_section()
        .split_once(&format!("```{language}\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("a {language} block in the README's section on templates"))
        .0
        .to_owned()
}

fn config(dir: &Path, store: &str) -> String {
    format!(
        "[store]\n{store}\n\n[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n{}\n{}",
        readme_block("toml"),
        file_route(dir, "")
    )
}

/// The README's `oncegate tenants add`, as arguments, pointed at `admin`.
fn readme_add(admin: &str) -> Vec<String> {
    let line = readme_block("sh").trim().to_owned();
    let (head, rest) = line.split_once(" --settings '").expect("--settings");
    let (settings, tail) = rest.split_once("' ").expect("the settings' end");
    head.split(' ')
        .skip(1)
        .map(str::to_owned)
        .chain(["--settings".to_owned(), settings.to_owned()])
        .chain(
            tail.split(' ')
                .map(|arg| arg.replace("http://127.0.0.1:9090", admin)),
        )
        .collect()
}

/// `oncegate tenants add corps <corp>` with `settings` on `gateway`.
fn add(gateway: &Serve, corp: &str, settings: &serde_json::Value) -> Result<String, String> {
    let args = [
        "tenants",
        "add",
        "corps",
        corp,
        "--settings",
        &settings.to_string(),
    ];
    let mut all: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    all.extend(["--admin".to_owned(), gateway.admin.clone()]);
    run(&all)
}

/// A message of `corp`'s app (agent `agent`) sealed with `token` and `key`, as WeCom posts it.
fn message(corp: &str, (token, key, agent): (&str, &str, &str), id: &str) -> SealedRequest {
    support::suite::corp_message_sealed(corp, (token, key, Some(agent)), id)
}

/// Posts `sealed` at the one URL for all, or at `corp`'s own.
async fn post(gateway: &Serve, corp: Option<&str>, sealed: &SealedRequest) -> (u16, String) {
    match corp {
        None => post_sealed(gateway, "corps", sealed).await,
        Some(corp) => post_sealed(gateway, &format!("corps/{corp}"), sealed).await,
    }
}

/// Posts `sealed` at the one URL for all until it is answered `status`, a second at most.
async fn until(gateway: &Serve, sealed: &SealedRequest, status: u16) -> Duration {
    support::until_answered(gateway, "corps", sealed, status, Duration::from_secs(1)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_serves_each_corp_with_its_own_secrets_on_every_gateway() {
    let store = redis_store("templates");
    let [(a_dir, a), (b_dir, b)] = support::start_in_dirs(|dir| config(dir, &store));
    let a_secrets = (TOKEN_A, KEY_A, AGENT_A);
    let first = message(CORP_A, a_secrets, "1");
    // No corp yet: answered as unsigned (no corp's secrets vouch for it), for WeCom to retry,
    // on both.
    for gateway in [&a, &b] {
        let (status, body) = post(gateway, None, &first).await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("the signature does not verify"), "{body}");
    }

    // The README's command on A; B serves the corp within a second.
    let said = run(&readme_add(&a.admin)).expect("the README's tenants add");
    assert!(said.contains(CORP_A), "{said}");
    let took = until(&b, &first, 200).await;
    eprintln!("a corp added on A was served by B {took:?} later");
    // At its own URL too; the same message again is a duplicate, answered as received.
    let second = message(CORP_A, a_secrets, "2");
    let (status, body) = post(&a, Some(CORP_A), &second).await;
    assert_eq!((status, body.as_str()), (200, ""), "{}", a.stderr());

    // B's corp is added with its own secrets; each corp's callbacks open with its own only.
    let b_settings =
        serde_json::json!({"token": TOKEN_B, "encoding_aes_key": KEY_B, "agent_id": "1"});
    add(&b, CORP_B, &b_settings).expect("add corp B");
    let from_b = message(CORP_B, (TOKEN_B, KEY_B, "1"), "3");
    until(&a, &from_b, 200).await;
    // Corp B's callback at A's URL is checked with A's token: refused, not taken as A's.
    let (status, body) = post(
        &a,
        Some(CORP_A),
        &message(CORP_B, (TOKEN_B, KEY_B, "1"), "4"),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    // Corp B's name around a callback sealed with A's secrets: B's token does not sign it.
    let posing = message(CORP_B, a_secrets, "5");
    let (status, body) = post(&b, None, &posing).await;
    assert_eq!(status, 401, "{body}");
    // A callback of another of corp A's apps (agent) is not this template's corp app's.
    let other_agent = message(CORP_A, (TOKEN_A, KEY_A, "1000003"), "6");
    let (status, body) = post(&b, None, &other_agent).await;
    assert_eq!(status, 400, "{body}");

    // Settings a corp cannot be served with are refused when added, and nothing changes.
    for bad in [
        serde_json::json!({"token": TOKEN_B}),
        serde_json::json!({"token": TOKEN_B, "encoding_aes_key": "too-short"}),
    ] {
        let refused = add(&a, CORP_B, &bad).expect_err("bad settings");
        assert!(
            refused.contains("400")
                && (refused.contains("encoding_aes_key") || refused.contains("EncodingAESKey")),
            "{refused}"
        );
    }
    let (status, _) = post(&a, None, &message(CORP_B, (TOKEN_B, KEY_B, "1"), "7")).await;
    assert_eq!(status, 200);

    // Secrets never in the list.
    let listed = run(&[
        "tenants".into(),
        "list".into(),
        "corps".into(),
        "--admin".into(),
        b.admin.clone(),
    ])
    .expect("tenants list");
    assert!(
        listed.contains(CORP_A) && listed.contains(CORP_B),
        "{listed}"
    );
    for secret in [TOKEN_A, KEY_A, TOKEN_B, KEY_B] {
        assert!(!listed.contains(secret), "{secret} in {listed}");
    }
    let (status, body) = a.admin_get("/admin/tenants/corps").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("redacted") && !body.contains(KEY_A), "{body}");

    // Corp B's secrets rotated by adding it again: the new ones on both within a second, the
    // old ones refused.
    let rotated = (
        "corp-b-token-2",
        "ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoM",
        "1",
    );
    add(
        &a,
        CORP_B,
        &serde_json::json!({"token": rotated.0, "encoding_aes_key": rotated.1, "agent_id": 1}),
    )
    .expect("rotate corp B");
    until(&b, &message(CORP_B, rotated, "8"), 200).await;
    until(&b, &message(CORP_B, (TOKEN_B, KEY_B, "1"), "9"), 401).await;

    // Every message admitted was delivered once, as its corp's.
    let admitted = [
        ("1", CORP_A),
        ("2", CORP_A),
        ("3", CORP_B),
        ("7", CORP_B),
        ("8", CORP_B),
    ];
    wait_until(
        "the corps' messages delivered",
        Duration::from_secs(15),
        || lines(a_dir.path()).len() + lines(b_dir.path()).len() >= admitted.len(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered: Vec<serde_json::Value> = lines(a_dir.path())
        .into_iter()
        .chain(lines(b_dir.path()))
        .collect();
    assert_eq!(delivered.len(), admitted.len(), "{delivered:?}");
    for (id, corp) in admitted {
        let found: Vec<_> = delivered
            .iter()
            .filter(|line| line["event_id"] == id)
            .collect();
        assert_eq!(found.len(), 1, "message {id}: {delivered:?}");
        assert_eq!(found[0]["app"], corp);
        assert_eq!(found[0]["owner"]["tenant"], corp);
    }
}
