//! One route: which events (by type and owner), which sink, what happens to stale events, and
//! whether the sink's answer is the platform's reply. The routes in force are one snapshot
//! ([`Routes`]) that a reload replaces whole.

use std::sync::Arc;

use crate::{Retries, StaleEvents, sink::SharedSink};

/// One route: which event types, which sink, whether stale events are dropped, and whether
/// the sink's answer is the platform's reply (a synchronous call, not queued).
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) patterns: Vec<String>,
    pub(crate) sink: SharedSink,
    pub(crate) stale: StaleEvents,
    pub(crate) reply: bool,
    /// How its failed deliveries are retried.
    pub(crate) retries: Retries,
    /// Set when the endpoint answered 410 Gone: the route delivers nothing until resumed. A
    /// reload that keeps the route keeps this too.
    pub(crate) gone: Arc<GoneState>,
    /// The tenants and agents whose events it takes (every one's when empty).
    pub(crate) tenants: Vec<String>,
    pub(crate) agents: Vec<String>,
    /// Which of its events go before the rest of their tenant's backlog.
    pub(crate) priority: oncegate_config::Priority,
    /// The `[[route]]` it was built from, its secrets resolved: a reload keeps the route (its
    /// sink, its connections, its gone state) when the new file describes it the same way.
    /// `None` for a route built in code.
    pub(crate) origin: Option<oncegate_config::RouteConfig>,
}

impl Route {
    pub(crate) fn new(
        patterns: &[&str],
        sink: SharedSink,
        stale: StaleEvents,
        reply: bool,
    ) -> Self {
        Self {
            patterns: patterns.iter().map(|p| (*p).to_owned()).collect(),
            sink,
            stale,
            reply,
            retries: Retries::default(),
            gone: Arc::default(),
            tenants: Vec::new(),
            agents: Vec::new(),
            priority: oncegate_config::Priority::default(),
            origin: None,
        }
    }

    pub(crate) fn matches(&self, event_type: &str, owner: oncegate_core::Owner<'_>) -> bool {
        oncegate_config::event_type_matches(&self.patterns, event_type)
            && oncegate_config::owner_matches(&self.tenants, owner.tenant)
            && oncegate_config::owner_matches(&self.agents, owner.agent)
    }
}

/// The routes in force, in order: the first that matches an event takes it.
#[derive(Clone, Default)]
pub(crate) struct Routes {
    pub(crate) list: Vec<Arc<Route>>,
    /// Whether any route replies: ingress looks an event's route up only then.
    pub(crate) replying: bool,
    /// Each app's bot, by app id (a Feishu app's `bot_open_id`): whom a mention must name for
    /// a route's `priority = "mentions"`.
    pub(crate) bots: Arc<std::collections::HashMap<String, String>>,
}

impl Routes {
    /// The routes `list`, in order.
    pub(crate) fn of(list: Vec<Arc<Route>>) -> Self {
        let replying = list.iter().any(|route| route.reply);
        Self {
            list,
            replying,
            bots: Arc::default(),
        }
    }

    /// These routes, mentions to name `bots`.
    pub(crate) fn with_bots(self, bots: Arc<std::collections::HashMap<String, String>>) -> Self {
        Self { bots, ..self }
    }

    /// Which of `event`'s kind go before the rest of its tenant's backlog, by its route
    /// (none for an event no route takes).
    pub(crate) fn priority_of(&self, event: &oncegate_core::Event) -> oncegate_config::Priority {
        self.route_for(&event.event_type, crate::registry::owner::of(event))
            .map_or(oncegate_config::Priority::None, |route| route.priority)
    }

    /// The first route that takes an event of `event_type` owned by `owner`.
    pub(crate) fn route_for(
        &self,
        event_type: &str,
        owner: oncegate_core::Owner<'_>,
    ) -> Option<&Arc<Route>> {
        self.list
            .iter()
            .find(|route| route.matches(event_type, owner))
    }

    /// Where `route` stands in the list (`usize::MAX` once a reload removed it).
    pub(crate) fn index_of(&self, route: &Route) -> usize {
        self.list
            .iter()
            .position(|r| std::ptr::eq(&**r, route))
            .unwrap_or(usize::MAX)
    }
}

/// When and why a route's endpoint went away.
#[derive(Debug, Clone)]
pub(crate) struct Gone {
    pub(crate) since_ms: u64,
    pub(crate) reason: String,
}

/// A route's gone state: a flag every delivery reads without a lock, and why, for the few that
/// need it.
#[derive(Default)]
pub(crate) struct GoneState {
    flag: std::sync::atomic::AtomicBool,
    why: std::sync::Mutex<Option<Gone>>,
}

impl GoneState {
    fn why(&self) -> std::sync::MutexGuard<'_, Option<Gone>> {
        self.why
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl GoneState {
    /// Marks the route gone; whether it was not before (the first 410 wins: its time is
    /// kept).
    pub(crate) fn mark(&self, gone: Gone) -> bool {
        let mut why = self.why();
        if why.is_some() {
            return false;
        }
        *why = Some(gone);
        self.flag.store(true, std::sync::atomic::Ordering::Release);
        true
    }

    /// The route delivers again; why it was gone, if it was.
    pub(crate) fn clear(&self) -> Option<Gone> {
        let mut why = self.why();
        self.flag.store(false, std::sync::atomic::Ordering::Release);
        why.take()
    }
}

impl Route {
    /// Why the route delivers nothing now, if it does not (a healthy route: one atomic load).
    pub(crate) fn gone(&self) -> Option<Gone> {
        if !self.gone.flag.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.gone.why().clone()
    }
}
