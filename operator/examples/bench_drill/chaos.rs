//! Reading Chaos Mesh's experiments as the benchmark waits on them: until
//! Chaos Mesh says it injected the fault, and until the object is gone.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use flashsale_controller_drill::chaos::Kind;
use flashsale_e2e::wait::poll_until;
use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, WatchEvent, WatchParams},
};

/// The namespace's PodChaos objects.
pub fn pod_chaos(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &Kind::PodChaos.resource())
}

/// Whether Chaos Mesh reports every target of `object` injected.
pub fn injected(object: &DynamicObject) -> bool {
    object.data["status"]["experiment"]["containerRecords"]
        .as_array()
        .is_some_and(|records| {
            !records.is_empty()
                && records
                    .iter()
                    .all(|r| r["phase"].as_str() == Some("Injected"))
        })
}

/// Waits until the one object `selector` selects is injected.
pub async fn until_injected(
    api: &Api<DynamicObject>,
    selector: &str,
    bound: Duration,
) -> anyhow::Result<()> {
    let params = ListParams::default().labels(selector);
    poll_until(
        &format!("Chaos Mesh injected {selector}"),
        bound,
        Duration::from_millis(20),
        || async {
            let list = api.list(&params).await.map_err(|e| e.to_string())?;
            match list.items.as_slice() {
                [object] if injected(object) => Ok(()),
                [object] => Err(format!("status {}", object.data["status"])),
                other => Err(format!("{} objects", other.len())),
            }
        },
    )
    .await?;
    Ok(())
}

/// From `since` until nothing `selector` selects is left: a list, then a
/// watch from the list's version, so each delete is seen the moment the
/// apiserver makes it (a poll would add up to a list's time).
pub async fn until_gone(
    api: &Api<DynamicObject>,
    selector: &str,
    since: Instant,
    bound: Duration,
) -> anyhow::Result<Duration> {
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
