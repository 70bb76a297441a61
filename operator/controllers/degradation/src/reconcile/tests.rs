//! The pure steps of the reconcile: which switches a tier means, which of
//! several policies keeps a sale.

use flashsale_degradation::{
    MiniGamesMode, OrderHistoryMode, RecommendationsMode, ReviewsMode, Switches,
};

use super::{holder, switches_for};
use flashsale_api::DegradationPolicy;

fn example() -> anyhow::Result<DegradationPolicy> {
    Ok(serde_yaml_ng::from_str(include_str!(
        "../../../../../crds/examples/degradationpolicy-two-tier.yaml"
    ))?)
}

#[test]
fn a_tier_switches_its_own_features_and_those_of_the_tiers_below() -> anyhow::Result<()> {
    let spec = example()?.spec;
    assert_eq!(switches_for(&spec, 0), Switches::default());
    let one = switches_for(&spec, 1);
    assert_eq!(one.recommendations, RecommendationsMode::Static);
    assert_eq!(one.order_history, OrderHistoryMode::Last7Days);
    assert_eq!(one.reviews, ReviewsMode::Normal, "a tier-2 feature");
    let two = switches_for(&spec, 2);
    assert_eq!(
        two.recommendations,
        RecommendationsMode::Static,
        "kept from tier 1"
    );
    assert_eq!(two.reviews, ReviewsMode::Queued);
    assert_eq!(two.mini_games, MiniGamesMode::Closed);
    Ok(())
}

#[test]
fn the_oldest_policy_keeps_the_sale() -> anyhow::Result<()> {
    let at = |s: &str| -> anyhow::Result<_> {
        Ok(Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            s.parse()?,
        )))
    };
    let mut first = example()?;
    first.metadata.name = Some("b-first".into());
    first.metadata.creation_timestamp = at("2026-11-10T10:00:00Z")?;
    let mut second = example()?;
    second.metadata.name = Some("a-second".into());
    second.metadata.creation_timestamp = at("2026-11-10T11:00:00Z")?;
    let mut twin = example()?;
    twin.metadata.name = Some("a-twin".into());
    twin.metadata.creation_timestamp = at("2026-11-10T10:00:00Z")?;
    let name = |p: Option<&DegradationPolicy>| p.and_then(|p| p.metadata.name.clone());
    assert_eq!(name(holder(&[&second, &first])).as_deref(), Some("b-first"));
    assert_eq!(
        name(holder(&[&second, &first, &twin])).as_deref(),
        Some("a-twin"),
        "same second: by name"
    );
    assert_eq!(name(holder(&[])), None);
    // Created in the same second as the one already switching the sale
    // (timestamps have whole seconds): the one switching keeps it.
    let mut holding = example()?;
    holding.metadata.name = Some("z-holding".into());
    holding.metadata.creation_timestamp = at("2026-11-10T10:00:00Z")?;
    holding.status = Some(flashsale_api::degradation::DegradationPolicyStatus {
        tier: Some(0),
        ..Default::default()
    });
    assert_eq!(
        name(holder(&[&twin, &holding, &first])).as_deref(),
        Some("z-holding")
    );
    Ok(())
}

/// The request sequence on a scripted apiserver: the finalizer goes on
/// first, alone; the next look finds the sale missing and says so in the
/// status and an Event, and nothing else is written.
#[tokio::test]
async fn a_first_look_adds_the_finalizer_and_a_missing_sale_is_reported() -> anyhow::Result<()> {
    use flashsale_kit::mock::{Scripted, Step};
    use http::{Method, StatusCode};
    use serde_json::json;

    let mut policy = example()?;
    policy.metadata.namespace = Some("shop".to_owned());
    policy.metadata.uid = Some("uid-1".to_owned());
    policy.metadata.resource_version = Some("7".to_owned());
    let name = policy.metadata.name.clone().unwrap_or_default();
    let sale = policy.spec.sale_ref.name.clone();
    let object = format!("/apis/flashsale.dev/v1alpha1/namespaces/shop/degradationpolicies/{name}");
    let settings = || -> anyhow::Result<crate::Settings> {
        Ok(crate::Settings {
            prometheus_url: None,
            signal: flashsale_observe::signal::SignalReader::new()?,
            probe: flashsale_observe::probe::Probe::new(
                "http://{name}.{namespace}:8080",
                std::time::Duration::from_secs(1),
            )?,
            propagation_bound: std::time::Duration::from_secs(1),
            pace: crate::pace::Pace::default(),
        })
    };

    let script = vec![
        Step::expect(Method::PATCH, object.clone())
            .holding("/metadata/finalizers", json!([crate::FINALIZER]))
            .holding("/metadata/resourceVersion", json!("7"))
            .answer(StatusCode::OK, serde_json::to_value(&policy)?),
    ];
    let scripted = Scripted::new(super::IDENTITY, settings()?, script);
    let outcome = super::reconcile_policy(&policy, &scripted.ctx).await;
    scripted.check(outcome).await.map_err(anyhow::Error::msg)?;

    policy.metadata.finalizers = Some(vec![crate::FINALIZER.to_owned()]);
    let script = vec![
        Step::expect(
            Method::GET,
            format!("/apis/flashsale.dev/v1alpha1/namespaces/shop/flashsales/{sale}"),
        )
        .not_found(),
        Step::expect(Method::PATCH, format!("{object}/status"))
            .holding("/status/conditions/0/type", json!("Ready"))
            .holding("/status/conditions/0/reason", json!("SaleNotFound"))
            .answer(StatusCode::OK, serde_json::to_value(&policy)?),
        Step::expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/shop/events",
        )
        .holding("/reason", json!("SaleNotFound"))
        .holding("/type", json!("Warning"))
        .answer(StatusCode::CREATED, json!({})),
    ];
    let scripted = Scripted::new(super::IDENTITY, settings()?, script);
    let outcome = super::reconcile_policy(&policy, &scripted.ctx).await;
    let action = scripted.check(outcome).await.map_err(anyhow::Error::msg)?;
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(policy.spec.signal.interval.0)
    );
    Ok(())
}
