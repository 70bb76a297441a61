//! A ChaosDrill's guard when the stack's Prometheus itself is stopped
//! mid-run: blind for `staleAfter`, the guard aborts the run and the chaos
//! is removed. In a test binary of its own, because stopping Prometheus
//! would blind every other test that reads it.

mod common;

use std::time::Duration;

use common::drill::{DrillScene, drill, pod_failure};
use flashsale_e2e::faults::{Outage, exclusive};
use flashsale_operator::{api::chaosdrill::RunOutcome, drill::chaos::Kind};
use tokio::time::Instant;

#[tokio::test]
async fn prometheus_stopped_mid_run_aborts_within_stale_after() -> anyhow::Result<()> {
    let _alone = exclusive().await;
    let scene = DrillScene::start("cd-outage", 0.0).await?;
    scene.gateway_pods(4).await?;
    scene
        .create(drill(
            "blind",
            &scene.exporter.query(),
            pod_failure("60s"),
            (25.0, 1),
        ))
        .await?;
    scene.run_now("blind", "r1", None).await?;
    let run = scene.until_injected("blind").await?;

    // From before the stop: the guard must not abort within staleAfter of
    // the moment Prometheus went away, which is at or after this instant.
    let stopped = Instant::now();
    let outage = Outage::begin("prometheus").await?;
    let ended = scene
        .until_ended("blind", Some(&run.id), Duration::from_secs(30))
        .await;
    let waited = stopped.elapsed();
    let left = scene.chaos_objects(Kind::PodChaos, &run.id).await;
    outage.end().await?;
    let ended = ended?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(
        ended.reason.as_deref(),
        Some("PrometheusUnreachable"),
        "{ended:?}"
    );
    assert!(left?.is_empty(), "the experiment outlived the abort");
    let (Some(decided), Some(gone)) = (ended.decided_at.map(|t| t.0), ended.gone_at.map(|t| t.0))
    else {
        anyhow::bail!("times missing");
    };
    eprintln!(
        "blind guard: run ended {waited:?} after the stop began; decision → gone {:?}",
        gone.duration_since(decided)
    );
    // staleAfter is 2 s; `stack down` itself takes part of `waited`.
    assert!(
        waited >= Duration::from_secs(2),
        "aborted after {waited:?}, inside staleAfter"
    );
    assert!(waited < Duration::from_secs(8), "aborted after {waited:?}");
    Ok(())
}
