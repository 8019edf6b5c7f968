//! An address that answers, but not as Redis does.

use std::time::Duration;

/// A URL that reaches an HTTP server instead of Redis: the error says the answer was not the
/// Redis protocol, not only the parser's "Unexpected `84`".
#[test]
fn a_server_that_is_not_redis_is_named_as_such() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { continue };
            let mut buffer = [0u8; 512];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    let config = oncegate_redis::RedisConfig {
        timeout: Duration::from_secs(2),
        ..oncegate_redis::RedisConfig::at(&format!("redis://127.0.0.1:{port}"))
    };
    let error = oncegate_redis::RedisStore::connect(config.clone()).expect_err("not redis");
    assert!(
        error.to_string().contains("not the Redis protocol"),
        "{error}"
    );
    let error = oncegate_redis::RedisStore::probe(&config).expect_err("not redis");
    assert!(
        error.to_string().contains("not the Redis protocol"),
        "{error}"
    );
}
