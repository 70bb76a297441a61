//! A DegradationPolicy when the stack's Prometheus itself is stopped: the
//! policy does what `onSignalLoss` says once `after` has passed, not before,
//! and names the cause. In a test binary of its own, because stopping
//! Prometheus would blind every other test that reads it.

mod common;

use std::time::Duration;

use common::scene::{POLICY, SALE, Scene, policy};
use flashsale_api::degradation::TierReason;
use flashsale_e2e::faults::{Outage, exclusive};

#[tokio::test]
async fn prometheus_stopped_enters_the_signal_loss_tier_after_its_bound() -> anyhow::Result<()> {
    let _alone = exclusive().await;
    let scene = Scene::start("dp-outage", 0.5).await?;
    scene
        .create_policy(policy(POLICY, SALE, &scene.exporter.query(), 2))
        .await?;
    scene.until_tier(0, Duration::from_secs(30)).await?;

    // From the moment Prometheus stopped answering (a prober asking every
    // 10 ms finds it): the policy must not act within `after` of it.
    let silence = common::first_silence(&flashsale_e2e::stack::prometheus_url()?);
    let outage = Outage::begin("prometheus").await?;
    let entered = scene.until_tier(2, Duration::from_secs(20)).await;
    let status = scene.status(POLICY).await;
    let stopped = silence.await?;
    outage.end().await?;
    let (entered, (stopped, stopped_at)) = (entered?, stopped?);
    let status = status?;
    // When the policy decided tier 2 (its status), after the silence:
    // onSignalLoss.after is 2 s from its first failed evaluation, which
    // may have begun up to an evaluation (250 ms) before the prober's 10 ms
    // found the silence.
    let decided = status
        .since
        .as_ref()
        .map(|t| t.0)
        .ok_or_else(|| anyhow::anyhow!("no since: {status:?}"))?;
    let acted = decided.duration_since(stopped_at);
    assert!(
        acted >= jiff::SignedDuration::from_millis(1_740),
        "acted {acted:?} after Prometheus stopped answering, before `after`"
    );
    // An evaluation every 250 ms bounded by a 1 s query timeout.
    let waited = entered.duration_since(stopped);
    assert!(waited < Duration::from_secs(6), "acted after {waited:?}");
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
