//! A Feishu/Lark store app's (商店应用) own API: asking for the `app_ticket` again, the
//! `app_access_token` from the pushed ticket, and each tenant's `tenant_access_token`. Knows no
//! store: the gateway keeps the ticket and the tokens, shared by every gateway.
//! Facts: `shared/protocols/tenants.md` §2.1.

use std::time::Duration;

use serde_json::{Value, json};

use crate::SendError;
use crate::feishu::{auth_call, token_of};

/// Feishu's answer that the `app_ticket` is not (or no longer) valid: ask for another
/// (`app_ticket/resend`), which Feishu pushes to the event URL.
pub const APP_TICKET_INVALID: i64 = 10012;
/// Feishu's answers that the `app_access_token` is not valid: fetch another, once.
pub const APP_TOKEN_REFUSED: &[i64] = &[99991664, 99991671];

/// One store app's API.
pub struct FeishuStoreApi {
    http: reqwest::Client,
    domain: String,
    app_id: String,
    app_secret: String,
}

impl std::fmt::Debug for FeishuStoreApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuStoreApi")
            .field("domain", &self.domain)
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

impl FeishuStoreApi {
    /// A client of `domain` (`https://open.feishu.cn`, `https://open.larksuite.com`, or a
    /// local server) for the store app `app_id`; every call is bounded by `timeout`.
    pub fn new(
        domain: &str,
        app_id: &str,
        app_secret: &str,
        timeout: Duration,
    ) -> Result<Self, SendError> {
        if app_secret.trim().is_empty() {
            return Err(SendError::Permanent {
                code: 0,
                message: "the app secret is empty".into(),
            });
        }
        Ok(Self {
            http: crate::wecom::client(timeout)?,
            domain: domain.trim_end_matches('/').to_owned(),
            app_id: app_id.to_owned(),
            app_secret: app_secret.to_owned(),
        })
    }

    /// Its HTTP client, for the app's tenants' senders to share.
    pub fn http(&self) -> reqwest::Client {
        self.http.clone()
    }

    /// The API's address.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The app.
    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// Asks Feishu to push the `app_ticket` now (it arrives as an event, not in the answer).
    pub async fn resend_ticket(&self) -> Result<(), SendError> {
        self.call(
            "app_ticket/resend",
            json!({"app_id": self.app_id, "app_secret": self.app_secret}),
        )
        .await
        .map(drop)
    }

    /// The app's `app_access_token` and its life, with the newest pushed `ticket`.
    pub async fn app_token(&self, ticket: &str) -> Result<(String, Duration), SendError> {
        let answer = self
            .call(
                "app_access_token",
                json!({"app_id": self.app_id, "app_secret": self.app_secret, "app_ticket": ticket}),
            )
            .await?;
        token_of(&answer, "app_access_token")
    }

    /// Tenant `tenant_key`'s `tenant_access_token` and its life.
    pub async fn tenant_token(
        &self,
        app_token: &str,
        tenant_key: &str,
    ) -> Result<(String, Duration), SendError> {
        let answer = self
            .call(
                "tenant_access_token",
                json!({"app_access_token": app_token, "tenant_key": tenant_key}),
            )
            .await?;
        token_of(&answer, "tenant_access_token")
    }

    async fn call(&self, path: &str, body: Value) -> Result<Value, SendError> {
        auth_call(&self.http, &self.domain, path, body).await
    }
}
