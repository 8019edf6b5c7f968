//! One open socket: frames in, acks out. Pings go out on their own task so that a slow store
//! never delays them; silence longer than a ping interval plus grace ends the connection.
//! Events of one chat are admitted in the order they came, other chats' alongside.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use oncegate_core::{Admit, Refusal};
use oncegate_feishu::{FeishuApp, Inbound};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::fragments::{Fragments, Part};
use crate::frame::{Frame, METHOD_CONTROL, METHOD_DATA};
use crate::seen::SeenFrames;
use crate::{ClientConfig, Inlet, Settings, Status, unix_ms};
pub(crate) use oncegate_longconn::End;

/// Acks and pings waiting for the socket.
const OUTBOX: usize = 1024;
/// Events waiting in one lane.
const LANE_DEPTH: usize = 256;
/// Card actions answered at once per connection.
const CARDS_AT_ONCE: usize = 64;
/// A write that takes longer is a dead connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one connection shares with its lanes and card tasks.
pub(crate) struct Context<I> {
    pub(crate) app: FeishuApp,
    pub(crate) settings: Settings,
    pub(crate) inlet: Arc<I>,
    pub(crate) status: Arc<Status>,
    pub(crate) counters: EventCounters,
}

/// The counters every event moves, registered once: a labelled counter looked up by its
/// labels costs an allocation and a registry lookup per event.
pub(crate) struct EventCounters {
    events: metrics::Counter,
    acked: metrics::Counter,
    failed: metrics::Counter,
}

impl EventCounters {
    pub(crate) fn new(source: &str) -> Self {
        let source = source.to_owned();
        Self {
            events: metrics::counter!("oncegate_ws_frames_total", "source" => source.clone(), "type" => "event"),
            acked: metrics::counter!("oncegate_ws_acks_total", "source" => source.clone(), "code" => "200"),
            failed: metrics::counter!("oncegate_ws_acks_total", "source" => source, "code" => "500"),
        }
    }
}

impl<I: Inlet> Context<I> {
    fn count_frame(&self, kind: &'static str) {
        oncegate_longconn::count_frame(&self.settings.source, kind);
    }

    /// A frame that cannot be used: counted, and summarized in the log.
    fn garbage(&self, label: &'static str, detail: &str) {
        oncegate_longconn::bad_frame(&*self.inlet, &self.settings.source, label, detail);
    }
}

struct Work {
    frame: Frame,
    admit: Admit,
    received: Instant,
}

/// Runs one connection until it ends. Work already taken from it is finished (admitted) even
/// after it ended; only its acks are lost then, and Feishu redelivers to a live connection,
/// where the event id catches the repeat.
pub(crate) async fn run<I: Inlet, S>(
    context: Arc<Context<I>>,
    socket: S,
    service: i32,
    config: &mut ClientConfig,
    shutdown: &CancellationToken,
) -> End
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>>
        + futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error>
        + Send
        + Unpin
        + 'static,
{
    let (sink, mut stream) = socket.split();
    let (outbox, letters) = mpsc::channel::<Frame>(OUTBOX);
    let (ping_every, ping_changes) = watch::channel(config.ping_every());
    let ended = CancellationToken::new();
    let writer = tokio::spawn(write(sink, letters, service, ping_changes, ended.clone()));
    let window = Arc::new(Mutex::new(SeenFrames::default()));
    let lanes: Vec<mpsc::Sender<Work>> = (0..context.settings.lanes.max(1))
        .map(|_| {
            let (lane, work) = mpsc::channel(LANE_DEPTH);
            tokio::spawn(admit_in_order(
                context.clone(),
                work,
                outbox.clone(),
                window.clone(),
            ));
            lane
        })
        .collect();
    let cards = Arc::new(Semaphore::new(CARDS_AT_ONCE));
    let mut fragments = Fragments::new(context.settings.fragments);
    let mut reported = 0;
    let mut heard = Instant::now();
    let end = loop {
        let silent_at = heard + context.settings.silence_limit(config);
        let message = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break End::Shutdown,
            message = stream.next() => message,
            _ = ended.cancelled() => break End::Lost {
                reason: "write_failed",
                detail: "a write to the socket failed or timed out".into(),
            },
            _ = tokio::time::sleep_until(silent_at.into()) => break End::Lost {
                reason: "silent",
                detail: format!(
                    "nothing heard for {} ms (ping interval plus grace): taken for half-open",
                    context.settings.silence_limit(config).as_millis()
                ),
            },
        };
        let message = match message {
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
            Some(Ok(message)) => message,
        };
        heard = Instant::now();
        context.status.frame_at(unix_ms());
        let data = match message {
            Message::Binary(data) => data,
            Message::Close(close) => {
                break End::Lost {
                    reason: "closed",
                    detail: format!(
                        "the server closed the connection: {}",
                        close.map_or_else(String::new, |c| format!("{} {}", c.code, c.reason))
                    ),
                };
            }
            // Answered by tungstenite itself.
            Message::Ping(_) | Message::Pong(_) => continue,
            Message::Text(_) | Message::Frame(_) => {
                context.garbage("text_message", "a text message; Feishu sends binary frames");
                continue;
            }
        };
        let frame = match Frame::decode_bytes(&data) {
            Ok(frame) => frame,
            Err(error) => {
                context.garbage(error.label(), &error.to_string());
                continue;
            }
        };
        match frame.method {
            METHOD_CONTROL => control(&context, &frame, config, &ping_every),
            METHOD_DATA => {
                data_frame(
                    &context,
                    frame,
                    &mut fragments,
                    &window,
                    &lanes,
                    &cards,
                    &outbox,
                )
                .await;
                count_dropped(&context, fragments.dropped() - reported);
                reported = fragments.dropped();
            }
            other => context.garbage("bad_method", &format!("frame method {other}")),
        }
    };
    // Parts still waiting die with the connection: Feishu resends their messages whole.
    let dropped = fragments.dropped() + fragments.pending() as u64;
    count_dropped(&context, dropped.saturating_sub(reported));
    ended.cancel();
    let _ = writer.await;
    end
}

/// Counts incomplete messages given up (too old, pushed out by the bounds, or cut off).
fn count_dropped<I: Inlet>(context: &Context<I>, newly: u64) {
    if newly > 0 {
        metrics::counter!("oncegate_ws_fragments_dropped_total", "source" => context.settings.source.clone())
            .increment(newly);
        context.inlet.note(
            "ws_incomplete_message",
            &format!(
                "long connection {}: gave up {newly} message(s) whose fragments did not all come",
                context.settings.source
            ),
        );
    }
}

fn control<I: Inlet>(
    context: &Context<I>,
    frame: &Frame,
    config: &mut ClientConfig,
    ping_every: &watch::Sender<Duration>,
) {
    match frame.kind() {
        Some("pong") => {
            context.count_frame("pong");
            if let Some(payload) = frame.payload.as_deref().filter(|p| !p.is_empty())
                && config.apply(payload)
            {
                let _ = ping_every.send(config.ping_every());
                tracing::debug!(source = %context.settings.source, ?config, "client config from a pong");
            }
        }
        Some("ping") => context.count_frame("ping"),
        other => context.garbage(
            "unknown_control",
            &format!("control frame of type {:?}", other.unwrap_or("")),
        ),
    }
}

async fn data_frame<I: Inlet>(
    context: &Arc<Context<I>>,
    frame: Frame,
    fragments: &mut Fragments,
    window: &Arc<Mutex<SeenFrames>>,
    lanes: &[mpsc::Sender<Work>],
    cards: &Arc<Semaphore>,
    outbox: &mpsc::Sender<Frame>,
) {
    let received = Instant::now();
    let kind = frame.kind().unwrap_or("");
    if kind != "event" {
        // `card` frames come when the app's callback subscription was not republished; the
        // SDKs drop them without a word. Acked (Feishu would resend them) and counted.
        let label = if kind == "card" { "card" } else { "unknown" };
        context.count_frame(label);
        context.inlet.note(
            "ws_unhandled_frame",
            &format!(
                "long connection {}: acked a data frame of type {kind:?} without handling it; \
                 republish the app's callback subscription so that card actions come as events",
                context.settings.source
            ),
        );
        let _ = outbox.send(frame.ack(200, None, 0)).await;
        return;
    }
    context.counters.events.increment(1);
    let parts = (frame.number("sum"), frame.number("seq"));
    let (sum, seq) = match parts {
        (Ok(sum), Ok(seq)) => (sum, seq),
        // A frame without them is whole.
        (Err(crate::FrameError::MissingHeader(_)), Err(crate::FrameError::MissingHeader(_))) => {
            (1, 0)
        }
        (Err(error), _) | (_, Err(error)) => {
            context.garbage(error.label(), &error.to_string());
            return;
        }
    };
    let message_id = frame.header("message_id").unwrap_or("").to_owned();
    if sum > 1 && message_id.is_empty() {
        context.garbage("missing_header", "a fragment without message_id");
        return;
    }
    let part = frame.payload.clone().unwrap_or_default();
    let payload = match fragments.add(&message_id, sum, seq, part, received) {
        Part::Complete(payload) => payload,
        Part::Pending => return,
        Part::Refused(label) => {
            context.garbage(
                label,
                &format!("fragment {seq} of {sum} of message {message_id:?} refused"),
            );
            return;
        }
    };
    if is_resend(window, frame.seq_id, &message_id) {
        metrics::counter!("oncegate_ws_resent_frames_total", "source" => context.settings.source.clone())
            .increment(1);
        metrics::counter!("oncegate_drops_total", "layer" => "sequence_window").increment(1);
        let _ = outbox.send(frame.ack(200, None, 0)).await;
        return;
    }
    let decoded = context.app.open_pushed(&payload);
    match decoded {
        Ok(Inbound::Event(verified)) => {
            let admit = Admit::new(verified.event, verified.keys);
            let lane = &lanes[lane_of(&admit, lanes.len())];
            let work = Work {
                frame,
                admit,
                received,
            };
            // A full lane holds the reader back: backpressure, not loss.
            let _ = lane.send(work).await;
        }
        Ok(Inbound::Card(verified)) => {
            let Ok(permit) = cards.clone().acquire_owned().await else {
                return;
            };
            let context = context.clone();
            let outbox = outbox.clone();
            let window = window.clone();
            tokio::spawn(async move {
                let admit = Admit::new(verified.event, verified.keys);
                let deadline = context.settings.card_deadline;
                let answered = context.inlet.call(admit, deadline).await;
                let ack = match &answered {
                    Ok(answer) => {
                        mark(&window, &frame);
                        // A card with no answer is acked with Feishu's empty answer, `{}`.
                        let answer = answer.as_deref().unwrap_or(b"{}");
                        frame.ack(200, Some(answer), elapsed_ms(received))
                    }
                    Err(refusal) => {
                        refused(&context, refusal);
                        frame.ack(500, None, elapsed_ms(received))
                    }
                };
                let _ = outbox.send(ack).await;
                drop(permit);
            });
        }
        Ok(Inbound::Challenge { .. }) => {
            let _ = outbox.send(frame.ack(200, None, 0)).await;
        }
        Err(error) => {
            // Not an event this app can take: answered as a failure, so that Feishu does not
            // take it for handled, and counted.
            let refusal = Refusal::from(error);
            refused(context, &refusal);
            let _ = outbox
                .send(frame.ack(500, None, elapsed_ms(received)))
                .await;
        }
    }
}

fn refused<I: Inlet>(context: &Context<I>, refusal: &Refusal) {
    oncegate_longconn::refused(
        &*context.inlet,
        &context.settings.source,
        refusal,
        "answered code 500",
    );
}

/// The lane of an event: by its chat, so that one chat's events are admitted in order.
fn lane_of(admit: &Admit, lanes: usize) -> usize {
    (admit.event.order_hash() % lanes as u64) as usize
}

/// Admits one lane's events one after another, acking each once it was admitted; marks its
/// frame seen then (a resend of one that failed is admitted again).
async fn admit_in_order<I: Inlet>(
    context: Arc<Context<I>>,
    mut work: mpsc::Receiver<Work>,
    outbox: mpsc::Sender<Frame>,
    window: Arc<Mutex<SeenFrames>>,
) {
    while let Some(Work {
        frame,
        admit,
        received,
    }) = work.recv().await
    {
        let code = match context.inlet.admit(admit).await {
            Ok(_) => {
                mark(&window, &frame);
                200
            }
            Err(refusal) => {
                refused(&context, &refusal);
                500
            }
        };
        match code {
            200 => context.counters.acked.increment(1),
            _ => context.counters.failed.increment(1),
        }
        let ack = frame.ack(code, None, elapsed_ms(received));
        // A connection that ended lost its acks: Feishu redelivers, the event id catches it.
        let _ = outbox.send(ack).await;
    }
}

fn is_resend(window: &Mutex<SeenFrames>, seq: u64, message_id: &str) -> bool {
    window
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .is_resend(seq, message_id)
}

/// Marks `frame` handled (its SeqID with its message id).
fn mark(window: &Mutex<SeenFrames>, frame: &Frame) {
    window
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .mark(frame.seq_id, frame.header("message_id").unwrap_or(""));
}

fn elapsed_ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

/// Writes acks as they come and a ping every interval (the first at once), each within the
/// write deadline; on a failed write or the end of the connection it stops and says so.
async fn write<W>(
    mut sink: W,
    mut letters: mpsc::Receiver<Frame>,
    service: i32,
    mut ping_every: watch::Receiver<Duration>,
    ended: CancellationToken,
) where
    W: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    let mut next_ping = tokio::time::Instant::now();
    loop {
        let frame = tokio::select! {
            _ = ended.cancelled() => break,
            letter = letters.recv() => match letter {
                Some(frame) => frame,
                None => break,
            },
            _ = tokio::time::sleep_until(next_ping) => {
                next_ping = tokio::time::Instant::now() + *ping_every.borrow();
                Frame::ping(service)
            }
            Ok(()) = ping_every.changed() => {
                next_ping = tokio::time::Instant::now() + *ping_every.borrow();
                continue;
            }
        };
        let message = Message::Binary(Bytes::from(frame.to_bytes()));
        match tokio::time::timeout(WRITE_TIMEOUT, sink.send(message)).await {
            Ok(Ok(())) => {}
            _ => break,
        }
    }
    ended.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
}
