//! The standby region of the local stack (`e2e/local/stack up region-b`):
//! where region A's Redis of a failover pair and region B's stores listen,
//! and the global endpoint in front of both regions' gateways, which a test
//! points at two gateways and reads the health view of.

use std::time::Duration;

use flashsale_observe::standby::{self, StandbyReadError};

use crate::{
    faults::{self, FaultError},
    same_store,
    stack::{self, MissingComponent},
    wait::{Timeout, poll_until},
};

/// Where the two regions' stores and the global endpoint listen, from the
/// variables `e2e/local/stack env` exports once region B is up.
#[derive(Debug, Clone)]
pub struct Regions {
    /// Region A's Redis of the failover pair (`redis://`).
    pub a_redis: String,
    /// Region B's Redis, a replica of A's (`redis://`).
    pub b_redis: String,
    /// Region A's Kafka: the stack's broker.
    pub a_kafka: String,
    /// Region B's Kafka, fed by MirrorMaker 2.
    pub b_kafka: String,
    /// Region B's PostgreSQL database (`postgres://`).
    pub b_database: String,
    /// The global endpoint's base URL.
    pub endpoint: String,
    /// The global endpoint's stats as CSV.
    pub endpoint_stats: String,
    /// The kubeconfig file of region B's cluster (its own apiserver, no
    /// nodes).
    pub b_kubeconfig: String,
}

/// The component named when region B's variables are missing.
const COMPONENT: &str = "standby region (e2e/local/stack up region-b)";

fn var(name: &'static str) -> Result<String, MissingComponent> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or(MissingComponent {
            var: name,
            component: COMPONENT,
        })
}

impl Regions {
    /// Reads the addresses, or says how to start region B.
    pub fn from_env() -> Result<Self, MissingComponent> {
        Ok(Self {
            a_redis: var("FLASHSALE_REGION_A_REDIS_URL")?,
            b_redis: var("FLASHSALE_REGION_B_REDIS_URL")?,
            a_kafka: stack::kafka_brokers()?,
            b_kafka: var("FLASHSALE_REGION_B_KAFKA_BROKERS")?,
            b_database: var("FLASHSALE_REGION_B_DATABASE_URL")?,
            endpoint: var("FLASHSALE_GLOBAL_ENDPOINT")?,
            endpoint_stats: var("FLASHSALE_GLOBAL_ENDPOINT_STATS")?,
            b_kubeconfig: var("FLASHSALE_REGION_B_KUBECONFIG")?,
        })
    }
}

/// How the global endpoint checks the regions' gateways: every `interval`,
/// a gateway down after `fall` failed checks and up after `rise` passing
/// ones, its health `/readyz` on `health_port` of its host.
#[derive(Debug, Clone, Copy)]
pub struct Checks {
    /// Time between two checks of one gateway.
    pub interval: Duration,
    /// Failed checks before a gateway is taken out.
    pub fall: u32,
    /// Passing checks before it is taken back.
    pub rise: u32,
    /// The port of the gateway's `/readyz`.
    pub health_port: u16,
}

/// Points the global endpoint at `primary` (region A's gateway) and
/// `standby` (region B's, HAProxy's `backup`), both `host:port`, and
/// restarts it: `e2e/local/stack endpoint`.
pub async fn point_endpoint(
    primary: &str,
    standby: &str,
    checks: Checks,
) -> Result<(), FaultError> {
    let interval = format!("{}ms", checks.interval.as_millis());
    let (fall, rise, health) = (
        checks.fall.to_string(),
        checks.rise.to_string(),
        checks.health_port.to_string(),
    );
    faults::run(
        "endpoint",
        &[
            primary,
            standby,
            "--interval",
            &interval,
            "--fall",
            &fall,
            "--rise",
            &rise,
            "--health-port",
            &health,
        ],
    )
    .await
}

/// Polls until the answers through the global endpoint come from
/// `region`'s gateways (each stamps its region on every answer), for at
/// most `within`.
pub async fn until_answered_by(
    endpoint: &str,
    region: &str,
    within: Duration,
) -> Result<(), Timeout> {
    poll_until(
        &format!("the global endpoint's answers to come from region {region}"),
        within,
        Duration::from_millis(100),
        || async {
            match standby::answering_region(endpoint, "/api/v1/items/CASE", Duration::from_secs(2))
                .await
            {
                Ok((_, Some(from))) if from == region => Ok(()),
                Ok((status, from)) => Err(format!("{status} from {from:?}")),
                Err(err) => Err(err.to_string()),
            }
        },
    )
    .await
}

/// Polls until region A's Redis of the pair at `a_redis` has a replica
/// online (B's, following it again after a failover), for at most
/// `within`.
pub async fn until_followed(a_redis: &str, within: Duration) -> Result<(), Timeout> {
    poll_until(
        "region A's Redis to have its replica online",
        within,
        Duration::from_millis(100),
        || async {
            match standby::redis_replicas(a_redis, Duration::from_secs(2)).await {
                Ok(replicas) if replicas.online > 0 => Ok(()),
                Ok(replicas) => Err(format!("{replicas:?}")),
                Err(err) => Err(err.to_string()),
            }
        },
    )
    .await
}

/// Polls until the Redis replica at `replica` follows the primary at
/// `primary` and has applied everything the primary had written when the
/// call began, for at most `within`. A replica whose link just came `up`
/// may still lack the primary's latest writes: after a full sync the
/// primary streams nothing until the replica's first acknowledgement.
pub async fn until_caught_up(primary: &str, replica: &str, within: Duration) -> anyhow::Result<()> {
    let written: u64 = same_store::redis_info(primary, "replication", "master_repl_offset")
        .await?
        .parse()?;
    poll_until(
        "the Redis replica to catch up with its primary",
        within,
        Duration::from_millis(20),
        || async {
            let field = async |name| {
                same_store::redis_info(replica, "replication", name)
                    .await
                    .map_err(|e| e.to_string())
            };
            let (link, applied) = (
                field("master_link_status").await?,
                field("slave_repl_offset").await?,
            );
            match applied.parse::<u64>() {
                Ok(applied) if link == "up" && applied >= written => Ok(()),
                _ => Err(format!("link {link}, applied {applied} of {written}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// One gateway as the global endpoint sees it.
pub use flashsale_observe::standby::HaproxyServer as EndpointServer;

/// The gateways of the endpoint's `sale` backend, from its stats CSV.
pub async fn endpoint_servers(stats_url: &str) -> Result<Vec<EndpointServer>, StandbyReadError> {
    let servers = standby::haproxy_servers(stats_url, Duration::from_secs(5)).await?;
    Ok(servers
        .into_iter()
        .filter(|s| s.backend == "sale")
        .collect())
}
