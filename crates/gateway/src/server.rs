//! The HTTP listeners: a bound on open connections, deadlines on headers (and so on idle
//! kept-alive connections), and a shutdown that ends within its grace whatever clients do.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::base::summary::Summaries;

/// The largest request head (request line and headers) a client may send; hyper's read
/// buffer, which it must not be smaller than 8 KiB.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Bounds of one listener.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    /// Connections open at once; more are closed at once, counted and logged.
    pub max_connections: usize,
    /// Time to send a request's headers; also how long a kept-alive connection may idle.
    pub header_timeout: Duration,
    /// Time to send a request's body.
    pub body_timeout: Duration,
    /// How long shutdown waits for requests in progress before it closes their connections.
    pub shutdown_grace: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        let config = oncegate_config::ServerConfig::default();
        Self {
            max_connections: config.max_connections,
            header_timeout: config.header_timeout,
            body_timeout: config.body_timeout,
            shutdown_grace: oncegate_config::DispatcherConfig::default().shutdown_grace,
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, then lets requests in progress finish
/// within the grace and closes whatever is left.
pub(crate) async fn serve(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    summaries: Arc<Summaries>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, most often: wait for connections to close.
                    summaries.note("accept_failed", None, &format!("{name}: {error}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics::counter!("oncegate_connections_refused_total", "listener" => name)
                .increment(1);
            summaries.note(
                "connection_limit",
                Some(peer),
                &format!(
                    "{name}: {} connections are open (server.max_connections); closed a new one",
                    limits.max_connections
                ),
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            router.clone().oneshot(request)
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let shutdown = shutdown.clone();
        // The peer for the connection's requests, which run inside its task: an extension
        // would cost every request a map and a box.
        connections.spawn(PEER.scope(peer, async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(slot);
        }));
    }
    drop(listener);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            listener = name,
            open = connections.len(),
            "connections still open after the shutdown grace; closing them"
        );
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
    Ok(())
}

tokio::task_local! {
    /// The peer of the connection whose request runs, set by the listener.
    static PEER: SocketAddr;
}

/// The peer of the running request, when a listener of ours accepted it.
pub(crate) fn peer() -> Option<SocketAddr> {
    PEER.try_with(|peer| *peer).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Each request learns its own connection's peer, on every request of a kept-alive
    /// connection; code outside a listener's connection learns none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_see_their_connections_peer() -> anyhow::Result<()> {
        assert_eq!(peer(), None);
        let router = Router::new().route(
            "/",
            axum::routing::get(|| async {
                peer().map_or_else(|| "none".to_owned(), |p| p.to_string())
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            "test",
            listener,
            router,
            ServerLimits::default(),
            Arc::new(Summaries::new(Duration::from_secs(60))),
            shutdown.clone(),
        ));
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(tokio::spawn(async move {
                let mut stream = tokio::net::TcpStream::connect(addr).await?;
                let local = stream.local_addr()?;
                let mut seen = Vec::new();
                for _ in 0..3 {
                    stream
                        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                        .await?;
                    let mut buf = vec![0u8; 1024];
                    let n = stream.read(&mut buf).await?;
                    let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
                    seen.push(answer.rsplit("\r\n\r\n").next().unwrap_or("").to_owned());
                }
                anyhow::Ok((local, seen))
            }));
        }
        for client in clients {
            let (local, seen) = client.await??;
            assert_eq!(seen, vec![local.to_string(); 3]);
        }
        shutdown.cancel();
        server.await??;
        Ok(())
    }
}
