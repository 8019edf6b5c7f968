//! The WeCom app message API: one `access_token` per corp app shared by all callers, sends
//! with WeCom's duplicate check, a cap on calls in flight (45033 is a concurrency limit, not
//! only a rate), and failures classed by what a retry may do.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::SendError;
use crate::token::TokenCache;

/// The token is invalid or expired.
const BAD_TOKEN: &[i64] = &[40014, 42001, 41001];
/// Over a frequency limit (WeCom blocks a minute's excess for 60 s).
pub(crate) const FREQUENCY: i64 = 45009;
/// Too many calls in flight at once.
pub(crate) const CONCURRENCY: i64 = 45033;
/// WeCom is busy: nothing was sent.
pub(crate) const BUSY: i64 = -1;

/// One message: WeCom's own body, with this app's `agentid` and the duplicate check set.
#[derive(Debug, Clone, PartialEq)]
pub struct WecomMessage {
    /// The body sent to `message/send`.
    pub body: Value,
}

impl WecomMessage {
    /// The members it goes to (`touser`, `|`-separated; `@all` is one bucket of its own).
    pub fn members(&self) -> impl Iterator<Item = &str> {
        self.body["touser"]
            .as_str()
            .unwrap_or("")
            .split('|')
            .filter(|member| !member.is_empty())
    }
}

pub use crate::token::{TokenFuture, TokenSource};

/// How an app gets its token.
enum Tokens {
    /// Its own secret, at `gettoken`, cached here.
    Own { secret: String, cache: TokenCache },
    /// Someone else's (a suite's corp token).
    Supplied(Arc<dyn TokenSource>),
}

/// One WeCom app (a corp's agent).
pub struct WecomApi {
    http: reqwest::Client,
    domain: String,
    corp_id: String,
    agent_id: i64,
    duplicate_check_interval: Duration,
    tokens: Tokens,
    in_flight: Semaphore,
}

impl std::fmt::Debug for WecomApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WecomApi")
            .field("domain", &self.domain)
            .field("corp_id", &self.corp_id)
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    /// "在调用失败时才返回errcode": absent is success.
    #[serde(default)]
    errcode: i64,
    #[serde(default)]
    errmsg: String,
    access_token: Option<String>,
    expires_in: Option<u64>,
    #[serde(flatten)]
    others: serde_json::Map<String, Value>,
}

/// How a `WecomApi` behaves.
#[derive(Debug, Clone, Copy)]
pub struct WecomOptions {
    /// One call's deadline.
    pub timeout: Duration,
    /// Calls in flight at once (45033 answers more).
    pub max_in_flight: usize,
    /// WeCom's duplicate check window: the same content within it is delivered once (at most
    /// 4 hours).
    pub duplicate_check_interval: Duration,
}

impl Default for WecomOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            max_in_flight: 16,
            duplicate_check_interval: Duration::from_secs(1800),
        }
    }
}

impl WecomApi {
    /// The corp it sends in.
    pub fn corp_id(&self) -> &str {
        &self.corp_id
    }

    /// The agent (app) of the corp it sends as.
    pub fn agent_id(&self) -> i64 {
        self.agent_id
    }

    /// A client of `domain` (`https://qyapi.weixin.qq.com` or a local server) for agent
    /// `agent_id` of corp `corp_id`, with the app's `secret`.
    pub fn new(
        domain: &str,
        corp_id: &str,
        agent_id: i64,
        secret: &str,
        options: WecomOptions,
    ) -> Result<Self, SendError> {
        if secret.trim().is_empty() {
            return Err(SendError::Permanent {
                code: 0,
                message: "the app secret is empty".into(),
            });
        }
        let tokens = Tokens::Own {
            secret: secret.to_owned(),
            cache: TokenCache::default(),
        };
        Self::build(domain, corp_id, agent_id, tokens, options)
    }

    /// A client for agent `agent_id` of corp `corp_id` whose token comes from `tokens` (a
    /// suite's corp token): never fetched with a secret here. It calls through `http`, which
    /// a suite's corps share (one connection pool and TLS setup, not one per corp).
    pub fn with_tokens(
        domain: &str,
        corp_id: &str,
        agent_id: i64,
        tokens: Arc<dyn TokenSource>,
        options: WecomOptions,
        http: reqwest::Client,
    ) -> Self {
        Self::build_on(
            http,
            domain,
            corp_id,
            agent_id,
            Tokens::Supplied(tokens),
            options,
        )
    }

    fn build(
        domain: &str,
        corp_id: &str,
        agent_id: i64,
        tokens: Tokens,
        options: WecomOptions,
    ) -> Result<Self, SendError> {
        Ok(Self::build_on(
            client(options.timeout)?,
            domain,
            corp_id,
            agent_id,
            tokens,
            options,
        ))
    }

    fn build_on(
        http: reqwest::Client,
        domain: &str,
        corp_id: &str,
        agent_id: i64,
        tokens: Tokens,
        options: WecomOptions,
    ) -> Self {
        Self {
            http,
            domain: domain.trim_end_matches('/').to_owned(),
            corp_id: corp_id.to_owned(),
            agent_id,
            duplicate_check_interval: options
                .duplicate_check_interval
                .min(Duration::from_secs(4 * 3600)),
            tokens,
            in_flight: Semaphore::new(options.max_in_flight.max(1)),
        }
    }

    /// A caller's body as this app's message: `msgtype` and a receiver are required; the
    /// `agentid` is this app's; the duplicate check is on unless the caller turned it off.
    pub fn prepare(&self, mut body: Value) -> Result<WecomMessage, String> {
        let Some(fields) = body.as_object_mut() else {
            return Err("a WeCom send is a JSON object".into());
        };
        if !fields.get("msgtype").is_some_and(Value::is_string) {
            return Err("name msgtype (text, markdown, textcard, …)".into());
        }
        if !["touser", "toparty", "totag"].iter().any(|field| {
            fields
                .get(*field)
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty())
        }) {
            return Err("name touser, toparty or totag".into());
        }
        fields.insert("agentid".into(), self.agent_id.into());
        fields.entry("enable_duplicate_check").or_insert(1.into());
        fields
            .entry("duplicate_check_interval")
            .or_insert(self.duplicate_check_interval.as_secs().into());
        Ok(WecomMessage { body })
    }

    async fn token(&self) -> Result<String, SendError> {
        match &self.tokens {
            Tokens::Own { secret, cache } => {
                cache
                    .get(async || gettoken(&self.http, &self.domain, &self.corp_id, secret).await)
                    .await
            }
            Tokens::Supplied(source) => source.token().await,
        }
    }

    async fn refused(&self, token: &str) {
        match &self.tokens {
            Tokens::Own { cache, .. } => cache.invalidate(token).await,
            Tokens::Supplied(source) => source.refused(token).await,
        }
    }

    /// Sends `message`: WeCom's answer (`msgid`, `invaliduser`, …) on success.
    pub async fn send(&self, message: &WecomMessage) -> Result<Value, SendError> {
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| SendError::Transient("the client is closing".into()))?;
        for attempt in 0..2 {
            let token = self.token().await?;
            let url = format!("{}/cgi-bin/message/send", self.domain);
            let sent = self
                .http
                .post(url)
                .query(&[("access_token", &token)])
                .json(&message.body)
                .send()
                .await
                .map_err(|error| {
                    let connect = error.is_connect();
                    let text = oncegate_core::redact::causes(&error.without_url());
                    if connect {
                        SendError::Transient(text)
                    } else {
                        SendError::Unknown(text)
                    }
                })?;
            let body = crate::feishu::read(sent)
                .await
                .map_err(SendError::Unknown)?;
            let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let code = answer["errcode"].as_i64().unwrap_or(-2);
            let text: String = answer["errmsg"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            match code {
                0 => return Ok(answer),
                code if BAD_TOKEN.contains(&code) && attempt == 0 => {
                    self.refused(&token).await;
                }
                FREQUENCY => {
                    // WeCom blocks the window a minute ("按分钟拦截则被屏蔽60秒").
                    return Err(SendError::RetryAfter {
                        after: Duration::from_secs(60),
                        code,
                        limit: crate::Limit::App,
                    });
                }
                CONCURRENCY => {
                    return Err(SendError::RetryAfter {
                        after: Duration::from_secs(1),
                        code,
                        limit: crate::Limit::Concurrency,
                    });
                }
                BUSY | -2 => return Err(SendError::Transient(format!("code {code}: {text}"))),
                code => {
                    return Err(SendError::Permanent {
                        code,
                        message: text,
                    });
                }
            }
        }
        Err(SendError::Transient(
            "WeCom refused a freshly fetched token".into(),
        ))
    }
}

/// An HTTP client for a platform's API: `timeout` per call, no redirects followed.
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, SendError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|error| SendError::Transient(error.to_string()))
}

/// A corp app's token from `gettoken` with its secret (a 代开发 app's secret is its permanent
/// code): the token and its lifetime.
pub(crate) async fn gettoken(
    http: &reqwest::Client,
    domain: &str,
    corp_id: &str,
    secret: &str,
) -> Result<(String, Duration), SendError> {
    let url = format!("{domain}/cgi-bin/gettoken");
    let sent = http
        .get(url)
        .query(&[("corpid", corp_id), ("corpsecret", secret)])
        .send()
        .await
        .map_err(|error| {
            SendError::Transient(format!(
                "token: {}",
                oncegate_core::redact::causes(&error.without_url())
            ))
        })?;
    let body = crate::feishu::read(sent)
        .await
        .map_err(SendError::Transient)?;
    token_answer(&body, "access_token", "check corp_id and the app's secret")
}

/// A token from a WeCom answer (`field` and `expires_in`), or WeCom's refusal, with `hint`.
pub(crate) fn token_answer(
    body: &[u8],
    field: &str,
    hint: &str,
) -> Result<(String, Duration), SendError> {
    let answer: TokenAnswer = serde_json::from_slice(body)
        .map_err(|error| SendError::Transient(format!("token answer: {error}")))?;
    let token = match field {
        "access_token" => answer.access_token,
        _ => answer
            .others
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    match (answer.errcode, token, answer.expires_in) {
        (0, Some(token), Some(expires)) if !token.is_empty() => {
            Ok((token, Duration::from_secs(expires)))
        }
        (BUSY, _, _) => Err(SendError::Transient(format!("WeCom is busy ({field})"))),
        (code, _, _) => Err(SendError::Permanent {
            code,
            message: format!(
                "{field} refused: {}; {hint}",
                answer.errmsg.chars().take(200).collect::<String>()
            ),
        }),
    }
}
