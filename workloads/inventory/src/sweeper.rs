//! The background sweeper: returns unpaid reservations of every loaded sale.

use std::time::Duration;

use flashsale_runtime::Shutdown;

use crate::{api::AppState, metrics::Metrics, store::Store};

/// Sweeps every loaded sale each `interval` until shutdown. Several replicas
/// may sweep at once: the store returns each reservation exactly once.
pub async fn run(
    store: Store,
    state: AppState,
    metrics: Metrics,
    interval: Duration,
    shutdown: Shutdown,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = ticker.tick() => {}
        }
        for sale in store.sales().await {
            match store.sweep(&sale, 512).await {
                Ok(0) => {}
                Ok(n) => {
                    metrics.expired(n);
                    state.clear_sold_out(&sale);
                    tracing::info!(sale, returned = n, "returned unpaid reservations to stock");
                }
                Err(err) => tracing::warn!(sale, error = %err, "sweep failed; retrying next tick"),
            }
        }
    }
}
