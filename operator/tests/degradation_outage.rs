//! A DegradationPolicy when the stack's Prometheus itself is stopped: the
//! policy does what `onSignalLoss` says once `after` has passed, not before,
//! and names the cause. In a test binary of its own, because stopping
//! Prometheus would blind every other test that reads it.

mod common;

use std::time::Duration;

use common::scene::{POLICY, SALE, Scene, policy};
use flashsale_e2e::faults::{Outage, exclusive};
use flashsale_operator::api::degradation::TierReason;
use tokio::time::Instant;

#[tokio::test]
async fn prometheus_stopped_enters_the_signal_loss_tier_after_its_bound() -> anyhow::Result<()> {
    let _alone = exclusive().await;
    let scene = Scene::start("dp-outage", 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 2))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;

    // From before the stop: the policy must not act within `after` of the
    // moment Prometheus went away, which is at or after this instant.
    let stopped = Instant::now();
    let outage = Outage::begin("prometheus").await?;
    let entered = scene.until_tier(2, Duration::from_secs(20)).await;
    let status = scene.status(POLICY).await;
    outage.end().await?;
    let entered = entered?;
    let waited = entered.duration_since(stopped);
    // onSignalLoss.after is 2 s; an evaluation every 250 ms bounded by a
    // 1 s query timeout.
    assert!(
        waited >= Duration::from_secs(2),
        "acted after {waited:?}, before `after`"
    );
    assert!(waited < Duration::from_secs(6), "acted after {waited:?}");
    let status = status?;
    assert_eq!(status.tier_reason, Some(TierReason::SignalLost));
    let signal = status.observed.get("SignalAvailable");
    assert_eq!(
        signal.map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("False", "PrometheusUnreachable")),
        "{signal:?}"
    );

    // Back: the signal decides again, one tier at a time.
    scene.until_tier(1, Duration::from_secs(30)).await?;
    scene.until_tier(0, Duration::from_secs(15)).await?;
    assert_eq!(scene.tiers(), [0, 2, 1, 0]);
    scene.finish(POLICY).await
}
