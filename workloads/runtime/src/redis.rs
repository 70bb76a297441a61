//! One Redis connection type for a single server or a Redis Cluster, chosen
//! by configuration, so the gateway and the inventory run unchanged on
//! either. Every script the workloads send touches keys of one hash slot, so
//! the cluster client routes each call to the primary that owns it.
//!
//! `REDIS_URL` forms:
//! - `redis://host:6379`: one server;
//! - `redis://a:7001,redis://b:7002`: a cluster, from these seed nodes;
//! - `redis+cluster://a:7001` (or `rediss+cluster://`): a cluster, one seed.

use std::{
    fmt,
    future::Future,
    str::FromStr,
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::{ClusterClient, ClusterClientBuilder},
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
    /// How long every call on a cluster connection may fail before the
    /// connection is replaced by a fresh one (see [`StallWatch`]).
    pub stall: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
            stall: Duration::from_secs(3),
        }
    }
}

/// A multiplexed, reconnecting connection to one Redis or a cluster. Cheap
/// to clone; clones share the underlying connections.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server.
    Single(SingleServer),
    /// A cluster: commands go to the primary of their keys' slot and follow
    /// MOVED/ASK redirections and failovers.
    Cluster(HealingCluster),
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
                Ok(Self::Single(SingleServer::connect(client, config).await?))
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
                Ok(Self::Cluster(
                    HealingCluster::connect(client, timeouts).await?,
                ))
            }
        }
    }

    /// Changes each time the connection underneath is replaced (see
    /// [`HealingCluster`]); always 0 for one server. A `WAIT` only covers
    /// writes made on the same connection, so a caller that writes and then
    /// waits compares the generation before the write with the one after
    /// the wait.
    pub fn generation(&self) -> u64 {
        match self {
            Self::Single(_) => 0,
            Self::Cluster(conn) => conn.replacements(),
        }
    }

    /// A new connection to the same Redis, with server-side clients of its
    /// own: a command that blocks its client (`WAIT`) sent on it holds up
    /// nothing sent on this one, and a `WAIT` on it waits for the writes
    /// made on it, not for this one's.
    pub async fn separate(&self) -> RedisResult<Self> {
        match self {
            Self::Single(conn) => {
                let (client, config) = conn.origin.as_ref();
                Ok(Self::Single(
                    SingleServer::connect(client.clone(), config.clone()).await?,
                ))
            }
            Self::Cluster(conn) => {
                let timeouts = conn.shared.timeouts;
                // Bounded as a replacement is: the cluster client's own
                // connect waits on every seed in turn.
                let fresh = tokio::time::timeout(
                    timeouts.connect.saturating_mul(4),
                    HealingCluster::connect(conn.shared.client.clone(), timeouts),
                )
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connecting to the Redis Cluster timed out",
                    ))
                })??;
                Ok(Self::Cluster(fresh))
            }
        }
    }

    /// Sends `pipeline`, in order on one server-side client, to the primary
    /// that owns `key`'s slot (on a single server: to it), and returns every
    /// answer; the first error reply is the call's error, on either kind of
    /// Redis. For a write and a `WAIT` that must meet on the same node.
    pub async fn pipeline_on_primary_of(
        &mut self,
        key: &str,
        pipeline: &Pipeline,
    ) -> RedisResult<Vec<Value>> {
        let answers: Vec<Value> = match self {
            Self::Single(conn) => pipeline.query_async(&mut conn.manager).await?,
            Self::Cluster(conn) => {
                let route =
                    SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                let count = pipeline.len();
                conn.call(|mut c| async move {
                    c.route_pipeline(pipeline.clone(), 0, count, route).await
                })
                .await?
            }
        };
        answers.into_iter().map(Value::extract_error).collect()
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
            Self::Single(conn) => cmd.query_async(&mut conn.manager).await,
            Self::Cluster(conn) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                conn.call(|mut c| async move { c.route_command(cmd.clone(), routing).await })
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
            Self::Single(conn) => Ok(vec![cmd.query_async(&mut conn.manager).await?]),
            Self::Cluster(conn) => {
                let routing = RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    None,
                ));
                let answer = conn
                    .call(|mut c| async move { c.route_command(cmd.clone(), routing).await })
                    .await?;
                match answer {
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

/// Decides when a cluster connection has stalled: every call has failed at
/// the connection level (timeouts, refused or dropped connections) for at
/// least `stall`, with no success in between. A single primary failing over
/// does not stall a connection that also serves other primaries; a client
/// wedged for good does.
///
/// Why this exists: the `redis` crate's cluster client (1.8) can wedge after
/// a primary dies. Its slot refresh waits for a lock whose turn went to a
/// reconnect task that is not polled while the refresh runs, so every later
/// call times out until the process restarts. A fresh connection has fresh
/// state; replacing the wedged one restores service.
#[derive(Debug)]
pub struct StallWatch {
    stall: Duration,
    failing_since: Option<Instant>,
}

impl StallWatch {
    /// A watch that calls a connection stalled after `stall` of failures.
    pub fn new(stall: Duration) -> Self {
        Self {
            stall,
            failing_since: None,
        }
    }

    /// Records a call's outcome at `now`; returns whether the connection
    /// has stalled and should be replaced. Resets after saying so, so the
    /// next replacement needs another full `stall` of failures.
    pub fn observe(&mut self, connection_failed: bool, now: Instant) -> bool {
        if !connection_failed {
            self.failing_since = None;
            return false;
        }
        let since = *self.failing_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.stall {
            self.failing_since = None;
            return true;
        }
        false
    }
}

/// Whether `error` says the connection (not the command) failed: only these
/// count towards a stall; a script's own error proves the connection works.
fn is_connection_failure(error: &RedisError) -> bool {
    error.is_timeout()
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.kind() == ErrorKind::ClusterConnectionNotFound
}

/// A reconnecting connection to one server, which can open another like it.
#[derive(Clone)]
pub struct SingleServer {
    manager: ConnectionManager,
    // Shared, so the hot path's clones copy a pointer.
    origin: Arc<(redis::Client, ConnectionManagerConfig)>,
}

impl SingleServer {
    async fn connect(client: redis::Client, config: ConnectionManagerConfig) -> RedisResult<Self> {
        Ok(Self {
            manager: ConnectionManager::new_with_config(client.clone(), config.clone()).await?,
            origin: Arc::new((client, config)),
        })
    }
}

/// A cluster connection that replaces itself with a fresh one when it
/// stalls (see [`StallWatch`]). Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct HealingCluster {
    shared: Arc<HealingShared>,
}

struct HealingShared {
    client: ClusterClient,
    timeouts: RedisTimeouts,
    current: RwLock<ClusterConnection>,
    watch: Mutex<StallWatch>,
    replacing: AtomicBool,
    replacements: AtomicU64,
}

impl HealingCluster {
    async fn connect(client: ClusterClient, timeouts: RedisTimeouts) -> RedisResult<Self> {
        let first = client.get_async_connection().await?;
        Ok(Self {
            shared: Arc::new(HealingShared {
                client,
                timeouts,
                current: RwLock::new(first),
                watch: Mutex::new(StallWatch::new(timeouts.stall)),
                replacing: AtomicBool::new(false),
                replacements: AtomicU64::new(0),
            }),
        })
    }

    /// How many times the connection has been replaced after a stall.
    pub fn replacements(&self) -> u64 {
        self.shared.replacements.load(Ordering::Relaxed)
    }

    fn current(&self) -> ClusterConnection {
        self.shared
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `op` on the current connection and watches its outcome; the
    /// call that finds the connection stalled replaces it before returning
    /// its own error (the caller retries as it would after any failure).
    async fn call<T, F, Fut>(&self, op: F) -> RedisResult<T>
    where
        F: FnOnce(ClusterConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let result = op(self.current()).await;
        let failed = result.as_ref().err().is_some_and(is_connection_failure);
        let stalled = self
            .shared
            .watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observe(failed, Instant::now());
        if stalled && !self.shared.replacing.swap(true, Ordering::AcqRel) {
            self.replace().await;
            self.shared.replacing.store(false, Ordering::Release);
        }
        result
    }

    async fn replace(&self) {
        let fresh = tokio::time::timeout(
            self.shared.timeouts.connect.saturating_mul(4),
            self.shared.client.get_async_connection(),
        )
        .await;
        match fresh {
            Ok(Ok(conn)) => {
                *self
                    .shared
                    .current
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = conn;
                let n = self.shared.replacements.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(
                    replacements = n,
                    "Redis Cluster connection stalled; replaced it with a fresh one"
                );
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "Redis Cluster connection stalled; reconnecting failed");
            }
            Err(_) => {
                tracing::warn!("Redis Cluster connection stalled; reconnecting timed out");
            }
        }
    }
}

impl ConnectionLike for HealingCluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.call(move |mut c| async move { c.req_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(
            self.call(
                move |mut c| async move { c.req_packed_commands(pipeline, offset, count).await },
            ),
        )
    }

    fn get_db(&self) -> i64 {
        self.current().get_db()
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.manager.req_packed_command(cmd),
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
            Self::Single(conn) => conn.manager.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.manager.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_stalls_only_after_failing_without_a_success_for_the_whole_span() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut watch = StallWatch::new(Duration::from_secs(3));
        // Failures with a success in between never add up.
        assert!(!watch.observe(true, at(0)));
        assert!(!watch.observe(true, at(2_900)));
        assert!(!watch.observe(false, at(2_950)));
        assert!(!watch.observe(true, at(3_000)));
        assert!(!watch.observe(true, at(5_999)));
        // Three seconds of nothing but failures: stalled, once.
        assert!(watch.observe(true, at(6_000)));
        assert!(!watch.observe(true, at(6_001)));
        // The next replacement needs another full span.
        assert!(!watch.observe(true, at(8_999)));
        assert!(watch.observe(true, at(9_001)));
    }

    #[test]
    fn only_connection_level_errors_count_towards_a_stall() {
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let not_found = RedisError::from((ErrorKind::ClusterConnectionNotFound, "none"));
        let script = RedisError::from((ErrorKind::Client, "a script said no"));
        assert!(is_connection_failure(&timeout));
        assert!(is_connection_failure(&refused));
        assert!(is_connection_failure(&not_found));
        assert!(!is_connection_failure(&script));
    }

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
