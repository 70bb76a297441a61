//! One evaluation of a DegradationPolicy: gather (sale, rivals) → read the
//! signal → decide (pure) → write the switches when they change → measure
//! how fast the gateways apply them → status and Events, then sleep until
//! the next evaluation or the next instant the decision could change.

use std::{sync::Arc, time::Instant};

use flashsale_degradation::{Degradation, Switches, next_generation};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams},
    runtime::controller::Action,
};

use super::{Ctx, FINALIZER, decide, decide::Decision, propagation, status, status::Evaluation};
use flashsale_api::reasons::PolicyReason;
use flashsale_api::{
    DegradationPolicy, FlashSale, children, conditions::READY, degradation::ActiveOverride,
    degradation::DegradationPolicySpec, degradation::DegradationPolicyStatus, validate,
};
use flashsale_kit::{Blocker, Failure as Error, Identity, Verb, apply};
use flashsale_observe::{signal::Loss, signal::Reading, signal::SignalLoss};

/// The DegradationPolicy controller.
pub const IDENTITY: Identity = Identity {
    name: "degradationpolicy",
    field_manager: "flashsale-operator-degradationpolicy",
};

/// Reconciles one policy; every error is also a Warning Event and a metric.
pub async fn reconcile(policy: Arc<DegradationPolicy>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    flashsale_kit::reconcile(policy, ctx, |policy, ctx| async move {
        reconcile_policy(&policy, &ctx).await
    })
    .await
}

async fn reconcile_policy(policy: &DegradationPolicy, ctx: &Ctx) -> Result<Action, Error> {
    let namespace = policy
        .namespace()
        .ok_or(flashsale_kit::Error::MissingMetadata("metadata.namespace"))?;
    let key = flashsale_kit::key(policy);
    if policy.metadata.deletion_timestamp.is_some() {
        return release(ctx, policy, &namespace, &key).await;
    }
    if !policy.finalizers().iter().any(|f| f == FINALIZER) {
        // The write wakes the controller again, with the finalizer on.
        let mut finalizers = policy.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        apply::set_finalizers(ctx, policy, &finalizers).await?;
        return Ok(Action::await_change());
    }
    let moment = ctx.clock.moment();
    let now = moment.wall;
    let generation = policy.metadata.generation;
    if let Some(wait) = ctx.settings.pace.wait(&key, generation, moment.mono) {
        return Ok(Action::requeue(wait));
    }
    let interval = policy.spec.signal.interval.0;
    let old = policy.status.as_ref();

    let (sale, current) = match gather(ctx, policy, &namespace).await? {
        Ok(found) => found,
        Err(blocker) => {
            let new = status::blocked(old, generation, &blocker, now);
            apply::write_status(ctx, policy, &new).await?;
            let was = old
                .and_then(|s| s.observed.get(READY))
                .map(|c| c.reason.as_str());
            if was != Some(blocker.reason.as_str()) {
                ctx.event(policy, true, blocker.reason, blocker.message.clone())
                    .await;
            }
            // An invalid spec waits for an edit; a missing sale or a rival
            // policy is looked at again every interval.
            if blocker.reason == PolicyReason::InvalidSpec {
                ctx.settings.pace.forget(&key);
                return Ok(Action::await_change());
            }
            ctx.settings
                .pace
                .set(&key, generation, moment.mono + interval);
            return Ok(Action::requeue(interval));
        }
    };

    let reading = read_signal(ctx, &policy.spec, now).await;
    let decision = decide::decide(&policy.spec, &status::memory(old), &reading, now);
    let active_override = status::active_override(policy, now);
    let propagation = publish(ctx, policy, &sale, current, &decision, now).await?;
    let seen = Evaluation {
        decision: &decision,
        reading: &reading,
        active_override: active_override.clone(),
        propagation,
    };
    let new = status::evaluated(old, generation, &seen, now);
    apply::write_status(ctx, policy, &new).await?;
    ctx.metrics
        .set_tier(&namespace, &policy.name_any(), decision.memory.tier);
    announce(ctx, policy, old, &new, &decision, &reading).await;

    // The next evaluation: the interval, or sooner when the decision can
    // change by time alone (a hold-down ends, an override lapses).
    let wait = decision
        .wake_at
        .and_then(|at| std::time::Duration::try_from(at.duration_since(now)).ok())
        .filter(|wait| *wait < interval)
        .unwrap_or(interval);
    ctx.settings.pace.set(&key, generation, moment.mono + wait);
    tracing::debug!(tier = decision.memory.tier, source = ?decision.memory.source, next = ?wait, "evaluated");
    Ok(Action::requeue(wait))
}

/// The sale the policy switches, unless something stops the policy: an
/// invalid spec, a missing sale, or an older policy for the same sale.
async fn gather(
    ctx: &Ctx,
    policy: &DegradationPolicy,
    namespace: &str,
) -> Result<Result<(FlashSale, Option<Degradation>), Blocker<PolicyReason>>, Error> {
    let problems = validate::degradation_policy(&policy.spec);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Ok(Err(Blocker {
            reason: PolicyReason::InvalidSpec,
            message: list.join("; "),
        }));
    }
    let sale_name = &policy.spec.sale_ref.name;
    let sales: Api<FlashSale> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(sale) = sales
        .get_opt(sale_name)
        .await
        .map_err(flashsale_kit::Error::kube(
            Verb::Read,
            "FlashSale",
            sale_name,
        ))?
    else {
        return Ok(Err(Blocker {
            reason: PolicyReason::SaleNotFound,
            message: format!(
                "FlashSale {namespace}/{sale_name} does not exist; nothing is switched until it does"
            ),
        }));
    };
    let all = policies_in(ctx, namespace).await?;
    let rivals: Vec<&DegradationPolicy> = all
        .iter()
        .filter(|p| p.spec.sale_ref.name == *sale_name && p.metadata.deletion_timestamp.is_none())
        .collect();
    if let Some(holder) = holder(&rivals)
        && holder.uid() != policy.uid()
    {
        return Ok(Err(Blocker {
            reason: PolicyReason::ConflictingPolicy,
            message: format!(
                "DegradationPolicy {} already switches FlashSale {sale_name}; this one writes nothing \
                 while it exists (one policy per sale)",
                holder.name_any()
            ),
        }));
    }
    Ok(switches_in_force(ctx, namespace, &sale)
        .await?
        .map(|current| (sale, current.state())))
}

/// The sale's `<sale>-degradation` ConfigMap as the operator finds it.
enum InForce {
    /// There is none: the gateways run at tier 0.
    Absent,
    /// Its data does not parse: the gateways keep their last good state.
    Unreadable,
    /// The state it holds.
    State(Degradation),
}

impl InForce {
    fn state(self) -> Option<Degradation> {
        match self {
            Self::State(state) => Some(state),
            Self::Absent | Self::Unreadable => None,
        }
    }
}

/// What the sale's `<sale>-degradation` ConfigMap holds, or a blocker when
/// an object of that name is not the sale's: the operator does not write
/// over it, and the gateways do not read it.
async fn switches_in_force(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
) -> Result<Result<InForce, Blocker<PolicyReason>>, Error> {
    let name = children::names::degradation(sale);
    let uid = sale
        .uid()
        .ok_or(flashsale_kit::Error::MissingMetadata("metadata.uid"))?;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(map) = maps
        .get_opt(&name)
        .await
        .map_err(flashsale_kit::Error::kube(Verb::Read, "ConfigMap", &name))?
    else {
        return Ok(Ok(InForce::Absent));
    };
    if !apply::controlled_by(&map, &uid) {
        let refused = flashsale_kit::Error::NotOwned {
            kind: "ConfigMap",
            namespace: namespace.to_owned(),
            name,
        };
        return Ok(Err(Blocker {
            reason: PolicyReason::ObjectNotOwned,
            message: refused.to_string(),
        }));
    }
    Ok(Ok(
        match Degradation::from_data(&map.data.unwrap_or_default()) {
            Ok(state) => InForce::State(state),
            Err(_) => InForce::Unreadable,
        },
    ))
}

/// Of several policies for one sale, the one that keeps control: one that
/// already switches the sale, else the oldest (then by name), so a second
/// policy applied by mistake during a sale never takes the switches from
/// the one that was working.
fn holder<'a>(policies: &[&'a DegradationPolicy]) -> Option<&'a DegradationPolicy> {
    policies
        .iter()
        .min_by_key(|p| {
            let holds = p.status.as_ref().is_some_and(|s| {
                s.tier.is_some()
                    && s.observed
                        .get(READY)
                        .is_none_or(|c| c.reason != PolicyReason::ConflictingPolicy)
            });
            (
                !holds,
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                p.name_any(),
            )
        })
        .copied()
}

/// The signal, or why it is missing.
async fn read_signal(ctx: &Ctx, spec: &DegradationPolicySpec, now: Timestamp) -> Reading {
    let signal = &spec.signal;
    let Some(url) = signal
        .prometheus_url
        .as_deref()
        .or(ctx.settings.prometheus_url.as_deref())
    else {
        return Reading::Lost(Loss {
            cause: SignalLoss::PrometheusUnreachable,
            detail: "no Prometheus to ask: set spec.signal.prometheusURL or the operator's \
                     --prometheus-url"
                .to_owned(),
        });
    };
    ctx.settings
        .signal
        .read(
            url,
            &signal.query,
            signal.timeout.0,
            signal.stale_after.0,
            now,
        )
        .await
}

/// The switches of `tier`: every tier's changes from 1 up to it, in order.
pub fn switches_for(spec: &DegradationPolicySpec, tier: i32) -> Switches {
    let mut tiers: Vec<_> = spec.tiers.iter().filter(|t| t.tier <= tier).collect();
    tiers.sort_by_key(|t| t.tier);
    tiers.into_iter().fold(Switches::default(), |switches, t| {
        switches.with(&t.switches)
    })
}

/// Writes the sale's switches when the decided tier's differ from what the
/// ConfigMap holds, then measures how fast the ready gateways apply them.
/// Returns the generation in force and its propagation.
async fn publish(
    ctx: &Ctx,
    policy: &DegradationPolicy,
    sale: &FlashSale,
    current: Option<Degradation>,
    decision: &Decision,
    now: Timestamp,
) -> Result<Option<(i64, propagation::Progress, Option<std::time::Duration>)>, Error> {
    let namespace = policy
        .namespace()
        .ok_or(flashsale_kit::Error::MissingMetadata("metadata.namespace"))?;
    let (generation, started) = write_switches(ctx, policy, sale, current, decision, now).await?;
    let replicas = gateways(ctx, &namespace, sale).await?;
    if let Some(settled) = settled(policy, generation, replicas.len()) {
        return Ok(Some(settled));
    }
    // After a write: wait for the gateways, up to the bound. Otherwise a
    // single look, for gateways that were behind or new.
    let bound = if started.is_some() {
        ctx.settings.propagation_bound
    } else {
        std::time::Duration::ZERO
    };
    let outcome = propagation::await_generation(
        &ctx.settings.probe,
        &replicas,
        generation,
        started.unwrap_or_else(Instant::now),
        bound,
        PROPAGATION_POLL,
    )
    .await;
    let took = started.and(outcome.elapsed_to_all);
    if let Some(took) = took {
        ctx.metrics.propagated(&namespace, &policy.name_any(), took);
    }
    Ok(Some((
        i64::try_from(generation).unwrap_or(i64::MAX),
        outcome.progress,
        took,
    )))
}

/// Writes the switches of the decided tier unless the ConfigMap already
/// holds them; the generation in force, and when it was written.
async fn write_switches(
    ctx: &Ctx,
    policy: &DegradationPolicy,
    sale: &FlashSale,
    current: Option<Degradation>,
    decision: &Decision,
    now: Timestamp,
) -> Result<(u64, Option<Instant>), Error> {
    let tier = decision.memory.tier;
    let wanted = switches_for(&policy.spec, tier);
    // A generation beyond belief (a hand edit) is written over at once:
    // the gateways refuse it, so it could never be what they apply.
    // The override's expiry goes with the switches: a state that outlived
    // its override is written again without it, even at the same tier.
    let unchanged = current.as_ref().is_some_and(|c| {
        i64::from(c.tier) == i64::from(tier)
            && c.switches == wanted
            && c.override_expires == decision.override_expires
            && flashsale_degradation::plausible(c.generation, now)
    });
    let recorded = policy
        .status
        .as_ref()
        .and_then(|s| s.propagation.as_ref())
        .map_or(0, |p| u64::try_from(p.generation).unwrap_or(0));
    Ok(if unchanged {
        (current.map_or(0, |c| c.generation), None)
    } else {
        let previous = current.map_or(0, |c| c.generation).max(recorded);
        let state = Degradation {
            tier: u32::try_from(tier).unwrap_or(0),
            generation: next_generation(previous, now),
            switches: wanted,
            reason: decision.message.clone(),
            changed_at: Some(now),
            override_expires: decision.override_expires,
        };
        let map = children::degradation_config_map(sale, &state)?;
        apply::apply(ctx, &map).await?;
        (state.generation, Some(Instant::now()))
    })
}

/// The propagation the status already shows, when it is complete for
/// `generation` over `replicas` gateways: nothing to wait for or measure.
fn settled(
    policy: &DegradationPolicy,
    generation: u64,
    replicas: usize,
) -> Option<(i64, propagation::Progress, Option<std::time::Duration>)> {
    let p = policy.status.as_ref()?.propagation.as_ref()?;
    let complete = u64::try_from(p.generation).ok() == Some(generation)
        && p.laggards.is_empty()
        && p.applied_replicas == i32::try_from(replicas).unwrap_or(i32::MAX);
    complete.then(|| {
        let progress = propagation::Progress {
            applied: p.applied_replicas,
            total: p.desired_replicas,
            laggards: Vec::new(),
        };
        (p.generation, progress, None)
    })
}

/// How often the gateways are asked while a change propagates.
const PROPAGATION_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// The sale's ready gateway replicas, as (pod, metrics endpoint).
async fn gateways(
    ctx: &Ctx,
    namespace: &str,
    sale: &FlashSale,
) -> Result<Vec<(String, std::net::SocketAddr)>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = children::selector(&sale.name_any(), children::Component::Gateway)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(flashsale_kit::Error::kube(Verb::List, "Pod", &selector))?;
    Ok(flashsale_observe::replicas::ready_replicas(
        &listed.items,
        children::OPS_PORT_NUMBER,
    ))
}

/// On deletion: lift the sale's degradation (tier 0, a new generation), so
/// deleting the policy never leaves the gateways degraded, then let go.
/// Decided from what the switches ConfigMap holds, not from the policy's
/// status, which may lag the last write (a policy deleted between writing
/// the switches and its status). Another live policy of the same sale is
/// left to decide: it takes the switches over.
async fn release(
    ctx: &Ctx,
    policy: &DegradationPolicy,
    namespace: &str,
    key: &str,
) -> Result<Action, Error> {
    if !policy.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let sale_name = &policy.spec.sale_ref.name;
    let sales: Api<FlashSale> = Api::namespaced(ctx.client.clone(), namespace);
    let sale = sales
        .get_opt(sale_name)
        .await
        .map_err(flashsale_kit::Error::kube(
            Verb::Read,
            "FlashSale",
            sale_name,
        ))?
        .filter(|sale| sale.metadata.deletion_timestamp.is_none());
    if let Some(sale) = sale
        && !rival_exists(ctx, policy, namespace).await?
        // Someone else's ConfigMap in the sale's name is not written over.
        && let Ok(current) = switches_in_force(ctx, namespace, &sale).await?
        && let Some(previous) = degraded(&current)
    {
        let now = ctx.clock.now();
        let state = Degradation {
            tier: 0,
            generation: next_generation(previous.generation, now),
            switches: Switches::default(),
            reason: format!(
                "DegradationPolicy {} deleted: nothing degraded",
                policy.name_any()
            ),
            changed_at: Some(now),
            override_expires: None,
        };
        apply::apply(ctx, &children::degradation_config_map(&sale, &state)?).await?;
        ctx.event_of(
            policy,
            false,
            PolicyReason::TierChanged,
            &format!("Tier{}To0", previous.tier),
            format!("tier {} → 0: the policy is being deleted", previous.tier),
        )
        .await;
    }
    let rest: Vec<String> = policy
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    apply::set_finalizers(ctx, policy, &rest).await?;
    ctx.settings.pace.forget(key);
    ctx.metrics.forget_policy(namespace, &policy.name_any());
    Ok(Action::await_change())
}

/// What must be lifted of `current`: the state in force unless it already
/// degrades nothing (a ConfigMap that does not parse is lifted too, from
/// generation 0: the gateways kept their last good state).
fn degraded(current: &InForce) -> Option<Degradation> {
    match current {
        InForce::Absent => None,
        InForce::Unreadable => Some(Degradation::default()),
        InForce::State(state)
            if state.tier == 0
                && state.switches == Switches::default()
                && state.override_expires.is_none() =>
        {
            None
        }
        InForce::State(state) => Some(state.clone()),
    }
}

/// The namespace's policies, each read on its own: one the operator's type
/// cannot read (the watch names it in an `InvalidObject` Event) is left
/// out instead of failing the list for every policy.
async fn policies_in(ctx: &Ctx, namespace: &str) -> Result<Vec<DegradationPolicy>, Error> {
    let resource = ApiResource::erase::<DegradationPolicy>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &resource);
    let all = api
        .list(&ListParams::default())
        .await
        .map_err(flashsale_kit::Error::kube(
            Verb::List,
            "DegradationPolicy",
            namespace,
        ))?;
    Ok(all
        .items
        .into_iter()
        .filter_map(|object| {
            serde_json::to_value(object)
                .and_then(serde_json::from_value)
                .ok()
        })
        .collect())
}

/// Whether another policy of the same sale, not being deleted, exists.
async fn rival_exists(
    ctx: &Ctx,
    policy: &DegradationPolicy,
    namespace: &str,
) -> Result<bool, Error> {
    Ok(policies_in(ctx, namespace).await?.iter().any(|p| {
        p.uid() != policy.uid()
            && p.spec.sale_ref.name == policy.spec.sale_ref.name
            && p.metadata.deletion_timestamp.is_none()
    }))
}

/// Events for what an on-call engineer reads in `kubectl describe`: every
/// tier change, the start and end of an override (with who set it), and the
/// loss and return of the signal.
async fn announce(
    ctx: &Ctx,
    policy: &DegradationPolicy,
    old: Option<&DegradationPolicyStatus>,
    new: &DegradationPolicyStatus,
    decision: &Decision,
    reading: &Reading,
) {
    let was_override = old.and_then(|s| s.active_override.as_ref());
    match (was_override, new.active_override.as_ref()) {
        (before, Some(now)) if before != Some(now) => {
            let action = format!("OverrideTier{}", now.tier);
            let note = override_note(now);
            ctx.event_of(policy, false, PolicyReason::OverrideStarted, &action, note)
                .await;
        }
        (Some(before), None) => {
            let note = format!(
                "override to tier {} (set by {}: {}) ended; the signal decides again",
                before.tier, before.set_by, before.reason
            );
            let action = format!("OverrideTier{}", before.tier);
            ctx.event_of(policy, false, PolicyReason::OverrideEnded, &action, note)
                .await;
        }
        _ => {}
    }
    if decision.changed {
        let from = old.and_then(|s| s.tier).unwrap_or(0);
        let note = format!(
            "tier {from} → {} ({:?}): {}",
            decision.memory.tier, decision.memory.source, decision.message
        );
        let action = format!("Tier{from}To{}", decision.memory.tier);
        ctx.event_of(policy, false, PolicyReason::TierChanged, &action, note)
            .await;
    }
    let was_refused = old
        .and_then(|s| s.observed.get(READY))
        .is_some_and(|c| c.reason == PolicyReason::OverrideRefused);
    if let (Some(why), false) = (&decision.refused_override, was_refused) {
        ctx.event(policy, true, PolicyReason::OverrideRefused, why.clone())
            .await;
    }
    let was_lost = old.is_some_and(|s| s.signal_lost_since.is_some());
    match reading {
        Reading::Lost(loss) if !was_lost => {
            ctx.event(policy, true, loss.cause, loss.detail.clone())
                .await;
        }
        Reading::Value(sample) if was_lost => {
            let note = format!("signal back: {:.3}", sample.value);
            ctx.event(policy, false, PolicyReason::SignalOk, note).await;
        }
        _ => {}
    }
}

fn override_note(active: &ActiveOverride) -> String {
    format!(
        "override to tier {} set by {} until {}: {}",
        active.tier, active.set_by, active.expires.0, active.reason
    )
}

#[cfg(test)]
mod tests;
