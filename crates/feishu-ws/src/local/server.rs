//! The local server's sockets: the endpoint discovery call, the WebSocket accept loop, and
//! one connection's frames.

use super::*;

pub(super) async fn endpoint(
    State(shared): State<Arc<Shared>>,
    Json(body): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    let code = {
        let mut inner = shared.lock();
        inner.endpoint_calls += 1;
        inner.endpoint_code
    };
    if body["AppID"] != shared.app_id.as_str() || body["AppSecret"] != shared.app_secret.as_str() {
        return Json(serde_json::json!({"code": 10003, "msg": "invalid app_id or app_secret"}));
    }
    if code != 0 {
        return Json(serde_json::json!({"code": code, "msg": "refused by the local server"}));
    }
    let config = *shared.config.lock().unwrap_or_else(|p| p.into_inner());
    let device = fastrand::u64(..);
    Json(serde_json::json!({
        "code": 0, "msg": "ok",
        "data": {
            "URL": format!("ws://{}/ws/v2?device_id={device}&service_id=1&access_key=local-secret", shared.ws_addr),
            "ClientConfig": config_json(&config),
        }
    }))
}

pub(super) fn config_json(config: &ClientConfig) -> serde_json::Value {
    serde_json::json!({
        "ReconnectCount": config.reconnect_count,
        "ReconnectInterval": config.reconnect_interval,
        "ReconnectNonce": config.reconnect_nonce,
        "PingInterval": config.ping_interval,
    })
}

pub(super) async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            let refusal = {
                let mut inner = shared.lock();
                inner.handshakes.push(Instant::now());
                inner.refusals.pop_front()
            };
            // The signature is tungstenite's.
            #[allow(clippy::result_large_err)]
            let check = move |_: &Request, response: Response| -> Result<Response, ErrorResponse> {
                match refusal {
                    None => Ok(response),
                    Some((status, auth)) => {
                        let mut refused = ErrorResponse::new(Some("refused".into()));
                        *refused.status_mut() = axum::http::StatusCode::from_u16(status)
                            .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
                        let headers = refused.headers_mut();
                        if let Ok(value) = status.to_string().parse() {
                            headers.insert("Handshake-Status", value);
                        }
                        if let Some(value) = auth.and_then(|auth| auth.parse().ok()) {
                            headers.insert("Handshake-Autherrcode", value);
                        }
                        if let Ok(value) = "refused by the local server".parse() {
                            headers.insert("Handshake-Msg", value);
                        }
                        Err(refused)
                    }
                }
            };
            if let Ok(socket) = tokio_tungstenite::accept_hdr_async(stream, check).await {
                serve(socket, shared).await;
            }
        });
    }
}

pub(super) async fn serve<S>(socket: tokio_tungstenite::WebSocketStream<S>, shared: Arc<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (commands, mut orders) = mpsc::unbounded_channel();
    let silent = Arc::new(AtomicBool::new(false));
    let id = {
        let mut inner = shared.lock();
        inner.next_connection += 1;
        let id = inner.next_connection;
        inner.connections.insert(
            id,
            Connection {
                commands,
                silent: silent.clone(),
                next_seq: 0,
            },
        );
        id
    };
    let (mut sink, mut stream) = socket.split();
    loop {
        tokio::select! {
            order = orders.recv() => match order {
                Some(Command::Send(bytes)) if !silent.load(Ordering::Relaxed) => {
                    if sink.send(Message::Binary(bytes.into())).await.is_err() { break; }
                }
                Some(Command::Send(_)) => {}
                Some(Command::Close) | None => break,
            },
            message = stream.next() => match message {
                Some(Ok(Message::Binary(data))) if !silent.load(Ordering::Relaxed) => {
                    if let Some(pong) = received(&shared, id, &data)
                        && sink.send(Message::Binary(pong.into())).await.is_err()
                    {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                _ => break,
            },
        }
    }
    shared.lock().connections.remove(&id);
}

/// Records an ack, or answers a ping with a pong.
pub(super) fn received(shared: &Shared, connection: u64, data: &[u8]) -> Option<Vec<u8>> {
    let frame = Frame::decode_bytes(data).ok()?;
    let mut inner = shared.lock();
    if frame.method == METHOD_CONTROL && frame.kind() == Some("ping") {
        inner.pings += 1;
        let mut pong = Frame::ping(frame.service);
        pong.headers[0].value = "pong".into();
        pong.payload = inner
            .pong_config
            .map(|config| Bytes::from(config_json(&config).to_string()));
        return Some(pong.to_bytes());
    }
    let answer: serde_json::Value =
        serde_json::from_slice(frame.payload.as_deref().unwrap_or_default()).ok()?;
    let code = answer["code"].as_i64().unwrap_or(-1);
    let data = answer["data"].as_str().and_then(|data| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.decode(data).ok()
    });
    let message_id = frame.header("message_id").unwrap_or("").to_owned();
    let now = Instant::now();
    let after = inner
        .unacked
        .get(&message_id)
        .map(|pushed| now.saturating_duration_since(*pushed));
    if code == 200 {
        inner.unacked.remove(&message_id);
    }
    inner.acks.push(AckRecord {
        connection,
        seq_id: frame.seq_id,
        message_id,
        code,
        data,
        biz_rt: frame.header("biz_rt").map(str::to_owned),
        at: now,
        after,
    });
    None
}
