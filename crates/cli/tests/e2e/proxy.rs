//! A TCP fault proxy for the fault suite, between a gateway and Redis or its downstream: it
//! passes bytes, delays them, holds them (a blackhole: connected, answering nothing), or cuts
//! every open connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Pass,
    /// Each chunk waits this long before it goes on.
    Delay(Duration),
    /// Chunks are held until the mode changes; new connections are accepted and held too.
    Blackhole,
}

/// The proxy; it stops when dropped.
pub(crate) struct FaultProxy {
    pub(crate) addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// Listens on a loopback port and forwards every connection to `target`.
    pub(crate) async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let (cuts, _) = watch::channel(0u64);
        let task = {
            let (mode, cuts) = (mode.clone(), cuts.clone());
            tokio::spawn(async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let (mode, cut) = (mode.clone(), cuts.subscribe());
                    tokio::spawn(carry(inbound, target, mode, cut));
                }
            })
        };
        Self {
            addr,
            mode,
            cuts,
            task,
        }
    }

    pub(crate) fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
    }

    /// Closes every connection open now, mid-request or not.
    pub(crate) fn cut_all(&self) {
        self.cuts.send_modify(|generation| *generation += 1);
    }
}

fn mode_of(mode: &Mutex<Mode>) -> Mode {
    *mode.lock().expect("mode")
}

async fn carry(
    inbound: TcpStream,
    target: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    mut cut: watch::Receiver<u64>,
) {
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (from_in, to_in) = inbound.into_split();
    let (from_out, to_out) = outbound.into_split();
    let up = pump(from_in, to_out, mode.clone());
    let down = pump(from_out, to_in, mode);
    // Either side closing, or a cut, ends the connection both ways.
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut.changed() => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: Arc<Mutex<Mode>>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        loop {
            match mode_of(&mode) {
                Mode::Pass => break,
                Mode::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::Blackhole => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
