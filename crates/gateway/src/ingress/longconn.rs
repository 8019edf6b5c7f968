//! The long connections in the gateway, whatever their platform (a [`Transport`] the registry
//! built): their events take the one admission path and synchronous calls the claim protocol,
//! like webhooks' do. With `instances = "leader"` one gateway of several holds a source's
//! connections, through a lease in the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bytes::Bytes;
use oncegate_config::Instances;
use oncegate_core::{Accepted, Admit, FenceCheck, Inlet, Refusal, SharedInlet, Store, key_for};
use oncegate_longconn::{Ended, Status, Transport};
use oncegate_once::{Claimed, OnceKey};
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// The longest leader lease: how long connections may go unheld after a leader dies.
const LEADER_LEASE: Duration = Duration::from_secs(15);
/// A gateway that is not the leader asks for the lease this often.
const STANDBY_POLL: Duration = Duration::from_secs(2);
/// A bot taken over twice within this, while this gateway held its lease, is held by a client
/// outside the gateways sharing the store: dialling on would kick it and be kicked for ever.
const KICK_WINDOW: Duration = Duration::from_secs(60);

/// One configured long-connection source.
pub(crate) struct LongSource {
    pub(crate) name: String,
    transport: Box<dyn Transport>,
    pub(crate) instances: Instances,
    pub(crate) status: Arc<Status>,
    role: AtomicU8,
    /// What `/send/<name>` sends as when the connection carries the sends (an AI bot's):
    /// taken when the gateway is assembled.
    #[cfg(feature = "send")]
    pub(crate) sender: Option<crate::api::send::Sender>,
}

const ROLE_CONNECTING: u8 = 0;
const ROLE_LEADING: u8 = 1;
const ROLE_STANDBY: u8 = 2;

impl LongSource {
    pub(crate) fn new(name: &str, transport: impl Transport, instances: Instances) -> Self {
        Self::boxed(name, Box::new(transport), instances)
    }

    /// [`LongSource::new`] for a transport already boxed (the Rust SDK's).
    pub(crate) fn boxed(name: &str, transport: Box<dyn Transport>, instances: Instances) -> Self {
        Self {
            name: name.to_owned(),
            transport,
            instances,
            status: Arc::new(Status::default()),
            role: AtomicU8::new(ROLE_CONNECTING),
            #[cfg(feature = "send")]
            sender: None,
        }
    }

    /// The source with what `/send/<name>` sends as over its connection.
    #[cfg(feature = "send")]
    pub(crate) fn with_sender(mut self, sender: crate::api::send::Sender) -> Self {
        self.sender = Some(sender);
        self
    }

    /// The lease one gateway of several holds the connections under.
    fn leader_key(&self) -> oncegate_core::KeyHash {
        key_for(
            self.transport.platform(),
            self.transport.app(),
            "leader",
            "long_connection",
        )
    }

    /// Why this source keeps the gateway from being ready, if it does.
    pub(crate) fn not_ready(&self) -> Option<String> {
        if let Some(fatal) = self.status.fatal() {
            return Some(format!("long connection {}: {fatal}", self.name));
        }
        let standby = self.role.load(Ordering::Relaxed) == ROLE_STANDBY;
        (!standby && self.status.open() == 0)
            .then(|| format!("long connection {}: no connection open yet", self.name))
    }

    /// `leading`, `standby` or `all`, for the status answers.
    pub(crate) fn role(&self) -> &'static str {
        match (self.instances, self.role.load(Ordering::Relaxed)) {
            (Instances::All, _) => "all",
            (Instances::Leader, ROLE_LEADING) => "leading",
            (Instances::Leader, ROLE_STANDBY) => "standby",
            (Instances::Leader, _) => "electing",
        }
    }
}

/// The gateway as the long connection's inlet; `bound`: whether its admissions keep to
/// `dispatcher.max_queued` (not those of a platform that never pushes an event again).
struct GatewayInlet<S>(Arc<Shared<S>>, crate::ingress::admission::Bound);

impl<S: Store> Inlet for GatewayInlet<S> {
    async fn admit(&self, admit: Admit) -> Result<Accepted, Refusal> {
        // The frame was decoded just before: its trace starts here.
        let received = self.0.traces.on().then(std::time::SystemTime::now);
        crate::ingress::admission::admit_traced(&self.0, admit, received, self.1).await
    }

    async fn call(&self, admit: Admit, deadline: Duration) -> Result<Option<Bytes>, Refusal> {
        crate::ingress::sync_call::call(&self.0, admit, deadline).await
    }

    fn replies(&self, event: &oncegate_core::Event) -> bool {
        let routes = self.0.routes.load();
        routes.replying
            && routes
                .route_for(&event.event_type, crate::registry::owner::of(event))
                .is_some_and(|route| route.reply)
    }

    /// The budgets are named within the app, as `/send` names its own: a reply and a send to
    /// one conversation spend one budget.
    async fn reply(
        &self,
        admit: Admit,
        deadline: Duration,
        budgets: Vec<(String, oncegate_core::Rate)>,
        updates: oncegate_core::Updates,
        deliver: oncegate_core::Deliver,
    ) -> Result<oncegate_core::Replied, Refusal> {
        let budgets: Vec<(oncegate_core::KeyHash, oncegate_core::Rate)> = budgets
            .iter()
            .map(|(name, rate)| (crate::api::budget::bucket(&admit.event.app, name), *rate))
            .collect();
        crate::ingress::sync_call::reply(&self.0, admit, deadline, &budgets, &updates, deliver)
            .await
    }

    fn note(&self, label: &'static str, message: &str) {
        self.0.summaries.note(label, None, message);
    }
}

/// Holds every long-connection source's connections until `shutdown`.
pub(crate) async fn run_all<S: Store>(shared: Arc<Shared<S>>, shutdown: CancellationToken) {
    let mut running = tokio::task::JoinSet::new();
    for index in 0..shared.ingress.long_sources.len() {
        let (shared, shutdown) = (shared.clone(), shutdown.clone());
        running.spawn(async move {
            let source = &shared.ingress.long_sources[index];
            match source.instances {
                Instances::All => {
                    connect(&shared, source, shutdown).await;
                }
                Instances::Leader => lead(&shared, source, shutdown).await,
            }
        });
    }
    while running.join_next().await.is_some() {}
}

/// Holds `source`'s connections until `stop`.
async fn connect<S: Store>(
    shared: &Arc<Shared<S>>,
    source: &LongSource,
    stop: CancellationToken,
) -> Ended {
    let bound = if source.transport.redelivers() {
        crate::ingress::admission::Bound::Keep
    } else {
        crate::ingress::admission::Bound::Exceed
    };
    let inlet = SharedInlet::new(GatewayInlet(shared.clone(), bound));
    match source
        .transport
        .hold(inlet, source.status.clone(), stop)
        .await
    {
        Ok(ended) => ended,
        Err(error) => {
            shared.fail(format!("long connection {}: {error}", source.name));
            Ended::Stopped
        }
    }
}

/// Holds the lease of `source`'s connections while it can, and the connections with it; waits
/// as a standby otherwise. The lease is released at shutdown, so that another gateway takes
/// over at once instead of when it runs out.
async fn lead<S: Store>(shared: &Arc<Shared<S>>, source: &LongSource, shutdown: CancellationToken) {
    let key = source.leader_key();
    // A leader that dies is replaced when its lease runs out: not the minutes a handler's
    // lease may take.
    let lease_for = shared.timing.lease.min(LEADER_LEASE);
    let renew_every = lease_for / 3;
    let claiming = OnceKey::new(key, 0)
        .lease(lease_for)
        .renew_every(renew_every);
    loop {
        let claimed = tokio::select! {
            _ = shutdown.cancelled() => return,
            claimed = shared.once.claim(claiming) => claimed,
        };
        let lease = match claimed {
            Ok(Claimed::Run(lease)) => lease,
            Ok(_) => {
                source.role.store(ROLE_STANDBY, Ordering::Relaxed);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(STANDBY_POLL) => continue,
                }
            }
            Err(error) => {
                shared.summaries.note(
                    "leader_claim_failed",
                    None,
                    &format!("long connection {}: leader lease: {error}", source.name),
                );
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(STANDBY_POLL) => continue,
                }
            }
        };
        tracing::info!(source = %source.name, "leading: this gateway holds the long connections");
        source.role.store(ROLE_LEADING, Ordering::Relaxed);
        let stop = shutdown.child_token();
        let connections = hold(shared, source, &lease, stop.clone());
        tokio::pin!(connections);
        tokio::select! {
            _ = &mut connections => {}
            // Another gateway holds it now, or the store cannot tell us we still do: let go,
            // rather than hold connections on a lease that may be gone.
            why = lease.keep() => {
                tracing::warn!(source = %source.name, "no longer leading: {why}");
                stop.cancel();
                connections.await;
            }
        }
        source.role.store(ROLE_STANDBY, Ordering::Relaxed);
        // Let go at once (refused harmlessly when another gateway took it over): the next
        // leader need not wait for the lease to run out.
        let _ = lease.release().await;
        // A fatal answer (wrong credentials, too many connections) would be the same for any
        // gateway: stop.
        if shutdown.is_cancelled() || source.status.fatal().is_some() {
            return;
        }
    }
}

/// Holds `source`'s connections under `lease` until they stop. An AI bot taken over is dialled
/// again (after a pause) only while the lease is still this gateway's: when another gateway
/// holds it, the takeover was its doing, and this one stands by. The connection dialled again
/// after a takeover, taken over in its turn within [`KICK_WINDOW`] while holding the lease:
/// the bot is held by a client outside the gateways, and the connection stops and says so
/// rather than kick it back for ever. A connection lost and dialled again in between (the
/// server restarted, as a local test server does between runs) starts the count again: two
/// takeovers of two sessions are not a fight.
async fn hold<S: Store>(
    shared: &Arc<Shared<S>>,
    source: &LongSource,
    lease: &oncegate_once::Held<S>,
    stop: CancellationToken,
) {
    // When the last takeover came, and the reconnect count then.
    let mut kicked_at: Option<(std::time::Instant, u64)> = None;
    loop {
        if connect(shared, source, stop.clone()).await == Ended::Stopped {
            return;
        }
        match lease.renew().await {
            Ok(FenceCheck::Accepted) => {}
            _ => {
                tracing::info!(source = %source.name, "taken over by the gateway that holds the lease now: standing by");
                return;
            }
        }
        let reconnects = source.status.reconnects();
        if kicked_at.is_some_and(|(at, then)| at.elapsed() < KICK_WINDOW && then == reconnects) {
            let why = format!(
                "taken over twice within {}s while this gateway held the bot's lease: a client \
                 outside the gateways sharing this store subscribes as the same bot (WeCom keeps \
                 one connection per bot); stop it, then restart this gateway",
                KICK_WINDOW.as_secs()
            );
            tracing::error!(source = %source.name, "long connection stopped: {why}");
            source.status.set_fatal(why);
            return;
        }
        kicked_at = Some((std::time::Instant::now(), reconnects));
        shared.summaries.note(
            "ws_taken_over",
            None,
            &format!(
                "long connection {}: taken over by a subscribe elsewhere while this gateway holds \
                 the bot's lease; dialling again once",
                source.name
            ),
        );
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(oncegate_longconn::backoff(Duration::ZERO, 1)) => {}
        }
    }
}
