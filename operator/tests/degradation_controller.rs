//! The DegradationPolicy controller against the real apiserver and the real
//! Prometheus of the local stack, scraping a gauge each test sets: the load
//! walks the tiers (up at once, down one tier at a time after the
//! hold-down), a signal around a threshold does not flap, NaN and empty
//! answers are a lost signal, on-call's override wins and lapses at its
//! instant, a bad query or a missing sale writes nothing, a standby takes
//! over at the same tier, and deleting the policy lifts degradation.

mod common;

use std::time::Duration;

use common::{
    Operator,
    scene::{HOLD_DOWN, POLICY, SALE, SWITCHES, Scene, events, policy},
};
use flashsale_api::degradation::TierReason;
use flashsale_degradation::Degradation;
use flashsale_e2e::{stack, wait::poll_until};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;
use tokio::time::Instant;

#[tokio::test]
async fn load_walks_up_at_once_and_down_one_tier_at_a_time_after_the_hold_down()
-> anyhow::Result<()> {
    let scene = Scene::start("dp-walk", 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;
    walk_up_at_once(&scene).await?;
    walk_down_after_the_hold_down(&scene).await?;
    assert_eq!(
        scene.tiers(),
        [0, 1, 2, 1, 0],
        "one tier at a time on the way down"
    );
    let generations: Vec<u64> = scene
        .log
        .lock()
        .map(|l| l.iter().map(|(s, _)| s.generation).collect())
        .unwrap_or_default();
    assert!(
        generations.windows(2).all(|w| w[0] < w[1]),
        "{generations:?}"
    );

    let status = scene.status(POLICY).await?;
    assert_eq!(status.tier, Some(0));
    assert_eq!(status.tier_reason, Some(TierReason::Signal));
    assert_eq!(status.last_value, Some(0.5));
    assert!(status.last_sample_time.is_some() && status.since.is_some());
    await_tier_changed_events(&scene).await?;
    let before = generations.last().copied().unwrap_or_default();
    assert_deleted_switches_come_back_above(&scene, before).await?;
    scene.finish(POLICY).await
}

/// Raises the load to tier 1, then tier 2: each is reached at once, a
/// scrape (1 s) and an evaluation (250 ms) away.
async fn walk_up_at_once(scene: &Scene) -> anyhow::Result<()> {
    for (value, tier) in [(0.9, 1), (0.97, 2)] {
        scene.exporter.set(value);
        let set = Instant::now();
        let reached = scene.until_tier(tier, Duration::from_secs(10)).await?;
        assert!(
            reached.duration_since(set) < Duration::from_secs(3),
            "tier {tier} took {:?}",
            reached.duration_since(set)
        );
    }
    Ok(())
}

/// Lowers the load below tier 2's exit but above tier 1's: one step down,
/// after the hold-down; then below tier 1's exit: the next step, after
/// another.
async fn walk_down_after_the_hold_down(scene: &Scene) -> anyhow::Result<()> {
    for (value, tier) in [(0.8, 1), (0.5, 0)] {
        scene.exporter.set(value);
        let set = Instant::now();
        let reached = scene.until_tier(tier, Duration::from_secs(15)).await?;
        assert!(
            reached.duration_since(set) >= HOLD_DOWN,
            "tier {tier} after {:?}, before the hold-down",
            reached.duration_since(set)
        );
    }
    Ok(())
}

/// Waits for a TierChanged Event per step of the walk. The Event follows
/// the status write that shows the tier, hence the wait.
async fn await_tier_changed_events(scene: &Scene) -> anyhow::Result<()> {
    poll_until(
        "a TierChanged Event per step",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let changes = events(&scene.client, &scene.ns.name, "TierChanged")
                .await
                .map_err(|e| e.to_string())?;
            let missing: Vec<&str> = ["0 → 1", "1 → 2", "2 → 1", "1 → 0"]
                .into_iter()
                .filter(|step| !changes.iter().any(|m| m.contains(step)))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("{missing:?} missing in {changes:?}"))
            }
        },
    )
    .await?;
    Ok(())
}

/// Deletes the switches' ConfigMap: it comes back above every generation
/// the gateways saw (`before` the last).
async fn assert_deleted_switches_come_back_above(scene: &Scene, before: u64) -> anyhow::Result<()> {
    let maps: Api<ConfigMap> = Api::namespaced(scene.client.clone(), &scene.ns.name);
    maps.delete(SWITCHES, &DeleteParams::default()).await?;
    let again = poll_until(
        "the switches rewritten",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let maps = maps.clone();
            async move {
                let map = maps.get_opt(SWITCHES).await.map_err(|e| e.to_string())?;
                let map = map.ok_or("not yet")?;
                Degradation::from_data(&map.data.unwrap_or_default()).map_err(|e| e.to_string())
            }
        },
    )
    .await?;
    assert!(
        again.generation > before,
        "{} after {before}",
        again.generation
    );
    Ok(())
}

#[tokio::test]
async fn a_signal_around_a_threshold_does_not_flap() -> anyhow::Result<()> {
    let scene = Scene::start("dp-flap", 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;
    scene.exporter.set(0.82);
    scene.until_tier(1, Duration::from_secs(10)).await?;
    // Between tier 1's exitBelow (0.70) and enterAbove (0.80) for twice the
    // hold-down: hysteresis holds the tier, however long it lasts.
    scene.exporter.set(0.75);
    tokio::time::sleep(HOLD_DOWN * 2 + Duration::from_secs(1)).await;
    let status = scene.status(POLICY).await?;
    assert_eq!(status.last_value, Some(0.75), "{status:?}");
    assert!(
        status
            .tier_message
            .as_deref()
            .is_some_and(|m| m.contains("holding tier 1")),
        "{status:?}"
    );
    assert_eq!(scene.tiers(), [0, 1]);
    // Around tier 1's enterAbove: it stays, since the signal never goes
    // below exitBelow.
    for value in [0.78, 0.82, 0.78, 0.82, 0.78, 0.82, 0.78, 0.82] {
        scene.exporter.set(value);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // Around tier 1's exitBelow, each dip shorter than the hold-down.
    for value in [0.68, 0.72, 0.68, 0.72, 0.68, 0.72] {
        scene.exporter.set(value);
        tokio::time::sleep(Duration::from_millis(1_200)).await;
    }
    assert_eq!(scene.tiers(), [0, 1]);
    scene.finish(POLICY).await
}

#[tokio::test]
async fn nan_and_empty_answers_are_a_lost_signal_that_acts_after_its_bound() -> anyhow::Result<()> {
    let mut scene = Scene::start("dp-lost", 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 2))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;

    scene.exporter.set(f64::NAN);
    let lost = Instant::now();
    let entered = scene.until_tier(2, Duration::from_secs(15)).await?;
    assert!(
        entered.duration_since(lost) >= Duration::from_secs(2),
        "acted on a loss shorter than onSignalLoss.after: {:?}",
        entered.duration_since(lost)
    );
    let status = scene.status(POLICY).await?;
    assert_eq!(status.tier_reason, Some(TierReason::SignalLost));
    let signal = status.observed.get("SignalAvailable").cloned();
    assert_eq!(
        signal
            .as_ref()
            .map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("False", "NotANumber")),
        "{signal:?}"
    );

    // Back, and down by the normal rules.
    scene.exporter.set(0.5);
    scene.until_tier(1, Duration::from_secs(15)).await?;
    scene.until_tier(0, Duration::from_secs(15)).await?;
    // No series at all.
    scene.exporter.unregister();
    scene.until_tier(2, Duration::from_secs(20)).await?;
    let status = scene.status(POLICY).await?;
    let reason = status
        .observed
        .get("SignalAvailable")
        .map(|c| c.reason.clone());
    assert!(
        matches!(reason.as_deref(), Some("EmptyResult" | "StaleSample")),
        "{reason:?}"
    );
    assert_eq!(scene.tiers(), [0, 2, 1, 0, 2]);
    scene.finish(POLICY).await
}

#[tokio::test]
async fn the_override_wins_is_credited_to_its_author_and_lapses_at_its_instant()
-> anyhow::Result<()> {
    let scene = Scene::start("dp-override", 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;

    // Whole seconds: the apiserver keeps timestamps to the second.
    let expires = Timestamp::from_second(Timestamp::now().as_second() + 8)?;
    let patch = json!({"spec": {"override": {
        "tier": 2, "reason": "INC-4711: payment provider slow", "expires": expires.to_string()
    }}});
    scene
        .policies()
        .patch(
            POLICY,
            &PatchParams {
                field_manager: Some("oncall-jane".to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await?;
    let patched = Instant::now();
    let forced = scene.until_tier(2, Duration::from_secs(5)).await?;
    assert!(
        forced.duration_since(patched) < Duration::from_secs(1),
        "{:?}",
        forced.duration_since(patched)
    );
    let status = scene.status(POLICY).await?;
    assert_eq!(status.tier_reason, Some(TierReason::Override));
    let active = status.active_override.clone();
    assert_eq!(
        active.as_ref().map(|o| o.set_by.as_str()),
        Some("oncall-jane"),
        "{active:?}"
    );
    let started = events(&scene.client, &scene.ns.name, "OverrideStarted").await?;
    assert!(
        started
            .iter()
            .any(|m| m.contains("oncall-jane") && m.contains("INC-4711")),
        "{started:?}"
    );
    // A high signal meanwhile changes nothing.
    scene.exporter.set(0.5);

    // It lapses at its instant: the switches leave tier 2 then, stepping
    // down by the signal's rules (hold-down), not before.
    let left = scene.until_tier(1, Duration::from_secs(20)).await?;
    let left_at = Timestamp::now() - SignedDuration::try_from(left.elapsed())?;
    assert!(
        left_at >= expires,
        "left tier 2 at {left_at}, before {expires}"
    );
    let ended = events(&scene.client, &scene.ns.name, "OverrideEnded").await?;
    assert!(!ended.is_empty());
    assert_eq!(scene.status(POLICY).await?.active_override, None);
    assert_eq!(scene.tiers(), [0, 2, 1]);
    scene.finish(POLICY).await
}

#[tokio::test]
async fn a_bad_query_a_missing_sale_or_a_second_policy_writes_nothing() -> anyhow::Result<()> {
    let scene = Scene::start("dp-refused", 0.5).await?;
    scene
        .create_policy(policy("broken", SALE, "sum(rate(x[5m]", 1))
        .await?;
    let (reason, message) = scene.until_refused("broken").await?;
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("spec.signal.query"), "{message}");
    // Not retried in a loop: it waits for an edit.
    // This controller's reconciles only: the scene's sale is reconciled by
    // its own controller meanwhile, as often as its pods change.
    let reconciles = |text: String| {
        text.lines()
            .filter(|l| l.starts_with("flashsale_operator_reconcile_total{"))
            .filter(|l| l.contains("controller=\"degradationpolicy\""))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = reconciles(scene.operator.metrics().await?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = reconciles(scene.operator.metrics().await?);
    assert!(
        after - before <= 2.0,
        "{before} → {after} reconciles of an invalid policy"
    );
    scene.finish("broken").await?;

    scene
        .create_policy(policy("orphan", "no-such-sale", &scene.exporter.query(), 1))
        .await?;
    let (reason, message) = scene.until_refused("orphan").await?;
    assert_eq!(reason, "SaleNotFound");
    assert!(message.contains("no-such-sale"), "{message}");

    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;
    scene
        .create_policy(policy("second", SALE, &scene.exporter.query(), 1))
        .await?;
    let (reason, message) = scene.until_refused("second").await?;
    assert_eq!(reason, "ConflictingPolicy");
    assert!(message.contains(POLICY), "{message}");
    // The first still drives the switches alone.
    scene.exporter.set(0.9);
    scene.until_tier(1, Duration::from_secs(10)).await?;
    let second = scene.status("second").await?;
    assert_eq!(second.tier, None, "{second:?}");
    // Deleting the second changes nothing for the first.
    scene.finish("second").await?;
    assert_eq!(scene.tiers(), [0, 1]);
    for name in ["orphan", POLICY] {
        scene.finish(name).await?;
    }
    Ok(())
}

#[tokio::test]
async fn deleting_the_policy_lifts_degradation() -> anyhow::Result<()> {
    let scene = Scene::start("dp-delete", 0.99).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(2, Duration::from_secs(30)).await?;
    scene.finish(POLICY).await?;
    scene.until_switches(0, Duration::from_secs(5)).await?;
    assert_eq!(scene.tiers(), [2, 0]);
    Ok(())
}

#[tokio::test]
async fn a_standby_takes_over_at_the_same_tier_and_only_the_leader_writes() -> anyhow::Result<()> {
    let mut scene = Scene::start("dp-takeover", 0.9).await?;
    let prometheus = stack::prometheus_url()?;
    // The scene's operator leads; a standby waits.
    scene.operator.until_leads().await?;
    let standby = Operator::start(
        &scene.ns.name,
        "standby",
        &["--prometheus-url", &prometheus],
    )?;
    standby.until_serves().await?;
    assert_eq!(
        standby.metric_sum("flashsale_operator_leader").await?,
        0.0,
        "the standby leads too"
    );
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(1, Duration::from_secs(30)).await?;
    let writes = |text: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("flashsale_operator_writes_total{controller=\"degradationpolicy\"}")
            })
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert_eq!(writes(&standby.metrics().await?), 0.0, "the standby wrote");
    assert!(writes(&scene.operator.metrics().await?) > 0.0);

    // The leader dies; the standby continues from the status: tier 1, not 0.
    scene.operator.kill();
    standby.until_leads().await?;
    poll_until(
        "the standby evaluates",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            let standby = &standby;
            async move {
                let text = standby.metrics().await.map_err(|e| e.to_string())?;
                (writes(&text) > 0.0)
                    .then_some(())
                    .ok_or_else(|| "no write yet".to_owned())
            }
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(scene.status(POLICY).await?.tier, Some(1));
    assert_eq!(scene.tiers(), [1], "the switches never went back to 0");
    // The new leader steps up from there.
    scene.exporter.set(0.99);
    scene.until_tier(2, Duration::from_secs(10)).await?;
    scene.operator = standby;
    scene.finish(POLICY).await
}

#[tokio::test]
async fn someone_elses_switches_config_map_is_refused_and_left_alone() -> anyhow::Result<()> {
    let scene = Scene::start("dp-foreign", 0.9).await?;
    let maps: Api<ConfigMap> = Api::namespaced(scene.client.clone(), &scene.ns.name);
    let foreign: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": SWITCHES},
        "data": {"owner": "another team"}
    }))?;
    maps.create(&kube::api::PostParams::default(), &foreign)
        .await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    let (reason, message) = scene.until_refused(POLICY).await?;
    assert_eq!(reason, "ObjectNotOwned");
    assert!(message.contains(SWITCHES), "{message}");
    let kept = maps.get(SWITCHES).await?;
    assert_eq!(kept.data, foreign.data, "not written over");
    assert!(kept.metadata.owner_references.is_none(), "{kept:?}");
    assert!(scene.tiers().is_empty(), "{:?}", scene.tiers());
    scene.finish(POLICY).await
}
