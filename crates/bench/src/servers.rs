//! The HTTP ends of a load run: a bare server (the ceiling) and a slow sink.

use super::*;

/// Answers every `POST /webhook/{source}` with the gateway's success body, and nothing more;
/// and takes OTLP/HTTP trace exports (`POST /v1/traces`), answering them as a collector does,
/// for a benchmark of the gateway with traces on.
pub(crate) fn bare_server(address: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS as usize)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = axum::Router::new()
            .route(
                "/webhook/{source}",
                axum::routing::post(|_body: axum::body::Bytes| async { "{\"msg\":\"success\"}" }),
            )
            .route(
                "/v1/traces",
                axum::routing::post(|_body: axum::body::Bytes| async {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }),
            );
        let listener = tokio::net::TcpListener::bind(address).await?;
        println!("bare server on http://{}", listener.local_addr()?);
        axum::serve(listener, app).await?;
        Ok(())
    })
}

/// Deliveries a slow downstream counted: how many, the first's and the last's unix ms.
#[derive(Default)]
pub(crate) struct SinkCount {
    pub(crate) count: u64,
    pub(crate) first_ms: u64,
    pub(crate) last_ms: u64,
}

/// A downstream that takes `delay` per request (`--slow-sink`), to make the dispatch the
/// bottleneck and see how it scales with gateways.
pub(crate) fn slow_sink(address: &str, delay: Duration) -> anyhow::Result<()> {
    use axum::routing::{get, post};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let counted = Arc::new(std::sync::Mutex::new(SinkCount::default()));
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    runtime.block_on(async move {
        let (on_post, on_count, on_reset) = (counted.clone(), counted.clone(), counted);
        let app = axum::Router::new()
            .route(
                "/count",
                get(move || async move {
                    let c = on_count.lock().unwrap_or_else(|p| p.into_inner());
                    format!(
                        "{{\"count\":{},\"first_ms\":{},\"last_ms\":{}}}",
                        c.count, c.first_ms, c.last_ms
                    )
                }),
            )
            .route(
                "/reset",
                get(move || async move {
                    *on_reset.lock().unwrap_or_else(|p| p.into_inner()) = SinkCount::default();
                    "{}"
                }),
            )
            .fallback(post(move |_body: axum::body::Bytes| async move {
                tokio::time::sleep(delay).await;
                let at = now_ms();
                let mut c = on_post.lock().unwrap_or_else(|p| p.into_inner());
                if c.count == 0 {
                    c.first_ms = at;
                }
                c.count += 1;
                c.last_ms = at;
                axum::http::StatusCode::NO_CONTENT
            }));
        let listener = tokio::net::TcpListener::bind(address).await?;
        println!(
            "slow sink on http://{} ({delay:?} a request)",
            listener.local_addr()?
        );
        axum::serve(listener, app).await?;
        Ok(())
    })
}
