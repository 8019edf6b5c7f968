//! Keeping the durability promise: reading what the servers do (at connect, on first contact,
//! every `CHECK_EVERY`), refusing acknowledgements the mode cannot back, and waiting for
//! replicas.

use std::sync::atomic::{AtomicU64, Ordering};

use super::durability::{CHECK_EVERY, RedisDurability, ServerPromise, config_answer, judge};
use super::*;
use oncegate_core::Durability;

/// What the store last found about its promise.
pub(super) struct Promise {
    pub(super) mode: RedisDurability,
    verdict: std::sync::Mutex<Durability>,
    holds: std::sync::atomic::AtomicBool,
    /// Acknowledgements waiting for replicas, coalesced per lane: one `WAIT` at a time covers
    /// every write answered before it was sent.
    replication: Vec<Replication>,
}

impl Promise {
    /// `lanes`: 1 for one primary, the partition count on a cluster.
    pub(super) fn new(mode: RedisDurability, lanes: u16) -> Self {
        Self {
            mode,
            verdict: std::sync::Mutex::new(Durability {
                mode: mode.name(),
                holds: true,
                detail: "not checked yet: the store has not reached Redis".into(),
                at_risk: None,
            }),
            holds: std::sync::atomic::AtomicBool::new(true),
            replication: (0..lanes.max(1)).map(|_| Replication::default()).collect(),
        }
    }

    pub(super) fn current(&self) -> Durability {
        match self.verdict.lock() {
            Ok(verdict) => verdict.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Takes a new verdict, saying so when it changed.
    pub(super) fn set(&self, verdict: Durability) {
        let before = self.current();
        if before.holds != verdict.holds || before.detail != verdict.detail {
            match (&verdict.at_risk, verdict.holds) {
                (_, false) => tracing::error!(
                    mode = verdict.mode,
                    "redis durability does not hold: {}",
                    verdict.detail
                ),
                (Some(at_risk), true) => tracing::warn!(
                    mode = verdict.mode,
                    "redis durability: {}; can lose: {at_risk}",
                    verdict.detail
                ),
                (None, true) => {
                    tracing::info!(mode = verdict.mode, "redis durability: {}", verdict.detail)
                }
            }
        }
        metrics::gauge!("oncegate_store_durability_holds", "mode" => verdict.mode)
            .set(if verdict.holds { 1.0 } else { 0.0 });
        metrics::gauge!("oncegate_store_durability_at_risk", "mode" => verdict.mode)
            .set(if verdict.at_risk.is_some() { 1.0 } else { 0.0 });
        self.holds.store(verdict.holds, Ordering::Release);
        if let Ok(mut current) = self.verdict.lock() {
            *current = verdict;
        }
    }

    /// Whether acknowledgements wait for replicas (then the primary a write went to matters).
    pub(super) fn waits(&self) -> bool {
        matches!(self.mode, RedisDurability::Replicas { .. })
    }

    /// Refuses an acknowledgement `fsync` cannot back: the server was last found not to write
    /// every change to disk.
    pub(super) fn admits(&self) -> Result<(), StoreError> {
        if self.mode == RedisDurability::Fsync && !self.holds.load(Ordering::Acquire) {
            return Err(unavailable(self.current().detail));
        }
        Ok(())
    }
}

/// Reads what every server behind `conn` promises: the primary, or each cluster primary.
pub(super) async fn read(conn: &mut Conn) -> Result<Vec<ServerPromise>, StoreError> {
    let nodes = conn.scan_nodes().await.map_err(from_redis)?;
    let mut promises = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let mut config = redis::cmd("CONFIG");
        config.arg("GET").arg("append*").arg("save");
        let config = match conn.query_on(node, config).await {
            Ok(value) => config_answer(value),
            // The connection failed, not the command: nothing is known.
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                return Err(from_redis(e));
            }
            Err(refused) => Err(refused.to_string()),
        };
        let info = |section: &str| {
            let mut cmd = redis::cmd("INFO");
            cmd.arg(section);
            cmd
        };
        let persistence = conn.query_on(node, info("persistence")).await;
        let replication = conn.query_on(node, info("replication")).await;
        let as_text = |reply: redis::RedisResult<Value>| -> Result<String, StoreError> {
            let value = reply.map_err(from_redis)?;
            Ok(text(&value).unwrap_or_default().to_owned())
        };
        promises.push(ServerPromise::from_answers(
            config,
            &as_text(persistence)?,
            &as_text(replication)?,
        ));
    }
    Ok(promises)
}

impl<C> Inner<C> {
    /// Reads the servers' promise again and takes the verdict.
    pub(super) async fn check_durability(&self, conn: &mut Conn) -> Result<Durability, StoreError> {
        let verdict = judge(self.promise.mode, &read(conn).await?);
        self.promise.set(verdict.clone());
        Ok(verdict)
    }

    /// In `replicas` mode, waits until `min` replicas have what the caller's call wrote (or
    /// found written, for a duplicate) in `partition`. `written_at` is the primary the call
    /// went to (`Conn::primary`, read before it): a wait on another primary proves nothing.
    ///
    /// `WAIT` covers the writes of the connection it is sent on, up to the primary's
    /// replication offset then; a small write in the partition's slot just before it, on the
    /// connection that waits, carries that offset past every write answered earlier, whoever
    /// made them. That connection is a second one, since `WAIT` blocks the connection it is
    /// sent on; and one wait at a time covers every acknowledgement answered before it.
    pub(super) async fn replicated(
        &self,
        partition: u16,
        written_at: Option<String>,
    ) -> Result<(), StoreError> {
        let RedisDurability::Replicas { min, wait } = self.promise.mode else {
            return Ok(());
        };
        if self.conn.primary() != written_at {
            return Err(unavailable(
                "the Redis primary changed while the write was made; nothing was acknowledged",
            ));
        }
        let lane = usize::from(partition) % self.promise.replication.len().max(1);
        let Some(replication) = self.promise.replication.get(lane) else {
            return Ok(());
        };
        let mut waits = self.waits.clone();
        replication
            .wait(
                &mut waits,
                &self.replication_mark(partition),
                written_at,
                min,
                wait,
            )
            .await
            .map_err(unavailable)
    }
}

/// Coalesced `WAIT`s: one at a time per lane (the server, or each partition on a cluster,
/// whose partitions live on different primaries).
pub(super) struct Replication {
    /// Writes answered so far (a ticket per caller).
    answered: AtomicU64,
    /// The last wait: the tickets it covered, the primary it ran on, whether enough replicas
    /// confirmed.
    last: tokio::sync::Mutex<(u64, Option<String>, Result<(), String>)>,
}

impl Default for Replication {
    fn default() -> Self {
        Self {
            answered: AtomicU64::new(0),
            last: tokio::sync::Mutex::new((0, None, Ok(()))),
        }
    }
}

impl Replication {
    async fn wait(
        &self,
        conn: &mut Conn,
        mark: &str,
        written_at: Option<String>,
        min: u16,
        wait: Duration,
    ) -> Result<(), String> {
        let ticket = self.answered.fetch_add(1, Ordering::AcqRel) + 1;
        let mut last = self.last.lock().await;
        if last.0 < ticket {
            // Every write answered until now is covered by a wait sent now.
            let covers = self.answered.load(Ordering::Acquire);
            let before = conn.primary();
            let confirmed = conn
                .mark_and_wait(mark, TTL_SLACK_MS, min, wait.as_millis() as u64)
                .await;
            let outcome = match confirmed {
                _ if conn.primary() != before => {
                    Err("the Redis primary changed during the wait for replicas".into())
                }
                Ok(n) if n >= u64::from(min) => Ok(()),
                Ok(n) => Err(format!(
                    "only {n} of {min} replica{} confirmed the write within {} ms; nothing was \
                     acknowledged (the platform retries, the retry is admitted once)",
                    if min == 1 { "" } else { "s" },
                    wait.as_millis()
                )),
                Err(e) => Err(format!("WAIT for replicas failed: {e}")),
            };
            if outcome.is_err() {
                metrics::counter!("oncegate_store_replica_waits_failed_total").increment(1);
            }
            *last = (covers, before, outcome);
        }
        if last.1 != written_at {
            return Err(
                "the Redis primary changed while the write was made; nothing was acknowledged"
                    .into(),
            );
        }
        last.2.clone()
    }
}

/// Rereads the promise every `CHECK_EVERY` while the store lives.
pub(super) fn watch<C: Send + Sync + 'static>(
    inner: std::sync::Weak<Inner<C>>,
    handle: &tokio::runtime::Handle,
) {
    handle.spawn(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if !inner.partitions_checked.load(Ordering::Relaxed) {
                // A lazy store that has not reached Redis: its first call checks.
                continue;
            }
            let mut conn = inner.conn.clone();
            if let Err(error) =
                tokio::time::timeout(inner.timeout * 2, inner.check_durability(&mut conn)).await
            {
                tracing::debug!(%error, "redis durability check: no answer in time");
            }
        }
    });
}
