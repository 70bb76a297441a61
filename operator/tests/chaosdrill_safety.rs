//! A drill's safety rules at every moment of a run, not only at its start,
//! against the real apiserver, the real chaos-controller-manager and the
//! real Prometheus, with the operator holding only the Helm chart's rights:
//! the kill switch reaches a run whose drill became invalid or unreadable
//! and one still in steady state; deleting a drill ends its run at once;
//! two drills asked together share one budget and a killed pod counts until
//! it is replaced; a closing window, a blackout added mid-run and a sale
//! going Live end the run; a request that cannot run is refused, not kept;
//! a pod that only copies the sale's labels is never a target; and a run
//! Chaos Mesh's backstop ended is recorded as such.

mod common;

use std::{collections::BTreeSet, time::Duration};

use common::drill::{DrillScene, SALE, drill, first_target, pod_failure, pod_kill, pod_of};
use flashsale_api::{
    FlashSale, chaosdrill::DrillPhase, chaosdrill::RunOutcome, chaosdrill::RunRecord,
};
use flashsale_controller_drill::{chaos::Kind, chaos::selected_pods};
use flashsale_e2e::wait::poll_until;
use jiff::{SignedDuration, Timestamp, ToSpan};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use serde_json::json;
use tokio::time::Instant;

/// Accepted by the apiserver's `date-time` check (its pattern has an
/// unescaped `.` before the fraction), refused by every RFC 3339 parser.
const LOOSE_TIME: &str = "2030-01-01T10:00:00_5Z";

/// The drill `name` of a pod-failure of `duration` on one of the sale's
/// gateways, steady for `steady` before it injects.
fn slow_drill(scene: &DrillScene, name: &str, steady: &str) -> serde_json::Value {
    let mut object = drill(name, &scene.exporter.query(), pod_failure("60s"), (25.0, 1));
    object["spec"]["sloGuard"]["steadyState"] = json!(steady);
    object
}

#[tokio::test]
async fn the_kill_switch_stops_a_run_whose_drill_became_invalid() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-ks-invalid", 0.0).await?;
    let (run, target) = scene.failing_one_pod("edited").await?;
    // A typo made while the run is in progress: the apiserver takes it, the
    // operator's check of the cron does not.
    scene
        .patch_drill(
            "edited",
            json!({"spec": {"schedule": {"cron": "61 14 * * *"}}}),
        )
        .await?;
    scene
        .until_status("edited", "stalled", Duration::from_secs(30), |s| {
            s.observed.is_true("Stalled")
        })
        .await?;
    assert!(
        !scene.run_objects(&run.id).await?.is_empty(),
        "an invalid spec alone does not end the run"
    );

    let switched = Instant::now();
    scene.kill_switch(true).await?;
    scene
        .until_no_chaos(&run.id, Duration::from_secs(30))
        .await?;
    let took = switched.elapsed();
    scene.until_restored(&target).await?;
    assert_eq!(scene.guard("edited", &run.id).await?, 503);
    let ended = scene
        .until_ended("edited", Some(&run.id), Duration::from_secs(30))
        .await?;
    assert_eq!(
        (ended.outcome, ended.reason.as_deref()),
        (Some(RunOutcome::Aborted), Some("KillSwitch")),
        "{ended:?}"
    );
    eprintln!("the kill switch removed the run's chaos in {took:?}");
    // The namespaced operator reads the switch every 2 s.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    Ok(())
}

#[tokio::test]
async fn the_kill_switch_stops_a_run_whose_drill_cannot_be_read() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-ks-unreadable", 0.0).await?;
    let (run, target) = scene.failing_one_pod("unreadable").await?;
    // A time the apiserver's format check lets through and the operator's
    // type refuses: the watch leaves the drill out from now on. The run's
    // `endedAt` is a field the operator does not write while the run lasts.
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        scene.client.clone(),
        &scene.ns.name,
        &kube::api::ApiResource::erase::<flashsale_api::ChaosDrill>(&()),
    );
    raw.patch_status(
        "unreadable",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"currentRun": {"endedAt": LOOSE_TIME}}})),
    )
    .await?;
    poll_until(
        "the drill named as unreadable",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let count = scene
                .operator
                .metric_sum("flashsale_operator_invalid_objects_total")
                .await
                .map_err(|e| e.to_string())?;
            if count >= 1.0 {
                Ok(())
            } else {
                Err("not yet".to_owned())
            }
        },
    )
    .await?;
    assert!(!scene.run_objects(&run.id).await?.is_empty());

    scene.kill_switch(true).await?;
    scene
        .until_no_chaos(&run.id, Duration::from_secs(30))
        .await?;
    scene.until_restored(&target).await?;
    assert_eq!(scene.guard("unreadable", &run.id).await?, 503);
    Ok(())
}

#[tokio::test]
async fn a_kill_switch_while_a_run_settles_injects_nothing_after_it() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-ks-steady", 0.0).await?;
    let before = scene.gateway_pods(4).await?;
    scene.create(slow_drill(&scene, "settling", "5s")).await?;
    scene.run_now("settling", "r1", None).await?;
    let run = scene.until_steady_state("settling").await?;
    scene.kill_switch(true).await?;
    let ended = scene
        .until_ended("settling", Some(&run.id), Duration::from_secs(30))
        .await?;
    assert_eq!(ended.reason.as_deref(), Some("KillSwitch"), "{ended:?}");
    assert_eq!(ended.injected_at, None);
    // Past the steady state it was waiting for: nothing was created.
    scene.never_injects(&run.id, Duration::from_secs(7)).await?;
    assert_eq!(scene.ready_pods().await?, before);
    Ok(())
}

#[tokio::test]
async fn deleting_a_drill_while_its_run_settles_injects_nothing() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-del-steady", 0.0).await?;
    let before = scene.gateway_pods(4).await?;
    scene.create(slow_drill(&scene, "doomed", "4s")).await?;
    scene.run_now("doomed", "r1", None).await?;
    let run = scene.until_steady_state("doomed").await?;
    scene
        .drills()
        .delete("doomed", &DeleteParams::default())
        .await?;
    scene.never_injects(&run.id, Duration::from_secs(8)).await?;
    assert_eq!(scene.ready_pods().await?, before);
    Ok(())
}

#[tokio::test]
async fn deleting_a_drill_mid_run_removes_its_chaos_without_the_garbage_collector()
-> anyhow::Result<()> {
    let scene = DrillScene::start("cd-del-orphan", 0.0).await?;
    scene.gateway_pods(4).await?;
    let mut object = drill(
        "orphaning",
        &scene.exporter.query(),
        pod_failure("60s"),
        (25.0, 1),
    );
    object["spec"]["suspend"] = json!(true);
    scene.create(object).await?;
    // A refused request counts a run (Skipped): the drill has metric series.
    scene.run_now("orphaning", "r0", None).await?;
    refused(&scene, "orphaning", "r0").await?;
    let series = "drill=\"orphaning\"";
    assert!(scene.operator.metrics().await?.contains(series));
    scene
        .patch_drill("orphaning", json!({"spec": {"suspend": false}}))
        .await?;
    scene.run_now("orphaning", "r1", None).await?;
    let run = scene.until_injected("orphaning").await?;
    let target = first_target(&run)?;

    // Orphan: the garbage collector leaves the Workflow and its chain in
    // place, so only the operator can end the chaos.
    let deleted = Instant::now();
    scene
        .drills()
        .delete(
            "orphaning",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..DeleteParams::default()
            },
        )
        .await?;
    scene
        .until_no_chaos(&run.id, Duration::from_secs(20))
        .await?;
    let took = deleted.elapsed();
    scene.until_restored(&target).await?;
    eprintln!("a deleted drill's chaos was gone {took:?} after the delete");
    // The drill's metric series go with it.
    poll_until(
        "the deleted drill's series dropped",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let text = scene.operator.metrics().await.map_err(|e| e.to_string())?;
            if text.contains(series) {
                Err(text)
            } else {
                Ok(())
            }
        },
    )
    .await?;
    Ok(())
}

/// The pods Chaos Mesh was told to act on by `run`'s experiments.
async fn named_pods(scene: &DrillScene, run: &str) -> anyhow::Result<BTreeSet<String>> {
    let mut named = BTreeSet::new();
    for object in scene.chaos_objects(Kind::PodChaos, run).await? {
        named.extend(selected_pods(&object).iter().map(|t| pod_of(t).to_owned()));
    }
    Ok(named)
}

#[tokio::test]
async fn a_killed_pod_counts_against_the_budget_until_its_replacement_is_ready()
-> anyhow::Result<()> {
    let scene = DrillScene::start("cd-kill-budget", 0.0).await?;
    scene.gateway_pods(10).await?;
    let query = scene.exporter.query();
    // 20 % of 10 pods: 2 at a time in the namespace.
    scene
        .create(drill("killer", &query, pod_kill("1s"), (20.0, 5)))
        .await?;
    scene
        .create(drill("next", &query, pod_failure("60s"), (20.0, 5)))
        .await?;
    scene.run_now("killer", "r1", None).await?;
    let killed = scene
        .until_ended("killer", None, Duration::from_secs(60))
        .await?;
    assert_eq!(killed.outcome, Some(RunOutcome::Succeeded), "{killed:?}");
    assert_eq!(killed.targets.len(), 2);

    // Two pods are gone and nothing replaced them: they still count, and
    // eight live pods are still ten for the cap.
    scene.run_now("next", "r1", None).await?;
    let refused = scene
        .until_ended("next", None, Duration::from_secs(30))
        .await?;
    assert_eq!(
        (refused.outcome, refused.reason.as_deref()),
        (Some(RunOutcome::Skipped), Some("BudgetExhausted")),
        "{refused:?}"
    );

    // Their replacements serve: the budget is whole again.
    let replacements = ["gateway-r1".to_owned(), "gateway-r2".to_owned()];
    scene.add_gateway_pods(&replacements, true).await?;
    scene.run_now("next", "r2", None).await?;
    let run = scene.until_injected("next").await?;
    assert_eq!(run.targets.len(), 2, "{run:?}");
    Ok(())
}

#[tokio::test]
async fn a_pod_that_only_copies_the_sales_labels_is_never_a_target() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-impostor", 0.0).await?;
    let owned = scene.gateway_pods(2).await?;
    scene
        .add_gateway_pods(&["impostor".to_owned()], false)
        .await?;
    scene
        .create(drill(
            "all",
            &scene.exporter.query(),
            pod_failure("60s"),
            (100.0, 10),
        ))
        .await?;
    scene.run_now("all", "r1", None).await?;
    let run = scene.until_injected("all").await?;
    let targets: BTreeSet<String> = run.targets.iter().map(|t| pod_of(t).to_owned()).collect();
    assert_eq!(targets, owned, "targets {targets:?}");
    assert_eq!(named_pods(&scene, &run.id).await?, owned);
    scene.kill_switch(true).await?;
    scene.until_no_chaos(&run.id, Duration::from_secs(30)).await
}

/// A window of every day in UTC that closes at a minute boundary between
/// 20 and 80 s from now: `(start, end, the instant it closes)`.
async fn window_closing_soon() -> anyhow::Result<(String, String, Timestamp)> {
    loop {
        let now = Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
        let minute = i64::from(now.hour()) * 60 + i64::from(now.minute());
        let next = if now.second() < 40 {
            minute + 1
        } else {
            minute + 2
        };
        if next > 24 * 60 {
            // Across midnight a window of one day cannot hold it: wait for
            // the new day (at most a minute and a half).
            tokio::time::sleep(Duration::from_secs(30)).await;
            continue;
        }
        let close = now
            .start_of_day()?
            .checked_add((next * 60).seconds())?
            .timestamp();
        let end = format!("{:02}:{:02}", next / 60, next % 60);
        return Ok(("00:00".to_owned(), end, close));
    }
}

#[tokio::test]
async fn a_closing_window_ends_the_run_and_cuts_its_experiment_to_the_window() -> anyhow::Result<()>
{
    let scene = DrillScene::start("cd-window-close", 0.0).await?;
    scene.gateway_pods(4).await?;
    let (start, end, closes) = window_closing_soon().await?;
    let every_day = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let mut object = drill(
        "windowed",
        &scene.exporter.query(),
        json!({"name": "fail", "target": "gateway", "duration": "1h",
               "podChaos": {"action": "pod-failure"}}),
        (25.0, 1),
    );
    object["spec"]["windows"] = json!([{"days": every_day, "start": start, "end": end}]);
    scene.create(object).await?;
    scene.run_now("windowed", "r1", None).await?;
    let run = scene.until_injected("windowed").await?;
    let started = run
        .started_at
        .as_ref()
        .map(|t| t.0)
        .ok_or_else(|| anyhow::anyhow!("no start: {run:?}"))?;
    // The experiment Chaos Mesh was given lasts at most until the window
    // closes (cut when the run injected, after it started), not the hour
    // the spec asks for.
    let experiments = scene.chaos_objects(Kind::PodChaos, &run.id).await?;
    let duration = experiments
        .first()
        .and_then(|e| e.data["spec"]["duration"].as_str())
        .ok_or_else(|| anyhow::anyhow!("no experiment duration: {experiments:?}"))?;
    let millis: i64 = duration.trim_end_matches("ms").parse()?;
    let left = closes.duration_since(started);
    assert!(
        SignedDuration::from_millis(millis) <= left,
        "experiment of {duration} with {left:?} of the window left at the run's start"
    );

    let ended = scene
        .until_ended("windowed", Some(&run.id), Duration::from_secs(120))
        .await?;
    assert_eq!(
        (ended.outcome, ended.reason.as_deref()),
        (Some(RunOutcome::Aborted), Some("WindowClosed")),
        "{ended:?}"
    );
    let ended_at = ended.ended_at.as_ref().map(|t| t.0).unwrap_or_default();
    assert!(
        ended_at >= closes,
        "ended {ended_at} before the close {closes}"
    );
    scene.until_no_chaos(&run.id, Duration::from_secs(30)).await
}

#[tokio::test]
async fn a_blackout_added_mid_run_ends_it() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-blackout", 0.0).await?;
    let (run, target) = scene.failing_one_pod("frozen").await?;
    let now = Timestamp::now();
    scene
        .patch_drill(
            "frozen",
            json!({"spec": {"blackouts": [{
                "start": (now - SignedDuration::from_secs(60)).to_string(),
                "end": (now + SignedDuration::from_hours(1)).to_string(),
                "reason": "change freeze"}]}}),
        )
        .await?;
    let ended = scene
        .until_ended("frozen", Some(&run.id), Duration::from_secs(30))
        .await?;
    assert_eq!(
        (ended.outcome, ended.reason.as_deref()),
        (Some(RunOutcome::Aborted), Some("BlackoutStarted")),
        "{ended:?}"
    );
    assert!(
        ended
            .message
            .as_deref()
            .is_some_and(|m| m.contains("change freeze")),
        "{ended:?}"
    );
    scene
        .until_no_chaos(&run.id, Duration::from_secs(30))
        .await?;
    scene.until_restored(&target).await
}

/// Moves the scene's sale to open at `start` (and last an hour).
async fn reschedule(scene: &DrillScene, start: Timestamp) -> anyhow::Result<()> {
    let end = start + SignedDuration::from_hours(1);
    Api::<FlashSale>::namespaced(scene.client.clone(), &scene.ns.name)
        .patch(
            SALE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"schedule": {
                "start": start.to_string(), "end": end.to_string()}}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_sale_that_opens_mid_run_ends_the_run() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-goes-live", 0.0).await?;
    // Whole seconds: the apiserver keeps the run's end to the second.
    let opens = Timestamp::from_second(Timestamp::now().as_second() + 25)?;
    reschedule(&scene, opens).await?;
    let (run, target) = scene.failing_one_pod("opening").await?;
    anyhow::ensure!(
        Timestamp::now() < opens,
        "the run injected only after the sale opened"
    );
    let ended = scene
        .until_ended("opening", Some(&run.id), Duration::from_secs(60))
        .await?;
    assert_eq!(
        (ended.outcome, ended.reason.as_deref()),
        (Some(RunOutcome::Aborted), Some("SaleWentLive")),
        "{ended:?}"
    );
    let ended_at = ended.ended_at.as_ref().map(|t| t.0).unwrap_or_default();
    assert!(
        ended_at >= opens,
        "ended {ended_at} before the opening {opens}"
    );
    scene
        .until_no_chaos(&run.id, Duration::from_secs(30))
        .await?;
    scene.until_restored(&target).await
}

#[tokio::test]
async fn a_sale_inside_its_schedule_is_live_whatever_its_status_says() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-live-failed", 0.0).await?;
    let before = scene.gateway_pods(4).await?;
    // The sale's Secrets do not exist: its status says Failed, but inside
    // its schedule its pods (here, the scene's) serve buyers.
    reschedule(&scene, Timestamp::now() - SignedDuration::from_secs(60)).await?;
    let sales = Api::<FlashSale>::namespaced(scene.client.clone(), &scene.ns.name);
    poll_until(
        "the sale's status says Failed",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let sale = sales.get(SALE).await.map_err(|e| e.to_string())?;
            let phase = sale.status.and_then(|s| s.phase);
            if phase == Some(flashsale_api::flashsale::SalePhase::Failed) {
                Ok(())
            } else {
                Err(format!("{phase:?}"))
            }
        },
    )
    .await?;
    scene
        .create(drill(
            "careful",
            &scene.exporter.query(),
            pod_failure("60s"),
            (25.0, 1),
        ))
        .await?;
    scene.run_now("careful", "r1", None).await?;
    let ended = scene
        .until_ended("careful", None, Duration::from_secs(30))
        .await?;
    assert_eq!(
        (ended.outcome, ended.reason.as_deref()),
        (Some(RunOutcome::Skipped), Some("SaleLive")),
        "{ended:?}"
    );
    assert!(scene.run_objects(&ended.id).await?.is_empty());
    assert_eq!(scene.ready_pods().await?, before);
    Ok(())
}

/// Waits until `request` is handled and returns the history entry it made.
async fn refused(scene: &DrillScene, name: &str, request: &str) -> anyhow::Result<RunRecord> {
    let status = scene
        .until_status(name, "the request handled", Duration::from_secs(30), |s| {
            s.last_run_request.as_deref() == Some(request)
        })
        .await?;
    assert_eq!(status.current_run, None, "{status:?}");
    status
        .history
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no history: {status:?}"))
}

/// Checks for `window` that the drill starts no run.
async fn starts_nothing(scene: &DrillScene, name: &str, window: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + window;
    let runs = scene
        .drills()
        .get(name)
        .await?
        .status
        .unwrap_or_default()
        .history
        .len();
    while Instant::now() < until {
        let status = scene.drills().get(name).await?.status.unwrap_or_default();
        anyhow::ensure!(
            status.current_run.is_none() && status.history.len() == runs,
            "a run started: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_request_that_cannot_run_is_refused_when_it_arrives_not_kept() -> anyhow::Result<()> {
    let scene = DrillScene::start("cd-refused", 0.0).await?;
    scene.gateway_pods(4).await?;
    let mut object = drill("held", &scene.exporter.query(), pod_kill("1s"), (25.0, 1));
    object["spec"]["suspend"] = json!(true);
    scene.create(object).await?;

    // Suspended: refused with a history entry and an Event.
    scene.run_now("held", "while-suspended", None).await?;
    let entry = refused(&scene, "held", "while-suspended").await?;
    assert_eq!(
        (entry.outcome, entry.reason.as_deref()),
        (Some(RunOutcome::Skipped), Some("Suspended")),
        "{entry:?}"
    );
    let notes = common::scene::events(&scene.client, &scene.ns.name, "RunSkipped").await?;
    assert!(
        notes.iter().any(|n| n.contains("while-suspended")),
        "{notes:?}"
    );
    // Lifting the suspension starts nothing.
    scene
        .patch_drill("held", json!({"spec": {"suspend": false}}))
        .await?;
    scene
        .until_status("held", "scheduled", Duration::from_secs(30), |s| {
            s.phase == Some(DrillPhase::Scheduled)
        })
        .await?;
    starts_nothing(&scene, "held", Duration::from_secs(4)).await?;

    // Under the kill switch: the same.
    scene.kill_switch(true).await?;
    scene
        .until_status("held", "held by the switch", Duration::from_secs(30), |s| {
            s.observed
                .get("Ready")
                .is_some_and(|c| c.reason == "KillSwitch")
        })
        .await?;
    scene.run_now("held", "while-switched", None).await?;
    let entry = refused(&scene, "held", "while-switched").await?;
    assert_eq!(entry.reason.as_deref(), Some("KillSwitch"), "{entry:?}");
    scene.kill_switch(false).await?;
    scene
        .until_status("held", "scheduled again", Duration::from_secs(30), |s| {
            s.phase == Some(DrillPhase::Scheduled)
        })
        .await?;
    starts_nothing(&scene, "held", Duration::from_secs(4)).await
}

#[tokio::test]
async fn a_run_chaos_meshs_backstop_ended_is_recorded_as_such() -> anyhow::Result<()> {
    // Chaos Mesh probes a guard URL nothing answers: its StatusCheck fails
    // and it aborts the run's Workflow while the operator lives on.
    let scene =
        DrillScene::start_with("cd-backstop", 0.0, &["--guard-url", "http://127.0.0.1:9"]).await?;
    scene.gateway_pods(4).await?;
    scene
        .create(drill(
            "unheard",
            &scene.exporter.query(),
            pod_failure("12s"),
            (25.0, 1),
        ))
        .await?;
    scene.run_now("unheard", "r1", None).await?;
    let ended = scene
        .until_ended("unheard", None, Duration::from_secs(60))
        .await?;
    assert_eq!(
        (ended.outcome, ended.reason.as_deref()),
        (Some(RunOutcome::Aborted), Some("BackstopFired")),
        "{ended:?}"
    );
    scene
        .until_no_chaos(&ended.id, Duration::from_secs(30))
        .await
}
