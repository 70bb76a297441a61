//! Kubernetes helpers for tests against the local control plane.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use futures::StreamExt;

use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Pod, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{
        DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
        WatchParams,
    },
};

use crate::{
    stack,
    wait::{Timeout, poll_until},
};

/// Why no client could be had.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The stack's variables are not loaded.
    #[error(transparent)]
    Missing(#[from] stack::MissingComponent),
    /// The kubeconfig does not work.
    #[error("cannot build a client from the local stack's kubeconfig: {0}")]
    Config(#[from] kube::Error),
}

/// A client for the local control plane, or a clear error if the stack's
/// kubeconfig is not set.
pub async fn client() -> Result<Client, ClientError> {
    stack::kubeconfig()?;
    Ok(Client::try_default().await?)
}

/// Why CRDs could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The apiserver refused the CRD.
    #[error("applying CRD {name}: {source}")]
    Apply {
        /// The CRD.
        name: String,
        /// What the apiserver said.
        source: kube::Error,
    },
    /// The CRD did not become Established in time.
    #[error(transparent)]
    NotEstablished(#[from] Timeout),
}

/// Installs `crds` (server-side apply as `manager`) and waits until each is
/// Established, so objects of their kinds can be created at once.
pub async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
    manager: &str,
) -> Result<(), InstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(manager).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|source| InstallError::Apply {
                name: name.clone(),
                source,
            })?;
        poll_until(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let (api, name) = (api.clone(), name.clone());
                async move {
                    let crd = api.get(&name).await.map_err(|e| e.to_string())?;
                    let established = crd
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True");
                    if established {
                        Ok(())
                    } else {
                        Err("not established".to_owned())
                    }
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Creates the Secret `name` in `namespace` with one `key` holding 32 bytes
/// of test data (long enough for an HS256 or HMAC key).
pub async fn create_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<(), kube::Error> {
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
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// Waits up to a minute until exactly `count` pods matching `selector` in
/// `namespace` are Running, and returns them.
pub async fn await_running_pods(
    client: &Client,
    namespace: &str,
    selector: &str,
    count: usize,
) -> Result<Vec<Pod>, Timeout> {
    await_pods(
        client,
        (namespace, selector),
        count,
        ("Running", Duration::from_secs(60)),
        |p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
    )
    .await
}

/// Waits up to `deadline` until exactly `count` pods matching `selector` in
/// `namespace` are what `keep` accepts (`state` names it for the timeout's
/// message), and returns them.
pub async fn await_pods(
    client: &Client,
    (namespace, selector): (&str, &str),
    count: usize,
    (state, deadline): (&str, Duration),
    keep: impl Fn(&Pod) -> bool,
) -> Result<Vec<Pod>, Timeout> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let keep = &keep;
    poll_until(
        &format!("{count} pods {selector} {state}"),
        deadline,
        Duration::from_millis(200),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(|e| e.to_string())?;
                let kept: Vec<Pod> = list.items.into_iter().filter(|p| keep(p)).collect();
                if kept.len() == count {
                    Ok(kept)
                } else {
                    Err(format!("{} of {count} {state}", kept.len()))
                }
            }
        },
    )
    .await
}

/// A namespace for one test, deleted (in the background) when dropped, so
/// tests never see each other's objects.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
}

impl TestNamespace {
    /// Creates a namespace named after `prefix` and a unique suffix.
    pub async fn create(client: &Client, prefix: &str) -> Result<Self, kube::Error> {
        Self::create_labelled(client, prefix, &[]).await
    }

    /// Creates a namespace named after `prefix` and a unique suffix, with
    /// `labels` (a Pod Security level, for one).
    pub async fn create_labelled(
        client: &Client,
        prefix: &str,
        labels: &[(&str, &str)],
    ) -> Result<Self, kube::Error> {
        let name = stack::unique_name(prefix);
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: (!labels.is_empty()).then_some(labels),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Self { name })
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        with_fresh_client(|client| async move {
            let api = Api::<Namespace>::all(client);
            let _ = api.delete(&name, &DeleteParams::background()).await;
        });
    }
}

/// Runs `cleanup` to its end with a fresh client on a runtime of its own, for
/// `Drop`: the test's runtime (and its client's background worker) may be
/// shutting down. Best effort: the test's verdict is already decided.
pub fn with_fresh_client<F, Fut>(cleanup: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let done = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            if let Ok(client) = Client::try_default().await {
                cleanup(client).await;
            }
        });
    });
    let _ = done.join();
}

/// From `since` until nothing `selector` selects is left: a list, then a
/// watch from the list's version, so each delete is seen the moment the
/// apiserver makes it (a poll would add up to a list's time).
pub async fn until_gone<K>(
    api: &Api<K>,
    selector: &str,
    since: Instant,
    bound: Duration,
) -> anyhow::Result<Duration>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + 'static,
{
    let list = api.list(&ListParams::default().labels(selector)).await?;
    let mut left: BTreeSet<String> = list.items.iter().map(ResourceExt::name_any).collect();
    if left.is_empty() {
        return Ok(since.elapsed());
    }
    let version = list.metadata.resource_version.unwrap_or_default();
    let mut events = api
        .watch(&WatchParams::default().labels(selector), &version)
        .await?
        .boxed();
    let deadline = since + bound;
    while !left.is_empty() {
        let event = tokio::time::timeout_at(deadline.into(), events.next())
            .await
            .map_err(|_| anyhow::anyhow!("{left:?} of {selector} still there after {bound:?}"))?
            .ok_or_else(|| anyhow::anyhow!("the watch of {selector} ended"))??;
        if let WatchEvent::Deleted(object) = event {
            left.remove(&object.name_any());
        }
    }
    Ok(since.elapsed())
}
