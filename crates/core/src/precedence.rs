//! Which queued events go before the rest of their tenant's backlog: a rule the gateway sets
//! on its store (an event that @-mentions the bot, as each route says), which the store asks
//! of every event it queues or finds queued. The store knows no platform; the rule does.

use std::sync::{Arc, OnceLock};

use crate::Event;

/// Names the events that go before their group's other waiting events (never before an
/// earlier event of their own chain).
pub trait Precedence: Send + Sync + 'static {
    /// Whether `event` goes first. Asked once per event a store queues or finds queued on
    /// open or takeover: it must be cheap and must not block.
    fn first(&self, event: &Event) -> bool;
}

impl<F: Fn(&Event) -> bool + Send + Sync + 'static> Precedence for F {
    fn first(&self, event: &Event) -> bool {
        self(event)
    }
}

/// A store's rule, set once; until it is, no event goes first.
#[derive(Default)]
pub struct FirstRule(OnceLock<Arc<dyn Precedence>>);

impl FirstRule {
    /// Sets the rule; refused (and the rule kept) when one was set before, as
    /// [`EventQueue::put_first`](crate::EventQueue::put_first) says.
    pub fn set(&self, rule: Arc<dyn Precedence>) -> Result<(), crate::StoreError> {
        self.0.set(rule).map_err(|_| {
            crate::StoreError::Invalid(
                "the store ranks by a rule set before; it is set once".into(),
            )
        })
    }

    /// Whether `event` goes first by the rule set (`false` while none is).
    pub fn first(&self, event: &Event) -> bool {
        self.0.get().is_some_and(|rule| rule.first(event))
    }

    /// Whether a rule is set: a store may skip reading events for it while none is.
    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }
}

impl std::fmt::Debug for FirstRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FirstRule").field(&self.is_set()).finish()
    }
}
