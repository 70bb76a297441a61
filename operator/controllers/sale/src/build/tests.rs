//! Focused checks of the build rules.

use std::collections::BTreeMap;

use anyhow::{Context, bail, ensure};
use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::PodTemplateSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::Deserialize;

use flashsale_degradation::Degradation;
use flashsale_inventory_api::{ItemDefinition, SaleDefinition};

use super::{
    BuildError, CONFIG_HASH_ANNOTATION, Component, Desired, GATEWAY_CONFIG_KEY,
    INVENTORY_CONFIG_KEY, Input, MANAGED_BY, Stage, build, degradation_config_map, fixtures, names,
    secret_refs,
};
use flashsale_api::{Duration, FlashSale};

fn build_at(sale: &FlashSale, stage: Stage) -> anyhow::Result<Desired> {
    let images = fixtures::images();
    Ok(build(&Input {
        sale,
        images: &images,
        stage,
        operator_namespace: "flashsale-system",
    })?)
}

fn deployment<'a>(desired: &'a Desired, name: &str) -> anyhow::Result<&'a Deployment> {
    desired
        .deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some(name))
        .with_context(|| format!("no Deployment {name}"))
}

fn replicas_of(desired: &Desired, sale: &FlashSale) -> anyhow::Result<Vec<Option<i32>>> {
    Component::ALL
        .iter()
        .map(|&c| {
            let d = deployment(desired, &names::workload(sale, c))?;
            Ok(d.spec.replicas)
        })
        .collect()
}

fn template<'a>(desired: &'a Desired, name: &str) -> anyhow::Result<&'a PodTemplateSpec> {
    Ok(&deployment(desired, name)?.spec.template)
}

fn config_data<'a>(desired: &'a Desired, name: &str, key: &str) -> anyhow::Result<&'a str> {
    desired
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(key))
        .map(String::as_str)
        .with_context(|| format!("no ConfigMap {name} with {key}"))
}

fn hash_of(desired: &Desired, name: &str) -> anyhow::Result<String> {
    template(desired, name)?
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION))
        .cloned()
        .with_context(|| format!("{name} has no config hash"))
}

#[test]
fn replicas_follow_the_stage_without_autoscaling() -> anyhow::Result<()> {
    // Gateway 3, inventory default 2, order-writer default 2.
    let sale = fixtures::small_sale()?;
    for (stage, expected) in [
        (Stage::Pending, [Some(1), Some(1), Some(1)]),
        (Stage::Active, [Some(3), Some(2), Some(2)]),
        (Stage::Ending, [Some(1), Some(1), Some(2)]),
        (Stage::Drained, [Some(0), Some(0), Some(0)]),
    ] {
        let desired = build_at(&sale, stage)?;
        assert_eq!(replicas_of(&desired, &sale)?, expected, "{stage:?}");
        assert!(desired.horizontal_pod_autoscalers.is_empty(), "{stage:?}");
    }
    Ok(())
}

#[test]
fn replicas_follow_the_stage_with_autoscaling() -> anyhow::Result<()> {
    // Gateway autoscaled 6..60, inventory 4, order-writer 6.
    let sale = fixtures::big_sale()?;
    for (stage, expected, hpas) in [
        (Stage::Pending, [Some(1), Some(1), Some(1)], 0),
        (Stage::Active, [None, Some(4), Some(6)], 1),
        (Stage::Ending, [Some(1), Some(1), Some(6)], 0),
        (Stage::Drained, [Some(0), Some(0), Some(0)], 0),
    ] {
        let desired = build_at(&sale, stage)?;
        assert_eq!(replicas_of(&desired, &sale)?, expected, "{stage:?}");
        assert_eq!(desired.horizontal_pod_autoscalers.len(), hpas, "{stage:?}");
    }
    let desired = build_at(&sale, Stage::Active)?;
    let hpa = desired
        .horizontal_pod_autoscalers
        .first()
        .map(|h| &h.spec)
        .context("no HPA")?;
    assert_eq!(hpa.scale_target_ref.name, "singles-day-gateway");
    assert_eq!(hpa.scale_target_ref.kind, "Deployment");
    assert_eq!(hpa.scale_target_ref.api_version.as_deref(), Some("apps/v1"));
    assert_eq!((hpa.min_replicas, hpa.max_replicas), (Some(6), 60));
    let target = hpa
        .metrics
        .as_ref()
        .and_then(|m| m.first())
        .and_then(|m| m.resource.as_ref())
        .context("cpu metric")?;
    assert_eq!(target.name, "cpu");
    assert_eq!(target.target.type_, "Utilization");
    assert_eq!(target.target.average_utilization, Some(60));
    Ok(())
}

#[test]
fn a_workload_switched_off_stays_off_before_and_after_the_sale() -> anyhow::Result<()> {
    let mut sale = fixtures::small_sale()?;
    sale.spec.inventory.workload.replicas = Some(0);
    for (stage, expected) in [
        (Stage::Pending, [Some(1), Some(0), Some(1)]),
        (Stage::Active, [Some(3), Some(0), Some(2)]),
        (Stage::Ending, [Some(1), Some(0), Some(2)]),
    ] {
        let desired = build_at(&sale, stage)?;
        assert_eq!(replicas_of(&desired, &sale)?, expected, "{stage:?}");
    }
    Ok(())
}

/// Every object's metadata, with its kind for messages.
fn all_metadata(desired: &Desired) -> Vec<(&'static str, &ObjectMeta)> {
    let mut all = Vec::new();
    all.extend(
        desired
            .deployments
            .iter()
            .map(|o| ("Deployment", &o.metadata)),
    );
    all.extend(desired.services.iter().map(|o| ("Service", &o.metadata)));
    all.extend(
        desired
            .config_maps
            .iter()
            .map(|o| ("ConfigMap", &o.metadata)),
    );
    all.extend(
        desired
            .pod_disruption_budgets
            .iter()
            .map(|o| ("PodDisruptionBudget", &o.metadata)),
    );
    all.extend(
        desired
            .network_policies
            .iter()
            .map(|o| ("NetworkPolicy", &o.metadata)),
    );
    all.extend(
        desired
            .horizontal_pod_autoscalers
            .iter()
            .map(|o| ("HorizontalPodAutoscaler", &o.metadata)),
    );
    all.extend(
        desired
            .service_accounts
            .iter()
            .map(|o| ("ServiceAccount", &o.metadata)),
    );
    all.extend(desired.roles.iter().map(|o| ("Role", &o.metadata)));
    all.extend(
        desired
            .role_bindings
            .iter()
            .map(|o| ("RoleBinding", &o.metadata)),
    );
    all
}

fn check_labels(
    what: &str,
    labels: Option<&BTreeMap<String, String>>,
    sale: &str,
) -> anyhow::Result<()> {
    let labels = labels.with_context(|| format!("{what} has no labels"))?;
    let get = |key: &str| labels.get(key).map(String::as_str);
    ensure!(
        get("app.kubernetes.io/managed-by") == Some(MANAGED_BY),
        "{what}: managed-by"
    );
    ensure!(
        get("app.kubernetes.io/part-of") == Some(sale),
        "{what}: part-of"
    );
    let component = get("app.kubernetes.io/component");
    ensure!(
        matches!(component, Some("gateway" | "inventory" | "order-writer")),
        "{what}: component {component:?}"
    );
    Ok(())
}

#[test]
fn every_object_carries_the_design_labels_and_one_controller_owner() -> anyhow::Result<()> {
    for sale in [fixtures::big_sale()?, fixtures::small_sale()?] {
        let uid = sale.metadata.uid.clone().context("fixture uid")?;
        let name = sale.metadata.name.clone().context("fixture name")?;
        let desired = build_at(&sale, Stage::Active)?;
        let degradation = degradation_config_map(&sale, &Degradation::default())?;
        let mut all = all_metadata(&desired);
        all.push(("ConfigMap", &degradation.metadata));
        assert_eq!(all.len(), if name == "singles-day" { 19 } else { 18 });
        for (kind, meta) in all {
            let what = format!("{kind} {:?}", meta.name);
            check_labels(&what, meta.labels.as_ref(), &name)?;
            ensure!(
                meta.namespace.as_deref() == Some("shop"),
                "{what}: namespace"
            );
            let owners = meta.owner_references.as_deref().unwrap_or_default();
            let [owner] = owners else {
                bail!("{what}: {} owner references", owners.len());
            };
            ensure!(owner.uid == uid, "{what}: owner uid");
            ensure!(owner.controller == Some(true), "{what}: controller");
            ensure!(owner.block_owner_deletion == Some(true), "{what}: block");
            ensure!(owner.kind == "FlashSale", "{what}: owner kind");
            ensure!(
                owner.api_version == "flashsale.dev/v1alpha1",
                "{what}: group"
            );
        }
        for d in &desired.deployments {
            let what = format!("pod template of {:?}", d.metadata.name);
            let spec = &d.spec;
            let pod_labels = spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.as_ref());
            check_labels(&what, pod_labels, &name)?;
            // The selector must select the pods, and be part-of + component only.
            let selector = spec.selector.match_labels.as_ref().context("selector")?;
            ensure!(selector.len() == 2, "{what}: selector {selector:?}");
            for (key, value) in selector {
                ensure!(
                    pod_labels.and_then(|l| l.get(key)) == Some(value),
                    "{what}: selector {key}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn every_kind_is_sorted_by_name() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let desired = build_at(&sale, Stage::Active)?;
    let names = |metas: Vec<&ObjectMeta>| -> Vec<String> {
        metas.iter().filter_map(|m| m.name.clone()).collect()
    };
    let workloads = vec![
        "singles-day-gateway".to_owned(),
        "singles-day-inventory".to_owned(),
        "singles-day-order-writer".to_owned(),
    ];
    assert_eq!(
        names(desired.deployments.iter().map(|d| &d.metadata).collect()),
        workloads
    );
    assert_eq!(
        names(desired.services.iter().map(|d| &d.metadata).collect()),
        workloads
    );
    assert_eq!(
        names(
            desired
                .pod_disruption_budgets
                .iter()
                .map(|d| &d.metadata)
                .collect()
        ),
        workloads
    );
    assert_eq!(
        names(
            desired
                .network_policies
                .iter()
                .map(|d| &d.metadata)
                .collect()
        ),
        workloads
    );
    assert_eq!(
        names(desired.config_maps.iter().map(|d| &d.metadata).collect()),
        ["singles-day-gateway", "singles-day-inventory"]
    );
    Ok(())
}

/// The gateway's `GatewayConfig` (workloads/gateway/src/config.rs), with the
/// schedule fields being added to it, refusing unknown fields like it does.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)] // Parsing is the check; not every field is read back.
struct GatewayConfig {
    sale: String,
    items: Vec<GatewayItem>,
    currency: String,
    rate_limit: RateLimit,
    waiting_room: WaitingRoom,
    concurrency: Concurrency,
    opens_at: String,
    closes_at: String,
    region: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GatewayItem {
    sku: String,
    price_minor: i64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RateLimit {
    per_user_per_second: u32,
    burst: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WaitingRoom {
    enabled: bool,
    admit_per_second: u32,
    pass_ttl_seconds: u64,
    #[serde(default)]
    bot_shield: Option<BotShield>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BotShield {
    difficulty_bits: Vec<u8>,
    challenge_ttl_seconds: u64,
    #[serde(default)]
    per_source: Option<PerSource>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PerSource {
    joins_per_second: u32,
    burst: u32,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Concurrency {
    min_limit: usize,
    max_limit: usize,
    tier0_reserved_percent: u32,
}

#[test]
fn gateway_json_parses_as_the_gateway_expects() -> anyhow::Result<()> {
    let mut sale = fixtures::big_sale()?;
    // 90.5 s must not become 90 s: a pass never expires early.
    sale.spec.gateway.waiting_room.pass_ttl = Duration::from_millis(90_500);
    let desired = build_at(&sale, Stage::Active)?;
    let text = config_data(&desired, "singles-day-gateway", GATEWAY_CONFIG_KEY)?;
    let config: GatewayConfig = serde_json::from_str(text)?;
    assert_eq!(config.sale, "shop.singles-day.6f1c5b8e");
    assert_eq!(config.currency, "CNY");
    assert_eq!(config.rate_limit.per_user_per_second, 3, "2.5 rounds up");
    assert_eq!(config.rate_limit.burst, 5);
    assert!(config.waiting_room.enabled);
    assert_eq!(config.waiting_room.admit_per_second, 2000);
    assert_eq!(config.waiting_room.pass_ttl_seconds, 91);
    assert_eq!(
        (config.concurrency.min_limit, config.concurrency.max_limit),
        (50, 2000)
    );
    assert_eq!(config.concurrency.tier0_reserved_percent, 40);
    assert_eq!(config.items.len(), 2);
    assert_eq!(
        (config.items[0].sku.as_str(), config.items[0].price_minor),
        ("PHONE-X-256", 399_900)
    );
    // +08:00 in the spec, UTC in the config.
    assert_eq!(config.opens_at, "2026-11-10T16:00:00Z");
    assert_eq!(config.closes_at, "2026-11-10T18:00:00Z");
    assert_eq!(config.region, "cn-east-1", "stamped on every answer");
    Ok(())
}

#[test]
fn the_bot_shield_reaches_the_gateway_as_it_reads_it() -> anyhow::Result<()> {
    let mut sale = fixtures::big_sale()?;
    let gateway_config = |sale: &FlashSale| -> anyhow::Result<GatewayConfig> {
        let desired = build_at(sale, Stage::Active)?;
        let text = config_data(&desired, "singles-day-gateway", GATEWAY_CONFIG_KEY)?;
        Ok(serde_json::from_str(text)?)
    };
    assert!(gateway_config(&sale)?.waiting_room.bot_shield.is_none());
    sale.spec.gateway.waiting_room.bot_shield = Some(flashsale_api::BotShield {
        difficulty_bits: vec![16, 18, 22],
        // 90.5 s becomes 91: a challenge never expires before the spec says.
        challenge_ttl: Duration::from_millis(90_500),
        per_source: Some(flashsale_api::PerSourceBudget {
            joins_per_second: 2,
            burst: 20,
            header: Some("x-ja4".to_owned()),
            trusted_proxies: vec!["10.0.0.0/8".to_owned(), "192.0.2.1".to_owned()],
        }),
    });
    let config = gateway_config(&sale)?;
    let shield = config.waiting_room.bot_shield.context("no botShield")?;
    assert_eq!(shield.difficulty_bits, [16, 18, 22]);
    assert_eq!(shield.challenge_ttl_seconds, 91);
    let budget = shield.per_source.context("no perSource")?;
    assert_eq!((budget.joins_per_second, budget.burst), (2, 20));
    assert_eq!(budget.header.as_deref(), Some("x-ja4"));
    assert_eq!(budget.trusted_proxies, ["10.0.0.0/8", "192.0.2.1"]);

    // A proxy that passes the schema's character check but is no address.
    if let Some(budget) = sale
        .spec
        .gateway
        .waiting_room
        .bot_shield
        .as_mut()
        .and_then(|shield| shield.per_source.as_mut())
    {
        budget.trusted_proxies = vec!["10.0.0.0/99".to_owned()];
    }
    match gateway_config(&sale) {
        Err(err) => match err.downcast_ref::<BuildError>() {
            Some(BuildError::OutOfRange { field, value }) => {
                assert!(field.ends_with("trustedProxies"), "{field}");
                assert_eq!(value, "10.0.0.0/99");
            }
            other => bail!("{other:?}"),
        },
        Ok(config) => bail!("rendered: {config:?}"),
    }
    Ok(())
}

#[test]
fn a_bot_shield_without_a_room_gets_the_key_that_signs_its_challenges() -> anyhow::Result<()> {
    let mut sale = fixtures::small_sale()?;
    let room = &mut sale.spec.gateway.waiting_room;
    room.bot_shield = Some(flashsale_api::BotShield {
        difficulty_bits: vec![12],
        challenge_ttl: Duration::from_secs(60),
        per_source: None,
    });
    assert!(!room.enabled);
    match build_at(&sale, Stage::Active) {
        Err(err) => match err.downcast_ref::<BuildError>() {
            Some(BuildError::InvalidSpec { field, .. }) => {
                assert_eq!(*field, "spec.gateway.waitingRoom.ticketSecretRef");
            }
            other => bail!("{other:?}"),
        },
        Ok(_) => bail!("built without a key"),
    }
    sale.spec.gateway.waiting_room.ticket_secret_ref = Some(flashsale_api::common::SecretKeyRef {
        name: "weekend-deal-shield".into(),
        key: "hmac".into(),
    });
    let desired = build_at(&sale, Stage::Active)?;
    let config: GatewayConfig = serde_json::from_str(config_data(
        &desired,
        "weekend-deal-gateway",
        GATEWAY_CONFIG_KEY,
    )?)?;
    assert!(!config.waiting_room.enabled);
    assert_eq!(
        config.waiting_room.bot_shield.map(|s| s.difficulty_bits),
        Some(vec![12])
    );
    let mounts = secret_mounts(&desired, "weekend-deal-gateway")?;
    assert!(
        mounts
            .iter()
            .any(|(secret, items, _)| secret == "weekend-deal-shield"
                && items == &[("hmac".to_owned(), "key".to_owned())]),
        "{mounts:?}"
    );
    assert!(
        env_of(&desired, "weekend-deal-gateway")?.contains_key("WAITING_ROOM_KEY_FILE"),
        "the gateway is told where the key is"
    );
    assert!(
        super::secret_refs(&sale).iter().any(|(path, r)| *path
            == "spec.gateway.waitingRoom.ticketSecretRef"
            && r.name == "weekend-deal-shield"),
        "the sale waits for the key's Secret"
    );
    Ok(())
}

#[test]
fn a_whole_rate_stays_and_a_tiny_one_becomes_one() -> anyhow::Result<()> {
    let mut sale = fixtures::small_sale()?;
    for (rate, expected) in [(2.0, 2), (0.01, 1), (5.000_1, 6)] {
        sale.spec.gateway.rate_limit.per_user_per_second = rate;
        let desired = build_at(&sale, Stage::Active)?;
        let text = config_data(&desired, "weekend-deal-gateway", GATEWAY_CONFIG_KEY)?;
        let config: GatewayConfig = serde_json::from_str(text)?;
        assert_eq!(config.rate_limit.per_user_per_second, expected, "{rate}");
    }
    Ok(())
}

#[test]
fn sale_json_parses_as_the_inventory_expects() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let desired = build_at(&sale, Stage::Pending)?;
    let text = config_data(&desired, "singles-day-inventory", INVENTORY_CONFIG_KEY)?;
    let definition: SaleDefinition = serde_json::from_str(text)?;
    // The hash of running sales stays what it was: fields keep their order.
    let at = |key: &str| text.find(&format!("\"{key}\"")).unwrap_or(usize::MAX);
    assert!(at("sale") < at("reservationTtlMs") && at("reservationTtlMs") < at("items"));
    assert_eq!(definition.sale, "shop.singles-day.6f1c5b8e");
    assert_eq!(definition.reservation_ttl_ms, 15 * 60 * 1000);
    assert_eq!(
        definition.items,
        [
            ItemDefinition {
                sku: "PHONE-X-256".to_owned(),
                stock: 10_000,
                per_user_limit: 1,
                shards: 8
            },
            ItemDefinition {
                sku: "PHONE-CASE".to_owned(),
                stock: 200_000,
                per_user_limit: 5,
                shards: 1
            },
            // The drill buyer's own stock, last.
            ItemDefinition::drill(),
        ]
    );
    Ok(())
}

#[test]
fn the_load_fence_follows_the_first_stock_reading_without_restarting_the_inventory()
-> anyhow::Result<()> {
    let mut sale = fixtures::big_sale()?;
    let opens_at = |desired: &Desired| -> anyhow::Result<Option<u64>> {
        let text = config_data(desired, "singles-day-inventory", INVENTORY_CONFIG_KEY)?;
        let definition: serde_json::Value = serde_json::from_str(text)?;
        Ok(definition["opensAtMs"].as_u64())
    };
    let before = build_at(&sale, Stage::Pending)?;
    assert_eq!(opens_at(&before)?, None, "no fence before stock was read");
    let loaded: jiff::Timestamp = "2026-11-11T00:00:01.5Z".parse()?;
    sale.status.get_or_insert_default().stock_loaded_at =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(loaded));
    let after = build_at(&sale, Stage::Pending)?;
    assert_eq!(
        opens_at(&after)?,
        Some(u64::try_from(loaded.as_millisecond())?)
    );
    assert_eq!(
        hash_of(&after, "singles-day-inventory")?,
        hash_of(&before, "singles-day-inventory")?,
        "setting the fence must not roll the inventory"
    );
    Ok(())
}

#[test]
fn a_negative_stock_is_refused_with_its_field() -> anyhow::Result<()> {
    let mut sale = fixtures::small_sale()?;
    sale.spec.items[0].stock = -1;
    match build_at(&sale, Stage::Active) {
        Err(err) => {
            let message = err.to_string();
            assert!(message.contains("spec.items[].stock"), "{message}");
            Ok(())
        }
        Ok(_) => bail!("a negative stock was rendered"),
    }
}

#[test]
fn the_gateway_role_reads_only_its_degradation_config_map() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let desired = build_at(&sale, Stage::Active)?;
    let [role] = desired.roles.as_slice() else {
        bail!("{} roles", desired.roles.len());
    };
    let rules = role.rules.as_deref().unwrap_or_default();
    let [rule] = rules else {
        bail!("{} rules", rules.len());
    };
    assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(
        rule.resources.as_deref(),
        Some(&["configmaps".to_owned()][..])
    );
    assert_eq!(
        rule.resource_names.as_deref(),
        Some(&["singles-day-degradation".to_owned()][..])
    );
    assert_eq!(rule.verbs, ["get", "list", "watch"]);
    assert!(rule.non_resource_urls.is_none());

    let [binding] = desired.role_bindings.as_slice() else {
        bail!("{} role bindings", desired.role_bindings.len());
    };
    assert_eq!(binding.role_ref.kind, "Role");
    assert_eq!(binding.role_ref.name, "singles-day-gateway");
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    let [subject] = subjects else {
        bail!("{} subjects", subjects.len());
    };
    assert_eq!(
        (subject.kind.as_str(), subject.name.as_str()),
        ("ServiceAccount", "singles-day-gateway")
    );
    assert_eq!(subject.namespace.as_deref(), Some("shop"));
    let gateway_pod = template(&desired, "singles-day-gateway")?
        .spec
        .as_ref()
        .context("pod spec")?;
    assert_eq!(
        gateway_pod.service_account_name.as_deref(),
        Some("singles-day-gateway")
    );
    Ok(())
}

#[test]
fn config_hash_follows_the_config_not_the_size() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let base = build_at(&sale, Stage::Active)?;
    let hashes = |desired: &Desired| -> anyhow::Result<Vec<String>> {
        Component::ALL
            .iter()
            .map(|&c| hash_of(desired, &names::workload(&sale, c)))
            .collect()
    };
    let before = hashes(&base)?;
    assert!(before.iter().all(|h| h.len() == 16), "{before:?}");

    let mut resized = sale.clone();
    resized.spec.inventory.workload.replicas = Some(9);
    resized.spec.order_writer.workload.replicas = Some(1);
    resized.spec.gateway.workload.replicas = Some(7);
    assert_eq!(hashes(&build_at(&resized, Stage::Active)?)?, before);
    assert_eq!(hashes(&build_at(&sale, Stage::Pending)?)?, before);

    let mut repriced = sale.clone();
    repriced.spec.items[0].price_minor += 100;
    let after = hashes(&build_at(&repriced, Stage::Active)?)?;
    assert_ne!(after[0], before[0], "the gateway prices items");
    assert_eq!(after[1..], before[1..], "the others do not see prices");

    let mut restocked = sale.clone();
    restocked.spec.items[0].stock += 1;
    let after = hashes(&build_at(&restocked, Stage::Active)?)?;
    assert_ne!(after[1], before[1], "the inventory loads stock");

    let mut rebatched = sale.clone();
    rebatched.spec.order_writer.database.batch_size = 500;
    let after = hashes(&build_at(&rebatched, Stage::Active)?)?;
    assert_ne!(after[2], before[2], "the order-writer's settings");
    Ok(())
}

#[test]
fn secret_refs_lists_every_mounted_ref_with_its_path() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let refs: Vec<_> = secret_refs(&sale)
        .into_iter()
        .map(|(path, secret)| (path, secret.name.as_str(), secret.key.as_str()))
        .collect();
    assert_eq!(
        refs,
        [
            (
                "spec.gateway.auth.hs256SecretRef",
                "singles-day-jwt",
                "hs256"
            ),
            (
                "spec.gateway.payment.secretRef",
                "singles-day-payment",
                "webhook-secret"
            ),
            (
                "spec.gateway.waitingRoom.ticketSecretRef",
                "singles-day-waiting-room",
                "hmac-key"
            ),
            (
                "spec.inventory.redis.urlSecretRef",
                "singles-day-redis",
                "url"
            ),
            (
                "spec.orderWriter.database.urlSecretRef",
                "singles-day-db",
                "url"
            ),
        ]
    );

    let small = fixtures::small_sale()?;
    let refs: Vec<_> = secret_refs(&small).into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        refs,
        [
            "spec.gateway.auth.rs256PublicKeySecretRef",
            "spec.orderWriter.database.urlSecretRef"
        ]
    );

    // A disabled waiting room mounts no key, so its ref is not required.
    let mut closed = sale;
    closed.spec.gateway.waiting_room.enabled = false;
    assert!(
        secret_refs(&closed)
            .iter()
            .all(|(p, _)| !p.contains("waitingRoom"))
    );
    Ok(())
}

#[test]
fn every_secret_ref_is_what_the_pods_mount() -> anyhow::Result<()> {
    for sale in [fixtures::big_sale()?, fixtures::small_sale()?] {
        let desired = build_at(&sale, Stage::Active)?;
        let mut used = Vec::new();
        for d in &desired.deployments {
            let pod = d.spec.template.spec.as_ref().context("pod spec")?;
            for volume in pod.volumes.iter().flatten() {
                if let Some(secret) = &volume.secret {
                    for item in secret.items.iter().flatten() {
                        used.push((
                            secret.secret_name.clone().unwrap_or_default(),
                            item.key.clone(),
                        ));
                    }
                }
            }
            for env in pod.containers.iter().flat_map(|c| c.env.iter().flatten()) {
                if let Some(secret) = env
                    .value_from
                    .as_ref()
                    .and_then(|v| v.secret_key_ref.as_ref())
                {
                    used.push((secret.name.clone(), secret.key.clone()));
                }
            }
        }
        used.sort();
        used.dedup();
        // The internal Secret is the operator's own, not the spec's.
        let internal = names::internal_secret(&sale);
        used.retain(|(name, _)| *name != internal);
        let mut listed: Vec<_> = secret_refs(&sale)
            .into_iter()
            .map(|(_, s)| (s.name.clone(), s.key.clone()))
            .collect();
        listed.sort();
        assert_eq!(used, listed);
    }
    Ok(())
}

#[test]
fn missing_metadata_is_an_error() -> anyhow::Result<()> {
    for (field, clear) in [
        (
            "uid",
            (|s: &mut FlashSale| s.metadata.uid = None) as fn(&mut FlashSale),
        ),
        ("namespace", |s| s.metadata.namespace = None),
        ("name", |s| s.metadata.name = None),
    ] {
        let mut sale = fixtures::small_sale()?;
        clear(&mut sale);
        match build_at(&sale, Stage::Active) {
            Err(err) => match err.downcast_ref::<BuildError>() {
                Some(BuildError::MissingMetadata(missing)) => assert_eq!(*missing, field),
                other => bail!("{field}: unexpected {other:?}"),
            },
            Ok(_) => bail!("built without metadata.{field}"),
        }
        ensure!(
            matches!(
                degradation_config_map(&sale, &Degradation::default()),
                Err(BuildError::MissingMetadata(missing)) if missing == field
            ),
            "degradation map without metadata.{field}"
        );
    }
    Ok(())
}

#[test]
fn the_degradation_map_holds_the_state_it_is_given() -> anyhow::Result<()> {
    let sale = fixtures::small_sale()?;
    let state = Degradation {
        tier: 2,
        generation: 1_764_547_200_123,
        switches: flashsale_degradation::Switches {
            reviews: flashsale_degradation::ReviewsMode::Queued,
            ..flashsale_degradation::Switches::default()
        },
        reason: "signal 0.97 above tier 2's enterAbove 0.95".to_owned(),
        changed_at: Some("2026-11-11T00:01:00Z".parse()?),
        override_expires: None,
    };
    let map = degradation_config_map(&sale, &state)?;
    assert_eq!(
        map.metadata.name.as_deref(),
        Some("weekend-deal-degradation")
    );
    let data = map.data.context("data")?;
    assert_eq!(data, state.to_data());
    assert_eq!(
        Degradation::from_data(&data)?,
        state,
        "the gateway reads it back"
    );
    assert_eq!(
        map.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/component"))
            .map(String::as_str),
        Some("gateway")
    );
    Ok(())
}

#[test]
fn the_order_writer_gets_one_consumer_group_per_sale() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let desired = build_at(&sale, Stage::Active)?;
    let pod = template(&desired, "singles-day-order-writer")?
        .spec
        .as_ref()
        .context("pod spec")?;
    let env: BTreeMap<_, _> = pod
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert_eq!(
        env.get("ORDER_WRITER_GROUP"),
        Some(&Some("flashsale-order-writer.shop.singles-day"))
    );
    assert_eq!(env.get("ORDER_WRITER_FLUSH_INTERVAL_MS"), Some(&Some("50")));
    assert_eq!(pod.automount_service_account_token, Some(false));
    Ok(())
}

#[test]
fn the_sale_id_tells_namespaces_and_incarnations_apart() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    assert_eq!(super::sale_id(&sale)?, "shop.singles-day.6f1c5b8e");
    let mut elsewhere = sale.clone();
    elsewhere.metadata.namespace = Some("outlet".to_owned());
    assert_eq!(super::sale_id(&elsewhere)?, "outlet.singles-day.6f1c5b8e");
    // Created again: the apiserver gives it a new uid.
    let mut again = sale.clone();
    again.metadata.uid = Some("0a9b8c7d-6e5f-4a3b-8c1d-000000000001".to_owned());
    assert_eq!(super::sale_id(&again)?, "shop.singles-day.0a9b8c7d");
    // Only the sale's configuration changes: its children keep their names.
    let (first, second) = (
        build_at(&sale, Stage::Active)?,
        build_at(&again, Stage::Active)?,
    );
    let names = |d: &Desired| -> Vec<Option<String>> {
        all_metadata(d)
            .iter()
            .map(|(_, m)| m.name.clone())
            .collect()
    };
    assert_eq!(names(&first), names(&second));
    // The longest namespace and name still fit the workloads' 128 characters.
    let longest = names::sale_id(&"n".repeat(63), &"s".repeat(50), "6f1c5b8e-2b1a");
    assert_eq!(longest.len(), 123);
    ensure!(
        matches!(
            super::sale_id(&{
                let mut s = sale;
                s.metadata.uid = None;
                s
            }),
            Err(BuildError::MissingMetadata("uid"))
        ),
        "a sale id without a uid"
    );
    Ok(())
}

#[test]
fn one_sale_in_two_regions_shares_its_id_and_drill_key() -> anyhow::Result<()> {
    let mut sale = fixtures::small_sale()?;
    sale.spec.sale_id = Some("shop:weekend-deal".to_owned());
    sale.spec.gateway.drill_key_secret_ref = Some(serde_json::from_value(
        serde_json::json!({"name": "drill", "key": "shared"}),
    )?);
    assert_eq!(super::sale_id(&sale)?, "shop:weekend-deal");
    let desired = build_at(&sale, Stage::Active)?;
    let gateway: serde_json::Value = serde_json::from_str(config_data(
        &desired,
        "weekend-deal-gateway",
        GATEWAY_CONFIG_KEY,
    )?)?;
    let inventory: SaleDefinition = serde_json::from_str(config_data(
        &desired,
        "weekend-deal-inventory",
        INVENTORY_CONFIG_KEY,
    )?)?;
    assert_eq!(
        (gateway["sale"].as_str(), inventory.sale.as_str()),
        (Some("shop:weekend-deal"), "shop:weekend-deal")
    );
    // The shared key, not the internal Secret's own.
    let mounts = secret_mounts(&desired, "weekend-deal-gateway")?;
    assert!(
        mounts.contains(&(
            "drill".to_owned(),
            vec![("shared".to_owned(), "key".to_owned())],
            "/etc/flashsale/drill".to_owned()
        )),
        "{mounts:?}"
    );
    assert_eq!(
        env_of(&desired, "weekend-deal-gateway")?.get("DRILL_BUYER_KEY_FILE"),
        Some(&Some("/etc/flashsale/drill/key".to_owned()))
    );
    assert!(
        super::secret_refs(&sale)
            .iter()
            .any(|(path, r)| *path == "spec.gateway.drillKeySecretRef" && r.name == "drill")
    );
    Ok(())
}

/// A container's env as name → literal value.
fn env_of(desired: &Desired, name: &str) -> anyhow::Result<BTreeMap<String, Option<String>>> {
    let pod = template(desired, name)?.spec.as_ref().context("pod spec")?;
    Ok(pod
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect())
}

/// One Secret volume of a pod: the Secret, its (key, file) items and where
/// it is mounted.
type SecretMount = (String, Vec<(String, String)>, String);

/// A pod's Secret volumes.
fn secret_mounts(desired: &Desired, name: &str) -> anyhow::Result<Vec<SecretMount>> {
    let pod = template(desired, name)?.spec.as_ref().context("pod spec")?;
    let mounts: BTreeMap<&str, &str> = pod
        .containers
        .iter()
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    pod.volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v, v.secret.as_ref()?)))
        .map(|(volume, secret)| {
            let items = secret
                .items
                .iter()
                .flatten()
                .map(|i| (i.key.clone(), i.path.clone()))
                .collect();
            let at = mounts
                .get(volume.name.as_str())
                .with_context(|| format!("volume {} is not mounted", volume.name))?;
            Ok((
                secret.secret_name.clone().unwrap_or_default(),
                items,
                (*at).to_owned(),
            ))
        })
        .collect()
}

#[test]
fn the_inventory_tokens_are_mounted_where_each_workload_needs_them() -> anyhow::Result<()> {
    let sale = fixtures::small_sale()?;
    let desired = build_at(&sale, Stage::Active)?;
    let internal = |keys: &[&str]| {
        (
            "weekend-deal-internal".to_owned(),
            keys.iter()
                .map(|k| ((*k).to_owned(), (*k).to_owned()))
                .collect::<Vec<_>>(),
            "/etc/flashsale/internal".to_owned(),
        )
    };
    let of = |mounts: Vec<SecretMount>| {
        mounts
            .into_iter()
            .filter(|m| m.0 == "weekend-deal-internal")
            .collect::<Vec<_>>()
    };
    // The gateway sends the API token; it never holds the admin token. It
    // checks drill buyers' tokens with the drill key.
    let drill = (
        "weekend-deal-internal".to_owned(),
        vec![("drill-buyer-key".to_owned(), "drill-buyer-key".to_owned())],
        "/etc/flashsale/drill".to_owned(),
    );
    assert_eq!(
        of(secret_mounts(&desired, "weekend-deal-gateway")?),
        [internal(&["inventory-token"]), drill]
    );
    let gateway = env_of(&desired, "weekend-deal-gateway")?;
    assert_eq!(
        gateway.get("INVENTORY_API_TOKEN_FILE"),
        Some(&Some("/etc/flashsale/internal/inventory-token".to_owned()))
    );
    assert_eq!(
        gateway.get("DRILL_BUYER_KEY_FILE"),
        Some(&Some("/etc/flashsale/drill/drill-buyer-key".to_owned()))
    );
    assert!(!gateway.contains_key("INVENTORY_ADMIN_TOKEN_FILE"));
    // The inventory checks both.
    assert_eq!(
        of(secret_mounts(&desired, "weekend-deal-inventory")?),
        [internal(&["inventory-token", "inventory-admin-token"])]
    );
    let inventory = env_of(&desired, "weekend-deal-inventory")?;
    assert_eq!(
        inventory.get("INVENTORY_API_TOKEN_FILE"),
        Some(&Some("/etc/flashsale/internal/inventory-token".to_owned()))
    );
    assert_eq!(
        inventory.get("INVENTORY_ADMIN_TOKEN_FILE"),
        Some(&Some(
            "/etc/flashsale/internal/inventory-admin-token".to_owned()
        ))
    );
    // The order-writer does not talk to the inventory.
    assert!(of(secret_mounts(&desired, "weekend-deal-order-writer")?).is_empty());
    Ok(())
}

#[test]
fn the_inventory_acknowledges_replicated_writes_by_default_where_redis_has_a_replica()
-> anyhow::Result<()> {
    let env = |sale: &FlashSale| -> anyhow::Result<Vec<Option<String>>> {
        let desired = build_at(sale, Stage::Active)?;
        let inventory = env_of(&desired, "weekend-deal-inventory")?;
        Ok([
            "INVENTORY_DURABILITY",
            "INVENTORY_DURABILITY_REPLICAS",
            "INVENTORY_DURABILITY_TIMEOUT_MS",
        ]
        .iter()
        .map(|key| inventory.get(*key).cloned().flatten())
        .collect())
    };
    let mut sale = fixtures::small_sale()?;
    // Unset in the spec: `auto`, which the inventory resolves against the
    // Redis it finds.
    assert_eq!(
        env(&sale)?,
        [Some("auto".into()), Some("1".into()), Some("50".into())]
    );
    sale.spec.inventory.durability = flashsale_api::flashsale::InventoryDurability {
        mode: flashsale_api::flashsale::DurabilityMode::Replicated,
        replicas: 2,
        timeout: flashsale_api::Duration::from_millis(120),
    };
    assert_eq!(
        env(&sale)?,
        [
            Some("replicated".into()),
            Some("2".into()),
            Some("120".into())
        ]
    );
    Ok(())
}

#[test]
fn the_payment_secret_is_mounted_into_the_gateway_only() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let desired = build_at(&sale, Stage::Active)?;
    let payment = |name: &str| -> anyhow::Result<Vec<SecretMount>> {
        Ok(secret_mounts(&desired, name)?
            .into_iter()
            .filter(|m| m.0 == "singles-day-payment")
            .collect())
    };
    assert_eq!(
        payment("singles-day-gateway")?,
        [(
            "singles-day-payment".to_owned(),
            vec![("webhook-secret".to_owned(), "secret".to_owned())],
            "/etc/flashsale/payment".to_owned()
        )]
    );
    assert_eq!(
        env_of(&desired, "singles-day-gateway")?.get("PAYMENT_SECRET_FILE"),
        Some(&Some("/etc/flashsale/payment/secret".to_owned()))
    );
    for other in ["singles-day-inventory", "singles-day-order-writer"] {
        assert!(payment(other)?.is_empty(), "{other}");
        assert!(!env_of(&desired, other)?.contains_key("PAYMENT_SECRET_FILE"));
    }
    // Without a payment block: no mount, no variable, no Secret to wait for.
    let small = fixtures::small_sale()?;
    let desired = build_at(&small, Stage::Active)?;
    assert!(!env_of(&desired, "weekend-deal-gateway")?.contains_key("PAYMENT_SECRET_FILE"));
    assert!(
        secret_refs(&small)
            .iter()
            .all(|(path, _)| !path.contains("payment"))
    );
    Ok(())
}

#[test]
fn the_inventory_publishes_expiries_to_the_orders_topic() -> anyhow::Result<()> {
    let sale = fixtures::big_sale()?;
    let desired = build_at(&sale, Stage::Active)?;
    let gateway = env_of(&desired, "singles-day-gateway")?;
    let inventory = env_of(&desired, "singles-day-inventory")?;
    for key in ["KAFKA_BROKERS", "ORDERS_TOPIC"] {
        assert_eq!(inventory.get(key), gateway.get(key), "{key}");
    }
    assert_eq!(
        inventory.get("ORDERS_TOPIC"),
        Some(&Some("flashsale.orders".to_owned()))
    );
    assert_eq!(
        inventory.get("KAFKA_BROKERS"),
        Some(&Some("kafka-0.kafka:9092,kafka-1.kafka:9092".to_owned()))
    );
    Ok(())
}

/// One ingress rule as (sources, ports): sources `None` = anywhere, else
/// each peer as "pods <labels>" or "namespace <name>".
type IngressRule = (Option<Vec<String>>, Vec<String>);

/// A policy's ingress rules.
fn ingress_of(desired: &Desired, name: &str) -> anyhow::Result<Vec<IngressRule>> {
    let policy = desired
        .network_policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .with_context(|| format!("no NetworkPolicy {name}"))?;
    let spec = policy.spec.as_ref().context("spec")?;
    ensure!(
        spec.policy_types.as_deref() == Some(&["Ingress".to_owned()][..]),
        "{name}: ingress only"
    );
    let labels = |s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>| {
        s.as_ref().map(|s| {
            s.match_labels
                .iter()
                .flatten()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
    };
    Ok(spec
        .ingress
        .iter()
        .flatten()
        .map(|rule| {
            let from = rule.from.as_ref().map(|peers| {
                peers
                    .iter()
                    .map(
                        |p| match (labels(&p.namespace_selector), labels(&p.pod_selector)) {
                            (Some(ns), None) => format!("namespace {ns}"),
                            (None, Some(pods)) => format!("pods {{{pods}}}"),
                            other => format!("{other:?}"),
                        },
                    )
                    .collect()
            });
            let ports = rule
                .ports
                .iter()
                .flatten()
                .map(|p| format!("{:?}/{}", p.port, p.protocol.as_deref().unwrap_or("")))
                .collect();
            (from, ports)
        })
        .collect())
}

#[test]
fn each_workload_admits_only_whom_it_serves() -> anyhow::Result<()> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let sale = fixtures::big_sale()?;
    let desired = build_at(&sale, Stage::Active)?;
    let http = format!("{:?}/TCP", Some(IntOrString::String("http".into())));
    let ops = format!("{:?}/TCP", Some(IntOrString::String("ops".into())));
    let namespace = "pods {}".to_owned();
    let operator = "namespace kubernetes.io/metadata.name=flashsale-system".to_owned();
    let gateways =
        "pods {app.kubernetes.io/component=gateway,app.kubernetes.io/part-of=singles-day}"
            .to_owned();
    assert_eq!(
        ingress_of(&desired, "singles-day-gateway")?,
        [
            (None, vec![http.clone()]),
            (
                Some(vec![namespace.clone(), operator.clone()]),
                vec![ops.clone()]
            ),
        ]
    );
    assert_eq!(
        ingress_of(&desired, "singles-day-inventory")?,
        [
            (Some(vec![gateways, operator.clone()]), vec![http]),
            (Some(vec![namespace.clone()]), vec![ops.clone()]),
        ]
    );
    assert_eq!(
        ingress_of(&desired, "singles-day-order-writer")?,
        [(Some(vec![namespace, operator]), vec![ops])]
    );
    // Each policy selects exactly its workload's pods, and names only ports
    // those pods have.
    for component in Component::ALL {
        let name = names::workload(&sale, component);
        let policy = desired
            .network_policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .context("policy")?;
        let deployment = deployment(&desired, &name)?;
        assert_eq!(
            policy.spec.as_ref().and_then(|s| s.pod_selector.as_ref()),
            Some(&deployment.spec.selector),
            "{name}"
        );
        let pod = deployment.spec.template.spec.as_ref().context("pod")?;
        let container_ports: Vec<String> = pod
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| p.name.clone())
            .collect();
        for rule in policy.spec.iter().flat_map(|s| s.ingress.iter().flatten()) {
            for port in rule.ports.iter().flatten() {
                match &port.port {
                    Some(IntOrString::String(port)) => {
                        ensure!(container_ports.contains(port), "{name}: port {port}")
                    }
                    other => bail!("{name}: port {other:?} is not named"),
                }
            }
        }
    }
    Ok(())
}

/// Where a pod's `REDIS_URL` comes from: a literal, or (Secret, key).
fn redis_source(desired: &Desired, name: &str) -> anyhow::Result<String> {
    let pod = template(desired, name)?.spec.as_ref().context("pod spec")?;
    let var = pod
        .containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "REDIS_URL")
        .context("no REDIS_URL")?;
    let secret = var
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .map(|s| format!("secret {}/{}", s.name, s.key));
    secret
        .or_else(|| var.value.clone())
        .context("REDIS_URL without a value")
}

#[test]
fn the_gateway_logs_in_to_redis_as_itself_when_given_its_own_user() -> anyhow::Result<()> {
    let mut sale = fixtures::small_sale()?;
    let shared = build_at(&sale, Stage::Active)?;
    assert_eq!(
        redis_source(&shared, "weekend-deal-gateway")?,
        redis_source(&shared, "weekend-deal-inventory")?,
        "without its own, the gateway uses the inventory's"
    );
    sale.spec.gateway.redis = Some(flashsale_api::flashsale::RedisSpec {
        url: None,
        url_secret_ref: Some(flashsale_api::common::SecretKeyRef {
            name: "redis-gateway-user".into(),
            key: "url".into(),
        }),
    });
    let own = build_at(&sale, Stage::Active)?;
    assert_eq!(
        redis_source(&own, "weekend-deal-gateway")?,
        "secret redis-gateway-user/url"
    );
    assert_eq!(
        redis_source(&own, "weekend-deal-inventory")?,
        redis_source(&shared, "weekend-deal-inventory")?
    );
    assert!(
        secret_refs(&sale)
            .iter()
            .any(|(path, s)| *path == "spec.gateway.redis.urlSecretRef"
                && s.name == "redis-gateway-user"),
        "the controller waits for the gateway's Secret too"
    );
    Ok(())
}
