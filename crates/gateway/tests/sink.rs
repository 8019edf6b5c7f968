//! The HTTP sink against a real downstream: redirects are failures, answers are read with a cap.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{any, post};
use bytes::Bytes;
use oncegate_core::Event;
use oncegate_gateway::sink::MAX_ANSWER;
use oncegate_gateway::{HttpSink, Outgoing, Sink, SinkError};

async fn downstream(hits: Arc<AtomicUsize>) -> String {
    let app = Router::new()
        .route(
            "/found",
            post(|| async { (StatusCode::FOUND, [(header::LOCATION, "/target")]) }),
        )
        .route(
            "/temporary",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [(header::LOCATION, "/target")],
                )
            }),
        )
        .route(
            "/target",
            any(move || {
                let hits = hits.clone();
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    StatusCode::NO_CONTENT
                }
            }),
        )
        .route(
            "/huge",
            post(|| async { vec![b'x'; 5 << 20].into_response() }),
        )
        .route("/small", post(|| async { r#"{"toast":"ok"}"# }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn event() -> Event {
    Event {
        platform: "feishu".into(),
        app: "cli_x".into(),
        tenant: None,
        event_id: "e1".into(),
        event_type: "t".into(),
        created_at_ms: 1,
        order_key: None,
        payload: Bytes::from_static(b"{}"),
    }
}

async fn deliver(url: &str, wants_answer: bool) -> Result<Option<Bytes>, SinkError> {
    let sink = HttpSink::new(url, None, Duration::from_secs(5)).expect("sink");
    let event = event();
    sink.deliver(Outgoing {
        id: "msg_1",
        event: &event,
        attempt: 0,
        wants_answer,
        updates: None,
    })
    .await
}

#[tokio::test]
async fn a_redirect_is_a_permanent_failure_and_is_never_followed() {
    let hits = Arc::new(AtomicUsize::new(0));
    let base = downstream(hits.clone()).await;
    for path in ["/found", "/temporary"] {
        let result = deliver(&format!("{base}{path}"), false).await;
        match result {
            Err(SinkError::Permanent(reason)) => {
                assert!(reason.contains("redirect"), "{reason}")
            }
            other => panic!("{path}: {other:?}"),
        }
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the target was never reached"
    );
}

#[tokio::test]
async fn answers_are_read_with_a_cap_and_kept_only_when_wanted() {
    let base = downstream(Arc::default()).await;
    assert_eq!(deliver(&format!("{base}/huge"), false).await, Ok(None));
    assert!(matches!(
        deliver(&format!("{base}/huge"), true).await,
        Err(SinkError::Permanent(reason)) if reason.contains(&MAX_ANSWER.to_string())
    ));
    assert_eq!(deliver(&format!("{base}/small"), false).await, Ok(None));
    assert_eq!(
        deliver(&format!("{base}/small"), true).await,
        Ok(Some(Bytes::from_static(br#"{"toast":"ok"}"#)))
    );
}

#[tokio::test]
async fn credentials_in_the_url_never_reach_an_error() {
    // Nothing listens on port 9: the error names the host, not the password or the query.
    let result = deliver("http://user:hunter2@127.0.0.1:9/in?api_key=s3cret", false).await;
    let Err(SinkError::Transient(reason)) = result else {
        panic!("{result:?}")
    };
    assert!(reason.contains("127.0.0.1:9/in"), "{reason}");
    assert!(
        !reason.contains("hunter2") && !reason.contains("s3cret"),
        "{reason}"
    );
}
