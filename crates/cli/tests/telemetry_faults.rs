//! A collector that refuses the gateway's spans is never silent (counted in `/metrics`, said in
//! a WARN), and one that hangs does not hold the gateway's exit: the last spans get a second.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use oncegate_core::{Sealer, SyntheticMessage};
use oncegate_wecom::WecomApp;
use support::{Serve, client, file_route, lines, oncegate, wait_until};

const CORP: &str = "wwtelemetry01";
const TOKEN: &str = "telemetry-token";
const KEY: &str = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C";

fn config(dir: &std::path::Path, endpoint: &str) -> String {
    format!(
        r#"[store]
backend = "memory"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[[source]]
name = "corp"
platform = "wecom"
corp_id = "{CORP}"
token = "{TOKEN}"
encoding_aes_key = "{KEY}"
{}
[telemetry]
otlp_endpoint = "{endpoint}"
timeout = "10s"
"#,
        file_route(dir, "")
    )
}

/// The gateway, exporting every 100 ms (the SDK's own setting) rather than every 5 s.
fn start(dir: &std::path::Path, endpoint: &str) -> Serve {
    let mut command = oncegate();
    command.env("OTEL_BSP_SCHEDULE_DELAY", "100");
    Serve::start_command(dir, &config(dir, endpoint), "warn", command)
}

async fn post_events(gateway: &Serve, n: usize) {
    let sealer = WecomApp::new(CORP, TOKEN, KEY).expect("sealer");
    let now = support::suite::now();
    for i in 0..n {
        let plain = sealer.message(&SyntheticMessage {
            id: format!("t{i}"),
            chat: "chat".into(),
            sender: "zhangsan".into(),
            text: "hello".into(),
            created_ms: now * 1000,
        });
        let sealed = sealer.seal(&plain, now, &format!("tn{i}"), [6; 16]);
        let status = client()
            .post(format!(
                "{}/webhook/corp?{}",
                gateway.base,
                sealed.query.as_deref().unwrap_or_default()
            ))
            .body(sealed.body)
            .send()
            .await
            .expect("post")
            .status();
        assert_eq!(status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_exports_are_counted_and_said() {
    let refused = Arc::new(AtomicUsize::new(0));
    let collector = {
        let refused = refused.clone();
        axum::Router::new().fallback(move || {
            let refused = refused.clone();
            async move {
                refused.fetch_add(1, Ordering::SeqCst);
                (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "no")
            }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}/v1/traces", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, collector).await });
    let dir = tempfile::tempdir().expect("dir");
    let gateway = start(dir.path(), &endpoint);
    post_events(&gateway, 3).await;
    wait_until("the events delivered", Duration::from_secs(10), || {
        lines(dir.path()).len() >= 3
    })
    .await;
    let metrics_url = format!("{}/metrics", gateway.admin);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let text = client()
            .get(&metrics_url)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .unwrap_or_default();
        let failures = text
            .lines()
            .find(|line| line.starts_with("oncegate_trace_export_failures_total "))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0);
        if failures >= 1.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failure counted; the collector refused {} exports\n{text}",
            refused.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused.load(Ordering::SeqCst) >= 1);
    wait_until("the WARN", Duration::from_secs(5), || {
        gateway.stderr().contains("could not be exported")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_collector_does_not_hold_the_exit() {
    // Takes connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}/v1/traces", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().expect("dir");
    let mut gateway = start(dir.path(), &endpoint);
    post_events(&gateway, 2).await;
    wait_until("the events delivered", Duration::from_secs(10), || {
        lines(dir.path()).len() >= 2
    })
    .await;
    // The periodic export now hangs on the collector; stopping gives the last spans 1 s.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gateway.signal("TERM");
    let (status, took) = gateway.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}: {}", gateway.stderr());
    assert!(took < Duration::from_secs(4), "took {took:?} to stop");
}
