//! `oncegate-bench --fill-store` writes a store folder that a gateway opens remembering every
//! key it was asked for, in the partitions it was given, each key completed; and it refuses a
//! folder that already holds a store.

use std::process::Command;

use oncegate_core::{DedupStore, RecordState, key_for};

fn fill(folder: &std::path::Path, keys: u64, partitions: Option<u16>) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oncegate-bench"));
    command
        .arg("--fill-store")
        .arg(folder)
        .args(["--keys", &keys.to_string()]);
    if let Some(partitions) = partitions {
        command.args(["--partitions", &partitions.to_string()]);
    }
    command.output().expect("run oncegate-bench")
}

#[test]
fn a_filled_folder_opens_remembering_every_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = dir.path().join("store");
    let filled = fill(&folder, 5_000, Some(4));
    assert!(
        filled.status.success(),
        "{}",
        String::from_utf8_lossy(&filled.stderr)
    );
    let mut config = oncegate_journal::JournalConfig::at(&folder);
    config.partitions = 4;
    let store = oncegate_journal::open(config).expect("open the filled folder");
    assert_eq!(store.held_records(), 5_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for id in [0u64, 2_500, 4_999] {
        let key = key_for("feishu", "cli_bench", "event_id", &id.to_string());
        let record = runtime
            .block_on(store.record(&key, 0))
            .expect("read")
            .unwrap_or_else(|| panic!("key {id} is not remembered"));
        assert!(
            matches!(record.state, RecordState::Completed { outcome: None }),
            "{record:?}"
        );
    }
    drop(store);
    // A folder that holds a store is not written over.
    let again = fill(&folder, 10, Some(4));
    assert!(!again.status.success());
    let error = String::from_utf8_lossy(&again.stderr);
    assert!(error.contains("already holds a store"), "{error}");
}

#[test]
fn without_partitions_the_folder_has_the_gateways_default() {
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = dir.path().join("store");
    let filled = fill(&folder, 10, None);
    assert!(
        filled.status.success(),
        "{}",
        String::from_utf8_lossy(&filled.stderr)
    );
    let mut config = oncegate_journal::JournalConfig::at(&folder);
    config.partitions = oncegate_config::EmbeddedSettings::default().partitions;
    let store = oncegate_journal::open(config).expect("open with the gateway's default");
    assert_eq!(store.held_records(), 10);
}
