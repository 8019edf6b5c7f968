//! The outage spool: when the shared store cannot be reached, the gateway keeps the admissions
//! it accepted in a local file and hands them to the store, in the order they came, once it
//! answers again.
//!
//! Admission is idempotent, so a spooled admission whose event the store had already admitted
//! (a platform retry during the outage) comes back as a duplicate and nothing is applied twice.
//! The file is the only copy until then: a spool on a disk that is lost loses its events, which
//! is why the spool is opt-in and 503 (the platform retries) is the default.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use oncegate_core::{Event, KeyHash, Nonce};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("spooled");

/// One admission, as the ingress would have made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spooled {
    /// The event.
    pub event: Event,
    /// Its dedup keys, first the one the dispatcher claims.
    pub keys: Vec<KeyHash>,
    /// How long the keys are remembered.
    pub retention_ms: u64,
    /// The request's nonce, if it had one.
    pub nonce: Option<Nonce>,
}

/// An admission as versions before the nonce's timestamp spooled it.
#[derive(Deserialize)]
struct SpooledWithoutTimestamp {
    event: Event,
    keys: Vec<KeyHash>,
    retention_ms: u64,
    _nonce: Option<(KeyHash, u64)>,
}

impl Spooled {
    /// The retention as a duration.
    pub fn retention(&self) -> Duration {
        Duration::from_millis(self.retention_ms)
    }

    /// The admission as the spool file holds it.
    pub fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_stdvec(self)
    }

    /// An entry of the spool file: this version's layout, else the one before it. An entry of
    /// the earlier layout comes back without its nonce, whose timestamp it lacks: a replay of it
    /// still finds its event's records, and is answered as the duplicate it is.
    pub fn decode(bytes: &[u8]) -> Result<Self, postcard::Error> {
        postcard::from_bytes(bytes).or_else(|error| {
            match postcard::take_from_bytes::<SpooledWithoutTimestamp>(bytes) {
                Ok((before, [])) => Ok(Self {
                    event: before.event,
                    keys: before.keys,
                    retention_ms: before.retention_ms,
                    nonce: None,
                }),
                // Bytes left over: neither layout, and the first one's error says more.
                _ => Err(error),
            }
        })
    }
}

/// Why the spool could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The file could not be opened or written.
    #[error("spool file {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The spool holds as many admissions as it may.
    #[error(
        "spool full: {limit} admissions wait for the store; raise store.spool_max or bring the store back"
    )]
    Full {
        /// The bound.
        limit: u64,
    },
    /// A stored entry does not decode.
    #[error("spool file {path} holds an entry this version cannot read: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// A durable FIFO of admissions on local disk.
pub struct Spool {
    db: Database,
    path: PathBuf,
    limit: u64,
    /// Entries held; kept beside the file so that the hot path checks it without a read.
    len: AtomicU64,
    next: AtomicU64,
    /// Admissions waiting for a commit, and whether one is running.
    group: Mutex<Group>,
    /// Signalled after every commit.
    committed: Condvar,
}

/// Where a waiting `push` learns how its commit went.
type Answer = Arc<OnceLock<Result<(), String>>>;

#[derive(Default)]
struct Group {
    waiting: Vec<(Vec<u8>, Answer)>,
    committing: bool,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool")
            .field("path", &self.path)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl Spool {
    /// Opens (or creates) the spool at `path`, holding at most `limit` admissions.
    pub fn open(path: &Path, limit: u64) -> Result<Self, SpoolError> {
        let io = |message: String| SpoolError::Io {
            path: path.to_path_buf(),
            message,
        };
        // Created 0600 in a 0700 folder: spooled admissions are decrypted events.
        oncegate_files::create_private(path).map_err(|e| io(e.to_string()))?;
        let db = Database::create(path).map_err(|e| io(e.to_string()))?;
        let txn = db.begin_write().map_err(|e| io(e.to_string()))?;
        let (len, next) = {
            let table = txn.open_table(ENTRIES).map_err(|e| io(e.to_string()))?;
            let len = table.len().map_err(|e| io(e.to_string()))?;
            let next = match table.last().map_err(|e| io(e.to_string()))? {
                Some((seq, _)) => seq.value() + 1,
                None => 0,
            };
            (len, next)
        };
        txn.commit().map_err(|e| io(e.to_string()))?;
        Ok(Self {
            db,
            path: path.to_path_buf(),
            limit: limit.max(1),
            len: AtomicU64::new(len),
            next: AtomicU64::new(next),
            group: Mutex::new(Group::default()),
            committed: Condvar::new(),
        })
    }

    /// Admissions waiting.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    /// The spool's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether another admission fits.
    pub fn has_room(&self) -> bool {
        self.len() < self.limit
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends an admission durably (the call returns after the commit). Blocking: call it
    /// off the async threads. Concurrent callers share commits: whoever finds no commit running
    /// writes everything waiting in one transaction, so one fsync answers them all.
    pub fn push(&self, spooled: &Spooled) -> Result<(), SpoolError> {
        let bytes = spooled.encode().map_err(|e| self.io(e))?;
        let answer: Answer = Arc::new(OnceLock::new());
        let mut group = self.group.lock().unwrap_or_else(|p| p.into_inner());
        if self.len() + group.waiting.len() as u64 >= self.limit {
            return Err(SpoolError::Full { limit: self.limit });
        }
        group.waiting.push((bytes, answer.clone()));
        if group.committing {
            while answer.get().is_none() {
                group = self
                    .committed
                    .wait(group)
                    .unwrap_or_else(|p| p.into_inner());
            }
        } else {
            group.committing = true;
            while !group.waiting.is_empty() {
                let batch = std::mem::take(&mut group.waiting);
                drop(group);
                let result = self.append(&batch).map_err(|e| e.to_string());
                for (_, waiter) in &batch {
                    let _ = waiter.set(result.clone());
                }
                group = self.group.lock().unwrap_or_else(|p| p.into_inner());
                self.committed.notify_all();
            }
            group.committing = false;
        }
        drop(group);
        match answer.get() {
            Some(Ok(())) => Ok(()),
            Some(Err(message)) => Err(SpoolError::Io {
                path: self.path.clone(),
                message: message.clone(),
            }),
            None => Err(self.io("the spool commit ended without an answer")),
        }
    }

    /// Writes `batch` in one transaction.
    fn append(&self, batch: &[(Vec<u8>, Answer)]) -> Result<(), SpoolError> {
        let txn = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut table = txn.open_table(ENTRIES).map_err(|e| self.io(e))?;
            let first = self.next.load(Ordering::Relaxed);
            for (i, (bytes, _)) in batch.iter().enumerate() {
                table
                    .insert(first + i as u64, bytes.as_slice())
                    .map_err(|e| self.io(e))?;
            }
        }
        txn.commit().map_err(|e| self.io(e))?;
        self.next.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.len.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The oldest `max` admissions with their positions, oldest first.
    pub fn peek(&self, max: usize) -> Result<Vec<(u64, Spooled)>, SpoolError> {
        let txn = self.db.begin_read().map_err(|e| self.io(e))?;
        let table = txn.open_table(ENTRIES).map_err(|e| self.io(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.io(e))?.take(max) {
            let (seq, bytes) = entry.map_err(|e| self.io(e))?;
            let spooled = Spooled::decode(bytes.value()).map_err(|e| SpoolError::Corrupt {
                path: self.path.clone(),
                message: e.to_string(),
            })?;
            out.push((seq.value(), spooled));
        }
        Ok(out)
    }

    /// Forgets the admission at `seq` (the store has it now).
    pub fn remove(&self, seq: u64) -> Result<(), SpoolError> {
        self.remove_all(&[seq])
    }

    /// Forgets the admissions at `seqs`, in one commit.
    pub fn remove_all(&self, seqs: &[u64]) -> Result<(), SpoolError> {
        let txn = self.db.begin_write().map_err(|e| self.io(e))?;
        let mut removed = 0;
        {
            let mut table = txn.open_table(ENTRIES).map_err(|e| self.io(e))?;
            for &seq in seqs {
                if table.remove(seq).map_err(|e| self.io(e))?.is_some() {
                    removed += 1;
                }
            }
        }
        txn.commit().map_err(|e| self.io(e))?;
        self.len.fetch_sub(removed, Ordering::Relaxed);
        Ok(())
    }

    fn io(&self, error: impl std::fmt::Display) -> SpoolError {
        SpoolError::Io {
            path: self.path.clone(),
            message: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncegate_contract::{event, key};

    fn spooled(id: &str) -> Spooled {
        Spooled {
            event: event(id, Some("chat")),
            keys: vec![key(id)],
            retention_ms: 60_000,
            nonce: Some(Nonce {
                key: key("nonce"),
                window_ms: 1_000,
                timestamp_secs: 1_764_000_000,
            }),
        }
    }

    /// An entry spooled by the version before the nonce's timestamp still comes back, without
    /// its nonce; bytes of neither layout are refused as corrupt.
    #[test]
    fn entries_of_the_earlier_layout_come_back_without_their_nonce() {
        #[derive(Serialize)]
        struct Before {
            event: Event,
            keys: Vec<KeyHash>,
            retention_ms: u64,
            nonce: Option<(KeyHash, u64)>,
        }
        let now = spooled("a");
        let before = postcard::to_stdvec(&Before {
            event: now.event.clone(),
            keys: now.keys.clone(),
            retention_ms: now.retention_ms,
            nonce: Some((key("nonce"), 1_000)),
        })
        .expect("encode");
        let decoded = Spooled::decode(&before).expect("the earlier layout decodes");
        assert_eq!(
            decoded,
            Spooled {
                nonce: None,
                ..now.clone()
            }
        );
        let current = now.encode().expect("encode");
        assert_eq!(Spooled::decode(&current).expect("decodes"), now);
        assert!(Spooled::decode(&current[..current.len() - 3]).is_err());
    }

    #[test]
    fn admissions_come_back_in_order_and_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("spool").join("s.redb");
        {
            let spool = Spool::open(&path, 10).expect("open");
            for id in ["a", "b", "c"] {
                spool.push(&spooled(id)).expect("push");
            }
            let first = spool.peek(1).expect("peek");
            assert_eq!(first[0].1, spooled("a"));
            spool.remove(first[0].0).expect("remove");
            assert_eq!(spool.len(), 2);
        }
        let spool = Spool::open(&path, 10).expect("reopen");
        assert_eq!(spool.len(), 2);
        spool.push(&spooled("d")).expect("push");
        let ids: Vec<String> = spool
            .peek(10)
            .expect("peek")
            .into_iter()
            .map(|(_, s)| s.event.event_id.to_string())
            .collect();
        assert_eq!(ids, ["b", "c", "d"]);
    }

    #[test]
    fn concurrent_pushes_share_commits_and_lose_nothing() {
        const THREADS: usize = 16;
        const EACH: usize = 200;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("s.redb");
        for round in 0..3 {
            let spool = Spool::open(&path, 1_000_000).expect("open");
            let before = spool.len() as usize;
            std::thread::scope(|scope| {
                for thread in 0..THREADS {
                    let spool = &spool;
                    scope.spawn(move || {
                        for n in 0..EACH {
                            spool
                                .push(&spooled(&format!("r{round}-t{thread}-{n}")))
                                .expect("push");
                        }
                    });
                }
            });
            assert_eq!(spool.len() as usize, before + THREADS * EACH);
            drop(spool);
            // Reopened: every push is on disk, and each caller's pushes are in its order.
            let spool = Spool::open(&path, 1_000_000).expect("reopen");
            let all = spool.peek(usize::MAX).expect("peek");
            assert_eq!(all.len(), before + THREADS * EACH);
            for thread in 0..THREADS {
                let prefix = format!("r{round}-t{thread}-");
                let mine: Vec<usize> = all
                    .iter()
                    .filter_map(|(_, s)| s.event.event_id.strip_prefix(&prefix)?.parse().ok())
                    .collect();
                assert_eq!(
                    mine,
                    (0..EACH).collect::<Vec<_>>(),
                    "round {round} thread {thread}"
                );
            }
        }
    }

    #[test]
    fn a_full_spool_refuses_and_says_so() {
        let dir = tempfile::tempdir().expect("dir");
        let spool = Spool::open(&dir.path().join("s.redb"), 2).expect("open");
        spool.push(&spooled("a")).expect("push");
        spool.push(&spooled("b")).expect("push");
        let refused = spool.push(&spooled("c"));
        assert!(
            matches!(&refused, Err(SpoolError::Full { limit: 2 })),
            "{refused:?}"
        );
        assert!(
            refused
                .expect_err("full")
                .to_string()
                .contains("store.spool_max")
        );
        assert_eq!(spool.len(), 2);
    }
}
