//! Endpoint discovery (`POST {domain}/callback/ws/endpoint`), the client configuration the
//! server hands out, and how failures are classed: fatal (fix the app) or retried.

use std::time::Duration;

use serde::Deserialize;

/// The largest endpoint answer read: a URL and four numbers.
const MAX_ENDPOINT_ANSWER: usize = 64 * 1024;
/// Endpoint code: all well.
const CODE_OK: i64 = 0;
/// Endpoint code: the server is busy; retried.
const CODE_SYSTEM_BUSY: i64 = 1;
/// Endpoint code: the server failed; retried.
const CODE_INTERNAL: i64 = 1_000_040_343;
/// "request trigger frequency limit" (PROTOCOLS: feishu.md, rate limits).
const CODE_RATE_LIMITED: i64 = 99_991_400;
/// Handshake auth error: the app has as many connections as Feishu allows (50).
pub const AUTH_EXCEED_CONN_LIMIT: i64 = 1_000_040_350;

/// The server's settings for a client, all in seconds as Feishu sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ClientConfig {
    /// Reconnect attempts after a connection is lost; negative: no end.
    #[serde(rename = "ReconnectCount")]
    pub reconnect_count: i64,
    /// Seconds between reconnect attempts.
    #[serde(rename = "ReconnectInterval")]
    pub reconnect_interval: u64,
    /// The first reconnect waits a random time below this many seconds, so that many clients
    /// cut off at once do not come back at once.
    #[serde(rename = "ReconnectNonce")]
    pub reconnect_nonce: u64,
    /// Seconds between pings.
    #[serde(rename = "PingInterval")]
    pub ping_interval: u64,
}

impl Default for ClientConfig {
    /// The SDKs' settings before the server said otherwise.
    fn default() -> Self {
        Self {
            reconnect_count: -1,
            reconnect_interval: 120,
            reconnect_nonce: 30,
            ping_interval: 120,
        }
    }
}

impl ClientConfig {
    /// The ping period, at least a second and at most an hour whatever the server says.
    pub fn ping_every(&self) -> Duration {
        Duration::from_secs(self.ping_interval.clamp(1, 3600))
    }

    /// The wait between reconnect attempts, at most an hour.
    pub fn retry_every(&self) -> Duration {
        Duration::from_secs(self.reconnect_interval.min(3600))
    }

    /// The random wait before the first reconnect attempt, below `reconnect_nonce`.
    pub fn first_delay(&self) -> Duration {
        let nonce_ms = self.reconnect_nonce.min(3600) * 1000;
        Duration::from_millis(if nonce_ms == 0 {
            0
        } else {
            fastrand::u64(0..nonce_ms)
        })
    }

    /// Takes the settings of a pong's payload, when it carries any (a partial document
    /// changes only what it names).
    pub fn apply(&mut self, payload: &[u8]) -> bool {
        #[derive(Deserialize)]
        struct Update {
            #[serde(rename = "ReconnectCount")]
            reconnect_count: Option<i64>,
            #[serde(rename = "ReconnectInterval")]
            reconnect_interval: Option<u64>,
            #[serde(rename = "ReconnectNonce")]
            reconnect_nonce: Option<u64>,
            #[serde(rename = "PingInterval")]
            ping_interval: Option<u64>,
        }
        let Ok(update) = serde_json::from_slice::<Update>(payload) else {
            return false;
        };
        let before = *self;
        self.reconnect_count = update.reconnect_count.unwrap_or(self.reconnect_count);
        self.reconnect_interval = update.reconnect_interval.unwrap_or(self.reconnect_interval);
        self.reconnect_nonce = update.reconnect_nonce.unwrap_or(self.reconnect_nonce);
        self.ping_interval = update.ping_interval.unwrap_or(self.ping_interval);
        before != *self
    }
}

/// Where to connect, and how to behave there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The `ws://` or `wss://` URL, with its credentials in the query: never log it whole.
    pub url: String,
    /// `service_id` of the URL: every frame the client sends names it.
    pub service: i32,
    /// The server's settings.
    pub config: ClientConfig,
}

/// Why no connection could be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The app or its credentials are wrong, or it has too many connections: retrying cannot
    /// help until someone changes something.
    #[error("{0}")]
    Fatal(String),
    /// The server or the network failed; retried on the reconnect settings.
    #[error("{0}")]
    Retry(String),
    /// The endpoint did not answer at all (nothing listens, a reset, a timeout): no server
    /// asked for an interval, so the client's own short backoff applies — a gateway started
    /// before its endpoint (a local Feishu, a proxy coming up) connects within seconds, not
    /// after the default two minutes.
    #[error("{0}")]
    Unreachable(String),
}

impl ConnectError {
    /// Whether retrying cannot help.
    pub fn is_fatal(&self) -> bool {
        matches!(self, ConnectError::Fatal(_))
    }
}

#[derive(Deserialize)]
struct Answer {
    code: i64,
    #[serde(default)]
    msg: String,
    data: Option<AnswerData>,
}

#[derive(Deserialize)]
struct AnswerData {
    #[serde(rename = "URL")]
    url: Option<String>,
    #[serde(rename = "ClientConfig")]
    client_config: Option<ClientConfig>,
}

/// Asks `domain` for a connection URL for the app.
pub async fn discover(
    client: &reqwest::Client,
    domain: &str,
    app_id: &str,
    app_secret: &str,
) -> Result<Endpoint, ConnectError> {
    let url = format!("{}/callback/ws/endpoint", domain.trim_end_matches('/'));
    let shown = oncegate_core::redact::url(&url);
    let sent = client
        .post(&url)
        .header("locale", "zh")
        .json(&serde_json::json!({ "AppID": app_id, "AppSecret": app_secret }))
        .send()
        .await
        .map_err(|error| {
            ConnectError::Unreachable(format!(
                "endpoint {shown}: {}",
                oncegate_core::redact::causes(&error.without_url())
            ))
        })?;
    let status = sent.status();
    if !status.is_success() {
        return Err(ConnectError::Retry(format!(
            "endpoint {shown} answered HTTP {status}"
        )));
    }
    let body = read_bounded(sent, MAX_ENDPOINT_ANSWER)
        .await
        .map_err(|error| ConnectError::Retry(format!("endpoint {shown}: {error}")))?;
    parse_endpoint(&body)
}

async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| oncegate_core::redact::causes(&error.without_url()))?
    {
        if body.len() + chunk.len() > limit {
            return Err(format!("answer larger than {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The endpoint answer's URL and settings, or why there is none.
pub fn parse_endpoint(body: &[u8]) -> Result<Endpoint, ConnectError> {
    let answer: Answer = serde_json::from_slice(body)
        .map_err(|error| ConnectError::Retry(format!("endpoint answer is not JSON: {error}")))?;
    let msg: String = answer.msg.chars().take(200).collect();
    match answer.code {
        CODE_OK => {}
        // Feishu's frequency limit (its general error code, HTTP 429 elsewhere): wait and try
        // again, like a busy endpoint.
        CODE_SYSTEM_BUSY | CODE_INTERNAL | CODE_RATE_LIMITED => {
            return Err(ConnectError::Retry(format!(
                "endpoint busy (code {}): {msg}",
                answer.code
            )));
        }
        code => {
            return Err(ConnectError::Fatal(format!(
                "endpoint refused the app (code {code}): {msg}; check app_id, app_secret and \
                 that the app is a self-built app subscribed in long-connection mode"
            )));
        }
    }
    let data = answer
        .data
        .ok_or_else(|| ConnectError::Retry("endpoint answer without data".into()))?;
    let url = data
        .url
        .filter(|url| url.starts_with("ws://") || url.starts_with("wss://"))
        .ok_or_else(|| ConnectError::Retry("endpoint answer without a ws(s):// URL".into()))?;
    warn_if_plain(&url);
    let service = service_id(&url).unwrap_or(0);
    Ok(Endpoint {
        url,
        service,
        config: data.client_config.unwrap_or_default(),
    })
}

/// Says once per process when the endpoint hands out a plain `ws://` URL to another machine:
/// the connection's credentials (in its query) and every event then travel in clear.
fn warn_if_plain(url: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(rest) = url.strip_prefix("ws://") else {
        return;
    };
    let host = rest.split(['/', '?', ':']).next().unwrap_or("");
    let local = host == "localhost" || host.starts_with("127.") || rest.starts_with("[::1]");
    if !local && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            host,
            "the long-connection endpoint gave a plain ws:// URL: the connection's credentials \
             and every event travel in clear; check the source's domain (https://open.feishu.cn)"
        );
    }
}

/// `service_id` of the URL's query.
fn service_id(url: &str) -> Option<i32> {
    let query = url.split_once('?')?.1;
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "service_id")
        .and_then(|(_, value)| value.parse().ok())
}

/// Classes a refused WebSocket upgrade by its status and Feishu's `Handshake-*` headers.
pub fn handshake_error(
    status: u16,
    auth_code: Option<&str>,
    message: Option<&str>,
) -> ConnectError {
    let message: String = message.unwrap_or("").chars().take(200).collect();
    let code = auth_code.and_then(|code| code.trim().parse::<i64>().ok());
    match (status, code) {
        (514, Some(AUTH_EXCEED_CONN_LIMIT)) => ConnectError::Fatal(format!(
            "handshake refused: the app has too many connections (Feishu allows 50; \
             1000040350): {message}; lower `connections` or stop other clients of the app"
        )),
        (403, _) => ConnectError::Fatal(format!(
            "handshake forbidden (403): {message}; check that the app may use the long connection"
        )),
        (status, code) => ConnectError::Retry(format!(
            "handshake refused (HTTP {status}, auth code {}): {message}",
            code.map_or_else(|| "none".to_owned(), |code| code.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_answer_gives_url_service_and_settings() {
        let body = br#"{"code":0,"msg":"ok","data":{"URL":"wss://msg.example/ws/v2?device_id=d1&service_id=33&access_key=s","ClientConfig":{"ReconnectCount":3,"ReconnectInterval":2,"ReconnectNonce":1,"PingInterval":5}}}"#;
        let endpoint = parse_endpoint(body).expect("endpoint");
        assert_eq!(endpoint.service, 33);
        assert_eq!(
            endpoint.config,
            ClientConfig {
                reconnect_count: 3,
                reconnect_interval: 2,
                reconnect_nonce: 1,
                ping_interval: 5
            }
        );
        let busy = parse_endpoint(br#"{"code":1,"msg":"busy"}"#);
        assert!(matches!(busy, Err(ConnectError::Retry(_))), "{busy:?}");
        let wrong = parse_endpoint(br#"{"code":10003,"msg":"invalid app"}"#);
        assert!(wrong.is_err_and(|e| e.is_fatal()));
        for body in [
            &b"<html>"[..],
            br#"{"code":0}"#,
            br#"{"code":0,"data":{"URL":"http://x"}}"#,
        ] {
            assert!(matches!(parse_endpoint(body), Err(ConnectError::Retry(_))));
        }
    }

    #[test]
    fn a_pong_changes_only_what_it_names() {
        let mut config = ClientConfig::default();
        assert!(config.apply(br#"{"PingInterval":7}"#));
        assert_eq!(config.ping_every(), Duration::from_secs(7));
        assert_eq!(config.reconnect_interval, 120);
        assert!(!config.apply(br#"{"PingInterval":7}"#), "no change");
        assert!(!config.apply(b"not json"));
        config.ping_interval = 0;
        assert_eq!(config.ping_every(), Duration::from_secs(1), "never zero");
        for _ in 0..100 {
            assert!(config.first_delay() < Duration::from_secs(30));
        }
    }

    #[test]
    fn handshake_refusals_are_classed() {
        assert!(handshake_error(514, Some("1000040350"), Some("exceed")).is_fatal());
        assert!(handshake_error(403, None, None).is_fatal());
        assert!(!handshake_error(514, Some("1000040351"), None).is_fatal());
        assert!(!handshake_error(500, None, None).is_fatal());
        assert!(!handshake_error(514, Some("junk"), None).is_fatal());
    }
}
