//! The loop the background jobs share: every interval until shutdown, one
//! round per loaded sale.

use std::{future::Future, time::Duration};

use flashsale_runtime::Shutdown;

use crate::store::Store;

/// Calls `round(sale)` for every sale loaded in `store`, every `interval`
/// (a late tick is delayed, never bunched), until `shutdown`.
pub async fn for_each_sale<F, Fut>(
    store: &Store,
    interval: Duration,
    shutdown: Shutdown,
    mut round: F,
) where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = ticker.tick() => {}
        }
        for sale in store.sales().await {
            round(sale).await;
        }
    }
}
