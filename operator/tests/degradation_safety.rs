//! Who writes a sale's switches, and when, in the states between the happy
//! ones, against the real apiserver and Prometheus: a policy deleted before
//! its status caught up with its last write still lifts the switches; an
//! override lapses at its expiry while its policy is invalid or cannot be
//! read at all; an override set to expire years ahead is refused; a
//! generation edited by hand to the largest number freezes nobody.

mod common;

use std::time::Duration;

use common::{
    Operator,
    scene::{POLICY, SALE, SWITCHES, Scene, events, policy},
};
use flashsale_api::{FlashSale, children::degradation_config_map, degradation::TierReason};
use flashsale_controller_degradation::{FINALIZER, expiry::GRACE};
use flashsale_degradation::{Degradation, Switches};
use flashsale_e2e::{stack, wait::poll_until};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams},
};
use serde_json::json;
use tokio::time::Instant;

/// Accepted by the apiserver's `date-time` check (its pattern has an
/// unescaped `.` before the fraction), refused by every RFC 3339 parser.
const LOOSE_TIME: &str = "2030-01-01T10:00:00_5Z";

/// What the switches ConfigMap holds now.
async fn switches(scene: &Scene) -> anyhow::Result<Degradation> {
    let map = Api::<ConfigMap>::namespaced(scene.client.clone(), &scene.ns.name)
        .get(SWITCHES)
        .await?;
    Ok(Degradation::from_data(&map.data.unwrap_or_default())?)
}

/// Merge-patches the policy as it is, not through the Rust type.
async fn patch_policy(scene: &Scene, patch: serde_json::Value) -> anyhow::Result<()> {
    let resource = ApiResource::erase::<flashsale_api::DegradationPolicy>(&());
    Api::<DynamicObject>::namespaced_with(scene.client.clone(), &scene.ns.name, &resource)
        .patch(POLICY, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// An override of `tier` for `reason`, lapsing `after` from now (in whole
/// seconds: the apiserver keeps timestamps to the second).
fn an_override(
    tier: i32,
    after: Duration,
    reason: &str,
) -> anyhow::Result<(serde_json::Value, Timestamp)> {
    let expires =
        Timestamp::from_second(Timestamp::now().as_second() + i64::try_from(after.as_secs())?)?;
    Ok((
        json!({"spec": {"override": {"tier": tier, "reason": reason, "expires": expires.to_string()}}}),
        expires,
    ))
}

#[tokio::test]
async fn deleting_a_policy_lifts_what_the_switches_hold_even_before_its_status_says_so()
-> anyhow::Result<()> {
    let mut scene = Scene::start("dp-del-unrecorded", 0.5).await?;
    // The policy wrote tier 2 and was deleted before its status said so:
    // the switches hold tier 2, the policy has no status, and its finalizer
    // waits for an operator.
    scene.operator.kill();
    let sale = Api::<FlashSale>::namespaced(scene.client.clone(), &scene.ns.name)
        .get(SALE)
        .await?;
    let now = Timestamp::now();
    let written = Degradation {
        tier: 2,
        generation: flashsale_degradation::next_generation(0, now),
        switches: Switches {
            reviews: flashsale_degradation::ReviewsMode::Queued,
            ..Switches::default()
        },
        reason: "signal above tier 2's enterAbove".to_owned(),
        changed_at: Some(now),
        override_expires: None,
    };
    let map = degradation_config_map(&sale, &written)?;
    Api::<ConfigMap>::namespaced(scene.client.clone(), &scene.ns.name)
        .patch(
            SWITCHES,
            &PatchParams::apply("flashsale-operator-degradationpolicy").force(),
            &Patch::Apply(&map),
        )
        .await?;
    scene.until_switches(2, Duration::from_secs(10)).await?;
    let mut object = policy(POLICY, SALE, &scene.exporter.query(), 1);
    object["metadata"]["finalizers"] = json!([FINALIZER]);
    scene.create_policy(object).await?;
    scene
        .policies()
        .delete(POLICY, &DeleteParams::default())
        .await?;

    scene.operator = Operator::start(
        &scene.ns.name,
        "next",
        &["--prometheus-url", &stack::prometheus_url()?],
    )?;
    scene.until_switches(0, Duration::from_secs(30)).await?;
    let lifted = switches(&scene).await?;
    assert_eq!(lifted.switches, Switches::default());
    assert!(lifted.generation > written.generation);
    poll_until(
        "the policy gone",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            match scene.policies().get_opt(POLICY).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    assert_eq!(scene.tiers(), [2, 0]);
    Ok(())
}

/// Sets an override of tier 2 lapsing in 8 s, waits until the switches
/// hold it with its expiry, then breaks the policy with `breaking`; the
/// switches must go back to tier 0 once the override lapsed, though the
/// policy can no longer be evaluated.
async fn an_override_lapses_while(
    prefix: &str,
    breaking: serde_json::Value,
) -> anyhow::Result<Scene> {
    let scene = Scene::start(prefix, 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;
    let (patch, expires) = an_override(2, Duration::from_secs(8), "INC-4712: hold tier 2")?;
    patch_policy(&scene, patch).await?;
    scene.until_switches(2, Duration::from_secs(10)).await?;
    assert_eq!(switches(&scene).await?.override_expires, Some(expires));

    patch_policy(&scene, breaking).await?;
    let lapsed = scene.until_switches(0, Duration::from_secs(40)).await?;
    let at = Timestamp::now() - SignedDuration::try_from(lapsed.elapsed())?;
    // Not before the override lapsed, and not before its policy had its
    // chance to take the switches back.
    let grace = SignedDuration::try_from(GRACE)?;
    assert!(
        at >= expires + grace - SignedDuration::from_secs(1),
        "lifted at {at}, override until {expires}"
    );
    let lifted = switches(&scene).await?;
    assert_eq!(
        (lifted.switches, lifted.override_expires),
        (Switches::default(), None)
    );
    let notes = events(&scene.client, &scene.ns.name, "OverrideExpired").await?;
    assert!(notes.iter().any(|n| n.contains("tier 2")), "{notes:?}");
    Ok(scene)
}

#[tokio::test]
async fn an_override_lapses_while_its_policy_is_invalid() -> anyhow::Result<()> {
    // A PromQL typo: the apiserver takes it, the operator refuses the spec
    // and evaluates nothing more.
    let scene = an_override_lapses_while(
        "dp-lapse-invalid",
        json!({"spec": {"signal": {"query": "sum(rate(x[1m])"}}}),
    )
    .await?;
    let (reason, _) = scene.until_refused(POLICY).await?;
    assert_eq!(reason, "InvalidSpec");
    scene.finish(POLICY).await
}

#[tokio::test]
async fn an_override_lapses_while_its_policy_cannot_be_read() -> anyhow::Result<()> {
    // A time the operator's type cannot read: the watch leaves the policy
    // out, so no reconcile of it runs at all.
    let scene = an_override_lapses_while(
        "dp-lapse-unreadable",
        json!({"spec": {"override": {"expires": LOOSE_TIME}}}),
    )
    .await?;
    // Readable again so its finalizer can be released.
    let (patch, _) = an_override(1, Duration::from_secs(60), "readable again")?;
    patch_policy(&scene, patch).await?;
    scene.finish(POLICY).await
}

#[tokio::test]
async fn an_override_expiring_years_ahead_is_refused_and_the_signal_decides() -> anyhow::Result<()>
{
    let scene = Scene::start("dp-override-far", 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;
    patch_policy(
        &scene,
        json!({"spec": {"override": {"tier": 2, "reason": "typo", "expires": "2099-11-11T00:00:00Z"}}}),
    )
    .await?;
    let (reason, message) = scene.until_refused(POLICY).await?;
    assert_eq!(reason, "OverrideRefused");
    assert!(message.contains("spec.override"), "{message}");
    let status = scene.status(POLICY).await?;
    assert_eq!(
        (status.tier, status.tier_reason, status.active_override),
        (Some(0), Some(TierReason::Signal), None)
    );
    assert_eq!(scene.tiers(), [0]);
    let notes = events(&scene.client, &scene.ns.name, "OverrideRefused").await?;
    assert!(notes.iter().any(|n| n.contains("2099")), "{notes:?}");
    // The signal still decides.
    scene.exporter.set(0.9);
    scene.until_tier(1, Duration::from_secs(10)).await?;
    scene.finish(POLICY).await
}

#[tokio::test]
async fn a_hand_edited_generation_is_written_over_and_the_next_change_goes_through()
-> anyhow::Result<()> {
    let scene = Scene::start("dp-generation", 0.9).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 1))
        .await?;
    scene.until_tier(1, Duration::from_secs(30)).await?;
    let maps = Api::<ConfigMap>::namespaced(scene.client.clone(), &scene.ns.name);
    maps.patch(
        SWITCHES,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"generation": u64::MAX.to_string()}})),
    )
    .await?;
    let edited = Instant::now();
    // The operator writes a believable generation over it at once, at the
    // same tier: the gateways refused the edit and must get a state they
    // take.
    let rewritten = poll_until(
        "the generation written over",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let state = switches(&scene).await.map_err(|e| e.to_string())?;
            if state.generation < u64::MAX
                && flashsale_degradation::plausible(state.generation, Timestamp::now())
            {
                Ok(state)
            } else {
                Err(format!("{}", state.generation))
            }
        },
    )
    .await?;
    eprintln!(
        "a hand-edited generation was written over {:?} later",
        edited.elapsed()
    );
    assert_eq!(rewritten.tier, 1);
    // The next change goes through with a generation above it.
    scene.exporter.set(0.99);
    scene.until_tier(2, Duration::from_secs(10)).await?;
    assert!(switches(&scene).await?.generation > rewritten.generation);
    scene.finish(POLICY).await
}
