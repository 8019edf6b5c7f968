//! kill -9 at any point: after reopening, every admitted event is queued or done, no key is
//! half-recorded, nothing admitted before a crash is admitted again after it, and a completion
//! that did not wait for its sync (`complete_and_ack`) is durable once anything done after it
//! was.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use std::sync::Arc;

use oncegate_contract::block_on;
use oncegate_core::{DedupStore, Event, EventQueue, RecordState, key_for};
use oncegate_journal::{JournalConfig, JournalStore};

const RUNS: u64 = 30;
const PER_RUN: u64 = 4000;

#[test]
fn kill_nine_loses_nothing_and_admits_nothing_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("crash");
    let mut admitted_in: HashMap<u64, u64> = HashMap::new();
    let mut acked: HashSet<u64> = HashSet::new();
    let mut lazily_done = 0;
    let mut kills_mid_run = 0;
    for run in 0..RUNS {
        // Each run re-sends the second half of the previous run's ids, as a platform retries.
        let first = run * PER_RUN / 2;
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncegate-crash-child"))
            .arg(&path)
            .arg(first.to_string())
            .arg(PER_RUN.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the child");
        // A different moment in each run: the first runs die while the file is being created,
        // the others from early in start-up to mid-flight.
        let delay = if run < 4 {
            1 + run * 3
        } else {
            10 + (run * 37) % 250
        };
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().expect("kill -9");
        let mut output = String::new();
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut output)
            .expect("read");
        child.wait().expect("reap");
        if !output.contains("FINISHED") {
            kills_mid_run += 1;
        }
        // Completions by `complete_and_ack` in the batches before the last `B`, and in the
        // batch after it: a durable completion (`K`) in a later batch makes the former durable.
        let (mut settled, mut open): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
        for line in output.lines() {
            if line == "B" {
                settled.append(&mut open);
                continue;
            }
            let mut parts = line.split(' ');
            let (Some(kind), Some(id)) = (
                parts.next(),
                parts.next().and_then(|i| i.parse::<u64>().ok()),
            ) else {
                continue;
            };
            match kind {
                "A" => {
                    if let Some(before) = admitted_in.insert(id, run) {
                        panic!("event {id} admitted in run {before} and again in run {run}");
                    }
                }
                "K" => {
                    acked.insert(id);
                    lazily_done += settled.len();
                    acked.extend(settled.drain(..));
                }
                "L" => open.push(id),
                _ => {}
            }
        }
        // Restart as a gateway would: reopening replays what the kill left.
        let store = oncegate_journal::open(config(&path)).expect("reopen after kill -9");
        block_on(check(&store, &admitted_in, &acked, run));
    }
    eprintln!(
        "{RUNS} kills ({kills_mid_run} during admission): {} events admitted, {} acked ({lazily_done} of them by complete_and_ack before a later durable step), every invariant held",
        admitted_in.len(),
        acked.len()
    );
    let snapshots = std::fs::read_dir(&path)
        .expect("list")
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        })
        .count();
    assert!(
        snapshots > 0,
        "the children took snapshots while they were killed"
    );
    assert!(
        acked.len() > 100,
        "the consumer should get events through ({})",
        acked.len()
    );
    assert!(
        lazily_done > 50,
        "completions by complete_and_ack should be followed by durable ones ({lazily_done})"
    );
    assert!(
        kills_mid_run >= RUNS / 2,
        "the kills should mostly land mid-run ({kills_mid_run})"
    );
    assert!(
        admitted_in.len() as u64 > PER_RUN,
        "the children should get real work done"
    );
}

/// The child's configuration, with snapshots often enough that kills land in them too.
fn config(path: &std::path::Path) -> JournalConfig {
    let mut config = JournalConfig::at(path);
    config.snapshot_after_bytes = 256 << 10;
    config
}

/// Where the child's event `id` lives (its chat's partition).
fn partition(id: u64, partitions: u16) -> u16 {
    Event {
        platform: Arc::from("feishu"),
        app: Arc::from("cli_crash"),
        tenant: None,
        event_id: format!("e{id}").into(),
        event_type: Arc::from("im.message.receive_v1"),
        created_at_ms: id,
        order_key: Some(format!("chat-{}", id % 13).into()),
        payload: bytes::Bytes::new(),
    }
    .partition(partitions)
}

async fn check(
    store: &JournalStore,
    admitted_in: &HashMap<u64, u64>,
    acked: &HashSet<u64>,
    run: u64,
) {
    let mut queued: HashMap<String, ()> = HashMap::new();
    for partition in 0..store.partitions() {
        for entry in store
            .queued_events(partition, None, usize::MAX)
            .await
            .expect("queue")
        {
            queued.insert(entry.event.event_id.to_string(), ());
        }
    }
    let max_id = (run + 2) * PER_RUN;
    for id in 0..max_id {
        let home = partition(id, store.partitions());
        let by_event = store
            .record(
                &key_for("feishu", "cli_crash", "event_id", &format!("e{id}")),
                home,
            )
            .await
            .expect("record");
        let by_message = store
            .record(
                &key_for("feishu", "cli_crash", "message_id", &format!("m{id}")),
                home,
            )
            .await
            .expect("record");
        let in_queue = queued.contains_key(&format!("e{id}"));
        // Both keys of an event were journaled in one frame, or neither.
        assert_eq!(
            by_event.is_some(),
            by_message.is_some(),
            "run {run}: event {id} half-recorded"
        );
        if in_queue {
            assert!(
                by_event.is_some(),
                "run {run}: event {id} queued without a seen-mark"
            );
        }
        if let Some(record) = &by_event {
            let done = matches!(record.state, RecordState::Completed { .. });
            assert!(
                in_queue || done,
                "run {run}: event {id} marked seen but neither queued nor done: {record:?}"
            );
        }
        if admitted_in.contains_key(&id) {
            assert!(
                by_event.is_some(),
                "run {run}: admitted event {id} lost its seen-mark"
            );
            assert!(
                in_queue
                    || matches!(
                        by_event.as_ref().map(|r| &r.state),
                        Some(RecordState::Completed { .. })
                    ),
                "run {run}: admitted event {id} lost"
            );
        }
        if acked.contains(&id) {
            assert!(!in_queue, "run {run}: acked event {id} came back");
            assert!(
                matches!(
                    by_event.as_ref().map(|r| &r.state),
                    Some(RecordState::Completed { .. })
                ),
                "run {run}: acked event {id} is not done"
            );
        }
    }
}
