//! Traces end to end: a real OTLP/HTTP receiver (here, decoding the protobuf the exporter
//! sends) gets one trace per event — the callback that admitted it as the root, its repeat, its
//! queue wait and each delivery attempt under it — the downstream's `traceparent` names the
//! delivery's span in that trace, and a delivery retried by the gateway after a restart lands
//! in the same trace under the same root. An API call's span joins its caller's trace.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::response::IntoResponse;

use crate::e2e;
use crate::support;
use e2e::*;

/// The parts of OTLP's `ExportTraceServiceRequest` the test reads
/// (opentelemetry-proto's `collector/trace/v1` and `trace/v1`); prost skips the rest.
mod otlp {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub(crate) resource_spans: Vec<ResourceSpans>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub(crate) resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub(crate) scope_spans: Vec<ScopeSpans>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub(crate) attributes: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ScopeSpans {
        #[prost(message, repeated, tag = "2")]
        pub(crate) spans: Vec<Span>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub(crate) span_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub(crate) parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub(crate) name: String,
        #[prost(int32, tag = "6")]
        pub(crate) kind: i32,
        #[prost(fixed64, tag = "7")]
        pub(crate) start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        pub(crate) end_time_unix_nano: u64,
        #[prost(message, repeated, tag = "9")]
        pub(crate) attributes: Vec<KeyValue>,
        #[prost(message, optional, tag = "15")]
        pub(crate) status: Option<Status>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct KeyValue {
        #[prost(string, tag = "1")]
        pub(crate) key: String,
        #[prost(message, optional, tag = "2")]
        pub(crate) value: Option<AnyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct AnyValue {
        #[prost(string, optional, tag = "1")]
        pub(crate) string_value: Option<String>,
        #[prost(int64, optional, tag = "3")]
        pub(crate) int_value: Option<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Status {
        #[prost(int32, tag = "3")]
        pub(crate) code: i32,
    }
}

/// One span as the receiver got it, ids in hex.
#[derive(Debug, Clone)]
struct Seen {
    trace: String,
    span: String,
    parent: String,
    name: String,
    start_ns: u64,
    end_ns: u64,
    attributes: HashMap<String, String>,
    error: bool,
    service: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&otlp::AnyValue>) -> String {
    match value {
        Some(otlp::AnyValue {
            string_value: Some(s),
            ..
        }) => s.clone(),
        Some(otlp::AnyValue {
            int_value: Some(i), ..
        }) => i.to_string(),
        _ => String::new(),
    }
}

/// An OTLP/HTTP traces receiver on loopback.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Seen>>>,
}

impl Receiver {
    async fn start() -> (Self, String) {
        let receiver = Self::default();
        let state = receiver.clone();
        let app = axum::Router::new()
            .route(
                "/v1/traces",
                axum::routing::post(
                    |axum::extract::State(state): axum::extract::State<Receiver>,
                     headers: axum::http::HeaderMap,
                     body: Bytes| async move {
                        assert_eq!(
                            headers.get("content-type").and_then(|v| v.to_str().ok()),
                            Some("application/x-protobuf"),
                            "OTLP/HTTP with protobuf"
                        );
                        let request: otlp::ExportTraceServiceRequest =
                            prost::Message::decode(body).expect("an ExportTraceServiceRequest");
                        state.take(request);
                        (
                            [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                            Vec::new(),
                        )
                            .into_response()
                    },
                ),
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{addr}/v1/traces"))
    }

    fn take(&self, request: otlp::ExportTraceServiceRequest) {
        let mut spans = self.spans.lock().expect("spans");
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(Seen {
                    trace: hex(&span.trace_id),
                    span: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    name: span.name,
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                        .collect(),
                    // STATUS_CODE_ERROR
                    error: span.status.is_some_and(|s| s.code == 2),
                    service: service.clone(),
                });
            }
        }
    }

    fn trace(&self, trace: &str) -> Vec<Seen> {
        let spans = self.spans.lock().expect("spans");
        spans.iter().filter(|s| s.trace == trace).cloned().collect()
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The gateway's config in `dir`: its events' route retried 3 s after a failure, its spans to
/// `endpoint`.
fn config(
    dir: &std::path::Path,
    downstream: std::net::SocketAddr,
    endpoint: &str,
) -> std::path::PathBuf {
    let store = format!("path = \"{}\"\npartitions = 4", dir.join("store").display());
    let config = write_config(dir, downstream, false, &store, "30s", "5s");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(&format!(
        "retry_schedule = [\"3s\"]\n\n[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"oncegate-test\"\n"
    ));
    std::fs::write(&config, text).expect("config");
    config
}

/// Stops `gateway` the way a supervisor does, so that it sends its last spans.
fn stop(gateway: Gateway) {
    gateway.signal("TERM");
    let mut gateway = gateway;
    let deadline = Instant::now() + Duration::from_secs(20);
    while gateway.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the gateway did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn wait_for_spans(
    receiver: &Receiver,
    trace: &str,
    done: impl Fn(&[Seen]) -> bool,
) -> Vec<Seen> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let spans = receiver.trace(trace);
        if done(&spans) {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "the receiver never got the trace's spans: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn named<'a>(spans: &'a [Seen], name: &str) -> Vec<&'a Seen> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_per_event_from_callback_to_downstream_and_across_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let (receiver, endpoint) = Receiver::start().await;
    let (downstream, addr) = Downstream::start().await;
    downstream
        .behavior
        .lock()
        .expect("behavior")
        .transient
        .insert("tr-late".into(), 1);
    let config = config(dir.path(), addr, &endpoint);
    let gateway = Gateway::run(&config);
    let client = client();
    // The event and Feishu's retry of it (signed anew, as a retry is).
    for signed in [
        sign(&message("tr-1", "oc_tr", 1_000)),
        sign(&message("tr-1", "oc_tr", 1_000)),
    ] {
        let (status, _) = post(&client, &gateway.url, &signed).await.expect("post");
        assert_eq!(status, 200);
    }
    let (status, _) = post(
        &client,
        &gateway.url,
        &sign(&message("tr-late", "oc_tr2", 1_000)),
    )
    .await
    .expect("post");
    assert_eq!(status, 200);
    downstream
        .wait_for("tr-1", |got| got.iter().any(|g| g.event_id == "tr-1"))
        .await;
    // tr-late failed once and waits 3 s for its retry: the gateway restarts meanwhile.
    let deadline = Instant::now() + Duration::from_secs(10);
    while downstream
        .behavior
        .lock()
        .expect("behavior")
        .attempts
        .get("tr-late")
        .is_none_or(Vec::is_empty)
    {
        assert!(Instant::now() < deadline, "tr-late was never tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop(gateway);
    let restarted_ns = now_ns();
    let gateway = Gateway::run(&config);
    downstream
        .wait_for("tr-late after the restart", |got| {
            got.iter().any(|g| g.event_id == "tr-late")
        })
        .await;
    stop(gateway);

    // tr-1: its downstream's traceparent names its delivery's span in the event's trace.
    let got = downstream.got();
    let delivered = got.iter().find(|g| g.event_id == "tr-1").expect("tr-1");
    let parts: Vec<&str> = delivered.traceparent.split('-').collect();
    assert_eq!(
        parts.len(),
        4,
        "a W3C traceparent: {:?}",
        delivered.traceparent
    );
    let (trace, delivery_span) = (parts[1], parts[2]);
    assert_eq!(
        delivered.idempotency_key,
        format!("msg_{trace}"),
        "the trace id is the event's key"
    );
    let spans = wait_for_spans(&receiver, trace, |spans| {
        named(spans, "oncegate.ingress").len() == 2 && !named(spans, "oncegate.deliver").is_empty()
    })
    .await;
    assert!(
        spans.iter().all(|s| s.service == "oncegate-test"),
        "{spans:#?}"
    );
    let roots: Vec<&Seen> = spans.iter().filter(|s| s.parent.is_empty()).collect();
    assert_eq!(roots.len(), 1, "one root: {spans:#?}");
    let root = roots[0];
    assert_eq!(root.name, "oncegate.ingress");
    assert_eq!(root.attributes["oncegate.outcome"], "admitted");
    assert_eq!(root.attributes["oncegate.event_id"], "tr-1");
    for name in [
        "oncegate.decode",
        "oncegate.admit",
        "oncegate.queue",
        "oncegate.claim",
        "oncegate.deliver",
    ] {
        let found = named(&spans, name);
        assert_eq!(found.len(), 1, "{name}: {spans:#?}");
        assert_eq!(found[0].parent, root.span, "{name} is under the root");
        assert!(found[0].start_ns <= found[0].end_ns, "{name}");
    }
    let repeat = named(&spans, "oncegate.ingress")
        .into_iter()
        .find(|s| !s.parent.is_empty())
        .expect("the platform's repeat");
    assert_eq!(
        (
            repeat.parent.as_str(),
            repeat.attributes["oncegate.outcome"].as_str()
        ),
        (root.span.as_str(), "duplicate")
    );
    assert_eq!(
        named(&spans, "oncegate.claim")[0].attributes["oncegate.claim"],
        "acquired"
    );
    let deliver = named(&spans, "oncegate.deliver")[0];
    assert_eq!(
        deliver.span, delivery_span,
        "the downstream's traceparent names it"
    );
    assert_eq!(deliver.attributes["oncegate.attempt"], "0");
    assert!(!deliver.error);

    // tr-late: both attempts in one trace under one root, the second made after the restart.
    let late = got
        .iter()
        .find(|g| g.event_id == "tr-late")
        .expect("tr-late");
    let late_trace = late
        .traceparent
        .split('-')
        .nth(1)
        .expect("traceparent")
        .to_owned();
    let spans = wait_for_spans(&receiver, &late_trace, |spans| {
        named(spans, "oncegate.deliver").len() == 2
    })
    .await;
    let root = spans
        .iter()
        .find(|s| s.parent.is_empty())
        .expect("the root, from the first run");
    assert!(root.end_ns < restarted_ns);
    let attempts: HashMap<String, &Seen> = named(&spans, "oncegate.deliver")
        .into_iter()
        .map(|s| (s.attributes["oncegate.attempt"].clone(), s))
        .collect();
    assert!(attempts["0"].error, "the first attempt failed: {spans:#?}");
    assert!(!attempts["1"].error);
    assert!(
        attempts["1"].start_ns > restarted_ns,
        "the second attempt was the restarted gateway's"
    );
    for attempt in attempts.values() {
        assert_eq!(
            attempt.parent, root.span,
            "across the restart, under the same root"
        );
    }
    assert_eq!(
        late.traceparent.split('-').nth(2),
        Some(attempts["1"].span.as_str())
    );
}

/// A `/keys` call that brings a W3C `traceparent` gets its span in the caller's trace, under
/// the caller's span; one without is a trace of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_call_joins_its_callers_trace() {
    let dir = tempfile::tempdir().expect("dir");
    let (receiver, endpoint) = Receiver::start().await;
    let config = format!(
        r#"
[store]
backend = "embedded"
path = "{}"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[api]
listen = "127.0.0.1:0"

[[api.caller]]
name = "worker"
token = "worker-token-0123456789"
namespace = "shop"

[telemetry]
otlp_endpoint = "{endpoint}"

{}"#,
        dir.path().join("data").display(),
        support::file_route(dir.path(), "")
    );
    let serve = support::Serve::start_with(dir.path(), &config);
    let api = serve.api.clone().expect("an api listener");
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let caller_span = "b7ad6b7169203331";
    let claim = |traceparent: Option<String>| {
        let mut request = client()
            .post(format!("{api}/keys/claim"))
            .bearer_auth("worker-token-0123456789")
            .json(&serde_json::json!({"key": "order-7"}));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        async move { request.send().await.expect("claim").status().as_u16() }
    };
    assert_eq!(
        claim(Some(format!("00-{caller_trace}-{caller_span}-01"))).await,
        200
    );
    assert_eq!(
        claim(None).await,
        409,
        "held: the second claim is in flight"
    );
    // A caller the gateway does not know puts nothing in the trace it names.
    let stranger = client()
        .post(format!("{api}/keys/claim"))
        .bearer_auth("not-a-caller-token-000")
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .json(&serde_json::json!({"key": "order-8"}))
        .send()
        .await
        .expect("claim");
    assert_eq!(stranger.status().as_u16(), 401);
    let mut serve = serve;
    serve.signal("TERM");
    serve.wait_exit(Duration::from_secs(20));
    let spans = wait_for_spans(&receiver, caller_trace, |spans| !spans.is_empty()).await;
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0].name, "POST /keys/claim");
    assert_eq!(spans[0].parent, caller_span, "under the caller's span");
    assert_eq!(spans[0].attributes["http.response.status_code"], "200");
    let all = receiver.spans.lock().expect("spans").clone();
    let own: Vec<&Seen> = all
        .iter()
        .filter(|s| s.trace != caller_trace && s.name == "POST /keys/claim")
        .collect();
    assert_eq!(own.len(), 1, "the call without a traceparent: {all:#?}");
    assert!(own[0].parent.is_empty());
    assert_eq!(own[0].attributes["http.response.status_code"], "409");
}

/// The README's `[telemetry]` example passes `check-config`, every setting it shows read.
#[test]
fn the_readme_telemetry_example_is_valid() {
    let block = readme_block("**Traces** (OpenTelemetry", &[]);
    assert!(block.contains("otlp_endpoint"), "{block}");
}

/// An event that came over Feishu's long connection has its trace's root too: every transport
/// admits through the traced admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_connection_event_has_its_root() {
    use oncegate_feishu_ws::local::{self, LocalFeishu, PartOrder};
    const APP: &str = "cli_trace_ws";
    let dir = tempfile::tempdir().expect("dir");
    let (receiver, endpoint) = Receiver::start().await;
    let quick = oncegate_feishu_ws::ClientConfig {
        reconnect_count: -1,
        reconnect_interval: 1,
        reconnect_nonce: 1,
        ping_interval: 2,
    };
    let feishu = LocalFeishu::start(APP, "trace-ws-secret", quick)
        .await
        .expect("local feishu");
    let config = format!(
        r#"
[store]
backend = "memory"

[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[[source]]
name = "ws"
platform = "feishu"
app_id = "{APP}"
transport = "websocket"
app_secret = "trace-ws-secret"
domain = "{}"

{}
[telemetry]
otlp_endpoint = "{endpoint}"
"#,
        feishu.domain(),
        support::file_route(dir.path(), "")
    );
    let mut serve = support::Serve::start_with(dir.path(), &config);
    assert!(
        feishu
            .wait_for_connections(1, Duration::from_secs(15))
            .await,
        "{}",
        serve.stderr()
    );
    let connection = feishu.connections()[0];
    let created_ms = now_ns() / 1_000_000;
    feishu
        .push(
            connection,
            "m-trace-1",
            &local::message_event(APP, "ev-ws-trace", "oc_ws_trace", created_ms),
            1,
            PartOrder::InOrder,
        )
        .expect("pushed");
    assert!(feishu.wait_all_acked(Duration::from_secs(15)).await);
    support::wait_until("the event delivered", Duration::from_secs(15), || {
        support::lines(dir.path()).len() == 1
    })
    .await;
    serve.signal("TERM");
    serve.wait_exit(Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(20);
    let root = loop {
        let spans = receiver.spans.lock().expect("spans").clone();
        if let Some(root) = spans.into_iter().find(|s| {
            s.name == "oncegate.ingress"
                && s.attributes.get("oncegate.event_id").map(String::as_str) == Some("ev-ws-trace")
        }) {
            break root;
        }
        assert!(Instant::now() < deadline, "no ingress span for the event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(root.parent.is_empty(), "the root: {root:#?}");
    assert_eq!(root.attributes["oncegate.outcome"], "admitted");
    let spans = wait_for_spans(&receiver, &root.trace, |spans| {
        !named(spans, "oncegate.deliver").is_empty()
    })
    .await;
    assert_eq!(named(&spans, "oncegate.deliver")[0].parent, root.span);
}
