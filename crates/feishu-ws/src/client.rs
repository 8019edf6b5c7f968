//! One app's connections: discovery, the handshake, and reconnects on the server's settings
//! (a random first delay below `ReconnectNonce`, then `ReconnectInterval`, at most
//! `ReconnectCount` attempts), never faster than a backoff of our own: a server that says
//! "again at once" (or a connection that is lost as soon as it opens) gets attempts one, two,
//! four … up to sixty seconds apart, with jitter. Fatal answers stop the app's connections and
//! say why; the rest is summarized, not logged per attempt.

use std::sync::Arc;
use std::time::Duration;

use oncegate_feishu::FeishuApp;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
use tokio_util::sync::CancellationToken;

use crate::connection::{self, Context, End};
use crate::endpoint::{self, ConnectError, Endpoint};
use oncegate_longconn::backoff;

use crate::{ClientConfig, Inlet, MAX_CONNECTIONS, Settings, Status};

/// A connection that ends sooner than this after opening counts as a failed attempt for the
/// backoff: the server keeps taking it and dropping it.
const STABLE: Duration = Duration::from_secs(10);

/// The longest wait between dials of an endpoint that did not answer at all (one HTTP request
/// each): a gateway started before its endpoint connects within seconds of it.
const UNANSWERED_MAX: Duration = Duration::from_secs(10);

/// The largest WebSocket message taken: Feishu splits events into fragments well below it.
const MAX_MESSAGE: usize = 4 << 20;

/// Why a long connection cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A setting is out of range.
    #[error("{0}")]
    Settings(String),
    /// The HTTP client for endpoint discovery could not be built.
    #[error("endpoint client: {0}")]
    Client(String),
}

/// One app's long connection: `settings.connections` sockets, each kept open.
pub struct LongConnection<I> {
    context: Arc<Context<I>>,
    http: reqwest::Client,
}

impl<I: Inlet> LongConnection<I> {
    /// Checks the settings; nothing is dialled before [`LongConnection::run`].
    pub fn new(app: FeishuApp, settings: Settings, inlet: Arc<I>) -> Result<Self, SetupError> {
        if settings.connections == 0 || settings.connections > MAX_CONNECTIONS {
            return Err(SetupError::Settings(format!(
                "connections = {}: Feishu allows 1 to {MAX_CONNECTIONS} per app",
                settings.connections
            )));
        }
        if settings.app_secret.trim().is_empty() {
            return Err(SetupError::Settings(
                "the app secret is empty: the endpoint needs it".into(),
            ));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(settings.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| SetupError::Client(error.to_string()))?;
        Ok(Self {
            context: Arc::new(Context {
                app,
                counters: crate::connection::EventCounters::new(&settings.source),
                settings,
                inlet,
                status: Arc::new(Status::default()),
            }),
            http,
        })
    }

    /// Reports into `status` instead of a status of its own (a caller that outlives several
    /// runs keeps one).
    pub fn with_status(mut self, status: Arc<Status>) -> Self {
        if let Some(context) = Arc::get_mut(&mut self.context) {
            context.status = status;
        }
        self
    }

    /// What the connections are doing.
    pub fn status(&self) -> Arc<Status> {
        self.context.status.clone()
    }

    /// Holds the connections until `shutdown` is cancelled, or until a fatal answer stopped
    /// them all.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut slots = JoinSet::new();
        for slot in 0..self.context.settings.connections {
            let (this, shutdown) = (self.clone(), shutdown.clone());
            slots.spawn(async move { this.keep_open(slot, shutdown).await });
        }
        let gauge = self.clone().report(shutdown.clone());
        tokio::select! {
            _ = async { while slots.join_next().await.is_some() {} } => {}
            _ = gauge => {}
        }
        metrics::gauge!("oncegate_ws_connections", "source" => self.context.settings.source.clone())
            .set(0.0);
    }

    /// Updates the gauges every second.
    async fn report(self: Arc<Self>, shutdown: CancellationToken) {
        let source = self.context.settings.source.clone();
        let open = metrics::gauge!("oncegate_ws_connections", "source" => source.clone());
        let age = metrics::gauge!("oncegate_ws_last_frame_age_seconds", "source" => source);
        // Before the first frame the age counts from the start: a connection that never got
        // one is silent, not fresh (0 would look healthy to an alert).
        let started = crate::unix_ms();
        loop {
            let status = &self.context.status;
            open.set(status.open() as f64);
            let last = status.last_frame_ms().max(started);
            age.set(crate::unix_ms().saturating_sub(last) as f64 / 1000.0);
            tokio::select! {
                _ = shutdown.cancelled() => return std::future::pending().await,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Keeps connection `slot` open: dial, run, and after a loss or a failure wait as the
    /// server's settings say and dial again.
    async fn keep_open(&self, slot: usize, shutdown: CancellationToken) {
        let settings = &self.context.settings;
        let mut config = ClientConfig::default();
        let mut failures: i64 = 0;
        // Attempts in a row that failed or were lost at once: what the backoff counts.
        let mut unsettled: u32 = 0;
        loop {
            let started = std::time::Instant::now();
            let delay = match self.session(&mut config, &shutdown).await {
                Ok(End::Shutdown) => return,
                Ok(End::Lost { reason, detail }) => {
                    self.context.status.reconnected();
                    metrics::counter!("oncegate_ws_reconnects_total", "source" => settings.source.clone(), "reason" => reason)
                        .increment(1);
                    self.context.inlet.note(
                        "ws_connection_lost",
                        &format!(
                            "long connection {} (slot {slot}) lost: {detail}; dialling again",
                            settings.source
                        ),
                    );
                    failures = 0;
                    unsettled = match started.elapsed() < STABLE {
                        true => unsettled.saturating_add(1),
                        false => 0,
                    };
                    backoff(config.first_delay(), unsettled)
                }
                Err(ConnectError::Fatal(reason)) => {
                    metrics::counter!("oncegate_ws_reconnects_total", "source" => settings.source.clone(), "reason" => "fatal")
                        .increment(1);
                    tracing::error!(source = %settings.source, slot, "long connection stopped: {reason}");
                    self.context.status.set_fatal(reason);
                    return;
                }
                Err(error @ (ConnectError::Retry(_) | ConnectError::Unreachable(_))) => {
                    let unanswered = matches!(error, ConnectError::Unreachable(_));
                    let reason = error.to_string();
                    failures += 1;
                    metrics::counter!("oncegate_ws_reconnects_total", "source" => settings.source.clone(), "reason" => "connect_failed")
                        .increment(1);
                    if config.reconnect_count >= 0 && failures > config.reconnect_count {
                        let reason = format!(
                            "gave up after {failures} failed attempts (ReconnectCount {}): {reason}",
                            config.reconnect_count
                        );
                        tracing::error!(source = %settings.source, slot, "long connection stopped: {reason}");
                        self.context.status.set_fatal(reason);
                        return;
                    }
                    self.context.inlet.note(
                        "ws_connect_failed",
                        &format!(
                            "long connection {} (slot {slot}) failed {failures} time(s) in a row: \
                             {reason}; retrying",
                            settings.source
                        ),
                    );
                    unsettled = unsettled.saturating_add(1);
                    if unanswered {
                        backoff(Duration::ZERO, unsettled).min(UNANSWERED_MAX)
                    } else {
                        let asked = if failures == 1 {
                            config.first_delay()
                        } else {
                            config.retry_every()
                        };
                        backoff(asked, unsettled)
                    }
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Discovers the endpoint, dials it and runs the connection until it ends.
    async fn session(
        &self,
        config: &mut ClientConfig,
        shutdown: &CancellationToken,
    ) -> Result<End, ConnectError> {
        let settings = &self.context.settings;
        let endpoint = endpoint::discover(
            &self.http,
            &settings.domain,
            self.context.app.app_id(),
            &settings.app_secret,
        )
        .await?;
        *config = endpoint.config;
        let socket = tokio::time::timeout(settings.connect_timeout, dial(&endpoint))
            .await
            .map_err(|_| {
                ConnectError::Retry(format!(
                    "handshake with {} took longer than {:?}",
                    oncegate_core::redact::url(&endpoint.url),
                    settings.connect_timeout
                ))
            })??;
        tracing::info!(source = %settings.source, url = %oncegate_core::redact::url(&endpoint.url), "long connection open");
        self.context.status.opened();
        let end = connection::run(
            self.context.clone(),
            socket,
            endpoint.service,
            config,
            shutdown,
        )
        .await;
        self.context.status.closed();
        Ok(end)
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The WebSocket handshake; a refusal is classed by Feishu's `Handshake-*` headers.
async fn dial(endpoint: &Endpoint) -> Result<Socket, ConnectError> {
    let shown = oncegate_core::redact::url(&endpoint.url);
    let request = endpoint
        .url
        .as_str()
        .into_client_request()
        .map_err(|error| ConnectError::Retry(format!("endpoint URL {shown}: {error}")))?;
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    match tokio_tungstenite::connect_async_with_config(request, Some(config), true).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|value| value.to_str().ok())
            };
            let status = header("handshake-status")
                .and_then(|status| status.trim().parse::<u16>().ok())
                .unwrap_or_else(|| response.status().as_u16());
            Err(endpoint::handshake_error(
                status,
                header("handshake-autherrcode"),
                header("handshake-msg"),
            ))
        }
        Err(error) => Err(ConnectError::Retry(format!(
            "handshake with {shown}: {error}"
        ))),
    }
}
