//! The loop the background jobs share: a round every interval until
//! shutdown.

use std::{future::Future, time::Duration};

use flashsale_runtime::Shutdown;

use crate::store::Store;

/// Ticks every interval until shutdown: `while ticks.next().await { … }`.
pub struct Ticks {
    ticker: tokio::time::Interval,
    shutdown: Shutdown,
}

impl Ticks {
    /// Ticks every `interval` (a late tick is delayed, never bunched),
    /// the first at once.
    pub fn new(interval: Duration, shutdown: Shutdown) -> Self {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { ticker, shutdown }
    }

    /// Waits for the next tick: `false` once shutdown began.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.shutdown.wait() => false,
            _ = self.ticker.tick() => true,
        }
    }
}

/// Calls `round(sale)` for every sale loaded in `store`, every `interval`,
/// until `shutdown`.
pub async fn for_each_sale<F, Fut>(
    store: &Store,
    interval: Duration,
    shutdown: Shutdown,
    mut round: F,
) where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticks = Ticks::new(interval, shutdown);
    while ticks.next().await {
        for sale in store.sales().await {
            round(sale).await;
        }
    }
}
