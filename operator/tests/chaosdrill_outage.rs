//! A ChaosDrill's guard when the stack's Prometheus itself is stopped
//! mid-run: blind for `staleAfter`, the guard aborts the run and the chaos
//! is removed. In a test binary of its own, because stopping Prometheus
//! would blind every other test that reads it.

mod common;

use std::time::Duration;

use common::drill::{DrillScene, drill, pod_failure};
use flashsale_api::chaosdrill::RunOutcome;
use flashsale_controller_drill::chaos::Kind;
use flashsale_e2e::faults::{Outage, exclusive};
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

    // From the moment Prometheus stopped answering (a prober asking every
    // 10 ms finds it): the guard must not abort within staleAfter of it.
    let silence = common::first_silence(&scene.prometheus);
    let outage = Outage::begin("prometheus").await?;
    let ended = scene
        .until_ended("blind", Some(&run.id), Duration::from_secs(30))
        .await;
    let seen_ended = Instant::now();
    let left = scene.chaos_objects(Kind::PodChaos, &run.id).await;
    let stopped = silence.await?;
    outage.end().await?;
    let (ended, (stopped, stopped_at)) = (ended?, stopped?);
    let waited = seen_ended.duration_since(stopped);
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
    let blind = decided.duration_since(stopped_at);
    eprintln!(
        "blind guard: abort decided {blind:?} after Prometheus stopped answering; decision → gone {:?}",
        gone.duration_since(decided)
    );
    // staleAfter is 2 s from the last answer, which may have come up to an
    // interval (250 ms) before the prober's 10 ms found the silence.
    assert!(
        blind >= jiff::SignedDuration::from_millis(1_740),
        "aborted {blind:?} after Prometheus stopped answering, inside staleAfter"
    );
    assert!(waited < Duration::from_secs(8), "aborted after {waited:?}");
    Ok(())
}
