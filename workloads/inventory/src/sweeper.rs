//! The background sweeper: returns unpaid reservations of every loaded sale.

use std::time::Duration;

use flashsale_runtime::Shutdown;

use crate::{
    api::AppState,
    metrics::Metrics,
    periodic,
    store::{Holding, Store},
};

/// Sweeps every loaded sale each `interval` until shutdown. Several replicas
/// may sweep at once: the store returns each reservation exactly once. Each
/// round first checks that Redis still holds the sale: one it lost is
/// refused from then on, not swept or reloaded.
pub async fn run(
    store: Store,
    state: AppState,
    metrics: Metrics,
    interval: Duration,
    shutdown: Shutdown,
) {
    periodic::for_each_sale(&store, interval, shutdown, |sale| {
        let (store, state, metrics) = (&store, &state, &metrics);
        async move {
            match store.check_held(&sale).await {
                Ok(Holding::Held) => {}
                Ok(Holding::LostNow) => {
                    tracing::error!(
                        sale,
                        "Redis lost the sale's stock (its load marker is gone); refusing to sell it again"
                    );
                    return;
                }
                Ok(Holding::Lost) => return,
                Err(err) => {
                    tracing::warn!(sale, error = %err, "checking the sale failed; retrying next tick");
                    return;
                }
            }
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
    })
    .await;
}
