//! Running a gateway: its listeners, the dispatcher, and the work beside them.

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use oncegate_core::Store;

use crate::{Gateway, GatewayError, Shared, admin, api, dispatch, ingress, server};

impl<S: Store> Gateway<S> {
    /// Serves callbacks on `listener` and the admin API on `admin` until `shutdown` is
    /// cancelled; requests in progress may finish within the shutdown grace.
    pub async fn serve(
        &self,
        listener: TcpListener,
        admin: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        let webhooks = self.serve_webhooks(listener, shutdown.clone());
        let admin = self.serve_on("admin", admin, self.admin_router(), shutdown.clone());
        let (a, b, ()) = tokio::join!(webhooks, admin, self.background(shutdown));
        a?;
        b?;
        Ok(())
    }

    /// Serves the callback routes on `listener` until `shutdown`, with the listeners' bounds
    /// and deadlines.
    pub async fn serve_webhooks(
        &self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        self.serve_on("webhooks", listener, self.webhooks_router(), shutdown)
            .await
    }

    /// Serves the API on `listener` until `shutdown`, with the listeners' bounds and deadlines.
    pub async fn serve_api(
        &self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        self.serve_on("api", listener, self.api_router(), shutdown)
            .await
    }

    /// Serves `router` on `listener` as the listener `name`, with the listeners' bounds and
    /// deadlines.
    async fn serve_on(
        &self,
        name: &'static str,
        listener: TcpListener,
        router: axum::Router,
        shutdown: CancellationToken,
    ) -> Result<(), GatewayError> {
        let shared = &self.shared;
        server::serve(
            name,
            listener,
            router,
            shared.limits.clone(),
            shared.summaries.clone(),
            shutdown,
        )
        .await?;
        Ok(())
    }

    /// The work beside the listeners until `shutdown`: metrics registered, the queue's depth
    /// and history sampled, summaries logged, long connections held, tenant registries read.
    pub async fn background(&self, shutdown: CancellationToken) {
        let shared = &self.shared;
        shared.meters.register();
        shared.store.register();
        #[cfg(feature = "send")]
        api::send::register(shared.api.senders.load().keys());
        dispatch::routes::register(&shared.routes.load());
        api::register(shared.api.callers.iter().map(|c| c.name.as_str()));
        // Each webhook source's accepted answers at 0: a rate over them is right from the
        // first callback.
        for (name, source) in &shared.ingress.sources.load().by_name {
            metrics::counter!("oncegate_callbacks_total", "source" => name.clone(), "platform" => source.decoder.platform().to_owned(), "status" => "200").increment(0);
        }
        tokio::join!(
            ingress::admission::watch_queue(shared.clone(), shutdown.clone()),
            admin::queue_view::watch(shared.clone(), shutdown.clone()),
            admin::history::watch(shared.clone(), shutdown.clone()),
            shared.summaries.run(shutdown.clone()),
            long_connections(shared, shutdown.clone()),
            ingress::tenants::sync(shared.clone(), shutdown.clone()),
            api::results::keep_ledgers(shared.clone(), shutdown.clone()),
            keepers_at_start(shared),
        );
    }

    /// Runs the dispatcher until `shutdown` is cancelled, then lets running handlers finish
    /// within the shutdown grace and releases what is left. If one of its tasks ends early
    /// (a panic), readiness fails, `shutdown` is cancelled and the reason is returned.
    pub async fn dispatch(&self, shutdown: CancellationToken) -> Result<(), GatewayError> {
        let shared = &self.shared;
        let supervised = |name: &'static str, task: tokio::task::JoinHandle<Result<(), String>>| {
            let (shared, shutdown) = (shared.clone(), shutdown.clone());
            async move {
                let ended = task.await;
                let reason = match ended {
                    Ok(Ok(())) if shutdown.is_cancelled() => return Ok(()),
                    Ok(Ok(())) => format!("the {name} stopped before shutdown"),
                    Ok(Err(reason)) => format!("the {name} stopped: {reason}"),
                    Err(error) if error.is_panic() => format!("the {name} panicked"),
                    Err(_) => format!("the {name} was cancelled"),
                };
                shared.fail(reason.clone());
                shutdown.cancel();
                Err(GatewayError::Stopped(reason))
            }
        };
        let dispatcher = tokio::spawn(dispatch::run(shared.clone(), shutdown.clone()));
        let drain = {
            let (shared, shutdown) = (shared.clone(), shutdown.clone());
            tokio::spawn(async move {
                ingress::spooling::drain(shared, shutdown).await;
                Ok(())
            })
        };
        let watch = {
            let (shared, shutdown) = (shared.clone(), shutdown.clone());
            tokio::spawn(async move { watch_store(&shared, shutdown).await })
        };
        let (a, b, c) = tokio::join!(
            supervised("dispatcher", dispatcher),
            supervised("spool drain", drain),
            supervised("store", watch),
        );
        a.and(b).and(c)
    }
}

/// Ends (with the reason) once the store says it cannot go on in this process, so that the
/// gateway stops and its supervisor starts it again: a gateway that only answered 503 would
/// wait for a restart nobody makes, with acknowledged events undelivered.
async fn watch_store<S: Store>(
    shared: &Shared<S>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let mut every = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = every.tick() => {}
        }
        if let Some(why) = shared.store.broken() {
            return Err(format!(
                "{why}; stopping, for the supervisor to start oncegate again once that is fixed \
                 (what was acknowledged is in the store and is delivered then)"
            ));
        }
    }
}

/// Holds the long connections until `shutdown` (none in a build without them).
async fn long_connections<S: Store>(
    shared: &std::sync::Arc<Shared<crate::base::timed_store::Timed<S>>>,
    shutdown: CancellationToken,
) {
    #[cfg(feature = "long-connection")]
    ingress::longconn::run_all(shared.clone(), shutdown).await;
    #[cfg(not(feature = "long-connection"))]
    let _ = (shared, shutdown);
}

/// The multi-tenant sources' keepers ready their credentials (a store app's ticket).
async fn keepers_at_start<S: Store>(shared: &Shared<S>) {
    #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
    crate::credentials::at_start(&shared.api.keepers.load_full()).await;
    let _ = shared;
}
