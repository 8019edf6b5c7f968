//! Credentials that are state, not configuration: a WeCom suite's ticket-born suite token, each
//! corp's permanent code and token; a Feishu store app's ticket, app token and each tenant's
//! token. They live in the store, shared by every gateway on it, and change while the gateway
//! runs (a tenant authorises or installs, a token expires).

pub(crate) mod shared_state;
#[cfg(feature = "feishu")]
pub(crate) mod store_app;
#[cfg(feature = "wecom")]
pub(crate) mod suite;
pub(crate) mod tokens;

use std::sync::Arc;

use oncegate_core::StoreError;
use oncegate_send::SendError;

use crate::api::send::Sender;

/// The most tenants' senders one keeper holds: past it, the one added longest ago is dropped
/// (and built again at its next send, from the store's token: a sender is a token's name and
/// the shared HTTP client). Thousands of tenants that each send now and then cost memory for
/// those that send, not for all.
const MAX_SENDERS: usize = 4096;

/// Senders by tenant, and the tenants in the order they were added.
#[derive(Default)]
struct Held {
    senders: std::collections::HashMap<String, Arc<Sender>>,
    order: std::collections::VecDeque<String>,
}

/// The senders of a keeper's tenants, bounded by [`MAX_SENDERS`].
#[derive(Default)]
pub(crate) struct Senders {
    held: std::sync::Mutex<Held>,
}

impl Senders {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `tenant`'s sender, if held.
    pub(crate) fn get(&self, tenant: &str) -> Option<Arc<Sender>> {
        self.held().senders.get(tenant).cloned()
    }

    /// Holds `sender` for `tenant`: the one held already if another caller was first with the
    /// same scope; one held for another scope (the tenant's agent changed) is replaced.
    pub(crate) fn keep(&self, tenant: &str, sender: Arc<Sender>) -> Arc<Sender> {
        let mut held = self.held();
        let Held { senders, order } = &mut *held;
        if let Some(first) = senders.get_mut(tenant) {
            if first.scope != sender.scope {
                *first = sender;
            }
            return first.clone();
        }
        while senders.len() >= MAX_SENDERS {
            match order.pop_front() {
                Some(oldest) => {
                    senders.remove(&oldest);
                }
                None => break,
            }
        }
        senders.insert(tenant.to_owned(), sender.clone());
        order.push_back(tenant.to_owned());
        sender
    }

    /// Drops `tenant`'s sender (it left, or its credential changed).
    pub(crate) fn forget(&self, tenant: &str) {
        let mut held = self.held();
        let Held { senders, order } = &mut *held;
        if senders.remove(tenant).is_some() {
            order.retain(|kept| kept != tenant);
        }
    }

    /// How many are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held().senders.len()
    }
}

/// The keeper of one multi-tenant source's credentials: what sends as each of its tenants.
#[derive(Clone)]
pub(crate) enum Keeper {
    /// A WeCom suite's: a corp's token from its permanent code.
    #[cfg(feature = "wecom")]
    Suite(Arc<suite::SuiteKeeper>),
    /// A Feishu store app's: a tenant's token from the app token.
    #[cfg(feature = "feishu")]
    StoreApp(Arc<store_app::StoreAppKeeper>),
}

impl Keeper {
    /// The sender of `tenant`, with that tenant's token only.
    pub(crate) async fn sender(&self, tenant: &str) -> Result<Arc<Sender>, SendError> {
        match self {
            #[cfg(feature = "wecom")]
            Keeper::Suite(keeper) => keeper.sender(tenant).await,
            #[cfg(feature = "feishu")]
            Keeper::StoreApp(keeper) => Ok(keeper.sender(tenant)),
        }
    }

    /// Exchanges a tenant's one-use authorisation code for its permanent credential (a WeCom
    /// suite's `create_auth`); `None` for a keeper that takes no codes.
    #[cfg(feature = "wecom")]
    pub(crate) async fn authorise(
        &self,
        code: &str,
    ) -> Option<Result<oncegate_send::Authorisation, SendError>> {
        match self {
            Keeper::Suite(keeper) => Some(keeper.authorise(code).await),
            #[cfg(feature = "feishu")]
            Keeper::StoreApp(_) => None,
        }
    }

    /// What the keeper does at start.
    async fn at_start(&self) {
        match self {
            #[cfg(feature = "wecom")]
            Keeper::Suite(_) => {}
            #[cfg(feature = "feishu")]
            Keeper::StoreApp(keeper) => keeper.ask_for_ticket_unless_kept().await,
        }
    }

    /// Reads a tenant's authorisation again (a WeCom suite's `change_auth`); `None` for a
    /// keeper that has nothing to read again.
    #[cfg(feature = "wecom")]
    pub(crate) async fn rescope(
        &self,
        tenant: &str,
    ) -> Option<Result<oncegate_send::Authorisation, SendError>> {
        match self {
            Keeper::Suite(keeper) => Some(keeper.rescope(tenant).await),
            #[cfg(feature = "feishu")]
            Keeper::StoreApp(_) => None,
        }
    }

    /// Forgets a tenant that left: its credentials and its sender.
    pub(crate) async fn forget(&self, tenant: &str) -> Result<(), StoreError> {
        match self {
            #[cfg(feature = "wecom")]
            Keeper::Suite(keeper) => keeper.forget(tenant).await,
            #[cfg(feature = "feishu")]
            Keeper::StoreApp(keeper) => keeper.forget(tenant).await,
        }
    }
}

/// At start, each keeper readies what its tenants' tokens need (a store app with no ticket
/// kept asks Feishu to push one, as the official SDKs do, instead of waiting up to an hour).
pub(crate) async fn at_start(keepers: &std::collections::HashMap<String, Keeper>) {
    for keeper in keepers.values() {
        keeper.at_start().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(scope: &str) -> Arc<Sender> {
        let api = oncegate_send::FeishuApi::new(
            "http://127.0.0.1:9",
            "cli_x",
            "secret",
            std::time::Duration::from_secs(1),
        )
        .expect("api");
        Arc::new(Sender {
            api: oncegate_send::Api::Feishu(api),
            scope: scope.to_owned(),
            shared: Vec::new(),
        })
    }

    #[test]
    fn senders_stay_within_their_bound_the_oldest_dropped_first() {
        let senders = Senders::default();
        let one = sender("one");
        for i in 0..MAX_SENDERS + 10 {
            let tenant = format!("t{i}");
            let kept = senders.keep(&tenant, one.clone());
            assert!(Arc::ptr_eq(&kept, &one));
        }
        assert_eq!(senders.len(), MAX_SENDERS);
        assert!(senders.get("t0").is_none() && senders.get("t9").is_none());
        assert!(senders.get("t10").is_some());
        // The first kept wins over a second built meanwhile for the same scope...
        let again = sender("one");
        let kept = senders.keep("t10", again);
        assert!(Arc::ptr_eq(&kept, &one));
        // ...and gives way to one for another (the tenant's agent changed).
        let other = sender("other");
        let kept = senders.keep("t10", other.clone());
        assert!(Arc::ptr_eq(&kept, &other));
        assert!(Arc::ptr_eq(&senders.get("t10").expect("held"), &other));
        assert_eq!(senders.len(), MAX_SENDERS);
        senders.forget("t10");
        assert!(senders.get("t10").is_none());
        assert_eq!(senders.len(), MAX_SENDERS - 1);
    }
}
