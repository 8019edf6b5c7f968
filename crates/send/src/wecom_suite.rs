//! A WeCom third-party suite's own API (服务商接口): the suite token from the pushed ticket, a
//! corp's permanent code from its authorisation code, its authorisation as it stands, and each
//! corp's token. Knows no store:
//! the gateway keeps the ticket, the codes and the tokens, shared by every gateway.
//! Facts: `shared/protocols/tenants.md` §1.3.

use std::time::Duration;

use serde_json::{Value, json};

use crate::SendError;
use crate::wecom::{client, gettoken, token_answer};

/// WeCom's answers that the suite token is stale (42009 "suite_access_token expired", 40082
/// "invalid suite_token"): fetch another, once.
pub const SUITE_TOKEN_REFUSED: &[i64] = &[42009, 40082];
/// The pushed ticket is not (or no longer) valid: wait for the next push (every 10 minutes),
/// or press 刷新ticket in the ISV console.
pub const TICKET_REFUSED: i64 = 40085;

/// What a corp's authorisation gave: who it is and the code that stands for it.
#[derive(Clone, PartialEq, Eq)]
pub struct Authorisation {
    /// The corp's id (`auth_corp_info.corpid`; an ISV sees it encrypted, case-sensitive).
    pub corp_id: String,
    /// The corp's name, when WeCom gave it.
    pub corp_name: Option<String>,
    /// The permanent code: with the suite's token it fetches the corp's token (a 代开发 app's
    /// permanent code is its secret). A secret: never logged.
    pub permanent_code: String,
    /// The suite's agent in the corp (`auth_info.agent[0].agentid`), when WeCom gave one.
    pub agent_id: Option<i64>,
}

impl std::fmt::Debug for Authorisation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorisation")
            .field("corp_id", &self.corp_id)
            .field("corp_name", &self.corp_name)
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

/// One suite's API.
pub struct WecomSuiteApi {
    http: reqwest::Client,
    domain: String,
    suite_id: String,
    secret: String,
}

impl std::fmt::Debug for WecomSuiteApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WecomSuiteApi")
            .field("domain", &self.domain)
            .field("suite_id", &self.suite_id)
            .finish_non_exhaustive()
    }
}

impl WecomSuiteApi {
    /// The suite's id.
    pub fn suite_id(&self) -> &str {
        &self.suite_id
    }

    /// The suite `suite_id` with its `secret`, at `domain` (`https://qyapi.weixin.qq.com` or a
    /// local server), each call within `timeout`.
    pub fn new(
        domain: &str,
        suite_id: &str,
        secret: &str,
        timeout: Duration,
    ) -> Result<Self, SendError> {
        if secret.trim().is_empty() || suite_id.trim().is_empty() {
            return Err(SendError::Permanent {
                code: 0,
                message: "a suite needs its suite_id and suite_secret".into(),
            });
        }
        Ok(Self {
            http: client(timeout)?,
            domain: domain.trim_end_matches('/').to_owned(),
            suite_id: suite_id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// Its HTTP client, for the suite's corps' senders to share.
    pub fn http(&self) -> reqwest::Client {
        self.http.clone()
    }

    /// The API address it calls.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Whether this is a 代开发 template (`dk…`): its corps' tokens come from `gettoken` with
    /// the permanent code as the app's secret, not from `get_corp_token`.
    pub fn is_custom_template(&self) -> bool {
        self.suite_id.starts_with("dk")
    }

    /// The suite token (`get_suite_token`) for the newest pushed `ticket`, with its lifetime.
    pub async fn suite_token(&self, ticket: &str) -> Result<(String, Duration), SendError> {
        let body = json!({
            "suite_id": self.suite_id,
            "suite_secret": self.secret,
            "suite_ticket": ticket,
        });
        let answer = self
            .post("/cgi-bin/service/get_suite_token", None, &body)
            .await?;
        token_answer(
            &answer,
            "suite_access_token",
            "check suite_id and suite_secret; a refused ticket (40085) is replaced by the next \
             push within 10 minutes",
        )
    }

    /// Exchanges a `create_auth` (or `reset_permanent_code`) push's one-use `auth_code` for the
    /// corp's permanent code.
    pub async fn permanent_code(
        &self,
        suite_token: &str,
        auth_code: &str,
    ) -> Result<Authorisation, SendError> {
        let answer = self
            .post(
                "/cgi-bin/service/get_permanent_code",
                Some(suite_token),
                &json!({ "auth_code": auth_code }),
            )
            .await?;
        let doc = checked(&answer, "get_permanent_code")?;
        let corp = &doc["auth_corp_info"];
        let (Some(corp_id), Some(permanent_code)) =
            (corp["corpid"].as_str(), doc["permanent_code"].as_str())
        else {
            return Err(SendError::Permanent {
                code: 0,
                message: "get_permanent_code answered without auth_corp_info.corpid or \
                          permanent_code"
                    .into(),
            });
        };
        Ok(authorisation(&doc, corp_id, permanent_code))
    }

    /// A corp's authorisation as it stands now (`get_auth_info`), for its `permanent_code`:
    /// what a `change_auth` push asks the ISV to read again (its agent may have changed).
    pub async fn auth_info(
        &self,
        suite_token: &str,
        corp_id: &str,
        permanent_code: &str,
    ) -> Result<Authorisation, SendError> {
        let answer = self
            .post(
                "/cgi-bin/service/get_auth_info",
                Some(suite_token),
                &json!({ "auth_corpid": corp_id, "permanent_code": permanent_code }),
            )
            .await?;
        let doc = checked(&answer, "get_auth_info")?;
        Ok(authorisation(&doc, corp_id, permanent_code))
    }

    /// Corp `corp_id`'s token: `get_corp_token` with the suite token, or for a 代开发 template
    /// `gettoken` with the permanent code as the secret (no suite token needed).
    pub async fn corp_token(
        &self,
        suite_token: Option<&str>,
        corp_id: &str,
        permanent_code: &str,
    ) -> Result<(String, Duration), SendError> {
        if self.is_custom_template() {
            return gettoken(&self.http, &self.domain, corp_id, permanent_code).await;
        }
        let answer = self
            .post(
                "/cgi-bin/service/get_corp_token",
                suite_token,
                &json!({ "auth_corpid": corp_id, "permanent_code": permanent_code }),
            )
            .await?;
        token_answer(
            &answer,
            "access_token",
            "the corp's authorisation may have been cancelled",
        )
    }

    async fn post(
        &self,
        path: &str,
        suite_token: Option<&str>,
        body: &Value,
    ) -> Result<Vec<u8>, SendError> {
        let mut request = self.http.post(format!("{}{path}", self.domain));
        if let Some(token) = suite_token {
            request = request.query(&[("suite_access_token", token)]);
        }
        let sent = request.json(body).send().await.map_err(|error| {
            SendError::Transient(format!(
                "{path}: {}",
                oncegate_core::redact::causes(&error.without_url())
            ))
        })?;
        crate::feishu::read(sent)
            .await
            .map_err(SendError::Transient)
    }
}

/// What an answer with `auth_corp_info` and `auth_info` says of `corp_id`, whose code is
/// `permanent_code`.
fn authorisation(doc: &Value, corp_id: &str, permanent_code: &str) -> Authorisation {
    Authorisation {
        corp_id: corp_id.to_owned(),
        corp_name: doc["auth_corp_info"]["corp_name"]
            .as_str()
            .map(str::to_owned),
        permanent_code: permanent_code.to_owned(),
        agent_id: doc["auth_info"]["agent"][0]["agentid"].as_i64(),
    }
}

/// WeCom's answer as JSON when it is a success ("在调用失败时才返回errcode").
fn checked(body: &[u8], call: &str) -> Result<Value, SendError> {
    let doc: Value = serde_json::from_slice(body)
        .map_err(|error| SendError::Transient(format!("{call} answer: {error}")))?;
    match doc["errcode"].as_i64().unwrap_or(0) {
        0 => Ok(doc),
        -1 => Err(SendError::Transient(format!("WeCom is busy ({call})"))),
        code => Err(SendError::Permanent {
            code,
            message: format!(
                "{call} refused: {}",
                doc["errmsg"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            ),
        }),
    }
}
