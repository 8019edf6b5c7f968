//! A primary found through Redis Sentinel and followed across failovers: the connection asks
//! the sentinels where the primary is, and asks again after any error that a failover causes
//! (a dropped or refused connection, `READONLY` from a demoted primary, `MASTERDOWN`,
//! `LOADING`). While there is no primary every call fails, so the gateway answers 503 and
//! records nothing.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, RedisError, RedisResult};

/// `redis+sentinel://[user:password@]host:port,host:port/primary-name[/db]`, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// The sentinels' addresses.
    pub(crate) sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the primary under.
    pub(crate) primary: String,
    /// Credentials for the Redis servers (not the sentinels).
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

/// The URL scheme that names sentinels.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// The sentinels' default port.
const SENTINEL_PORT: u16 = 26379;

impl SentinelUrl {
    /// Reads a `redis+sentinel://` URL; the error says what is missing.
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix(SENTINEL_SCHEME)
            .ok_or_else(|| format!("a Sentinel URL starts with {SENTINEL_SCHEME}"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials), hosts),
            None => (None, authority),
        };
        let (username, password) = match credentials {
            Some(credentials) => {
                let (user, password) = credentials.split_once(':').unwrap_or(("", credentials));
                let decode = |s: &str| {
                    percent_decode(s).ok_or("the credentials are not valid percent-encoding")
                };
                (
                    Some(decode(user)?).filter(|u| !u.is_empty()),
                    Some(decode(password)?).filter(|p| !p.is_empty()),
                )
            }
            None => (None, None),
        };
        let sentinels = hosts
            .split(',')
            .map(|host| {
                let host = host.trim();
                match host.rsplit_once(':') {
                    Some((name, port)) => port
                        .parse()
                        .map(|port| (name.to_owned(), port))
                        .map_err(|_| format!("{host:?}: the port is not a number")),
                    None => Ok((host.to_owned(), SENTINEL_PORT)),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if sentinels.iter().any(|(host, _)| host.is_empty()) {
            return Err("name at least one sentinel, host:port, separated by commas".into());
        }
        let mut path = path.split('/');
        let primary = path.next().unwrap_or_default().to_owned();
        if primary.is_empty() {
            return Err(
                "name the primary the sentinels monitor after the hosts, e.g. \
                 redis+sentinel://127.0.0.1:26379/mymaster"
                    .into(),
            );
        }
        let db = match path.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse()
                .map_err(|_| format!("{db:?}: the database is not a number"))?,
        };
        Ok(Self {
            sentinels,
            primary,
            username,
            password,
            db,
        })
    }
}

/// Percent-decoding of URL credentials; `None` for non-UTF-8 (a `%` not followed by two hex
/// digits stays as it is, as URL parsers take it).
fn percent_decode(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|decoded| decoded.into_owned())
}

/// The primary the sentinels name, followed.
pub(crate) struct Followed {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The primary's address and a connection to it; `None` until found, and again after an
    /// error that may mean a failover.
    current: std::sync::Mutex<Option<(String, ConnectionManager)>>,
    config: redis::aio::ConnectionManagerConfig,
    timeout: Duration,
}

impl Followed {
    /// The sentinels of `url`; with `lazy` nothing is asked until the first call.
    pub(crate) async fn open(
        url: &SentinelUrl,
        timeout: Duration,
        config: redis::aio::ConnectionManagerConfig,
        lazy: bool,
    ) -> RedisResult<Arc<Self>> {
        let mut builder = SentinelClientBuilder::new(
            url.sentinels
                .iter()
                .map(|(host, port)| ConnectionAddr::Tcp(host.clone(), *port)),
            &url.primary,
            SentinelServerType::Master,
        )?
        .set_client_to_redis_db(url.db);
        if let Some(username) = &url.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &url.password {
            builder = builder.set_client_to_redis_password(password);
        }
        let followed = Arc::new(Self {
            sentinels: tokio::sync::Mutex::new(builder.build()?),
            current: std::sync::Mutex::new(None),
            config,
            timeout,
        });
        if !lazy {
            followed.primary().await?;
        }
        Ok(followed)
    }

    /// The connection to the primary, asking the sentinels first when it is not known.
    async fn primary(&self) -> RedisResult<ConnectionManager> {
        if let Some((_, conn)) = self.known() {
            return Ok(conn);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Found by another caller while this one waited.
        if let Some((_, conn)) = self.known() {
            return Ok(conn);
        }
        let client = tokio::time::timeout(self.timeout, sentinels.async_get_client())
            .await
            .map_err(|_| {
                RedisError::from((
                    redis::ErrorKind::Io,
                    "no sentinel answered in time where the primary is",
                ))
            })??;
        let address = client.get_connection_info().addr().to_string();
        let conn = ConnectionManager::new_lazy_with_config(client, self.config.clone())?;
        tracing::info!(primary = %address, "redis sentinel: following the primary");
        if let Ok(mut current) = self.current.lock() {
            *current = Some((address, conn.clone()));
        }
        Ok(conn)
    }

    fn known(&self) -> Option<(String, ConnectionManager)> {
        self.current.lock().ok().and_then(|current| current.clone())
    }

    /// After `error`: forget the primary when the error may mean it is no longer one, so that
    /// the next call asks the sentinels.
    fn after(&self, error: &RedisError) {
        let failover = error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"));
        if failover
            && let Ok(mut current) = self.current.lock()
            && let Some((address, _)) = current.take()
        {
            tracing::warn!(primary = %address, %error, "redis sentinel: asking the sentinels again where the primary is");
        }
    }

    /// Where the primary is now, as the sentinels last said (for operators).
    pub(crate) fn address(&self) -> Option<String> {
        self.known().map(|(address, _)| address)
    }

    pub(crate) fn req_packed_command<'a>(
        self: &'a Arc<Self>,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let mut conn = self.primary().await?;
            let reply = conn.req_packed_command(cmd).await;
            if let Err(error) = &reply {
                self.after(error);
            }
            reply
        })
    }

    pub(crate) fn req_packed_commands<'a>(
        self: &'a Arc<Self>,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            let mut conn = self.primary().await?;
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(error) = &reply {
                self.after(error);
            }
            reply
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_are_read() {
        let url = SentinelUrl::parse("redis+sentinel://:p%40ss@127.0.0.1:26379,h2/mymaster/2")
            .expect("valid");
        assert_eq!(
            url,
            SentinelUrl {
                sentinels: vec![("127.0.0.1".into(), 26379), ("h2".into(), 26379)],
                primary: "mymaster".into(),
                username: None,
                password: Some("p@ss".into()),
                db: 2,
            }
        );
        for bad in [
            "redis://h:1/m",
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:x/m",
            "redis+sentinel://,h:1/m",
            "redis+sentinel://h:1/m/x",
            "redis+sentinel://:%ff@h:1/m",
        ] {
            assert!(SentinelUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
