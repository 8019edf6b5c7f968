//! A journal store reopened again and again ends in the state a store that never stopped has:
//! the same records, queue entries (ids, attempts, delays), dead letters and watermarks, with
//! snapshots taken in the background while the operations run.

use std::collections::BTreeSet;
use std::time::Duration;

use oncegate_contract::{block_on, event, key};
use oncegate_core::{
    Admission, Claim, DedupStore, EventQueue, FenceCheck, KeyHash, ManualClock, Record,
    RecordState, WatermarkStore,
};
use oncegate_journal::{JournalConfig, JournalStore};
use oncegate_memory::{MemoryConfig, MemoryStore};

const HOUR: Duration = Duration::from_secs(3600);

/// A small deterministic generator: the same seed, the same run.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Opens the folder again once the previous store has let it go: a snapshot thread that held
/// the last handle drops the store (and its lock) when its snapshot is written, as a previous
/// process exits before the next one starts.
fn reopen(dir: &std::path::Path, clock: &ManualClock) -> JournalStore<ManualClock> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match oncegate_journal::open_with_clock(config(dir), clock.clone()) {
            Err(oncegate_journal::OpenError::Locked { .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            opened => return opened.expect("open"),
        }
    }
}

fn config(dir: &std::path::Path) -> JournalConfig {
    let mut config = JournalConfig::at(dir);
    config.partitions = 4;
    // Tiny, so that snapshots (and the removal of old segments) happen many times.
    config.snapshot_after_bytes = 16 << 10;
    config
}

fn reference(clock: ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::with_clock(
        MemoryConfig {
            partitions: 4,
            ..MemoryConfig::default()
        },
        clock,
    )
}

/// A record as both stores must agree on it (tokens differ between runs).
fn shape(record: Option<Record>) -> Option<(String, u64)> {
    record.map(|record| {
        let state = match record.state {
            RecordState::Pending => "pending".to_owned(),
            RecordState::Processing { .. } => "processing".to_owned(),
            RecordState::Completed { outcome } => format!("completed {outcome:?}"),
        };
        (state, record.expires_at_ms)
    })
}

/// One round on one store: the same operations whatever the store. Every claim taken is
/// finished within the round, so a restart between rounds ends no lease.
async fn round<S: DedupStore + EventQueue + WatermarkStore>(
    store: &S,
    seed: u64,
    next_id: &mut u64,
    ids: &mut BTreeSet<u64>,
) -> Vec<String> {
    let mut dice = Dice(seed);
    let mut seen = Vec::new();
    for _ in 0..40 {
        let fresh = dice.below(3) != 0 || ids.is_empty();
        let id = if fresh {
            *next_id += 1;
            *next_id
        } else {
            *ids.iter()
                .nth(dice.below(ids.len() as u64) as usize)
                .unwrap_or(&0)
        };
        ids.insert(id);
        let name = format!("e{id}");
        let chat = format!("chat{}", id % 7);
        let admitted = store
            .admit(event(&name, Some(&chat)), &[key(&name)], HOUR)
            .await
            .expect("admit");
        seen.push(format!(
            "{name} {}",
            matches!(admitted, Admission::Admitted { .. })
        ));
    }
    for partition in 0..store.partitions() {
        for delivery in store.pull(partition, 8).await.expect("pull") {
            let claim = store
                .claim(&delivery.key, partition, Duration::from_secs(30))
                .await
                .expect("claim");
            let lease = match claim {
                Claim::Acquired(lease) | Claim::TookOver(lease) => lease,
                other => panic!("{other:?}"),
            };
            match dice.below(5) {
                0 => {
                    assert_eq!(
                        store.release(&lease).await.expect("release"),
                        FenceCheck::Accepted
                    );
                    assert!(store.retry(delivery.id, 0).await.expect("retry"));
                }
                1 => {
                    assert_eq!(
                        store.release(&lease).await.expect("release"),
                        FenceCheck::Accepted
                    );
                    assert!(
                        store
                            .dead_letter(delivery.id, "gave up")
                            .await
                            .expect("dead")
                    );
                }
                outcome => {
                    let outcome = (outcome == 2).then(|| bytes::Bytes::from(format!("r{outcome}")));
                    store
                        .complete_and_ack(&lease, HOUR, outcome, delivery.id)
                        .await
                        .expect("complete");
                }
            }
        }
    }
    let dead = store.dead_letters(1000).await.expect("dead letters");
    if let Some(letter) = dead.first()
        && dice.below(2) == 0
    {
        store
            .replay_dead_letter(letter.id)
            .await
            .expect("replay")
            .expect("replayed");
    }
    if let Some(letter) = dead.get(1)
        && dice.below(3) == 0
    {
        assert!(store.purge_dead_letter(letter.id).await.expect("purge"));
    }
    let scope = KeyHash([dice.below(5) as u8; 16]);
    let mark = store
        .advance_watermark(&scope, dice.below(100), HOUR)
        .await
        .expect("mark");
    seen.push(format!("{mark:?}"));
    seen
}

/// Everything observable, in a form two stores can be compared by.
async fn state<S: DedupStore + EventQueue>(store: &S, ids: &BTreeSet<u64>) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        let name = format!("e{id}");
        let partition =
            event(&name, Some(&format!("chat{}", id % 7))).partition(store.partitions());
        out.push(format!(
            "{name}: {:?}",
            shape(store.record(&key(&name), partition).await.expect("record"))
        ));
    }
    for partition in 0..store.partitions() {
        for queued in store
            .queued_events(partition, None, 10_000)
            .await
            .expect("queued")
        {
            out.push(format!(
                "queued {:?} {} attempt {} {:?}",
                queued.id, queued.event.event_id, queued.attempt, queued.state
            ));
        }
    }
    for letter in store.dead_letters(1000).await.expect("dead") {
        out.push(format!(
            "dead {:?} {} {} {}",
            letter.id, letter.event.event_id, letter.attempts, letter.reason
        ));
    }
    out
}

#[test]
fn reopened_after_every_round_it_matches_a_store_that_never_stopped() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = ManualClock::new(oncegate_contract::START_MS);
    let model = reference(clock.clone());
    let (mut model_next, mut model_ids) = (0, BTreeSet::new());
    let (mut next, mut ids) = (0, BTreeSet::new());
    let mut snapshots_seen = 0;
    for round_number in 0..60u64 {
        let seed = 0x9E37_79B9_7F4A_7C15 ^ (round_number + 1).wrapping_mul(0x2545_F491);
        block_on(async {
            let store: JournalStore<ManualClock> = reopen(dir.path(), &clock);
            assert_eq!(
                state(&store, &ids).await,
                state(&model, &model_ids).await,
                "after reopening before round {round_number}"
            );
            // The counts `stats` answers are rebuilt as the journal replays: a census agrees
            // (from the start of the minute: a record is counted until its minute is over).
            let now = oncegate_core::Clock::now_ms(&clock);
            let counted = |stats: oncegate_core::StoreStats| {
                (stats.pending, stats.processing, stats.completed)
            };
            assert_eq!(
                counted(store.stats().await.expect("stats")),
                counted(store.census(now - now % 60_000 - 1)),
                "counts after reopening before round {round_number}"
            );
            let ours = round(&store, seed, &mut next, &mut ids).await;
            let theirs = round(&model, seed, &mut model_next, &mut model_ids).await;
            assert_eq!(ours, theirs, "answers in round {round_number}");
        });
        clock.advance_ms(1_000);
        snapshots_seen += std::fs::read_dir(dir.path())
            .expect("list")
            .filter(|entry| {
                entry
                    .as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".snap"))
            })
            .count();
    }
    assert!(snapshots_seen > 0, "the tiny threshold made snapshots");
    // Old segments were removed as snapshots replaced them.
    let segments = std::fs::read_dir(dir.path())
        .expect("list")
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
        })
        .count();
    assert!(segments < 60, "{segments} segments kept");
}

#[test]
fn a_restart_ends_the_previous_runs_leases_and_keeps_tokens_growing() {
    let dir = tempfile::tempdir().expect("dir");
    let held = block_on(async {
        let store = oncegate_journal::open(JournalConfig::at(dir.path())).expect("open");
        store
            .admit(event("held", Some("held")), &[key("held")], HOUR)
            .await
            .expect("admit");
        let partition = event("held", Some("held")).partition(store.partitions());
        match store
            .claim(&key("held"), partition, HOUR)
            .await
            .expect("claim")
        {
            Claim::Acquired(lease) => lease,
            other => panic!("{other:?}"),
        }
    });
    block_on(async {
        let store = oncegate_journal::open(JournalConfig::at(dir.path())).expect("reopen");
        let partition = event("held", Some("held")).partition(store.partitions());
        let Claim::TookOver(new) = store
            .claim(&key("held"), partition, HOUR)
            .await
            .expect("claim")
        else {
            panic!("the previous run's hour-long lease should be over");
        };
        assert_eq!(new.token.run(), held.token.run() + 1);
        assert_eq!(
            store.complete(&held, HOUR, None).await.expect("complete"),
            FenceCheck::Rejected
        );
        // Still queued: it was never acked.
        assert_eq!(store.pull(partition, 10).await.expect("pull").len(), 1);
        // A second process cannot open the folder while this one has it.
        assert!(matches!(
            oncegate_journal::open(JournalConfig::at(dir.path())),
            Err(oncegate_journal::OpenError::Locked { .. })
        ));
    });
}

#[test]
fn a_torn_tail_is_cut_off_and_damage_before_it_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    block_on(async {
        let store = oncegate_journal::open(JournalConfig::at(dir.path())).expect("open");
        for id in 0..20 {
            let name = format!("t{id}");
            store
                .admit(event(&name, None), &[key(&name)], HOUR)
                .await
                .expect("admit");
        }
    });
    let segment = dir.path().join(format!("segment-{:016x}.log", 0));
    let full = std::fs::read(&segment).expect("read");
    // Half of the last frame written, as a crash mid-write leaves it.
    std::fs::write(&segment, &full[..full.len() - 7]).expect("write");
    block_on(async {
        let store = oncegate_journal::open(JournalConfig::at(dir.path())).expect("reopen");
        assert_eq!(
            store.queued().await.expect("queued"),
            19,
            "the torn admit is gone"
        );
        // Its answer never left the store, so the platform retries it: admitted now.
        assert!(matches!(
            store
                .admit(event("t19", None), &[key("t19")], HOUR)
                .await
                .expect("admit"),
            Admission::Admitted { .. }
        ));
    });
    // A flipped byte in a segment that has later ones is refused with the file named.
    let mut damaged = std::fs::read(&segment).expect("read");
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0xFF;
    std::fs::write(&segment, damaged).expect("write");
    match oncegate_journal::open(JournalConfig::at(dir.path())) {
        Err(error @ oncegate_journal::OpenError::Corrupt { .. }) => {
            assert!(
                error.to_string().contains("segment-0000000000000000.log"),
                "{error}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Opens the store in `dir`, admits `{prefix}{id}` for every id of `ids` and closes it again:
/// how many events it then holds queued.
fn reopen_and_admit(dir: &std::path::Path, prefix: &str, ids: std::ops::Range<u32>) -> u64 {
    block_on(async {
        let store = oncegate_journal::open(JournalConfig::at(dir)).expect("open");
        for id in ids {
            let name = format!("{prefix}{id}");
            store
                .admit(event(&name, None), &[key(&name)], HOUR)
                .await
                .expect("admit");
        }
        store.queued().await.expect("queued")
    })
}

/// A crash while a segment is created leaves, in this build, a `segment-*.tmp` that opening
/// removes; a folder of an earlier build may hold a newest segment without its header (created,
/// not yet written), which opening removes too. Neither loses what the other files hold.
#[test]
fn a_segment_caught_in_creation_is_dropped_not_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let admit_some = |names: std::ops::Range<u32>| reopen_and_admit(dir.path(), "c", names);
    assert_eq!(admit_some(0..10), 10);
    let newest = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .expect("list")
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with("segment-") && name.ends_with(".log"))
            .max()
            .expect("a segment")
    };
    let next_number = |name: &str| {
        let hex = &name["segment-".len()..name.len() - ".log".len()];
        u64::from_str_radix(hex, 16).expect("hex") + 1
    };
    for (leftover, content) in [("tmp", &b""[..]), ("log", &b""[..]), ("log", &b"OGJ"[..])] {
        let number = next_number(&newest(dir.path()));
        let path = dir.path().join(format!("segment-{number:016x}.{leftover}"));
        std::fs::write(&path, content).expect("write");
        assert_eq!(
            admit_some(10..12),
            12,
            "after a {leftover} of {} bytes",
            content.len()
        );
        assert!(!path.exists() || std::fs::metadata(&path).expect("stat").len() > 3);
    }
    assert!(
        std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .all(|name| !name.ends_with(".tmp")),
        "a temporary segment was left"
    );
}

/// The writer zeroes room ahead of its frames; a store killed before it trimmed that room
/// leaves zeros after the newest segment's frames, which opening gives back, and zeros after an
/// earlier segment's frames are read as its end, not as damage. Bytes in that room are damage.
#[test]
fn zeroed_room_after_the_frames_is_trimmed_or_read_as_the_end() {
    let dir = tempfile::tempdir().expect("dir");
    let segment = |n: u64| dir.path().join(format!("segment-{n:016x}.log"));
    let queued = |names: std::ops::Range<u32>| reopen_and_admit(dir.path(), "z", names);
    assert_eq!(queued(0..10), 10);
    let framed = std::fs::metadata(segment(0)).expect("stat").len();
    let pad = |path: &std::path::Path, bytes: usize| {
        let mut content = std::fs::read(path).expect("read");
        content.resize(content.len() + bytes, 0);
        std::fs::write(path, content).expect("write");
    };
    // As a kill leaves the newest segment: opening trims it back to its frames.
    pad(&segment(0), 1 << 20);
    assert_eq!(queued(10..15), 15);
    assert_eq!(std::fs::metadata(segment(0)).expect("stat").len(), framed);
    // An earlier segment ending in zeros is read to its end, not refused.
    pad(&segment(0), 4096);
    assert_eq!(queued(15..20), 20);
    // A byte in that room is damage before later segments: refused.
    let mut damaged = std::fs::read(segment(0)).expect("read");
    let last = damaged.len() - 1;
    damaged[last] = 0x5A;
    std::fs::write(segment(0), damaged).expect("write");
    assert!(matches!(
        oncegate_journal::open(JournalConfig::at(dir.path())),
        Err(oncegate_journal::OpenError::Corrupt { .. })
    ));
}

#[test]
fn a_file_is_checked_as_opening_reads_it() {
    let dir = tempfile::tempdir().expect("dir");
    block_on(async {
        let store = oncegate_journal::open(JournalConfig::at(dir.path())).expect("open");
        for id in 0..10 {
            let name = format!("c{id}");
            store
                .admit(event(&name, None), &[key(&name)], HOUR)
                .await
                .expect("admit");
        }
    });
    let bytes = std::fs::read(dir.path().join(format!("segment-{:016x}.log", 0))).expect("read");
    assert_eq!(oncegate_journal::check_file(&bytes), Ok((10, false)));
    assert_eq!(
        oncegate_journal::check_file(&bytes[..bytes.len() - 3]),
        Ok((9, true))
    );
    assert!(oncegate_journal::check_file(b"not a journal at all, just words").is_err());
}

#[test]
fn a_header_whose_run_cannot_grow_is_refused_not_wrapped() {
    let dir = tempfile::tempdir().expect("dir");
    let mut header = b"oncegate-journ1\n".to_vec();
    header.push(1); // a segment
    header.extend(16u16.to_le_bytes());
    header.extend(0u64.to_le_bytes());
    for run in [u64::MAX, 1 << 32] {
        let mut file = header.clone();
        file.extend(run.to_le_bytes());
        std::fs::write(dir.path().join(format!("segment-{:016x}.log", 0)), &file).expect("write");
        match oncegate_journal::open(JournalConfig::at(dir.path())) {
            Err(error @ oncegate_journal::OpenError::Corrupt { .. }) => {
                assert!(error.to_string().contains("run counter"), "{error}");
            }
            other => panic!("run {run}: expected a refusal, got {other:?}"),
        }
    }
}

/// Shared values survive a restart, through segments and snapshots alike: the same values,
/// versions and expiries, a removal stays removed, and the generation never goes back.
#[test]
fn shared_values_survive_restarts_and_snapshots() {
    use oncegate_core::{Changed, Expect, StateStore};
    let dir = tempfile::tempdir().expect("dir");
    let mut expected: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut generation = 0;
    for round in 0..6u32 {
        let store = oncegate_journal::open(config(dir.path())).expect("open");
        block_on(async {
            assert_eq!(
                store.state_generation("tenants").await.expect("gen"),
                generation,
                "round {round}"
            );
            for (name, version) in &expected {
                let got = store.state_get("tenants", name).await.expect("get");
                assert_eq!(got.map(|v| v.version), Some(*version), "{name}");
            }
            for i in 0..40u32 {
                let name = format!("corp{}", (round * 7 + i) % 50);
                // Filler in the queue makes the journal grow past its snapshot size.
                let id = format!("s{round}-{i}");
                store
                    .admit(event(&id, None), &[key(&id)], HOUR)
                    .await
                    .expect("admit");
                if i % 9 == 0 {
                    store
                        .state_remove("tenants", &name, Expect::Any)
                        .await
                        .expect("remove");
                    expected.remove(&name);
                } else {
                    let value = bytes::Bytes::from(format!("{name} in round {round}"));
                    match store
                        .state_put("tenants", &name, value, Expect::Any, None)
                        .await
                        .expect("put")
                    {
                        Changed::Done(version) => {
                            expected.insert(name, version);
                        }
                        Changed::Stale(_) => panic!("an unconditional put is never stale"),
                    }
                }
            }
            generation = store.state_generation("tenants").await.expect("gen");
        });
    }
    let snapshots = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("snapshot-"))
        .count();
    assert!(snapshots > 0, "a snapshot was taken and replayed");
}

/// Events restored from the journal are ranked by the rule set after the restart: a backlog
/// and then a mention in one partition, reopened, hand the mention out first.
#[test]
fn a_rule_set_after_a_restart_ranks_what_the_journal_restored() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = ManualClock::new(1_700_000_000_000);
    // Three events in partition 0 of 4 (chats picked by where they land).
    let ids: Vec<String> = (0..200)
        .map(|i| format!("ev-{i}"))
        .filter(|id| event(id, Some(id)).partition(4) == 0)
        .take(3)
        .collect();
    assert_eq!(ids.len(), 3);
    block_on(async {
        let store = reopen(dir.path(), &clock);
        for id in &ids {
            let admitted = store
                .admit(event(id, Some(id)), &[key(id)], HOUR)
                .await
                .expect("admit");
            assert!(matches!(admitted, Admission::Admitted { .. }));
        }
    });
    block_on(async {
        let store = reopen(dir.path(), &clock);
        let last = ids[2].clone();
        let rule = move |event: &oncegate_core::Event| *event.event_id == *last;
        store
            .put_first(std::sync::Arc::new(rule))
            .await
            .expect("rule");
        let pulled = store.pull(0, 3).await.expect("pull");
        let got: Vec<&str> = pulled.iter().map(|d| &*d.event.event_id).collect();
        assert_eq!(got, [&*ids[2], &*ids[0], &*ids[1]]);
    });
}

/// A folder that cannot be created (under a file) is refused with the path and the OS error,
/// said once even where the causes are printed too.
#[test]
fn a_folder_under_a_file_is_refused_with_its_os_error_said_once() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("a-file"), "not a folder").expect("write");
    let folder = dir.path().join("a-file").join("store");
    let Err(error) = oncegate_journal::open(JournalConfig::at(&folder)) else {
        panic!("a folder under a file opened");
    };
    let said = oncegate_contract::printed(&error);
    assert!(said.contains(&folder.display().to_string()), "{said}");
    assert_eq!(said.matches("(os error").count(), 1, "{said}");
}
