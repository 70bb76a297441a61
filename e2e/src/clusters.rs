//! The local stack's optional clusters for failover tests, started with
//! `e2e/local/stack up redis-cluster kafka-cluster`: a Redis Cluster of three
//! primaries with a replica each, and three KRaft Kafka nodes. A test kills
//! one node with SIGKILL (by the pid file the stack wrote for it), measures
//! how the cluster takes over, and brings the node back with the stack's
//! `up`, which starts just the nodes that are down.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::Duration,
};

use rdkafka::{
    ClientConfig,
    consumer::{BaseConsumer, Consumer},
    error::KafkaError,
    metadata::Metadata,
};
use redis::{AsyncConnectionConfig, aio::MultiplexedConnection};

use crate::wait::{Timeout, poll_until};

/// The number of hash slots of a Redis Cluster.
pub const REDIS_CLUSTER_SLOTS: usize = 16384;

/// The topic whose partitions [`KafkaCluster::until_healthy`] checks: the
/// stack creates it on the cluster with three replicas.
pub const ORDERS_TOPIC: &str = "flashsale.orders";

/// How often the health probes look again.
const POLL: Duration = Duration::from_millis(100);
/// One answer from a node; a killed node must not stall a probe.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a cluster helper failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A variable of `e2e/local/stack env` is not set: the cluster is not up.
    #[error(
        "{var} is not set, so the local stack's {component} cannot be found. Run the tests \
         through `e2e/local/stack test`, which starts it, or start it with \
         `e2e/local/stack up {component}` and load its variables with \
         `eval \"$(e2e/local/stack env)\"`"
    )]
    Missing {
        /// The environment variable that was looked up.
        var: &'static str,
        /// The stack component it belongs to.
        component: &'static str,
    },
    /// A node address in the environment is not `host:port`.
    #[error("{0:?} is not a node address with a port")]
    BadAddress(String),
    /// The node asked for is not one of the cluster's.
    #[error("{node} is not a node of the {component} (nodes: {known})")]
    UnknownNode {
        /// What was asked for.
        node: String,
        /// The stack component.
        component: &'static str,
        /// The nodes there are.
        known: String,
    },
    /// The stack has no live process for the node.
    #[error("{member} is not running (pid file {path})")]
    NotRunning {
        /// The node's process name in the stack (`redis-cluster-17001`).
        member: String,
        /// Its pid file.
        path: PathBuf,
    },
    /// `kill` could not be run or refused.
    #[error("killing {member} (pid {pid}): {reason}")]
    Kill {
        /// The node's process name in the stack.
        member: String,
        /// Its pid.
        pid: u32,
        /// Why.
        reason: String,
    },
    /// `e2e/local/stack up` could not be run.
    #[error("running `stack up {component}`: {source}")]
    StackSpawn {
        /// The stack component.
        component: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// `e2e/local/stack up` failed.
    #[error("`stack up {component}` failed: {stderr}")]
    StackFailed {
        /// The stack component.
        component: &'static str,
        /// Its error output.
        stderr: String,
    },
    /// A Redis node failed to answer.
    #[error("redis node {port}: {source}")]
    Redis {
        /// The node's port.
        port: u16,
        /// Why.
        source: redis::RedisError,
    },
    /// No node of the Redis Cluster answered.
    #[error("no node of the Redis Cluster answers ({0})")]
    NoNodeAnswers(String),
    /// A node's answer is not what Redis or Kafka documents.
    #[error("unexpected answer to {what}: {detail}")]
    Unexpected {
        /// The command or request.
        what: &'static str,
        /// What came back.
        detail: String,
    },
    /// No primary of the Redis Cluster serves the slot.
    #[error("no primary serves slot {0}")]
    SlotNotServed(u16),
    /// The topic or partition is not in the metadata.
    #[error("partition {partition} of topic {topic} is not in the metadata")]
    NoSuchPartition {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// The Kafka client failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The metadata task failed.
    #[error("metadata task: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The cluster did not become healthy in time.
    #[error(transparent)]
    Timeout(#[from] Timeout),
}

fn var(var: &'static str, component: &'static str) -> Result<String, ClusterError> {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or(ClusterError::Missing { var, component })
}

/// The port of `host:port`, with an optional scheme before it.
fn port_of(address: &str) -> Result<u16, ClusterError> {
    address
        .rsplit_once(':')
        .and_then(|(_, port)| port.trim_end_matches('/').parse().ok())
        .ok_or_else(|| ClusterError::BadAddress(address.to_owned()))
}

/// The nodes of one stack component: their pid files, and the stack script
/// that starts the ones that are down.
#[derive(Debug, Clone)]
struct StackNodes {
    component: &'static str,
    state_dir: PathBuf,
    script: PathBuf,
}

impl StackNodes {
    fn from_env(component: &'static str) -> Result<Self, ClusterError> {
        Ok(Self {
            component,
            state_dir: var("FLASHSALE_STATE_DIR", component)?.into(),
            script: var("FLASHSALE_STACK", component)?.into(),
        })
    }

    /// The node's process name in the stack: `redis-cluster-17001`, `kafka-cluster-2`.
    fn member(&self, node: impl std::fmt::Display) -> String {
        format!("{}-{node}", self.component)
    }

    fn pid_file(&self, member: &str) -> PathBuf {
        self.state_dir.join("run").join(format!("{member}.pid"))
    }

    /// The node's pid if it is alive and still the program the stack started,
    /// as the stack itself decides: a killed node's pid may be reused.
    fn live_pid(&self, member: &str) -> Option<u32> {
        let text = std::fs::read_to_string(self.pid_file(member)).ok()?;
        let mut fields = text.split_whitespace();
        let pid: u32 = fields.next()?.parse().ok()?;
        let exe = fields.next()?;
        let cmdline =
            std::fs::read(Path::new("/proc").join(pid.to_string()).join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(exe)
            .then_some(pid)
    }

    /// SIGKILL, then wait until the process is gone, so a restart right after
    /// does not take it for alive.
    async fn kill(&self, member: &str) -> Result<(), ClusterError> {
        let pid = self.signal(member, "KILL").await?;
        poll_until(
            &format!("{member} (pid {pid}) to be gone after SIGKILL"),
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async {
                match self.live_pid(member) {
                    Some(pid) => Err(format!("pid {pid} still runs")),
                    None => Ok(()),
                }
            },
        )
        .await?;
        Ok(())
    }

    /// Sends `signal` (a `kill -<signal>` name) to the member's live
    /// process; returns its pid.
    async fn signal(&self, member: &str, signal: &str) -> Result<u32, ClusterError> {
        let pid = self
            .live_pid(member)
            .ok_or_else(|| ClusterError::NotRunning {
                member: member.to_owned(),
                path: self.pid_file(member),
            })?;
        let kill_error = |reason: String| ClusterError::Kill {
            member: member.to_owned(),
            pid,
            reason,
        };
        let output = tokio::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .output()
            .await
            .map_err(|e| kill_error(e.to_string()))?;
        if !output.status.success() {
            return Err(kill_error(
                String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            ));
        }
        Ok(pid)
    }

    /// `e2e/local/stack up <component>`: starts the nodes that are down and
    /// returns once the stack calls the cluster ready.
    async fn up(&self) -> Result<(), ClusterError> {
        let component = self.component;
        let output = tokio::process::Command::new(&self.script)
            .args(["up", component])
            .env("FLASHSALE_STATE_DIR", &self.state_dir)
            .output()
            .await
            .map_err(|source| ClusterError::StackSpawn { component, source })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(ClusterError::StackFailed {
                component,
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            })
        }
    }
}

/// Each address of a comma-separated list, trimmed, with its port.
fn addresses(list: &str) -> Result<Vec<(String, u16)>, ClusterError> {
    list.split(',')
        .map(|address| Ok((address.trim().to_owned(), port_of(address.trim())?)))
        .collect()
}

/// A cluster's nodes as `e2e/local/stack env` exports them: one variable
/// listing every node's address (comma-separated, each ending in its port),
/// and the stack's handle on their processes.
#[derive(Debug, Clone)]
struct ClusterNodes {
    /// The variable's value, as the seeds for a client.
    list: String,
    /// Each node's address (trimmed) and port, in the order of `list`.
    addresses: Vec<(String, u16)>,
    stack: StackNodes,
}

impl ClusterNodes {
    /// Reads `list_var`, then the stack's state folder and script.
    fn from_env(list_var: &'static str, component: &'static str) -> Result<Self, ClusterError> {
        let list = var(list_var, component)?;
        let addresses = addresses(&list)?;
        Ok(Self {
            list,
            addresses,
            stack: StackNodes::from_env(component)?,
        })
    }

    fn ports(&self) -> Vec<u16> {
        self.addresses.iter().map(|(_, port)| *port).collect()
    }

    fn unknown(&self, node: impl ToString) -> ClusterError {
        ClusterError::UnknownNode {
            node: node.to_string(),
            component: self.stack.component,
            known: self.list.clone(),
        }
    }
}

// --- Redis Cluster -------------------------------------------------------------

/// A node's part in the Redis Cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisRole {
    /// Serves slots (or could: a primary may hold none).
    Primary,
    /// Replicates a primary.
    Replica,
}

/// One reachable node of the Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisNode {
    /// Its client port.
    pub port: u16,
    /// Primary or replica, as the node itself says (`ROLE`).
    pub role: RedisRole,
    /// How many hash slots it serves.
    pub slots: usize,
    /// Its process, from the stack's pid file; `None` if not alive.
    pub pid: Option<u32>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The id of the primary a replica follows.
    primary_id: Option<String>,
    connected: bool,
    /// Inclusive slot ranges.
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn is_primary(&self) -> bool {
        self.has_flag("master")
    }

    fn is_failing(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }

    fn slot_count(&self) -> usize {
        self.slots
            .iter()
            .map(|(a, b)| usize::from(b.saturating_sub(*a)) + 1)
            .sum()
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@cport> <flags> <primary> <ping>
/// <pong> <epoch> <link> <slot>...`, where a slot is `n` or `a-b`, and
/// `[...]` entries are slots being migrated (not served yet).
fn parse_cluster_nodes(text: &str) -> Result<Vec<NodeLine>, ClusterError> {
    let unexpected = |line: &str| ClusterError::Unexpected {
        what: "CLUSTER NODES",
        detail: line.to_owned(),
    };
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(unexpected(line));
        }
        let address = fields[1].split(['@', ',']).next().unwrap_or_default();
        let port = port_of(address).map_err(|_| unexpected(line))?;
        let mut slots = Vec::new();
        for slot in fields[8..].iter().filter(|s| !s.starts_with('[')) {
            let range = match slot.split_once('-') {
                Some((a, b)) => (a.parse(), b.parse()),
                None => (slot.parse(), slot.parse()),
            };
            match range {
                (Ok(a), Ok(b)) => slots.push((a, b)),
                _ => return Err(unexpected(line)),
            }
        }
        nodes.push(NodeLine {
            id: fields[0].to_owned(),
            port,
            flags: fields[2].split(',').map(str::to_owned).collect(),
            primary_id: (fields[3] != "-").then(|| fields[3].to_owned()),
            connected: fields[7] == "connected",
            slots,
        });
    }
    Ok(nodes)
}

/// One field of `CLUSTER INFO` or `INFO`.
fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim_end().strip_prefix(field)?.strip_prefix(':'))
}

/// How many replicas stream from a primary, by its `INFO replication`.
fn online_replicas(info: &str) -> usize {
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count()
}

/// The stack's Redis Cluster (`e2e/local/stack up redis-cluster`).
#[derive(Debug, Clone)]
pub struct RedisCluster {
    nodes: ClusterNodes,
}

impl RedisCluster {
    /// The cluster from `FLASHSALE_REDIS_CLUSTER_URL` (its nodes' URLs,
    /// comma-separated) and the stack's state folder and script, all from
    /// `e2e/local/stack env`.
    pub fn from_env() -> Result<Self, ClusterError> {
        Ok(Self {
            nodes: ClusterNodes::from_env("FLASHSALE_REDIS_CLUSTER_URL", "redis-cluster")?,
        })
    }

    /// Every node's URL, comma-separated: the seeds for a cluster client.
    pub fn urls(&self) -> &str {
        &self.nodes.list
    }

    /// The nodes' client ports, in the order of [`RedisCluster::urls`].
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.ports()
    }

    fn url_of(&self, port: u16) -> Result<&str, ClusterError> {
        self.nodes
            .addresses
            .iter()
            .find(|(_, p)| *p == port)
            .map(|(url, _)| url.as_str())
            .ok_or_else(|| self.nodes.unknown(port))
    }

    /// A plain (not cluster-aware) connection to one node, with short
    /// timeouts so a dead node fails fast.
    pub async fn connect(&self, port: u16) -> Result<MultiplexedConnection, ClusterError> {
        let redis_error = |source| ClusterError::Redis { port, source };
        let client = redis::Client::open(self.url_of(port)?).map_err(redis_error)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(NODE_TIMEOUT))
            .set_response_timeout(Some(NODE_TIMEOUT));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(redis_error)
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> Result<T, ClusterError> {
        let mut connection = self.connect(port).await?;
        cmd.query_async(&mut connection)
            .await
            .map_err(|source| ClusterError::Redis { port, source })
    }

    /// `CLUSTER NODES` as the first node that answers sees it.
    async fn cluster_view(&self) -> Result<Vec<NodeLine>, ClusterError> {
        let mut errors = Vec::new();
        for port in self.ports() {
            match self
                .query::<String>(port, redis::cmd("CLUSTER").arg("NODES"))
                .await
            {
                Ok(text) => return parse_cluster_nodes(&text),
                Err(e) => errors.push(e.to_string()),
            }
        }
        Err(ClusterError::NoNodeAnswers(errors.join("; ")))
    }

    /// The nodes that answer, each by its own account (`ROLE`, and its
    /// line in its `CLUSTER NODES`), with the pid the stack recorded.
    pub async fn nodes(&self) -> Vec<RedisNode> {
        let mut nodes = Vec::new();
        for port in self.ports() {
            if let Ok(node) = self.node(port).await {
                nodes.push(node);
            }
        }
        nodes
    }

    async fn node(&self, port: u16) -> Result<RedisNode, ClusterError> {
        let role: Vec<redis::Value> = self.query(port, &redis::cmd("ROLE")).await?;
        let role = match role.first().map(redis::from_redis_value_ref::<String>) {
            Some(Ok(r)) if r == "master" => RedisRole::Primary,
            Some(Ok(r)) if r == "slave" => RedisRole::Replica,
            other => {
                return Err(ClusterError::Unexpected {
                    what: "ROLE",
                    detail: format!("{other:?}"),
                });
            }
        };
        let view = parse_cluster_nodes(
            &self
                .query::<String>(port, redis::cmd("CLUSTER").arg("NODES"))
                .await?,
        )?;
        let slots = view
            .iter()
            .find(|n| n.has_flag("myself"))
            .map(NodeLine::slot_count)
            .unwrap_or_default();
        Ok(RedisNode {
            port,
            role,
            slots,
            pid: self.nodes.stack.live_pid(&self.nodes.stack.member(port)),
        })
    }

    /// The port of the primary that serves `key`'s slot, as the first node
    /// that answers sees the cluster (`CLUSTER KEYSLOT`, then the slot
    /// ranges of `CLUSTER NODES`).
    pub async fn primary_for_key(&self, key: &str) -> Result<u16, ClusterError> {
        let mut errors = Vec::new();
        let mut slot = None;
        for port in self.ports() {
            match self
                .query::<u16>(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
                .await
            {
                Ok(s) => {
                    slot = Some(s);
                    break;
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        let slot = slot.ok_or_else(|| ClusterError::NoNodeAnswers(errors.join("; ")))?;
        self.cluster_view()
            .await?
            .iter()
            .find(|n| n.is_primary() && n.serves(slot))
            .map(|n| n.port)
            .ok_or(ClusterError::SlotNotServed(slot))
    }

    /// SIGKILLs the node on `port`, by the pid the stack recorded, and
    /// returns once the process is gone.
    pub async fn kill(&self, port: u16) -> Result<(), ClusterError> {
        self.url_of(port)?;
        let stack = &self.nodes.stack;
        stack.kill(&stack.member(port)).await
    }

    /// Freezes the node on `port` (SIGSTOP): it holds its connections but
    /// answers and replicates nothing until [`Paused::resume`] or the guard
    /// is dropped (SIGCONT). Keep it shorter than the cluster's node timeout
    /// unless a failover is wanted.
    pub async fn pause(&self, port: u16) -> Result<Paused, ClusterError> {
        self.url_of(port)?;
        let stack = &self.nodes.stack;
        let pid = stack.signal(&stack.member(port), "STOP").await?;
        Ok(Paused { pid: Some(pid) })
    }

    /// The client ports of the replicas that follow the primary on `port`,
    /// as the cluster sees it.
    pub async fn replicas_of(&self, primary: u16) -> Result<Vec<u16>, ClusterError> {
        let view = self.cluster_view().await?;
        let Some(id) = view
            .iter()
            .find(|n| n.port == primary)
            .map(|n| n.id.clone())
        else {
            return Ok(Vec::new());
        };
        Ok(view
            .iter()
            .filter(|n| n.primary_id.as_deref() == Some(id.as_str()))
            .map(|n| n.port)
            .collect())
    }

    /// Starts the node on `port` again (with `e2e/local/stack up
    /// redis-cluster`, which starts only the nodes that are down) and returns
    /// once the stack calls the cluster ready. The node rejoins from its
    /// nodes.conf, as a replica if its replica took over meanwhile.
    pub async fn restart(&self, port: u16) -> Result<(), ClusterError> {
        self.url_of(port)?;
        self.nodes.stack.up().await
    }

    /// Waits until every node that answers sees the cluster as ok, primaries
    /// that answer serve all 16384 slots, and each of them has a replica
    /// streaming from it.
    pub async fn until_healthy(&self, deadline: Duration) -> Result<(), ClusterError> {
        poll_until(
            "the Redis Cluster to be healthy",
            deadline,
            POLL,
            || async { self.health().await },
        )
        .await?;
        Ok(())
    }

    /// `Err` says what is not healthy yet.
    async fn health(&self) -> Result<(), String> {
        let mut reachable = HashSet::new();
        for port in self.ports() {
            let Ok(info) = self
                .query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
                .await
            else {
                continue;
            };
            match info_field(&info, "cluster_state") {
                Some("ok") => {
                    reachable.insert(port);
                }
                state => return Err(format!("node {port}: cluster_state {state:?}")),
            }
        }
        let view = self.cluster_view().await.map_err(|e| e.to_string())?;
        let serving: Vec<&NodeLine> = view
            .iter()
            .filter(|n| n.is_primary() && !n.slots.is_empty())
            .collect();
        let mut slots = 0;
        for primary in &serving {
            if !reachable.contains(&primary.port) || primary.is_failing() {
                return Err(format!(
                    "primary {} serves slots but does not answer",
                    primary.port
                ));
            }
            slots += primary.slot_count();
        }
        if slots != REDIS_CLUSTER_SLOTS {
            return Err(format!(
                "reachable primaries serve {slots} of {REDIS_CLUSTER_SLOTS} slots"
            ));
        }
        for primary in &serving {
            let info = self
                .query::<String>(primary.port, redis::cmd("INFO").arg("replication"))
                .await
                .map_err(|e| e.to_string())?;
            let known = view.iter().any(|n| {
                n.primary_id.as_deref() == Some(primary.id.as_str())
                    && n.connected
                    && !n.is_failing()
            });
            if online_replicas(&info) == 0 || !known {
                return Err(format!("primary {} has no replica online", primary.port));
            }
        }
        Ok(())
    }
}

/// A node frozen by [`RedisCluster::pause`]; resumed when dropped, so a
/// failing test cannot leave it frozen.
#[derive(Debug)]
pub struct Paused {
    pid: Option<u32>,
}

impl Paused {
    /// The guard of process `pid`, already stopped.
    pub(crate) fn of(pid: u32) -> Self {
        Self { pid: Some(pid) }
    }

    /// Lets the node run again (SIGCONT).
    pub fn resume(mut self) -> std::io::Result<()> {
        self.cont()
    }

    fn cont(&mut self) -> std::io::Result<()> {
        match self.pid.take() {
            Some(pid) => std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status()
                .map(drop),
            None => Ok(()),
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if let Err(error) = self.cont() {
            eprintln!("could not resume a paused Redis node: {error}");
        }
    }
}

// --- Kafka cluster -------------------------------------------------------------

/// One partition as the cluster's metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// The leader's broker id; `None` while there is none.
    pub leader: Option<i32>,
    /// The brokers holding a replica.
    pub replicas: Vec<i32>,
    /// The replicas in sync with the leader.
    pub isr: Vec<i32>,
}

/// The stack's three KRaft Kafka nodes (`e2e/local/stack up kafka-cluster`),
/// each a broker and a controller. Broker ids are 1 to 3, in the order of
/// [`KafkaCluster::brokers`]; methods that take a broker accept its id or
/// its port.
#[derive(Debug, Clone)]
pub struct KafkaCluster {
    nodes: ClusterNodes,
}

impl KafkaCluster {
    /// The cluster from `FLASHSALE_KAFKA_CLUSTER_BROKERS` and the stack's
    /// state folder and script, all from `e2e/local/stack env`.
    pub fn from_env() -> Result<Self, ClusterError> {
        Ok(Self {
            nodes: ClusterNodes::from_env("FLASHSALE_KAFKA_CLUSTER_BROKERS", "kafka-cluster")?,
        })
    }

    /// Bootstrap servers: every broker, comma-separated.
    pub fn brokers(&self) -> &str {
        &self.nodes.list
    }

    /// The broker id of `broker`, given as an id (1 to 3) or a client port.
    pub fn broker_id(&self, broker: i32) -> Result<i32, ClusterError> {
        let by_id = usize::try_from(broker)
            .ok()
            .filter(|id| (1..=self.nodes.addresses.len()).contains(id));
        let by_port = || {
            self.nodes
                .addresses
                .iter()
                .position(|(_, p)| i32::from(*p) == broker)
                .map(|i| i + 1)
        };
        by_id
            .or_else(by_port)
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| self.nodes.unknown(broker))
    }

    /// SIGKILLs a broker (by id or port), by the pid the stack recorded,
    /// and returns once the process is gone.
    pub async fn kill(&self, broker: i32) -> Result<(), ClusterError> {
        let id = self.broker_id(broker)?;
        let stack = &self.nodes.stack;
        stack.kill(&stack.member(id)).await
    }

    /// Starts a broker (by id or port) again with `e2e/local/stack up
    /// kafka-cluster`, which starts only the nodes that are down, and returns
    /// once all three brokers are registered.
    pub async fn restart(&self, broker: i32) -> Result<(), ClusterError> {
        self.broker_id(broker)?;
        self.nodes.stack.up().await
    }

    /// Fresh metadata (of one topic, or of the brokers only), from any
    /// broker that answers.
    async fn metadata(&self, topic: Option<&str>) -> Result<Metadata, ClusterError> {
        let brokers = self.nodes.list.clone();
        let topic = topic.map(str::to_owned);
        tokio::task::spawn_blocking(move || -> Result<Metadata, ClusterError> {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .create()?;
            Ok(consumer.fetch_metadata(topic.as_deref(), Duration::from_secs(5))?)
        })
        .await?
    }

    /// The ids of the brokers registered (and not fenced) in the cluster.
    pub async fn registered_brokers(&self) -> Result<Vec<i32>, ClusterError> {
        let metadata = self.metadata(None).await?;
        let mut ids: Vec<i32> = metadata.brokers().iter().map(|b| b.id()).collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Leader, replicas and in-sync replicas of one partition.
    pub async fn partition(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<PartitionState, ClusterError> {
        let metadata = self.metadata(Some(topic)).await?;
        metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions())
            .find(|p| p.id() == partition)
            .map(|p| PartitionState {
                leader: (p.leader() >= 0).then_some(p.leader()),
                replicas: p.replicas().to_vec(),
                isr: p.isr().to_vec(),
            })
            .ok_or_else(|| ClusterError::NoSuchPartition {
                topic: topic.to_owned(),
                partition,
            })
    }

    /// The broker id that leads a partition; `None` while none does.
    pub async fn leader_of(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Option<i32>, ClusterError> {
        Ok(self.partition(topic, partition).await?.leader)
    }

    /// Waits until all brokers are registered and every partition of
    /// [`ORDERS_TOPIC`] has a leader and all of them in sync.
    pub async fn until_healthy(&self, deadline: Duration) -> Result<(), ClusterError> {
        poll_until(
            "the Kafka cluster to be healthy",
            deadline,
            POLL,
            || async { self.health().await },
        )
        .await?;
        Ok(())
    }

    /// `Err` says what is not healthy yet.
    async fn health(&self) -> Result<(), String> {
        let metadata = self
            .metadata(Some(ORDERS_TOPIC))
            .await
            .map_err(|e| e.to_string())?;
        let registered = metadata.brokers().len();
        let brokers = self.nodes.addresses.len();
        if registered != brokers {
            return Err(format!("{registered} of {brokers} brokers registered"));
        }
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == ORDERS_TOPIC && t.error().is_none())
            .ok_or_else(|| format!("topic {ORDERS_TOPIC} is not in the metadata"))?;
        if topic.partitions().is_empty() {
            return Err(format!("topic {ORDERS_TOPIC} has no partitions"));
        }
        for p in topic.partitions() {
            if p.leader() < 0 || p.isr().len() < brokers {
                return Err(format!(
                    "partition {}: leader {}, in sync {:?} of {:?}",
                    p.id(),
                    p.leader(),
                    p.isr(),
                    p.replicas()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
4c39 127.0.0.1:17006@27006 slave 47c1 0 1796160251250 2 connected
c144 127.0.0.1:17001@27001 myself,master - 0 1796160251000 1 connected 0-5460
47c1 127.0.0.1:17002@27002 master - 0 1796160251257 2 connected 5461-10921 10922 [10923->-7d58]
7d58 127.0.0.1:17003@27003,host master,fail - 0 1796160252054 3 disconnected 10923-16383
";

    #[test]
    fn parses_cluster_nodes() -> Result<(), ClusterError> {
        let nodes = parse_cluster_nodes(NODES)?;
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].port, 17006);
        assert_eq!(nodes[0].primary_id.as_deref(), Some("47c1"));
        assert!(!nodes[0].is_primary());
        assert!(nodes[1].has_flag("myself") && nodes[1].is_primary());
        assert_eq!(nodes[1].slot_count(), 5461);
        assert_eq!(nodes[2].slots, vec![(5461, 10921), (10922, 10922)]);
        assert!(nodes[2].serves(10922) && !nodes[2].serves(10923));
        assert_eq!(nodes[3].port, 17003);
        assert!(nodes[3].is_failing() && !nodes[3].connected);
        let total: usize = nodes.iter().map(NodeLine::slot_count).sum();
        assert_eq!(total, REDIS_CLUSTER_SLOTS);
        Ok(())
    }

    #[test]
    fn rejects_a_short_line() {
        assert!(parse_cluster_nodes("abc 127.0.0.1:1@2 master").is_err());
    }

    #[test]
    fn reads_info_fields_and_online_replicas() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=127.0.0.1,port=17005,state=online,offset=1,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=17006,state=wait_bgsave,offset=0,lag=0\r\n";
        assert_eq!(info_field(info, "role"), Some("master"));
        assert_eq!(info_field(info, "connected_slaves"), Some("2"));
        assert_eq!(info_field(info, "cluster_state"), None);
        assert_eq!(online_replicas(info), 1);
    }

    #[test]
    fn brokers_by_id_or_port() {
        let cluster = KafkaCluster {
            nodes: ClusterNodes {
                list: "127.0.0.1:19192,127.0.0.1:19292,127.0.0.1:19392".to_owned(),
                addresses: [19192, 19292, 19392]
                    .map(|port| (format!("127.0.0.1:{port}"), port))
                    .to_vec(),
                stack: StackNodes {
                    component: "kafka-cluster",
                    state_dir: PathBuf::new(),
                    script: PathBuf::new(),
                },
            },
        };
        assert_eq!(cluster.broker_id(2).ok(), Some(2));
        assert_eq!(cluster.broker_id(19392).ok(), Some(3));
        assert!(cluster.broker_id(0).is_err());
        assert!(cluster.broker_id(4).is_err());
        assert!(cluster.broker_id(19092).is_err());
    }

    #[test]
    fn missing_variable_says_how_to_start_the_cluster() {
        let err = var("FLASHSALE_SURELY_UNSET_VARIABLE", "redis-cluster").err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("FLASHSALE_SURELY_UNSET_VARIABLE is not set"),
            "{text}"
        );
        assert!(
            text.contains("`e2e/local/stack up redis-cluster`"),
            "{text}"
        );
        assert!(text.contains("`e2e/local/stack test`"), "{text}");
    }

    #[test]
    fn ports_of_addresses() {
        assert_eq!(port_of("redis://127.0.0.1:17001").ok(), Some(17001));
        assert_eq!(port_of("127.0.0.1:19192").ok(), Some(19192));
        assert!(port_of("127.0.0.1").is_err());
    }

    #[test]
    fn address_lists() {
        let listed = addresses("redis://127.0.0.1:17001, redis://127.0.0.1:17002").ok();
        assert_eq!(
            listed,
            Some(vec![
                ("redis://127.0.0.1:17001".to_owned(), 17001),
                ("redis://127.0.0.1:17002".to_owned(), 17002),
            ])
        );
        assert!(addresses("127.0.0.1:19192,127.0.0.1").is_err());
    }
}
