//! `[server]`: the HTTP listeners.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checks::Severity;
use crate::duration;
use crate::*;

/// `[server]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Where platforms send callbacks (`/webhook/<source>`).
    pub listen: String,
    /// Health, readiness, metrics and the admin API.
    pub admin_listen: String,
    /// Required as `Authorization: Bearer <token>` on `/admin/*`, if set.
    pub admin_token: Option<Secret>,
    /// The largest accepted callback body, in bytes.
    pub body_limit: usize,
    /// Most connections open at once on each listener; beyond it new ones are closed at once.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers; a kept-alive connection that
    /// sends no next request within it is closed.
    #[serde(with = "duration")]
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body.
    #[serde(with = "duration")]
    pub body_timeout: Duration,
    /// Refused requests and repeated failures are logged as one summary per interval.
    #[serde(with = "duration")]
    pub log_interval: Duration,
    /// After a reload (SIGHUP, `oncegate reload`) changes a source's callback secrets, how long
    /// callbacks signed or encrypted with the old ones are still taken: a platform keeps
    /// retrying what it sent before the change with the old secrets. `0s`: not at all (when the
    /// old secret leaked). A reload takes the value it reads.
    #[serde(with = "duration")]
    pub secret_overlap: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_listen: "127.0.0.1:9090".into(),
            admin_token: None,
            body_limit: 1024 * 1024,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            log_interval: Duration::from_secs(10),
            secret_overlap: Duration::from_secs(3600),
        }
    }
}

/// `[server]`: its addresses, body limit and admin token.
pub(crate) fn check(config: &Config, report: &mut impl FnMut(Severity, &str, String)) {
    for (what, address) in [
        ("server.listen", &config.server.listen),
        ("server.admin_listen", &config.server.admin_listen),
    ] {
        if address.parse::<std::net::SocketAddr>().is_err() {
            report(
                Severity::Error,
                what,
                format!("{address:?} is not an address and port, e.g. \"127.0.0.1:8080\""),
            );
        }
    }
    if config.server.listen == config.server.admin_listen && !config.server.listen.ends_with(":0") {
        report(
            Severity::Error,
            "server.admin_listen",
            "the same address as server.listen; the admin API needs its own listener".into(),
        );
    }
    if config.server.body_limit < 1024 {
        report(
            Severity::Error,
            "server.body_limit",
            format!(
                "{} bytes cannot hold a callback; use at least 65536",
                config.server.body_limit
            ),
        );
    }
    if let Some(Err(message)) = config
        .server
        .admin_token
        .as_ref()
        .map(crate::Secret::resolve)
    {
        report(Severity::Error, "server.admin_token", message);
    }
    let admin_public = config
        .server
        .admin_listen
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|address| !address.ip().is_loopback());
    if admin_public && config.server.admin_token.is_none() {
        report(
            Severity::Error,
            "server.admin_token",
            format!(
                "server.admin_listen {:?} is reachable from other machines, and the admin API \
                 shows records and dead letters: set admin_token (e.g. {{ env = \"ONCEGATE_ADMIN_TOKEN\" }}) \
                 or listen on 127.0.0.1",
                config.server.admin_listen
            ),
        );
    }
}
