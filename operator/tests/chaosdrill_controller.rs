//! The ChaosDrill controller against the real apiserver, the real
//! chaos-controller-manager and the real Prometheus scraping a gauge the
//! test sets: the exact pods under the cap, the namespace budget, the
//! steady-state refusal, the guard's abort on a breach, a NaN and an empty
//! answer, the windows at the apiserver, the kill switch, an invalid spec,
//! and the operator SIGKILLed mid-run (Chaos Mesh's backstop, then the next
//! operator's takeover).

mod common;

use std::{collections::BTreeSet, time::Duration};

use common::drill::{DrillScene, THRESHOLD, drill, pod_failure, pod_kill};
use common::scene::events;
use flashsale_api::{chaosdrill::DrillPhase, chaosdrill::RunOutcome, chaosdrill::RunRecord};
use flashsale_controller_drill::chaos::Kind;
use flashsale_e2e::wait::poll_until;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use tokio::time::Instant;

/// Runs a pod-kill on `fleet` gateway pods under `radius` and checks that
/// Chaos Mesh killed exactly the pods the run names, as many as the cap.
async fn kills_exactly_the_named_pods(
    prefix: &str,
    fleet: usize,
    radius: (f64, i32),
    cap: usize,
) -> anyhow::Result<()> {
    let scene = DrillScene::start(prefix, 0.0).await?;
    let before = scene.gateway_pods(fleet).await?;
    scene
        .create(drill(
            "kill",
            &scene.exporter.query(),
            pod_kill("2s"),
            radius,
        ))
        .await?;
    scene.run_now("kill", "r1", None).await?;
    let run = scene.until_injected("kill").await?;
    let targets: BTreeSet<String> = run
        .targets
        .iter()
        .map(|t| t.rsplit('/').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(targets.len(), cap, "targets {targets:?}");
    assert_eq!(run.targeted_pods, Some(cap as i32));
    assert!(targets.is_subset(&before));
    // pod-kill deletes at once and nothing recreates bare pods: what is
    // gone is exactly what Chaos Mesh killed.
    let left = poll_until(
        "the named pods killed",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let names = scene.pod_names().await.map_err(|e| e.to_string())?;
            if names.is_disjoint(&targets) {
                Ok(names)
            } else {
                Err(format!(
                    "{} targets left",
                    names.intersection(&targets).count()
                ))
            }
        },
    )
    .await?;
    let killed: BTreeSet<String> = before.difference(&left).cloned().collect();
    assert_eq!(killed, targets, "Chaos Mesh killed other pods than named");

    let ended = scene
        .until_ended("kill", Some(&run.id), Duration::from_secs(60))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Succeeded), "{ended:?}");
    for kind in [Kind::PodChaos, Kind::Workflow] {
        assert!(
            scene.chaos_objects(kind, &run.id).await?.is_empty(),
            "{kind:?} left after the run"
        );
    }
    // Still nothing else killed after the run.
    assert_eq!(scene.pod_names().await?, left);
    let notes = events(&scene.client, &scene.ns.name, "RunSucceeded").await?;
    assert!(notes.iter().any(|n| n.contains(&run.id)), "{notes:?}");
    Ok(())
}

#[tokio::test]
async fn on_three_pods_a_half_cap_kills_exactly_one_named_pod() -> anyhow::Result<()> {
    kills_exactly_the_named_pods("cd-three", 3, (50.0, 10), 1).await
}

#[tokio::test]
async fn on_fifty_pods_ten_percent_kills_exactly_the_five_named_pods() -> anyhow::Result<()> {
    kills_exactly_the_named_pods("cd-fifty", 50, (10.0, 100), 5).await
}

#[tokio::test]
async fn on_a_thousand_pods_two_percent_kills_exactly_twenty_never_more() -> anyhow::Result<()> {
    kills_exactly_the_named_pods("cd-thousand", 1000, (2.0, 100), 20).await
}

#[tokio::test]
async fn a_fleet_too_small_for_one_pod_within_the_cap_is_refused() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-small", 0.0).await?;
    let before = scene.gateway_pods(3).await?;
    // 2 % of 3 pods rounds down to none.
    scene
        .create(drill(
            "small",
            &scene.exporter.query(),
            pod_kill("2s"),
            (2.0, 2),
        ))
        .await?;
    scene.run_now("small", "r1", None).await?;
    let ended = scene
        .until_ended("small", None, Duration::from_secs(30))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Skipped));
    assert_eq!(ended.reason.as_deref(), Some("FleetTooSmall"), "{ended:?}");
    assert_eq!(
        scene.chaos_objects(Kind::PodChaos, &ended.id).await?.len(),
        0
    );
    assert_eq!(scene.ready_pods().await?, before);
    Ok(())
}

#[tokio::test]
async fn two_drills_asked_at_once_share_one_budget_and_one_is_skipped() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-budget", 0.0).await?;
    scene.gateway_pods(10).await?;
    let query = scene.exporter.query();
    // Each may hold 20 % of 10 pods: 2. Both are asked at once, as on one
    // cron tick, so both reach injection together: one reservation must
    // refuse the other, since each alone sees an empty namespace.
    scene
        .create(drill("first", &query, pod_failure("60s"), (20.0, 5)))
        .await?;
    scene
        .create(drill("second", &query, pod_failure("60s"), (20.0, 5)))
        .await?;
    let (first, second) = tokio::join!(
        scene.run_now("first", "r1", None),
        scene.run_now("second", "r1", None)
    );
    first?;
    second?;
    let ended = |name: &'static str| {
        let scene = &scene;
        async move {
            let status = scene
                .until_status(name, "injected or skipped", Duration::from_secs(60), |s| {
                    s.current_run
                        .as_ref()
                        .is_some_and(|r| r.injected_at.is_some())
                        || !s.history.is_empty()
                })
                .await?;
            anyhow::Ok(status.current_run.or(status.history.first().cloned()))
        }
    };
    let (first, second) = tokio::join!(ended("first"), ended("second"));
    let runs: Vec<RunRecord> = [first?, second?].into_iter().flatten().collect();
    let injected: Vec<&RunRecord> = runs.iter().filter(|r| r.injected_at.is_some()).collect();
    let skipped: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.outcome == Some(RunOutcome::Skipped))
        .collect();
    assert_eq!(injected.len(), 1, "{runs:#?}");
    assert_eq!(skipped.len(), 1, "{runs:#?}");
    assert_eq!(injected[0].targets.len(), 2);
    assert_eq!(skipped[0].reason.as_deref(), Some("BudgetExhausted"));
    // What Chaos Mesh was given: two pods in all, never four.
    let mut named = BTreeSet::new();
    for run in &runs {
        for object in scene.chaos_objects(Kind::PodChaos, &run.id).await? {
            named.extend(flashsale_controller_drill::chaos::selected_pods(&object).into_iter());
        }
    }
    assert_eq!(named.len(), 2, "{named:?}");
    Ok(())
}

#[tokio::test]
async fn a_breaking_slo_before_injection_skips_the_run_and_injects_nothing() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-steady", THRESHOLD * 2.0).await?;
    let before = scene.gateway_pods(4).await?;
    scene
        .create(drill(
            "steady",
            &scene.exporter.query(),
            pod_kill("2s"),
            (50.0, 2),
        ))
        .await?;
    scene.run_now("steady", "r1", None).await?;
    let ended = scene
        .until_ended("steady", None, Duration::from_secs(30))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Skipped));
    assert_eq!(
        ended.reason.as_deref(),
        Some("SteadyStateNotReached"),
        "{ended:?}"
    );
    assert!(
        ended
            .message
            .as_deref()
            .is_some_and(|m| m.contains("error-rate")),
        "{ended:?}"
    );
    assert_eq!(ended.injected_at, None);
    assert!(
        scene
            .chaos_objects(Kind::Workflow, &ended.id)
            .await?
            .is_empty()
    );
    assert_eq!(scene.ready_pods().await?, before);
    Ok(())
}

#[tokio::test]
async fn a_breach_aborts_the_run_the_objects_disappear_and_the_latencies_are_recorded()
-> anyhow::Result<()> {
    let scene = DrillScene::start("cd-breach", 0.0).await?;
    let (run, target) = scene.failing_one_pod("breach").await?;
    assert_eq!(
        scene.guard("breach", &run.id).await?,
        200,
        "the guard answers while healthy"
    );
    assert_eq!(
        scene.guard("breach", "20000101-000000-000").await?,
        503,
        "another run's check is not kept healthy by this run's guard"
    );
    assert_eq!(scene.chaos_objects(Kind::PodChaos, &run.id).await?.len(), 1);

    // The test's own clock: a watch of the run's experiment, started before
    // the breach, stamps the moment the apiserver reports it deleted.
    let gone_seen = watch_deletion(&scene, Kind::PodChaos, &run.id).await?;
    let breached = Instant::now();
    scene.exporter.set(THRESHOLD * 3.0);
    let ended = scene
        .until_ended("breach", Some(&run.id), Duration::from_secs(30))
        .await?;
    let seen = breached.elapsed();
    assert_aborted_and_restored(&scene, &ended, &run.id, &target).await?;
    assert_times_in_order(&ended)?;
    // The latency runs from the decision, which came after the breach, to
    // the experiment gone, which the test's watch saw too: it is positive
    // and no longer than breach → gone by the test's clock (plus the spread
    // between two watches of one deletion).
    let latency = ended
        .abort_latency
        .map(|d| d.0)
        .ok_or_else(|| anyhow::anyhow!("no abort latency: {ended:?}"))?;
    let independent = gone_seen.await??.duration_since(breached);
    assert!(
        latency > Duration::ZERO && latency <= independent + Duration::from_millis(100),
        "abort latency {latency:?}, breach → gone by the test's own watch {independent:?}"
    );
    eprintln!("abort latency {latency:?}; breach → gone seen by the test {independent:?}");
    assert!(
        seen < Duration::from_secs(10),
        "the breach took {seen:?} to end the run"
    );
    assert_abort_recorded(&scene, latency).await
}

/// Run `run` ended as `ended`: aborted for the breached SLO, its
/// experiment and workflow gone, `target` restored, and its guard silent.
async fn assert_aborted_and_restored(
    scene: &DrillScene,
    ended: &RunRecord,
    run: &str,
    target: &str,
) -> anyhow::Result<()> {
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("SloBreached"));
    assert!(
        ended
            .message
            .as_deref()
            .is_some_and(|m| m.contains("error-rate")),
        "{ended:?}"
    );
    for kind in [Kind::PodChaos, Kind::Workflow] {
        assert!(
            scene.chaos_objects(kind, run).await?.is_empty(),
            "{kind:?} left"
        );
    }
    scene.until_restored(target).await?;
    assert_eq!(
        scene.guard("breach", run).await?,
        503,
        "an aborted run's guard is silent"
    );
    Ok(())
}

/// The run recorded when the breach was detected, the abort decided, the
/// target recovered and the experiment gone, in that order.
fn assert_times_in_order(ended: &RunRecord) -> anyhow::Result<()> {
    let (detected, decided, recovered, gone) = (
        ended.detected_at.clone().map(|t| t.0),
        ended.decided_at.clone().map(|t| t.0),
        ended.recovered_at.clone().map(|t| t.0),
        ended.gone_at.clone().map(|t| t.0),
    );
    let (Some(detected), Some(decided), Some(recovered), Some(gone)) =
        (detected, decided, recovered, gone)
    else {
        anyhow::bail!("times missing: {ended:?}");
    };
    assert!(
        detected <= decided && decided <= recovered && recovered <= gone,
        "{ended:?}"
    );
    Ok(())
}

/// The abort shows in the drill's status with its `latency`, in the
/// operator's metrics and in an Event.
async fn assert_abort_recorded(scene: &DrillScene, latency: Duration) -> anyhow::Result<()> {
    let status = scene
        .until_status("breach", "last outcome", Duration::from_secs(5), |s| {
            s.last_outcome.is_some()
        })
        .await?;
    assert_eq!(status.last_outcome, Some(RunOutcome::Aborted));
    assert_eq!(status.last_abort_latency.map(|d| d.0), Some(latency));
    let aborts = scene
        .operator
        .metric_sum("flashsale_drill_abort_latency_seconds_count")
        .await?;
    assert_eq!(aborts, 1.0);
    let notes = events(&scene.client, &scene.ns.name, "RunAborted").await?;
    assert!(notes.iter().any(|n| n.contains("abort took")), "{notes:?}");
    Ok(())
}

/// A watch of run `run`'s objects of `kind`, already listening when this
/// returns; it resolves to the instant the apiserver reports one deleted.
async fn watch_deletion(
    scene: &DrillScene,
    kind: Kind,
    run: &str,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<Instant>>> {
    use futures::StreamExt;
    let api: Api<DynamicObject> =
        Api::namespaced_with(scene.client.clone(), &scene.ns.name, &kind.resource());
    let params = kube::api::WatchParams::default().labels(&format!(
        "{}={run}",
        flashsale_controller_drill::chaos::RUN_LABEL
    ));
    let version = api
        .list(&kube::api::ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut events = api.watch(&params, &version).await?.boxed();
    Ok(tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let kube::api::WatchEvent::Deleted(_) = event? {
                return Ok(Instant::now());
            }
        }
        anyhow::bail!("the watch ended before the deletion")
    }))
}

#[tokio::test]
async fn a_nan_answer_aborts_the_run() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-nan", 0.0).await?;
    let (run, target) = scene.failing_one_pod("nan").await?;
    scene.exporter.set(f64::NAN);
    let ended = scene
        .until_ended("nan", Some(&run.id), Duration::from_secs(30))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("NotANumber"));
    assert!(
        scene
            .chaos_objects(Kind::PodChaos, &run.id)
            .await?
            .is_empty()
    );
    scene.until_restored(&target).await
}

#[tokio::test]
async fn an_empty_answer_aborts_the_run() -> anyhow::Result<()> {
    let mut scene = DrillScene::start("cd-empty", 0.0).await?;
    let (run, target) = scene.failing_one_pod("empty").await?;
    // Out of Prometheus's targets: the series goes stale, the query empty.
    scene.exporter.unregister();
    let ended = scene
        .until_ended("empty", Some(&run.id), Duration::from_secs(60))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("EmptyResult"), "{ended:?}");
    assert!(
        scene
            .chaos_objects(Kind::PodChaos, &run.id)
            .await?
            .is_empty()
    );
    scene.until_restored(&target).await
}

#[tokio::test]
async fn a_request_outside_the_windows_is_skipped_unless_forced_with_a_reason() -> anyhow::Result<()>
{
    let scene = DrillScene::start("cd-window", 0.0).await?;
    scene.gateway_pods(4).await?;
    // A window of every day, in Tokyo, at least six hours away from now
    // whatever the hour the test runs at.
    let hour = jiff::Zoned::now()
        .with_time_zone(jiff::tz::TimeZone::get("Asia/Tokyo")?)
        .hour();
    let (start, end) = if hour < 12 {
        ("18:00", "24:00")
    } else {
        ("00:00", "06:00")
    };
    let every_day = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let mut object = drill("window", &scene.exporter.query(), pod_kill("1s"), (25.0, 1));
    object["spec"]["schedule"]["timeZone"] = json!("Asia/Tokyo");
    object["spec"]["windows"] = json!([{"days": every_day, "start": start, "end": end}]);
    scene.create(object).await?;
    scene.run_now("window", "r1", None).await?;
    let skipped = scene
        .until_ended("window", None, Duration::from_secs(30))
        .await?;
    assert_eq!(skipped.outcome, Some(RunOutcome::Skipped));
    assert_eq!(
        skipped.reason.as_deref(),
        Some("OutsideWindow"),
        "{skipped:?}"
    );

    scene
        .run_now("window", "r2", Some("alice: rehearsal before the sale"))
        .await?;
    let status = scene
        .until_status("window", "a forced run", Duration::from_secs(30), |s| {
            s.current_run.is_some() || s.history.len() > 1
        })
        .await?;
    let forced = status
        .current_run
        .or_else(|| status.history.first().cloned())
        .ok_or_else(|| anyhow::anyhow!("no run"))?;
    assert_eq!(
        forced.forced.as_deref(),
        Some("alice: rehearsal before the sale")
    );
    let ended = scene
        .until_ended("window", Some(&forced.id), Duration::from_secs(60))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Succeeded), "{ended:?}");

    // The force went with its one request: it is gone from the drill, and
    // the next plain request is bound by the windows again.
    let annotations = scene.drills().get("window").await?.metadata.annotations;
    assert!(
        annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("flashsale.dev/force-reason")),
        "{annotations:?}"
    );
    scene.run_now("window", "r3", None).await?;
    let status = scene
        .until_status(
            "window",
            "the third request handled",
            Duration::from_secs(30),
            |s| s.last_run_request.as_deref() == Some("r3") && s.current_run.is_none(),
        )
        .await?;
    let third = status.history.first().cloned().unwrap_or_default();
    assert_eq!(third.outcome, Some(RunOutcome::Skipped), "{third:?}");
    assert_eq!(third.reason.as_deref(), Some("OutsideWindow"), "{third:?}");
    assert_eq!(third.forced, None);
    Ok(())
}

#[tokio::test]
async fn the_namespace_kill_switch_removes_every_experiment_and_blocks_new_runs()
-> anyhow::Result<()> {
    let scene = DrillScene::start("cd-kill", 0.0).await?;
    let (run, target) = scene.failing_one_pod("kill").await?;
    let switched = Instant::now();
    scene.kill_switch(true).await?;
    let ended = scene
        .until_ended("kill", Some(&run.id), Duration::from_secs(30))
        .await?;
    let took = switched.elapsed();
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted));
    assert_eq!(ended.reason.as_deref(), Some("KillSwitch"), "{ended:?}");
    for kind in [Kind::PodChaos, Kind::Workflow] {
        assert!(
            scene.chaos_objects(kind, &run.id).await?.is_empty(),
            "{kind:?} left"
        );
    }
    scene.until_restored(&target).await?;
    assert!(
        took < Duration::from_secs(10),
        "the kill switch took {took:?}"
    );

    // While it is on, a request starts nothing.
    scene.run_now("kill", "r2", None).await?;
    let status = scene
        .until_status("kill", "suspended", Duration::from_secs(10), |s| {
            s.phase == Some(DrillPhase::Suspended)
        })
        .await?;
    assert_eq!(status.current_run, None);
    let ready = status.observed.get("Ready");
    assert_eq!(
        ready.map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("False", "KillSwitch")),
        "{ready:?}"
    );
    // The request that started the aborted run is not refused again as a
    // second one; only r2 is.
    let refused: Vec<&str> = status
        .history
        .iter()
        .filter_map(|r| r.message.as_deref())
        .filter(|m| m.contains("refused"))
        .collect();
    assert!(
        refused.iter().all(|m| m.contains("request r2 ")),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_operators_kill_switch_starts_nothing_and_sweeps_what_it_created() -> anyhow::Result<()>
{
    let scene = DrillScene::start_with("cd-switch", 0.0, &["--chaos-kill-switch=true"]).await?;
    let pods = scene.gateway_pods(2).await?;
    let pod = pods.first().cloned().unwrap_or_default();
    // An experiment the operator created before (say, before a crash).
    let leftover: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "chaos-mesh.org/v1alpha1",
        "kind": "PodChaos",
        "metadata": {"name": "leftover", "labels": {
            "app.kubernetes.io/managed-by": "flashsale-operator",
            "flashsale.dev/drill": "old", "flashsale.dev/run": "old-run"}},
        "spec": {"action": "pod-failure", "mode": "all", "duration": "5m",
                 "selector": {"namespaces": [scene.ns.name], "pods": {scene.ns.name.as_str(): [pod.as_str()]}}},
    }))?;
    let chaos: Api<DynamicObject> = Api::namespaced_with(
        scene.client.clone(),
        &scene.ns.name,
        &Kind::PodChaos.resource(),
    );
    chaos.create(&PostParams::default(), &leftover).await?;
    scene
        .create(drill(
            "held",
            &scene.exporter.query(),
            pod_kill("1s"),
            (50.0, 1),
        ))
        .await?;
    scene.run_now("held", "r1", None).await?;
    let status = scene
        .until_status("held", "held by the switch", Duration::from_secs(30), |s| {
            s.last_run_request.as_deref() == Some("r1")
                && s.observed
                    .get("Ready")
                    .is_some_and(|c| c.reason == "KillSwitch")
        })
        .await?;
    assert_eq!(status.phase, Some(DrillPhase::Suspended));
    assert_eq!(status.current_run, None);
    // The request is refused when it arrives, not kept for later.
    let refused: Vec<(Option<RunOutcome>, Option<&str>)> = status
        .history
        .iter()
        .map(|r| (r.outcome, r.reason.as_deref()))
        .collect();
    assert_eq!(
        refused,
        [(Some(RunOutcome::Skipped), Some("KillSwitch"))],
        "{status:?}"
    );
    assert!(
        scene
            .chaos_objects(Kind::PodChaos, "old-run")
            .await?
            .is_empty()
    );
    assert_eq!(scene.pod_names().await?, pods, "nothing was killed");
    Ok(())
}

#[tokio::test]
async fn an_invalid_cron_time_zone_or_query_is_a_condition_not_a_loop() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-invalid", 0.0).await?;
    let mut object = drill("bad", "sum(rate(x[1m])", pod_kill("1s"), (25.0, 1));
    object["spec"]["schedule"] = json!({"cron": "61 14 * * *", "timeZone": "Asia/Atlantis"});
    scene.create(object).await?;
    let status = scene
        .until_status("bad", "stalled", Duration::from_secs(30), |s| {
            s.observed.is_true("Stalled")
        })
        .await?;
    let stalled = status.observed.get("Stalled").map(|c| c.message.clone());
    let message = stalled.unwrap_or_default();
    for field in [
        "spec.schedule.cron",
        "spec.schedule.timeZone",
        "spec.sloGuard.objectives[0].query",
    ] {
        assert!(message.contains(field), "{field} not in {message:?}");
    }
    assert_eq!(status.phase, Some(DrillPhase::Failed));
    // No loop: the reconcile count stays put while nothing changes.
    let metric = "flashsale_operator_reconcile_total";
    let count = || async {
        let text = scene.operator.metrics().await?;
        Ok::<f64, anyhow::Error>(common::sum_samples(
            &text
                .lines()
                .filter(|l| l.contains("controller=\"chaosdrill\""))
                .collect::<Vec<_>>()
                .join("\n"),
            metric,
        ))
    };
    // Past the echoes of the first look (its status write, the namespace
    // watch's first list), nothing reconciles the drill again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = count().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let more = count().await? - first;
    assert_eq!(
        more, 0.0,
        "the invalid drill was reconciled {more} more times in 3 s"
    );
    Ok(())
}

#[tokio::test]
async fn a_killed_operator_leaves_chaos_mesh_to_end_the_chaos_and_the_next_one_records_it()
-> anyhow::Result<()> {
    let mut scene = DrillScene::start("cd-sigkill", 0.0).await?;
    let (run, target) = scene.failing_one_pod("crash").await?;
    let killed = Instant::now();
    scene.operator.kill();
    // Nothing of ours runs now: the run's StatusCheck finds the guard
    // silent, and Chaos Mesh removes the experiment by itself.
    poll_until(
        "Chaos Mesh removed the experiment",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            let left = scene
                .chaos_objects(Kind::PodChaos, &run.id)
                .await
                .map_err(|e| e.to_string())?;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{} left", left.len()))
            }
        },
    )
    .await?;
    let backstop = killed.elapsed();
    scene.until_restored(&target).await?;
    eprintln!("Chaos Mesh's backstop removed the experiment {backstop:?} after the kill");
    // staleAfter 2 s: two failed probes a second apart, then Chaos Mesh's
    // status writer, its abort chain and the garbage collector.
    assert!(
        backstop < Duration::from_secs(15),
        "backstop took {backstop:?}"
    );

    // The next operator finds a run no guard of its own drives, stops
    // what is left of it first, and records it.
    let next = scene.another_operator("next")?;
    next.until_leads().await?;
    let ended = scene
        .until_ended("crash", Some(&run.id), Duration::from_secs(30))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("GuardLost"), "{ended:?}");
    assert!(
        scene
            .chaos_objects(Kind::Workflow, &run.id)
            .await?
            .is_empty()
    );
    Ok(())
}

#[tokio::test]
async fn a_standby_that_takes_the_lease_stops_a_stale_run_first() -> anyhow::Result<()> {
    let mut scene = DrillScene::start("cd-standby", 0.0).await?;
    scene.operator.until_leads().await?;
    let standby = scene.another_operator("standby")?;
    let (run, target) = scene.failing_one_pod("takeover").await?;
    scene.operator.kill();
    standby.until_leads().await?;
    let ended = scene
        .until_ended("takeover", Some(&run.id), Duration::from_secs(30))
        .await?;
    assert_eq!(ended.outcome, Some(RunOutcome::Aborted), "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("GuardLost"));
    for kind in [Kind::PodChaos, Kind::Workflow] {
        assert!(
            scene.chaos_objects(kind, &run.id).await?.is_empty(),
            "{kind:?} left"
        );
    }
    scene.until_restored(&target).await
}
