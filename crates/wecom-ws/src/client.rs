//! One bot's connection, kept open: dial, subscribe, run, and after a loss dial again with
//! backoff and jitter (a second, doubling to thirty). A takeover (`disconnected_event`) and a
//! subscribe WeCom keeps refusing end the run and are told to the caller.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncegate_longconn::backoff;
use oncegate_wecom::AiBot;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
use tokio_util::sync::CancellationToken;

use crate::connection::{self, Context, End};
use crate::{Inlet, Settings, Status};

/// A connection that ends sooner than this after opening counts as a failed attempt.
const STABLE: Duration = Duration::from_secs(10);
/// The longest wait between attempts (the official SDK's).
const WAIT_MAX: Duration = Duration::from_secs(30);
/// Subscribes refused in a row before the bot's connection stops for good: a wrong secret
/// stays wrong, but a refusal may also be WeCom protecting its subscribe rate.
const REFUSALS: u32 = 3;
/// The largest message the socket reads whole: beyond it the connection ends. Larger than the
/// largest frame taken ([`crate::connection::MAX_FRAME`]), so that a frame between the two is
/// read and dropped, and the frames behind it still arrive.
const MAX_MESSAGE: usize = 16 << 20;

/// Why a bot's connection cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A setting is out of range.
    #[error("{0}")]
    Settings(String),
}

/// How [`AiBotConnection::run`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Shutdown was asked for.
    Shutdown,
    /// WeCom ended the connection because another subscribe took the bot over. Dialling again
    /// at once would take it back and start a ping-pong: the caller decides.
    Kicked,
    /// WeCom refused the subscribe again and again; the reason is in the status too.
    Fatal(String),
}

/// One AI bot's long connection.
pub struct AiBotConnection<I> {
    context: Arc<Context<I>>,
}

impl<I: Inlet> AiBotConnection<I> {
    /// Checks the settings; nothing is dialled before [`AiBotConnection::run`].
    pub fn new(bot: AiBot, settings: Settings, inlet: Arc<I>) -> Result<Self, SetupError> {
        if settings.secret.trim().is_empty() {
            return Err(SetupError::Settings(
                "the bot's secret is empty: the subscribe needs it".into(),
            ));
        }
        if settings.ping_every.is_zero() || settings.missed_pings == 0 {
            return Err(SetupError::Settings(
                "ping_every and missed_pings must be above zero".into(),
            ));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Self {
            context: Arc::new(Context {
                bot,
                settings,
                inlet,
                status: Arc::new(Status::default()),
                outbound: Arc::new(crate::Outbound::default()),
                replies: connection::Replies::default(),
                held: Arc::new(tokio::sync::Semaphore::new(connection::HELD_BYTES)),
            }),
        })
    }

    /// Reports into `status` instead of a status of its own.
    pub fn with_status(mut self, status: Arc<Status>) -> Self {
        if let Some(context) = Arc::get_mut(&mut self.context) {
            context.status = status;
        }
        self
    }

    /// Takes the bot's own commands (proactive sends) from `outbound` while subscribed.
    pub fn with_outbound(mut self, outbound: Arc<crate::Outbound>) -> Self {
        if let Some(context) = Arc::get_mut(&mut self.context) {
            context.outbound = outbound;
        }
        self
    }

    /// What the connection is doing.
    pub fn status(&self) -> Arc<Status> {
        self.context.status.clone()
    }

    /// Holds the connection until `shutdown`, a takeover, or a subscribe refused for good.
    pub async fn run(&self, shutdown: CancellationToken) -> Ended {
        let settings = &self.context.settings;
        let source = settings.source.clone();
        let gauge = metrics::gauge!("oncegate_ws_connections", "source" => source.clone());
        // Attempts in a row that failed or were lost at once: what the backoff counts.
        let mut unsettled: u32 = 0;
        let mut refusals: u32 = 0;
        loop {
            let started = Instant::now();
            let end = self.session(&shutdown, &gauge).await;
            let (reason, detail) = match end {
                End::Shutdown => return Ended::Shutdown,
                End::Kicked => {
                    metrics::counter!("oncegate_ws_reconnects_total", "source" => source.clone(), "reason" => "kicked")
                        .increment(1);
                    return Ended::Kicked;
                }
                End::Refused(why) => {
                    refusals += 1;
                    if refusals >= REFUSALS {
                        tracing::error!(source = %source, "long connection stopped: {why}");
                        self.context.status.set_fatal(why.clone());
                        return Ended::Fatal(why);
                    }
                    ("refused", why)
                }
                End::Lost { reason, detail } => {
                    refusals = 0;
                    (reason, detail)
                }
            };
            self.context.status.reconnected();
            metrics::counter!("oncegate_ws_reconnects_total", "source" => source.clone(), "reason" => reason)
                .increment(1);
            unsettled = match started.elapsed() < STABLE {
                true => unsettled.saturating_add(1),
                false => 1,
            };
            let wait = backoff(Duration::ZERO, unsettled).min(WAIT_MAX);
            self.context.inlet.note(
                "ws_connection_lost",
                &format!(
                    "long connection {source} lost: {detail}; dialling again in {} ms",
                    wait.as_millis()
                ),
            );
            tokio::select! {
                _ = shutdown.cancelled() => return Ended::Shutdown,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Dials, subscribes and runs one connection until it ends.
    async fn session(&self, shutdown: &CancellationToken, gauge: &metrics::Gauge) -> End {
        let settings = &self.context.settings;
        let shown = oncegate_core::redact::url(&settings.url);
        let dialled = tokio::select! {
            _ = shutdown.cancelled() => return End::Shutdown,
            dialled = tokio::time::timeout(settings.connect_timeout, dial(&settings.url)) => dialled,
        };
        let socket = match dialled {
            Ok(Ok(socket)) => socket,
            Ok(Err(error)) => {
                return End::Lost {
                    reason: "connect_failed",
                    detail: format!("handshake with {shown}: {error}"),
                };
            }
            Err(_) => {
                return End::Lost {
                    reason: "connect_failed",
                    detail: format!(
                        "handshake with {shown} took longer than {:?}",
                        settings.connect_timeout
                    ),
                };
            }
        };
        gauge.set(1.0);
        tracing::info!(source = %settings.source, url = %shown, "long connection open");
        let end = connection::run(self.context.clone(), socket, shutdown).await;
        gauge.set(0.0);
        end
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn dial(url: &str) -> Result<Socket, tungstenite::Error> {
    let request = url.into_client_request()?;
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let (socket, _) =
        tokio_tungstenite::connect_async_with_config(request, Some(config), true).await?;
    Ok(socket)
}
