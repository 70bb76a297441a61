//! Failover of the stack's optional clusters: SIGKILL a node, measure how
//! long until the cluster serves again, bring the node back and wait until
//! the cluster is whole. The clusters are not part of the default stack but
//! `e2e/local/stack test` starts them; without them (`e2e/local/stack up
//! redis-cluster kafka-cluster`) these tests fail and say how to start them.

use std::time::{Duration, Instant};

use flashsale_e2e::{
    clusters::{KafkaCluster, ORDERS_TOPIC, RedisCluster},
    faults,
    wait::poll_until,
};

/// From SIGKILL to a replica serving the slot: the node timeout (2 s), the
/// vote, and slack for a loaded machine.
const REDIS_FAILOVER: Duration = Duration::from_secs(30);
/// From SIGKILL to a new leader: the broker's session timeout (9 s by
/// default) and slack.
const KAFKA_FAILOVER: Duration = Duration::from_secs(60);
const HEALTHY: Duration = Duration::from_secs(120);

#[tokio::test]
async fn redis_cluster_promotes_a_replica_when_a_primary_is_killed() -> anyhow::Result<()> {
    let cluster = RedisCluster::from_env()?;
    let _exclusive = faults::exclusive().await;
    cluster.until_healthy(HEALTHY).await?;

    let key = "fs:{probe}:x";
    let primary = cluster.primary_for_key(key).await?;
    println!(
        "{key} is served by {primary}; nodes: {:?}",
        cluster.nodes().await
    );
    cluster.kill(primary).await?;
    let killed = Instant::now();
    // A SET is the proof: the slot's new primary accepts writes.
    let measured = poll_until(
        "a replica to take over the killed primary's slot and accept a SET",
        REDIS_FAILOVER,
        Duration::from_millis(50),
        || async {
            let owner = cluster
                .primary_for_key(key)
                .await
                .map_err(|e| e.to_string())?;
            if owner == primary {
                return Err(format!("{primary} still owns the slot"));
            }
            let mut connection = cluster.connect(owner).await.map_err(|e| e.to_string())?;
            redis::cmd("SET")
                .arg(key)
                .arg("after-failover")
                .query_async::<()>(&mut connection)
                .await
                .map_err(|e| format!("SET on {owner}: {e}"))?;
            Ok(owner)
        },
    )
    .await;
    let failover = killed.elapsed();
    // Back whole before any verdict, so a failed measurement leaves the
    // cluster as it found it.
    let restarting = Instant::now();
    cluster.restart(primary).await?;
    cluster.until_healthy(HEALTHY).await?;
    let new_primary = measured?;
    println!(
        "redis-cluster: {new_primary} took over from killed {primary} and accepted a SET after \
         {:.2} s; {primary} back in a healthy cluster {:.2} s after its restart began",
        failover.as_secs_f64(),
        restarting.elapsed().as_secs_f64()
    );
    let back = cluster.nodes().await;
    println!("nodes: {back:?}");
    assert!(
        back.iter().any(|n| n.port == primary && n.pid.is_some()),
        "{primary} is not back: {back:?}"
    );
    Ok(())
}

#[tokio::test]
async fn kafka_cluster_elects_a_new_leader_when_the_leader_is_killed() -> anyhow::Result<()> {
    let cluster = KafkaCluster::from_env()?;
    let _exclusive = faults::exclusive().await;
    cluster.until_healthy(HEALTHY).await?;

    let before = cluster.partition(ORDERS_TOPIC, 0).await?;
    let leader = before
        .leader
        .ok_or_else(|| anyhow::anyhow!("partition 0 has no leader: {before:?}"))?;
    println!("{ORDERS_TOPIC}/0 before: {before:?}");
    cluster.kill(leader).await?;
    let killed = Instant::now();
    let measured = poll_until(
        "a new leader of partition 0 with at least 2 replicas in sync",
        KAFKA_FAILOVER,
        Duration::from_millis(100),
        || async {
            let state = cluster
                .partition(ORDERS_TOPIC, 0)
                .await
                .map_err(|e| e.to_string())?;
            match state.leader {
                Some(l) if l != leader && state.isr.len() >= 2 => Ok(state),
                _ => Err(format!("{state:?}")),
            }
        },
    )
    .await;
    let failover = killed.elapsed();
    let restarting = Instant::now();
    cluster.restart(leader).await?;
    cluster.until_healthy(HEALTHY).await?;
    let after = measured?;
    println!(
        "kafka-cluster: broker {:?} leads {ORDERS_TOPIC}/0 (in sync {:?}) {:.2} s after broker \
         {leader} was killed; {leader} back and every partition fully in sync {:.2} s after its restart began",
        after.leader,
        after.isr,
        failover.as_secs_f64(),
        restarting.elapsed().as_secs_f64()
    );
    assert_eq!(cluster.registered_brokers().await?, vec![1, 2, 3]);
    Ok(())
}
