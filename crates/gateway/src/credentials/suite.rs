//! A WeCom suite's credentials, kept in the store for every gateway: the suite token (fetched
//! with the newest pushed ticket), each corp's permanent code (from its `create_auth`) and each
//! corp's token — and the sender of each corp, whose token is that corp's and no other's.
//! Facts: `shared/protocols/tenants.md` §1.3.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Expect, StoreError};
use oncegate_send::limits::{WECOM_ISV, WECOM_ISV_HOUR};
use oncegate_send::wecom::{TokenFuture, WecomOptions};
use oncegate_send::wecom_suite::{SUITE_TOKEN_REFUSED, TICKET_REFUSED};
use oncegate_send::{Api, Authorisation, SendError, WecomApi, WecomSuiteApi};
use serde_json::{Value, json};

use super::shared_state::SharedState;
use super::tokens::{SharedTokens, TenantToken, TenantTokenKeeper};
use crate::api::send::Sender;
use crate::ingress::tenants;

/// The store namespace of `source`'s permanent codes, by corp.
pub(crate) fn codes(source: &str) -> String {
    format!("credentials:{source}")
}

/// The store namespace of `source`'s tokens.
fn token_namespace(source: &str) -> String {
    format!("tokens:{source}")
}

/// A corp's kept credential.
struct Credential {
    permanent_code: String,
    agent_id: Option<i64>,
}

fn unavailable(error: StoreError) -> SendError {
    SendError::Transient(format!("the store cannot answer: {error}"))
}

/// One suite source's credentials and senders.
pub(crate) struct SuiteKeeper {
    source: String,
    api: WecomSuiteApi,
    store: Arc<dyn SharedState>,
    tokens: SharedTokens,
    timeout: Duration,
    senders: super::Senders,
}

impl SuiteKeeper {
    /// The keeper of `source`'s credentials, calling `api`, keeping them in `store`.
    pub(crate) fn new(
        source: &str,
        api: WecomSuiteApi,
        store: Arc<dyn SharedState>,
        timeout: Duration,
    ) -> Self {
        Self {
            source: source.to_owned(),
            tokens: SharedTokens::new(store.clone(), token_namespace(source)),
            api,
            store,
            timeout,
            senders: super::Senders::default(),
        }
    }

    /// The newest ticket WeCom pushed (kept by any gateway).
    async fn ticket(&self) -> Result<String, SendError> {
        let kept = self
            .store
            .get(&tenants::tickets(&self.source), "ticket")
            .await
            .map_err(unavailable)?;
        kept.and_then(|kept| serde_json::from_slice::<Value>(&kept.value).ok())
            .and_then(|doc| doc["ticket"].as_str().map(str::to_owned))
            .ok_or_else(|| {
                SendError::Transient(format!(
                    "source {:?} has no suite_ticket yet: WeCom pushes one every 10 minutes to \
                     the command URL (or press 刷新ticket in the ISV console)",
                    self.source
                ))
            })
    }

    async fn suite_token(&self) -> Result<String, SendError> {
        self.tokens
            .get("suite", async || {
                let ticket = self.ticket().await?;
                self.api
                    .suite_token(&ticket)
                    .await
                    .map_err(|error| match error {
                        // A ticket WeCom no longer takes: the next push replaces it.
                        SendError::Permanent { code, message } if code == TICKET_REFUSED => {
                            SendError::Transient(message)
                        }
                        other => other,
                    })
            })
            .await
    }

    /// `call` with the suite token, with a fresh one once if WeCom says it is stale.
    async fn with_suite_token<T, F>(&self, call: impl Fn(String) -> F) -> Result<T, SendError>
    where
        F: std::future::Future<Output = Result<T, SendError>>,
    {
        let token = self.suite_token().await?;
        match call(token.clone()).await {
            Err(SendError::Permanent { code, .. }) if SUITE_TOKEN_REFUSED.contains(&code) => {
                self.tokens.refused("suite", &token).await;
                call(self.suite_token().await?).await
            }
            other => other,
        }
    }

    /// Exchanges a `create_auth`'s (or `reset_permanent_code`'s) code for the corp's permanent
    /// code, keeps it, and adds the corp to the registry (its settings: name and agent).
    pub(crate) async fn authorise(&self, auth_code: &str) -> Result<Authorisation, SendError> {
        let authorised = self
            .with_suite_token(
                |token| async move { self.api.permanent_code(&token, auth_code).await },
            )
            .await?;
        self.keep(&authorised).await.map_err(unavailable)?;
        // A renewed code invalidates the corp's token.
        self.tokens
            .forget(&corp_token(&authorised.corp_id))
            .await
            .map_err(unavailable)?;
        Ok(authorised)
    }

    /// Reads a corp's authorisation again, as its `change_auth` asks (`get_auth_info`), and
    /// keeps what changed: its agent (every gateway's next send as the corp names it) and its
    /// name.
    pub(crate) async fn rescope(&self, corp: &str) -> Result<Authorisation, SendError> {
        let code = self.credential(corp).await?.permanent_code;
        let code = &code;
        let now = self
            .with_suite_token(|token| async move { self.api.auth_info(&token, corp, code).await })
            .await?;
        self.keep(&now).await.map_err(unavailable)?;
        Ok(now)
    }

    /// Keeps a corp's authorisation: its credential, and its settings in the registry (what an
    /// operator set there, such as `disabled`, stays).
    async fn keep(&self, authorised: &Authorisation) -> Result<(), StoreError> {
        let corp = &authorised.corp_id;
        let credential = json!({
            "permanent_code": authorised.permanent_code,
            "agent_id": authorised.agent_id,
        });
        self.store
            .put(
                &codes(&self.source),
                corp,
                Bytes::from(credential.to_string()),
                Expect::Any,
                None,
            )
            .await?;
        self.senders.forget(corp);
        let namespace = tenants::namespace(&self.source);
        for _ in 0..8 {
            let kept = self.store.get(&namespace, corp).await?;
            let mut settings = kept
                .as_ref()
                .and_then(|kept| serde_json::from_slice::<Value>(&kept.value).ok())
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            settings["name"] = json!(authorised.corp_name);
            settings["agent_id"] = json!(authorised.agent_id);
            settings["authorised"] = json!(true);
            let expect = kept.map_or(Expect::Absent, |kept| Expect::Version(kept.version));
            let put = self
                .store
                .put(
                    &namespace,
                    corp,
                    Bytes::from(settings.to_string()),
                    expect,
                    None,
                )
                .await?;
            if let oncegate_core::Changed::Done(_) = put {
                return Ok(());
            }
        }
        Err(StoreError::Unavailable(format!(
            "the settings of corp {corp:?} kept changing under eight writes in a row"
        )))
    }

    /// Forgets a corp that left: its permanent code, its token, its sender.
    pub(crate) async fn forget(&self, corp: &str) -> Result<(), StoreError> {
        self.store
            .remove(&codes(&self.source), corp, Expect::Any)
            .await?;
        self.forget_tokens(corp).await
    }

    async fn forget_tokens(&self, corp: &str) -> Result<(), StoreError> {
        self.senders.forget(corp);
        self.tokens.forget(&corp_token(corp)).await
    }

    async fn credential(&self, corp: &str) -> Result<Credential, SendError> {
        let kept = self
            .store
            .get(&codes(&self.source), corp)
            .await
            .map_err(unavailable)?;
        let doc = kept
            .and_then(|kept| serde_json::from_slice::<Value>(&kept.value).ok())
            .ok_or_else(|| SendError::Permanent {
                code: 0,
                message: format!(
                    "corp {corp:?} has no permanent code in source {:?}: it is kept when the \
                     corp authorises the suite (create_auth)",
                    self.source
                ),
            })?;
        Ok(Credential {
            permanent_code: doc["permanent_code"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            agent_id: doc["agent_id"].as_i64(),
        })
    }

    async fn corp_token_now(&self, corp: &str) -> Result<String, SendError> {
        self.tokens
            .get(&corp_token(corp), async || {
                let credential = self.credential(corp).await?;
                if self.api.is_custom_template() {
                    return self
                        .api
                        .corp_token(None, corp, &credential.permanent_code)
                        .await;
                }
                let code = &credential.permanent_code;
                self.with_suite_token(|token| async move {
                    self.api.corp_token(Some(&token), corp, code).await
                })
                .await
            })
            .await
    }

    /// The sender of corp `corp` (one of the registry's): its messages carry its token only,
    /// and name the agent the corp authorised as the store holds it now — read at each send,
    /// since any gateway may have taken a `change_auth` that changed it.
    pub(crate) async fn sender(self: &Arc<Self>, corp: &str) -> Result<Arc<Sender>, SendError> {
        let credential = self.credential(corp).await?;
        let agent = credential.agent_id.ok_or_else(|| SendError::Permanent {
            code: 0,
            message: format!("corp {corp:?} authorised no agent of the suite: nothing to send as"),
        })?;
        if let Some(sender) = self.senders.get(corp)
            && sender.scope == scope(corp, agent)
        {
            return Ok(sender);
        }
        let tokens = Arc::new(TenantToken {
            keeper: Arc::downgrade(self),
            tenant: corp.to_owned(),
        });
        let options = WecomOptions {
            timeout: self.timeout,
            ..Default::default()
        };
        let api = WecomApi::with_tokens(
            self.api.domain(),
            corp,
            agent,
            tokens,
            options,
            self.api.http(),
        );
        let sender = Arc::new(Sender {
            scope: scope(corp, agent),
            api: Api::Wecom(api),
            shared: self.shared_budgets(),
        });
        Ok(self.senders.keep(corp, sender))
    }
}

impl SuiteKeeper {
    /// The budgets all the suite's corps share: WeCom counts a service provider's calls from
    /// one egress address together (`tenants.md` §3.1), kept here per suite — a provider with
    /// several suites behind one address would share it across them too.
    fn shared_budgets(&self) -> Vec<(String, oncegate_core::KeyHash, oncegate_core::Rate)> {
        let scope = format!("suite:{}", self.api.suite_id());
        [("isv", WECOM_ISV), ("isv-hour", WECOM_ISV_HOUR)]
            .into_iter()
            .map(|(name, rate)| {
                let bucket = crate::api::budget::bucket(&scope, name);
                (format!("{scope} {name}"), bucket, rate)
            })
            .collect()
    }
}

/// What a corp's sender sends as (the WeCom API's own scope): the corp and its agent.
fn scope(corp: &str, agent: i64) -> String {
    format!("{corp}/{agent}")
}

fn corp_token(corp: &str) -> String {
    format!("corp:{corp}")
}

impl TenantTokenKeeper for SuiteKeeper {
    fn tenant_token<'a>(&'a self, corp: &'a str) -> TokenFuture<'a, Result<String, SendError>> {
        Box::pin(self.corp_token_now(corp))
    }

    fn tokens(&self) -> &SharedTokens {
        &self.tokens
    }

    fn token_name(&self, corp: &str) -> String {
        corp_token(corp)
    }
}
