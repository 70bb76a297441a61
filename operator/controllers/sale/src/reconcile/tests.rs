//! The reconcile's request sequence on a scripted apiserver.

use std::{sync::Arc, time::Duration};

use flashsale_api::FlashSale;
use flashsale_kit::mock::{Scripted, Step};
use http::{Method, StatusCode};
use kube::runtime::controller::Action;
use serde_json::json;

use crate::{Settings, allowlist::ImageAllowlist, build::Images};

fn settings() -> anyhow::Result<Settings> {
    let images = Images {
        gateway: "gateway:1".to_owned(),
        inventory: "inventory:1".to_owned(),
        order_writer: "order-writer:1".to_owned(),
    };
    Ok(Settings {
        allowed_images: ImageAllowlist::new(Vec::new(), &images),
        images,
        operator_namespace: "flashsale-system".to_owned(),
        refresh: Duration::from_secs(30),
        probe: flashsale_observe::probe::Probe::new(
            "http://{name}.{namespace}:8080",
            Duration::from_secs(1),
        )?,
        workloads: Arc::default(),
        stock_pace: Arc::default(),
    })
}

/// A sale whose token Secret is missing reads that Secret, says so in its
/// status and in one Warning Event, and writes nothing else: no child is
/// applied before its Secrets exist.
#[tokio::test]
async fn a_missing_secret_is_read_reported_and_nothing_is_applied() -> anyhow::Result<()> {
    let mut sale: FlashSale = serde_yaml_ng::from_str(include_str!(
        "../../../../../crds/examples/flashsale-singles-day.yaml"
    ))?;
    sale.metadata.namespace = Some("shop".to_owned());
    sale.metadata.uid = Some("uid-1".to_owned());
    let secret = sale
        .spec
        .gateway
        .auth
        .hs256_secret_ref
        .clone()
        .map(|r| r.name)
        .unwrap_or_default();
    let script = vec![
        Step::expect(
            Method::GET,
            format!("/api/v1/namespaces/shop/secrets/{secret}"),
        )
        .not_found(),
        Step::expect(
            Method::PATCH,
            "/apis/flashsale.dev/v1alpha1/namespaces/shop/flashsales/singles-day/status",
        )
        .holding("/status/phase", json!("Failed"))
        .holding("/status/conditions/0/type", json!("Stalled"))
        .holding("/status/conditions/0/reason", json!("SecretMissing"))
        .answer(StatusCode::OK, serde_json::to_value(&sale)?),
        Step::expect(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/shop/events",
        )
        .holding("/reason", json!("SecretMissing"))
        .holding("/type", json!("Warning"))
        .answer(StatusCode::CREATED, json!({})),
    ];
    let scripted = Scripted::new(super::IDENTITY, settings()?, script);
    let outcome = super::reconcile_sale(&sale, &scripted.ctx).await;
    let action = scripted.check(outcome).await.map_err(anyhow::Error::msg)?;
    assert_ne!(
        action,
        Action::await_change(),
        "a missing Secret is looked for again"
    );
    Ok(())
}
