//! oncegate as a library: a Rust handler behind the gateway, on the memory store.
//!
//! `cargo run -p oncegate-gateway --example embedded_handler` starts a gateway on a free port,
//! sends it one signed Feishu message twice (a platform retry), and shows the handler running
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use oncegate_core::{Event, SystemClock};
use oncegate_feishu::FeishuApp;
use oncegate_gateway::{Gateway, GatewayParts, Handler, HandlerSink, SinkError, Timing};
use oncegate_memory::{MemoryConfig, MemoryStore};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Replies to messages; counts how often it ran.
struct Replier {
    runs: Arc<AtomicUsize>,
}

impl Handler for Replier {
    async fn handle(
        &self,
        event: &Event,
        idempotency_key: &str,
        attempt: u32,
    ) -> Result<Option<Bytes>, SinkError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        println!(
            "handling {} {} (key {idempotency_key}, attempt {attempt})",
            event.event_type, event.event_id
        );
        // Send the reply here; return Transient(..) to be retried, Permanent(..) to give up.
        Ok(None)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let app = FeishuApp::new(
        oncegate_feishu::Cloud::Feishu,
        "cli_example",
        Some("example-key".into()),
        None,
    )?;
    let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
    let runs = Arc::new(AtomicUsize::new(0));
    let gateway = Gateway::new(
        store,
        GatewayParts {
            sources: vec![("bot".into(), Arc::new(app.clone()))],
            replay: Some(oncegate_gateway::ReplayLimits {
                max_skew: Duration::from_secs(300),
                max_nonces: 100_000,
            }),
            timing: Timing::default(),
            body_limit: 1 << 20,
            admin_token: None,
            ..GatewayParts::default()
        },
    )
    .route(
        &["im.message.*"],
        Arc::new(HandlerSink(Replier { runs: runs.clone() })),
        oncegate_gateway::StaleEvents::Deliver,
    )?;

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let admin = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhook/bot", listener.local_addr()?);
    let shutdown = CancellationToken::new();
    let server = {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.serve(listener, admin, shutdown).await })
    };
    let dispatcher = {
        let (gateway, shutdown) = (gateway.clone(), shutdown.clone());
        tokio::spawn(async move { gateway.dispatch(shutdown).await })
    };

    let message = r#"{"schema":"2.0","header":{"event_id":"ev_1","event_type":"im.message.receive_v1","create_time":"1700000000000","app_id":"cli_example"},"event":{"message":{"message_id":"om_1","chat_id":"oc_1"}}}"#;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    for nonce in ["first", "retry"] {
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs()
            .to_string();
        let (body, signature) = app.seal(message.as_bytes(), &timestamp, nonce, [9; 16]);
        let answer = client
            .post(&url)
            .header("x-lark-request-timestamp", &timestamp)
            .header("x-lark-request-nonce", nonce)
            .header("x-lark-signature", signature.unwrap_or_default())
            .body(body)
            .send()
            .await?;
        println!("{nonce}: {} {}", answer.status(), answer.text().await?);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("the handler ran {} time(s)", runs.load(Ordering::SeqCst));
    shutdown.cancel();
    server.await??;
    dispatcher.await??;
    Ok(())
}
