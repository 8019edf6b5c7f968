//! Registration: the app's credentials for an endpoint and a ticket that opens one connection.

use std::time::Duration;

use serde_json::Value;

use crate::Settings;

/// Why no connection could be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// DingTalk refused the credentials or the app: trying again changes nothing.
    #[error("{0}")]
    Fatal(String),
    /// Worth trying again after a pause.
    #[error("{0}")]
    Retry(String),
}

/// What the registration answered: where to connect, with what.
#[derive(Clone)]
pub struct Ticket {
    /// `wss://…/connect`.
    pub endpoint: String,
    /// Opens one connection, within 90 s.
    pub ticket: String,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// The URL to dial: the endpoint with the ticket, encoded, in its query.
    pub fn url(&self) -> String {
        let ticket =
            percent_encoding::utf8_percent_encode(&self.ticket, percent_encoding::NON_ALPHANUMERIC);
        let joint = if self.endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{}{joint}ticket={ticket}", self.endpoint)
    }
}

/// The longest registration answer read.
const MAX_ANSWER: usize = 64 << 10;

/// Registers for events and robot messages; a refusal of the credentials is fatal.
pub(crate) async fn open(
    http: &reqwest::Client,
    settings: &Settings,
) -> Result<Ticket, ConnectError> {
    let url = format!("{}/v1.0/gateway/connections/open", settings.domain);
    let body = serde_json::json!({
        "clientId": settings.client_id,
        "clientSecret": settings.client_secret,
        "subscriptions": [
            {"type": "EVENT", "topic": "*"},
            {"type": "CALLBACK", "topic": oncegate_dingtalk::stream::BOT_TOPIC},
        ],
        "ua": concat!("oncegate/", env!("CARGO_PKG_VERSION")),
        "localIp": "127.0.0.1",
    });
    let shown = oncegate_core::redact::url(&url);
    let response = http
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|error| ConnectError::Retry(format!("registration at {shown}: {error}")))?;
    let status = response.status();
    let answer = read(response, settings.connect_timeout).await?;
    let document: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    let said = || {
        ["message", "msg", "code"]
            .iter()
            .find_map(|name| document.get(*name).map(|v| v.to_string()))
            .unwrap_or_else(|| String::from_utf8_lossy(&answer[..answer.len().min(200)]).into())
    };
    if status.is_client_error() && status.as_u16() != 429 && status.as_u16() != 408 {
        return Err(ConnectError::Fatal(format!(
            "DingTalk refused the registration ({status}: {}): check app_key and app_secret \
             (the app's Client ID and Client Secret) and that Stream mode is on for the app",
            said()
        )));
    }
    if !status.is_success() {
        return Err(ConnectError::Retry(format!(
            "registration at {shown} answered {status}: {}",
            said()
        )));
    }
    let text = |name: &str| {
        document
            .get(name)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    match (text("endpoint"), text("ticket")) {
        (Some(endpoint), Some(ticket)) => Ok(Ticket {
            endpoint: endpoint.to_owned(),
            ticket: ticket.to_owned(),
        }),
        _ => Err(ConnectError::Retry(format!(
            "registration at {shown} answered without an endpoint and a ticket: {}",
            said()
        ))),
    }
}

/// The answer's body, bounded in size and time.
async fn read(mut response: reqwest::Response, within: Duration) -> Result<Vec<u8>, ConnectError> {
    let mut body = Vec::new();
    let reading = async {
        while let Some(chunk) = response.chunk().await.map_err(|error| error.to_string())? {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(format!("the answer is larger than {MAX_ANSWER} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(within, reading).await {
        Ok(Ok(())) => Ok(body),
        Ok(Err(error)) => Err(ConnectError::Retry(format!("registration answer: {error}"))),
        Err(_) => Err(ConnectError::Retry(format!(
            "registration answer took longer than {within:?}"
        ))),
    }
}
