//! A route whose endpoint is gone: the Standard Webhooks rule for 410 — stop delivering to it,
//! dead-letter what comes for it with the reason, say so loudly, and resume when an operator
//! says (`POST /admin/routes/<index>/resume`, served by the admin listener, then replay the
//! dead letters).

use oncegate_core::Store;

use crate::Shared;
use crate::route::{Gone, Route, Routes};

fn gauge(index: usize, value: f64) {
    metrics::gauge!("oncegate_route_gone", "route" => index.to_string()).set(value);
}

/// Every route's gauge at 0, so that an alert sees "not gone" rather than no series.
pub(crate) fn register(routes: &Routes) {
    for index in 0..routes.list.len() {
        gauge(index, 0.0);
    }
}

/// Marks route `index` gone (the first 410 wins: its time is kept).
pub(crate) fn mark_gone<S: Store>(shared: &Shared<S>, route: &Route, reason: &str) {
    let index = shared.routes.load().index_of(route);
    let gone = Gone {
        since_ms: shared.now_ms(),
        reason: reason.to_owned(),
    };
    if route.gone.mark(gone) {
        tracing::error!(
            route = index,
            events = ?route.patterns,
            "route stopped: {reason}; what comes for it is dead-lettered until POST \
             /admin/routes/{index}/resume (then replay the dead letters)"
        );
        gauge(index, 1.0);
    }
}

/// Each gone route as a line for readiness and the status page: the gateway stays ready (it
/// still takes every event), but says what it dead-letters.
pub(crate) fn degraded<S>(shared: &Shared<S>) -> Vec<String> {
    shared
        .routes
        .load()
        .list
        .iter()
        .enumerate()
        .filter_map(|(index, route)| {
            route.gone().map(|gone| {
                format!(
                    "route {index} ({}): its endpoint is gone ({}); its events are \
                     dead-lettered until POST /admin/routes/{index}/resume",
                    route.patterns.join(", "),
                    gone.reason
                )
            })
        })
        .collect()
}

/// The reason an event for a gone route is dead-lettered with.
pub(crate) fn dead_letter_reason(index_hint: &Gone) -> String {
    format!(
        "not delivered: the route's endpoint is gone ({}); resume the route, then replay",
        index_hint.reason
    )
}

/// Takes up delivering to `route` (number `index`) again; whether it was gone.
pub(crate) fn resume(route: &Route, index: usize) -> bool {
    let was = route.gone.clear();
    gauge(index, 0.0);
    if was.is_some() {
        tracing::info!(route = index, "route resumed");
    }
    was.is_some()
}
