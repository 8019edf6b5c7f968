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
        traceparent: None,
        owner: oncegate_core::Owner::default(),
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

/// The `standardwebhooks` libraries' verification: the expected `v1` signature of the id,
/// timestamp and body under `secret` must equal one of the header's space-separated `v1,…`
/// entries (other versions skipped), compared in constant time.
fn verifies(secret: &str, id: &str, timestamp: &str, body: &[u8], header: &str) -> bool {
    use base64::Engine;
    use hmac::Mac;
    let engine = base64::engine::general_purpose::STANDARD;
    let key = engine
        .decode(secret.trim_start_matches("whsec_"))
        .expect("a whsec_ secret");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("key");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = engine.encode(mac.finalize().into_bytes());
    header.split(' ').any(|entry| match entry.split_once(',') {
        Some(("v1", signature)) => {
            subtle::ConstantTimeEq::ct_eq(signature.as_bytes(), expected.as_bytes()).into()
        }
        _ => false,
    })
}

#[test]
fn the_verifier_follows_the_specs_published_example() {
    // The Standard Webhooks specification's example signature.
    assert!(verifies(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "1614265330",
        br#"{"test": 2432232314}"#,
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    ));
}

#[tokio::test]
async fn while_a_secret_rotates_both_secrets_verify_every_delivery() {
    const NEW: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const OLD: &str = "whsec_b2xkIHNlY3JldCBiZWluZyByb3RhdGVkIG91dA==";
    const OTHER: &str = "whsec_c29tZW9uZSBlbHNlJ3M=";
    let (url, got) = capturing().await;
    let sink = HttpSink::new(&url, Some(NEW), Duration::from_secs(5))
        .expect("sink")
        .with_previous_secrets(&[OLD])
        .expect("previous");
    let event = event();
    sink.deliver(Outgoing {
        id: "msg_rotation",
        event: &event,
        attempt: 0,
        wants_answer: false,
        updates: None,
        traceparent: None,
        owner: oncegate_core::Owner::default(),
    })
    .await
    .expect("delivered");
    let got = got.lock().expect("lock");
    let (headers, body) = &got[0];
    let header = |name: &str| headers[name].to_str().expect("ascii").to_owned();
    let signature = header("webhook-signature");
    let (id, timestamp) = (header("webhook-id"), header("webhook-timestamp"));
    assert_eq!(signature.split(' ').count(), 2, "{signature}");
    for secret in [NEW, OLD] {
        assert!(
            verifies(secret, &id, &timestamp, body, &signature),
            "{secret}"
        );
    }
    assert!(!verifies(OTHER, &id, &timestamp, body, &signature));
    assert!(
        verifies(
            NEW,
            &id,
            &timestamp,
            body,
            signature.split(' ').next().unwrap_or("")
        ),
        "the current secret's signature comes first"
    );
    // Previous secrets need a current one, and every secret is a whsec_ one.
    assert!(
        HttpSink::new(&url, None, Duration::from_secs(5))
            .expect("sink")
            .with_previous_secrets(&[OLD])
            .is_err()
    );
    assert!(
        HttpSink::new(&url, Some(NEW), Duration::from_secs(5))
            .expect("sink")
            .with_previous_secrets(&["not-a-secret"])
            .is_err()
    );
}

/// A receiver that keeps each request's headers and body.
async fn capturing() -> (
    String,
    Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, Bytes)>>>,
) {
    let got: Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, Bytes)>>> = Arc::default();
    let app = Router::new().route(
        "/hook",
        post({
            let got = got.clone();
            move |headers: axum::http::HeaderMap, body: Bytes| {
                let got = got.clone();
                async move {
                    got.lock().expect("lock").push((headers, body));
                    StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

#[tokio::test]
async fn a_v1a_signature_verifies_with_the_public_key_only() {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let (url, got) = capturing().await;
    // RFC 8032's first test key as a whsk_ seed.
    let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    let seed: Vec<u8> = (0..64)
        .step_by(2)
        .map(|i| u8::from_str_radix(&seed[i..i + 2], 16).expect("hex"))
        .collect();
    let key = format!("whsk_{}", engine.encode(&seed));
    let sink = HttpSink::new(
        &url,
        Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        Duration::from_secs(5),
    )
    .expect("sink")
    .with_signing_key(&key)
    .expect("key");
    let public = sink.public_key().expect("a public key");
    assert_eq!(
        public,
        format!(
            "whpk_{}",
            engine.encode(
                (0..64)
                    .step_by(2)
                    .map(|i| u8::from_str_radix(
                        &"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
                            [i..i + 2],
                        16
                    )
                    .expect("hex"))
                    .collect::<Vec<u8>>()
            )
        ),
        "RFC 8032's public key"
    );
    let event = event();
    sink.deliver(Outgoing {
        id: "msg_v1a",
        event: &event,
        attempt: 0,
        wants_answer: false,
        updates: None,
        traceparent: None,
        owner: oncegate_core::Owner::default(),
    })
    .await
    .expect("delivered");
    let got = got.lock().expect("lock");
    let (headers, body) = &got[0];
    let header = |name: &str| headers[name].to_str().expect("ascii").to_owned();
    let (id, timestamp) = (header("webhook-id"), header("webhook-timestamp"));
    let signature = header("webhook-signature");
    let entries: Vec<&str> = signature.split(' ').collect();
    assert_eq!(entries.len(), 2, "v1 and v1a: {signature}");
    assert!(entries[0].starts_with("v1,"));
    let v1a = entries[1].strip_prefix("v1a,").expect("a v1a entry");
    let public = engine
        .decode(public.trim_start_matches("whpk_"))
        .expect("base64");
    let verifier = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &public);
    let signed = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body].concat();
    let v1a = engine.decode(v1a).expect("base64");
    assert!(verifier.verify(&signed, &v1a).is_ok(), "verifies");
    let mut forged = signed.clone();
    forged.push(b' ');
    assert!(
        verifier.verify(&forged, &v1a).is_err(),
        "a changed body does not"
    );
    // The symmetric signature is still there for receivers that check it.
    assert!(verifies(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        &id,
        &timestamp,
        body,
        &signature
    ));
}
