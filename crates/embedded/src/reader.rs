//! Read-only access for `oncegate inspect`, while a gateway writes the file.

use super::*;

/// Read-only access to a store file, for `oncegate inspect` while a gateway runs.
pub struct StoreReader {
    db: redb::ReadOnlyDatabase,
    partitions: u16,
}

impl StoreReader {
    /// Opens `path` for reading.
    pub fn open(path: &Path) -> Result<Self, OpenError> {
        if !path.exists() {
            return Err(OpenError::Io {
                path: path.to_path_buf(),
                cause: std::io::Error::new(std::io::ErrorKind::NotFound, "no such store file"),
            });
        }
        let db = redb::Builder::new()
            .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
            .open_read_only(path)
            .map_err(|error| match error {
                redb::DatabaseError::RepairAborted => OpenError::Database {
                    path: path.to_path_buf(),
                    message: "the store was not closed cleanly and needs a repair, which a \
                              read-only reader cannot do; start the gateway on it once (it \
                              repairs on open) and read again"
                        .into(),
                },
                other => OpenError::Database {
                    path: path.to_path_buf(),
                    message: other.to_string(),
                },
            })?;
        let partitions = (|| -> Result<u16, redb::Error> {
            let txn = db.begin_read()?;
            let meta = txn.open_table(META)?;
            Ok(meta.get("partitions")?.map_or(1, |v| v.value() as u16))
        })()
        .map_err(|error| OpenError::Database {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?;
        Ok(Self { db, partitions })
    }

    /// One key's stored records (live or not yet swept), in whichever partitions hold one.
    pub fn record(&self, key: &KeyHash) -> Result<Vec<(u16, Record)>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let records = txn.open_table(RECORDS).map_err(unavailable)?;
        let mut found = Vec::new();
        for partition in 0..self.partitions {
            let placed = key.in_partition(partition);
            if let Some(stored) = records.get(&placed.0).map_err(unavailable)? {
                found.push((partition, codec::decode_record(stored.value())?));
            }
        }
        Ok(found)
    }

    /// Up to `limit` records in the order of their identities (`KeyHash::in_partition`).
    pub fn records(&self, limit: usize) -> Result<Vec<(KeyHash, Record)>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let records = txn.open_table(RECORDS).map_err(unavailable)?;
        let mut out = Vec::new();
        for entry in records.iter().map_err(unavailable)?.take(limit) {
            let (key, value) = entry.map_err(unavailable)?;
            out.push((KeyHash(*key.value()), codec::decode_record(value.value())?));
        }
        Ok(out)
    }

    /// Queued events (up to `limit`), oldest first per partition.
    pub fn queued(&self, limit: usize) -> Result<Vec<(QueueId, Event, u32)>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let queue = txn.open_table(QUEUE).map_err(unavailable)?;
        let mut out = Vec::new();
        for entry in queue.iter().map_err(unavailable)?.take(limit) {
            let (position, value) = entry.map_err(unavailable)?;
            let seq = position.value();
            let queued: codec::Queued = decode(value.value())?;
            let partition = oncegate_core::event::partition_of(queued.order_hash, self.partitions);
            out.push((QueueId { partition, seq }, queued.event, queued.attempt));
        }
        Ok(out)
    }

    /// Dead letters (up to `limit`), oldest first.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let dead = txn.open_table(DEAD).map_err(unavailable)?;
        let mut out = Vec::new();
        for entry in dead.iter().map_err(unavailable)?.take(limit) {
            out.push(decode(entry.map_err(unavailable)?.1.value())?);
        }
        Ok(out)
    }

    /// Every piece of the file's state as a change of the journal store's format, in one read
    /// transaction: how a file of this format moves into a journal folder.
    pub fn export(
        &self,
        emit: &mut dyn FnMut(&oncegate_memory::Change<'_>),
    ) -> Result<(), StoreError> {
        use oncegate_memory::Change;
        use std::borrow::Cow;
        let txn = self.db.begin_read().map_err(unavailable)?;
        let meta = txn.open_table(META).map_err(unavailable)?;
        let next_seq = meta
            .get("seq")
            .map_err(unavailable)?
            .map_or(0, |v| v.value());
        for entry in txn
            .open_table(RECORDS)
            .map_err(unavailable)?
            .iter()
            .map_err(unavailable)?
        {
            let (key, value) = entry.map_err(unavailable)?;
            emit(&Change::Record {
                key: KeyHash(*key.value()),
                record: Cow::Owned(codec::decode_record(value.value())?),
            });
        }
        for entry in txn
            .open_table(MARKS)
            .map_err(unavailable)?
            .iter()
            .map_err(unavailable)?
        {
            let (scope, value) = entry.map_err(unavailable)?;
            let (value, deadline_ms) = value.value();
            emit(&Change::Mark {
                scope: KeyHash(*scope.value()),
                value,
                deadline_ms,
            });
        }
        let mut highest = next_seq;
        for entry in txn
            .open_table(QUEUE)
            .map_err(unavailable)?
            .iter()
            .map_err(unavailable)?
        {
            let (position, value) = entry.map_err(unavailable)?;
            let seq = position.value();
            highest = highest.max(seq.saturating_add(1));
            let queued: codec::Queued = decode(value.value())?;
            let partition = oncegate_core::event::partition_of(queued.order_hash, self.partitions);
            emit(&Change::Queued {
                id: QueueId { partition, seq },
                key: queued.key,
                order_hash: queued.order_hash,
                attempt: queued.attempt,
                not_before_ms: queued.not_before_ms,
                event: Cow::Owned(queued.event),
            });
        }
        for entry in txn
            .open_table(DEAD)
            .map_err(unavailable)?
            .iter()
            .map_err(unavailable)?
        {
            let letter: DeadLetter = decode(entry.map_err(unavailable)?.1.value())?;
            highest = highest.max(letter.id.seq.saturating_add(1));
            emit(&Change::Dead {
                letter: Cow::Owned(letter),
            });
        }
        for partition in 0..self.partitions {
            emit(&Change::NextSeq {
                partition,
                next: highest,
            });
        }
        Ok(())
    }

    /// The last run that opened the file: a store it moves into must grant tokens above it.
    pub fn run(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let meta = txn.open_table(META).map_err(unavailable)?;
        Ok(meta
            .get("run")
            .map_err(unavailable)?
            .map_or(0, |v| v.value()))
    }

    /// Queue partitions the file was created with.
    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// Counts by state at `now_ms`; in-flight is unknown from outside the gateway and left 0.
    pub fn stats(&self, now_ms: u64) -> Result<StoreStats, StoreError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let mut stats = StoreStats::default();
        let records = txn.open_table(RECORDS).map_err(unavailable)?;
        for entry in records.iter().map_err(unavailable)? {
            let record = codec::decode_record(entry.map_err(unavailable)?.1.value())?;
            if record.is_live(now_ms) {
                match record.state {
                    RecordState::Pending => stats.pending += 1,
                    RecordState::Processing { .. } => stats.processing += 1,
                    RecordState::Completed { .. } => stats.completed += 1,
                }
            }
        }
        stats.queued = txn
            .open_table(QUEUE)
            .map_err(unavailable)?
            .len()
            .map_err(unavailable)?;
        stats.dead_letters = txn
            .open_table(DEAD)
            .map_err(unavailable)?
            .len()
            .map_err(unavailable)?;
        Ok(stats)
    }
}
