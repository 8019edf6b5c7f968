//! The AI bot's long connection against the local AI-bot server, over real sockets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Accepted, Admit, Inlet, Refusal, RefusalKind};
use oncegate_wecom::AiBot;
use oncegate_wecom_ws::local::{self, LocalAiBot};
use oncegate_wecom_ws::{AiBotConnection, Ended, Settings, frame};
use tokio_util::sync::CancellationToken;

const BOT: &str = "aibAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const SECRET: &str = "the-bot-secret";

/// Records what it is asked to admit, refusing the first `fail_first` attempts as unavailable.
#[derive(Default)]
struct Recorder {
    admitted: Mutex<Vec<Admit>>,
    fail_first: Mutex<usize>,
}

impl Inlet for Recorder {
    async fn admit(&self, admit: Admit) -> Result<Accepted, Refusal> {
        {
            let mut fail = self.fail_first.lock().unwrap_or_else(|p| p.into_inner());
            if *fail > 0 {
                *fail -= 1;
                return Err(Refusal::new(RefusalKind::Unavailable, "store_down", "down"));
            }
        }
        self.admitted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(admit);
        Ok(Accepted::Admitted)
    }

    async fn call(&self, _: Admit, _: Duration) -> Result<Option<Bytes>, Refusal> {
        Ok(None)
    }

    fn note(&self, _: &'static str, _: &str) {}
}

impl Recorder {
    fn ids(&self) -> Vec<(String, String)> {
        self.admitted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|a| {
                (
                    a.event.order_key.as_deref().unwrap_or("").to_owned(),
                    a.event.event_id.to_string(),
                )
            })
            .collect()
    }

    async fn wait_for(&self, n: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.ids().len() < n {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

fn settings(server: &LocalAiBot, secret: &str) -> Settings {
    let mut settings = Settings::new("bot", server.url(), secret);
    settings.ping_every = Duration::from_millis(200);
    settings.connect_timeout = Duration::from_secs(2);
    settings
}

fn start(
    server: &LocalAiBot,
    secret: &str,
    inlet: Arc<Recorder>,
) -> (CancellationToken, tokio::task::JoinHandle<Ended>) {
    let bot = AiBot::new(BOT).expect("bot");
    let connection = AiBotConnection::new(bot, settings(server, secret), inlet).expect("settings");
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { connection.run(stop).await }
    });
    (stop, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_with_repeats_and_a_dropped_connection_are_all_admitted_in_chat_order() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    let (stop, run) = start(&server, SECRET, inlet.clone());
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    let chats = ["wrA", "wrB", "wrC", "wrD"];
    let mut pushed = 0;
    for n in 0..200 {
        let chat = chats[n % chats.len()];
        let body = local::text_message(BOT, &format!("M{n:04}"), Some(chat), "zhangsan", "hi");
        server.push(frame::MESSAGE, &body);
        pushed += 1;
        if n % 7 == 0 {
            // A repeat under another req_id, as seen while a reply was pending.
            server.push(frame::MESSAGE, &body);
            pushed += 1;
        }
        if n == 100 {
            server.drop_connection();
        }
    }
    assert!(
        server.wait_for_subscribes(2, Duration::from_secs(10)).await,
        "dialled again"
    );
    assert!(
        inlet.wait_for(pushed, Duration::from_secs(10)).await,
        "every callback reached the inlet"
    );
    let ids = inlet.ids();
    let mut by_chat: HashMap<String, Vec<String>> = HashMap::new();
    for (chat, id) in ids {
        by_chat.entry(chat).or_default().push(id);
    }
    for (chat, mut ids) in by_chat {
        ids.dedup();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "chat {chat}: in the order they came");
        assert_eq!(ids.len(), 50, "chat {chat}: every message");
    }
    stop.cancel();
    assert_eq!(run.await.expect("run"), Ended::Shutdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_ends_the_run_and_is_told_even_when_the_socket_stays_open() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    let (_stop, run) = start(&server, SECRET, inlet.clone());
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    server.take_over_from_elsewhere();
    let ended = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the run ended though the socket stayed open")
        .expect("run");
    assert_eq!(ended, Ended::Kicked);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(server.subscribes().len(), 1, "no dialling back on its own");
    assert!(inlet.ids().is_empty(), "the takeover is no event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_pings_end_a_half_open_connection_and_it_is_dialled_again() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    let (stop, _run) = start(&server, SECRET, inlet.clone());
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(server.pings() >= 1, "pings go out");
    server.silence(true);
    // Two pings unanswered (200 ms apart), then a new connection within the backoff.
    assert!(
        server.wait_for_subscribes(2, Duration::from_secs(5)).await,
        "a silent connection was taken for dead"
    );
    server.silence(false);
    server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "after", None, "lisi", "x"),
    );
    assert!(inlet.wait_for(1, Duration::from_secs(5)).await);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_stops_for_good_after_a_few_refusals_and_says_why() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    let bot = AiBot::new(BOT).expect("bot");
    let connection =
        AiBotConnection::new(bot, settings(&server, "wrong"), inlet).expect("settings");
    let status = connection.status();
    let ended = tokio::time::timeout(
        Duration::from_secs(20),
        connection.run(CancellationToken::new()),
    )
    .await
    .expect("stopped");
    assert!(
        matches!(&ended, Ended::Fatal(why) if why.contains("600017")),
        "{ended:?}"
    );
    assert_eq!(server.refused(), 3);
    assert!(status.fatal().is_some_and(|why| why.contains("secret")));
    assert!(server.subscribes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_waited_out_and_a_callback_for_another_bot_is_refused() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    *inlet.fail_first.lock().expect("lock") = 3;
    let (stop, _run) = start(&server, SECRET, inlet.clone());
    server.push(
        frame::MESSAGE,
        &local::text_message("another-bot", "X", None, "u", "x"),
    );
    server.push(frame::EVENT, &local::enter_chat(BOT, "E1", "u"));
    assert!(
        inlet.wait_for(1, Duration::from_secs(10)).await,
        "admitted after the outage"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = inlet.ids();
    assert_eq!(
        ids,
        vec![("u".to_owned(), "E1".to_owned())],
        "only this bot's"
    );
    assert!(
        AiBotConnection::new(AiBot::new(BOT).expect("bot"), settings(&server, " "), inlet).is_err()
    );
    stop.cancel();
}

/// Replies to every message: streams `pieces` then fails as a handler that ran out of time.
struct Streamer {
    pieces: usize,
    deadlines: Mutex<Vec<Duration>>,
}

impl Inlet for Streamer {
    async fn admit(&self, _: Admit) -> Result<Accepted, Refusal> {
        Ok(Accepted::Admitted)
    }

    async fn call(&self, _: Admit, _: Duration) -> Result<Option<Bytes>, Refusal> {
        Ok(None)
    }

    fn replies(&self, event: &oncegate_core::Event) -> bool {
        event.event_type.starts_with("message.")
    }

    async fn reply(
        &self,
        _: Admit,
        deadline: Duration,
        budgets: Vec<(String, oncegate_core::Rate)>,
        updates: oncegate_core::Updates,
        _: oncegate_core::Deliver,
    ) -> Result<oncegate_core::Replied, Refusal> {
        // The user's own conversation (a single chat), by the names /send counts under too.
        let names: Vec<&str> = budgets.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["conversation:u:0", "conversation:u:1"]);
        self.deadlines.lock().expect("lock").push(deadline);
        for i in 0..self.pieces {
            updates(Bytes::from(format!("p{i} ")));
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        Err(Refusal::new(
            RefusalKind::HandlerTimeout,
            "sync_timeout",
            "too slow",
        ))
    }

    fn note(&self, _: &'static str, _: &str) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_out_of_time_leaves_its_stream_finished_with_what_came() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Streamer {
        pieces: 5,
        deadlines: Mutex::new(Vec::new()),
    });
    let mut settings = settings(&server, SECRET);
    settings.stream_limit = Duration::from_secs(7);
    let connection = AiBotConnection::new(AiBot::new(BOT).expect("bot"), settings, inlet.clone())
        .expect("settings");
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move { connection.run(stop).await }
    });
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    let req_id = server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "M1", None, "u", "x"),
    );
    let finished = |server: &LocalAiBot| {
        server
            .received()
            .into_iter()
            .filter(|f| f["headers"]["req_id"] == req_id.as_str())
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !finished(&server)
        .last()
        .is_some_and(|f| f["body"]["stream"]["finish"] == true)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            server.received()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let frames = finished(&server);
    assert_eq!(
        frames
            .last()
            .map(|f| f["body"]["stream"]["content"].clone()),
        Some(serde_json::json!("p0 p1 p2 p3 p4 "))
    );
    assert_eq!(
        *inlet.deadlines.lock().expect("lock"),
        vec![Duration::from_secs(7)]
    );
    stop.cancel();
}

/// Frames WeCom sent before it saw this side's close are read and taken (WeCom never sends
/// them again), and a frame over the size taken is dropped without ending the connection: the
/// frames behind it arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_in_flight_at_a_close_are_taken_and_an_oversized_one_is_skipped() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    let (stop, run) = start(&server, SECRET, inlet.clone());
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    let big = format!(
        "{{\"cmd\":\"aibot_msg_callback\",\"headers\":{{\"req_id\":\"big\"}},\"body\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(2 << 20)
    );
    assert!(server.send_raw(&big));
    server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "AFTER", None, "u", "x"),
    );
    assert!(inlet.wait_for(1, Duration::from_secs(5)).await);
    assert_eq!(server.subscribes().len(), 1, "the connection went on");
    for i in 0..24 {
        server.push(
            frame::MESSAGE,
            &local::text_message(BOT, &format!("C{i:02}"), None, "u", "x"),
        );
    }
    stop.cancel();
    let _ = run.await;
    // Every callback the server wrote before it saw the close (all but the oversized frame).
    let written = usize::try_from(server.written()).expect("count") - 1;
    assert!(written >= 2, "{written}");
    assert!(
        inlet.wait_for(written, Duration::from_secs(5)).await,
        "{} of {written} taken",
        inlet.ids().len()
    );
}

/// A stream frame WeCom does not answer (here: the first, while the server is mute) is no
/// reason to leave the stream spinning: the pieces after it wait, and the last frame — the
/// whole content, finished, under the same id — is still sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_frame_went_unanswered_is_still_finished() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Streamer {
        pieces: 3,
        deadlines: Mutex::new(Vec::new()),
    });
    let mut settings = settings(&server, SECRET);
    settings.stream_limit = Duration::from_secs(20);
    let connection =
        AiBotConnection::new(AiBot::new(BOT).expect("bot"), settings, inlet).expect("settings");
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move { connection.run(stop).await }
    });
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    server.mute_commands(true);
    let req_id = server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "M1", None, "u", "x"),
    );
    // The first frame goes unanswered for 5 s; WeCom answers again after it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.mute_commands(false);
    let frames = |server: &LocalAiBot| {
        server
            .received()
            .into_iter()
            .filter(|f| f["headers"]["req_id"] == req_id.as_str())
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !frames(&server)
        .last()
        .is_some_and(|f| f["body"]["stream"]["finish"] == true)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never finished: {:?}",
            frames(&server)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = frames(&server);
    let ids: std::collections::HashSet<String> = sent
        .iter()
        .map(|f| f["body"]["stream"]["id"].to_string())
        .collect();
    assert_eq!(ids.len(), 1, "one stream: {sent:?}");
    assert_eq!(
        sent.last().map(|f| f["body"]["stream"]["content"].clone()),
        Some(serde_json::json!("p0 p1 p2 "))
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscription_on_a_live_socket_is_subscribed_anew() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    // Pings left unanswered would take minutes here: only the 846609 answer can end it.
    let mut settings = settings(&server, SECRET);
    settings.missed_pings = 1_000;
    let connection = AiBotConnection::new(AiBot::new(BOT).expect("bot"), settings, inlet.clone())
        .expect("settings");
    let stop = CancellationToken::new();
    let _run = tokio::spawn({
        let stop = stop.clone();
        async move { connection.run(stop).await }
    });
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    server.forget_subscription();
    // The next ping (200 ms) is answered 846609: a new connection subscribes.
    assert!(
        server.wait_for_subscribes(2, Duration::from_secs(5)).await,
        "not subscribed anew"
    );
    server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "after", None, "u", "x"),
    );
    assert!(inlet.wait_for(1, Duration::from_secs(5)).await);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_frames_are_refused_and_the_connection_goes_on() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Recorder::default());
    let (stop, _run) = start(&server, SECRET, inlet.clone());
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    for garbage in [
        "not json",
        "[1, 2",
        r#"{"cmd":"aibot_msg_callback","headers":{"req_id":"R"}}"#,
        r#"{"cmd":"aibot_msg_callback","headers":{"req_id":"R"},"body":"a string"}"#,
        r#"{"cmd":"aibot_msg_callback","headers":{"req_id":"R"},"body":{"msgid":"M","aibotid":"another"}}"#,
        r#"{"cmd":"something_new","headers":{"req_id":"R"},"body":{}}"#,
        r#"{"headers":{"req_id":"unknown"},"errcode":0}"#,
    ] {
        assert!(server.send_raw(garbage));
    }
    assert!(server.send_binary(&[0, 1, 2, 3]));
    server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "good", None, "u", "x"),
    );
    assert!(inlet.wait_for(1, Duration::from_secs(5)).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        inlet.ids(),
        vec![("u".to_owned(), "good".to_owned())],
        "only the good one"
    );
    assert_eq!(server.subscribes().len(), 1, "the connection went on");
    stop.cancel();
}

/// Replies to every message; the one with msgid `slow` streams for a while first.
struct Slow;

impl Inlet for Slow {
    async fn admit(&self, _: Admit) -> Result<Accepted, Refusal> {
        Ok(Accepted::Admitted)
    }

    async fn call(&self, _: Admit, _: Duration) -> Result<Option<Bytes>, Refusal> {
        Ok(None)
    }

    fn replies(&self, _: &oncegate_core::Event) -> bool {
        true
    }

    async fn reply(
        &self,
        admit: Admit,
        _: Duration,
        _: Vec<(String, oncegate_core::Rate)>,
        updates: oncegate_core::Updates,
        deliver: oncegate_core::Deliver,
    ) -> Result<oncegate_core::Replied, Refusal> {
        if &*admit.event.event_id == "slow" {
            updates(Bytes::from_static(b"thinking "));
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let answer = Bytes::from(format!("answer to {}", admit.event.event_id));
        match deliver(Some(answer.clone())).await {
            oncegate_core::Sent::No => Err(Refusal::new(
                RefusalKind::Unavailable,
                "reply_not_sent",
                "not sent",
            )),
            _ => Ok(oncegate_core::Replied::Answer(Some(answer))),
        }
    }

    fn note(&self, _: &'static str, _: &str) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversations_replies_go_out_in_the_order_of_its_messages() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let connection = AiBotConnection::new(
        AiBot::new(BOT).expect("bot"),
        settings(&server, SECRET),
        Arc::new(Slow),
    )
    .expect("settings");
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move { connection.run(stop).await }
    });
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    let slow = server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "slow", Some("wrA"), "u", "1"),
    );
    let next = server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "next", Some("wrA"), "u", "2"),
    );
    let other = server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "other", Some("wrB"), "v", "3"),
    );
    let finished = |req_id: &str| {
        server
            .received()
            .iter()
            .position(|f| f["headers"]["req_id"] == req_id && f["body"]["stream"]["finish"] == true)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while [&slow, &next, &other].iter().any(|r| finished(r).is_none()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            server.received()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (slow, next, other) = (finished(&slow), finished(&next), finished(&other));
    assert!(
        next > slow,
        "the second message of wrA is answered after the first"
    );
    assert!(other < slow, "another conversation does not wait for wrA");
    stop.cancel();
}

/// Replies to every message once `open` says so; records what it admitted and what each
/// answer's delivery said.
#[derive(Default)]
struct Gate {
    open: tokio::sync::Notify,
    opened: std::sync::atomic::AtomicBool,
    running: std::sync::atomic::AtomicUsize,
    admitted: Mutex<Vec<String>>,
    sent: Mutex<Vec<(String, oncegate_core::Sent)>>,
}

impl Gate {
    fn release(&self) {
        self.opened.store(true, std::sync::atomic::Ordering::SeqCst);
        self.open.notify_waiters();
    }

    fn sent(&self) -> Vec<(String, oncegate_core::Sent)> {
        self.sent.lock().expect("lock").clone()
    }
}

impl Inlet for Gate {
    async fn admit(&self, admit: Admit) -> Result<Accepted, Refusal> {
        self.admitted
            .lock()
            .expect("lock")
            .push(admit.event.event_id.to_string());
        Ok(Accepted::Admitted)
    }

    async fn call(&self, _: Admit, _: Duration) -> Result<Option<Bytes>, Refusal> {
        Ok(None)
    }

    fn replies(&self, event: &oncegate_core::Event) -> bool {
        event.event_type.starts_with("message.")
    }

    async fn reply(
        &self,
        admit: Admit,
        _: Duration,
        _: Vec<(String, oncegate_core::Rate)>,
        _: oncegate_core::Updates,
        deliver: oncegate_core::Deliver,
    ) -> Result<oncegate_core::Replied, Refusal> {
        self.running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        loop {
            let opened = self.open.notified();
            if self.opened.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            opened.await;
        }
        let id = admit.event.event_id.to_string();
        let answer = Bytes::from(format!("answer to {id}"));
        let sent = deliver(Some(answer.clone())).await;
        self.sent.lock().expect("lock").push((id, sent));
        Ok(oncegate_core::Replied::Answer(Some(answer)))
    }

    fn note(&self, _: &'static str, _: &str) {}
}

fn gated(server: &LocalAiBot, inlet: Arc<Gate>, reply_wait: Duration) -> CancellationToken {
    let mut settings = settings(server, SECRET);
    settings.reply_wait = reply_wait;
    let connection =
        AiBotConnection::new(AiBot::new(BOT).expect("bot"), settings, inlet).expect("settings");
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move { connection.run(stop).await }
    });
    stop
}

/// The finished reply frames WeCom received for `req_id`.
fn finished(server: &LocalAiBot, req_id: &str) -> usize {
    server
        .received()
        .iter()
        .filter(|f| f["headers"]["req_id"] == req_id && f["body"]["stream"]["finish"] == true)
        .count()
}

/// 70 replies whose handlers all wait (more than the 64 that run at once): the socket is read
/// on — another chat's event is admitted at once, pongs keep the connection alive — and when
/// the connection is cut meanwhile, every answer goes out once on the next connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_replies_leave_the_socket_read_and_go_out_on_the_next_connection() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Gate::default());
    let stop = gated(&server, inlet.clone(), Duration::from_secs(10));
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    let req_ids: Vec<String> = (0..70)
        .map(|n| {
            let chat = format!("wr{n:03}");
            let body = local::text_message(BOT, &format!("S{n:03}"), Some(&chat), "u", "hi");
            server.push(frame::MESSAGE, &body)
        })
        .collect();
    server.push(frame::EVENT, &local::enter_chat(BOT, "E-after", "v"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !inlet
        .admitted
        .lock()
        .expect("lock")
        .contains(&"E-after".to_owned())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "an event behind 70 waiting replies was not read"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Ten ping intervals with every reply waiting: the connection stays the one subscribed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.subscribes().len(), 1, "taken for half-open");
    assert_eq!(
        inlet.running.load(std::sync::atomic::Ordering::SeqCst),
        64,
        "64 handlers at once"
    );
    server.drop_connection();
    assert!(server.wait_for_subscribes(2, Duration::from_secs(5)).await);
    inlet.release();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while inlet.sent().len() < 70 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} answers delivered",
            inlet.sent().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (id, sent) in inlet.sent() {
        assert_eq!(sent, oncegate_core::Sent::Yes, "{id}");
    }
    for req_id in &req_ids {
        assert_eq!(finished(&server, req_id), 1, "{req_id} answered once");
    }
    stop.cancel();
}

/// A reply whose connection ended with no other subscribed in time is not sent, and says so:
/// the gateway then leaves its event retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_with_no_connection_to_go_out_on_says_not_sent() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    let inlet = Arc::new(Gate::default());
    let _stop = gated(&server, inlet.clone(), Duration::from_millis(300));
    assert!(server.wait_for_subscribes(1, Duration::from_secs(5)).await);
    let req_id = server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "N1", None, "u", "hi"),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while inlet.running.load(std::sync::atomic::Ordering::SeqCst) < 1 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Taken over from elsewhere: this gateway holds no connection any more.
    server.take_over_from_elsewhere();
    tokio::time::sleep(Duration::from_millis(200)).await;
    inlet.release();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while inlet.sent().is_empty() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        inlet.sent(),
        vec![("N1".to_owned(), oncegate_core::Sent::No)]
    );
    assert_eq!(finished(&server, &req_id), 0);
}

/// A subscribe refused for its rate (45009), again and again, is backed off and tried again —
/// never a stop until a restart — and once WeCom takes it, messages flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_that_are_not_about_the_credentials_never_stop_the_bot() {
    let server = LocalAiBot::start(BOT, SECRET).await.expect("server");
    server.refuse_subscribes(Some(45_009));
    let inlet = Arc::new(Recorder::default());
    let bot = AiBot::new(BOT).expect("bot");
    let connection =
        AiBotConnection::new(bot, settings(&server, SECRET), inlet.clone()).expect("settings");
    let status = connection.status();
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { connection.run(stop).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while server.refused() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} refusals",
            server.refused()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !run.is_finished(),
        "still trying after {} refusals",
        server.refused()
    );
    assert!(status.fatal().is_none());
    server.refuse_subscribes(None);
    assert!(server.wait_for_subscribes(1, Duration::from_secs(40)).await);
    server.push(
        frame::MESSAGE,
        &local::text_message(BOT, "after-limit", None, "u", "x"),
    );
    assert!(inlet.wait_for(1, Duration::from_secs(5)).await);
    stop.cancel();
    assert_eq!(run.await.expect("run"), Ended::Shutdown);
}
