//! The local control plane schedules real workloads onto kwok nodes, and the
//! apiserver validates Chaos Mesh objects against Chaos Mesh's own schema.

use std::time::Duration;

use flashsale_e2e::{
    kube::{TestNamespace, await_running_pods, client},
    wait::poll_until,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};

#[tokio::test]
async fn deployment_pods_reach_running_on_kwok_nodes() -> anyhow::Result<()> {
    let client = client().await?;
    let version = client.apiserver_version().await?;
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "37"),
        "{version:?}"
    );
    let ns = TestNamespace::create(&client, "smoke").await?;

    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "smoke" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "app": "smoke" } },
            "template": {
                "metadata": { "labels": { "app": "smoke" } },
                "spec": { "containers": [{ "name": "app", "image": "flashsale/smoke:0" }] }
            }
        }
    }))?;
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &deployment)
        .await?;

    let nodes: Vec<String> = await_running_pods(&client, &ns.name, "app=smoke", 3)
        .await?
        .into_iter()
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .collect();
    assert!(
        nodes.iter().all(|n| n.starts_with("kwok-node-")),
        "{nodes:?}"
    );

    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns.name);
    let ready = poll_until(
        "Deployment to report 3 ready replicas",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("smoke").await.map_err(|e| e.to_string())?;
                let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                if ready == 3 {
                    Ok(ready)
                } else {
                    Err(format!("{ready} ready"))
                }
            }
        },
    )
    .await?;
    assert_eq!(ready, 3);
    Ok(())
}

fn pod_chaos_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("chaos-mesh.org", "v1alpha1", "PodChaos");
    // The plural is irregular ("podchaos"), so it is given, not derived.
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "podchaos"),
    )
}

fn pod_chaos(name: &str, ns: &str, action: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "chaos-mesh.org/v1alpha1",
        "kind": "PodChaos",
        "metadata": { "name": name },
        "spec": {
            "action": action,
            "mode": "fixed-percent",
            "value": "2",
            "duration": "30s",
            "selector": { "namespaces": [ns], "labelSelectors": { "app": "smoke" } }
        }
    }))?)
}

#[tokio::test]
async fn chaos_mesh_schema_accepts_a_valid_podchaos_and_rejects_an_invalid_one()
-> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "smoke").await?;
    let api = pod_chaos_api(&client, &ns.name);

    let created = api
        .create(
            &PostParams::default(),
            &pod_chaos("kill-2pct", &ns.name, "pod-kill")?,
        )
        .await?;
    assert_eq!(created.data["spec"]["action"], "pod-kill");

    let rejected = api
        .create(
            &PostParams::default(),
            &pod_chaos("explode", &ns.name, "explode")?,
        )
        .await;
    match rejected {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains("spec.action"), "{}", status.message);
        }
        other => anyhow::bail!("an invalid PodChaos was not rejected: {other:?}"),
    }
    Ok(())
}
