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
            Keeper::StoreApp(keeper) => keeper.sender(tenant),
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

/// At start: every store app with no ticket kept asks Feishu to push one (as the official SDKs
/// do), so that its tenants' tokens can be fetched without waiting up to an hour.
// Irrefutable in a build with store apps only.
#[allow(irrefutable_let_patterns)]
pub(crate) async fn ask_for_tickets(keepers: &std::collections::HashMap<String, Keeper>) {
    for (source, keeper) in keepers {
        #[cfg(feature = "feishu")]
        if let Keeper::StoreApp(keeper) = keeper {
            match keeper.ticket_kept().await {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(error) = keeper.resend(None).await {
                        tracing::warn!(source = %source, "asking Feishu to push the app_ticket failed: {error}; it is asked again when a token is needed");
                    }
                }
                Err(error) => {
                    tracing::warn!(source = %source, "the store cannot say whether an app_ticket is kept: {error}")
                }
            }
        }
        let _ = (source, keeper);
    }
}
