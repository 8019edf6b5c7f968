//! The shared backend: many gateway instances on one Redis, standalone or Cluster.
//!
//! Every state transition is one Lua script (loaded once, called by SHA, reloaded after
//! `NOSCRIPT` by `redis::Script`): admit checks every key and, only if all are unseen, marks them
//! and appends the event to its partition's stream in the same script. Records are hashes whose
//! logical times (`e` retention end, `u` lease end) decide liveness against the caller's clock;
//! Redis TTLs only clean up, a minute after the logical end.
//!
//! Every key a script touches carries its partition's hash tag (`{prefix:p}`): an event's
//! records, its partition's stream, counters and dead letters share one Cluster slot.
//!
//! Fencing tokens are a hybrid clock per partition (server microseconds, or last + 1), so they
//! grow with every grant and do not repeat after a restart without persistence or a failover
//! that lost the last writes.
//!
//! Queues: one stream per partition, entry id `0-<seq>` from a per-partition counter so that
//! `QueueId.seq` is the stream id, read through one consumer group. One gateway owns a
//! partition at a time (an expiring ownership key); it reads new entries with `XREADGROUP`,
//! and a new owner first takes over what earlier owners were handed and never acked with
//! `XAUTOCLAIM`. Acked entries are `XACK`ed and `XDEL`eted. The hand-out order (chat heads) is
//! kept in memory per partition, as in the embedded store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::queue_index::PartitionIndex;
use oncegate_core::store::millis;
use oncegate_core::{
    Admission, Claim, Clock, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck,
    FencingToken, KeyHash, Lease, Nonce, QueueId, Record, RecordState, StoreError, StoreStats,
    SystemClock, WatermarkOutcome, WatermarkStore,
};
use redis::{Script, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

mod conn;
use conn::Conn;

/// Physical TTLs outlive the logical end by this much, so that clock skew between gateways and
/// Redis never drops a record early.
const TTL_SLACK_MS: u64 = 60_000;
/// How long counting every record may take (a scan; ~100k records a second on loopback).
const STATS_LIMIT: Duration = Duration::from_secs(120);
/// Stream entries read per catch-up round.
const CATCH_UP: usize = 1000;

/// How a Redis store is reached.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://host:port/db`; for a cluster, one or more nodes separated by commas.
    pub url: String,
    /// Whether `url` names a Redis Cluster.
    pub cluster: bool,
    /// Prefix of every key, so that several deployments can share a Redis.
    pub prefix: String,
    /// Queue partitions.
    pub partitions: u16,
    /// Timeout of every call.
    pub timeout: Duration,
    /// Start without Redis: connect on first use and check the partition count then, instead
    /// of failing now. For gateways with a spool, which take requests during an outage.
    pub lazy: bool,
    /// How long a partition stays with its owner without a pull. Another instance takes it over
    /// after that, and hands out again what the old owner had not acked.
    pub ownership: Duration,
}

impl RedisConfig {
    /// Defaults for `url`.
    pub fn at(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            cluster: false,
            lazy: false,
            prefix: "og".into(),
            partitions: 16,
            timeout: Duration::from_secs(2),
            ownership: Duration::from_secs(10),
        }
    }
}

/// Why a Redis store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL or the server.
    #[error("cannot connect to {url}: {message}")]
    Connect {
        /// The URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The stored partition count differs.
    #[error(
        "prefix {prefix:?} was created with {stored} partitions but {configured} are configured; set partitions = {stored}"
    )]
    Partitions {
        /// The key prefix.
        prefix: String,
        /// In Redis.
        stored: u16,
        /// In the configuration.
        configured: u16,
    },
}

/// Records the partition count under the prefix when it is new, and refuses a different one:
/// partitions decide where keys live, so two counts on one prefix would split records.
async fn check_partitions(
    conn: &mut Conn,
    prefix: &str,
    partitions: u16,
) -> Result<(), ConnectError> {
    let key = format!("{prefix}:partitions");
    let connect = |e: redis::RedisError| ConnectError::Connect {
        url: String::new(),
        message: e.to_string(),
    };
    let _: Value = redis::cmd("SET")
        .arg(&key)
        .arg(partitions)
        .arg("NX")
        .query_async(conn)
        .await
        .map_err(connect)?;
    let stored: u16 = redis::cmd("GET")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(connect)?;
    if stored == partitions {
        Ok(())
    } else {
        Err(ConnectError::Partitions {
            prefix: prefix.to_owned(),
            stored,
            configured: partitions,
        })
    }
}

fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis: {error}"))
}

/// A queue entry's payload as stored in the stream.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    event: Event,
}

struct Scripts {
    admit: Script,
    claim: Script,
    fence: Script,
    watermark: Script,
    dead_letter: Script,
    own: Script,
    complete_ack: Script,
}

#[derive(Default)]
struct Partition {
    order: PartitionIndex,
    /// The largest entry folded into `order`: entries come in id order, so anything at or
    /// below it is known (or was acked).
    last_seq: u64,
    /// This instance owns the partition, as far as it knows.
    owned: bool,
    /// Newly owned: the group's pending entries of earlier owners are still to be taken over.
    reclaim: bool,
    /// A group read may have been applied by Redis without its answer reaching us (entries
    /// then sit in this consumer's pending list, unknown here): read that list back before
    /// anything newer.
    resync: bool,
    /// When the pending list was last read back; it is, every `RESYNC_EVERY`, whatever
    /// happened, so that an answer lost without an error is caught too.
    resynced: Option<std::time::Instant>,
}

impl Partition {
    fn forget(&mut self) {
        *self = Self::default();
    }
}

/// How often an owner reads its own pending list back (see `Partition::resynced`).
const RESYNC_EVERY: Duration = Duration::from_secs(1);

/// The consumer group every gateway reads the partition streams in; each gateway is a consumer
/// named by its instance id.
const GROUP: &str = "oncegate";

struct Inner<C> {
    conn: Conn,
    /// Whether the partition count in Redis was found to match (at connect, or when a lazy
    /// store first reached Redis).
    partitions_checked: std::sync::atomic::AtomicBool,
    /// This store's name in partition ownership.
    instance: String,
    prefix: String,
    partitions: u16,
    timeout: Duration,
    ownership_ms: u64,
    clock: C,
    scripts: Scripts,
    queues: Vec<Mutex<Partition>>,
    breaker: Breaker,
}

/// Failures in a row that open the circuit, and how long it stays open before one call may
/// try again.
const BREAKER_FAILURES: u32 = 5;
const BREAKER_OPEN: Duration = Duration::from_secs(1);

/// A circuit breaker, so that a dead Redis is not hammered by every request and worker: after
/// a run of failures, calls fail at once for a while; then one call tries again.
#[derive(Default)]
struct Breaker {
    failures: std::sync::atomic::AtomicU32,
    open_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Breaker {
    fn check(&self) -> Result<(), StoreError> {
        let mut open = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
        match *open {
            Some(until) if std::time::Instant::now() < until => Err(StoreError::Unavailable(
                "redis: circuit open after repeated failures; retrying shortly".into(),
            )),
            Some(_) => {
                // Half open: let this call through; the next failure reopens at once.
                *open = None;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn record(&self, ok: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if ok {
            if self.failures.swap(0, Relaxed) >= BREAKER_FAILURES {
                metrics::gauge!("oncegate_store_circuit_open").set(0.0);
                tracing::info!("redis answers again: circuit closed");
            }
            return;
        }
        let failures = self.failures.fetch_add(1, Relaxed) + 1;
        if failures >= BREAKER_FAILURES {
            *self.open_until.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(std::time::Instant::now() + BREAKER_OPEN);
            metrics::gauge!("oncegate_store_circuit_open").set(1.0);
            if failures == BREAKER_FAILURES {
                tracing::warn!(
                    failures,
                    "redis keeps failing: circuit open, calls fail fast"
                );
            }
        }
    }
}

/// The Redis store.
pub struct RedisStore<C: Clock = SystemClock> {
    inner: Arc<Inner<C>>,
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl<C: Clock> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Drop for RedisStore<C> {
    fn drop(&mut self) {
        // The store's own runtime may be dropped from inside another runtime.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl RedisStore<SystemClock> {
    /// Connects on the system clock.
    pub fn connect(config: RedisConfig) -> Result<Self, ConnectError> {
        Self::connect_with_clock(config, SystemClock)
    }
}

impl<C: Clock> RedisStore<C> {
    /// Connects; the store runs its connection on a small runtime of its own, so that it can be
    /// called from any runtime, or from several.
    pub fn connect_with_clock(config: RedisConfig, clock: C) -> Result<Self, ConnectError> {
        let connect_error = |message: String| ConnectError::Connect {
            url: oncegate_core::redact::url(&config.url),
            message,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("oncegate-redis")
            .enable_all()
            .build()
            .map_err(|e| connect_error(e.to_string()))?;
        let prefix = config.prefix.clone();
        let partitions = config.partitions.max(1);
        let urls: Vec<&str> = config.url.split(',').map(str::trim).collect();
        let conn = runtime
            .block_on(async {
                let mut conn = Conn::open(&urls, config.cluster, config.timeout, config.lazy)
                    .await
                    .map_err(|e| ConnectError::Connect {
                        url: String::new(),
                        message: e.to_string(),
                    })?;
                if !config.lazy {
                    check_partitions(&mut conn, &prefix, partitions).await?;
                }
                Ok::<_, ConnectError>(conn)
            })
            .map_err(|e| match e {
                ConnectError::Connect { message, .. } => connect_error(message),
                other => other,
            })?;
        let handle = runtime.handle().clone();
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                instance: format!("{:016x}", fastrand::u64(..)),
                partitions_checked: std::sync::atomic::AtomicBool::new(!config.lazy),
                prefix,
                partitions,
                timeout: config.timeout,
                ownership_ms: millis(config.ownership),
                clock,
                scripts: Scripts {
                    admit: Script::new(include_str!("../lua/admit.lua")),
                    claim: Script::new(include_str!("../lua/claim.lua")),
                    fence: Script::new(include_str!("../lua/fence.lua")),
                    watermark: Script::new(include_str!("../lua/watermark.lua")),
                    dead_letter: Script::new(include_str!("../lua/dead_letter.lua")),
                    own: Script::new(include_str!("../lua/own.lua")),
                    complete_ack: Script::new(include_str!("../lua/complete_ack.lua")),
                },
                breaker: Breaker::default(),
                queues: (0..partitions)
                    .map(|_| Mutex::new(Partition::default()))
                    .collect(),
            }),
            runtime: Some(runtime),
            handle,
        })
    }

    /// Runs `work` on the store's runtime, within twice the call timeout.
    async fn run<T, F, Fut>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner<C>>, Conn) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.run_within(self.inner.timeout * 2, work).await
    }

    /// Runs `work` on the store's runtime within `limit` (each round trip still has the call
    /// timeout).
    async fn run_within<T, F, Fut>(&self, limit: Duration, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner<C>>, Conn) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.inner.breaker.check()?;
        let inner = self.inner.clone();
        let task = self.handle.spawn(async move {
            let mut conn = inner.conn.clone();
            if !inner
                .partitions_checked
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                // Started without Redis (lazy): the check `connect` skipped, on first contact.
                match check_partitions(&mut conn, &inner.prefix, inner.partitions).await {
                    Ok(()) => inner
                        .partitions_checked
                        .store(true, std::sync::atomic::Ordering::Relaxed),
                    Err(ConnectError::Connect { message, .. }) => return Err(unavailable(message)),
                    // Unavailable, not Invalid: nothing may be dropped (a spool keeps waiting)
                    // until the configuration is fixed.
                    Err(mismatch) => {
                        tracing::error!(%mismatch, "refusing every store call");
                        return Err(unavailable(mismatch));
                    }
                }
            }
            tokio::time::timeout(limit, work(inner, conn))
                .await
                .unwrap_or_else(|_| Err(unavailable("no answer in time")))
        });
        let result = task
            .await
            .map_err(|e| unavailable(format!("task failed: {e}")))?;
        self.inner
            .breaker
            .record(!matches!(result, Err(StoreError::Unavailable(_))));
        result
    }
}

/// Key names. Everything one script touches carries its partition's hash tag `{prefix:p}`, so
/// that in a Redis Cluster a partition's records, stream and counters share one slot.
impl<C> Inner<C> {
    fn record_key(&self, key: &KeyHash, partition: u16) -> String {
        format!("{{{}:{partition}}}:r:{key}", self.prefix)
    }
    fn stream(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:q", self.prefix)
    }
    fn sequence(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:qseq", self.prefix)
    }
    fn attempts(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:qa", self.prefix)
    }
    fn dead(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:dead", self.prefix)
    }
    fn tokens(&self, partition: u16) -> String {
        format!("{{{}:{partition}}}:token", self.prefix)
    }
    fn nonce_key(&self, nonce: &KeyHash, partition: u16) -> String {
        format!("{{{}:{partition}}}:n:{nonce}", self.prefix)
    }
    fn owner(&self, partition: u16) -> String {
        format!("{}:own:{partition}", self.prefix)
    }
    /// A `SCAN` pattern for every record key.
    fn records_pattern(&self) -> String {
        let mut escaped = String::with_capacity(self.prefix.len() + 8);
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        format!("{{{escaped}:*}}:r:*")
    }
}

fn int(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

fn array(value: Value) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(StoreError::Corrupt(format!(
            "expected an array from redis, got {other:?}"
        ))),
    }
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes)
        .map_err(|e| StoreError::Corrupt(format!("a stored value does not decode: {e}")))
}

/// Parses HMGET s e t u o into a record.
fn parse_record(fields: Vec<Value>) -> Option<Record> {
    let state = text(fields.first()?)?.to_owned();
    let expires_at_ms = int(fields.get(1)?)?;
    let state = match state.as_str() {
        "p" => RecordState::Pending,
        "r" => RecordState::Processing {
            token: FencingToken(int(fields.get(2)?)?),
            lease_until_ms: int(fields.get(3)?)?,
        },
        "c" => RecordState::Completed {
            outcome: match fields.get(4) {
                Some(Value::BulkString(bytes)) => Some(Bytes::from(bytes.clone())),
                _ => None,
            },
        },
        _ => return None,
    };
    Some(Record {
        state,
        expires_at_ms,
    })
}

/// The id of a stream entry (also of one that is gone).
fn entry_id(entry: &Value) -> Option<String> {
    match entry {
        Value::Array(parts) => parts.first().and_then(text).map(str::to_owned),
        _ => None,
    }
}

/// Whether a stream reply stands for an entry that is gone.
fn is_deleted(entry: &Value) -> bool {
    match entry {
        Value::Nil => true,
        Value::Array(parts) => matches!(parts.get(1), None | Some(Value::Nil)),
        _ => false,
    }
}

/// Fields of one stream entry: (seq, key, order hash, event bytes).
fn parse_entry(entry: Value) -> Option<(u64, KeyHash, u64, Vec<u8>)> {
    let mut parts = array(entry).ok()?.into_iter();
    let id = parts.next()?;
    let seq = text(&id)?.strip_prefix("0-")?.parse().ok()?;
    let fields = array(parts.next()?).ok()?;
    let (mut key, mut order, mut event) = (None, None, None);
    let mut it = fields.into_iter();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        match text(&name)? {
            "k" => key = KeyHash::from_hex(text(&value)?),
            "o" => order = int(&value),
            "e" => {
                if let Value::BulkString(bytes) = value {
                    event = Some(bytes);
                }
            }
            _ => {}
        }
    }
    Some((seq, key?, order?, event?))
}

impl<C: Clock> Inner<C> {
    /// The partition of `id`, locked, if this instance handed `id` out; else `None`.
    async fn handed_out(&self, id: QueueId) -> Option<tokio::sync::MutexGuard<'_, Partition>> {
        let queue = self.queues.get(usize::from(id.partition))?.lock().await;
        queue.order.is_in_flight(id.seq).then_some(queue)
    }

    /// Takes or keeps `partition` for this instance. One owner at a time hands a partition's
    /// events out, so per-chat order holds across gateways. A new owner takes over, with
    /// `XAUTOCLAIM`, every entry the consumer group had delivered to earlier owners and that
    /// nobody acked; they come out again before anything newer.
    async fn own(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
    ) -> Result<bool, StoreError> {
        let verdict: i64 = self
            .scripts
            .own
            .key(self.owner(partition))
            .arg(&self.instance)
            .arg(self.ownership_ms)
            .invoke_async(conn)
            .await
            .map_err(unavailable)?;
        match verdict {
            // Ours already, unless we did not know: the answer that made it ours was lost.
            1 if queue.owned => Ok(true),
            1 | 2 => {
                queue.forget();
                queue.owned = true;
                queue.reclaim = true;
                Ok(true)
            }
            _ => {
                queue.forget();
                Ok(false)
            }
        }
    }

    /// Creates the partition's consumer group (and stream) unless it exists.
    async fn ensure_group(&self, conn: &mut Conn, partition: u16) -> Result<(), StoreError> {
        let created: redis::RedisResult<Value> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.stream(partition))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            Err(error) => Err(unavailable(error)),
        }
    }

    /// Moves every pending entry of the group to this consumer (in entry order) and into the
    /// hand-out order; then forgets consumers that hold nothing (gateways that are gone).
    async fn reclaim(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
    ) -> Result<(), StoreError> {
        let mut start = "0-0".to_owned();
        loop {
            let reply: Value = redis::cmd("XAUTOCLAIM")
                .arg(self.stream(partition))
                .arg(GROUP)
                .arg(&self.instance)
                .arg(0)
                .arg(&start)
                .arg("COUNT")
                .arg(CATCH_UP)
                .query_async(conn)
                .await
                .map_err(unavailable)?;
            let mut parts = array(reply)?.into_iter();
            let next = parts.next().as_ref().and_then(text).map(str::to_owned);
            let entries = array(parts.next().unwrap_or(Value::Array(Vec::new())))?;
            self.fold(conn, partition, queue, entries).await?;
            match next {
                Some(next) if next != "0-0" => start = next,
                _ => break,
            }
        }
        let consumers: Vec<Value> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(self.stream(partition))
            .arg(GROUP)
            .query_async(conn)
            .await
            .map_err(unavailable)?;
        for consumer in consumers {
            let fields = array(consumer)?;
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|pair| text(&pair[0]) == Some(name))
                    .and_then(|pair| pair.get(1))
            };
            let (Some(name), Some(pending)) =
                (field("name").and_then(text), field("pending").and_then(int))
            else {
                continue;
            };
            if pending == 0 && name != self.instance {
                let _: Value = redis::cmd("XGROUP")
                    .arg("DELCONSUMER")
                    .arg(self.stream(partition))
                    .arg(GROUP)
                    .arg(name)
                    .query_async(conn)
                    .await
                    .map_err(unavailable)?;
            }
        }
        Ok(())
    }

    /// Brings the hand-out order up to date: takes over earlier owners' pending entries once
    /// after a takeover, reads this consumer's own pending list back after a read whose answer
    /// may have been lost, then reads what the group has not delivered yet. Each step is
    /// repeated on the next pull until it has gone through, so no entry is left pending
    /// unknown, and entries are folded in id order.
    async fn catch_up(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
    ) -> Result<(), StoreError> {
        if queue.reclaim {
            self.ensure_group(conn, partition).await?;
            // XAUTOCLAIM moves entries to this consumer before answering: if the answer is
            // lost, they are in our own pending list.
            queue.resync = true;
            self.reclaim(conn, partition, queue).await?;
            queue.reclaim = false;
        }
        if queue.resynced.is_none_or(|at| at.elapsed() >= RESYNC_EVERY) {
            queue.resync = true;
        }
        if queue.resync {
            let mut after = "0".to_owned();
            loop {
                let entries = self.read_group(conn, partition, &after).await?;
                let Some(last) = entries.last().and_then(entry_id) else {
                    break;
                };
                let done = entries.len() < CATCH_UP;
                after = last;
                self.fold(conn, partition, queue, entries).await?;
                if done {
                    break;
                }
            }
            queue.resync = false;
            queue.resynced = Some(std::time::Instant::now());
        }
        loop {
            queue.resync = true;
            let entries = self.read_group(conn, partition, ">").await?;
            let done = entries.len() < CATCH_UP;
            self.fold(conn, partition, queue, entries).await?;
            queue.resync = false;
            if done {
                return Ok(());
            }
        }
    }

    /// `XREADGROUP` for this consumer from `from`: `>` for entries never delivered, an id for
    /// this consumer's own pending entries after it.
    async fn read_group(
        &self,
        conn: &mut Conn,
        partition: u16,
        from: &str,
    ) -> Result<Vec<Value>, StoreError> {
        let mut recreated = false;
        loop {
            let read: redis::RedisResult<Value> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg(&self.instance)
                .arg("COUNT")
                .arg(CATCH_UP)
                .arg("STREAMS")
                .arg(self.stream(partition))
                .arg(from)
                .query_async(conn)
                .await;
            let reply = match read {
                Ok(reply) => reply,
                // The group is gone (a Redis that lost its data): start it again.
                Err(error) if error.code() == Some("NOGROUP") && !recreated => {
                    self.ensure_group(conn, partition).await?;
                    recreated = true;
                    continue;
                }
                Err(error) => return Err(unavailable(error)),
            };
            return match reply {
                Value::Nil => Ok(Vec::new()),
                // [[stream, [entries]]] (RESP2) or {stream: [entries]} (RESP3)
                Value::Array(streams) => match streams.into_iter().next() {
                    Some(stream) => array(array(stream)?.into_iter().nth(1).unwrap_or(Value::Nil)),
                    None => Ok(Vec::new()),
                },
                Value::Map(streams) => match streams.into_iter().next() {
                    Some((_, entries)) => array(entries),
                    None => Ok(Vec::new()),
                },
                other => Err(StoreError::Corrupt(format!(
                    "unexpected XREADGROUP reply {other:?}"
                ))),
            };
        }
    }

    /// Adds stream entries (in entry order) to the hand-out order, with their retry times.
    async fn fold(
        &self,
        conn: &mut Conn,
        partition: u16,
        queue: &mut Partition,
        entries: Vec<Value>,
    ) -> Result<(), StoreError> {
        let mut seqs = Vec::with_capacity(entries.len());
        for entry in entries {
            if is_deleted(&entry) {
                // Redis 6.2 lists an entry deleted while pending as nil; it was acked.
                continue;
            }
            let Some((seq, _, order, _)) = parse_entry(entry) else {
                return Err(StoreError::Corrupt("a stream entry lacks k, o or e".into()));
            };
            if seq > queue.last_seq {
                seqs.push((seq, order));
            }
        }
        if seqs.is_empty() {
            return Ok(());
        }
        let fields: Vec<String> = seqs.iter().map(|(seq, _)| seq.to_string()).collect();
        let attempts: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.attempts(partition))
            .arg(&fields)
            .query_async(conn)
            .await
            .map_err(unavailable)?;
        for ((seq, order), attempt) in seqs.into_iter().zip(attempts) {
            let not_before = attempt
                .as_deref()
                .and_then(|a| a.split(':').nth(1))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            queue.order.push(seq, order, not_before);
            queue.last_seq = seq;
        }
        Ok(())
    }
}

impl<C: Clock> DedupStore for RedisStore<C> {
    async fn admit(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
    ) -> Result<Admission, StoreError> {
        self.admit_with_nonce(event, keys, retention, None).await
    }

    async fn admit_with_nonce(
        &self,
        event: Event,
        keys: &[KeyHash],
        retention: Duration,
        nonce: Option<Nonce>,
    ) -> Result<Admission, StoreError> {
        oncegate_core::store::require_keys(keys)?;
        let keys = keys.to_vec();
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let order_hash = event.order_hash();
            let partition = oncegate_core::event::partition_of(order_hash, inner.partitions);
            let bytes = postcard::to_stdvec(&Stored { event })
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let mut call = inner.scripts.admit.prepare_invoke();
            for key in &keys {
                call.key(inner.record_key(key, partition));
            }
            call.key(inner.stream(partition))
                .key(inner.sequence(partition));
            call.arg(inner.clock.now_ms())
                .arg(millis(retention))
                .arg(keys.len())
                .arg(keys[0].to_string())
                .arg(order_hash)
                .arg(bytes)
                .arg(TTL_SLACK_MS);
            if let Some(nonce) = nonce {
                // In the event's slot: a replay carries the same event, so the same partition.
                call.key(inner.nonce_key(&nonce.key, partition))
                    .arg(nonce.window_ms.max(1));
            }
            let reply = array(call.invoke_async(&mut conn).await.map_err(unavailable)?)?;
            match (reply.first().and_then(int), reply.get(1).and_then(int)) {
                (Some(1), Some(seq)) => Ok(Admission::Admitted {
                    id: QueueId { partition, seq },
                }),
                (Some(0), Some(index)) => Ok(Admission::Duplicate {
                    key_index: index as usize,
                }),
                (Some(2), None) => Ok(Admission::Replayed),
                _ => Err(StoreError::Corrupt(format!(
                    "unexpected admit reply {reply:?}"
                ))),
            }
        })
        .await
    }

    async fn claim(
        &self,
        key: &KeyHash,
        partition: u16,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        oncegate_core::store::require_partition(partition, self.inner.partitions)?;
        let key = *key;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let reply: Value = inner
                .scripts
                .claim
                .key(inner.record_key(&key, partition))
                .key(inner.tokens(partition))
                .arg(inner.clock.now_ms())
                .arg(millis(lease))
                .arg(TTL_SLACK_MS)
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            let reply = array(reply)?;
            match reply.first().and_then(text) {
                Some("acquired") => {
                    match (reply.get(1).and_then(int), reply.get(2).and_then(int)) {
                        (Some(token), Some(until_ms)) => Ok(Claim::Acquired(Lease {
                            key,
                            partition,
                            token: FencingToken(token),
                            until_ms,
                        })),
                        _ => Err(StoreError::Corrupt(format!(
                            "unexpected claim reply {reply:?}"
                        ))),
                    }
                }
                Some("inflight") => Ok(Claim::InFlight {
                    until_ms: reply.get(1).and_then(int).unwrap_or(0),
                }),
                Some("done") => Ok(Claim::Done {
                    outcome: match reply.get(1) {
                        Some(Value::BulkString(bytes)) => Some(Bytes::from(bytes.clone())),
                        _ => None,
                    },
                }),
                _ => Err(StoreError::Corrupt(format!(
                    "unexpected claim reply {reply:?}"
                ))),
            }
        })
        .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<FenceCheck, StoreError> {
        self.fence("renew", *lease, millis(extend), None).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        self.fence("complete", *lease, millis(retention), outcome)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.fence("release", *lease, 0, None).await
    }

    async fn record(&self, key: &KeyHash, partition: u16) -> Result<Option<Record>, StoreError> {
        oncegate_core::store::require_partition(partition, self.inner.partitions)?;
        let key = *key;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let fields: Vec<Value> = redis::cmd("HMGET")
                .arg(inner.record_key(&key, partition))
                .arg(&["s", "e", "t", "u", "o"])
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            let now = inner.clock.now_ms();
            Ok(parse_record(fields).filter(|record| record.is_live(now)))
        })
        .await
    }

    async fn complete_and_ack(
        &self,
        lease: &Lease,
        retention: Duration,
        outcome: Option<Bytes>,
        id: QueueId,
    ) -> Result<FenceCheck, StoreError> {
        if lease.partition != id.partition {
            // Two slots in a cluster: no one script can touch both.
            let fence = self.complete(lease, retention, outcome).await?;
            self.ack(id).await?;
            return Ok(fence);
        }
        let lease = *lease;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some(queue) = inner.queues.get(usize::from(id.partition)) else {
                return Err(StoreError::Invalid(format!(
                    "no partition {}",
                    id.partition
                )));
            };
            let mut queue = queue.lock().await;
            let mut call = inner.scripts.complete_ack.prepare_invoke();
            call.key(inner.record_key(&lease.key, lease.partition))
                .key(inner.stream(id.partition))
                .key(inner.attempts(id.partition))
                .arg(lease.token.0)
                .arg(inner.clock.now_ms())
                .arg(millis(retention))
                .arg(TTL_SLACK_MS)
                .arg(format!("0-{}", id.seq))
                .arg(id.seq)
                .arg(GROUP);
            if let Some(outcome) = &outcome {
                call.arg(outcome.as_ref());
            }
            let applied: i64 = call.invoke_async(&mut conn).await.map_err(unavailable)?;
            queue.order.remove(id.seq);
            Ok(if applied == 1 {
                FenceCheck::Accepted
            } else {
                FenceCheck::Rejected
            })
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run(move |_inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    /// The streams' lengths, one pipelined round trip: entries stay in a stream until acked.
    async fn queued(&self) -> Result<u64, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let mut pipe = redis::pipe();
            for partition in 0..inner.partitions {
                pipe.cmd("XLEN").arg(inner.stream(partition));
            }
            let lengths: Vec<u64> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
            Ok(lengths.iter().sum())
        })
        .await
    }

    /// Counts by scanning the prefix on every primary, a thousand records per round trip:
    /// O(records), for operators, not for tight polling.
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let in_flight = {
            let mut total = 0u64;
            let mut queued = 0u64;
            for queue in &self.inner.queues {
                let queue = queue.lock().await;
                total += queue.order.in_flight() as u64;
                queued += queue.order.len() as u64;
            }
            (total, queued)
        };
        self.run_within(
            STATS_LIMIT,
            move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
                let mut stats = StoreStats {
                    in_flight: in_flight.0,
                    ..StoreStats::default()
                };
                let now = inner.clock.now_ms();
                let pattern = inner.records_pattern();
                for node in conn.scan_nodes().await.map_err(unavailable)? {
                    let mut cursor = 0u64;
                    loop {
                        let (next, keys) = conn
                            .scan(&node, cursor, &pattern)
                            .await
                            .map_err(unavailable)?;
                        // One round trip per slot (a cluster pipeline stays in one slot): the
                        // keys of a batch grouped by their partition's hash tag.
                        let mut by_tag: std::collections::BTreeMap<&str, Vec<&str>> =
                            std::collections::BTreeMap::new();
                        for key in &keys {
                            let tag = key.split_once('}').map_or(key.as_str(), |(tag, _)| tag);
                            by_tag.entry(tag).or_default().push(key);
                        }
                        for group in by_tag.values() {
                            let mut pipe = redis::pipe();
                            for key in group {
                                pipe.cmd("HMGET").arg(*key).arg(&["s", "e", "t", "u"]);
                            }
                            let records: Vec<Vec<Value>> =
                                pipe.query_async(&mut conn).await.map_err(unavailable)?;
                            for fields in records {
                                match parse_record(fields) {
                                    Some(record) if record.is_live(now) => match record.state {
                                        RecordState::Pending => stats.pending += 1,
                                        RecordState::Processing { .. } => stats.processing += 1,
                                        RecordState::Completed { .. } => stats.completed += 1,
                                    },
                                    _ => {}
                                }
                            }
                        }
                        cursor = next;
                        if cursor == 0 {
                            break;
                        }
                    }
                }
                for partition in 0..inner.partitions {
                    let (queued, dead): (u64, u64) = redis::pipe()
                        .cmd("XLEN")
                        .arg(inner.stream(partition))
                        .cmd("XLEN")
                        .arg(inner.dead(partition))
                        .query_async(&mut conn)
                        .await
                        .map_err(unavailable)?;
                    stats.queued += queued;
                    stats.dead_letters += dead;
                }
                Ok(stats)
            },
        )
        .await
    }
}

impl<C: Clock> RedisStore<C> {
    async fn fence(
        &self,
        op: &'static str,
        lease: Lease,
        ms: u64,
        outcome: Option<Bytes>,
    ) -> Result<FenceCheck, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let mut call = inner.scripts.fence.prepare_invoke();
            call.key(inner.record_key(&lease.key, lease.partition))
                .arg(op)
                .arg(lease.token.0)
                .arg(inner.clock.now_ms())
                .arg(ms)
                .arg(TTL_SLACK_MS);
            if let Some(outcome) = &outcome {
                call.arg(outcome.as_ref());
            }
            let applied: i64 = call.invoke_async(&mut conn).await.map_err(unavailable)?;
            Ok(if applied == 1 {
                FenceCheck::Accepted
            } else {
                FenceCheck::Rejected
            })
        })
        .await
    }
}

impl<C: Clock> EventQueue for RedisStore<C> {
    fn partitions(&self) -> u16 {
        self.inner.partitions
    }

    async fn pull(&self, partition: u16, max: usize) -> Result<Vec<Delivery>, StoreError> {
        if partition >= self.inner.partitions {
            return Err(StoreError::Invalid(format!("no partition {partition}")));
        }
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let mut queue = inner.queues[usize::from(partition)].lock().await;
            if !inner.own(&mut conn, partition, &mut queue).await? {
                return Ok(Vec::new());
            }
            inner.catch_up(&mut conn, partition, &mut queue).await?;
            let ready = queue.order.take_ready(inner.clock.now_ms(), max);
            match fetch(&inner, &mut conn, partition, &ready).await {
                Ok(fetched) => {
                    let mut out = Vec::with_capacity(fetched.len());
                    for (seq, found) in ready.iter().zip(fetched) {
                        match found {
                            Some(delivery) => out.push(delivery),
                            // Gone (acked by an earlier owner): forget it here too.
                            None => {
                                queue.order.remove(*seq);
                            }
                        }
                    }
                    Ok(out)
                }
                Err(error) => {
                    // Not handed out after all: put them back so that they go out later.
                    for seq in ready {
                        queue.order.retry(seq, 0);
                    }
                    Err(error)
                }
            }
        })
        .await
    }

    async fn ack(&self, id: QueueId) -> Result<bool, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some(mut queue) = inner.handed_out(id).await else {
                return Ok(false);
            };
            let _: Value = redis::pipe()
                .cmd("XACK")
                .arg(inner.stream(id.partition))
                .arg(GROUP)
                .arg(format!("0-{}", id.seq))
                .cmd("XDEL")
                .arg(inner.stream(id.partition))
                .arg(format!("0-{}", id.seq))
                .cmd("HDEL")
                .arg(inner.attempts(id.partition))
                .arg(id.seq)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            queue.order.remove(id.seq);
            Ok(true)
        })
        .await
    }

    async fn retry(&self, id: QueueId, not_before_ms: u64) -> Result<bool, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some(mut queue) = inner.handed_out(id).await else {
                return Ok(false);
            };
            let previous: Option<String> = redis::cmd("HGET")
                .arg(inner.attempts(id.partition))
                .arg(id.seq)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            let attempt: u32 = previous
                .as_deref()
                .and_then(|a| a.split(':').next())
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            let _: Value = redis::cmd("HSET")
                .arg(inner.attempts(id.partition))
                .arg(id.seq)
                .arg(format!("{}:{not_before_ms}", attempt + 1))
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            queue.order.retry(id.seq, not_before_ms);
            Ok(true)
        })
        .await
    }

    async fn dead_letter(&self, id: QueueId, reason: &str) -> Result<bool, StoreError> {
        let reason = reason.to_owned();
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let Some(mut queue) = inner.handed_out(id).await else {
                return Ok(false);
            };
            let moved: i64 = inner
                .scripts
                .dead_letter
                .key(inner.stream(id.partition))
                .key(inner.attempts(id.partition))
                .key(inner.dead(id.partition))
                .arg(format!("0-{}", id.seq))
                .arg(id.seq)
                .arg(reason)
                .arg(inner.clock.now_ms())
                .arg(id.partition)
                .arg(GROUP)
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            queue.order.remove(id.seq);
            Ok(moved == 1)
        })
        .await
    }

    /// The oldest `limit` dead letters of all partitions (each partition keeps its own, in its
    /// slot), oldest first.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let mut out = Vec::new();
            for partition in 0..inner.partitions {
                let entries: Value = redis::cmd("XRANGE")
                    .arg(inner.dead(partition))
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(limit)
                    .query_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                for entry in array(entries)? {
                    out.push(parse_dead_letter(entry)?);
                }
            }
            out.sort_by_key(|letter| (letter.at_ms, letter.id));
            out.truncate(limit);
            Ok(out)
        })
        .await
    }
}

/// One entry of a dead-letter stream.
fn parse_dead_letter(entry: Value) -> Result<DeadLetter, StoreError> {
    let mut parts = array(entry)?.into_iter().skip(1);
    let fields = array(parts.next().unwrap_or(Value::Nil))?;
    let mut map = std::collections::HashMap::new();
    let mut it = fields.into_iter();
    while let (Some(Value::BulkString(name)), Some(value)) = (it.next(), it.next()) {
        map.insert(name, value);
    }
    let get_int = |name: &[u8]| map.get(name).and_then(int).unwrap_or(0);
    let event = match map.get(b"e".as_slice()) {
        Some(Value::BulkString(bytes)) => decode::<Stored>(bytes)?.event,
        _ => return Err(StoreError::Corrupt("a dead letter lacks its event".into())),
    };
    Ok(DeadLetter {
        id: QueueId {
            partition: get_int(b"p") as u16,
            seq: get_int(b"s"),
        },
        key: map
            .get(b"k".as_slice())
            .and_then(text)
            .and_then(KeyHash::from_hex)
            .unwrap_or(KeyHash([0; 16])),
        event,
        attempts: get_int(b"a") as u32,
        reason: map
            .get(b"r".as_slice())
            .and_then(text)
            .unwrap_or_default()
            .to_owned(),
        at_ms: get_int(b"t"),
    })
}

/// Reads the entries `seqs` of a partition's stream with their attempt counts, in one round
/// trip; `None` for an entry that is gone.
async fn fetch<C>(
    inner: &Inner<C>,
    conn: &mut Conn,
    partition: u16,
    seqs: &[u64],
) -> Result<Vec<Option<Delivery>>, StoreError> {
    if seqs.is_empty() {
        return Ok(Vec::new());
    }
    let stream = inner.stream(partition);
    let attempts = inner.attempts(partition);
    let mut pipe = redis::pipe();
    for &seq in seqs {
        let id = format!("0-{seq}");
        pipe.cmd("XRANGE").arg(&stream).arg(&id).arg(&id);
        pipe.cmd("HGET").arg(&attempts).arg(seq);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await.map_err(unavailable)?;
    let mut out = Vec::with_capacity(seqs.len());
    let mut replies = replies.into_iter();
    for &seq in seqs {
        let (Some(entries), Some(attempt)) = (replies.next(), replies.next()) else {
            return Err(StoreError::Corrupt(
                "a short pipeline reply from redis".into(),
            ));
        };
        let Some((_, key, _, bytes)) = array(entries)?.into_iter().next().and_then(parse_entry)
        else {
            out.push(None);
            continue;
        };
        let stored: Stored = decode(&bytes)?;
        out.push(Some(Delivery {
            id: QueueId { partition, seq },
            key,
            event: stored.event,
            attempt: text(&attempt)
                .and_then(|a| a.split(':').next())
                .and_then(|a| a.parse().ok())
                .unwrap_or(0),
        }));
    }
    Ok(out)
}

impl<C: Clock> WatermarkStore for RedisStore<C> {
    async fn advance_watermark(
        &self,
        scope: &KeyHash,
        value: u64,
        retention: Duration,
    ) -> Result<WatermarkOutcome, StoreError> {
        let scope = *scope;
        self.run(move |inner: Arc<Inner<C>>, mut conn: Conn| async move {
            let reply: Value = inner
                .scripts
                .watermark
                .key(format!("{}:w:{scope}", inner.prefix))
                .arg(inner.clock.now_ms())
                .arg(value)
                .arg(millis(retention))
                .arg(TTL_SLACK_MS)
                .invoke_async(&mut conn)
                .await
                .map_err(unavailable)?;
            let reply = array(reply)?;
            match (reply.first().and_then(int), reply.get(1).and_then(int)) {
                (Some(1), previous) => Ok(WatermarkOutcome::Accepted { previous }),
                (Some(0), Some(current)) => Ok(WatermarkOutcome::Stale { current }),
                _ => Err(StoreError::Corrupt(format!(
                    "unexpected watermark reply {reply:?}"
                ))),
            }
        })
        .await
    }
}
