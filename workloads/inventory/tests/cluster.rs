//! The inventory on the stack's real Redis Cluster (three primaries, one
//! replica each): a sharded SKU spread over every primary never oversells,
//! and a primary SIGKILLed under 200 clients loses no acknowledged
//! reservation under the replicated policy. The cluster is optional in the
//! stack but `e2e/local/stack test` starts it; without it (`e2e/local/stack
//! up redis-cluster`) these tests fail and say how to start it.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use flashsale_e2e::{clusters::RedisCluster, faults, stack};
use inventory::{
    keys::SaleKeys,
    store::{Durability, ReserveOutcome, ReserveRequest, StockLevel, Store, StoreError},
};
use tokio::sync::{Mutex, MutexGuard};

const HEALTHY: Duration = Duration::from_secs(120);
/// How long the safe policy waits for its replica here.
const REPLICATED_TIMEOUT: Duration = Duration::from_millis(100);
/// The safe policy as the tests use it: one replica, 100 ms.
const REPLICATED: Durability = Durability::Replicated {
    replicas: 1,
    timeout: REPLICATED_TIMEOUT,
};

/// The cluster, whole, with this process's fault tests kept out while the
/// guard lives; without the cluster, an error naming the command that starts it.
async fn cluster() -> anyhow::Result<(RedisCluster, MutexGuard<'static, ()>)> {
    // The cluster client's own recovery steps, shown for a failing test
    // (RUST_LOG=redis=warn,flashsale_runtime=warn).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cluster = RedisCluster::from_env()?;
    let exclusive = faults::exclusive().await;
    cluster.until_healthy(HEALTHY).await?;
    Ok((cluster, exclusive))
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
async fn auto_durability_on_the_cluster_waits_for_a_replica() -> anyhow::Result<()> {
    let (cluster, _exclusive) = cluster().await?;
    // Every primary of the stack's cluster has one replica: `auto` is the
    // replicated policy, and a reservation is acknowledged through it.
    let store = Store::connect(cluster.urls()).await?;
    assert_eq!(store.fewest_replicas().await?, 1);
    let auto = Durability::auto(store.fewest_replicas().await?, 1, REPLICATED_TIMEOUT);
    assert_eq!(auto, REPLICATED);
    // Two replicas per primary are not there: `auto` does not ask for them.
    assert_eq!(
        Durability::auto(store.fewest_replicas().await?, 2, REPLICATED_TIMEOUT),
        Durability::Fast
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_shards_over_all_three_primaries_never_oversell() -> anyhow::Result<()> {
    let (cluster, _exclusive) = cluster().await?;
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
    /// Failed calls by error (each was retried under its request id).
    failed: BTreeMap<String, u64>,
}

/// A run through a failover and its timeline, from the run's start.
struct Failover {
    run: Run,
    sale: String,
    store: Store,
    killed: Duration,
    /// When the replica was seen owning the slot.
    promoted: Duration,
    /// When the killed node was back as a replica and the cluster whole.
    healed: Duration,
}

/// 200 clients reserve one unit each call of a one-shard SKU (its keys all
/// on one primary) under `durability`; that primary is SIGKILLed after 1.5 s
/// and restarted once its replica is promoted; the clients run on until 2 s
/// after the first acknowledgement that follows the kill.
async fn reserve_through_a_failover(
    cluster: &RedisCluster,
    durability: Durability,
) -> anyhow::Result<Failover> {
    let sale = stack::unique_name("inv-failover");
    let (store, sale) = common::store_on(cluster.urls(), &sale, 1_000_000, 1_000_000, 1, 600_000)
        .await
        .map(|(store, sale)| (store.with_durability(durability), sale))?;
    let key = SaleKeys::new(&sale).sku("HOT");
    let primary = cluster.primary_for_key(&key).await?;
    let run = Arc::new(Mutex::new(Run::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients: Vec<_> = (0..200)
        .map(|client| {
            tokio::spawn(keep_reserving(
                client,
                store.clone(),
                sale.clone(),
                run.clone(),
                stop.clone(),
                started,
            ))
        })
        .collect();

    // Let the clients get going, then kill the primary holding the SKU.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (killed, promoted, healed) = fail_over(cluster, primary, &key, started).await?;
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
    let (promoted, healed) = (promoted?, healed?);
    resumed?;
    let run = Arc::try_unwrap(run)
        .map_err(|_| anyhow::anyhow!("clients still hold the run"))?
        .into_inner();
    Ok(Failover {
        run,
        sale,
        store,
        killed,
        promoted,
        healed,
    })
}

/// One client of the failover run: reserves one unit per call as user
/// `u<client>` until `stop`, each call retried under its request id until
/// answered; every acknowledgement and failure goes into `run`.
async fn keep_reserving(
    client: usize,
    store: Store,
    sale: String,
    run: Arc<Mutex<Run>>,
    stop: Arc<AtomicBool>,
    started: Instant,
) -> anyhow::Result<()> {
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
                Err(e) => {
                    *run.lock().await.failed.entry(e.to_string()).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
    anyhow::Ok(())
}

/// SIGKILLs `primary`, waits for its replica to own `key`'s slot, restarts
/// it and waits for the cluster to be whole. Returns when the kill came and
/// when (or whether) the promotion and the healing were seen, from `started`.
async fn fail_over(
    cluster: &RedisCluster,
    primary: u16,
    key: &str,
    started: Instant,
) -> anyhow::Result<(Duration, anyhow::Result<Duration>, anyhow::Result<Duration>)> {
    cluster.kill(primary).await?;
    let killed = started.elapsed();
    // Its replica takes over; the killed node comes back as a replica of
    // the new primary, which the replicated policy needs to acknowledge
    // anything again (each primary has one replica).
    let promoted = flashsale_e2e::wait::poll_until(
        "the replica to be promoted",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            match cluster.primary_for_key(key).await {
                Ok(owner) if owner != primary => Ok(started.elapsed()),
                Ok(_) => Err(format!("{primary} still owns the slot")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    cluster.restart(primary).await?;
    let healed = cluster
        .until_healthy(HEALTHY)
        .await
        .map(|()| started.elapsed());
    Ok((
        killed,
        promoted.map_err(Into::into),
        healed.map_err(Into::into),
    ))
}

/// The longest stretch without an acknowledgement from the last one before
/// `killed` to the end of the run: how long clients could not reserve.
fn unavailability(acked_at: &[Duration], killed: Duration) -> Duration {
    let mut times = acked_at.to_vec();
    times.sort();
    let from = times.iter().rposition(|t| *t <= killed).unwrap_or(0);
    times[from..]
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .max()
        .unwrap_or(Duration::MAX)
}

/// What a failover cost: acknowledged reservations whose record is gone
/// (read over a fresh connection) and the SKU's stock afterwards, printed
/// with the timeline.
async fn report(
    cluster: &RedisCluster,
    policy: &str,
    failover: &Failover,
) -> anyhow::Result<(Vec<String>, StockLevel)> {
    let Failover {
        run, sale, store, ..
    } = failover;
    let fresh = Store::connect(cluster.urls()).await?;
    let mut lost = Vec::new();
    for id in run.acknowledged.values() {
        if fresh.reservation(sale, id).await?.is_none() {
            lost.push(id.clone());
        }
    }
    let level = store
        .stock(sale, "HOT")
        .await
        .map_err(|e| anyhow::anyhow!("reading the stock after the failover: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("HOT not loaded"))?;
    let since_kill = |t: Duration| t.saturating_sub(failover.killed).as_secs_f64();
    println!(
        "{policy}: {} acknowledged, {} lost; no acknowledgement for {:.2} s; replica promoted \
         {:.2} s and the cluster whole {:.2} s after the kill; failed calls retried: {:?}; \
         stock {level:?}",
        run.acknowledged.len(),
        lost.len(),
        unavailability(&run.acked_at, failover.killed).as_secs_f64(),
        since_kill(failover.promoted),
        since_kill(failover.healed),
        run.failed,
    );
    assert!(
        run.acknowledged.len() > 200,
        "too few reservations to judge"
    );
    // The counts add up, and what survived is held.
    assert_eq!(level.stock, 1_000_000, "{level:?}");
    assert!(
        level.reserved + level.sold >= (run.acknowledged.len() - lost.len()) as u64,
        "{level:?} holds fewer units than survived"
    );
    Ok((lost, level))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_loses_no_acknowledged_reservation_when_replicated() -> anyhow::Result<()>
{
    let (cluster, _exclusive) = cluster().await?;
    let failover = reserve_through_a_failover(&cluster, REPLICATED).await?;
    let (lost, level) = report(&cluster, "replicated", &failover).await?;
    assert_eq!(lost, Vec::<String>::new(), "acknowledged reservations lost");
    // No unit can be sold twice: every acknowledged unit is still held.
    assert!(
        level.reserved + level.sold >= failover.run.acknowledged.len() as u64,
        "{level:?} holds fewer units than were acknowledged"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_under_the_fast_policy_reports_what_it_lost() -> anyhow::Result<()> {
    let (cluster, _exclusive) = cluster().await?;
    let failover = reserve_through_a_failover(&cluster, Durability::Fast).await?;
    // Asynchronous replication may drop the last writes before the kill;
    // what was lost went back to stock with its record (report checks the
    // counts), which is what the fast policy documents.
    report(&cluster, "fast", &failover).await?;
    Ok(())
}

/// Under the replicated policy a retry that reaches another connection
/// (another inventory replica) finds the reservation the first one made; its
/// `WAIT` must still cover that write, which its own connection never made
/// (`admit.lua` rewrites the request key on a duplicate for this). With the
/// SKU's replica frozen, neither connection may acknowledge; once it runs
/// again, the retry is acknowledged with the same reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_connection_waits_for_the_original_write() -> anyhow::Result<()> {
    let (cluster, _exclusive) = cluster().await?;

    let sale = stack::unique_name("inv-retry-elsewhere");
    let (first, sale) = common::store_on(cluster.urls(), &sale, 10, 10, 1, 600_000)
        .await
        .map(|(store, sale)| (store.with_durability(REPLICATED), sale))?;
    // Another replica: its own connection, the same sale (loading again
    // changes nothing).
    let (second, _) = common::store_on(cluster.urls(), &sale, 10, 10, 1, 600_000).await?;
    let second = second.with_durability(REPLICATED);
    let primary = cluster
        .primary_for_key(&SaleKeys::new(&sale).sku("HOT"))
        .await?;
    let replica = *cluster
        .replicas_of(primary)
        .await?
        .first()
        .ok_or_else(|| anyhow::anyhow!("primary {primary} has no replica"))?;
    let request = ReserveRequest {
        sale: &sale,
        sku: "HOT",
        user: "ulla",
        quantity: 1,
        request_id: "u1",
        amount_minor: 100,
    };

    // The second connection's own writes so far (its load, one reservation
    // of its own) are confirmed: all it could wait for is replicated.
    let own = second
        .reserve(&ReserveRequest {
            user: "vera",
            request_id: "v1",
            ..request.clone()
        })
        .await?;
    assert!(matches!(own, ReserveOutcome::Reserved(_)), "{own:?}");

    let frozen = cluster.pause(replica).await?;
    let made = first.reserve(&request).await;
    let retried = second.reserve(&request).await;
    frozen.resume()?;
    assert!(
        matches!(made, Err(StoreError::NotDurable { .. })),
        "the first write reached no replica: {made:?}"
    );
    assert!(
        matches!(retried, Err(StoreError::NotDurable { .. })),
        "a retry on another connection acknowledged a write no replica had: {retried:?}"
    );
    let answer = flashsale_e2e::wait::poll_until(
        "the retry to be acknowledged once the replica runs",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            match second.reserve(&request).await {
                Ok(ReserveOutcome::Existing(r)) => Ok(r),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let level = second
        .stock(&sale, "HOT")
        .await?
        .ok_or_else(|| anyhow::anyhow!("HOT not loaded"))?;
    assert_eq!(
        (level.available, level.reserved),
        (8, 2),
        "one unit for {answer:?}"
    );
    cluster.until_healthy(HEALTHY).await?;
    Ok(())
}
