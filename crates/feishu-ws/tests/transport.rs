//! The long connection against the local Feishu-like server, with a recording inlet in place
//! of the gateway: acks after admission, fragments, resends, cards, garbage, handshake
//! classes, reconnect timing, half-open sockets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oncegate_core::{Accepted, Admit, Refusal, RefusalKind};
use oncegate_feishu::{Cloud, FeishuApp};
use oncegate_feishu_ws::local::{self, LocalFeishu, PartOrder};
use oncegate_feishu_ws::{ClientConfig, Inlet, LongConnection, Settings, Status};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const APP: &str = "cli_local";
const SECRET: &str = "local-app-secret";

/// Admits each primary key once; can be made to fail or to wait.
#[derive(Default)]
struct Recorder {
    seen: Mutex<HashMap<String, Bytes>>,
    calls: AtomicUsize,
    fail: AtomicBool,
    gate: Option<Semaphore>,
    notes: Mutex<Vec<&'static str>>,
}

impl Inlet for Recorder {
    async fn admit(&self, admit: Admit) -> Result<Accepted, Refusal> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            let _ = gate.acquire().await.map(|permit| permit.forget());
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(Refusal::new(
                RefusalKind::Unavailable,
                "admit_failed",
                "store down",
            ));
        }
        let mut seen = self.seen.lock().expect("lock");
        let key = admit.event.event_id.to_string();
        if seen.contains_key(&key) {
            return Ok(Accepted::Duplicate);
        }
        seen.insert(key, admit.event.payload.clone());
        Ok(Accepted::Admitted)
    }

    async fn call(&self, admit: Admit, _deadline: Duration) -> Result<Option<Bytes>, Refusal> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = format!(r#"{{"toast":{{"content":"{}"}}}}"#, admit.event.event_id);
        Ok(Some(Bytes::from(answer)))
    }

    fn note(&self, label: &'static str, _message: &str) {
        self.notes.lock().expect("lock").push(label);
    }
}

struct Running {
    server: LocalFeishu,
    inlet: Arc<Recorder>,
    status: Arc<Status>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.task.abort();
    }
}

fn quick() -> ClientConfig {
    ClientConfig {
        reconnect_count: -1,
        reconnect_interval: 1,
        reconnect_nonce: 1,
        ping_interval: 120,
    }
}

async fn start(config: ClientConfig, inlet: Recorder, tune: impl FnOnce(&mut Settings)) -> Running {
    let server = LocalFeishu::start(APP, SECRET, config)
        .await
        .expect("server");
    start_tuned(server, inlet, tune)
}

fn start_tuned(server: LocalFeishu, inlet: Recorder, tune: impl FnOnce(&mut Settings)) -> Running {
    let inlet = Arc::new(inlet);
    let app = FeishuApp::new(Cloud::Feishu, APP, None, None).expect("app");
    let mut settings = Settings::new("feishu-ws", &server.domain(), SECRET);
    settings.pong_grace = Some(Duration::from_secs(1));
    tune(&mut settings);
    let client = Arc::new(LongConnection::new(app, settings, inlet.clone()).expect("client"));
    let status = client.status();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(client.run(shutdown.clone()));
    Running {
        server,
        inlet,
        status,
        shutdown,
        task,
    }
}

async fn first_connection(running: &Running) -> u64 {
    assert!(
        running
            .server
            .wait_for_connections(1, Duration::from_secs(10))
            .await,
        "the client connects"
    );
    running.server.connections()[0]
}

fn event(id: &str, chat: &str) -> Vec<u8> {
    local::message_event(APP, id, chat, 1_700_000_000_000)
}

async fn until(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_acked_only_once_admitted() {
    let inlet = Recorder {
        gate: Some(Semaphore::new(0)),
        ..Recorder::default()
    };
    let running = start(quick(), inlet, |_| {}).await;
    let conn = first_connection(&running).await;
    running
        .server
        .push(conn, "m1", &event("e1", "oc_1"), 1, PartOrder::InOrder)
        .expect("pushed");
    assert!(
        until(Duration::from_secs(5), || running
            .inlet
            .calls
            .load(Ordering::SeqCst)
            == 1)
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        running.server.acks().is_empty(),
        "no ack before the admission returned"
    );
    running.inlet.gate.as_ref().expect("gate").add_permits(1);
    assert!(running.server.wait_all_acked(Duration::from_secs(5)).await);
    let acks = running.server.acks();
    assert_eq!(acks.len(), 1);
    assert_eq!((acks[0].code, acks[0].message_id.as_str()), (200, "m1"));
    assert!(
        acks[0]
            .biz_rt
            .as_deref()
            .is_some_and(|ms| ms.parse::<u64>().is_ok_and(|ms| ms >= 250))
    );
    assert_eq!(acks[0].data, None, "an event's ack has no data");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_admission_is_answered_500_and_its_resend_is_admitted() {
    let inlet = Recorder::default();
    inlet.fail.store(true, Ordering::SeqCst);
    let running = start(quick(), inlet, |_| {}).await;
    let conn = first_connection(&running).await;
    let seqs = running
        .server
        .push(conn, "m1", &event("e1", "oc_1"), 1, PartOrder::InOrder)
        .expect("pushed");
    assert!(until(Duration::from_secs(5), || !running.server.acks().is_empty()).await);
    assert_eq!(running.server.acks()[0].code, 500);
    assert_eq!(running.server.unacked(), vec!["m1".to_owned()]);
    // The same frame again on the same connection: the failed one was not marked seen.
    running.inlet.fail.store(false, Ordering::SeqCst);
    assert!(running.server.repeat(conn, seqs[0], "m1"));
    assert!(running.server.wait_all_acked(Duration::from_secs(5)).await);
    assert_eq!(running.inlet.seen.lock().expect("lock").len(), 1);
    // And once more: now it was, so it is acked without a second admission.
    let calls = running.inlet.calls.load(Ordering::SeqCst);
    assert!(running.server.repeat(conn, seqs[0], "m1"));
    assert!(until(Duration::from_secs(5), || running.server.acks().len() == 3).await);
    assert_eq!(running.server.acks()[2].code, 200);
    assert_eq!(
        running.inlet.calls.load(Ordering::SeqCst),
        calls,
        "acked from the window"
    );
}

/// A frame that reuses a handled frame's SeqID for another message is that message, not a
/// resend: admitted, not acked from the window and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_reusing_a_seq_id_for_another_message_is_admitted() {
    let running = start(quick(), Recorder::default(), |_| {}).await;
    let conn = first_connection(&running).await;
    let seqs = running
        .server
        .push(conn, "m1", &event("e1", "oc_1"), 1, PartOrder::InOrder)
        .expect("pushed");
    assert!(running.server.wait_all_acked(Duration::from_secs(5)).await);
    let other = local::data_frame(seqs[0], "m2", 1, 0, &event("e2", "oc_1"));
    assert!(running.server.send_raw(conn, other));
    assert!(until(Duration::from_secs(5), || running.server.acks().len() == 2).await);
    assert_eq!(running.server.acks()[1].code, 200);
    let seen = running.inlet.seen.lock().expect("lock").clone();
    assert!(
        seen.contains_key("e1") && seen.contains_key("e2"),
        "both messages admitted: {:?}",
        seen.keys().collect::<Vec<_>>()
    );
    // The first frame again, byte for byte: a resend, acked without a second admission.
    let calls = running.inlet.calls.load(Ordering::SeqCst);
    assert!(running.server.repeat(conn, seqs[0], "m1"));
    assert!(until(Duration::from_secs(5), || running.server.acks().len() == 3).await);
    assert_eq!(
        running.inlet.calls.load(Ordering::SeqCst),
        calls + 1,
        "not from the window: m2 holds the SeqID now"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragments_out_of_order_make_one_event() {
    let running = start(quick(), Recorder::default(), |_| {}).await;
    let conn = first_connection(&running).await;
    let payload = event("e-frag", "oc_1");
    running
        .server
        .push(conn, "m-frag", &payload, 4, PartOrder::Reversed)
        .expect("pushed");
    assert!(running.server.wait_all_acked(Duration::from_secs(5)).await);
    let seen = running.inlet.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    // The stored payload is the document whole (without its empty token).
    let stored: serde_json::Value = serde_json::from_slice(&seen["e-frag"]).expect("json");
    let sent: serde_json::Value = serde_json::from_slice(&payload).expect("json");
    assert_eq!(stored["event"], sent["event"]);
    let acks = running.server.acks();
    assert_eq!(acks.len(), 1, "one ack for the reassembled message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_are_answered_in_the_ack_and_card_frames_are_acked() {
    let running = start(quick(), Recorder::default(), |_| {}).await;
    let conn = first_connection(&running).await;
    running
        .server
        .push(
            conn,
            "m-card",
            &local::card_action(APP, "c1", "yes"),
            1,
            PartOrder::InOrder,
        )
        .expect("pushed");
    assert!(running.server.wait_all_acked(Duration::from_secs(5)).await);
    let ack = &running.server.acks()[0];
    assert_eq!(ack.code, 200);
    let data: serde_json::Value =
        serde_json::from_slice(ack.data.as_deref().expect("data")).expect("json");
    assert_eq!(data["toast"]["content"], "c1");
    // A frame of type `card` (an app that did not republish its callbacks): acked, noted.
    let mut frame = oncegate_feishu_ws::Frame::decode_bytes(&local::data_frame(
        900,
        "m-type-card",
        1,
        0,
        b"{}",
    ))
    .expect("frame");
    frame.headers[0].value = "card".into();
    assert!(running.server.send_raw(conn, frame.to_bytes()));
    assert!(until(Duration::from_secs(5), || running.server.acks().len() == 2).await);
    assert_eq!(running.server.acks()[1].seq_id, 900);
    assert!(
        running
            .inlet
            .notes
            .lock()
            .expect("lock")
            .contains(&"ws_unhandled_frame")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_frames_are_counted_and_the_connection_goes_on() {
    let running = start(quick(), Recorder::default(), |_| {}).await;
    let conn = first_connection(&running).await;
    let server = &running.server;
    assert!(server.send_raw(conn, vec![0xff, 0xff, 0xff]));
    let mut huge =
        oncegate_feishu_ws::Frame::decode_bytes(&local::data_frame(7, "m-huge", 1, 0, b"x"))
            .expect("frame");
    huge.headers.retain(|h| h.key != "sum");
    huge.headers.push(oncegate_feishu_ws::Header {
        key: "sum".into(),
        value: "4294967296".into(),
    });
    assert!(server.send_raw(conn, huge.to_bytes()));
    let mut headless = huge.clone();
    headless.headers.retain(|h| h.key == "type");
    headless.headers.push(oncegate_feishu_ws::Header {
        key: "sum".into(),
        value: "2".into(),
    });
    assert!(server.send_raw(conn, headless.to_bytes()));
    // Not an event of this app: answered 500, not taken for handled.
    server.push(
        conn,
        "m-bad",
        b"{\"not\":\"an envelope\"}",
        1,
        PartOrder::InOrder,
    );
    server.push(conn, "m-ok", &event("e-ok", "oc_1"), 1, PartOrder::InOrder);
    assert!(until(Duration::from_secs(5), || server.acks().len() == 2).await);
    let codes: HashMap<String, i64> = server
        .acks()
        .into_iter()
        .map(|a| (a.message_id, a.code))
        .collect();
    assert_eq!(codes["m-bad"], 500);
    assert_eq!(codes["m-ok"], 200);
    assert_eq!(server.connections(), vec![conn], "the same connection");
    let notes = running.inlet.notes.lock().expect("lock").clone();
    for label in ["bad_protobuf", "bad_sum", "missing_header", "ws_refused"] {
        assert!(notes.contains(&label), "{label} in {notes:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fatal_handshakes_stop_and_others_are_retried_on_the_interval() {
    for (status, auth) in [(514, Some("1000040350")), (403, None)] {
        let server = LocalFeishu::start(APP, SECRET, quick())
            .await
            .expect("server");
        server.refuse_handshake(status, auth);
        let running = start_on(server).await;
        assert!(until(Duration::from_secs(5), || running.status.fatal().is_some()).await);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            running.server.handshakes().len(),
            1,
            "{status}: not retried"
        );
        assert_eq!(running.status.open(), 0);
    }
    let server = LocalFeishu::start(APP, SECRET, quick())
        .await
        .expect("server");
    server.refuse_handshake(514, Some("1000040351"));
    server.refuse_handshake(502, None);
    let running = start_on(server).await;
    first_connection(&running).await;
    let handshakes = running.server.handshakes();
    assert_eq!(handshakes.len(), 3);
    // The second retry waits ReconnectInterval (1 s); the first a random part of the nonce.
    assert!(handshakes[2] - handshakes[1] >= Duration::from_millis(950));
    assert!(running.status.fatal().is_none());
}

async fn start_on(server: LocalFeishu) -> Running {
    start_tuned(server, Recorder::default(), |_| {})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_fatal_at_the_endpoint() {
    let server = LocalFeishu::start(APP, "another secret", quick())
        .await
        .expect("server");
    let running = start_on(server).await;
    assert!(until(Duration::from_secs(5), || running.status.fatal().is_some()).await);
    let reason = running.status.fatal().expect("fatal");
    assert!(
        reason.contains("10003") && !reason.contains(SECRET),
        "{reason}"
    );
    assert!(running.server.handshakes().is_empty());
}

/// A server whose settings say "again at once" (interval and nonce 0) and that keeps refusing
/// the handshake gets attempts a backoff apart, not thousands a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_says_retry_at_once_gets_a_backoff() {
    let eager = ClientConfig {
        reconnect_count: -1,
        reconnect_interval: 0,
        reconnect_nonce: 0,
        ping_interval: 120,
    };
    let server = LocalFeishu::start(APP, SECRET, eager)
        .await
        .expect("server");
    for _ in 0..1000 {
        server.refuse_handshake(500, None);
    }
    let running = start_tuned(server, Recorder::default(), |_| {});
    tokio::time::sleep(Duration::from_secs(4)).await;
    let tries = running.server.handshakes().len();
    assert!((2..=5).contains(&tries), "{tries} handshakes in 4 s");
    assert!(running.status.fatal().is_none(), "a 500 is retried");
}

/// Feishu's frequency limit at the endpoint (99991400) is waited out, not taken as fatal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_endpoint_is_retried() {
    let server = LocalFeishu::start(APP, SECRET, quick())
        .await
        .expect("server");
    server.endpoint_code(99_991_400);
    let running = start_tuned(server, Recorder::default(), |_| {});
    assert!(
        until(Duration::from_secs(5), || running.server.endpoint_calls()
            >= 1)
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Retried after the default reconnect wait (the server's settings come with a success).
    assert!(
        running.status.fatal().is_none(),
        "{:?}",
        running.status.fatal()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_socket_is_replaced_and_the_pong_config_applies() {
    let config = ClientConfig {
        ping_interval: 120,
        ..quick()
    };
    // Pongs say: ping every second (set before the client dials, so that its first pong says
    // it too).
    let server = LocalFeishu::start(APP, SECRET, config)
        .await
        .expect("server");
    server.pong_with(ClientConfig {
        ping_interval: 1,
        ..quick()
    });
    let running = start_tuned(server, Recorder::default(), |_| {});
    let conn = first_connection(&running).await;
    assert!(
        until(Duration::from_secs(15), || running.server.pings() >= 3).await,
        "pings follow the pong's interval"
    );
    running.server.silence(conn);
    // Silence longer than 1 s ping + 1 s grace: the client dials again.
    assert!(
        until(Duration::from_secs(10), || running
            .server
            .connections()
            .iter()
            .any(|c| *c != conn))
        .await,
        "a new connection replaces the silent one"
    );
    assert!(running.status.reconnects() >= 1);
    let fresh = running.server.connections()[0];
    running.server.push(
        fresh,
        "m-after",
        &event("e-after", "oc_1"),
        1,
        PartOrder::InOrder,
    );
    assert!(running.server.wait_all_acked(Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_unacked_when_a_connection_drops_are_admitted_once_after_the_resend() {
    let inlet = Recorder {
        gate: Some(Semaphore::new(5)),
        ..Recorder::default()
    };
    let running = start(quick(), inlet, |s| s.connections = 2).await;
    assert!(
        running
            .server
            .wait_for_connections(2, Duration::from_secs(10))
            .await
    );
    let conns = running.server.connections();
    for i in 0..10 {
        let id = format!("e{i}");
        running.server.push(
            conns[0],
            &format!("m{i}"),
            &event(&id, &format!("oc_{}", i % 3)),
            1,
            PartOrder::InOrder,
        );
    }
    // Five are admitted, five wait; the connection drops with them unacked.
    assert!(
        until(Duration::from_secs(5), || running
            .inlet
            .seen
            .lock()
            .expect("lock")
            .len()
            == 5)
        .await
    );
    running.server.drop_connection(conns[0]);
    // Acks already on the wire when the connection closes still arrive: read the two ledgers
    // once they have settled, not in two racing snapshots.
    assert!(
        until(Duration::from_secs(5), || running.server.unacked().len()
            + running.server.acks().len()
            == 10)
        .await,
        "every pushed event is either acked or waiting"
    );
    assert!(
        running.server.unacked().len() >= 5,
        "the five events still at the gate are unacked"
    );
    running.inlet.gate.as_ref().expect("gate").add_permits(1000);
    // Feishu resends what was not acked, on the other connection.
    running.server.resend_unacked(conns[1]);
    assert!(running.server.wait_all_acked(Duration::from_secs(10)).await);
    assert_eq!(
        running.inlet.seen.lock().expect("lock").len(),
        10,
        "each once"
    );
    assert!(
        until(Duration::from_secs(10), || running
            .server
            .connections()
            .len()
            == 2)
        .await,
        "the dropped one is dialled again"
    );
}
