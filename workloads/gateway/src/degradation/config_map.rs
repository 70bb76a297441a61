//! The ConfigMap source, through the Kubernetes API.

use std::{future::Future, pin::pin};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};

use flashsale_degradation::{MANAGED_BY, MANAGED_BY_KEY};

use super::{Degradation, Switchboard, offer};

/// Whether `map` carries the operator's label: a ConfigMap of the same name
/// made by someone else must not switch the sale's features.
fn made_by_operator(map: &ConfigMap) -> bool {
    map.labels().get(MANAGED_BY_KEY).map(String::as_str) == Some(MANAGED_BY)
}

/// Keeps `board` in line with the ConfigMap `name` in `namespace` until
/// `stop` completes.
///
/// The watch selects the one object by `metadata.name`, so the gateway's
/// RBAC can be get/list/watch on that single resource name. Every applied
/// object (from the initial list or a later event) is parsed and offered to
/// the board; invalid data is logged and the last good state stays. A
/// ConfigMap without the operator's `managed-by` label is ignored. Watch
/// errors are logged and retried with the watcher's default backoff.
///
/// A deleted ConfigMap keeps the state in force: deletion says nothing about
/// the load (a re-install, a `kubectl delete` by mistake, an owner being
/// cleaned up), and dropping every switch back to normal in the middle of a
/// spike would put the full load back on the core path just when it was
/// being shed. The operator's DegradationPolicy controller, the only
/// writer, lifts degradation by writing tier 0 with a higher generation.
///
/// A sale without a DegradationPolicy has no such ConfigMap: the board then
/// stays at tier 0, which is logged as information, not as a fault.
pub async fn watch_config_map(
    client: Client,
    namespace: String,
    name: String,
    board: Switchboard,
    stop: impl Future<Output = ()>,
) {
    let api = Api::<ConfigMap>::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = pin!(watcher(api, config).default_backoff());
    let mut stop = pin!(stop);
    // Whether the object was in the last list or applied since, to say so
    // when it is absent (no DegradationPolicy, or none has written it yet).
    let mut present = false;
    loop {
        let event = tokio::select! {
            biased;
            () = &mut stop => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)))
                if !made_by_operator(&map) =>
            {
                tracing::warn!(%namespace, %name,
                    "a ConfigMap of the degradation name without the label {MANAGED_BY_KEY}={MANAGED_BY} \
                     is someone else's, not switches; ignored");
            }
            Some(Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map))) => {
                present = true;
                let data = map.data.unwrap_or_default();
                match Degradation::from_data(&data) {
                    Ok(next) => offer(&board, next, "configmap"),
                    Err(err) => tracing::warn!(%namespace, %name, error = %err,
                        resource_version = map.metadata.resource_version.as_deref().unwrap_or(""),
                        "invalid degradation ConfigMap; keeping the state in force"),
                }
            }
            Some(Ok(watcher::Event::Init)) => present = false,
            Some(Ok(watcher::Event::InitDone)) => {
                if !present {
                    let in_force = board.current();
                    if in_force.generation == 0 {
                        tracing::info!(%namespace, %name,
                            "degradation ConfigMap not found; the gateway runs at tier 0 until a DegradationPolicy writes it");
                    } else {
                        // Deleted while the watch was down: as for a
                        // deletion seen live, the state in force stays.
                        tracing::warn!(%namespace, %name, generation = in_force.generation,
                            tier = in_force.tier,
                            "degradation ConfigMap deleted; keeping the state in force");
                    }
                }
            }
            Some(Ok(watcher::Event::Delete(map))) => {
                present = false;
                tracing::warn!(%namespace, name = %map.name_any(),
                    generation = board.current().generation,
                    "degradation ConfigMap deleted; keeping the state in force");
            }
            Some(Err(err)) => tracing::warn!(%namespace, %name, error = %err,
                "degradation ConfigMap watch failed; retrying with backoff"),
            None => {
                // The watcher retries forever; an end would be a kube bug.
                tracing::error!(%namespace, %name, "degradation ConfigMap watch ended");
                return;
            }
        }
    }
}
