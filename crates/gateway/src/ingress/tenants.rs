//! The tenant registry: the tenants of a source that serves many (a WeCom suite's corps) live
//! in the store, under `tenants:<source>`, changed by the admin API (`/admin/tenants`,
//! `oncegate tenants`) or by the platform's lifecycle events, and read by every gateway on the
//! store. Each gateway polls the namespace's generation (one O(1) call per source and poll)
//! and reads the registry again only when it moved: a change reaches every gateway within a
//! poll, without a restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use oncegate_core::state::MAX_LIST;
use oncegate_core::{
    Changed, Event, Expect, StateStore, Store, StoreError, TenancyChange, TenantSet,
};
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// How often each gateway asks whether a registry changed.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// The store namespace of `source`'s tenants.
pub(crate) fn namespace(source: &str) -> String {
    format!("tenants:{source}")
}

/// Whether a tenant with these settings is served: not `{"disabled": true}`.
pub(crate) fn enabled(settings: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(settings)
        .map_or(true, |doc| doc["disabled"] != serde_json::Value::Bool(true))
}

/// Every tenant of `namespace` that is served (not disabled), with its settings, page by page.
async fn all<S: StateStore>(
    store: &S,
    namespace: &str,
) -> Result<Vec<(String, bytes::Bytes)>, StoreError> {
    let mut tenants = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .state_list(namespace, after.as_deref(), MAX_LIST)
            .await?;
        let full = page.len() == MAX_LIST;
        after = page.last().map(|(name, _)| name.clone());
        tenants.extend(
            page.into_iter()
                .filter(|(_, kept)| enabled(&kept.value))
                .map(|(name, kept)| (name, kept.value)),
        );
        if !full {
            return Ok(tenants);
        }
    }
}

/// Reads the registry `namespace` into `set`: the tenants served after it. A tenant whose
/// settings the set cannot serve (a template's corp without its secrets) is left out, said in
/// the log, and its callbacks are refused as a stranger's.
pub(crate) async fn load<S: StateStore>(
    store: &S,
    namespace: &str,
    set: &dyn TenantSet,
) -> Result<usize, StoreError> {
    let tenants = all(store, namespace).await?;
    let left_out = set.replace_with_settings(tenants);
    for (tenant, why) in left_out.iter().take(8) {
        tracing::warn!(registry = namespace, tenant = %tenant, "a tenant is not served: {why}");
    }
    if left_out.len() > 8 {
        tracing::warn!(
            registry = namespace,
            more = left_out.len() - 8,
            "more tenants are not served for their settings"
        );
    }
    Ok(set.len())
}

/// Keeps every multi-tenant source's set current until `shutdown`; a registry that cannot be
/// read keeps its last set (said in the summary log) and is read again at the next poll. The
/// sources are those in force at each poll: a set a reload put in is read at once.
pub(crate) async fn sync<S: Store>(shared: Arc<Shared<S>>, shutdown: CancellationToken) {
    // By namespace: the generation read last, and for which set (a reload brings new ones).
    let mut loaded: HashMap<String, (u64, usize)> = HashMap::new();
    let mut every = tokio::time::interval(POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        let sets: Vec<(String, Arc<dyn TenantSet>)> = {
            let sources = shared.ingress.sources.load();
            sources
                .multi_tenant
                .iter()
                .filter_map(|name| {
                    let set = sources.by_name.get(name)?.decoder.tenants()?;
                    Some((namespace(name), set))
                })
                .collect()
        };
        for (namespace, set) in sets {
            // The set's address tells a set a reload put in from the one read before.
            let identity = Arc::as_ptr(&set).cast::<()>() as usize;
            let read = async {
                let generation = shared.store.state_generation(&namespace).await?;
                if loaded.get(&namespace) == Some(&(generation, identity)) {
                    return Ok(None);
                }
                let served = load(&*shared.store, &namespace, &*set).await?;
                Ok::<_, StoreError>(Some((generation, served)))
            };
            match read.await {
                Ok(Some((generation, served))) => {
                    metrics::gauge!("oncegate_tenants", "registry" => namespace.clone())
                        .set(served as f64);
                    loaded.insert(namespace, (generation, identity));
                }
                Ok(None) => {}
                Err(error) => shared.summaries.note(
                    "tenants_unreadable",
                    None,
                    &format!(
                        "the tenant registry {namespace} could not be read ({error}); its last \
                         tenants stay in force"
                    ),
                ),
            }
        }
    }
}

/// The store namespace of `source`'s platform tickets.
pub(crate) fn tickets(source: &str) -> String {
    format!("tickets:{source}")
}

/// Applies what `event` changes in the tenancy of the multi-tenant source it came from, before
/// it goes to its route; an error leaves the event to be retried. Nothing for other events.
/// The answer is the payload routes get instead of the event's when it carried a credential
/// the gateway keeps (a ticket, an authorisation code): redacted.
pub(crate) async fn apply<S: Store>(
    shared: &Shared<S>,
    event: &Event,
) -> Result<Option<bytes::Bytes>, StoreError> {
    // Every event passes here: a gateway with no multi-tenant source pays one guard load.
    if shared.ingress.sources.load().multi_tenant.is_empty() {
        return Ok(None);
    }
    let sources = shared.ingress.sources.load_full();
    for name in &sources.multi_tenant {
        let Some(source) = sources.by_name.get(name) else {
            continue;
        };
        if let Some(change) = source.decoder.tenancy(event) {
            change_tenancy(shared, name, change).await?;
            return Ok(source.decoder.redacted(event));
        }
    }
    Ok(None)
}

async fn change_tenancy<S: Store>(
    shared: &Shared<S>,
    source: &str,
    change: TenancyChange,
) -> Result<(), StoreError> {
    match change {
        TenancyChange::Ticket {
            ticket,
            issued_secs,
            life,
        } => keep_ticket(&*shared.store, &tickets(source), &ticket, issued_secs, life).await,
        TenancyChange::Authorised { auth_code } => authorise(shared, source, &auth_code).await,
        TenancyChange::Rescoped { tenant } => rescope(shared, source, &tenant).await,
        TenancyChange::Joined { tenant } => {
            let namespace = namespace(source);
            let settings = bytes::Bytes::from_static(br#"{"joined":true}"#);
            // A tenant added by hand (or disabled) keeps the settings it was given.
            let added = shared
                .store
                .state_put(&namespace, &tenant, settings, Expect::Absent, None)
                .await?;
            if let Changed::Done(_) = added {
                metrics::counter!("oncegate_tenancy_changes_total", "source" => source.to_owned(), "change" => "joined").increment(1);
                tracing::info!(source, tenant = %tenant, "a tenant installed or enabled the app: /send sends as it");
            }
            Ok(())
        }
        TenancyChange::Left { tenant } => {
            let namespace = namespace(source);
            shared
                .store
                .state_remove(&namespace, &tenant, Expect::Any)
                .await?;
            #[cfg(all(feature = "send", any(feature = "feishu", feature = "wecom")))]
            if let Some(keeper) = shared.api.keepers.load().get(source).cloned() {
                keeper.forget(&tenant).await?;
            }
            metrics::counter!("oncegate_tenancy_changes_total", "source" => source.to_owned(), "change" => "left").increment(1);
            tracing::info!(source, tenant = %tenant, "a tenant left: it is out of the registry, and a suite's corp's callbacks are refused from the next poll on");
            Ok(())
        }
    }
}

/// Exchanges a tenant's authorisation code for its permanent credential (which adds it to the
/// registry): an error WeCom may answer otherwise later (no ticket yet, a busy API) retries the
/// event; a refusal for good (the code used or expired) is said, and the event still goes to
/// its route, whose handler may act on it.
async fn authorise<S: Store>(
    shared: &Shared<S>,
    source: &str,
    auth_code: &str,
) -> Result<(), StoreError> {
    #[cfg(all(feature = "send", feature = "wecom"))]
    if let Some(exchanged) = match shared.api.keepers.load().get(source).cloned() {
        Some(keeper) => keeper.authorise(auth_code).await,
        None => None,
    } {
        return settled(
            source,
            ["authorised", "authorisation_refused"],
            exchanged,
            "a tenant authorised the suite: its callbacks are taken from the next poll on, and \
             /send sends as it",
            "the corp was not added; it can be added with oncegate tenants add, or authorise \
             again",
        );
    }
    let _ = auth_code;
    shared.summaries.note(
        "authorisation_unexchanged",
        None,
        &format!(
            "source {source:?} received an authorisation (create_auth) but has no suite_secret \
             to exchange it: add the corp with oncegate tenants add, or set suite_secret"
        ),
    );
    Ok(())
}

/// Reads a tenant's authorisation again (WeCom's `change_auth`: the corp changed what it
/// authorised): its agent and name as WeCom says them now. Retried as `authorise` is; a refusal
/// for good is said, and the event still goes to its route.
async fn rescope<S: Store>(
    shared: &Shared<S>,
    source: &str,
    tenant: &str,
) -> Result<(), StoreError> {
    #[cfg(all(feature = "send", feature = "wecom"))]
    if let Some(read) = match shared.api.keepers.load().get(source).cloned() {
        Some(keeper) => keeper.rescope(tenant).await,
        None => None,
    } {
        return settled(
            source,
            ["rescoped", "rescope_refused"],
            read,
            "a tenant changed what it authorised: /send sends as the agent it authorised now",
            "what the gateway keeps of the corp is unchanged",
        );
    }
    shared.summaries.note(
        "rescope_unread",
        None,
        &format!(
            "source {source:?} received a change of authorisation (change_auth) of corp \
             {tenant:?} but has no suite_secret to read it again (get_auth_info)"
        ),
    );
    Ok(())
}

/// What an exchange with the platform about a tenant came to: counted as `changes[0]` when
/// done, as `changes[1]` and said when refused for good (the event goes on to its route); an
/// error that may pass (no ticket yet, a busy API) retries the event.
#[cfg(all(feature = "send", feature = "wecom"))]
fn settled(
    source: &str,
    changes: [&'static str; 2],
    outcome: Result<oncegate_send::Authorisation, oncegate_send::SendError>,
    done: &str,
    refused: &str,
) -> Result<(), StoreError> {
    match outcome {
        Ok(authorised) => {
            metrics::counter!("oncegate_tenancy_changes_total", "source" => source.to_owned(), "change" => changes[0]).increment(1);
            tracing::info!(source, tenant = %authorised.corp_id, agent = ?authorised.agent_id, "{done}");
            Ok(())
        }
        Err(oncegate_send::SendError::Permanent { code, message }) => {
            metrics::counter!("oncegate_tenancy_changes_total", "source" => source.to_owned(), "change" => changes[1]).increment(1);
            tracing::error!(source, code, "WeCom refused ({message}): {refused}");
            Ok(())
        }
        Err(other) => Err(StoreError::Unavailable(format!(
            "a change of a tenant of {source:?} waits: {other}"
        ))),
    }
}

/// Keeps `ticket` as the newest, unless a newer one is kept already (a late retry of an older
/// push, or another gateway's newer one): compare-and-set, so two gateways never both win.
pub(crate) async fn keep_ticket<S: StateStore>(
    store: &S,
    namespace: &str,
    ticket: &str,
    issued_secs: u64,
    life: Duration,
) -> Result<(), StoreError> {
    let value = bytes::Bytes::from(
        serde_json::json!({"ticket": ticket, "issued_secs": issued_secs}).to_string(),
    );
    for _ in 0..8 {
        let expect = match store.state_get(namespace, "ticket").await? {
            Some(kept) => {
                let kept_secs = serde_json::from_slice::<serde_json::Value>(&kept.value)
                    .ok()
                    .and_then(|doc| doc["issued_secs"].as_u64())
                    .unwrap_or(0);
                if kept_secs > issued_secs {
                    return Ok(());
                }
                Expect::Version(kept.version)
            }
            None => Expect::Absent,
        };
        match store
            .state_put(namespace, "ticket", value.clone(), expect, Some(life))
            .await?
        {
            Changed::Done(_) => return Ok(()),
            Changed::Stale(_) => continue,
        }
    }
    Err(StoreError::Unavailable(
        "the ticket kept changing under eight writes in a row".into(),
    ))
}
