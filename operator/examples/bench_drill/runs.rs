//! Parts 2–4: whole runs of a drill through the release operator, the
//! test kit's drill scene (a pod-failure on one of four gateway pods, the guard
//! reading a gauge through the real Prometheus every 250 ms, staleAfter 2 s,
//! steadyState 1 s). Each run is requested with the run-now annotation and
//! measured once Chaos Mesh reports the fault injected; the next starts once
//! the run is recorded, its target restored and the gauge healthy in
//! Prometheus again.
//!
//! - Breach: the gauge set above the threshold, timed until the run's
//!   PodChaos is gone; the run's status splits it.
//! - Dead man: the stack's Prometheus stopped, timed until the PodChaos is
//!   gone, from before the stop and from its end.
//! - Backstop: the operator SIGKILLed, timed until Chaos Mesh's StatusCheck
//!   alone has removed the PodChaos; a fresh operator then takes over.

use std::time::{Duration, Instant};

use flashsale_api::chaosdrill::RunRecord;
use flashsale_bench::ms;
use flashsale_controller_drill::{chaos, chaos::Kind};
use flashsale_e2e::{
    drill::{DrillScene, THRESHOLD, drill, first_target, image, pod_failure, until_scraped},
    faults::Outage,
    wait::poll_until,
};
use flashsale_observe::{pods::is_ready, signal::Reading, signal::SignalReader};
use jiff::Timestamp;

use super::chaos::{pod_chaos, until_injected};
use flashsale_e2e::kube::until_gone;

/// The drill's name.
const DRILL: &str = "guarded";
/// The image of the scene's gateway pods, which Chaos Mesh swaps while a
/// pod-failure holds.
const GATEWAY_IMAGE: &str = "gateway:drill";
/// The gauge's healthy value.
const HEALTHY: f64 = 0.0;
/// The drill's staleAfter.
pub const STALE_AFTER: Duration = Duration::from_secs(2);

/// One run aborted by a breach, in ms.
#[derive(Debug, Clone, Copy)]
pub struct Breach {
    /// Gauge set → the PodChaos gone, seen from here.
    pub gone: f64,
    /// Gauge set → the evaluation that saw the breach (`detectedAt`).
    pub detected: f64,
    /// `detectionLatency`: that evaluation → the guard's decision.
    pub detection: f64,
    /// `abortLatency`: decision → every experiment gone.
    pub abort: f64,
}

/// One run aborted by a stopped Prometheus.
#[derive(Debug, Clone)]
pub struct Blind {
    /// Before `stack down prometheus` → the PodChaos gone, ms.
    pub from_begin: f64,
    /// `stack down prometheus` returned → the PodChaos gone, ms.
    pub from_down: f64,
    /// How long `stack down prometheus` took, ms.
    pub down: f64,
    /// The run's recorded reason.
    pub reason: String,
    /// `abortLatency`, ms.
    pub abort: Option<f64>,
}

/// One run ended by Chaos Mesh alone after the operator was killed.
#[derive(Debug, Clone)]
pub struct Backstop {
    /// SIGKILL → the PodChaos gone, ms.
    pub gone: f64,
    /// The next operator's start → it leads, ms.
    pub leads: f64,
    /// The reason the next operator recorded.
    pub reason: String,
}

/// The scene's four gateway pods and the drill, with the operator leading.
pub async fn prepare(scene: &mut DrillScene) -> anyhow::Result<()> {
    scene.gateway_pods(4).await?;
    scene.operator.until_leads().await?;
    scene
        .create(drill(
            DRILL,
            &scene.exporter.query(),
            pod_failure("5m"),
            (25.0, 1),
        ))
        .await
}

/// A run requested as `request`, once Chaos Mesh injected its fault; the
/// run and its target pod.
async fn injected_run(
    scene: &DrillScene,
    request: &str,
    bound: Duration,
) -> anyhow::Result<(RunRecord, String)> {
    scene.run_now(DRILL, request, None).await?;
    let run = scene.until_injected(DRILL).await?;
    let target = first_target(&run)?;
    until_injected(
        &pod_chaos(&scene.client, &scene.ns.name),
        &chaos::run_selector(DRILL, &run.id),
        bound,
    )
    .await?;
    Ok((run, target))
}

/// From `since` until the run's PodChaos is gone.
async fn until_run_gone(
    scene: &DrillScene,
    run: &str,
    since: Instant,
    bound: Duration,
) -> anyhow::Result<Duration> {
    let api = pod_chaos(&scene.client, &scene.ns.name);
    until_gone(&api, &chaos::run_selector(DRILL, run), since, bound).await
}

/// Waits until the run is recorded, its target runs its own image again
/// and is Ready, and Prometheus has the healthy gauge; the record.
async fn settle(
    scene: &DrillScene,
    run: &str,
    target: &str,
    bound: Duration,
) -> anyhow::Result<RunRecord> {
    let ended = scene.until_ended(DRILL, Some(run), bound).await?;
    anyhow::ensure!(
        scene
            .objects(&Kind::Workflow.resource(), &chaos::run_selector(DRILL, run))
            .await?
            .is_empty(),
        "the run's Workflow outlived it"
    );
    let pods = scene.pods();
    poll_until(
        "the target restored",
        bound,
        Duration::from_millis(50),
        || {
            let pods = &pods;
            async move {
                let current = image(pods, target).await.map_err(|e| e.to_string())?;
                let ready = pods.get(target).await.map_err(|e| e.to_string())?;
                if current == GATEWAY_IMAGE && is_ready(&ready) {
                    Ok(())
                } else {
                    Err(format!("image {current}, ready {}", is_ready(&ready)))
                }
            }
        },
    )
    .await?;
    until_scraped(&scene.prometheus, &scene.exporter.query(), HEALTHY).await?;
    Ok(ended)
}

/// Ms of a recorded duration.
fn recorded(duration: Option<&flashsale_api::Duration>) -> anyhow::Result<f64> {
    duration
        .map(|d| ms(d.0))
        .ok_or_else(|| anyhow::anyhow!("a latency is missing from the run's record"))
}

/// `runs` runs aborted by a breach of the gauge.
pub async fn breaches(
    scene: &DrillScene,
    runs: usize,
    bound: Duration,
) -> anyhow::Result<Vec<Breach>> {
    let mut measured = Vec::with_capacity(runs);
    for i in 1..=runs {
        let (run, target) = injected_run(scene, &format!("breach-{i}"), bound).await?;
        let set_at = Timestamp::now();
        let started = Instant::now();
        scene.exporter.set(THRESHOLD * 3.0);
        let gone = until_run_gone(scene, &run.id, started, bound).await?;
        scene.exporter.set(HEALTHY);
        let ended = settle(scene, &run.id, &target, bound).await?;
        anyhow::ensure!(
            ended.reason.as_deref() == Some("SloBreached"),
            "run {} ended otherwise: {ended:?}",
            run.id
        );
        let detected = ended
            .detected_at
            .as_ref()
            .map(|t| t.0.duration_since(set_at).as_secs_f64() * 1e3)
            .ok_or_else(|| anyhow::anyhow!("no detectedAt in {ended:?}"))?;
        let breach = Breach {
            gone: ms(gone),
            detected,
            detection: recorded(ended.detection_latency.as_ref())?,
            abort: recorded(ended.abort_latency.as_ref())?,
        };
        eprintln!(
            "  breach {i}/{runs}: gone {:.1} ms after the gauge was set (detected +{:.1}, decided +{:.1}, gone +{:.1})",
            breach.gone, breach.detected, breach.detection, breach.abort
        );
        measured.push(breach);
    }
    Ok(measured)
}

/// `runs` runs aborted by stopping the stack's Prometheus, started again
/// after each.
pub async fn outages(
    scene: &DrillScene,
    runs: usize,
    bound: Duration,
) -> anyhow::Result<Vec<Blind>> {
    let mut measured = Vec::with_capacity(runs);
    for i in 1..=runs {
        let (run, target) = injected_run(scene, &format!("blind-{i}"), bound).await?;
        let began = Instant::now();
        let outage = Outage::begin("prometheus").await?;
        let down = Instant::now();
        let gone = until_run_gone(scene, &run.id, began, bound).await;
        outage.end().await?;
        let gone = gone?;
        let restarted = Timestamp::now();
        until_fresh(&scene.prometheus, &scene.exporter.query(), restarted, bound).await?;
        let ended = settle(scene, &run.id, &target, bound).await?;
        let blind = Blind {
            from_begin: ms(gone),
            from_down: ms(gone.saturating_sub(down - began)),
            down: ms(down - began),
            reason: ended.reason.clone().unwrap_or_default(),
            abort: ended.abort_latency.as_ref().map(|d| ms(d.0)),
        };
        eprintln!(
            "  outage {i}/{runs}: gone {:.1} ms after `stack down` began, {:.1} ms after it returned ({:.1} ms); {}",
            blind.from_begin, blind.from_down, blind.down, blind.reason
        );
        measured.push(blind);
    }
    Ok(measured)
}

/// Waits until Prometheus answers `query` from a scrape after `since`: a
/// restarted Prometheus still answers from what it had before the stop.
async fn until_fresh(
    prometheus: &str,
    query: &str,
    since: Timestamp,
    bound: Duration,
) -> anyhow::Result<()> {
    let reader = SignalReader::new()?;
    let fresh = format!(
        "timestamp({query}) > {}",
        since.as_millisecond() as f64 / 1e3
    );
    poll_until(
        "the gauge scraped again",
        bound,
        Duration::from_millis(100),
        || {
            let (reader, fresh) = (&reader, &fresh);
            async move {
                match reader
                    .read(
                        prometheus,
                        fresh,
                        Duration::from_secs(1),
                        Duration::from_secs(30),
                        Timestamp::now(),
                    )
                    .await
                {
                    Reading::Value(_) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// `runs` runs whose operator is SIGKILLed once the fault is injected; a
/// fresh operator takes over for the next.
pub async fn backstops(
    scene: &mut DrillScene,
    runs: usize,
    bound: Duration,
) -> anyhow::Result<Vec<Backstop>> {
    let mut measured = Vec::with_capacity(runs);
    for i in 1..=runs {
        let (run, target) = injected_run(scene, &format!("backstop-{i}"), bound).await?;
        let killed = Instant::now();
        scene.operator.kill();
        let gone = until_run_gone(scene, &run.id, killed, bound).await?;
        let started = Instant::now();
        scene.operator = scene.another_operator(&format!("next-{i}"))?;
        scene.operator.until_leads().await?;
        let leads = started.elapsed();
        let ended = settle(scene, &run.id, &target, bound).await?;
        let backstop = Backstop {
            gone: ms(gone),
            leads: ms(leads),
            reason: ended.reason.clone().unwrap_or_default(),
        };
        eprintln!(
            "  backstop {i}/{runs}: gone {:.1} ms after the SIGKILL; the next operator led after {:.1} ms and recorded {}",
            backstop.gone, backstop.leads, backstop.reason
        );
        measured.push(backstop);
    }
    Ok(measured)
}
