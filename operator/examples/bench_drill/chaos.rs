//! Reading Chaos Mesh's experiments as the benchmark waits on them: until
//! Chaos Mesh says it injected the fault.

use std::time::Duration;

use flashsale_controller_drill::chaos::Kind;
use flashsale_e2e::wait::poll_until;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams},
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
