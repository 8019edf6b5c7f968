//! Encryption at rest (`[store.encryption]`): with it, no byte of a payload, a stored result or
//! a shared value is in clear in the journal's files or in Redis — checked by reading every
//! file and every Redis value, against the same run without it, where they are; a rotated key
//! still reads what the old one sealed; a wrong or missing key refuses to start, naming it.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use oncegate_core::{Sealer, SyntheticMessage};
use oncegate_wecom::WecomApp;
use serde_json::{Value, json};
use support::{Serve, client, file_route, lines, oncegate, redis_store, refused_start, wait_until};

const MARKER: &str = "AtRestMarker7f3a";
const CORP: &str = "wwatrestcorp01";
const TOKEN: &str = "at-rest-token";
const AES_KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";
const CALLER: &str = "at-rest-caller-token";
/// Two keys: base64 and hex, as `openssl rand` makes them.
const K1: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const K2: &str = "6162636465666768696a6b6c6d6e6f707172737475767778797a303132333435";

/// `[[store.encryption.keys]]` for `keys` (id, key file), newest first.
fn encryption(keys: &[(&str, &Path)]) -> String {
    keys.iter()
        .map(|(id, file)| {
            format!(
                "\n[[store.encryption.keys]]\nid = \"{id}\"\nkey = {{ file = \"{}\" }}\n",
                file.display()
            )
        })
        .collect()
}

fn config(dir: &Path, store: &str) -> String {
    format!(
        r#"[store]
{store}

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[[api.caller]]
name = "app"
token = "{CALLER}"

[[source]]
name = "corp"
platform = "wecom"
corp_id = "{CORP}"
token = "{TOKEN}"
encoding_aes_key = "{AES_KEY}"

[[source]]
name = "suite"
platform = "wecom-suite"
suite_id = "wwatrestsuite01"
token = "{TOKEN}"
encoding_aes_key = "{AES_KEY}"

{}"#,
        file_route(dir, "")
    )
}

fn key_file(dir: &Path, name: &str, key: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{key}\n")).expect("key file");
    path
}

async fn keys_call(gateway: &Serve, op: &str, body: Value) -> Value {
    let response = client()
        .post(format!(
            "{}/keys/{op}",
            gateway.api.as_deref().expect("api")
        ))
        .bearer_auth(CALLER)
        .json(&body)
        .send()
        .await
        .expect("keys");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// Puts the marker in every kind of value the store keeps: five events' payloads (queue
/// entries, records), a business key's result, a tenant's settings (a shared value).
async fn exercise(gateway: &Serve, dir: &Path, round: &str) {
    let sealer = WecomApp::new(CORP, TOKEN, AES_KEY).expect("sealer");
    let now = support::suite::now();
    for i in 0..5 {
        let plain = sealer.message(&SyntheticMessage {
            id: format!("{round}-{i}"),
            chat: "chat".into(),
            sender: "zhangsan".into(),
            text: format!("{MARKER} {round} {i}"),
            created_ms: now * 1000,
        });
        let sealed = sealer.seal(&plain, now, &format!("{round}n{i}"), [7; 16]);
        let response = client()
            .post(format!(
                "{}/webhook/corp?{}",
                gateway.base,
                sealed.query.as_deref().unwrap_or_default()
            ))
            .body(sealed.body)
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 200);
    }
    let key = format!("order-{round}");
    let claimed = keys_call(gateway, "claim", json!({"key": key, "lease_ms": 10_000})).await;
    assert_eq!(claimed["state"], "acquired", "{claimed}");
    let done = json!({"key": key, "lease": claimed["lease"], "result": {"note": MARKER}});
    keys_call(gateway, "complete", done).await;
    let output = oncegate()
        .args([
            "tenants",
            "add",
            "suite",
            &format!("wp{round}"),
            "--settings",
        ])
        .arg(json!({"name": MARKER}).to_string())
        .args(["--admin", &gateway.admin])
        .output()
        .expect("tenants add");
    assert!(output.status.success(), "{output:?}");
    wait_until("the events delivered", Duration::from_secs(10), || {
        lines(dir).len() >= 5
    })
    .await;
}

/// Whether any file under `root` holds the marker.
fn files_hold_marker(root: &Path) -> bool {
    let mut found = false;
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                found |= bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes());
            }
        }
    }
    found
}

fn store_section(dir: &Path, extra: &str) -> String {
    format!(
        "backend = \"embedded\"\npath = \"{}\"\n{extra}",
        dir.join("store").display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_holds_no_payload_result_or_credential_in_clear() {
    // Without encryption the marker is in the journal's files: the check can see it.
    let plain = tempfile::tempdir().expect("dir");
    {
        let gateway = Serve::start_with(
            plain.path(),
            &config(plain.path(), &store_section(plain.path(), "")),
        );
        exercise(&gateway, plain.path(), "plain").await;
    }
    assert!(files_hold_marker(&plain.path().join("store")));

    let dir = tempfile::tempdir().expect("dir");
    let k1 = key_file(dir.path(), "k1.key", K1);
    let k2 = key_file(dir.path(), "k2.key", K2);
    {
        let store = store_section(dir.path(), &encryption(&[("k1", &k1)]));
        let gateway = Serve::start_with(dir.path(), &config(dir.path(), &store));
        exercise(&gateway, dir.path(), "one").await;
        // What the gateway reads back is opened: the tenant's settings, the key's result.
        let again = keys_call(
            &gateway,
            "claim",
            json!({"key": "order-one", "lease_ms": 10_000}),
        )
        .await;
        assert_eq!(again["result"]["note"], MARKER, "{again}");
    }
    assert!(!files_hold_marker(&dir.path().join("store")));

    // Rotated: k2 seals, k1 still reads what it sealed (the journal is read again at start).
    {
        let store = store_section(dir.path(), &encryption(&[("k2", &k2), ("k1", &k1)]));
        let gateway = Serve::start_with(dir.path(), &config(dir.path(), &store));
        let old = keys_call(
            &gateway,
            "claim",
            json!({"key": "order-one", "lease_ms": 10_000}),
        )
        .await;
        assert_eq!(old["result"]["note"], MARKER, "{old}");
        exercise(&gateway, dir.path(), "two").await;
    }
    assert!(!files_hold_marker(&dir.path().join("store")));

    // k1's id with other bytes: refused at start, naming it; k1 left out: what it sealed does
    // not read, said by name; a key file that is not there: refused, naming it.
    let wrong = key_file(dir.path(), "wrong.key", K2);
    let path = dir.path().join("refused.toml");
    for (keys, says) in [
        (encryption(&[("k2", &k2), ("k1", &wrong)]), "\"k1\""),
        (
            encryption(&[("k2", &k2), ("k1", &dir.path().join("gone.key"))]),
            "gone.key",
        ),
    ] {
        std::fs::write(&path, config(dir.path(), &store_section(dir.path(), &keys)))
            .expect("config");
        let said = refused_start(&path, &[]);
        assert!(said.contains(says), "{said}");
    }
}

/// Every value Redis holds under `prefix`, of every type, joined.
fn redis_values(url: &str, prefix: &str) -> String {
    const SCRIPT: &str = r#"
local out = {}
local cursor = "0"
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', '*' .. ARGV[1] .. '*', 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    local kind = redis.call('TYPE', key).ok
    local values = {}
    if kind == 'string' then values = {redis.call('GET', key)}
    elseif kind == 'hash' then values = redis.call('HGETALL', key)
    elseif kind == 'list' then values = redis.call('LRANGE', key, 0, -1)
    elseif kind == 'set' then values = redis.call('SMEMBERS', key)
    elseif kind == 'zset' then values = redis.call('ZRANGE', key, 0, -1)
    elseif kind == 'stream' then
      for _, entry in ipairs(redis.call('XRANGE', key, '-', '+')) do
        for _, field in ipairs(entry[2]) do table.insert(values, field) end
      end
    end
    table.insert(out, key)
    for _, value in ipairs(values) do table.insert(out, value) end
  end
until cursor == "0"
return table.concat(out, "\n")
"#;
    let output = std::process::Command::new("redis-cli")
        .args(["-u", url, "--raw", "EVAL", SCRIPT, "0", prefix])
        .output()
        .expect("redis-cli");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holds_no_payload_result_or_credential_in_clear() {
    let url = std::env::var("ONCEGATE_TEST_REDIS_URL").expect("scripts/test starts redis-server");
    let plain_store = redis_store("plainrest");
    let plain_prefix = plain_store
        .split("prefix = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("prefix")
        .to_owned();
    let plain = tempfile::tempdir().expect("dir");
    {
        let gateway = Serve::start_with(plain.path(), &config(plain.path(), &plain_store));
        exercise(&gateway, plain.path(), "plain").await;
    }
    let values = redis_values(&url, &plain_prefix);
    assert!(values.contains(&plain_prefix) && values.contains(MARKER));

    let dir = tempfile::tempdir().expect("dir");
    let k1 = key_file(dir.path(), "k1.key", K1);
    let store = redis_store("sealedrest");
    let prefix = store
        .split("prefix = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("prefix")
        .to_owned();
    let store = format!("{store}\n{}", encryption(&[("k1", &k1)]));
    {
        let gateway = Serve::start_with(dir.path(), &config(dir.path(), &store));
        exercise(&gateway, dir.path(), "one").await;
        let again = keys_call(
            &gateway,
            "claim",
            json!({"key": "order-one", "lease_ms": 10_000}),
        )
        .await;
        assert_eq!(again["result"]["note"], MARKER, "{again}");
    }
    let values = redis_values(&url, &prefix);
    assert!(values.contains(&prefix), "the scan found the store's keys");
    assert!(!values.contains(MARKER), "in clear in Redis");
}

/// The README's example, its key file and variable pointed at real keys: check-config takes
/// it; a key of 31 bytes is refused, named.
#[test]
fn the_readmes_example_is_checked_and_a_short_key_named() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README");
    let example = readme
        .split_once("**Encryption at rest.**")
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the README's example")
        .0
        .to_owned();
    let dir = tempfile::tempdir().expect("dir");
    let k1 = key_file(dir.path(), "k1.key", K1);
    let short = key_file(dir.path(), "short.key", &K2[..62]);
    let check = |key: &Path| {
        let config = example
            .replace(
                "data/oncegate",
                &dir.path().join("store").display().to_string(),
            )
            .replace(
                "/etc/oncegate/at-rest-2026-12.key",
                &key.display().to_string(),
            );
        let path = dir.path().join("oncegate.toml");
        std::fs::write(&path, config).expect("config");
        oncegate()
            .args(["check-config"])
            .arg(&path)
            .env("ONCEGATE_AT_REST_2026_06", K2)
            .output()
            .expect("check-config")
    };
    let taken = check(&k1);
    assert!(taken.status.success(), "{taken:?}");
    let refused = check(&short);
    let said = String::from_utf8_lossy(&refused.stderr).into_owned()
        + &String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("\"2026-12\"") && said.contains("32 bytes"),
        "{said}"
    );
}
