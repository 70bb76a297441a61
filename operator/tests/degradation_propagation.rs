//! How long the gateways take to apply a degradation generation, measured
//! against tiny servers on 127.0.0.1 that export
//! `gateway_degradation_generation` as the gateway replicas do.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use flashsale_controller_degradation::{propagation::Progress, propagation::await_generation};
use flashsale_observe::probe::Probe;

const POLL: Duration = Duration::from_millis(5);

/// A gateway replica's metrics endpoint, at the generation it holds.
async fn replica(generation: u64) -> anyhow::Result<(SocketAddr, Arc<AtomicU64>)> {
    let held = Arc::new(AtomicU64::new(generation));
    let metrics = {
        let held = held.clone();
        move || {
            let generation = held.load(Ordering::SeqCst);
            async move {
                format!(
                    "# TYPE gateway_degradation_generation gauge\n\
                     gateway_degradation_generation {generation}\n"
                )
            }
        }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(metrics));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, held))
}

/// Sets `generation` on `held` after `delay`, as a gateway that reloads.
fn apply_after(held: &Arc<AtomicU64>, generation: u64, delay: Duration) {
    let held = held.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        held.store(generation, Ordering::SeqCst);
    });
}

fn probe() -> anyhow::Result<Probe> {
    Ok(Probe::new("http://unused", Duration::from_secs(10))?)
}

#[tokio::test]
async fn the_time_until_every_replica_has_the_generation_is_measured() -> anyhow::Result<()> {
    let mut replicas = Vec::new();
    for (pod, delay) in [("a", 0), ("b", 100), ("c", 200)] {
        let (addr, held) = replica(3).await?;
        apply_after(&held, 4, Duration::from_millis(delay));
        replicas.push((pod.to_owned(), addr));
    }
    let started = Instant::now();
    let outcome = await_generation(
        &probe()?,
        &replicas,
        4,
        started,
        Duration::from_secs(5),
        POLL,
    )
    .await;
    let elapsed = outcome
        .elapsed_to_all
        .ok_or_else(|| anyhow::anyhow!("not applied: {:?}", outcome.progress))?;
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(1),
        "{elapsed:?}"
    );
    assert_eq!(
        outcome.progress,
        Progress {
            applied: 3,
            total: 3,
            laggards: Vec::new(),
        }
    );
    Ok(())
}

#[tokio::test]
async fn a_replica_that_never_applies_it_is_named_after_the_bound() -> anyhow::Result<()> {
    let (ahead, _) = replica(5).await?;
    let (behind, _) = replica(3).await?;
    // Accepts and never answers: the round is cut off at the bound, even
    // though the probe itself would wait 10 s.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let silent_addr = silent.local_addr()?;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let replicas = [
        ("a".to_owned(), ahead),
        ("b".to_owned(), behind),
        ("c".to_owned(), silent_addr),
    ];
    let bound = Duration::from_millis(300);
    let started = Instant::now();
    let outcome = await_generation(&probe()?, &replicas, 4, started, bound, POLL).await;
    let waited = started.elapsed();
    assert!(waited >= bound && waited < bound * 3, "{waited:?}");
    assert_eq!(outcome.elapsed_to_all, None);
    assert_eq!(
        outcome.progress,
        Progress {
            applied: 1,
            total: 3,
            laggards: vec![
                "b: at generation 3".to_owned(),
                "c: no answer within 300ms".to_owned(),
            ],
        }
    );
    Ok(())
}

#[tokio::test]
async fn without_replicas_nothing_is_measured_or_awaited() -> anyhow::Result<()> {
    let started = Instant::now();
    let bound = Duration::from_secs(5);
    let outcome = await_generation(&probe()?, &[], 4, started, bound, POLL).await;
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    assert_eq!(outcome.elapsed_to_all, None);
    assert_eq!(outcome.progress, Progress::default());
    Ok(())
}
