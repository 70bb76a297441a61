//! Chaos Mesh's own controller runs against the local control plane and
//! really executes the two apiserver-only PodChaos actions on kwok pods:
//! pod-kill deletes exactly the named pod; pod-failure swaps every container's
//! image for the pause image and deleting the experiment restores them.

use std::{collections::BTreeMap, time::Duration};

use flashsale_e2e::{
    kube::{TestNamespace, await_running_pods, client},
    stack,
    wait::poll_until,
};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};

const IMAGES: [(&str, &str); 2] = [
    ("app", "flashsale/chaos-app:0"),
    ("side", "flashsale/chaos-side:0"),
];

fn pod_chaos_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("chaos-mesh.org", "v1alpha1", "PodChaos");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "podchaos"),
    )
}

/// A PodChaos aimed at one pod by name. Without Chaos Mesh's webhooks nothing
/// defaults the namespaces, so they are named too.
fn pod_chaos_on(name: &str, ns: &str, action: &str, pod: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "chaos-mesh.org/v1alpha1",
        "kind": "PodChaos",
        "metadata": { "name": name },
        "spec": {
            "action": action,
            "mode": "all",
            "selector": { "namespaces": [ns], "pods": { ns: [pod] } }
        }
    }))?)
}

/// Three pods of a two-container Deployment on kwok nodes, Running; returns
/// their names and uids.
async fn running_pods(client: &Client, ns: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let containers: Vec<_> = IMAGES
        .iter()
        .map(|(name, image)| serde_json::json!({ "name": name, "image": image }))
        .collect();
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "target" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "app": "target" } },
            "template": {
                "metadata": { "labels": { "app": "target" } },
                "spec": { "nodeSelector": { "type": "kwok" }, "containers": containers }
            }
        }
    }))?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await?;
    let running = await_running_pods(client, ns, "app=target", 3).await?;
    Ok(running
        .into_iter()
        .filter_map(|p| Some((p.metadata.name?, p.metadata.uid?)))
        .collect())
}

fn images(pod: &Pod) -> Vec<(String, String)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn pod_kill_deletes_exactly_the_named_pod() -> anyhow::Result<()> {
    let client = client().await?;
    let ns = TestNamespace::create(&client, "chaos-kill").await?;
    let before = running_pods(&client, &ns.name).await?;
    let (victim, victim_uid) = before
        .iter()
        .next()
        .map(|(n, u)| (n.clone(), u.clone()))
        .ok_or_else(|| anyhow::anyhow!("no pod"))?;

    pod_chaos_api(&client, &ns.name)
        .create(
            &PostParams::default(),
            &pod_chaos_on("kill-one", &ns.name, "pod-kill", &victim)?,
        )
        .await?;

    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    poll_until(
        "the named pod to be deleted",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let (pods, victim, uid) = (pods.clone(), victim.clone(), victim_uid.clone());
            async move {
                match pods.get_opt(&victim).await.map_err(|e| e.to_string())? {
                    Some(p) if p.metadata.uid.as_deref() == Some(uid.as_str()) => {
                        Err(format!("{victim} still there"))
                    }
                    _ => Ok(()),
                }
            }
        },
    )
    .await?;

    // The others are untouched: same names, same uids.
    for (name, uid) in before.iter().filter(|(n, _)| **n != victim) {
        let pod = pods.get(name).await?;
        assert_eq!(pod.metadata.uid.as_deref(), Some(uid.as_str()), "{name}");
        assert!(pod.metadata.deletion_timestamp.is_none(), "{name}");
    }
    Ok(())
}

#[tokio::test]
async fn pod_failure_swaps_in_the_pause_image_until_the_experiment_is_deleted() -> anyhow::Result<()>
{
    let pause = stack::chaos_mesh_pause_image()?;
    let client = client().await?;
    let ns = TestNamespace::create(&client, "chaos-fail").await?;
    let before = running_pods(&client, &ns.name).await?;
    let victim = before
        .keys()
        .next()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no pod"))?;
    let original: Vec<(String, String)> = IMAGES
        .iter()
        .map(|(n, i)| ((*n).to_owned(), (*i).to_owned()))
        .collect();

    let chaos = pod_chaos_api(&client, &ns.name);
    chaos
        .create(
            &PostParams::default(),
            &pod_chaos_on("fail-one", &ns.name, "pod-failure", &victim)?,
        )
        .await?;

    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let paused: Vec<(String, String)> = IMAGES
        .iter()
        .map(|(n, _)| ((*n).to_owned(), pause.clone()))
        .collect();

    let failed = await_images(
        &pods,
        &victim,
        &paused,
        "every container on the pause image",
    )
    .await?;
    // The original images are kept on the pod, so a person could restore them.
    let kept: Vec<&String> = failed
        .metadata
        .annotations
        .iter()
        .flat_map(|a| a.iter())
        .filter(|(k, _)| k.starts_with("chaos-mesh-fail-one-pod-failure-"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        kept.len(),
        IMAGES.len(),
        "{:?}",
        failed.metadata.annotations
    );

    // The other pods are untouched.
    for name in before.keys().filter(|n| **n != victim) {
        assert_eq!(images(&pods.get(name).await?), original, "{name}");
    }

    chaos.delete("fail-one", &DeleteParams::default()).await?;
    let restored = await_images(&pods, &victim, &original, "the original images back").await?;
    let left: Vec<&String> = restored
        .metadata
        .annotations
        .iter()
        .flat_map(|a| a.keys())
        .filter(|k| k.starts_with("chaos-mesh-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    await_gone(&chaos, "fail-one").await
}

/// Waits until the containers of pod `victim` run `want` (name, image), in
/// order, and returns the pod.
async fn await_images(
    pods: &Api<Pod>,
    victim: &str,
    want: &[(String, String)],
    what: &str,
) -> anyhow::Result<Pod> {
    let pod = poll_until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let pod = pods.get(victim).await.map_err(|e| e.to_string())?;
            let seen = images(&pod);
            if seen == want {
                Ok(pod)
            } else {
                Err(format!("images {seen:?}"))
            }
        },
    )
    .await?;
    Ok(pod)
}

/// Waits until the PodChaos `name` is gone: Chaos Mesh has restored its
/// target and removed its finalizer.
async fn await_gone(chaos: &Api<DynamicObject>, name: &str) -> anyhow::Result<()> {
    poll_until(
        "the PodChaos to be gone (its finalizer removed)",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            match chaos.get_opt(name).await.map_err(|e| e.to_string())? {
                Some(_) => Err("still there".to_owned()),
                None => Ok(()),
            }
        },
    )
    .await?;
    Ok(())
}
