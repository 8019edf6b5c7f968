//! The `oncegate` binary, run as a user runs it.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Admission, Claim, DedupStore, Event, EventQueue, key_for};
use oncegate_embedded::{EmbeddedConfig, EmbeddedStore};

fn oncegate(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(args)
        .env_remove("ONCEGATE_CONFIG")
        .output()
        .expect("run oncegate");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_example_configuration_is_valid() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/oncegate.toml");
    let (code, out, err) = oncegate(&["check-config", example]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ok (1 source, embedded store, 0 warnings)"),
        "{out}"
    );
}

#[test]
fn a_bad_configuration_names_each_problem_and_fails() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "[dedup]\nretention = \"2h\"\n[lease]\nduration = \"1m\"\nrenew_every = \"5m\"\n",
    )
    .expect("write");
    let (code, out, _) = oncegate(&["check-config", file.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("error: dedup.retention: 2h is shorter than the platform's retry span"),
        "{out}"
    );
    assert!(out.contains("error: lease.renew_every"), "{out}");
    assert!(out.contains("2 errors, 0 warnings"), "{out}");

    std::fs::write(&file, "[store]\nbackend = \"mongo\"\n").expect("write");
    let (code, _, err) = oncegate(&["check-config", file.to_str().expect("utf-8")]);
    assert_eq!(code, 2);
    assert!(err.contains("mongo") && err.contains("embedded"), "{err}");

    let (code, _, err) = oncegate(&["check-config", "/no/such/file.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read /no/such/file.toml"), "{err}");
}

#[test]
fn inspect_reads_a_store_while_its_gateway_holds_it() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("store.redb");
    let store = EmbeddedStore::open(EmbeddedConfig::at(&path)).expect("open");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let event = |id: &str| Event {
        source: Arc::from("feishu"),
        app: Arc::from("cli_x"),
        tenant: None,
        event_id: id.to_owned(),
        event_type: Arc::from("im.message.receive_v1"),
        created_at_ms: 0,
        order_key: Some("oc_chat".into()),
        payload: Bytes::from_static(b"{}"),
    };
    runtime.block_on(async {
        for id in ["e1", "e2", "e3"] {
            let key = key_for("feishu", "cli_x", "event_id", id);
            let admitted = store
                .admit(event(id), &[key], Duration::from_secs(86_400))
                .await
                .expect("admit");
            assert!(matches!(admitted, Admission::Admitted { .. }));
        }
        let key = key_for("feishu", "cli_x", "event_id", "e1");
        let partition = event("e1").partition(store.partitions());
        let Claim::Acquired(lease) = store
            .claim(&key, partition, Duration::from_secs(60))
            .await
            .expect("claim")
        else {
            panic!("claim");
        };
        store
            .complete(&lease, Duration::from_secs(86_400), None)
            .await
            .expect("complete");
    });
    let path_text = path.to_str().expect("utf-8");
    let (code, out, err) = oncegate(&["inspect", "--store", path_text, "stats"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pending      2"), "{out}");
    assert!(out.contains("completed    1"), "{out}");
    assert!(out.contains("queued       3"), "{out}");

    let (code, out, _) = oncegate(&[
        "inspect", "--store", path_text, "record", "--source", "feishu", "--app", "cli_x", "--id",
        "e1",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("completed (no outcome)"), "{out}");
    assert_eq!(
        out.lines().count(),
        1,
        "one record, in its chat's partition: {out}"
    );
    let (_, out, _) = oncegate(&[
        "inspect", "--store", path_text, "record", "--source", "feishu", "--app", "cli_x", "--id",
        "e9",
    ]);
    assert!(out.contains("not seen"), "{out}");
    let (_, out, _) = oncegate(&["inspect", "--store", path_text, "queue"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        out.contains("im.message.receive_v1  e2  chat=oc_chat"),
        "{out}"
    );
    let (code, _, err) = oncegate(&["inspect", "--store", path_text, "record", "--key", "xyz"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a key hash"), "{err}");
    drop(store);
}
