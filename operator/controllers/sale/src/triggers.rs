//! What wakes a sale besides its own spec: its children and its pods.
//!
//! Each watch event is weighed before it wakes anything:
//! - a child changed by someone else (a hand edit, a deletion) wakes its
//!   sale at once, so the edit is reverted promptly;
//! - the echo of the operator's own apply wakes nobody (the ledger knows it);
//! - progress to report (a Deployment's ready replicas, a pod starting or
//!   failing) wakes the sale after [`STATUS_BATCH`], and every such event of
//!   the same sale meanwhile joins that one reconcile, so pods coming up
//!   cost one status write rather than one each.
//!
//! Children other than Deployments are watched as metadata only; the
//! Deployments in full, but only what the status needs is kept
//! ([`Workloads`]).

use std::{
    collections::HashMap,
    fmt::Debug,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use k8s_openapi::api::{
    apps::v1::Deployment,
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{ConfigMap, Pod, Service, ServiceAccount},
    networking::v1::NetworkPolicy,
    policy::v1::PodDisruptionBudget,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Resource, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::ObjectRef,
        scheduler::{ScheduleRequest, scheduler},
        watcher::{self, Event, watcher},
    },
};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::{Ctx, build, status::WorkloadView};
use flashsale_api::FlashSale;
use flashsale_kit::{ChildKey, apply::Namespaced, apply::kind_of, ledger::Seen};

/// How long progress events of one sale are gathered into one reconcile.
pub const STATUS_BATCH: Duration = Duration::from_millis(500);

/// What the status needs of each Deployment of the sales, as last watched
/// or applied, by (namespace, name), with the Deployment's generation.
#[derive(Debug, Default)]
pub struct Workloads {
    views: Mutex<HashMap<(String, String), (i64, WorkloadView)>>,
}

fn view_of(deployment: &Deployment) -> Option<((String, String), (i64, WorkloadView))> {
    let view = WorkloadView::of_labelled(deployment)?;
    let key = (deployment.namespace()?, deployment.name_any());
    Some((key, (deployment.metadata.generation.unwrap_or(0), view)))
}

impl Workloads {
    fn views(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (i64, WorkloadView)>> {
        self.views.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `deployment` as its watch shows it; returns whether its view
    /// changed.
    pub fn record(&self, deployment: &Deployment) -> bool {
        let Some((key, entry)) = view_of(deployment) else {
            return false;
        };
        self.views().insert(key, entry).map(|(_, view)| view) != Some(entry.1)
    }

    /// Records `deployment` as an apply returned it, unless the watch has
    /// shown the same generation already: the apply's answer can be older
    /// than the watch's last event (the pods became ready while the
    /// reconcile went on). A new generation (a changed spec) is newer than
    /// anything the watch has shown.
    pub fn fill(&self, deployment: &Deployment) {
        let Some((key, entry)) = view_of(deployment) else {
            return;
        };
        let mut views = self.views();
        if views
            .get(&key)
            .is_none_or(|(generation, _)| *generation < entry.0)
        {
            views.insert(key, entry);
        }
    }

    /// The view of Deployment `namespace/name`, if it was seen.
    pub fn get(&self, namespace: &str, name: &str) -> Option<WorkloadView> {
        self.views()
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|(_, view)| *view)
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.views()
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    fn retain(&self, keep: impl Fn(&str, &str) -> bool) {
        self.views().retain(|(ns, name), _| keep(ns, name));
    }
}

type Requests = BoxStream<'static, ScheduleRequest<ObjectRef<FlashSale>>>;

/// The wake-ups of the sales in `namespace` (all when `None`) from their
/// children and pods.
pub fn triggers(
    ctx: &Arc<Ctx>,
    namespace: Option<&str>,
) -> impl Stream<Item = ObjectRef<FlashSale>> + Send + 'static {
    let requests = futures::stream::select_all([
        children::<ServiceAccount>(ctx, namespace),
        children::<Role>(ctx, namespace),
        children::<RoleBinding>(ctx, namespace),
        children::<ConfigMap>(ctx, namespace),
        children::<Service>(ctx, namespace),
        children::<PodDisruptionBudget>(ctx, namespace),
        children::<NetworkPolicy>(ctx, namespace),
        children::<HorizontalPodAutoscaler>(ctx, namespace),
        deployments(ctx, namespace),
        pods(ctx, namespace),
    ]);
    // Keeps one pending wake-up per sale, at the earliest time asked for.
    scheduler(requests)
}

/// Only the operator's own objects.
fn managed() -> watcher::Config {
    watcher::Config::default().labels(&format!("{}={}", build::MANAGED_BY_KEY, build::MANAGED_BY))
}

/// An `Api` of `K`'s metadata only, in `namespace` or all of them.
fn metadata_api<K: Namespaced>(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Api<PartialObjectMeta<K>> {
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The sale that controls a child.
fn owner<K: Resource>(child: &K) -> Option<ObjectRef<FlashSale>> {
    let reference = child
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "FlashSale")?;
    Some(ObjectRef::new(&reference.name).within(&child.namespace()?))
}

fn wake(sale: ObjectRef<FlashSale>, after: Duration) -> ScheduleRequest<ObjectRef<FlashSale>> {
    ScheduleRequest {
        message: sale,
        run_at: Instant::now() + after,
    }
}

/// Weighs one watch event of a child against the ledger; `on_seen` adds
/// what the kind's own view says (a Deployment's progress). Returns the
/// wake-ups it causes.
fn weigh<K, F>(ctx: &Ctx, event: Event<K>, on_seen: F) -> Vec<ScheduleRequest<ObjectRef<FlashSale>>>
where
    K: Resource<DynamicType = ()>,
    F: Fn(&K, bool) -> Option<Duration>,
{
    let kind = kind_of::<K>();
    let key = |child: &K| ChildKey {
        kind,
        namespace: child.namespace().unwrap_or_default(),
        name: child.name_any(),
    };
    match event {
        Event::Init => {
            ctx.ledger.relist_started(kind);
            Vec::new()
        }
        Event::InitApply(child) | Event::Apply(child) => {
            let sale = owner(&child);
            let seen = ctx.ledger.saw(
                key(&child),
                sale.as_ref().map(|s| s.name.as_str()),
                child.meta(),
            );
            let changed = seen == Seen::Changed;
            let after = if changed { Some(Duration::ZERO) } else { None };
            let after = match (after, on_seen(&child, false)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            sale.zip(after)
                .map(|(sale, after)| wake(sale, after))
                .into_iter()
                .collect()
        }
        Event::Delete(child) => {
            ctx.ledger.deleted(&key(&child));
            on_seen(&child, true);
            owner(&child)
                .map(|sale| wake(sale, Duration::ZERO))
                .into_iter()
                .collect()
        }
        Event::InitDone => ctx
            .ledger
            .relist_done(kind)
            .into_iter()
            .map(|(namespace, name)| wake(ObjectRef::new(&name).within(&namespace), Duration::ZERO))
            .collect(),
    }
}

/// Logs a watch failure; the watch retries with backoff.
fn failed<T>(kind: &'static str, result: Result<T, watcher::Error>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(err) => {
            tracing::warn!(kind, error = %err, "watching the sales' children failed; retrying");
            None
        }
    }
}

fn children<K>(ctx: &Arc<Ctx>, namespace: Option<&str>) -> Requests
where
    K: Namespaced + DeserializeOwned + Debug,
{
    let ctx = ctx.clone();
    watcher(metadata_api::<K>(&ctx.client, namespace), managed())
        .default_backoff()
        .filter_map(|r| std::future::ready(failed(kind_of::<K>(), r)))
        .flat_map(move |event: Event<PartialObjectMeta<K>>| {
            futures::stream::iter(weigh(&ctx, event, |_, _| None))
        })
        .boxed()
}

fn deployments(ctx: &Arc<Ctx>, namespace: Option<&str>) -> Requests {
    let ctx = ctx.clone();
    watcher(
        flashsale_kit::api::<Deployment>(&ctx.client, namespace),
        managed(),
    )
    .default_backoff()
    .filter_map(|r| std::future::ready(failed("Deployment", r)))
    .flat_map(move |event: Event<Deployment>| {
        let workloads = &ctx.settings.workloads;
        let done = matches!(event, Event::InitDone);
        let wakes = weigh(&ctx, event, |deployment, deleted| {
            if deleted {
                workloads.forget(
                    &deployment.namespace().unwrap_or_default(),
                    &deployment.name_any(),
                );
                return None;
            }
            workloads.record(deployment).then_some(STATUS_BATCH)
        });
        if done {
            workloads.retain(|namespace, name| {
                ctx.ledger.is_watched(&ChildKey {
                    kind: "Deployment",
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            });
        }
        futures::stream::iter(wakes)
    })
    .boxed()
}

/// Pods belong to ReplicaSets, not to the sale: a pod that starts, becomes
/// ready or fails wakes the sale named by its part-of label, batched.
/// Metadata only: every change still arrives, at a fraction of the memory;
/// the reconcile reads full pods only while some are short.
fn pods(ctx: &Arc<Ctx>, namespace: Option<&str>) -> Requests {
    watcher(metadata_api::<Pod>(&ctx.client, namespace), managed())
        .default_backoff()
        .filter_map(|r| std::future::ready(failed("Pod", r)))
        .flat_map(|event: Event<PartialObjectMeta<Pod>>| {
            let pods = match event {
                Event::Apply(pod) | Event::InitApply(pod) | Event::Delete(pod) => Some(pod),
                Event::Init | Event::InitDone => None,
            };
            let wake = pods.and_then(|pod| {
                let sale = pod.labels().get(build::PART_OF_KEY)?;
                Some(wake(
                    ObjectRef::new(sale).within(&pod.namespace()?),
                    STATUS_BATCH,
                ))
            });
            futures::stream::iter(wake)
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64, ready: i32) -> Result<Deployment, serde_json::Error> {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "s-gateway",
                "namespace": "ns",
                "generation": generation,
                "labels": {build::COMPONENT_KEY: "gateway"}
            },
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": {"readyReplicas": ready}
        }))
    }

    #[test]
    fn an_older_apply_answer_never_hides_what_the_watch_showed_since()
    -> Result<(), serde_json::Error> {
        let workloads = Workloads::default();
        assert!(workloads.record(&deployment(1, 2)?), "first seen");
        assert!(!workloads.record(&deployment(1, 2)?), "unchanged");
        // The answer of an apply sent before the pods became ready.
        workloads.fill(&deployment(1, 0)?);
        assert_eq!(workloads.get("ns", "s-gateway").map(|v| v.ready), Some(2));
        // A changed spec is newer than anything watched.
        workloads.fill(&deployment(2, 0)?);
        assert_eq!(workloads.get("ns", "s-gateway").map(|v| v.ready), Some(0));
        // A first apply fills the gap before the watch's echo.
        workloads.forget("ns", "s-gateway");
        workloads.fill(&deployment(1, 0)?);
        assert!(workloads.get("ns", "s-gateway").is_some());
        Ok(())
    }
}
