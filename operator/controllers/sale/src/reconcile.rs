//! One reconcile of a FlashSale: gather → validate → build → apply → prune →
//! status, then sleep exactly until the next phase change (or the next status
//! refresh, whichever comes first).

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::{
    autoscaling::v2::HorizontalPodAutoscaler,
    core::v1::{Pod, Secret},
};
use kube::{Api, ResourceExt, api::ListParams, runtime::controller::Action};

use super::{
    Ctx, build, build::Input, build::Stage, drain, lifecycle, status, status::Drain,
    status::Observation, status::WorkloadView, tokens,
};
use flashsale_api::reasons::SaleReason;
use flashsale_api::{
    FlashSale, children::Component, conditions::DRAINED, flashsale::SalePhase, timeline::Timeline,
    validate,
};
use flashsale_kit::{Blocker, Failure as Error, Identity, Verb, apply, apply::Namespaced, key};
use flashsale_observe::{pods, probe::SaleAddress};

/// The FlashSale controller.
pub const IDENTITY: Identity = Identity {
    name: "flashsale",
    // The operator's name, unchanged since the first release, so the fields
    // of existing children keep one owner.
    field_manager: "flashsale-operator",
};

/// Reconciles one sale; every error is also a Warning Event and a metric.
pub async fn reconcile(sale: Arc<FlashSale>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    flashsale_kit::reconcile(sale, ctx, |sale, ctx| async move {
        reconcile_sale(&sale, &ctx).await
    })
    .await
}

async fn reconcile_sale(sale: &FlashSale, ctx: &Ctx) -> Result<Action, Error> {
    // A sale being deleted is left to the garbage collector: applying its
    // children again would recreate what the collector removes.
    if sale.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = sale
        .namespace()
        .ok_or(flashsale_kit::Error::MissingMetadata("metadata.namespace"))?;
    let now = ctx.clock.now();
    let old = sale.status.as_ref();
    let generation = sale.metadata.generation;

    let token = match gather(ctx, &namespace, sale).await? {
        Ok(token) => token,
        Err(blocker) => return block(ctx, sale, &blocker).await,
    };

    let timeline = Timeline::of(&sale.spec);
    let (phase, next) = timeline.phase_at(now);
    let settled = timeline.settled(now);
    let drain = drain(ctx, &namespace, sale, phase, &timeline, settled).await;
    let stage = lifecycle::stage(phase, settled, drain == Drain::Drained);

    // build (pure) and apply.
    let desired = build::build(&Input {
        sale,
        images: &ctx.settings.images,
        stage,
        operator_namespace: &ctx.settings.operator_namespace,
    })?;
    let skus: Vec<String> = sale.spec.items.iter().map(|i| i.sku.clone()).collect();
    let address = SaleAddress {
        namespace: namespace.clone(),
        name: sale.name_any(),
        id: build::sale_id(sale)?,
    };
    // The writes and the stock reading are independent: run them together,
    // so a transition shows in the status a few round trips after its time.
    let writes = async {
        let workloads = apply_all(ctx, sale, &desired).await?;
        prune(ctx, &namespace, sale, &desired).await?;
        Ok::<_, Error>(workloads)
    };
    let stock = read_stock(ctx, sale, stage, &address, &token, &skus, now);
    let (workloads, stock) = tokio::join!(writes, stock);
    let workloads = match workloads {
        Err(Error::Kit(err @ flashsale_kit::Error::NotOwned { .. })) => {
            let blocker = Blocker {
                reason: SaleReason::ObjectNotOwned,
                message: err.to_string(),
            };
            return block(ctx, sale, &blocker).await;
        }
        other => other?,
    };
    let pod_problems = if workloads
        .iter()
        .all(|w| w.ready >= w.desired && w.rolled_out)
    {
        Vec::new()
    } else {
        failing_pods(ctx, &namespace, sale).await?
    };
    let seen = Observation {
        phase,
        next_transition: next,
        workloads,
        stock,
        drain,
        pod_problems,
    };
    let new = status::observed(old, generation, &seen, now);
    write_status(ctx, sale, &new, None).await?;
    announce_pod_problem(ctx, sale, &seen).await;
    tracing::debug!(sale = %key(sale), ?phase, ?stage, next = ?next, "reconciled");
    Ok(requeue(ctx, now, next, stage))
}

/// The sale's stock, or why it could not be read; `None` when nobody runs.
/// An inventory without a ready replica is not asked, and one that did not
/// answer is asked again only when its pace says so: until then the last
/// answer (the status's message) stands.
async fn read_stock(
    ctx: &Ctx,
    sale: &FlashSale,
    stage: Stage,
    address: &SaleAddress,
    token: &str,
    skus: &[String],
    now: Timestamp,
) -> Option<Result<Vec<flashsale_api::flashsale::ItemStatus>, String>> {
    let pace = &ctx.settings.stock_pace;
    let sale_key = key(sale);
    if stage == Stage::Drained {
        pace.forget(&sale_key);
        return None;
    }
    let inventory = build::names::workload(sale, Component::Inventory);
    let ready = ctx
        .settings
        .workloads
        .get(&address.namespace, &inventory)
        .is_some_and(|view| view.ready > 0);
    if !ready {
        return Some(Err(format!(
            "Deployment {inventory} has no ready replica to ask"
        )));
    }
    let last = sale
        .status
        .as_ref()
        .and_then(|s| {
            s.observed
                .get(flashsale_api::conditions::INVENTORY_REACHABLE)
        })
        .filter(|c| c.status == "False");
    if let Some(last) = last
        && !pace.due(&sale_key, now)
    {
        return Some(Err(last.message.clone()));
    }
    let read = ctx
        .settings
        .probe
        .stock(address, token, skus)
        .await
        .map_err(|err| err.to_string());
    pace.read(&sale_key, read.is_ok(), now, ctx.settings.refresh);
    Some(read)
}

/// Shows why the sale cannot proceed, and when to look again: a bad spec
/// (or image) waits for an edit; what cannot be watched for cheaply (a
/// missing Secret, an object in the way) is looked for again, less and
/// less often.
async fn block(
    ctx: &Ctx,
    sale: &FlashSale,
    blocker: &Blocker<SaleReason>,
) -> Result<Action, Error> {
    let now = ctx.clock.now();
    let new = status::blocked(sale.status.as_ref(), sale.metadata.generation, blocker, now);
    write_status(ctx, sale, &new, Some(blocker)).await?;
    let edit_needed = [SaleReason::InvalidSpec, SaleReason::ImageNotAllowed];
    Ok(if edit_needed.contains(&blocker.reason) {
        Action::await_change()
    } else {
        Action::requeue(ctx.backoff(&key(sale)))
    })
}

/// Why the sale's pods that do not run do not run, read from the pods.
async fn failing_pods(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
) -> Result<Vec<pods::PodProblem>, Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!(
        "{}={},{}={}",
        build::PART_OF_KEY,
        sale.name_any(),
        build::MANAGED_BY_KEY,
        build::MANAGED_BY
    );
    let listed = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(flashsale_kit::Error::kube(Verb::List, "Pod", selector))?;
    Ok(pods::problems(&listed.items))
}

/// A Warning Event when a pod problem first becomes the reason the sale is
/// stalled, so `kubectl describe` and alerting on Events see it once, not at
/// every refresh.
async fn announce_pod_problem(ctx: &Ctx, sale: &FlashSale, seen: &Observation) {
    let Some(first) = seen.pod_problems.first() else {
        return;
    };
    let was = sale
        .status
        .as_ref()
        .and_then(|s| s.observed.get(flashsale_api::conditions::STALLED))
        .filter(|c| c.status == "True")
        .map(|c| c.reason.as_str());
    if was != Some(first.reason.as_str()) {
        ctx.event(sale, true, SaleReason::Pod(first.reason), first.to_string())
            .await;
    }
}

/// Wakes at the next phase change, or sooner to refresh replicas and stock
/// while anything runs.
fn requeue(ctx: &Ctx, now: Timestamp, next: Option<Timestamp>, stage: Stage) -> Action {
    let until_next = next.map(|at| {
        let wait = at.duration_since(now);
        // Round up, so the wake-up is never a hair before the change.
        std::time::Duration::try_from(wait)
            .unwrap_or_default()
            .saturating_add(std::time::Duration::from_millis(1))
    });
    let refresh = (stage != Stage::Drained).then_some(ctx.settings.refresh);
    match (until_next, refresh) {
        (Some(a), Some(b)) => Action::requeue(a.min(b)),
        (Some(a), None) | (None, Some(a)) => Action::requeue(a),
        (None, None) => Action::await_change(),
    }
}

/// Validates the spec and its images, then gathers what it refers to: the
/// Secrets it names, and the sale's internal Secret (created when absent),
/// whose API token is returned. The first problem found blocks the sale,
/// before anything of it is written.
async fn gather(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
) -> Result<Result<String, Blocker<SaleReason>>, Error> {
    let checks = [
        (SaleReason::InvalidSpec, validate::flash_sale(&sale.spec)),
        (
            SaleReason::ImageNotAllowed,
            ctx.settings.allowed_images.refused(&sale.spec),
        ),
    ];
    for (reason, problems) in checks {
        if !problems.is_empty() {
            let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
            return Ok(Err(Blocker {
                reason,
                message: list.join("; "),
            }));
        }
    }
    if let Some(blocker) = missing_secret(ctx, namespace, sale).await? {
        return Ok(Err(blocker));
    }
    tokens::ensure(ctx, namespace, sale).await
}

/// The first Secret the spec names that does not exist or lacks its key.
async fn missing_secret(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
) -> Result<Option<Blocker<SaleReason>>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    for (field, reference) in build::secret_refs(sale) {
        let secret = api
            .get_opt(&reference.name)
            .await
            .map_err(flashsale_kit::Error::kube(
                Verb::Read,
                "Secret",
                &reference.name,
            ))?;
        let Some(secret) = secret else {
            return Ok(Some(Blocker {
                reason: SaleReason::SecretMissing,
                message: format!(
                    "Secret {namespace}/{} ({field}) does not exist; create it with key {:?}",
                    reference.name, reference.key
                ),
            }));
        };
        let has_key = secret
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key(&reference.key))
            || secret
                .string_data
                .as_ref()
                .is_some_and(|d| d.contains_key(&reference.key));
        if !has_key {
            return Ok(Some(Blocker {
                reason: SaleReason::SecretKeyMissing,
                message: format!(
                    "Secret {namespace}/{} ({field}) has no key {:?}",
                    reference.name, reference.key
                ),
            }));
        }
    }
    Ok(None)
}

/// Where the order-writer's drain stands. Its lag is read only once the
/// sale is settled, and `Drained` is sticky: after scaling to zero there is
/// nobody left to ask.
async fn drain(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
    phase: SalePhase,
    timeline: &Timeline,
    settled: bool,
) -> Drain {
    if phase != SalePhase::Ended {
        return Drain::NotEnded;
    }
    if sale
        .status
        .as_ref()
        .is_some_and(|s| s.observed.is_true(DRAINED))
    {
        return Drain::Drained;
    }
    if !settled {
        return Drain::Settling(timeline.settled_at);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = build::selector(&sale.name_any(), Component::OrderWriter)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(err) => return Drain::Unknown(format!("listing the order-writer's pods: {err}")),
    };
    let replicas = flashsale_observe::replicas::ready_replicas(&listed, build::OPS_PORT_NUMBER);
    drain::verdict(&ctx.settings.probe.writer_lags(&replicas).await)
}

/// Applies every desired object that differs from what its child shows;
/// returns the Deployments' views, for the status. Nothing is written when
/// one of the names is taken by an object the sale does not control.
async fn apply_all(
    ctx: &Ctx,
    sale: &FlashSale,
    desired: &build::Desired,
) -> Result<Vec<WorkloadView>, Error> {
    let uid = sale
        .uid()
        .ok_or(flashsale_kit::Error::MissingMetadata("metadata.uid"))?;
    let owner = sale.name_any();
    tokio::try_join!(
        refuse_foreign(ctx, &uid, &desired.service_accounts),
        refuse_foreign(ctx, &uid, &desired.roles),
        refuse_foreign(ctx, &uid, &desired.role_bindings),
        refuse_foreign(ctx, &uid, &desired.config_maps),
        refuse_foreign(ctx, &uid, &desired.services),
        refuse_foreign(ctx, &uid, &desired.pod_disruption_budgets),
        refuse_foreign(ctx, &uid, &desired.network_policies),
        refuse_foreign(ctx, &uid, &desired.deployments),
        refuse_foreign(ctx, &uid, &desired.horizontal_pod_autoscalers),
    )?;
    // Two waves of concurrent applies: what the pods refer to (identity,
    // configuration) and what guards them (disruption budgets, network
    // policies) first, so new pods never start without it. Services only
    // route to pods, so they go with the Deployments: a slow ClusterIP
    // allocation does not hold the pods back. The RoleBinding waits for its
    // Role: without the `bind` verb, the apiserver refuses a binding to a
    // Role it cannot find yet.
    tokio::try_join!(
        apply_each(ctx, &owner, &desired.service_accounts),
        apply_each(ctx, &owner, &desired.roles),
        apply_each(ctx, &owner, &desired.config_maps),
        apply_each(ctx, &owner, &desired.pod_disruption_budgets),
        apply_each(ctx, &owner, &desired.network_policies),
    )?;
    let (deployments, _, _, _) = tokio::try_join!(
        apply_each(ctx, &owner, &desired.deployments),
        apply_each(ctx, &owner, &desired.horizontal_pod_autoscalers),
        apply_each(ctx, &owner, &desired.services),
        apply_each(ctx, &owner, &desired.role_bindings),
    )?;
    let workloads = &ctx.settings.workloads;
    let mut views = Vec::new();
    for (wanted, applied) in desired.deployments.iter().zip(deployments) {
        if let Some(applied) = applied {
            workloads.fill(&applied);
        }
        // Every Deployment the status shows: one current in the ledger was
        // seen by its watch, which recorded its view; one just applied was
        // recorded above unless the watch had a newer view.
        views.extend(workloads.get(&wanted.namespace().unwrap_or_default(), &wanted.name_any()));
    }
    Ok(views)
}

async fn refuse_foreign<K: Namespaced>(ctx: &Ctx, uid: &str, objects: &[K]) -> Result<(), Error> {
    futures::future::try_join_all(objects.iter().map(|o| apply::refuse_foreign(ctx, uid, o)))
        .await?;
    Ok(())
}

async fn apply_each<K: Namespaced>(
    ctx: &Ctx,
    owner: &str,
    objects: &[K],
) -> Result<Vec<Option<K>>, Error> {
    Ok(
        futures::future::try_join_all(objects.iter().map(|o| apply::apply_changed(ctx, owner, o)))
            .await?,
    )
}

/// Deletes what the sale may have but no longer needs. Every other child
/// exists in every stage, so only the gateway's HPA can go stale; the
/// apiserver is asked only when the HPA watch shows one.
async fn prune(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
    desired: &build::Desired,
) -> Result<(), Error> {
    let uid = sale
        .uid()
        .ok_or(flashsale_kit::Error::MissingMetadata("metadata.uid"))?;
    let hpa = build::names::gateway_autoscaler(sale);
    let watched = ctx.ledger.is_watched(&flashsale_kit::ChildKey {
        kind: apply::kind_of::<HorizontalPodAutoscaler>(),
        namespace: namespace.to_owned(),
        name: hpa.clone(),
    });
    if desired.horizontal_pod_autoscalers.is_empty() && watched {
        apply::delete_owned::<HorizontalPodAutoscaler, _>(ctx, namespace, &hpa, &uid).await?;
    }
    Ok(())
}

/// Writes the status when it changed; publishes an Event when the phase or
/// the blocker changed, so `kubectl describe` tells the story.
async fn write_status(
    ctx: &Ctx,
    sale: &FlashSale,
    new: &flashsale_api::FlashSaleStatus,
    blocker: Option<&Blocker<SaleReason>>,
) -> Result<(), Error> {
    if !apply::write_status(ctx, sale, new).await? {
        return Ok(());
    }
    let old = sale.status.clone().unwrap_or_default();
    if let Some(blocker) = blocker {
        let was = old
            .observed
            .get(flashsale_api::conditions::STALLED)
            .map(|c| c.reason.as_str());
        if was != Some(blocker.reason.as_str()) {
            ctx.event(sale, true, blocker.reason, blocker.message.clone())
                .await;
        }
    } else if old.phase != new.phase
        && let Some(phase) = new.phase
    {
        let from = old
            .phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "new".into());
        // One reason per phase: Events of the same reason on one object are
        // folded into a series that keeps the first message.
        let reason = SaleReason::phase(phase);
        ctx.event(sale, false, reason, format!("{from} → {phase:?}"))
            .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
