//! The Feishu/Lark open API: `tenant_access_token` shared by all callers, and message sends
//! and replies that carry a `uuid`, so that a repeat within Feishu's hour sends once even if
//! oncegate itself lost track.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::token::{TokenCache, TokenSource};
use crate::{Limit, SendError};

/// Feishu's answers that no retry changes: a receiver the bot cannot reach, a card older than
/// 14 days, a streaming card that expired, and the like.
const PERMANENT: &[i64] = &[
    230001, 230002, 230006, 230011, 230013, 230017, 230018, 230031, 230099, 200850, 99991672,
];
/// "request trigger frequency limit" (HTTP 429), and the message API's own limit (HTTP 400).
const RATE_LIMITED: &[i64] = &[99991400, CHAT_LIMITED];
/// The send-message limit of one chat (5 per second, shared by the chat's bots).
const CHAT_LIMITED: i64 = 230020;

/// Which budget a 429 speaks of: `x-ogw-ratelimit-limit` is the window's limit, and a limit of
/// at most 5 is a receiver's (5 per second to a user or a chat); any other, or none, the app's
/// in its tenant (50 per second, 1 000 per minute for sends).
fn limit_of(window: Option<u64>) -> Limit {
    match window {
        Some(1..=5) => Limit::Receiver,
        _ => Limit::App,
    }
}
/// The token is not (or no longer) valid.
const BAD_TOKEN: &[i64] = &[99991663, 99991671, 99991661];
/// The largest answer read from Feishu.
const MAX_ANSWER: usize = 1 << 20;

/// One message to send, or to send as a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `chat_id`, `open_id`, `user_id`, `union_id` or `email`.
    pub receive_id_type: String,
    /// Who receives it (for a reply: ignored).
    pub receive_id: String,
    /// `text`, `post`, `interactive`, …
    pub msg_type: String,
    /// The content document, as Feishu takes it: a JSON string.
    pub content: String,
    /// Reply to this message instead of sending to `receive_id`.
    pub reply_to: Option<String>,
    /// Update this (card) message's content instead: streaming cards edit one message many
    /// times.
    pub update_of: Option<String>,
    /// Feishu's idempotency key (at most 50 characters): the same for every retry.
    pub uuid: String,
}

/// The receiver id types Feishu's send API takes (`receive_id_type`).
pub const RECEIVE_ID_TYPES: [&str; 5] = ["chat_id", "open_id", "user_id", "union_id", "email"];

/// The longest message id taken: Feishu's are `om_` and 32 hex digits.
const MESSAGE_ID_MAX: usize = 128;

impl Message {
    /// Refuses what must not reach Feishu's URL: the ids that go into its path (`reply_to`,
    /// `update_of`) must be message ids (`om_` and letters, digits, `_` or `-`), and the
    /// receiver id type one of [`RECEIVE_ID_TYPES`] — else `"../../contact/v3/…"` would make
    /// the bot's token call another API. What is wrong, to say to the caller.
    pub fn check(&self) -> Result<(), String> {
        for (field, id) in [("reply_to", &self.reply_to), ("update", &self.update_of)] {
            if let Some(id) = id
                && !is_message_id(id)
            {
                return Err(format!(
                    "{field} must be a Feishu message id: om_ and up to {MESSAGE_ID_MAX} letters, digits, _ or -"
                ));
            }
        }
        if self.update_of.is_none()
            && self.reply_to.is_none()
            && !RECEIVE_ID_TYPES.contains(&self.receive_id_type.as_str())
        {
            return Err(format!(
                "receive_id_type must be one of {}",
                RECEIVE_ID_TYPES.join(", ")
            ));
        }
        Ok(())
    }
}

fn is_message_id(id: &str) -> bool {
    id.strip_prefix("om_").is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= MESSAGE_ID_MAX
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// How an app gets its token.
enum Tokens {
    /// A custom app's own: `tenant_access_token/internal` with its secret, cached here.
    Own { secret: String, cache: TokenCache },
    /// A store app's tenant's, which the gateway keeps (`tenant_access_token` per tenant).
    Supplied(Arc<dyn TokenSource>),
}

/// One app's client (for a store app: one tenant's).
pub struct FeishuApi {
    http: reqwest::Client,
    domain: String,
    app_id: String,
    tokens: Tokens,
}

impl std::fmt::Debug for FeishuApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuApi")
            .field("domain", &self.domain)
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

impl FeishuApi {
    /// The app it sends as.
    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// A client of `domain` (`https://open.feishu.cn`, `https://open.larksuite.com`, or a
    /// local server) for one app; every call is bounded by `timeout`.
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
        Self::build(
            domain,
            app_id,
            Tokens::Own {
                secret: app_secret.to_owned(),
                cache: TokenCache::default(),
            },
            timeout,
        )
    }

    /// A client of one tenant of a store app, whose token `tokens` supplies (the gateway's,
    /// kept per tenant): it never holds a token of another tenant. It calls through `http`,
    /// which the app's tenants share (one connection pool and TLS setup, not one per tenant).
    pub fn with_tokens(
        domain: &str,
        app_id: &str,
        tokens: Arc<dyn TokenSource>,
        http: reqwest::Client,
    ) -> Self {
        Self::build_on(http, domain, app_id, Tokens::Supplied(tokens))
    }

    fn build(
        domain: &str,
        app_id: &str,
        tokens: Tokens,
        timeout: Duration,
    ) -> Result<Self, SendError> {
        Ok(Self::build_on(
            crate::wecom::client(timeout)?,
            domain,
            app_id,
            tokens,
        ))
    }

    fn build_on(http: reqwest::Client, domain: &str, app_id: &str, tokens: Tokens) -> Self {
        Self {
            http,
            domain: domain.trim_end_matches('/').to_owned(),
            app_id: app_id.to_owned(),
            tokens,
        }
    }

    async fn token(&self) -> Result<String, SendError> {
        match &self.tokens {
            Tokens::Own { secret, cache } => {
                cache.get(async || self.fetch_token(secret).await).await
            }
            Tokens::Supplied(source) => source.token().await,
        }
    }

    async fn invalidate(&self, token: &str) {
        match &self.tokens {
            Tokens::Own { cache, .. } => cache.invalidate(token).await,
            Tokens::Supplied(source) => source.refused(token).await,
        }
    }

    async fn fetch_token(&self, secret: &str) -> Result<(String, Duration), SendError> {
        let body = json!({"app_id": self.app_id, "app_secret": secret});
        let answer = auth_call(
            &self.http,
            &self.domain,
            "tenant_access_token/internal",
            body,
        )
        .await
        .map_err(|error| match error {
            SendError::Permanent { code, message } => SendError::Permanent {
                code,
                message: format!("{message}; check app_id and app_secret"),
            },
            other => other,
        })?;
        token_of(&answer, "tenant_access_token")
    }

    /// Sends (or replies with) `message`; the platform's answer document on success.
    pub async fn send(&self, message: &Message) -> Result<Value, SendError> {
        // Checked here too, for callers that build a `Message` themselves: nothing unchecked
        // goes into a URL with the bot's token.
        message
            .check()
            .map_err(|message| SendError::Permanent { code: 0, message })?;
        // A token refused mid-way is fetched again once, and the send made once more.
        for attempt in 0..2 {
            let token = self.token().await?;
            match self.send_with(&token, message).await {
                Err(Refused::BadToken) if attempt == 0 => self.invalidate(&token).await,
                Err(Refused::BadToken) => {
                    return Err(SendError::Transient(
                        "Feishu refused a freshly fetched token".into(),
                    ));
                }
                Err(Refused::Send(error)) => return Err(error),
                Ok(answer) => return Ok(answer),
            }
        }
        Err(SendError::Transient("unreachable".into()))
    }

    async fn send_with(&self, token: &str, message: &Message) -> Result<Value, Refused> {
        let (method, url, body) = match (&message.update_of, &message.reply_to) {
            (Some(id), _) => (
                reqwest::Method::PATCH,
                format!("{}/open-apis/im/v1/messages/{id}", self.domain),
                json!({"content": message.content}),
            ),
            (None, Some(parent)) => (
                reqwest::Method::POST,
                format!("{}/open-apis/im/v1/messages/{parent}/reply", self.domain),
                json!({"content": message.content, "msg_type": message.msg_type, "uuid": message.uuid}),
            ),
            (None, None) => (
                reqwest::Method::POST,
                format!(
                    "{}/open-apis/im/v1/messages?receive_id_type={}",
                    self.domain, message.receive_id_type
                ),
                json!({
                    "receive_id": message.receive_id, "msg_type": message.msg_type,
                    "content": message.content, "uuid": message.uuid,
                }),
            ),
        };
        let sent = self
            .http
            .request(method, url)
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .map_err(|error| Refused::Send(classify_io(error)))?;
        let status = sent.status().as_u16();
        let header = |name: &str| {
            sent.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let reset = header("x-ogw-ratelimit-reset");
        let limit = limit_of(header("x-ogw-ratelimit-limit"));
        // The request was taken: an answer cut off leaves the outcome unknown.
        let body = read(sent)
            .await
            .map_err(|error| Refused::Send(SendError::Unknown(error)))?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let code = answer["code"].as_i64();
        let message_text = answer["msg"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect::<String>();
        match code {
            Some(0) if (200..300).contains(&status) => Ok(answer),
            Some(code) if BAD_TOKEN.contains(&code) => Err(Refused::BadToken),
            Some(code) if RATE_LIMITED.contains(&code) || status == 429 => {
                Err(Refused::Send(SendError::RetryAfter {
                    after: Duration::from_secs(reset.unwrap_or(1).clamp(1, 3600)),
                    code,
                    limit: if code == CHAT_LIMITED {
                        Limit::Receiver
                    } else {
                        limit
                    },
                }))
            }
            None if status == 429 => Err(Refused::Send(SendError::RetryAfter {
                after: Duration::from_secs(reset.unwrap_or(1).clamp(1, 3600)),
                code: 0,
                limit,
            })),
            Some(code) if PERMANENT.contains(&code) || (400..500).contains(&status) => {
                Err(Refused::Send(SendError::Permanent {
                    code,
                    message: message_text,
                }))
            }
            // A server error: Feishu did not send it (the uuid makes a retry safe either way).
            code => Err(Refused::Send(SendError::Transient(format!(
                "HTTP {status}, code {}: {message_text}",
                code.map_or_else(|| "none".to_owned(), |c| c.to_string())
            )))),
        }
    }
}

enum Refused {
    BadToken,
    Send(SendError),
}

/// A request error: before anything was sent (no connection) it is transient; once the
/// request may have been written (a timeout, a reset), the outcome is unknown.
fn classify_io(error: reqwest::Error) -> SendError {
    let connect = error.is_connect();
    let text = oncegate_core::redact::causes(&error.without_url());
    if connect {
        SendError::Transient(text)
    } else {
        SendError::Unknown(text)
    }
}

/// `POST /open-apis/auth/v3/<path>` (the tokens, the store app's ticket): Feishu's answer when
/// its code is 0; another code is the platform's refusal, anything else transient.
pub(crate) async fn auth_call(
    http: &reqwest::Client,
    domain: &str,
    path: &str,
    body: Value,
) -> Result<Value, SendError> {
    let url = format!("{domain}/open-apis/auth/v3/{path}");
    let sent = http.post(url).json(&body).send().await.map_err(|error| {
        SendError::Transient(format!(
            "{path}: {}",
            oncegate_core::redact::causes(&error.without_url())
        ))
    })?;
    let status = sent.status().as_u16();
    let body = read(sent)
        .await
        .map_err(|error| SendError::Transient(format!("{path}: {error}")))?;
    let answer: Value = serde_json::from_slice(&body).map_err(|error| {
        SendError::Transient(format!("{path}: HTTP {status}, not JSON: {error}"))
    })?;
    match answer["code"].as_i64() {
        Some(0) => Ok(answer),
        Some(code) => Err(SendError::Permanent {
            code,
            message: format!(
                "{path} refused: {}",
                answer["msg"]
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect::<String>()
            ),
        }),
        None => Err(SendError::Transient(format!(
            "{path}: HTTP {status} without a code"
        ))),
    }
}

/// A token and its life from an auth answer whose code was 0.
pub(crate) fn token_of(answer: &Value, field: &str) -> Result<(String, Duration), SendError> {
    match (answer[field].as_str(), answer["expire"].as_u64()) {
        (Some(token), Some(expire)) if !token.is_empty() => {
            Ok((token.to_owned(), Duration::from_secs(expire)))
        }
        _ => Err(SendError::Transient(format!(
            "Feishu answered code 0 without {field} and expire"
        ))),
    }
}

/// The answer's body within its bound (WeCom's client reads through it too).
pub(crate) async fn read(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_ANSWER {
                    return Err(format!("answer larger than {MAX_ANSWER} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(error) => return Err(error.without_url().to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feishu's documents name the window's limit but not which one it is: a limit of 5 can
    /// only be a receiver's, the app's are 50 per second or 1 000 per minute; no header at all
    /// lowers the app's (the wider, the safer).
    #[test]
    fn a_rate_answer_names_the_budget_it_counts() {
        assert_eq!(limit_of(Some(5)), Limit::Receiver);
        assert_eq!(limit_of(Some(1)), Limit::Receiver);
        assert_eq!(limit_of(Some(50)), Limit::App);
        assert_eq!(limit_of(Some(1000)), Limit::App);
        assert_eq!(limit_of(Some(0)), Limit::App);
        assert_eq!(limit_of(None), Limit::App);
    }
}
