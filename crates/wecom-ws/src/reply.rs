//! Replies over the socket: a replying event's handler runs once (the gateway's claim protocol)
//! and its answer goes back naming the callback's `req_id` — a welcome message, a card update,
//! a body of the handler's own, or a stream. A streamed answer (the handler's server-sent
//! events) is pushed as `aibot_respond_msg` frames under one `stream.id`, one at a time with
//! WeCom's answer awaited, each frame carrying all the content so far (WeCom replaces it), and
//! finished before WeCom's 6 minutes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Admit, Deliver, KeyHash, Rate, Replied, Sent, Updates};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::Inlet;
use crate::connection::Context;
use crate::frame;

/// WeCom's answers awaited, by `req_id`.
pub(crate) type Pending = Mutex<HashMap<String, oneshot::Sender<(i64, String)>>>;

/// How long WeCom's answer to one reply frame is awaited (the official SDK's).
const ANSWER_WAIT: Duration = Duration::from_secs(5);
/// Welcome messages and card updates must be sent within 5 s of their event.
const QUICK: Duration = Duration::from_millis(4_500);
/// A stream must be finished within 6 minutes of its first frame; the handler gets this long,
/// which leaves the last frames their time.
pub const STREAM_LIMIT: Duration = Duration::from_secs(330);
/// The most content one stream frame carries.
pub const MAX_CONTENT: usize = 20_480;
/// Replies and proactive sends per conversation, WeCom's 30 per minute and 1 000 per hour kept
/// a little inside: a bucket of `n` per period with a burst of `b` lets `n + b - 1` through in
/// some period, so 24 per minute with a burst of 5 (28 at most in any minute) and 900 per hour
/// with a burst of 50 (949 at most in any hour).
pub const CONVERSATION_BUDGETS: [Rate; 2] = [
    Rate::per_minute(24, 5),
    Rate {
        count: 900,
        per: Duration::from_secs(3600),
        burst: 50,
    },
];

/// Connections a reply frame is tried on.
const FRAME_TRIES: u32 = 3;

/// Why a command got no success answer.
#[derive(Debug, Clone)]
pub(crate) enum NotAnswered {
    /// It never went out: the connection had ended.
    NotSent(String),
    /// WeCom answered with an error.
    Refused { code: i64, message: String },
    /// It went out and no answer came in time.
    Unknown(String),
    /// It was handed to a connection that ended before WeCom answered: it may not have gone
    /// out.
    Cut(String),
}

impl std::fmt::Display for NotAnswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAnswered::NotSent(why) | NotAnswered::Unknown(why) | NotAnswered::Cut(why) => {
                f.write_str(why)
            }
            NotAnswered::Refused { code, message } => {
                write!(f, "WeCom answered errcode {code}: {message:?}")
            }
        }
    }
}

/// The budgets of conversation `chat` (a group's `chatid`, or the user), by bucket name: the
/// names replies and proactive sends both count under.
pub fn conversation_budgets(chat: &str) -> Vec<(String, Rate)> {
    CONVERSATION_BUDGETS
        .iter()
        .enumerate()
        .map(|(i, budget)| (format!("conversation:{chat}:{i}"), *budget))
        .collect()
}

/// Sends `text`, a command naming `req_id`, and waits for WeCom's answer.
pub(crate) async fn send_awaited(
    outbox: &mpsc::Sender<String>,
    pending: &Pending,
    req_id: &str,
    text: String,
) -> Result<(), NotAnswered> {
    let (tell, told) = oneshot::channel();
    lock(pending).insert(req_id.to_owned(), tell);
    if outbox.send(text).await.is_err() {
        lock(pending).remove(req_id);
        return Err(NotAnswered::NotSent(
            "the connection ended before it went out".into(),
        ));
    }
    match tokio::time::timeout(ANSWER_WAIT, told).await {
        Ok(Ok((0, _))) => Ok(()),
        Ok(Ok((code, message))) => Err(NotAnswered::Refused { code, message }),
        Ok(Err(_)) => Err(NotAnswered::Cut(
            "the connection ended before WeCom answered".into(),
        )),
        Err(_) => {
            lock(pending).remove(req_id);
            Err(NotAnswered::Unknown(format!(
                "WeCom did not answer within {ANSWER_WAIT:?}"
            )))
        }
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The command a reply to an event of `event_type` goes out as, and how long its handler has
/// (a message's: `stream_limit`).
fn kind_of(event_type: &str, stream_limit: Duration) -> (&'static str, Duration) {
    match event_type {
        "event.enter_chat" => (frame::RESPOND_WELCOME, QUICK),
        "event.template_card_event" => (frame::RESPOND_UPDATE, QUICK),
        _ => (frame::RESPOND, stream_limit.min(STREAM_LIMIT)),
    }
}

/// Sends one reply frame over whichever connection is subscribed, waiting for one while there
/// is none. A frame that never went out is sent on the next connection; one whose connection
/// ended before WeCom answered is sent again only when `repeatable` (a stream frame: WeCom
/// replaces the content under its id, so a second copy changes nothing).
async fn send_reply_frame(
    outbound: &crate::Outbound,
    wait: Duration,
    req_id: &str,
    text: &str,
    repeatable: bool,
) -> Result<(), NotAnswered> {
    let mut failed_on = None;
    let mut tries = 0;
    loop {
        tries += 1;
        let Some(holder) = outbound.current(failed_on, wait).await else {
            return Err(NotAnswered::NotSent(format!(
                "no connection of the bot was subscribed within {} ms",
                wait.as_millis()
            )));
        };
        match send_awaited(&holder.outbox, &holder.pending, req_id, text.to_owned()).await {
            Err(NotAnswered::NotSent(_)) if tries < FRAME_TRIES => {}
            Err(NotAnswered::Cut(_)) if repeatable && tries < FRAME_TRIES => {}
            other => return other,
        }
        failed_on = Some(holder.generation);
    }
}

/// One stream's frames, pushed one at a time.
struct Stream<'a> {
    outbound: &'a crate::Outbound,
    /// How long a frame waits for a subscribed connection.
    wait: Duration,
    req_id: &'a str,
    id: String,
    content: String,
    frames: u64,
    failed: Option<NotAnswered>,
}

impl Stream<'_> {
    /// Sends the content so far (`finish`: as the last frame). After a failed frame only the
    /// last one is sent: it carries the whole content under the same id, so a stream whose
    /// frame WeCom did not answer is still finished on the user's screen rather than left
    /// spinning (a frame that did arrive is replaced, never doubled).
    async fn push(&mut self, finish: bool) {
        if self.failed.is_some() && !finish {
            return;
        }
        let body = json!({
            "msgtype": "stream",
            "stream": {"id": self.id, "finish": finish, "content": self.content},
        });
        let text = frame::command(frame::RESPOND, self.req_id, Some(body));
        self.frames += 1;
        match send_reply_frame(self.outbound, self.wait, self.req_id, &text, true).await {
            // The last frame holds everything: taken, the whole answer is on the screen.
            Ok(()) if finish => self.failed = None,
            Ok(()) => {}
            Err(why) => self.failed = Some(why),
        }
    }

    fn append(&mut self, piece: &[u8]) {
        let piece = String::from_utf8_lossy(piece);
        let room = MAX_CONTENT.saturating_sub(self.content.len());
        let mut cut = piece.len().min(room);
        while !piece.is_char_boundary(cut) {
            cut -= 1;
        }
        self.content.push_str(&piece[..cut]);
    }

    /// Sends the handler's whole answer (`cmd`'s frame, or the last frame of the stream) and
    /// says whether it reached WeCom.
    async fn finish(&mut self, cmd: &str, answer: Option<Bytes>) -> Sent {
        if self.frames > 0 {
            self.push(true).await;
        } else if let Some(answer) = answer {
            match whole_answer(cmd, self.req_id, &answer) {
                Some(text) => {
                    if let Err(why) =
                        send_reply_frame(self.outbound, self.wait, self.req_id, &text, false).await
                    {
                        self.failed = Some(why);
                    }
                }
                None => {
                    self.append(&answer);
                    self.push(true).await;
                }
            }
        }
        match &self.failed {
            None => Sent::Yes,
            Some(NotAnswered::NotSent(_) | NotAnswered::Refused { .. }) => Sent::No,
            Some(NotAnswered::Unknown(_) | NotAnswered::Cut(_)) => Sent::Unknown,
        }
    }
}

/// Answers one replying event: runs its handler through the inlet and sends what it answered,
/// on the bot's subscribed connection (the next one, if the callback's has ended meanwhile).
/// The handler's claim is settled by whether the answer reached WeCom.
pub(crate) async fn answer<I: Inlet>(context: Arc<Context<I>>, admit: Admit, req_id: String) {
    let source = context.settings.source.clone();
    let (cmd, deadline) = kind_of(&admit.event.event_type, context.settings.stream_limit);
    let budgets = admit
        .event
        .order_key
        .as_deref()
        .map(conversation_budgets)
        .unwrap_or_default();
    let stream_id = stream_id(&admit.keys.primary());
    let (pieces, mut taken) = mpsc::unbounded_channel::<Bytes>();
    let updates: Updates = Arc::new(move |piece| {
        let _ = pieces.send(piece);
    });
    let (answered, mut answer) = oneshot::channel::<Option<Bytes>>();
    let (tell_sent, sent) = oneshot::channel::<Sent>();
    let deliver: Deliver = Box::new(move |whole| {
        Box::pin(async move {
            if answered.send(whole).is_err() {
                return Sent::No;
            }
            sent.await.unwrap_or(Sent::No)
        })
    });
    let event_id = admit.event.event_id.clone();
    let run = context
        .inlet
        .reply(admit, deadline, budgets, updates, deliver);
    let mut stream = Stream {
        outbound: &context.outbound,
        wait: context.settings.reply_wait,
        req_id: &req_id,
        id: stream_id,
        content: String::new(),
        frames: 0,
        failed: None,
    };
    // The pieces are pushed while the handler runs; those that come while a frame waits for
    // WeCom's answer go out together in the next. The whole answer follows its pieces.
    let push = async {
        let mut open = true;
        let whole = loop {
            tokio::select! {
                biased;
                piece = taken.recv(), if open => match piece {
                    Some(piece) => {
                        stream.append(&piece);
                        while let Ok(more) = taken.try_recv() {
                            stream.append(&more);
                        }
                        stream.push(false).await;
                    }
                    None => open = false,
                },
                whole = &mut answer => break whole.ok(),
            }
        };
        while let Ok(more) = taken.try_recv() {
            stream.append(&more);
        }
        if let Some(whole) = whole {
            let _ = tell_sent.send(stream.finish(cmd, whole).await);
        }
    };
    let (replied, ()) = tokio::join!(run, push);
    let outcome = match replied {
        Ok(Replied::Repeat) => "repeat",
        Ok(Replied::Answer(_)) if stream.failed.is_some() => "send_failed",
        Ok(Replied::Answer(_)) => "sent",
        Err(refusal) => {
            // What came is kept on the user's screen, finished rather than left spinning
            // (after a frame WeCom did not answer too).
            if stream.frames > 0 {
                stream.push(true).await;
            }
            context.inlet.note(
                "ws_reply_failed",
                &format!(
                    "long connection {source}: no reply to {event_id} ({}): {}",
                    refusal.label, refusal.message
                ),
            );
            refusal.label
        }
    };
    if let Some(why) = &stream.failed {
        context.inlet.note(
            "ws_reply_not_sent",
            &format!("long connection {source}: the reply to {event_id} was not sent whole: {why}"),
        );
    }
    metrics::counter!("oncegate_ws_replies_total", "source" => source.clone(), "result" => outcome)
        .increment(1);
    metrics::counter!("oncegate_ws_reply_frames_total", "source" => source)
        .increment(stream.frames);
}

/// A stream's id: the event's key, so that a reply made again after a failover continues the
/// same message rather than starting a second.
fn stream_id(key: &KeyHash) -> String {
    format!("og{key}")
}

/// The frame of a whole (not streamed) answer: a JSON object is the reply's body as the
/// handler wrote it; anything else is `None` (sent as a finished stream of its text).
fn whole_answer(cmd: &str, req_id: &str, answer: &[u8]) -> Option<String> {
    let body: serde_json::Value = serde_json::from_slice(answer).ok()?;
    body.is_object()
        .then(|| frame::command(cmd, req_id, Some(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_is_answered_with_its_command_within_its_time() {
        let limit = Duration::from_secs(60);
        assert_eq!(
            kind_of("event.enter_chat", limit),
            (frame::RESPOND_WELCOME, QUICK)
        );
        assert_eq!(
            kind_of("event.template_card_event", limit),
            (frame::RESPOND_UPDATE, QUICK)
        );
        assert_eq!(kind_of("message.text", limit), (frame::RESPOND, limit));
        assert_eq!(
            kind_of("message.mixed", Duration::from_secs(3600)),
            (frame::RESPOND, STREAM_LIMIT),
            "never past WeCom's stream limit"
        );
        let card = br#"{"msgtype":"template_card","template_card":{"card_type":"text_notice"}}"#;
        let text = whole_answer(frame::RESPOND, "R1", card).expect("a body");
        let sent: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(sent["headers"]["req_id"], "R1");
        assert_eq!(sent["body"]["msgtype"], "template_card");
        assert!(whole_answer(frame::RESPOND, "R1", b"plain words").is_none());
        assert!(whole_answer(frame::RESPOND, "R1", b"[1]").is_none());
    }

    #[test]
    fn content_is_cut_at_the_limit_on_a_character_boundary() {
        let outbound = crate::Outbound::default();
        let mut stream = Stream {
            outbound: &outbound,
            wait: Duration::ZERO,
            req_id: "R",
            id: "s".into(),
            content: String::new(),
            frames: 0,
            failed: None,
        };
        stream.append("好".repeat(MAX_CONTENT).as_bytes());
        assert!(stream.content.len() <= MAX_CONTENT);
        assert!(stream.content.len() > MAX_CONTENT - 3);
        assert!(stream.content.chars().all(|c| c == '好'));
    }
}
