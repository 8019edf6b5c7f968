//! Opening a store: creating its file atomically, counting states and rebuilding the hand-out order from the queue table, and the reads every operation shares.

use super::*;

impl EmbeddedStore<SystemClock> {
    /// Opens (or creates) the store described by `config` on the system clock.
    pub fn open(config: EmbeddedConfig) -> Result<Self, OpenError> {
        Self::open_with_clock(config, SystemClock)
    }
}

impl<C: Clock + Clone> EmbeddedStore<C> {
    /// Opens (or creates) the store on `clock`.
    pub fn open_with_clock(config: EmbeddedConfig, clock: C) -> Result<Self, OpenError> {
        Self::open_inner(config, clock, None)
    }

    /// A store in a fresh temporary folder, deleted when the store is dropped (feature
    /// `test-support`).
    #[cfg(feature = "test-support")]
    pub fn open_temporary(clock: C) -> Result<Self, OpenError> {
        let dir = tempfile::tempdir().map_err(|cause| OpenError::Io {
            path: std::env::temp_dir(),
            cause,
        })?;
        let config = EmbeddedConfig::at(dir.path().join("oncegate.redb"));
        Self::open_inner(config, clock, Some(Box::new(dir)))
    }

    pub(super) fn open_inner(
        config: EmbeddedConfig,
        clock: C,
        keep: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Result<Self, OpenError> {
        let path = config.path.clone();
        oncegate_files::create_parent(&path).map_err(|cause| OpenError::Io {
            path: path.parent().unwrap_or(&path).to_path_buf(),
            cause,
        })?;
        if !path.exists() {
            create_atomically(&path, config.partitions.max(1))?;
        }
        let db = redb::Builder::new()
            .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
            .set_cache_size(config.cache_bytes)
            .create(&path)
            .map_err(|error| match error {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    OpenError::Locked { path: path.clone() }
                }
                other => OpenError::Database {
                    path: path.clone(),
                    message: other.to_string(),
                },
            })?;
        let database_error = |error: redb::Error| OpenError::Database {
            path: path.clone(),
            message: error.to_string(),
        };
        let (run, partitions) = (|| -> Result<(u64, u16), redb::Error> {
            let txn = db.begin_write()?;
            let run;
            let partitions;
            {
                let mut meta = txn.open_table(META)?;
                run = meta.get("run")?.map_or(0, |v| v.value()) + 1;
                meta.insert("run", run)?;
                let stored = meta.get("partitions")?.map(|v| v.value());
                partitions = match stored {
                    Some(stored) => stored as u16,
                    None => {
                        meta.insert("partitions", u64::from(config.partitions.max(1)))?;
                        config.partitions.max(1)
                    }
                };
                // Create every table so that readers never meet a missing one.
                txn.open_table(RECORDS)?;
                txn.open_table(EXPIRY)?;
                txn.open_table(QUEUE)?;
                txn.open_table(DEAD)?;
                txn.open_table(MARKS)?;
            }
            txn.commit()?;
            Ok((run, partitions))
        })()
        .map_err(database_error)?;
        if partitions != config.partitions.max(1) {
            return Err(OpenError::Partitions {
                path,
                stored: partitions,
                configured: config.partitions,
            });
        }
        rekey_dead_letters(&db).map_err(|error| OpenError::Database {
            path: path.clone(),
            message: error.to_string(),
        })?;
        let order = load_order(&db, partitions).map_err(|error| OpenError::Database {
            path: path.clone(),
            message: error.to_string(),
        })?;
        let counts = count_states(&db).map_err(|error| OpenError::Database {
            path: path.clone(),
            message: error.to_string(),
        })?;
        let shared = Arc::new(Shared {
            db,
            order,
            next_token: AtomicU64::new(FencingToken::compose(run, 1).0),
            run,
            partitions,
            commits: AtomicU64::new(0),
            committed_requests: AtomicU64::new(0),
            commit_nanos: AtomicU64::new(0),
            counts: counts.map(AtomicU64::new),
            first: oncegate_core::FirstRule::default(),
        });
        let (commands, receiver) = mpsc::channel();
        let writer = Writer::new(
            shared.clone(),
            receiver,
            config.max_batch.max(1),
            clock.clone(),
        );
        let writer = std::thread::Builder::new()
            .name("oncegate-embedded-writer".into())
            .spawn(move || writer.run())
            .map_err(|cause| OpenError::Io {
                path: path.clone(),
                cause,
            })?;
        Ok(Self {
            shared,
            clock,
            rates: oncegate_core::rates::LocalRates::default(),
            commands: Some(commands),
            writer: Some(writer),
            _keep: keep,
        })
    }

    pub(super) async fn send<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .as_ref()
            .ok_or_else(|| unavailable("the store is closing"))?
            .send(make(reply))
            .map_err(|_| unavailable("the writer thread has stopped"))?;
        answer
            .await
            .map_err(|_| unavailable("the writer thread dropped the request"))?
    }

    /// Group-commit figures since open: (commits, requests committed, time spent committing).
    pub fn commit_stats(&self) -> (u64, u64, Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.shared.commits.load(Relaxed),
            self.shared.committed_requests.load(Relaxed),
            Duration::from_nanos(self.shared.commit_nanos.load(Relaxed)),
        )
    }

    pub(super) fn order(&self, partition: u16) -> Option<MutexGuard<'_, PartitionIndex>> {
        self.shared.order.get(usize::from(partition)).map(lock)
    }

    pub(super) fn is_in_flight(&self, id: QueueId) -> bool {
        self.order(id.partition)
            .is_some_and(|order| order.is_in_flight(id.seq))
    }

    pub(super) fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let txn = self.shared.db.begin_read().map_err(unavailable)?;
        f(&txn).map_err(unavailable)
    }
}

/// Creates a new store file beside `path`, commits its first transaction, and only then renames
/// it into place: a crash while creating leaves a stray temporary file, never a half-made store.
pub(super) fn create_atomically(path: &Path, partitions: u16) -> Result<(), OpenError> {
    let creating = path.with_extension("creating");
    let io = |cause: std::io::Error| OpenError::Io {
        path: creating.clone(),
        cause,
    };
    let database = |message: String| OpenError::Database {
        path: creating.clone(),
        message,
    };
    if creating.exists() {
        std::fs::remove_file(&creating).map_err(io)?;
    }
    // Created 0600 before redb writes a byte into it: the store holds decrypted messages.
    oncegate_files::create_private(&creating).map_err(io)?;
    let db = redb::Builder::new()
        .create(&creating)
        .map_err(|e| database(e.to_string()))?;
    (|| -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(META)?
            .insert("partitions", u64::from(partitions))?;
        txn.commit()?;
        Ok(())
    })()
    .map_err(|e| database(e.to_string()))?;
    drop(db);
    std::fs::rename(&creating, path).map_err(io)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        // The rename is durable once the folder is synced.
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// Counts the stored records per state, once, on open.
pub(super) fn count_states(db: &Database) -> Result<[u64; 3], StoreError> {
    let txn = db.begin_read().map_err(unavailable)?;
    let records = txn.open_table(RECORDS).map_err(unavailable)?;
    let mut counts = [0u64; 3];
    for entry in records.iter().map_err(unavailable)? {
        let (_, value) = entry.map_err(unavailable)?;
        if let Ok(record) = codec::decode_record(value.value()) {
            counts[state_index(&record.state)] += 1;
        }
    }
    Ok(counts)
}

/// Files written before dead letters could be replayed kept them under a counter: keep each
/// under its queue seq instead, where a replay or purge finds it (once; a no-op after).
pub(super) fn rekey_dead_letters(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(unavailable)?;
    {
        let mut dead = txn.open_table(DEAD).map_err(unavailable)?;
        let mut moved = Vec::new();
        for entry in dead.iter().map_err(unavailable)? {
            let (position, value) = entry.map_err(unavailable)?;
            let letter: DeadLetter = decode(value.value())?;
            if letter.id.seq != position.value() {
                moved.push((position.value(), letter.id.seq, value.value().to_vec()));
            }
        }
        for (old, _, _) in &moved {
            dead.remove(*old).map_err(unavailable)?;
        }
        for (_, seq, bytes) in &moved {
            dead.insert(*seq, bytes.as_slice()).map_err(unavailable)?;
        }
    }
    txn.commit().map_err(unavailable)
}

/// Rebuilds every partition's hand-out order from the queue table.
pub(super) fn load_order(
    db: &Database,
    partitions: u16,
) -> Result<Box<[Mutex<PartitionIndex>]>, StoreError> {
    let mut order: Vec<PartitionIndex> = (0..partitions).map(|_| PartitionIndex::new()).collect();
    let txn = db.begin_read().map_err(unavailable)?;
    let queue = txn.open_table(QUEUE).map_err(unavailable)?;
    for entry in queue.iter().map_err(unavailable)? {
        let (position, value) = entry.map_err(unavailable)?;
        let seq = position.value();
        let queued: codec::Queued = decode(value.value())?;
        let partition = oncegate_core::event::partition_of(queued.order_hash, partitions);
        if let Some(index) = order.get_mut(usize::from(partition)) {
            index.push_in(
                seq,
                queued.order_hash,
                queued.event.group_hash(),
                queued.not_before_ms,
                queued.event.payload.len(),
            );
        }
    }
    Ok(order.into_iter().map(Mutex::new).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncegate_contract::{block_on, event, key};
    use oncegate_core::{Admission, DedupStore, EventQueue};

    /// A file from before replays kept dead letters under a counter (0, 1, …), which may be
    /// another letter's seq: reopened, every letter is found by its id.
    #[test]
    fn dead_letters_of_an_older_file_are_rekeyed_and_replayable() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("old.redb");
        let ids = block_on(async {
            let store = EmbeddedStore::open(EmbeddedConfig::at(&path)).expect("open");
            let mut ids = Vec::new();
            for name in ["o0", "o1", "o2"] {
                let Admission::Admitted { id } = store
                    .admit(event(name, None), &[key(name)], Duration::from_secs(3600))
                    .await
                    .expect("admit")
                else {
                    panic!("admitted")
                };
                ids.push(id);
            }
            for partition in 0..store.partitions() {
                store.pull(partition, 10).await.expect("pull");
            }
            // Dead in the order 2, 0: the old counter put seq 2 at 0 and seq 0 at 1.
            for id in [ids[2], ids[0]] {
                assert!(store.dead_letter(id, "old").await.expect("dead"));
            }
            ids
        });
        {
            let db = Database::open(&path).expect("db");
            let txn = db.begin_write().expect("txn");
            {
                let mut dead = txn.open_table(DEAD).expect("dead");
                let letters: Vec<Vec<u8>> = [ids[2].seq, ids[0].seq]
                    .iter()
                    .map(|seq| {
                        dead.remove(*seq)
                            .expect("remove")
                            .expect("present")
                            .value()
                            .to_vec()
                    })
                    .collect();
                for (counter, bytes) in letters.iter().enumerate() {
                    dead.insert(counter as u64, bytes.as_slice())
                        .expect("insert");
                }
            }
            txn.commit().expect("commit");
        }
        block_on(async {
            let store = EmbeddedStore::open(EmbeddedConfig::at(&path)).expect("reopen");
            assert_eq!(store.dead_letters(10).await.expect("list").len(), 2);
            assert_eq!(store.stats().await.expect("stats").queued, 1, "o1 alone");
            for id in [ids[0], ids[2]] {
                let replayed = store.replay_dead_letter(id).await.expect("replay");
                assert!(replayed.is_some(), "{id:?} found after the rekey");
            }
            assert!(store.dead_letters(10).await.expect("list").is_empty());
            assert_eq!(store.stats().await.expect("stats").queued, 3);
        });
        // A replay survives a restart.
        block_on(async {
            let store = EmbeddedStore::open(EmbeddedConfig::at(&path)).expect("reopen");
            let mut events = Vec::new();
            for partition in 0..store.partitions() {
                for delivery in store.pull(partition, 10).await.expect("pull") {
                    assert_eq!(delivery.attempt, 0);
                    events.push(delivery.event.event_id.to_string());
                }
            }
            events.sort();
            assert_eq!(events, ["o0", "o1", "o2"]);
        });
    }
}
