//! A bare `kube::runtime::watcher` on the switches ConfigMap in this
//! process: the floor any API-server watch reaches, and the instant a new
//! state became visible.

use std::time::{Duration, Instant};

use flashsale_degradation::Degradation;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};
use tokio::{sync::watch, task::JoinHandle};

/// The newest state the watch has seen, and when its event arrived.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// Its generation (0 before the first).
    pub generation: u64,
    /// Its tier.
    pub tier: u32,
    /// When it arrived.
    pub at: Instant,
}

/// The watch, stopped when dropped.
pub struct Follower {
    seen: watch::Receiver<Seen>,
    task: JoinHandle<()>,
}

impl Follower {
    /// Follows the ConfigMap `name` (absent until it is created).
    pub fn start(api: Api<ConfigMap>, name: &str) -> Self {
        let (sender, seen) = watch::channel(Seen {
            generation: 0,
            tier: 0,
            at: Instant::now(),
        });
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let events = watcher(api, config).default_backoff().applied_objects();
        let task = tokio::spawn(async move {
            let mut events = events.boxed();
            while let Some(event) = events.next().await {
                let at = Instant::now();
                let Ok(map) = event else { continue };
                let Ok(state) = Degradation::from_data(&map.data.unwrap_or_default()) else {
                    continue;
                };
                // A re-list replays older states: keep the newest.
                sender.send_if_modified(|seen| {
                    let newer = state.generation > seen.generation;
                    if newer {
                        *seen = Seen {
                            generation: state.generation,
                            tier: state.tier,
                            at,
                        };
                    }
                    newer
                });
            }
        });
        Self { seen, task }
    }

    /// The newest state seen so far.
    pub fn latest(&self) -> Seen {
        *self.seen.borrow()
    }

    /// Waits up to `bound` for a state that `wanted` accepts.
    pub async fn wait_for(
        &self,
        what: &str,
        wanted: impl FnMut(&Seen) -> bool,
        bound: Duration,
    ) -> anyhow::Result<Seen> {
        let mut seen = self.seen.clone();
        let found = tokio::time::timeout(bound, seen.wait_for(wanted))
            .await
            .map_err(|_| anyhow::anyhow!("the bare watch did not see {what} within {bound:?}"))??;
        Ok(*found)
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}
