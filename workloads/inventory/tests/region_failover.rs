//! Stock divergence when region A is lost: region B's Redis, a replica of
//! A's (`e2e/local/stack up region-b`), is promoted while it lags, and every
//! reservation A acknowledged that B does not hold is a unit B would sell
//! again. Clients reserve on A; B is paused (its lag grows), A is SIGKILLed,
//! B resumes and is promoted. The bound: under `fast` the divergence is at
//! most what A acknowledged during the lag, rate × lag; under `replicated`,
//! with B the replica `WAIT` counts, it is 0, since nothing is acknowledged
//! that B does not hold. Afterwards A is restored as the primary from its
//! own log, holding every acknowledged reservation, and B follows it again.

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use flashsale_e2e::{
    faults,
    region::{self, Regions},
    stack,
    wait::poll_until,
};
use inventory::store::{Durability, ReserveOutcome, ReserveRequest, Store};
use tokio::sync::Mutex;

/// How long B lags before A is lost.
const LAG: Duration = Duration::from_millis(1_500);
const CLIENTS: usize = 20;
const POLL: Duration = Duration::from_millis(20);

/// One acknowledged reservation: its id and when it was acknowledged.
type Acked = Vec<(String, Instant)>;

/// What losing region A cost.
struct Divergence {
    /// Reservations A acknowledged before B was paused, and during.
    before: usize,
    during: usize,
    /// Acknowledged reservations promoted B does not hold, each with when
    /// A acknowledged it.
    missing: Vec<(String, Instant)>,
    paused: Instant,
    /// Reservations per second before the pause.
    rate: f64,
}

/// Polls until B has applied everything A had written when the call began.
async fn until_caught_up(regions: &Regions) -> anyhow::Result<()> {
    region::until_caught_up(&regions.a_redis, &regions.b_redis, Duration::from_secs(30)).await
}

/// Reserves one unit per call as `u<client>` until `stop`, every
/// acknowledgement recorded; refusals (a replica that does not confirm,
/// A gone) are retried.
async fn keep_reserving(
    client: usize,
    store: Store,
    sale: String,
    acked: Arc<Mutex<Acked>>,
    stop: Arc<AtomicBool>,
) {
    for call in 0.. {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let request_id = format!("c{client}-{call}");
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
                acked.lock().await.push((r.id, Instant::now()));
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

/// Puts the pair back: A restarted from its append-only file, the primary
/// again; B its replica again, caught up.
async fn restore(regions: &Regions, crash: faults::Outage) -> anyhow::Result<()> {
    crash.end().await?;
    let (host, port) = regions
        .a_redis
        .trim_start_matches("redis://")
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("{} has no port", regions.a_redis))?;
    let mut b = redis::Client::open(regions.b_redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let () = redis::cmd("REPLICAOF")
        .arg(host)
        .arg(port)
        .query_async(&mut b)
        .await?;
    until_caught_up(regions).await
}

/// Reserves on A under `durability`, pauses B for [`LAG`], loses A,
/// promotes B and counts what B lacks; then restores the pair and checks
/// that A holds every acknowledged reservation.
async fn lose_region_a(durability: Durability) -> anyhow::Result<Divergence> {
    let regions = Regions::from_env()?;
    let sale = stack::unique_name("inv-region");
    let (store, sale) = common::store_on(&regions.a_redis, &sale, 1_000_000, 1_000_000, 1, 600_000)
        .await
        .map(|(store, sale)| (store.with_durability(durability), sale))?;
    until_caught_up(&regions).await?;

    let (acked, stop) = (
        Arc::new(Mutex::new(Acked::new())),
        Arc::new(AtomicBool::new(false)),
    );
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (store, sale, acked, stop) =
                (store.clone(), sale.clone(), acked.clone(), stop.clone());
            tokio::spawn(keep_reserving(c, store, sale, acked, stop))
        })
        .collect();
    poll_until(
        "200 reservations on A",
        Duration::from_secs(30),
        POLL,
        || async {
            let n = acked.lock().await.len();
            if n >= 200 {
                Ok(())
            } else {
                Err(format!("{n}"))
            }
        },
    )
    .await?;
    let pause = faults::Outage::pause("redis-b").await?;
    let paused = Instant::now();
    let rate = acked.lock().await.len() as f64 / (paused - started).as_secs_f64();
    // The lag's length is the measurement, not a wait for readiness.
    tokio::time::sleep(LAG).await;
    let crash = faults::Outage::crash("redis-a").await?;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await?;
    }
    pause.end().await?;
    let b = Store::connect(&regions.b_redis).await?;
    let mut promote = redis::Client::open(regions.b_redis.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut promote)
        .await?;

    let acked = acked.lock().await.clone();
    let mut missing = Vec::new();
    for (id, at) in &acked {
        if b.reservation(&sale, id).await?.is_none() {
            missing.push((id.clone(), *at));
        }
    }
    restore(&regions, crash).await?;
    let a = Store::connect(&regions.a_redis).await?;
    for (id, _) in &acked {
        anyhow::ensure!(
            a.reservation(&sale, id).await?.is_some(),
            "restored A lost acknowledged reservation {id}"
        );
    }
    let before = acked.iter().filter(|(_, at)| *at < paused).count();
    Ok(Divergence {
        before,
        during: acked.len() - before,
        missing,
        paused,
        rate,
    })
}

/// The figures of one loss: the bound is what A acknowledged during the
/// lag, its rate then times the lag.
fn report(policy: &str, d: &Divergence) {
    println!(
        "{policy}: {:.0} reservations/s before B lagged ({} acknowledged), {:.0}/s during its \
         {LAG:?} lag ({} acknowledged: the bound); B promoted without {} of them",
        d.rate,
        d.before,
        d.during as f64 / LAG.as_secs_f64(),
        d.during,
        d.missing.len(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_region_a_under_the_replicated_policy_diverges_by_no_unit() -> anyhow::Result<()> {
    let _exclusive = faults::exclusive().await;
    let d = lose_region_a(Durability::Replicated {
        replicas: 1,
        timeout: Duration::from_millis(50),
    })
    .await?;
    report("replicated", &d);
    assert!(d.before >= 200, "too few reservations to judge");
    // Every acknowledgement waited for B: promoted, it holds them all.
    assert_eq!(d.missing, Vec::new(), "units B would sell again");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_region_a_under_the_fast_policy_diverges_by_at_most_what_the_lag_held()
-> anyhow::Result<()> {
    let _exclusive = faults::exclusive().await;
    let d = lose_region_a(Durability::Fast).await?;
    report("fast", &d);
    // The fast policy keeps acknowledging while B lags: that is its exposure.
    assert!(d.during > 0, "nothing acknowledged while B lagged");
    // Only what was acknowledged in the lag can be missing (B had caught
    // up on everything before, up to the moment's in-flight writes).
    let late = d.paused - Duration::from_millis(100);
    let early: Vec<_> = d.missing.iter().filter(|(_, at)| *at < late).collect();
    assert_eq!(
        early,
        Vec::<&(String, Instant)>::new(),
        "lost before the lag"
    );
    assert!(
        d.missing.len() <= d.during,
        "{} missing, {} acknowledged in the lag",
        d.missing.len(),
        d.during
    );
    Ok(())
}
