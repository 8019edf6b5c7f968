//! The tenants this gateway has seen, by their group hash (what the stores count by): a
//! name for each in the tenants view, and the requests a queue bound refused for each.
//! Noted where the hash is at hand anyway (a hand-out, a bounded admission, a refusal), so
//! that naming costs no extra hashing; bounded, the oldest names kept once full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use oncegate_core::Event;

/// Tenants named at most.
const MOST: usize = 65_536;

/// A seen tenant.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// `platform app tenant` (the tenant left out where the platform names none).
    pub(crate) name: Arc<str>,
    /// Requests refused for its queue bound, by this gateway.
    pub(crate) refused: u64,
}

/// The tenants seen, by group.
#[derive(Default)]
pub(crate) struct TenantNames {
    seen: Mutex<HashMap<u64, Seen>>,
}

impl TenantNames {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes `event`'s tenant as `group`'s, once.
    pub(crate) fn note(&self, group: u64, event: &Event) {
        let mut seen = self.lock();
        if seen.len() < MOST && !seen.contains_key(&group) {
            seen.insert(
                group,
                Seen {
                    name: name_of(event),
                    refused: 0,
                },
            );
        }
    }

    /// Counts a refusal of `event`, whose tenant is `group`, for its queue bound.
    pub(crate) fn refused(&self, group: u64, event: &Event) {
        let mut seen = self.lock();
        if seen.len() >= MOST && !seen.contains_key(&group) {
            return;
        }
        seen.entry(group)
            .or_insert_with(|| Seen {
                name: name_of(event),
                refused: 0,
            })
            .refused += 1;
    }

    /// What is known of `group`.
    pub(crate) fn get(&self, group: u64) -> Option<Seen> {
        self.lock().get(&group).cloned()
    }
}

fn name_of(event: &Event) -> Arc<str> {
    match &event.tenant {
        Some(tenant) => format!("{} {} {tenant}", event.platform, event.app).into(),
        None => format!("{} {}", event.platform, event.app).into(),
    }
}
