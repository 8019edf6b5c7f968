//! `oncegate serve`: the gateway.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use oncegate_config::{Config, Severity, StoreConfig};
use oncegate_core::Store;
use oncegate_gateway::Gateway;
use oncegate_memory::{MemoryConfig, MemoryStore};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Loads and checks the configuration, opens the store, and runs until SIGINT or SIGTERM.
pub(crate) async fn serve(config_path: Option<&Path>) -> anyhow::Result<()> {
    let config = crate::load(config_path)?;
    let problems = oncegate_config::validate(&config);
    for problem in &problems {
        // The level says error or warning; "at risk" is said, it is more than a level.
        let (setting, message) = (&problem.setting, &problem.message);
        match problem.severity {
            Severity::Error => tracing::error!("{setting}: {message}"),
            Severity::Warning => tracing::warn!("{setting}: {message}"),
            Severity::AtRisk => tracing::warn!("at risk: {setting}: {message}"),
        }
    }
    if problems.iter().any(|p| p.severity == Severity::Error) {
        bail!(
            "the configuration has errors (listed above); `oncegate check-config` shows them too"
        );
    }
    let metrics = oncegate_gateway::MetricsRecorder::new()
        .install()
        .map_err(anyhow::Error::msg)?;
    // Histograms other than `_seconds` ones wait in the exporter until its upkeep folds them
    // into their summaries: without it they would pile up between scrapes (or forever).
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let render = move || metrics.render();
    match &config.store {
        StoreConfig::Embedded(settings) => {
            let store = crate::store_files::open_embedded(settings)?;
            tracing::info!(path = %settings.path.display(), "embedded store open");
            run(&config, config_path, store, None, None, render).await
        }
        StoreConfig::Memory(settings) => {
            let store = MemoryStore::with_clock(
                MemoryConfig {
                    partitions: settings.partitions,
                    max_records: settings.max_records,
                    ..MemoryConfig::default()
                },
                oncegate_core::SystemClock,
            );
            tracing::warn!("memory store: everything is forgotten when the gateway stops");
            run(&config, config_path, store, None, None, render).await
        }
        StoreConfig::Redis(settings) => {
            let defaults = oncegate_redis::RedisConfig::at(&settings.url);
            let redis_config = oncegate_redis::RedisConfig {
                partitions: settings.partitions,
                prefix: settings.prefix.clone().unwrap_or(defaults.prefix.clone()),
                ownership: settings.ownership.unwrap_or(defaults.ownership),
                handover: settings.handover.unwrap_or(defaults.handover),
                durability: crate::redis_durability(settings),
                cluster: settings.cluster,
                // With a spool the gateway takes requests during an outage, so it also starts
                // during one.
                lazy: settings.spool.is_some(),
                // Owners and handovers name gateways as their logs do.
                name: Some(config.log.instance_name()),
                ..defaults
            };
            // Every gateway on this Redis judges time by the server's clock (leases, ownership,
            // retries, replay windows): a machine whose clock is off or steps cannot take over
            // a lease another gateway still holds.
            let clock = oncegate_core::SteadyClock::from_system();
            let store = tokio::task::block_in_place(|| {
                oncegate_redis::RedisStore::connect_on(
                    redis_config,
                    clock.clone(),
                    tokio::runtime::Handle::current(),
                )
            })?;
            tracing::info!(
                gateway = store.name(),
                "on Redis as {}: owners and handovers name this gateway so",
                store.name()
            );
            match store.sync_clock(&clock).await {
                Ok(()) => {
                    let off = oncegate_core::Clock::now_ms(&clock) as i64
                        - oncegate_core::Clock::now_ms(&oncegate_core::SystemClock) as i64;
                    if off.abs() > 1_000 {
                        tracing::warn!(
                            off_ms = off,
                            "this machine's clock is {off} ms off the Redis server's; the gateway \
                             judges time by the server's"
                        );
                    }
                }
                Err(error) => tracing::warn!(
                    "the Redis server's clock could not be read yet ({error}); the machine's \
                     clock stands in until it can"
                ),
            }
            store.follow_clock(clock.clone());
            let shown = oncegate_core::redact::url(&settings.url);
            if settings.spool.is_some() {
                tracing::info!(url = %shown, cluster = settings.cluster, "redis store: connecting on first use (a spool is configured)");
            } else {
                tracing::info!(url = %shown, cluster = settings.cluster, "redis store connected");
            }
            let spool = settings
                .spool
                .as_deref()
                .map(|path| (path, settings.spool_max));
            run(
                &config,
                config_path,
                store,
                spool,
                Some(Arc::new(clock)),
                render,
            )
            .await
        }
    }
}

async fn run<S: Store>(
    config: &Config,
    config_path: Option<&Path>,
    store: S,
    spool: Option<(&Path, u64)>,
    clock: Option<Arc<dyn oncegate_core::Clock>>,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> anyhow::Result<()> {
    say_durability(&store);
    let mut gateway = Gateway::from_config(config, store).await?.metrics(render)?;
    if let Some(path) = config_path {
        // SIGHUP and `oncegate reload` read the same file, with the same overrides.
        let path = path.to_owned();
        gateway = gateway.reload_from(Box::new(move || {
            crate::load(Some(&path)).map_err(|error| format!("{error:#}"))
        }))?;
    }
    let exporting = match crate::telemetry::start(&config.telemetry)? {
        Some((traces, exporting)) => {
            gateway = gateway.traces(traces)?;
            Some(exporting)
        }
        None => None,
    };
    if let Some(clock) = clock {
        gateway = gateway.with_clock(clock)?;
    }
    if let Some((path, spool_max)) = spool {
        let spool = oncegate_gateway::Spool::open(path, spool_max)
            .with_context(|| format!("open the spool (store.spool = {})", path.display()))?;
        if !spool.is_empty() {
            tracing::info!(
                waiting = spool.len(),
                "spooled admissions from an earlier run wait for the store"
            );
        }
        tracing::info!(path = %path.display(), "admissions are spooled while the store is unreachable");
        gateway = gateway.spool(spool)?;
    }
    let listener = TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("listen on {} (server.listen)", config.server.listen))?;
    let admin = TcpListener::bind(&config.server.admin_listen)
        .await
        .with_context(|| {
            format!(
                "listen on {} (server.admin_listen)",
                config.server.admin_listen
            )
        })?;
    let api = match gateway.has_api() {
        true => Some(
            TcpListener::bind(&config.api.listen)
                .await
                .with_context(|| format!("listen on {} (api.listen)", config.api.listen))?,
        ),
        false => None,
    };
    banner(
        config,
        listener.local_addr()?,
        admin.local_addr()?,
        api.as_ref().map(TcpListener::local_addr).transpose()?,
    );
    let shutdown = CancellationToken::new();
    let api = api.map(|api| {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.serve_api(api, shutdown).await })
    });
    tokio::spawn(on_signals(shutdown.clone()));
    tokio::spawn(on_hangups(gateway.clone()));
    let dispatcher = {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.dispatch(shutdown).await })
    };
    // A dispatcher that ends early cancels `shutdown`, so serving stops too and the process
    // exits non-zero instead of answering 200 for events nobody delivers.
    let served = gateway.serve(listener, admin, shutdown.clone()).await;
    shutdown.cancel();
    let dispatched = dispatcher
        .await
        .context("the dispatcher stopped abnormally")?;
    if let Some(api) = api {
        api.await.context("the API listener stopped abnormally")??;
    }
    if let Some(exporting) = exporting {
        // The exporter's own thread blocks while it sends the last batch.
        tokio::task::spawn_blocking(move || exporting.stop())
            .await
            .ok();
    }
    served?;
    dispatched?;
    // Figures as fields (numbers in JSON), not a struct's Debug dump.
    let stats = gateway.stats();
    tracing::info!(
        requests = stats.requests,
        admitted = stats.admitted,
        duplicates = stats.duplicates,
        delivered = stats.delivered,
        retries = stats.retries,
        dead_letters = stats.dead_letters,
        refused = stats.bad_requests + stats.replays_rejected + stats.stale_timestamps,
        "stopped"
    );
    Ok(())
}

/// The first line on stdout, which scripts and tests read the bound addresses from: plain text,
/// or with `log.format = "json"` a JSON object like the log's lines (a collector that reads a
/// container's output as JSON lines meets nothing else).
fn banner(
    config: &Config,
    listen: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    api: Option<std::net::SocketAddr>,
) {
    let line = match config.log.format {
        oncegate_config::LogFormat::Json => {
            let mut timestamp = String::new();
            {
                use tracing_subscriber::fmt::time::FormatTime as _;
                let mut writer = tracing_subscriber::fmt::format::Writer::new(&mut timestamp);
                let _ = tracing_subscriber::fmt::time::SystemTime.format_time(&mut writer);
            }
            serde_json::json!({
                "instance": config.log.instance_name(),
                "timestamp": timestamp,
                "level": "INFO",
                "message": "oncegate listening",
                "listen": format!("http://{listen}"),
                "webhooks": format!("http://{listen}/webhook/<source>"),
                "admin": format!("http://{admin}"),
                "status_page": format!("http://{admin}/status"),
                "api": api.map(|api| format!("http://{api}")),
            })
            .to_string()
        }
        _ => {
            let api = api.map_or_else(String::new, |api| format!(", api on http://{api}"));
            format!(
                "oncegate listening on http://{listen} (webhooks at /webhook/<source>), admin on http://{admin} (status page at /status){api}"
            )
        }
    };
    // A stdout route writes its events as JSON lines there: the banner must not be one of
    // them.
    match config
        .routes
        .iter()
        .any(|r| r.sink == oncegate_config::SinkKind::Stdout)
    {
        true => eprintln!("{line}"),
        false => println!("{line}"),
    }
}

/// Says at start what the store keeps of what the gateway acknowledges: an error when the
/// promise does not hold (acknowledgements are refused until it does), a warning naming what
/// can be lost when the mode allows losses.
fn say_durability<S: Store>(store: &S) {
    let durability = store.durability();
    metrics::gauge!("oncegate_store_durability_holds", "mode" => durability.mode)
        .set(if durability.holds { 1.0 } else { 0.0 });
    metrics::gauge!("oncegate_store_durability_at_risk", "mode" => durability.mode).set(
        if durability.at_risk.is_some() {
            1.0
        } else {
            0.0
        },
    );
    match (&durability.at_risk, durability.holds) {
        (_, false) => tracing::error!(
            mode = durability.mode,
            "durability does not hold, acknowledgements are refused until it does: {}",
            durability.detail
        ),
        (Some(at_risk), true) => tracing::warn!(
            mode = durability.mode,
            "durability: {}; acknowledged events this can lose: {at_risk}",
            durability.detail
        ),
        (None, true) => tracing::info!(mode = durability.mode, "durability: {}", durability.detail),
    }
}

/// Each SIGHUP reloads the configuration file (the reload logs what changed, or why nothing
/// did).
async fn on_hangups<S: Store>(gateway: Gateway<S>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler; reload with `oncegate reload`");
        return;
    };
    while hangups.recv().await.is_some() {
        tracing::info!("SIGHUP: reloading the configuration");
        // Said in the log and counted by the reload itself.
        let _ = gateway.reload().await;
    }
}

/// The first SIGINT or SIGTERM starts a graceful shutdown; a second one exits at once.
async fn on_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the gateway with SIGKILL");
        return;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!(
        "shutting down: no new work, running requests and handlers may finish \
         (dispatcher.shutdown_grace); a second signal exits at once"
    );
    shutdown.cancel();
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    tracing::warn!("second signal: exiting now; unfinished handlers run again after a restart");
    std::process::exit(130);
}
