//! What the benchmark sets up in the cluster: the CRDs, nodes of its own
//! (kwok fakes, tainted so that only its pods land there), an admission
//! policy that sends the pods of its namespaces to those nodes, and the
//! namespaces themselves.

use std::{collections::BTreeMap, future::Future, time::Duration};

use anyhow::Context as _;
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding},
        core::v1::{Namespace, Node, Pod, Secret},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::json;

/// Field manager of everything the benchmark applies.
pub const MANAGER: &str = "flashsale-bench";
/// Label of the benchmark's namespaces and nodes, and key of the nodes' taint.
pub const BENCH_LABEL: &str = "flashsale.dev/bench";
/// Label naming the benchmark process that created a namespace, so that an
/// interrupted benchmark deletes its own namespaces and nothing else.
pub const BENCH_ID_LABEL: &str = "flashsale.dev/bench-id";
const POLICY: &str = "flashsale-bench-nodes";

/// Polls `probe` every `every` until it yields `Some`, or fails after
/// `deadline` with `what`.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        if start.elapsed() >= deadline {
            anyhow::bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Server-side applies the operator's CRDs and waits until each is
/// Established.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(MANAGER).force();
    for crd in flashsale_api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
        wait_for(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async {
                let crd = crds.get(&name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// Name of the `index`-th (1-based) benchmark node.
pub fn node_name(index: usize) -> String {
    format!("kwok-bench-{index}")
}

/// A kwok fake node like the stack's (same labels and annotations), bigger,
/// labelled and tainted as the benchmark's.
fn bench_node(index: usize, pods: u32) -> anyhow::Result<Node> {
    let name = node_name(index);
    let zone = format!("local-{}", (index - 1) % 3 + 1);
    let resources = json!({"cpu": "256", "memory": "1Ti", "pods": pods.to_string()});
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/role": "agent",
                "node-role.kubernetes.io/agent": "",
                "topology.kubernetes.io/zone": zone,
                "type": "kwok",
                BENCH_LABEL: "true"
            }
        },
        "spec": {"taints": [{"key": BENCH_LABEL, "value": "true", "effect": "NoSchedule"}]},
        "status": {"allocatable": resources, "capacity": resources}
    }))?)
}

/// Creates (or updates) the benchmark's nodes and waits until kwok reports
/// them Ready.
pub async fn create_nodes(client: &Client, count: usize, pods: u32) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for index in 1..=count {
        let node = bench_node(index, pods)?;
        let name = node_name(index);
        // A create keeps the status (capacity); an existing node, left by an
        // interrupted run, gets its spec, labels and capacity patched.
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let patch = serde_json::to_value(&node)?;
                nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                nodes
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Err(err) => return Err(err).with_context(|| format!("creating node {name}")),
        }
    }
    wait_for(
        "benchmark nodes Ready",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let list = nodes
                .list(&ListParams::default().labels(&format!("{BENCH_LABEL}=true")))
                .await?;
            let ready = list
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            Ok((ready >= count).then_some(()))
        },
    )
    .await
}

/// Deletes the benchmark's nodes.
pub async fn delete_nodes(client: &Client, count: usize) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for index in 1..=count {
        delete_if_present(&nodes, &node_name(index)).await?;
    }
    Ok(())
}

/// Installs the admission policy that gives every pod created in a namespace
/// labelled [`BENCH_LABEL`] a node selector and a toleration for the
/// benchmark's nodes, so the benchmark's pods and other users' pods of the
/// shared stack never share nodes. The binding's namespace selector is what
/// limits it to those namespaces.
pub async fn install_policy(client: &Client) -> anyhow::Result<()> {
    let toleration = format!(
        r#"Object.spec.tolerations{{key: "{BENCH_LABEL}", operator: "Exists", effect: "NoSchedule"}}"#
    );
    let expression = format!(
        r#"(has(object.spec.nodeSelector)
  ? [JSONPatch{{op: "add", path: "/spec/nodeSelector/" + jsonpatch.escapeKey("{BENCH_LABEL}"), value: "true"}}]
  : [JSONPatch{{op: "add", path: "/spec/nodeSelector", value: {{"{BENCH_LABEL}": "true"}}}}])
+ (has(object.spec.tolerations)
  ? [JSONPatch{{op: "add", path: "/spec/tolerations/-", value: {toleration}}}]
  : [JSONPatch{{op: "add", path: "/spec/tolerations", value: [{toleration}]}}])"#
    );
    let selector = json!({"matchLabels": {BENCH_LABEL: "true"}});
    let policy: MutatingAdmissionPolicy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "namespaceSelector": selector,
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]
                }]
            },
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}]
        }
    }))?;
    let binding: MutatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {"policyName": POLICY, "matchResources": {"namespaceSelector": selector}}
    }))?;
    let params = PatchParams::apply(MANAGER).force();
    Api::<MutatingAdmissionPolicy>::all(client.clone())
        .patch(POLICY, &params, &Patch::Apply(&policy))
        .await
        .context("installing the MutatingAdmissionPolicy (admissionregistration.k8s.io/v1)")?;
    Api::<MutatingAdmissionPolicyBinding>::all(client.clone())
        .patch(POLICY, &params, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// Removes the admission policy and its binding.
pub async fn delete_policy(client: &Client) -> anyhow::Result<()> {
    delete_if_present(
        &Api::<MutatingAdmissionPolicyBinding>::all(client.clone()),
        POLICY,
    )
    .await?;
    delete_if_present(&Api::<MutatingAdmissionPolicy>::all(client.clone()), POLICY).await
}

/// Waits until a pod created in `ns` would get the benchmark's node selector
/// (the apiserver loads policies asynchronously), using a dry-run create.
pub async fn await_policy(client: &Client, ns: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bench-policy-probe"},
        "spec": {"containers": [{"name": "c", "image": "probe"}]}
    }))?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for(
        "the admission policy to apply to the benchmark namespace",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let pod = pods.create(&params, &probe).await?;
            let selected = pod
                .spec
                .and_then(|s| s.node_selector)
                .is_some_and(|s| s.contains_key(BENCH_LABEL));
            Ok(selected.then_some(()))
        },
    )
    .await
}

/// Creates the namespace `name`, labelled for the policy and with `bench_id`.
pub async fn create_namespace(client: &Client, name: &str, bench_id: &str) -> anyhow::Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                (BENCH_LABEL.to_owned(), "true".to_owned()),
                (BENCH_ID_LABEL.to_owned(), bench_id.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// Names of the namespaces this benchmark process created.
pub async fn own_namespaces(client: &Client, bench_id: &str) -> anyhow::Result<Vec<String>> {
    let list = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{BENCH_ID_LABEL}={bench_id}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect())
}

/// The Secrets a sale references (`jwt`/`hs256` and `db`/`url`).
pub async fn create_secrets(client: &Client, ns: &str) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for (name, key) in [("jwt", "hs256"), ("db", "url")] {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                key.to_owned(),
                ByteString(b"0123456789abcdef0123456789abcdef".to_vec()),
            )])),
            ..Secret::default()
        };
        secrets.create(&PostParams::default(), &secret).await?;
    }
    Ok(())
}

/// How many objects `api` lists: one item plus `remainingItemCount`, so a
/// namespace of thousands of pods is counted without listing them.
pub async fn count<K>(api: &Api<K>) -> anyhow::Result<u64>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let page = api.list_metadata(&ListParams::default().limit(1)).await?;
    let remaining = page.metadata.remaining_item_count.unwrap_or(0);
    Ok(page.items.len() as u64 + u64::try_from(remaining).unwrap_or(0))
}

/// Deletes namespace `name` and waits until it is gone, printing how many
/// pods are left; gives up (with a warning) after `deadline`.
pub async fn delete_namespace(
    client: &Client,
    name: &str,
    deadline: Duration,
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    delete_if_present(&namespaces, name).await?;
    let start = tokio::time::Instant::now();
    let mut last_print = start;
    loop {
        match namespaces.get_opt(name).await? {
            None => {
                println!(
                    "  namespace {name} deleted after {:.1} s",
                    start.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            Some(_) if start.elapsed() >= deadline => {
                println!(
                    "  warning: namespace {name} still terminating after {:.0} s; going on",
                    deadline.as_secs_f64()
                );
                return Ok(());
            }
            Some(_) => {}
        }
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = tokio::time::Instant::now();
            println!(
                "  deleting {name}: {} pods left after {:.0} s",
                count(&pods).await?,
                start.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err).with_context(|| format!("deleting {name}")),
    }
}
