//! The inventory on the stack's real Redis Cluster (three primaries, one
//! replica each): a sharded SKU spread over every primary never oversells,
//! and a primary SIGKILLed under 200 clients loses no acknowledged
//! reservation under the replicated policy. The cluster is optional in the
//! stack; without it (`e2e/local/stack up redis-cluster`) these tests say why
//! and pass.

mod common;

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use flashsale_e2e::{clusters::RedisCluster, faults, stack};
use inventory::{
    keys::SaleKeys,
    store::{Durability, ReserveOutcome, ReserveRequest, Store},
};
use tokio::sync::Mutex;

const HEALTHY: Duration = Duration::from_secs(120);

fn cluster() -> anyhow::Result<Option<RedisCluster>> {
    if std::env::var("FLASHSALE_REDIS_CLUSTER_URL").map_or(true, |v| v.is_empty()) {
        println!(
            "skipped: FLASHSALE_REDIS_CLUSTER_URL is not set; start the cluster with \
             `e2e/local/stack up redis-cluster` and load `e2e/local/stack env`"
        );
        return Ok(None);
    }
    Ok(Some(RedisCluster::from_env()?))
}

/// The primaries serving `sale`'s `shards` shards of SKU `HOT`.
async fn primaries_of(
    cluster: &RedisCluster,
    sale: &str,
    shards: u32,
) -> anyhow::Result<BTreeSet<u16>> {
    let keys = SaleKeys::new(sale);
    let mut primaries = BTreeSet::new();
    for index in 0..shards {
        primaries.insert(
            cluster
                .primary_for_key(&keys.shard("HOT", shards, index).avail())
                .await?,
        );
    }
    Ok(primaries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_shards_over_all_three_primaries_never_oversell() -> anyhow::Result<()> {
    let Some(cluster) = cluster()? else {
        return Ok(());
    };
    let _exclusive = faults::exclusive().await;
    cluster.until_healthy(HEALTHY).await?;
    // A sale name whose eight shards land on all three primaries, so every
    // cross-slot step (claim, take, settle, stock reads) crosses nodes.
    let mut sale = stack::unique_name("inv-cluster");
    for attempt in 0.. {
        if primaries_of(&cluster, &sale, 8).await?.len() == 3 {
            break;
        }
        anyhow::ensure!(attempt < 100, "no sale name spreads over three primaries");
        sale = stack::unique_name("inv-cluster");
    }
    common::hammer(cluster.urls(), &sale, 8).await
}

/// What one client run through a primary's death saw.
#[derive(Debug, Default)]
struct Run {
    /// Reservation id by request id, for every acknowledged reservation.
    acknowledged: HashMap<String, String>,
    /// When each acknowledgement came, from the run's start.
    acked_at: Vec<Duration>,
    /// Failed calls (each was retried under its request id).
    errors: u64,
}

/// 200 clients reserve one unit each call of a one-shard SKU (its keys all
/// on one primary) under `durability`; that primary is SIGKILLed after 1.5 s
/// and restarted once its replica is promoted; the clients run on until 2 s
/// after the first acknowledgement that follows the kill. Returns the run, the sale, and
/// when the kill happened.
async fn reserve_through_a_failover(
    cluster: &RedisCluster,
    durability: Durability,
) -> anyhow::Result<(Run, String, Store, Duration)> {
    let sale = stack::unique_name("inv-failover");
    let (store, sale) = common::store_on(cluster.urls(), &sale, 1_000_000, 1_000_000, 1, 600_000)
        .await
        .map(|(store, sale)| (store.with_durability(durability), sale))?;
    let primary = cluster
        .primary_for_key(&SaleKeys::new(&sale).sku("HOT"))
        .await?;
    let run = Arc::new(Mutex::new(Run::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients: Vec<_> = (0..200)
        .map(|client| {
            let (store, sale, run, stop) = (store.clone(), sale.clone(), run.clone(), stop.clone());
            tokio::spawn(async move {
                for call in 0.. {
                    let request_id = format!("c{client}-{call}");
                    // Retried under its request id until answered: the
                    // client's own idempotency, as the gateway does.
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            return anyhow::Ok(());
                        }
                        let answer = store
                            .reserve(&ReserveRequest {
                                sale: &sale,
                                sku: "HOT",
                                user: &format!("u{client}"),
                                quantity: 1,
                                request_id: &request_id,
                                amount_minor: 100,
                            })
                            .await;
                        match answer {
                            Ok(ReserveOutcome::Reserved(r) | ReserveOutcome::Existing(r)) => {
                                let mut run = run.lock().await;
                                run.acknowledged.insert(request_id.clone(), r.id);
                                run.acked_at.push(started.elapsed());
                                break;
                            }
                            Ok(other) => anyhow::bail!("unexpected answer {other:?}"),
                            Err(_) => {
                                run.lock().await.errors += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();

    // Let the clients get going, then kill the primary holding the SKU.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    cluster.kill(primary).await?;
    let killed = started.elapsed();
    // Its replica takes over; the killed node comes back as a replica of
    // the new primary, which the replicated policy needs to acknowledge
    // anything again (each primary has one replica).
    let key = SaleKeys::new(&sale).sku("HOT");
    let promoted = flashsale_e2e::wait::poll_until(
        "the replica to be promoted",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            match cluster.primary_for_key(&key).await {
                Ok(owner) if owner != primary => Ok(owner),
                Ok(_) => Err(format!("{primary} still owns the slot")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    cluster.restart(primary).await?;
    // Run until reservations flow again (or give up), then 2 s more.
    let resumed = flashsale_e2e::wait::poll_until(
        "reservations to be acknowledged again after the kill",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            let run = run.clone();
            async move {
                let run = run.lock().await;
                run.acked_at
                    .iter()
                    .any(|t| *t > killed)
                    .then_some(())
                    .ok_or_else(|| "none yet".to_owned())
            }
        },
    )
    .await;
    if resumed.is_ok() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await??;
    }
    // Whole again before any verdict, so later tests find the cluster as it was.
    cluster.until_healthy(HEALTHY).await?;
    promoted?;
    resumed?;
    let run = Arc::try_unwrap(run)
        .map_err(|_| anyhow::anyhow!("clients still hold the run"))?
        .into_inner();
    Ok((run, sale, store, killed))
}

/// The longest stretch without an acknowledgement that spans `killed`.
fn unavailability(acked_at: &[Duration], killed: Duration) -> Duration {
    let mut times = acked_at.to_vec();
    times.sort();
    let before = times.iter().rev().find(|t| **t <= killed).copied();
    let after = times.iter().find(|t| **t > killed).copied();
    match (before, after) {
        (Some(b), Some(a)) => a - b,
        _ => Duration::MAX,
    }
}

/// Acknowledged reservations whose record is gone after the failover, read
/// over a fresh connection (the clients' one may still hold a socket to the
/// killed node, whose calls time out once before it reconnects; the clients
/// rode through that with retries).
async fn lost(cluster: &RedisCluster, sale: &str, run: &Run) -> anyhow::Result<Vec<String>> {
    let store = Store::connect(cluster.urls()).await?;
    let mut lost = Vec::new();
    for id in run.acknowledged.values() {
        if store.reservation(sale, id).await?.is_none() {
            lost.push(id.clone());
        }
    }
    Ok(lost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the cluster client does not yet recover reliably after a primary dies: calls time out for tens of seconds"]
async fn a_killed_primary_loses_no_acknowledged_reservation_when_replicated() -> anyhow::Result<()>
{
    let Some(cluster) = cluster()? else {
        return Ok(());
    };
    let _exclusive = faults::exclusive().await;
    cluster.until_healthy(HEALTHY).await?;
    let policy = Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };
    let (run, sale, store, killed) = reserve_through_a_failover(&cluster, policy).await?;
    let lost = lost(&cluster, &sale, &run)
        .await
        .map_err(|e| e.context("reading the acknowledged reservations back"))?;
    let level = store
        .stock(&sale, "HOT")
        .await?
        .ok_or_else(|| anyhow::anyhow!("HOT not loaded"))?;
    println!(
        "replicated: {} acknowledged, {} lost, {} failed calls retried, unavailable for {:.2} s; \
         stock {level:?}",
        run.acknowledged.len(),
        lost.len(),
        run.errors,
        unavailability(&run.acked_at, killed).as_secs_f64()
    );
    assert!(
        run.acknowledged.len() > 200,
        "too few reservations to judge"
    );
    assert_eq!(lost, Vec::<String>::new(), "acknowledged reservations lost");
    // No unit can be sold twice: every acknowledged unit is still held, and
    // the stock adds up.
    assert!(
        level.reserved + level.sold >= run.acknowledged.len() as u64,
        "{level:?} holds fewer units than were acknowledged ({})",
        run.acknowledged.len()
    );
    assert_eq!(level.stock, 1_000_000, "{level:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the cluster client does not yet recover reliably after a primary dies: calls time out for tens of seconds"]
async fn a_killed_primary_under_the_fast_policy_reports_what_it_lost() -> anyhow::Result<()> {
    let Some(cluster) = cluster()? else {
        return Ok(());
    };
    let _exclusive = faults::exclusive().await;
    cluster.until_healthy(HEALTHY).await?;
    let (run, sale, store, killed) = reserve_through_a_failover(&cluster, Durability::Fast).await?;
    let lost = lost(&cluster, &sale, &run)
        .await
        .map_err(|e| e.context("reading the acknowledged reservations back"))?;
    let level = store
        .stock(&sale, "HOT")
        .await?
        .ok_or_else(|| anyhow::anyhow!("HOT not loaded"))?;
    println!(
        "fast: {} acknowledged, {} lost (asynchronous replication: the last writes before the \
         kill), {} failed calls retried, unavailable for {:.2} s; stock {level:?}",
        run.acknowledged.len(),
        lost.len(),
        run.errors,
        unavailability(&run.acked_at, killed).as_secs_f64()
    );
    assert!(
        run.acknowledged.len() > 200,
        "too few reservations to judge"
    );
    // What was lost went back to stock with its record: the counts still
    // add up, and what survived is held.
    assert_eq!(level.stock, 1_000_000, "{level:?}");
    assert!(
        level.reserved + level.sold >= (run.acknowledged.len() - lost.len()) as u64,
        "{level:?}"
    );
    Ok(())
}
