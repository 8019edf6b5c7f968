//! Connecting: the configuration, why a connection failed, and the partition-count check.

use super::*;

/// How a Redis store is reached. Its `Debug` shows the URL without credentials.
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://host:port/db`; for a cluster, one or more nodes separated by commas.
    pub url: String,
    /// Whether `url` names a Redis Cluster.
    pub cluster: bool,
    /// Prefix of every key, so that several deployments can share a Redis.
    pub prefix: String,
    /// Queue partitions.
    pub partitions: u16,
    /// Timeout of every call.
    pub timeout: Duration,
    /// Start without Redis: connect on first use and check the partition count then, instead
    /// of failing now. For gateways with a spool, which take requests during an outage.
    pub lazy: bool,
    /// How long a partition stays with its owner without a heartbeat (they ride on its pulls).
    /// Another instance takes it over after that, and hands out again what the old owner had
    /// not acked.
    pub ownership: Duration,
    /// How long an instance handing a partition over waits for the events it handed out there
    /// to be settled before it lets go. A handler still running then keeps its event's claim:
    /// the next owner holds that chat back until the claim is settled or its lease ends.
    pub handover: Duration,
    /// What an acknowledged event survives (`RedisDurability`); `Fsync` by default, which
    /// refuses a server that does not write every change to disk.
    pub durability: RedisDurability,
    /// What this gateway is called among those sharing the Redis (its `[log] instance`): the
    /// start of its name there, so that owners and handovers name it. Letters, digits, `.`,
    /// `_`, `-` and `:` are kept, 40 at most; a random part follows, unique per connection.
    pub name: Option<String>,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &oncegate_core::redact::url(&self.url))
            .field("cluster", &self.cluster)
            .field("prefix", &self.prefix)
            .field("partitions", &self.partitions)
            .field("timeout", &self.timeout)
            .field("lazy", &self.lazy)
            .field("ownership", &self.ownership)
            .field("handover", &self.handover)
            .field("durability", &self.durability)
            .field("name", &self.name)
            .finish()
    }
}

impl RedisConfig {
    /// Defaults for `url`.
    pub fn at(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            cluster: false,
            lazy: false,
            prefix: "og".into(),
            partitions: 16,
            timeout: Duration::from_secs(2),
            ownership: Duration::from_secs(10),
            handover: Duration::from_secs(30),
            durability: RedisDurability::Fsync,
            name: None,
        }
    }

    /// The store's name among the gateways: `name` (its safe characters) and a random part.
    pub(crate) fn instance_name(&self) -> String {
        let random = format!("{:016x}", fastrand::u64(..));
        let label: String = self
            .name
            .as_deref()
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
            .take(40)
            .collect();
        match label.is_empty() {
            true => random,
            false => format!("{label}-{}", &random[..8]),
        }
    }
}

/// Why a Redis store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL or the server.
    #[error("cannot connect to {url}: {message}")]
    Connect {
        /// The URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The server does not keep what the configured durability promises.
    #[error("{0}")]
    Durability(String),
    /// The stored partition count differs.
    #[error(
        "prefix {prefix:?} was created with {stored} partitions but {configured} are configured; set partitions = {stored}"
    )]
    Partitions {
        /// The key prefix.
        prefix: String,
        /// In Redis.
        stored: u16,
        /// In the configuration.
        configured: u16,
    },
}

/// Records the partition count under the prefix when it is new, and refuses a different one:
/// partitions decide where keys live, so two counts on one prefix would split records.
pub(super) async fn check_partitions(
    conn: &mut Conn,
    prefix: &str,
    partitions: u16,
) -> Result<(), ConnectError> {
    let key = format!("{prefix}:partitions");
    let connect = |e: redis::RedisError| ConnectError::Connect {
        url: String::new(),
        message: connect_message(&e),
    };
    let _: Value = redis::cmd("SET")
        .arg(&key)
        .arg(partitions)
        .arg("NX")
        .query_async(conn)
        .await
        .map_err(connect)?;
    let stored: u16 = redis::cmd("GET")
        .arg(&key)
        .query_async(conn)
        .await
        .map_err(connect)?;
    if stored == partitions {
        Ok(())
    } else {
        Err(ConnectError::Partitions {
            prefix: prefix.to_owned(),
            stored,
            configured: partitions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_store_is_called_by_its_name_and_a_random_part() {
        let named = RedisConfig {
            name: Some("gw 7/east:1".into()),
            ..RedisConfig::at("redis://127.0.0.1:1")
        };
        let first = named.instance_name();
        let (label, random) = first.rsplit_once('-').expect("a random part");
        assert_eq!(label, "gw7east:1");
        assert_eq!(random.len(), 8);
        assert_ne!(first, named.instance_name(), "unique per connection");
        let unnamed = RedisConfig::at("redis://127.0.0.1:1").instance_name();
        assert_eq!(unnamed.len(), 16, "{unnamed}");
        assert!(unnamed.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
