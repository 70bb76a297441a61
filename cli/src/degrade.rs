//! `degrade`: sets or clears a policy's override, then waits until every
//! gateway applied the switches and prints the propagation the operator
//! measured.

use std::io::Write;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::Serialize;
use serde_json::json;

use flashsale_api::{
    DegradationPolicy, FlashSale,
    conditions::PROPAGATED,
    degradation::{Override, Propagation},
};

use crate::{
    args::DegradeArgs,
    failure::{Call, Described, Failure},
    output::Out,
    render::clock,
    session::{FIELD_MANAGER, POLICIES, SALES, Session},
    wait::{self, Waited},
};

/// What `degrade` did, for `-o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Degraded {
    namespace: String,
    policy: String,
    /// The override written; none when cleared.
    r#override: Option<Override>,
    dry_run: bool,
    /// The tier in force once every gateway applied it.
    tier: Option<i32>,
    propagation: Option<Propagation>,
    /// From the write to reading the propagation back.
    waited_seconds: Option<f64>,
}

/// Runs `degrade`.
pub async fn run<O: Write, E: Write>(
    session: &mut Session,
    args: &DegradeArgs,
    out: &mut Out<O>,
    err: &mut E,
) -> Result<(), Failure> {
    let policy = find_policy(session, args).await?;
    let name = policy.name_any();
    let wanted = wanted(&policy, args, Timestamp::now())?;
    let api: Api<DegradationPolicy> = session.namespaced();
    let started = std::time::Instant::now();
    let written = write(&api, &name, wanted.as_ref(), args.write.dry_run)
        .await
        .described(Call {
            verb: "patch",
            resource: POLICIES,
            name: Some(&name),
            namespace: Some(&session.namespace),
        })?;
    let mut done = Degraded {
        namespace: session.namespace.clone(),
        policy: name.clone(),
        r#override: wanted.clone(),
        dry_run: args.write.dry_run,
        tier: None,
        propagation: None,
        waited_seconds: None,
    };
    let what = match &wanted {
        Some(o) => format!(
            "tier {} forced until {} ({})",
            o.tier,
            clock(o.expires.0),
            args.for_.map(|d| d.to_string()).unwrap_or_default()
        ),
        None => "override cleared: the signal decides".to_owned(),
    };
    if args.write.dry_run {
        let text = format!(
            "degradationpolicy {}/{name}: {what} (dry run: the apiserver accepted it, nothing changed)\n",
            session.namespace
        );
        return out.emit(&done, &text);
    }
    announce(session, &written, wanted.as_ref(), &args.write.reason, err).await;
    let generation = written.metadata.generation.unwrap_or_default();
    let applied = wait::until(api, &name, args.write.timeout.0, |p| {
        propagated(p, generation, wanted.as_ref())
    })
    .await;
    match applied {
        Ok((tier, why, propagation)) => {
            done.waited_seconds = Some(started.elapsed().as_secs_f64());
            let text = format!(
                "degradationpolicy {}/{name}: {what}\ntier {tier} in force{}: applied by {}/{} gateways in {} (read back {:.1}s after the write)\n",
                session.namespace,
                why.map(|w| format!(" ({w})")).unwrap_or_default(),
                propagation.applied_replicas,
                propagation.desired_replicas,
                propagation
                    .seconds
                    .map_or_else(|| "?".to_owned(), |s| format!("{s:.2}s")),
                started.elapsed().as_secs_f64(),
            );
            done.tier = Some(tier);
            done.propagation = Some(propagation);
            out.emit(&done, &text)
        }
        Err(Waited::Failed(failure)) => Err(failure),
        Err(Waited::TimedOut(last)) => Err(Failure::TimedOut(format!(
            "the override is written, but not every gateway applied it within {}: {}",
            args.write.timeout,
            lagging(last.as_ref())
        ))),
    }
}

/// The override `args` ask for at `now` (none to clear), checked against
/// the tiers `policy` defines.
fn wanted(
    policy: &DegradationPolicy,
    args: &DegradeArgs,
    now: Timestamp,
) -> Result<Option<Override>, Failure> {
    let (Some(tier), Some(period), false) = (args.tier, args.for_, args.clear) else {
        return Ok(None);
    };
    check_tier(policy, tier)?;
    let secs = i64::try_from(period.0.as_secs()).unwrap_or(i64::MAX);
    let until = now
        .checked_add(SignedDuration::from_secs(secs))
        .map_err(|_| Failure::Usage(format!("--for {period} ends after the year 9999")))?;
    Ok(Some(Override {
        tier,
        reason: args.write.reason.clone(),
        expires: Time(until.round(jiff::Unit::Second).unwrap_or(until)),
    }))
}

/// The Event that says who set or cleared the override, and why.
async fn announce<E: Write>(
    session: &mut Session,
    written: &DegradationPolicy,
    wanted: Option<&Override>,
    reason: &str,
    err: &mut E,
) {
    let user = session.user().await;
    let (kind, note) = match wanted {
        Some(o) => (
            "OverrideSet",
            format!(
                "{user} forced tier {} until {}: {reason}",
                o.tier,
                clock(o.expires.0)
            ),
        ),
        None => (
            "OverrideCleared",
            format!("{user} cleared the override: {reason}"),
        ),
    };
    session
        .record(written.object_ref(&()), kind, "Degrade", note, err)
        .await;
}

/// The policy of the sale `args` name: the one naming it, or `--policy`.
async fn find_policy(session: &Session, args: &DegradeArgs) -> Result<DegradationPolicy, Failure> {
    session.get::<FlashSale>(SALES, &args.sale).await?;
    let listed: Vec<DegradationPolicy> = session.list(POLICIES, false).await?;
    let mut policies: Vec<DegradationPolicy> = listed
        .into_iter()
        .filter(|p| p.spec.sale_ref.name == args.sale)
        .filter(|p| {
            args.policy
                .as_ref()
                .is_none_or(|name| &p.name_any() == name)
        })
        .collect();
    match policies.len() {
        1 => Ok(policies.remove(0)),
        0 => Err(Failure::Refused(format!(
            "no DegradationPolicy{} names sale {} in namespace {}: create one (crds/examples/degradationpolicy-two-tier.yaml)",
            args.policy
                .as_ref()
                .map(|p| format!(" {p}"))
                .unwrap_or_default(),
            args.sale,
            session.namespace
        ))),
        _ => Err(Failure::Usage(format!(
            "{} DegradationPolicies name sale {}: choose one with --policy ({})",
            policies.len(),
            args.sale,
            policies
                .iter()
                .map(ResourceExt::name_any)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Refuses a tier the policy does not define, naming those it does.
fn check_tier(policy: &DegradationPolicy, tier: i32) -> Result<(), Failure> {
    let defined: Vec<i32> = policy.spec.tiers.iter().map(|t| t.tier).collect();
    if tier == 0 || defined.contains(&tier) {
        return Ok(());
    }
    let names: Vec<String> = defined.iter().map(ToString::to_string).collect();
    Err(Failure::Refused(format!(
        "policy {} does not define tier {tier}: it defines {} (and 0 forces nothing degraded)",
        policy.name_any(),
        names.join(", ")
    )))
}

/// Sets the override by server-side apply under this plugin's field
/// manager, or clears it. A clear is a merge patch: the override may have
/// been set by another manager (kubectl patch, a GitOps tool), which an
/// apply leaving the field out would not remove.
async fn write(
    api: &Api<DegradationPolicy>,
    name: &str,
    wanted: Option<&Override>,
    dry_run: bool,
) -> Result<DegradationPolicy, kube::Error> {
    let mut params = PatchParams::apply(FIELD_MANAGER);
    params.dry_run = dry_run;
    match wanted {
        Some(o) => {
            let body = json!({
                "apiVersion": DegradationPolicy::api_version(&()),
                "kind": DegradationPolicy::kind(&()),
                "metadata": {"name": name},
                "spec": {"override": o},
            });
            api.patch(name, &params.force(), &Patch::Apply(body)).await
        }
        None => {
            params.force = false;
            let body = json!({"spec": {"override": null}});
            api.patch(name, &params, &Patch::Merge(body)).await
        }
    }
}

/// The tier, why it is in force, and the propagation, once the operator
/// has taken `generation` in, obeys the `wanted` override (or none), and
/// every gateway applied the switches.
fn propagated(
    policy: &DegradationPolicy,
    generation: i64,
    wanted: Option<&Override>,
) -> Option<(i32, Option<String>, Propagation)> {
    let status = policy.status.as_ref()?;
    if status.observed.observed_generation? < generation {
        return None;
    }
    let obeyed = match (wanted, &status.active_override) {
        (Some(w), Some(a)) => {
            w.tier == a.tier && w.expires == a.expires && status.tier == Some(w.tier)
        }
        (None, None) => true,
        _ => false,
    };
    let condition = status
        .observed
        .conditions
        .iter()
        .find(|c| c.type_ == PROPAGATED)?;
    let propagation = status.propagation.clone()?;
    let complete = condition.status == "True"
        && propagation.seconds.is_some()
        && propagation.applied_replicas >= propagation.desired_replicas;
    (obeyed && complete).then(|| {
        let tier = status.tier.unwrap_or(0);
        (tier, status.tier_message.clone(), propagation)
    })
}

/// Which gateways lag, as the policy last said.
fn lagging(policy: Option<&DegradationPolicy>) -> String {
    let Some(status) = policy.and_then(|p| p.status.as_ref()) else {
        return "the operator has not written the policy's status".to_owned();
    };
    match &status.propagation {
        Some(p) if !p.laggards.is_empty() => format!(
            "{}/{} gateways applied generation {}; behind: {}",
            p.applied_replicas,
            p.desired_replicas,
            p.generation,
            p.laggards.join("; ")
        ),
        Some(p) => format!(
            "{}/{} gateways applied generation {}",
            p.applied_replicas, p.desired_replicas, p.generation
        ),
        None => "no propagation reported yet: is the operator running?".to_owned(),
    }
}
