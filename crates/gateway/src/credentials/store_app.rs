//! A Feishu store app's credentials, kept in the store for every gateway: the `app_ticket`
//! (pushed hourly, asked for again at start and when Feishu refuses the kept one), the
//! `app_access_token` fetched with it, each tenant's `tenant_access_token` — and the sender of
//! each tenant, whose token is that tenant's and no other's. Facts:
//! `shared/protocols/tenants.md` §2.1.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oncegate_send::feishu_store::{APP_TICKET_INVALID, APP_TOKEN_REFUSED};
use oncegate_send::{Api, FeishuApi, FeishuStoreApi, SendError, TokenFuture};
use serde_json::Value;

use super::shared_state::SharedState;
use super::tokens::{SharedTokens, TenantToken, TenantTokenKeeper};
use crate::api::send::Sender;
use crate::ingress::tenants;

/// The least time between two resends this gateway asks for: Feishu pushes the ticket to the
/// event URL a moment after the call, and every gateway would ask at once.
const RESEND_SPACING: Duration = Duration::from_secs(30);

fn unavailable(error: oncegate_core::StoreError) -> SendError {
    SendError::Transient(format!("the store cannot answer: {error}"))
}

/// One store app's credentials and senders.
pub(crate) struct StoreAppKeeper {
    source: String,
    api: FeishuStoreApi,
    store: Arc<dyn SharedState>,
    tokens: SharedTokens,
    /// When this gateway last asked for a ticket, and the refused ticket it asked instead of.
    last_resend: Mutex<Option<(Instant, Option<String>)>>,
    senders: super::Senders,
}

impl StoreAppKeeper {
    /// The keeper of `source`'s credentials, calling `api`, keeping them in `store`.
    pub(crate) fn new(source: &str, api: FeishuStoreApi, store: Arc<dyn SharedState>) -> Self {
        Self {
            source: source.to_owned(),
            tokens: SharedTokens::new(store.clone(), format!("tokens:{source}")),
            api,
            store,
            last_resend: Mutex::default(),
            senders: super::Senders::default(),
        }
    }

    /// Asks Feishu to push the ticket again — because none is kept (`refused`: `None`) or
    /// Feishu refused the kept one — unless this gateway asked for the same reason a moment ago.
    pub(crate) async fn resend(&self, refused: Option<&str>) -> Result<(), SendError> {
        {
            let mut last = self
                .last_resend
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some((at, why)) = &*last
                && at.elapsed() < RESEND_SPACING
                && why.as_deref() == refused
            {
                return Ok(());
            }
            *last = Some((Instant::now(), refused.map(str::to_owned)));
        }
        metrics::counter!("oncegate_ticket_resends_total", "source" => self.source.clone())
            .increment(1);
        self.api.resend_ticket().await
    }

    /// Asks Feishu to push the ticket unless one is kept (by any gateway); a failure is said
    /// and left to the next token that needs the ticket, which asks again.
    pub(crate) async fn ask_for_ticket_unless_kept(&self) {
        match self
            .store
            .get(&tenants::tickets(&self.source), "ticket")
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => {
                if let Err(error) = self.resend(None).await {
                    tracing::warn!(source = %self.source, "asking Feishu to push the app_ticket failed: {error}; it is asked again when a token is needed");
                }
            }
            Err(error) => {
                tracing::warn!(source = %self.source, "the store cannot say whether an app_ticket is kept: {error}")
            }
        }
    }

    /// The newest ticket Feishu pushed (kept by any gateway); none kept: a resend is asked for.
    async fn ticket(&self) -> Result<String, SendError> {
        let kept = self
            .store
            .get(&tenants::tickets(&self.source), "ticket")
            .await
            .map_err(unavailable)?;
        if let Some(ticket) = kept
            .and_then(|kept| serde_json::from_slice::<Value>(&kept.value).ok())
            .and_then(|doc| doc["ticket"].as_str().map(str::to_owned))
        {
            return Ok(ticket);
        }
        self.resend(None).await?;
        Err(SendError::Transient(format!(
            "source {:?} has no app_ticket yet: asked Feishu to push one to /webhook/{} \
             (app_ticket/resend); it arrives within seconds if the app's event URL points here",
            self.source, self.source
        )))
    }

    async fn app_token(&self) -> Result<String, SendError> {
        self.tokens
            .get("app", async || {
                let ticket = self.ticket().await?;
                match self.api.app_token(&ticket).await {
                    // The kept ticket is no longer valid: the pushed one replaces it.
                    Err(SendError::Permanent { code, message }) if code == APP_TICKET_INVALID => {
                        self.resend(Some(&ticket)).await?;
                        Err(SendError::Transient(format!(
                            "Feishu refused the kept app_ticket ({message}): asked for another"
                        )))
                    }
                    other => other,
                }
            })
            .await
    }

    async fn tenant_token_now(&self, tenant: &str) -> Result<String, SendError> {
        self.tokens
            .get(&tenant_token(tenant), async || {
                let app_token = self.app_token().await?;
                match self.api.tenant_token(&app_token, tenant).await {
                    Err(SendError::Permanent { code, .. }) if APP_TOKEN_REFUSED.contains(&code) => {
                        self.tokens.refused("app", &app_token).await;
                        let app_token = self.app_token().await?;
                        self.api.tenant_token(&app_token, tenant).await
                    }
                    other => other,
                }
            })
            .await
    }

    /// Forgets a tenant that left: its token and its sender.
    pub(crate) async fn forget(&self, tenant: &str) -> Result<(), oncegate_core::StoreError> {
        self.senders.forget(tenant);
        self.tokens.forget(&tenant_token(tenant)).await
    }

    /// The sender of tenant `tenant` (one of the registry's): its messages carry its token only.
    pub(crate) fn sender(self: &Arc<Self>, tenant: &str) -> Arc<Sender> {
        if let Some(sender) = self.senders.get(tenant) {
            return sender;
        }
        let tokens = Arc::new(TenantToken {
            keeper: Arc::downgrade(self),
            tenant: tenant.to_owned(),
        });
        let api = FeishuApi::with_tokens(
            self.api.domain(),
            self.api.app_id(),
            tokens,
            self.api.http(),
        );
        let api = Api::Feishu(api);
        let sender = Arc::new(Sender {
            scope: format!("{}:{tenant}", self.api.app_id()),
            api,
            // Feishu counts a store app's calls per tenant, its own alone.
            shared: Vec::new(),
        });
        self.senders.keep(tenant, sender)
    }
}

fn tenant_token(tenant: &str) -> String {
    format!("tenant:{tenant}")
}

impl TenantTokenKeeper for StoreAppKeeper {
    fn tenant_token<'a>(&'a self, tenant: &'a str) -> TokenFuture<'a, Result<String, SendError>> {
        Box::pin(self.tenant_token_now(tenant))
    }

    fn tokens(&self) -> &SharedTokens {
        &self.tokens
    }

    fn token_name(&self, tenant: &str) -> String {
        tenant_token(tenant)
    }
}
