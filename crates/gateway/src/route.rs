//! One route: which events (by type and owner), which sink, what happens to stale events, and
//! whether the sink's answer is the platform's reply.

use crate::{Retries, StaleEvents, dispatch, sink::SharedSink};

/// One route: which event types, which sink, whether stale events are dropped, and whether
/// the sink's answer is the platform's reply (a synchronous call, not queued).
pub(crate) struct Route {
    pub(crate) patterns: Vec<String>,
    pub(crate) sink: SharedSink,
    pub(crate) stale: StaleEvents,
    pub(crate) reply: bool,
    /// How its failed deliveries are retried.
    pub(crate) retries: Retries,
    /// Set when the endpoint answered 410 Gone: the route delivers nothing until resumed.
    pub(crate) gone: dispatch::routes::GoneState,
    /// The tenants and agents whose events it takes (every one's when empty).
    pub(crate) tenants: Vec<String>,
    pub(crate) agents: Vec<String>,
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
            gone: dispatch::routes::GoneState::default(),
            tenants: Vec::new(),
            agents: Vec::new(),
        }
    }

    pub(crate) fn matches(&self, event_type: &str, owner: oncegate_core::Owner<'_>) -> bool {
        oncegate_config::event_type_matches(&self.patterns, event_type)
            && oncegate_config::owner_matches(&self.tenants, owner.tenant)
            && oncegate_config::owner_matches(&self.agents, owner.agent)
    }
}
