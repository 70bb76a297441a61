//! The Secret `flashsale-stack/stores` leads a run holding only a
//! kubeconfig to the stack's own stores and Prometheus, by either reach
//! (`flashsale_e2e::same_store` tells each store by what it says of itself
//! or what a run writes through it). And the
//! stores a kind cluster's install puts up are valid objects the Secret
//! names.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use flashsale_e2e::{
    kube::TestNamespace,
    reach::Reach,
    same_store, stack,
    stores::{Stores, StoresError, Urls},
};
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams, ValidationDirective},
    discovery::Scope,
};
use serde::Deserialize;

#[tokio::test]
async fn the_stores_secret_leads_to_the_stacks_own_stores_by_either_reach() -> anyhow::Result<()> {
    let client = flashsale_e2e::kube::client().await?;
    for reach in [Reach::ServiceIp, Reach::Apiserver] {
        let stores = Stores::discover(&client, reach).await?;
        assert_eq!(
            stores.in_cluster,
            Urls {
                redis: stack::in_cluster::redis_url()?,
                database: stack::in_cluster::database_url()?,
                kafka_brokers: stack::in_cluster::kafka_brokers()?,
                prometheus: stack::in_cluster::prometheus_url()?,
            },
            "{reach:?}: the pods' addresses are the Secret's"
        );
        same_store::redis(&stores.here.redis, &stack::redis_url()?).await?;
        same_store::database(&stores.here.database, &stack::postgres_url()?).await?;
        same_store::kafka(&stores.here.kafka_brokers, &stack::kafka_brokers()?).await?;
        let prometheus: prometheus_http_query::Client = stores.here.prometheus.parse()?;
        let up = prometheus.query("up").get().await?;
        assert!(
            up.data().as_vector().is_some_and(|v| !v.is_empty()),
            "{reach:?}: Prometheus at {} has no targets: {up:?}",
            stores.here.prometheus
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_missing_or_incomplete_stores_secret_is_named_with_what_to_do() -> anyhow::Result<()> {
    let client = flashsale_e2e::kube::client().await?;
    let ns = TestNamespace::create(&client, "stores-secret").await?;
    // Why the stores cannot be found; finding them fails the test.
    let refusal = || async {
        match Stores::discover_in(&client, &ns.name, Reach::ServiceIp).await {
            Ok(_) => anyhow::bail!("stores found without a complete Secret"),
            Err(err) => Ok(err),
        }
    };

    let missing = refusal().await?.to_string();
    for part in [
        &format!("{}/stores", ns.name),
        "create it",
        "prometheus-url",
    ] {
        assert!(missing.contains(part), "{part:?} not in {missing}");
    }

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let write = |data: &[(&str, &str)]| {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("stores".to_owned()),
                ..ObjectMeta::default()
            },
            string_data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Secret::default()
        };
        let secrets = secrets.clone();
        async move {
            secrets
                .patch(
                    "stores",
                    &PatchParams::apply("smoke").force(),
                    &Patch::Apply(&secret),
                )
                .await
        }
    };
    write(&[("redis-url", "redis://10.0.0.1:6379")]).await?;
    let key = refusal().await?;
    assert!(
        matches!(
            &key,
            StoresError::Key {
                key: "database-url",
                ..
            }
        ),
        "{key}"
    );

    write(&[
        ("redis-url", "redis://10.0.0.1:6379"),
        ("database-url", "postgres://u@10.0.0.1/orders"),
        ("kafka-brokers", "kafka.shop.svc"),
        ("prometheus-url", "http://10.0.0.1:9090"),
    ])
    .await?;
    let port = refusal().await?.to_string();
    assert!(
        port.contains("kafka-brokers") && port.contains("kafka.shop.svc") && port.contains("port"),
        "{port}"
    );
    Ok(())
}

/// What a kind cluster's install puts up for the suite
/// (`e2e/kind/stores.yaml`, which kind alone runs): every object is one
/// the apiserver takes as written (a server-side dry run with strict field
/// validation), and its Secret names every store by a Service the file
/// defines, at one of that Service's ports.
#[tokio::test]
async fn the_kind_installs_stores_are_valid_and_its_secret_names_their_services()
-> anyhow::Result<()> {
    let client = flashsale_e2e::kube::client().await?;
    let path = flashsale_e2e::checkout::path("e2e/kind/stores.yaml")?;
    let text = std::fs::read_to_string(&path)?;
    let dry_run = PatchParams {
        dry_run: true,
        force: true,
        field_manager: Some("kind-stores-check".into()),
        field_validation: Some(ValidationDirective::Strict),
    };
    let mut ports = BTreeSet::new();
    let mut named = BTreeMap::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let object = DynamicObject::deserialize(document)?;
        let types = object
            .types
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("an object without a kind"))?;
        let gvk = GroupVersionKind::try_from(types)?;
        let (resource, capabilities) = kube::discovery::pinned_kind(&client, &gvk).await?;
        let name = object.name_any();
        let api: Api<DynamicObject> = match (&capabilities.scope, object.namespace()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &dry_run, &Patch::Apply(&object))
            .await
            .with_context(|| format!("{} {name}", gvk.kind))?;
        match gvk.kind.as_str() {
            "Service" => {
                let ns = object.namespace().unwrap_or_default();
                for port in object.data["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    ports.insert(format!("{name}.{ns}.svc.cluster.local:{}", port["port"]));
                }
            }
            "Secret" if name == "stores" => {
                for (key, value) in object.data["stringData"].as_object().into_iter().flatten() {
                    named.insert(key.clone(), value.as_str().unwrap_or_default().to_owned());
                }
            }
            _ => {}
        }
    }
    let keys: BTreeSet<&str> = named.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "database-url",
            "kafka-brokers",
            "kafka-outside",
            "prometheus-url",
            "redis-url"
        ]),
        "the Secret's keys"
    );
    for (key, value) in &named {
        // host:port after any scheme and credentials, before any path.
        let after_scheme = value.split("://").last().unwrap_or_default();
        let authority = after_scheme.split('/').next().unwrap_or_default();
        let host_port = authority.rsplit('@').next().unwrap_or_default();
        assert!(
            ports.contains(host_port),
            "{key}: {host_port} is no port of a Service in the file: {ports:?}"
        );
    }
    Ok(())
}
