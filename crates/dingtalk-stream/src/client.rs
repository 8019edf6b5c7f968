//! One app's Stream connection kept open: register, dial, run, and after a loss dial again on
//! a new ticket, with a backoff that keeps many gateways out of step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;

use crate::connection::{self, Context, End};
use crate::register::{self, ConnectError};
use crate::{Inlet, Settings, Status};

/// The largest WebSocket message taken.
const MAX_MESSAGE: usize = 4 << 20;
/// A connection that stayed open this long was a success: the backoff starts over.
const STABLE: Duration = Duration::from_secs(30);

/// Why a Stream connection cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A setting is empty or out of range.
    #[error("{0}")]
    Settings(String),
    /// The HTTP client for the registration could not be built.
    #[error("registration client: {0}")]
    Client(String),
}

/// One app's Stream connection.
pub struct StreamConnection<I> {
    context: Arc<Context<I>>,
    http: reqwest::Client,
}

impl<I: Inlet> StreamConnection<I> {
    /// Checks the settings; nothing is dialled before [`StreamConnection::run`].
    pub fn new(settings: Settings, inlet: Arc<I>) -> Result<Self, SetupError> {
        for (name, value) in [
            ("app_key", &settings.client_id),
            ("app_secret", &settings.client_secret),
        ] {
            if value.trim().is_empty() {
                return Err(SetupError::Settings(format!(
                    "{name} is empty: Stream mode registers with the app's Client ID and Secret"
                )));
            }
        }
        if settings.silence <= settings.ping_every {
            return Err(SetupError::Settings(format!(
                "silence ({:?}) must be longer than the ping interval ({:?})",
                settings.silence, settings.ping_every
            )));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(settings.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| SetupError::Client(error.to_string()))?;
        Ok(Self {
            context: Arc::new(Context {
                settings,
                inlet,
                status: Arc::new(Status::default()),
            }),
            http,
        })
    }

    /// Reports into `status` instead of a status of its own.
    pub fn with_status(mut self, status: Arc<Status>) -> Self {
        if let Some(context) = Arc::get_mut(&mut self.context) {
            context.status = status;
        }
        self
    }

    /// What the connection is doing.
    pub fn status(&self) -> Arc<Status> {
        self.context.status.clone()
    }

    /// Holds the connection until `shutdown` is cancelled, or until DingTalk refused the
    /// credentials (said in the status).
    pub async fn run(&self, shutdown: CancellationToken) {
        let settings = &self.context.settings;
        let source = settings.source.clone();
        let gauge = metrics::gauge!("oncegate_ws_connections", "source" => source.clone());
        // Attempts in a row that failed or were lost at once: what the backoff counts.
        let mut unsettled: u32 = 0;
        loop {
            let started = Instant::now();
            let outcome = self.session(&shutdown).await;
            gauge.set(self.context.status.open() as f64);
            let (reason, detail) = match outcome {
                Ok(End::Shutdown) => return,
                Ok(End::Lost { reason, detail }) => {
                    self.context.status.reconnected();
                    unsettled = match started.elapsed() < STABLE {
                        true => unsettled.saturating_add(1),
                        false => 0,
                    };
                    // DingTalk's own request for a new connection is answered at once.
                    if reason == "disconnect" {
                        unsettled = 0;
                    }
                    (reason, detail)
                }
                Err(ConnectError::Fatal(reason)) => {
                    metrics::counter!("oncegate_ws_reconnects_total", "source" => source.clone(), "reason" => "fatal")
                        .increment(1);
                    tracing::error!(source = %source, "long connection stopped: {reason}");
                    self.context.status.set_fatal(reason);
                    return;
                }
                Err(ConnectError::Retry(detail)) => {
                    unsettled = unsettled.saturating_add(1);
                    ("connect_failed", detail)
                }
            };
            metrics::counter!("oncegate_ws_reconnects_total", "source" => source.clone(), "reason" => reason)
                .increment(1);
            self.context.inlet.note(
                "ws_connection_lost",
                &format!("long connection {source}: {detail}; dialling again"),
            );
            let delay = oncegate_longconn::backoff(Duration::ZERO, unsettled);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Registers, dials the ticket and runs the connection until it ends.
    async fn session(&self, shutdown: &CancellationToken) -> Result<End, ConnectError> {
        let settings = &self.context.settings;
        let ticket = tokio::select! {
            _ = shutdown.cancelled() => return Ok(End::Shutdown),
            ticket = register::open(&self.http, settings) => ticket?,
        };
        let url = ticket.url();
        let shown = oncegate_core::redact::url(&ticket.endpoint);
        let socket = tokio::time::timeout(settings.connect_timeout, dial(&url, &shown))
            .await
            .map_err(|_| {
                ConnectError::Retry(format!(
                    "handshake with {shown} took longer than {:?}",
                    settings.connect_timeout
                ))
            })??;
        tracing::info!(source = %settings.source, url = %shown, "long connection open");
        self.context.status.opened();
        metrics::gauge!("oncegate_ws_connections", "source" => settings.source.clone())
            .set(self.context.status.open() as f64);
        let end = connection::run(self.context.clone(), socket, shutdown).await;
        self.context.status.closed();
        Ok(end)
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The WebSocket handshake. A refused ticket (used, or older than 90 s) is worth a new one.
async fn dial(url: &str, shown: &str) -> Result<Socket, ConnectError> {
    let request = url
        .into_client_request()
        .map_err(|error| ConnectError::Retry(format!("endpoint URL {shown}: {error}")))?;
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    match tokio_tungstenite::connect_async_with_config(request, Some(config), true).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => Err(ConnectError::Retry(format!(
            "{shown} refused the connection ({}): the ticket was used or expired; registering \
             again",
            response.status()
        ))),
        Err(error) => Err(ConnectError::Retry(format!(
            "handshake with {shown}: {error}"
        ))),
    }
}
