//! One open socket: frames in, acks out. Pings go out on the writer's own clock, so that a
//! slow store never delays them; silence longer than the settings allow ends the connection.
//! Events of one conversation are admitted in the order they came, others alongside, and each
//! is acked only once the gateway answered for it.

use std::sync::Arc;
use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use oncegate_core::{Admit, Refusal};
use oncegate_dingtalk::stream::{self, Inbound};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::{Inlet, Settings, Status};
pub(crate) use oncegate_longconn::End;

/// Acks waiting for the socket.
const OUTBOX: usize = 1024;
/// Events waiting in one lane.
const LANE_DEPTH: usize = 256;
/// A write that takes longer is a dead connection.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What one connection shares with its lanes.
pub(crate) struct Context<I> {
    pub(crate) settings: Settings,
    pub(crate) inlet: Arc<I>,
    pub(crate) status: Arc<Status>,
}

impl<I: Inlet> Context<I> {
    fn garbage(&self, label: &'static str, detail: &str) {
        oncegate_longconn::bad_frame(&*self.inlet, &self.settings.source, label, detail);
    }
}

/// What a lane admits, and how its ack is answered.
struct Work {
    message_id: String,
    admit: Admit,
    /// A robot message (acked with its empty response, or 500), else an event (acked
    /// `SUCCESS` or `LATER`).
    bot: bool,
}

/// Runs one connection until it ends. Events already taken are still admitted and acked
/// within `settings.drain`; DingTalk pushes again what was not acked, and the keys catch what
/// was admitted twice.
pub(crate) async fn run<I: Inlet, S>(
    context: Arc<Context<I>>,
    socket: S,
    shutdown: &CancellationToken,
) -> End
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
        + futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error>
        + Send
        + Unpin
        + 'static,
{
    let settings = &context.settings;
    let (sink, mut stream) = socket.split();
    let (outbox, letters) = mpsc::channel::<Message>(OUTBOX);
    let ended = CancellationToken::new();
    let writer = tokio::spawn(write(sink, letters, settings.ping_every, ended.clone()));
    let mut lanes = JoinSet::new();
    let senders: Vec<mpsc::Sender<Work>> = (0..settings.lanes.max(1))
        .map(|_| {
            let (lane, work) = mpsc::channel(LANE_DEPTH);
            lanes.spawn(admit_in_order(context.clone(), work, outbox.clone()));
            lane
        })
        .collect();
    let mut heard = Instant::now();
    let end = loop {
        let message = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break End::Shutdown,
            _ = ended.cancelled() => break End::Lost {
                reason: "write_failed",
                detail: "a write to the socket failed or timed out".into(),
            },
            _ = tokio::time::sleep_until((heard + settings.silence).into()) => break End::Lost {
                reason: "silent",
                detail: format!(
                    "nothing heard for {} s: taken for half-open",
                    settings.silence.as_secs()
                ),
            },
            message = stream.next() => message,
        };
        let text = match message {
            None => {
                break End::Lost {
                    reason: "closed",
                    detail: "the server ended the stream".into(),
                };
            }
            Some(Err(error)) => {
                break End::Lost {
                    reason: "socket_error",
                    detail: error.to_string(),
                };
            }
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(close))) => {
                break End::Lost {
                    reason: "closed",
                    detail: format!(
                        "the server closed the connection: {}",
                        close.map_or_else(String::new, |c| format!("{} {}", c.code, c.reason))
                    ),
                };
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {
                heard = Instant::now();
                continue;
            }
            Some(Ok(Message::Binary(_) | Message::Frame(_))) => {
                heard = Instant::now();
                context.garbage(
                    "binary_message",
                    "a binary message; DingTalk sends JSON text",
                );
                continue;
            }
        };
        heard = Instant::now();
        context.status.frame_at(oncegate_longconn::unix_ms());
        let pushed = match stream::decode(text.as_bytes(), &settings.client_id) {
            Ok(pushed) => pushed,
            Err(refusal) => {
                context.garbage(refusal.label, &refusal.message);
                // Answered, not left to be pushed again for want of an ack: an error ack.
                if let Some(id) = stream::message_id_of(text.as_bytes()) {
                    let _ = outbox.send(text_of(stream::ack(&id, 500, "{}"))).await;
                }
                continue;
            }
        };
        let id = pushed.message_id;
        let (admit, bot) = match pushed.inbound {
            Inbound::Ping { data } => {
                oncegate_longconn::count_frame(&settings.source, "ping");
                let _ = outbox.send(text_of(stream::ack(&id, 200, &data))).await;
                continue;
            }
            Inbound::Disconnect { reason } => {
                oncegate_longconn::count_frame(&settings.source, "disconnect");
                // Acked, or the server asks again; then a new connection on a new ticket.
                let _ = outbox.send(text_of(stream::ack(&id, 200, "{}"))).await;
                break End::Lost {
                    reason: "disconnect",
                    detail: format!("DingTalk asked for a new connection ({reason})"),
                };
            }
            Inbound::Unknown { topic } => {
                oncegate_longconn::count_frame(&settings.source, "unknown");
                context.garbage(
                    "unknown_topic",
                    &format!("a frame on topic {topic:?}, which this app did not subscribe to"),
                );
                let _ = outbox.send(text_of(stream::ack(&id, 404, "{}"))).await;
                continue;
            }
            Inbound::Event(admit) => (admit, false),
            Inbound::BotMessage(admit) => (admit, true),
        };
        oncegate_longconn::count_frame(&settings.source, if bot { "callback" } else { "event" });
        // By its conversation, so that one conversation's events are admitted in order.
        let lane = (admit.event.order_hash() % senders.len() as u64) as usize;
        let work = Work {
            message_id: id,
            admit,
            bot,
        };
        // A full lane holds the reader back: backpressure, not loss.
        let _ = senders[lane].send(work).await;
    };
    // What the lanes took is admitted and acked while the socket may still take acks.
    drop(senders);
    drop(outbox);
    let drained = tokio::time::timeout(settings.drain, async {
        while lanes.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        lanes.abort_all();
        ended.cancel();
    }
    // With the lanes done the writer writes what is left and closes the socket.
    if tokio::time::timeout(WRITE_TIMEOUT, writer).await.is_err() {
        ended.cancel();
    }
    end
}

fn text_of(text: String) -> Message {
    Message::Text(text.into())
}

/// Admits one lane's events in order, each acked once the gateway answered for it.
async fn admit_in_order<I: Inlet>(
    context: Arc<Context<I>>,
    mut work: mpsc::Receiver<Work>,
    outbox: mpsc::Sender<Message>,
) {
    let source = context.settings.source.clone();
    while let Some(Work {
        message_id,
        admit,
        bot,
    }) = work.recv().await
    {
        let admitted = context.inlet.admit(admit).await;
        let ack = match (&admitted, bot) {
            (Ok(_), false) => stream::ack(&message_id, 200, &stream::event_status(true, "ok")),
            (Ok(_), true) => stream::ack(&message_id, 200, stream::BOT_ANSWER),
            (Err(refusal), false) => {
                refused(&context, refusal, "acked LATER, DingTalk pushes it again");
                stream::ack(
                    &message_id,
                    200,
                    &stream::event_status(false, &refusal.message),
                )
            }
            (Err(refusal), true) => {
                refused(&context, refusal, "acked with code 500");
                stream::ack(&message_id, 500, "{}")
            }
        };
        let code = if admitted.is_ok() { "200" } else { "later" };
        metrics::counter!("oncegate_ws_acks_total", "source" => source.clone(), "code" => code)
            .increment(1);
        if outbox.send(text_of(ack)).await.is_err() {
            // The connection is gone: DingTalk pushes the event again, and its key says it
            // was admitted.
            return;
        }
    }
}

fn refused<I: Inlet>(context: &Context<I>, refusal: &Refusal, answered: &str) {
    oncegate_longconn::refused(&*context.inlet, &context.settings.source, refusal, answered);
}

/// Writes acks as they come and a ping every `ping_every`; a write that fails or hangs ends
/// the connection. Once every sender is gone, closes the socket.
async fn write<W>(
    mut sink: W,
    mut letters: mpsc::Receiver<Message>,
    ping_every: std::time::Duration,
    ended: CancellationToken,
) where
    W: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    let mut ping = tokio::time::interval(ping_every.max(std::time::Duration::from_millis(100)));
    ping.tick().await;
    loop {
        let message = tokio::select! {
            letter = letters.recv() => match letter {
                Some(letter) => letter,
                None => break,
            },
            _ = ping.tick() => Message::Ping(Vec::new().into()),
            _ = ended.cancelled() => break,
        };
        match tokio::time::timeout(WRITE_TIMEOUT, sink.send(message)).await {
            Ok(Ok(())) => {}
            _ => {
                ended.cancel();
                return;
            }
        }
    }
    let _ = tokio::time::timeout(WRITE_TIMEOUT, sink.close()).await;
}
