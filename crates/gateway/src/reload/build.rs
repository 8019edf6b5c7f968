//! The dynamic part of a configuration — its webhook sources, what sends as them, its routes,
//! `dispatcher.max_queued` — built into what a gateway uses, beside what is in force: a source
//! or route the file describes as before is kept as it is (its connections, counters, replay
//! guard, gone state), the rest built anew. Nothing is in force until [`install`].

use std::collections::HashMap;
use std::sync::Arc;

use oncegate_config::Config;
use oncegate_core::Store;
use oncegate_core::store::millis;

use crate::reload::{Changes, Reloaded};
use crate::route::{Route, Routes};
use crate::{GatewayError, Retries, Shared, Source, StaleEvents, ingress, registry};

/// What a configuration's dynamic part builds, not yet in force.
pub(crate) struct Dynamic {
    sources: HashMap<String, Arc<Source>>,
    #[cfg(feature = "send")]
    senders: crate::api::Senders,
    #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
    keepers: crate::api::Keepers,
    /// The keepers built anew, which ready themselves once in force.
    #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
    pub(crate) new_keepers: crate::api::Keepers,
    routes: Vec<Arc<Route>>,
    /// Each app's bot id, for mentions.
    bots: Arc<HashMap<String, String>>,
    max_queued: Option<u64>,
    /// What changes against what is in force.
    pub(crate) report: Reloaded,
}

/// Builds `config`'s dynamic part beside what `shared` has in force. A multi-tenant source
/// built anew on a reload has its registry read before it is returned, so that it never takes
/// callbacks with an empty set (a registry that cannot be read refuses the reload); at start
/// the registry's first poll reads it, so that a gateway with a spool starts while the store
/// is down.
pub(crate) async fn build<S: Store>(
    config: &Config,
    shared: &Shared<S>,
    reloading: bool,
) -> Result<Dynamic, GatewayError> {
    let mut report = Reloaded {
        max_queued: config.dispatcher.max_queued,
        ..Reloaded::default()
    };
    let (sources, unchanged) = sources(config, shared, &mut report.sources, reloading).await?;
    #[cfg(feature = "send")]
    let senders = senders(config, shared, &unchanged)?;
    #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
    let (keepers, new_keepers) = keepers(config, shared, &unchanged)?;
    let _ = &unchanged;
    let routes = routes(config, shared, &mut report.routes).await?;
    Ok(Dynamic {
        sources,
        #[cfg(feature = "send")]
        senders,
        #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
        keepers,
        #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
        new_keepers,
        routes,
        bots: Arc::new(crate::registry::bot_ids(config)),
        max_queued: config.dispatcher.max_queued,
        report,
    })
}

/// Puts `dynamic` in force: each part swapped whole, the sources first (a callback of a new
/// source may then find its route a moment before that route is in force, never the reverse
/// of what it was admitted under: routes are read at delivery).
pub(crate) fn install<S>(shared: &Shared<S>, dynamic: Dynamic) -> Reloaded {
    shared
        .ingress
        .sources
        .store(Arc::new(ingress::Sources::of(dynamic.sources)));
    #[cfg(feature = "send")]
    shared.api.senders.store(Arc::new(dynamic.senders));
    #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
    shared.api.keepers.store(Arc::new(dynamic.keepers));
    shared
        .routes
        .store(Arc::new(Routes::of(dynamic.routes).with_bots(dynamic.bots)));
    shared.max_queued.store(
        dynamic.max_queued.unwrap_or(u64::MAX),
        std::sync::atomic::Ordering::Relaxed,
    );
    dynamic.report
}

/// The webhook sources, and the names of every source whose settings did not change (a long
/// connection is static: it never changes on a reload).
async fn sources<S: Store>(
    config: &Config,
    shared: &Shared<S>,
    changes: &mut Changes,
    reloading: bool,
) -> Result<(HashMap<String, Arc<Source>>, Vec<String>), GatewayError> {
    let current = shared.ingress.sources.load_full();
    let overlap_until = shared.now_ms() + millis(config.server.secret_overlap);
    let mut sources = HashMap::new();
    let mut unchanged = Vec::new();
    for source in &config.sources {
        if registry::is_long_connection(source) {
            unchanged.push(source.name.clone());
            continue;
        }
        let resolved = source.resolved().map_err(GatewayError::Config)?;
        let old = current.by_name.get(&source.name);
        if let Some(old) = old.filter(|old| old.origin.as_ref() == Some(&resolved)) {
            sources.insert(source.name.clone(), old.clone());
            unchanged.push(source.name.clone());
            changes.kept += 1;
            continue;
        }
        let mut new = Source::new(registry::source(source)?, shared.ingress.replay);
        match old {
            Some(old) => {
                if old.decoder.platform() == new.decoder.platform() {
                    new.replay = old.replay.clone();
                    new.answers = old.answers.clone();
                }
                if !config.server.secret_overlap.is_zero() {
                    new.previous = Some((old.decoder.clone(), overlap_until));
                }
                changes.changed.push(source.name.clone());
            }
            None => changes.added.push(source.name.clone()),
        }
        if let Some(set) = new.decoder.tenants().filter(|_| reloading) {
            let namespace = ingress::tenants::namespace(&source.name);
            ingress::tenants::load(&*shared.store, &namespace, &*set)
                .await
                .map_err(|error| {
                    GatewayError::Config(format!(
                        "source {:?}: its tenant registry could not be read ({error})",
                        source.name
                    ))
                })?;
        }
        new.origin = Some(resolved);
        sources.insert(source.name.clone(), Arc::new(new));
    }
    changes.removed = current
        .by_name
        .keys()
        .filter(|name| !sources.contains_key(*name))
        .cloned()
        .collect();
    changes.removed.sort();
    Ok((sources, unchanged))
}

/// What sends as each source: kept for a source that did not change (an AI bot's too, whose
/// connection is static), built anew for the rest.
#[cfg(feature = "send")]
fn senders<S: Store>(
    config: &Config,
    shared: &Shared<S>,
    unchanged: &[String],
) -> Result<crate::api::Senders, GatewayError> {
    let current = shared.api.senders.load_full();
    let mut senders = crate::api::Senders::new();
    for source in &config.sources {
        let kept = unchanged
            .contains(&source.name)
            .then(|| current.get(&source.name).cloned())
            .flatten();
        let sender = match kept {
            Some(sender) => Some(sender),
            None => registry::sender(source, config.api.send_timeout)?.map(Arc::new),
        };
        if let Some(sender) = sender {
            senders.insert(source.name.clone(), sender);
        }
    }
    Ok(senders)
}

/// The multi-tenant sources' keepers, and which of them are new.
#[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
fn keepers<S: Store>(
    config: &Config,
    shared: &Shared<S>,
    unchanged: &[String],
) -> Result<(crate::api::Keepers, crate::api::Keepers), GatewayError> {
    let current = shared.api.keepers.load_full();
    let (mut keepers, mut new) = (crate::api::Keepers::new(), crate::api::Keepers::new());
    for source in &config.sources {
        if unchanged.contains(&source.name)
            && let Some(kept) = current.get(&source.name)
        {
            keepers.insert(source.name.clone(), kept.clone());
            continue;
        }
        if let Some(keeper) = registry::keeper(source, &shared.store, config.api.send_timeout)? {
            keepers.insert(source.name.clone(), keeper.clone());
            new.insert(source.name.clone(), keeper);
        }
    }
    Ok((keepers, new))
}

/// The routes, in the file's order: one the file describes as a route in force describes it
/// is that route (its sink, its connections, its gone state); the rest are built anew.
async fn routes<S>(
    config: &Config,
    shared: &Shared<S>,
    changes: &mut Changes,
) -> Result<Vec<Arc<Route>>, GatewayError> {
    let current = shared.routes.load_full();
    let mut unused: Vec<Option<&Arc<Route>>> = current.list.iter().map(Some).collect();
    let mut routes = Vec::with_capacity(config.routes.len());
    for (index, settings) in config.routes.iter().enumerate() {
        let resolved = settings.resolved().map_err(GatewayError::Config)?;
        let same = unused
            .iter_mut()
            .find(|old| old.is_some_and(|old| old.origin.as_ref() == Some(&resolved)))
            .and_then(Option::take);
        if let Some(old) = same {
            routes.push(old.clone());
            changes.kept += 1;
            continue;
        }
        let sink = crate::sink::configured::of_route(settings).await?;
        let patterns: Vec<&str> = settings.events.iter().map(String::as_str).collect();
        let stale = match settings.watermark && !settings.reply {
            true => StaleEvents::Drop,
            false => StaleEvents::Deliver,
        };
        let mut route = Route::new(&patterns, sink, stale, settings.reply);
        if !settings.reply {
            route.retries = Retries {
                schedule: settings.retry_schedule.as_ref().map(|s| s.0.clone()),
                hold_chat: settings.hold_chat,
            };
        }
        route.tenants = settings.tenants.clone();
        route.agents = settings.agents.clone();
        route.priority = settings.priority;
        route.origin = Some(resolved);
        routes.push(Arc::new(route));
        changes
            .added
            .push(format!("route {index} ({})", settings.events.join(", ")));
    }
    changes.removed = unused
        .iter()
        .flatten()
        .map(|old| format!("route ({})", old.patterns.join(", ")))
        .collect();
    Ok(routes)
}
