//! One connection type for a standalone Redis and a Redis Cluster, so that every script and
//! command is written once.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::sentinel::{Followed, SENTINEL_SCHEME, SentinelUrl};

/// A multiplexed connection that pipelines concurrent calls and reconnects by itself: one
/// server, a cluster (commands routed by their first key's slot, following `MOVED`), or the
/// primary that Redis Sentinel names (followed across failovers).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(std::sync::Arc<Followed>),
}

impl Conn {
    /// Connects to `url`: one URL for a standalone server; with `cluster`, any of the
    /// cluster's nodes separated by commas (the rest is discovered); `redis+sentinel://` for
    /// the primary the sentinels name.
    /// With `lazy`, nothing is reached now: the first call connects.
    pub(crate) async fn open(
        url: &str,
        cluster: bool,
        timeout: Duration,
        lazy: bool,
    ) -> RedisResult<Self> {
        let urls: Vec<&str> = url.split(',').map(str::trim).collect();
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2);
        if url.starts_with(SENTINEL_SCHEME) {
            let parsed = SentinelUrl::parse(url).map_err(|message| {
                redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "not a Sentinel URL",
                    message,
                ))
            })?;
            return Ok(Self::Sentinel(
                Followed::open(&parsed, timeout, config, lazy).await?,
            ));
        }
        if cluster {
            let client = ClusterClientBuilder::new(urls.to_vec())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(2)
                .build()?;
            if lazy {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout);
                return Ok(Self::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ));
            }
            return Ok(Self::Cluster(client.get_async_connection().await?));
        }
        let client = redis::Client::open(urls.first().copied().unwrap_or_default())?;
        if lazy {
            return Ok(Self::Single(ConnectionManager::new_lazy_with_config(
                client, config,
            )?));
        }
        Ok(Self::Single(
            client.get_connection_manager_with_config(config).await?,
        ))
    }

    /// Runs `commands`, each on its own key (any slots), and answers their replies in order:
    /// one pipeline on a standalone server; on a cluster, whose pipelines must stay in one
    /// slot, each command on its own, all at once.
    pub(crate) async fn each(&mut self, commands: Vec<Cmd>) -> RedisResult<Vec<Value>> {
        match self {
            Self::Single(_) | Self::Sentinel(_) => {
                let mut pipe = redis::pipe();
                for command in commands {
                    pipe.add_command(command);
                }
                pipe.query_async(self).await
            }
            Self::Cluster(conn) => {
                let mut running = tokio::task::JoinSet::new();
                let count = commands.len();
                for (i, command) in commands.into_iter().enumerate() {
                    let mut conn = conn.clone();
                    running
                        .spawn(async move { (i, command.query_async::<Value>(&mut conn).await) });
                }
                let mut replies = vec![Value::Nil; count];
                while let Some(done) = running.join_next().await {
                    let (i, reply) = done.map_err(|e| {
                        redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "a cluster call's task failed",
                            e.to_string(),
                        ))
                    })?;
                    replies[i] = reply?;
                }
                Ok(replies)
            }
        }
    }

    /// The primary the sentinels named, while one is known; `None` for a server or cluster
    /// named by URL.
    pub(crate) fn primary(&self) -> Option<String> {
        match self {
            Self::Sentinel(followed) => followed.address(),
            _ => None,
        }
    }

    /// `SET mark 1 PX ttl_ms` then `WAIT min wait_ms` on the node that holds `mark`: how
    /// many replicas have every write that node answered before.
    pub(crate) async fn mark_and_wait(
        &mut self,
        mark: &str,
        ttl_ms: u64,
        min: u16,
        wait_ms: u64,
    ) -> RedisResult<u64> {
        let mut set = redis::cmd("SET");
        set.arg(mark).arg(1).arg("PX").arg(ttl_ms);
        let mut wait = redis::cmd("WAIT");
        wait.arg(min).arg(wait_ms);
        match self {
            Self::Cluster(cluster) => {
                // The mark as a command of its own, so that a redirect after a failover is
                // followed (and the slot map refreshed); then the wait on the primary that
                // took it, over the same connection to that node.
                let _: Value = set.query_async(cluster).await?;
                let route =
                    SingleNodeRoutingInfo::SpecificNode(redis::cluster_routing::Route::with_key(
                        mark,
                        redis::cluster_routing::SlotAddr::Master,
                    ));
                let reply = cluster
                    .route_command(wait, RoutingInfo::SingleNode(route))
                    .await?;
                Ok(redis::from_redis_value(reply)?)
            }
            conn => {
                // One round trip.
                let mut pipe = redis::pipe();
                pipe.add_command(set).add_command(wait);
                let (_, confirmed): (Value, u64) = pipe.query_async(conn).await?;
                Ok(confirmed)
            }
        }
    }

    /// The nodes whose keys a `SCAN` must visit: the server, or every cluster primary.
    pub(crate) async fn scan_nodes(&mut self) -> RedisResult<Vec<ScanNode>> {
        match self {
            Self::Single(_) | Self::Sentinel(_) => Ok(vec![ScanNode::Server]),
            Self::Cluster(cluster) => {
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(cluster)
                    .await?;
                Ok(primaries(&nodes)
                    .into_iter()
                    .map(|(host, port)| ScanNode::Primary { host, port })
                    .collect())
            }
        }
    }

    /// Runs `cmd` on `node` (a command without keys, such as `CONFIG GET` or `INFO`).
    pub(crate) async fn query_on(&mut self, node: &ScanNode, cmd: Cmd) -> RedisResult<Value> {
        match (self, node) {
            (Self::Cluster(cluster), ScanNode::Primary { host, port }) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                cluster.route_command(cmd, routing).await
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }
}

/// Where a `SCAN` runs.
pub(crate) enum ScanNode {
    /// The one server of a standalone Redis.
    Server,
    /// A cluster primary.
    Primary { host: String, port: u16 },
}

/// The primaries in a `CLUSTER NODES` answer that are not marked failed.
fn primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = fields.nth(1)?;
            let flags = fields.next()?;
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            // ip:port@cport[,hostname]
            let address = address.split('@').next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(followed) => followed.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(followed) => followed.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
            // The URL's database, which every connection to the primary selects.
            Self::Sentinel(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::primaries;

    #[test]
    fn primaries_are_read_from_cluster_nodes() {
        let nodes = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 master,fail - 0 1426238316232 5 connected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460
";
        assert_eq!(
            primaries(nodes),
            vec![
                ("127.0.0.1".to_owned(), 30002),
                ("127.0.0.1".to_owned(), 30003),
                ("127.0.0.1".to_owned(), 30001),
            ]
        );
    }
}
