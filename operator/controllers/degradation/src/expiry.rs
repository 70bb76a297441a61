//! The backstop that ends a lapsed override whatever state its policy is
//! in.
//!
//! A healthy policy ends its override itself: it wakes at the expiry and
//! writes what the signal decides. A policy that cannot be evaluated (its
//! spec became invalid, its sale's ConfigMap is blocked, the operator cannot
//! read the object at all) writes nothing, so on-call's tier would stay in
//! force for good. The switches carry the override's expiry
//! (`overrideExpires`, see `flashsale-degradation`); this task watches the
//! operator's ConfigMaps and, when one still holds an override [`GRACE`]
//! after it lapsed, writes tier 0 in its place, which is what a sale
//! without a working policy runs at. The write is conditional on the
//! ConfigMap's resourceVersion, so it never overwrites a state a policy
//! wrote meanwhile.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use flashsale_degradation::{Degradation, MANAGED_BY, MANAGED_BY_KEY, Switches, next_generation};
use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};

use super::{Ctx, reconcile::IDENTITY};
use flashsale_api::{FlashSale, children, reasons::PolicyReason};
use flashsale_kit::{Verb, apply, health::WatchHealth};

/// How long after an override lapsed its policy has to take the switches
/// back before this task does: a healthy policy writes at the expiry
/// itself, within one reconcile.
pub const GRACE: Duration = Duration::from_secs(10);

/// The longest this task sleeps between looks (a wall clock that steps is
/// noticed within it).
const LONGEST_SLEEP: Duration = Duration::from_secs(30);

/// When the keeper lifts `state`: [`GRACE`] after its override lapses;
/// `None` when the state is not an override's.
pub fn lift_at(state: &Degradation) -> Option<Timestamp> {
    let grace = SignedDuration::try_from(GRACE).unwrap_or(SignedDuration::ZERO);
    state
        .override_expires
        .map(|expires| expires.saturating_add(grace).unwrap_or(Timestamp::MAX))
}

/// What the keeper writes in place of a lapsed override.
pub fn lifted(state: &Degradation, now: Timestamp) -> Degradation {
    let expired = state
        .override_expires
        .map_or_else(String::new, |at| format!(" at {at}"));
    Degradation {
        tier: 0,
        generation: next_generation(state.generation, now),
        switches: Switches::default(),
        reason: format!(
            "the override to tier {} lapsed{expired} and no DegradationPolicy took the switches \
             back within {}s (the policy is invalid, blocked, unreadable or gone): nothing degraded",
            state.tier,
            GRACE.as_secs()
        ),
        changed_at: Some(now),
        override_expires: None,
    }
}

/// Watches the operator's ConfigMaps (in `namespace`, or all) and lifts
/// every override that outlived its expiry by [`GRACE`]. Runs until the
/// watch ends with the controller.
pub async fn run(ctx: Arc<Ctx>, namespace: Option<&str>, health: Option<WatchHealth>) {
    let api: Api<ConfigMap> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let config = watcher::Config::default().labels(&format!("{MANAGED_BY_KEY}={MANAGED_BY}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    // The overrides in force, by (namespace, name).
    let mut overrides: BTreeMap<(String, String), Timestamp> = BTreeMap::new();
    loop {
        let now = ctx.clock.now();
        let sleep = overrides
            .values()
            .min()
            .map(|at| Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO))
            .unwrap_or(LONGEST_SLEEP)
            .min(LONGEST_SLEEP);
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map))) => {
                    let key = (map.namespace().unwrap_or_default(), map.name_any());
                    match override_of(&map) {
                        Some(at) => overrides.insert(key, at),
                        None => overrides.remove(&key),
                    };
                }
                Some(Ok(watcher::Event::Delete(map))) => {
                    overrides.remove(&(map.namespace().unwrap_or_default(), map.name_any()));
                }
                Some(Ok(watcher::Event::Init)) => overrides.clear(),
                Some(Ok(watcher::Event::InitDone)) => {}
                Some(Err(err)) => {
                    let error = format!("watching ConfigMaps for lapsed overrides: {err}");
                    tracing::warn!(controller = IDENTITY.name, error, "watch failed");
                    if let Some(health) = &health {
                        health.failed(IDENTITY.name, &error);
                    }
                }
            },
            () = tokio::time::sleep(sleep) => {
                let now = ctx.clock.now();
                let due: Vec<(String, String)> = overrides
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(key, _)| key.clone())
                    .collect();
                for (namespace, name) in due {
                    // Looked at once: a failure is retried on the ConfigMap's
                    // next change, or by the policy once it works again.
                    overrides.remove(&(namespace.clone(), name.clone()));
                    if let Err(err) = lift(&ctx, &namespace, &name).await {
                        tracing::warn!(configmap = %format_args!("{namespace}/{name}"), %err,
                            "lifting a lapsed override failed");
                    }
                }
            }
        }
    }
}

/// When the keeper must lift `map`, if it holds an override.
fn override_of(map: &ConfigMap) -> Option<Timestamp> {
    let data = map.data.as_ref()?;
    lift_at(&Degradation::from_data(data).ok()?)
}

/// Writes tier 0 over `namespace/name` if it still holds a lapsed override,
/// on the condition that nobody wrote it since it was read.
async fn lift(ctx: &Ctx, namespace: &str, name: &str) -> Result<(), flashsale_kit::Failure> {
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(map) = maps
        .get_opt(name)
        .await
        .map_err(flashsale_kit::Error::kube(Verb::Read, "ConfigMap", name))?
    else {
        return Ok(());
    };
    let now = ctx.clock.now();
    let Some(state) = map
        .data
        .as_ref()
        .and_then(|data| Degradation::from_data(data).ok())
        .filter(|state| lift_at(state).is_some_and(|at| at <= now))
    else {
        return Ok(());
    };
    // Only the switches of a sale, written by the operator for it.
    let Some(owner) = map
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "FlashSale")
    else {
        return Ok(());
    };
    let sales: Api<FlashSale> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(sale) = sales
        .get_opt(&owner.name)
        .await
        .map_err(flashsale_kit::Error::kube(
            Verb::Read,
            "FlashSale",
            &owner.name,
        ))?
        .filter(|sale| sale.uid().as_deref() == Some(owner.uid.as_str()))
    else {
        return Ok(());
    };
    if children::names::degradation(&sale) != name {
        return Ok(());
    }
    let next = lifted(&state, now);
    let mut replacement = children::degradation_config_map(&sale, &next)?;
    // Conditional: a policy's write meanwhile wins.
    replacement.metadata.resource_version = map.resource_version();
    match apply::apply(ctx, &replacement).await {
        Ok(_) => {}
        Err(flashsale_kit::Error::Kube { source, .. }) if is_conflict(&source) => {
            tracing::debug!(configmap = name, "written meanwhile: left as it is");
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    }
    tracing::warn!(sale = %flashsale_kit::key(&sale), tier = state.tier, generation = next.generation,
        "a lapsed override no policy took back was lifted");
    ctx.event(
        &sale,
        true,
        PolicyReason::OverrideExpired,
        next.reason.clone(),
    )
    .await;
    Ok(())
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> Timestamp {
        rfc3339.parse().unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn only_an_overrides_state_is_lifted_and_only_after_the_grace() {
        let state = Degradation {
            tier: 2,
            generation: 1_794_355_200_000,
            override_expires: Some(at("2026-11-11T00:10:00Z")),
            ..Degradation::default()
        };
        assert_eq!(lift_at(&state), Some(at("2026-11-11T00:10:10Z")));
        let by_signal = Degradation {
            override_expires: None,
            ..state.clone()
        };
        assert_eq!(lift_at(&by_signal), None);

        let now = at("2026-11-11T00:10:10Z");
        let next = lifted(&state, now);
        assert_eq!(
            (next.tier, next.switches, next.override_expires),
            (0, Switches::default(), None)
        );
        assert!(next.generation > state.generation);
        assert!(next.reason.contains("tier 2"), "{}", next.reason);
    }
}
