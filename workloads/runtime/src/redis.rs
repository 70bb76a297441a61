//! One Redis connection type for a single server or a Redis Cluster, chosen
//! by configuration, so the gateway and the inventory run unchanged on
//! either. Every script the workloads send touches keys of one hash slot, so
//! the cluster client routes each call to the primary that owns it.
//!
//! `REDIS_URL` forms:
//! - `redis://host:6379`: one server;
//! - `redis://a:7001,redis://b:7002`: a cluster, from these seed nodes;
//! - `redis+cluster://a:7001` (or `rediss+cluster://`): a cluster, one seed.

use std::{fmt, str::FromStr, time::Duration};

use redis::{
    Cmd, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
    cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr},
};

/// Where Redis is: one server or the seed nodes of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a proxy in front of several).
    Single(String),
    /// A Redis Cluster, reached through any of these seed nodes.
    Cluster(Vec<String>),
}

/// A `REDIS_URL` that names no server.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid Redis URL {0:?}: give redis://host:port, a comma-separated list of cluster nodes, or redis+cluster://host:port"
)]
pub struct InvalidRedisUrl(String);

impl FromStr for RedisTarget {
    type Err = InvalidRedisUrl;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let urls: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        let cluster_scheme = |u: &str| {
            u.strip_prefix("redis+cluster://")
                .map(|rest| format!("redis://{rest}"))
                .or_else(|| {
                    u.strip_prefix("rediss+cluster://")
                        .map(|rest| format!("rediss://{rest}"))
                })
        };
        match urls.as_slice() {
            [] => Err(InvalidRedisUrl(text.to_owned())),
            [one] => Ok(match cluster_scheme(one) {
                Some(seed) => Self::Cluster(vec![seed]),
                None => Self::Single((*one).to_owned()),
            }),
            many => Ok(Self::Cluster(
                many.iter()
                    .map(|u| cluster_scheme(u).unwrap_or_else(|| (*u).to_owned()))
                    .collect(),
            )),
        }
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Single(url) => f.write_str(url),
            Self::Cluster(seeds) => write!(f, "cluster via {}", seeds.join(",")),
        }
    }
}

/// How long connecting and each answer may take: bounded, so a hung or
/// failing-over Redis fails a call instead of hanging a request.
#[derive(Debug, Clone, Copy)]
pub struct RedisTimeouts {
    /// Establishing a connection.
    pub connect: Duration,
    /// One command's answer.
    pub response: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
        }
    }
}

/// A multiplexed, reconnecting connection to one Redis or a cluster. Cheap
/// to clone; clones share the underlying connections.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server.
    Single(ConnectionManager),
    /// A cluster: commands go to the primary of their keys' slot and follow
    /// MOVED/ASK redirections and failovers.
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Connects to `target`.
    pub async fn connect(target: &RedisTarget, timeouts: RedisTimeouts) -> RedisResult<Self> {
        match target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_response_timeout(Some(timeouts.response));
                Ok(Self::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
            RedisTarget::Cluster(seeds) => {
                let client = ClusterClientBuilder::new(seeds.clone())
                    .connection_timeout(timeouts.connect)
                    .response_timeout(timeouts.response)
                    // A failover takes a few node timeouts; retries with
                    // backoff ride through it instead of failing at once.
                    .retries(6)
                    .min_retry_wait(50)
                    .max_retry_wait(1_000)
                    .build()?;
                Ok(Self::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Runs `cmd`, which names no key, on the primary that owns `key`'s slot
    /// (on a single server: on it). For commands such as WAIT, whose meaning
    /// is "on the node that holds these writes".
    pub async fn on_primary_of(&mut self, key: &str, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Single(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                conn.route_command(
                    cmd.clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        }
    }

    /// Waits until the writes this connection made on `key`'s primary reach
    /// `replicas` replicas, or `timeout` passes; returns how many replicas
    /// have them.
    pub async fn wait_for_replicas(
        &mut self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<u64> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(
            u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let value = self.on_primary_of(key, &wait).await?;
        redis::from_redis_value(value).map_err(Into::into)
    }

    /// The answer of every primary to `cmd` (on a single server: its one
    /// answer), for settings that must hold on every node.
    pub async fn on_every_primary(&mut self, cmd: &Cmd) -> RedisResult<Vec<Value>> {
        match self {
            Self::Single(conn) => Ok(vec![cmd.query_async(conn).await?]),
            Self::Cluster(conn) => {
                let routing = RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    None,
                ));
                match conn.route_command(cmd.clone(), routing).await? {
                    // Without a response policy the nodes' answers come back
                    // as a map of address → answer.
                    Value::Map(pairs) => Ok(pairs.into_iter().map(|(_, v)| v).collect()),
                    Value::Array(values) => Ok(values),
                    other => Ok(vec![other]),
                }
            }
        }
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(conn: ConnectionManager) -> Self {
        Self::Single(conn)
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_is_a_server_and_a_list_or_the_cluster_scheme_is_a_cluster() {
        let parse = |s: &str| s.parse::<RedisTarget>().map_err(|e| e.to_string());
        assert_eq!(
            parse("redis://r:6379"),
            Ok(RedisTarget::Single("redis://r:6379".into()))
        );
        assert_eq!(
            parse("redis://a:7001, redis://b:7002,"),
            Ok(RedisTarget::Cluster(vec![
                "redis://a:7001".into(),
                "redis://b:7002".into()
            ]))
        );
        assert_eq!(
            parse("redis+cluster://a:7001"),
            Ok(RedisTarget::Cluster(vec!["redis://a:7001".into()]))
        );
        assert_eq!(
            parse("rediss+cluster://u:p@a:7001"),
            Ok(RedisTarget::Cluster(vec!["rediss://u:p@a:7001".into()]))
        );
        assert!(parse(" , ").is_err_and(|e| e.contains("invalid Redis URL")));
    }
}
