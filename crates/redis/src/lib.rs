//! The shared backend: many gateway instances on one Redis, standalone or Cluster.
//!
//! Every state transition is one Lua script (loaded once, called by SHA, reloaded after
//! `NOSCRIPT` by `redis::Script`): admit checks every key and, only if all are unseen, marks them
//! and appends the event to its partition's stream in the same script. Records are strings (the layout
//! is in `lua/record.lua`; hashes written by earlier versions are still read) whose logical
//! times (retention end, lease end) decide liveness against the caller's clock; Redis TTLs only
//! clean up, a minute after the logical end.
//!
//! Claims and completions made at once in one partition share a script (`gather`): each
//! script costs Redis a fixed few microseconds beyond its keys' work.
//!
//! Hand-outs are lean: the owner of a partition is the only one that hands its events out
//! (fenced by its epoch), so a handed-out event's key needs no claim record of its own. The
//! hand-out reads its keys' records (one `MGET`): a key someone else holds is in flight, a done
//! one is done, and the others go out under a lease whose token names the epoch. Completion
//! marks the key done if nobody else holds or completed it meanwhile. A lean lease becomes a
//! claim of its own when its handler runs long (`ownership / 2`), when it is renewed, and before
//! its partition is handed over; entries taken over from an owner whose ownership ran out wait
//! the ownership time before they go out again.
//!
//! Every key a script touches carries its partition's hash tag (`{prefix:p}`): an event's
//! records, its partition's stream, counters and dead letters share one Cluster slot.
//!
//! Fencing tokens are a hybrid clock per partition (server microseconds, or last + 1), so they
//! grow with every grant and do not repeat after a restart without persistence or a failover
//! that lost the last writes.
//!
//! Queues: one stream per partition, entry id `0-<seq>` from the partition's hybrid clock (as
//! fencing tokens: ids do not repeat after a failover that lost the last appends) so that
//! `QueueId.seq` is the stream id, read through one consumer group. One gateway owns a
//! partition at a time, under an epoch that grows with every grant (`share`): live gateways
//! know each other through a membership set and each takes a fair share of the partitions,
//! handing the excess over once its running handlers are done. The owner reads new entries with
//! `XREADGROUP`, and a new owner first takes over what earlier owners were handed and never
//! acked with `XAUTOCLAIM`; reads, acks, retries and dead letters name the owner's epoch and are
//! refused inside their script under any other. Acked entries are `XACK`ed and `XDEL`eted. The
//! hand-out order (chat heads) is kept in memory per partition, as in the embedded store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::store::{millis, require_partition};
use oncegate_core::{
    Admission, Claim, Clock, DeadLetter, DedupStore, Delivery, Event, EventQueue, FenceCheck,
    FencingToken, Fingerprint, KeyHash, Lease, Nonce, PartitionOwner, QueueId, QueueSummary,
    QueuedEvent, QueuedState, Rate, RateStore, RateVerdict, Record, RecordState, StoreError,
    StoreStats, SystemClock, WatermarkOutcome, WatermarkStore,
};
use redis::{Script, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

mod breaker;
mod config;
mod conn;
mod consumer;
mod counted;
mod dedup;
mod durability;
mod gather;
mod groups;
mod keys;
mod lean;
mod partition;
mod promise;
mod queue;
mod rates;
mod reply;
mod sentinel;
mod server_clock;
mod share;
mod state;
mod view;

pub use server_clock::CLOCK_SYNC_EVERY;

use breaker::Breaker;
use config::check_partitions;
pub use config::{ConnectError, RedisConfig};
use conn::Conn;
use consumer::fetch;
use dedup::{ClaimCall, CompleteCall};
pub use durability::{RedisDurability, ServerPromise, judge};
use gather::Gather;
use partition::*;
use reply::*;
pub use sentinel::SENTINEL_SCHEME;

/// Physical TTLs outlive the logical end by this much, so that clock skew between gateways and
/// Redis never drops a record early.
pub const TTL_SLACK_MS: u64 = 60_000;
/// Stream entries read per catch-up round.
const CATCH_UP: usize = 1000;

/// The admit script's source (also for benchmarks that run it by itself).
pub const ADMIT_LUA: &str = concat!(
    include_str!("../lua/clock.lua"),
    include_str!("../lua/record.lua"),
    include_str!("../lua/counts.lua"),
    include_str!("../lua/admit.lua")
);

/// The claim script's source (also for benchmarks that run it by itself).
pub const CLAIM_LUA: &str = concat!(
    include_str!("../lua/clock.lua"),
    include_str!("../lua/record.lua"),
    include_str!("../lua/counts.lua"),
    include_str!("../lua/claim.lua")
);

/// The complete-and-ack script's source (also for benchmarks that run it by itself).
pub const COMPLETE_ACK_LUA: &str = concat!(
    include_str!("../lua/owns.lua"),
    include_str!("../lua/record.lua"),
    include_str!("../lua/counts.lua"),
    include_str!("../lua/completed.lua"),
    include_str!("../lua/complete_ack.lua")
);

/// A queue entry's payload as stored in the stream.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    event: Event,
}

struct Scripts {
    admit: Script,
    claim: Script,
    fence: Script,
    /// Reads records as strings (those of earlier versions' hashes converted).
    records: Script,
    /// A partition's counts by state (`lua/counts.lua`) and its streams' lengths.
    stats: Script,
    /// Writes the changes of a partition's counts a gateway gathered (`counted.rs`).
    count: Script,
    watermark: Script,
    rate: Script,
    rate_adjust: Script,
    dead_letter: Script,
    dead_replay: Script,
    dead_purge: Script,
    /// Partition ownership: renew, take, release.
    own: Script,
    /// Gateway membership.
    members: Script,
    /// The owner's group reads.
    read: Script,
    /// The owner's ack.
    ack: Script,
    /// The owner's retry.
    retry: Script,
    complete_ack: Script,
    /// Shared values: a write or removal, and a page of a listing.
    state_change: Script,
    state_list: Script,
}

/// How long a pull may go without reading its stream when this instance appended nothing to
/// it: what other instances append waits at most this long (an idle dispatcher pulls every
/// 100 ms anyway).
const READ_EVERY: Duration = Duration::from_millis(10);

/// How often an owner reads its own pending list back (see `Partition::resynced`).
const RESYNC_EVERY: Duration = Duration::from_secs(1);

/// The consumer group every gateway reads the partition streams in; each gateway is a consumer
/// named by its instance id.
const GROUP: &str = "oncegate";

struct Inner<C> {
    conn: Conn,
    /// A second connection for `WAIT` (`replicas` durability), which blocks the connection it
    /// is sent on; the first one otherwise.
    waits: Conn,
    /// The durability asked for and what the servers were last found to do.
    promise: promise::Promise,
    /// Whether the partition count in Redis was found to match (at connect, or when a lazy
    /// store first reached Redis).
    partitions_checked: std::sync::atomic::AtomicBool,
    /// This store's name in partition ownership.
    instance: String,
    prefix: String,
    partitions: u16,
    /// Each partition's key names, made once.
    names: Vec<keys::PartitionNames>,
    timeout: Duration,
    ownership_ms: u64,
    /// How long a hand-over waits for the partition's handed-out events.
    handover: Duration,
    /// How often this instance says it is alive and rebalances (on its pulls).
    balance_every: Duration,
    /// Membership and this instance's share of the partitions.
    share: Mutex<share::Share>,
    /// The first balancing round has run: later pulls do not wait for one that is running.
    joined: std::sync::atomic::AtomicBool,
    /// This instance has left (`EventQueue::leave`): it takes nothing anymore.
    left: std::sync::atomic::AtomicBool,
    clock: C,
    scripts: Scripts,
    queues: Vec<Mutex<Partition>>,
    /// Per partition: its stream may hold entries this instance's group reads have not brought
    /// yet (this instance appended one since its last read). Without it, a pull reads the
    /// stream only every `READ_EVERY`, for what other instances append.
    unread: Vec<std::sync::atomic::AtomicBool>,
    /// Claims waiting for their partition's next claim script.
    claims: Vec<Gather<ClaimCall, Claim>>,
    /// Completions waiting for their partition's next complete-and-ack script.
    completions: Vec<Gather<CompleteCall, FenceCheck>>,
    breaker: Breaker,
    /// Which events go before the rest of their group's backlog: asked of each entry as it
    /// joins a partition's hand-out order here (every owner asks its own, so a partition
    /// taken over ranks as its first owner did, given the same rule).
    first: oncegate_core::FirstRule,
    /// Changes of the counts made here, not yet written (`counted.rs`).
    tallies: counted::Tallies,
}

impl<C> Inner<C> {
    /// Checks, on first contact, the partition count a lazy store could not check at connect.
    async fn reachable(&self, conn: &mut Conn) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.partitions_checked.load(Relaxed) {
            return Ok(());
        }
        match check_partitions(conn, &self.prefix, self.partitions).await {
            Ok(()) => {
                // A lazy store learns what the server keeps now: `fsync` refuses admissions
                // until it holds (`Promise::admits`).
                self.check_durability(conn).await?;
                self.partitions_checked.store(true, Relaxed);
                Ok(())
            }
            Err(ConnectError::Connect { message, .. }) => Err(unavailable(message)),
            // Unavailable, not Invalid: nothing may be dropped (a spool keeps waiting) until
            // the configuration is fixed.
            Err(mismatch) => {
                tracing::error!(%mismatch, "refusing every store call");
                Err(unavailable(mismatch))
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

    /// [`connect`](Self::connect), from async code: the blocking connect runs on the
    /// runtime's blocking pool, not on a worker it would stall (where it would panic).
    pub async fn connect_async(config: RedisConfig) -> Result<Self, ConnectError> {
        let url = oncegate_core::redact::url(&config.url);
        tokio::task::spawn_blocking(move || Self::connect(config))
            .await
            .unwrap_or_else(|joined| {
                Err(ConnectError::Connect {
                    url,
                    message: format!("the connecting task failed: {joined}"),
                })
            })
    }

    /// What the Redis at `config.url` keeps of what a store on it would acknowledge under
    /// `config.durability`, read without writing anything (for `oncegate check-config`).
    /// Blocks: call it outside a runtime.
    pub fn probe(config: &RedisConfig) -> Result<oncegate_core::Durability, ConnectError> {
        let connect_error = |message: String| ConnectError::Connect {
            url: oncegate_core::redact::url(&config.url),
            message,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| connect_error(e.to_string()))?;
        runtime.block_on(async {
            let read = async {
                let mut conn = Conn::open(&config.url, config.cluster, config.timeout, false)
                    .await
                    .map_err(|e| connect_message(&e))?;
                promise::read(&mut conn).await.map_err(|e| e.to_string())
            };
            let nodes = tokio::time::timeout(config.timeout * 2, read)
                .await
                .map_err(|_| connect_error("no answer in time".into()))?
                .map_err(connect_error)?;
            Ok(durability::judge(config.durability, &nodes))
        })
    }
}

impl<C: Clock> RedisStore<C> {
    /// Connects; the store runs its connection on a small runtime of its own, so that it can be
    /// called from any runtime, or from several.
    pub fn connect_with_clock(config: RedisConfig, clock: C) -> Result<Self, ConnectError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("oncegate-redis")
            .enable_all()
            .build()
            .map_err(|e| ConnectError::Connect {
                url: oncegate_core::redact::url(&config.url),
                message: e.to_string(),
            })?;
        let handle = runtime.handle().clone();
        Self::open(config, clock, Some(runtime), handle)
    }

    /// Connects, with the connection and every call on the runtime of `handle` (a
    /// multi-threaded one): no hop between runtimes per call, for a caller that runs on it.
    /// Blocks while connecting: call it outside the runtime or inside `block_in_place`.
    pub fn connect_on(
        config: RedisConfig,
        clock: C,
        handle: tokio::runtime::Handle,
    ) -> Result<Self, ConnectError> {
        Self::open(config, clock, None, handle)
    }

    fn open(
        config: RedisConfig,
        clock: C,
        runtime: Option<tokio::runtime::Runtime>,
        handle: tokio::runtime::Handle,
    ) -> Result<Self, ConnectError> {
        // Shown from the start: an alert on it must tell "closed" from "never scraped".
        metrics::gauge!("oncegate_store_circuit_open").set(0.0);
        let connect_error = |message: String| ConnectError::Connect {
            url: oncegate_core::redact::url(&config.url),
            message,
        };
        let prefix = config.prefix.clone();
        let partitions = config.partitions.max(1);
        let (conn, waits, verdict) = handle
            .block_on(async {
                let open = || Conn::open(&config.url, config.cluster, config.timeout, config.lazy);
                let connect = |e: redis::RedisError| ConnectError::Connect {
                    url: String::new(),
                    message: connect_message(&e),
                };
                let mut conn = open().await.map_err(connect)?;
                let waits = match config.durability {
                    RedisDurability::Replicas { .. } => open().await.map_err(connect)?,
                    _ => conn.clone(),
                };
                let mut verdict = None;
                if !config.lazy {
                    check_partitions(&mut conn, &prefix, partitions).await?;
                    let found = durability::judge(
                        config.durability,
                        &promise::read(&mut conn)
                            .await
                            .map_err(|e| ConnectError::Connect {
                                url: String::new(),
                                message: e.to_string(),
                            })?,
                    );
                    if config.durability == RedisDurability::Fsync && !found.holds {
                        return Err(ConnectError::Durability(found.detail));
                    }
                    verdict = Some(found);
                }
                Ok::<_, ConnectError>((conn, waits, verdict))
            })
            .map_err(|e| match e {
                ConnectError::Connect { message, .. } => connect_error(message),
                other => other,
            })?;
        let lanes = match config.cluster {
            true => partitions,
            false => 1,
        };
        let inner = Arc::new(Inner {
            conn,
            waits,
            promise: promise::Promise::new(config.durability, lanes),
            instance: config.instance_name(),
            partitions_checked: std::sync::atomic::AtomicBool::new(!config.lazy),
            names: keys::PartitionNames::all(&prefix, partitions),
            prefix,
            partitions,
            timeout: config.timeout,
            ownership_ms: millis(config.ownership),
            balance_every: share::balance_every(config.ownership),
            handover: config.handover,
            share: Mutex::new(share::Share::default()),
            joined: std::sync::atomic::AtomicBool::new(false),
            left: std::sync::atomic::AtomicBool::new(false),
            clock,
            scripts: Scripts {
                admit: Script::new(ADMIT_LUA),
                claim: Script::new(CLAIM_LUA),
                fence: Script::new(concat!(
                    include_str!("../lua/owns.lua"),
                    include_str!("../lua/record.lua"),
                    include_str!("../lua/counts.lua"),
                    include_str!("../lua/completed.lua"),
                    include_str!("../lua/fence.lua")
                )),
                records: Script::new(concat!(
                    include_str!("../lua/record.lua"),
                    include_str!("../lua/records.lua")
                )),
                stats: Script::new(include_str!("../lua/stats.lua")),
                count: Script::new(include_str!("../lua/count.lua")),
                watermark: Script::new(include_str!("../lua/watermark.lua")),
                rate: Script::new(include_str!("../lua/rate.lua")),
                rate_adjust: Script::new(include_str!("../lua/rate_adjust.lua")),
                dead_letter: Script::new(concat!(
                    include_str!("../lua/owns.lua"),
                    include_str!("../lua/dead_letter.lua")
                )),
                dead_replay: Script::new(concat!(
                    include_str!("../lua/clock.lua"),
                    include_str!("../lua/dead_replay.lua")
                )),
                dead_purge: Script::new(include_str!("../lua/dead_purge.lua")),
                own: Script::new(concat!(
                    include_str!("../lua/clock.lua"),
                    include_str!("../lua/own.lua")
                )),
                members: Script::new(concat!(
                    include_str!("../lua/clock.lua"),
                    include_str!("../lua/members.lua")
                )),
                read: Script::new(concat!(
                    include_str!("../lua/owns.lua"),
                    include_str!("../lua/read.lua")
                )),
                ack: Script::new(concat!(
                    include_str!("../lua/owns.lua"),
                    include_str!("../lua/ack.lua")
                )),
                retry: Script::new(concat!(
                    include_str!("../lua/owns.lua"),
                    include_str!("../lua/retry.lua")
                )),
                state_change: Script::new(include_str!("../lua/state_change.lua")),
                state_list: Script::new(include_str!("../lua/state_list.lua")),
                complete_ack: Script::new(COMPLETE_ACK_LUA),
            },
            breaker: Breaker::default(),
            queues: (0..partitions)
                .map(|_| Mutex::new(Partition::default()))
                .collect(),
            unread: (0..partitions)
                .map(|_| std::sync::atomic::AtomicBool::new(true))
                .collect(),
            claims: (0..partitions).map(|_| Gather::default()).collect(),
            completions: (0..partitions).map(|_| Gather::default()).collect(),
            first: oncegate_core::FirstRule::default(),
            tallies: counted::Tallies::new(partitions),
        });
        if let Some(verdict) = verdict {
            inner.promise.set(verdict);
        }
        promise::watch(Arc::downgrade(&inner), &handle);
        handle.spawn(counted::write_every_second(Arc::downgrade(&inner)));
        Ok(Self {
            inner,
            runtime,
            handle,
        })
    }

    /// This store's name among the gateways that share the Redis: its configured name (the
    /// gateway's `[log] instance`) with a random part, or a random one — unique per
    /// connection, shown as the owner of its partitions (`EventQueue::owners`) and in the
    /// `gateway` label of `oncegate_partitions_owned`. Live gateways take their shares in the
    /// order of their names.
    pub fn name(&self) -> &str {
        &self.inner.instance
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
            inner.reachable(&mut conn).await?;
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
