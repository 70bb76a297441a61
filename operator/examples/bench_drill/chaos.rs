//! Reading Chaos Mesh's experiments as the benchmark waits on them: until
//! Chaos Mesh says it injected the fault, and until the object is gone.

use std::time::{Duration, Instant};

use flashsale_e2e::wait::poll_until;
use flashsale_operator::drill::chaos::Kind;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams},
};

/// How often the benchmark looks while the chaos is being removed.
pub const GONE_POLL: Duration = Duration::from_millis(10);

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

/// From `since` until nothing `selector` selects is left, looking every
/// [`GONE_POLL`].
pub async fn until_gone(
    api: &Api<DynamicObject>,
    selector: &str,
    since: Instant,
    bound: Duration,
) -> anyhow::Result<Duration> {
    let params = ListParams::default().labels(selector);
    loop {
        let left = api.list(&params).await?.items.len();
        let now = Instant::now();
        if left == 0 {
            return Ok(now - since);
        }
        anyhow::ensure!(
            now - since < bound,
            "{left} objects of {selector} still there after {bound:?}"
        );
        tokio::time::sleep(GONE_POLL).await;
    }
}
