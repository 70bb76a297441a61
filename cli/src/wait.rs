//! Waiting for the operator to act: one object watched (never polled)
//! until a check on it passes or a bound runs out.

use std::{fmt::Debug, time::Duration};

use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Resource,
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;

use crate::failure::{Failure, ONCALL};

/// How a wait ended without the check passing.
pub enum Waited<K> {
    /// The bound ran out; the object as last seen.
    TimedOut(Option<K>),
    /// Watching failed for good.
    Failed(Failure),
}

/// Watches `name` in `api` until `check` returns a value, for at most
/// `bound`.
pub async fn until<K, T>(
    api: Api<K>,
    name: &str,
    bound: Duration,
    mut check: impl FnMut(&K) -> Option<T>,
) -> Result<T, Waited<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut objects = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut last = None;
    let watching = async {
        loop {
            match objects.try_next().await {
                Ok(Some(object)) => {
                    if let Some(found) = check(&object) {
                        return Ok(found);
                    }
                    last = Some(object);
                }
                Ok(None) => return Err(Failure::Refused("the watch ended".to_owned())),
                Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                | Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))
                    if status.code == 403 =>
                {
                    return Err(Failure::Refused(format!(
                        "permission denied: {}.\nYou need `list` and `watch` on it to follow \
                         the operator's answer: {ONCALL}.",
                        status.message
                    )));
                }
                // Transient: the watcher backs off and starts again.
                Err(_) => {}
            }
        }
    };
    let result = tokio::time::timeout(bound, watching).await;
    match result {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(failure)) => Err(Waited::Failed(failure)),
        Err(_) => Err(Waited::TimedOut(last)),
    }
}
