//! A standby region's inventory. Its Redis is a read-only replica of the
//! primary region's: it holds the primary's counts but cannot change them.
//! The inventory starts all the same and stands by (every sale operation
//! answers `standby`, its readiness holds, its background jobs idle), then
//! sells as soon as the replica is promoted, from the counts the primary
//! replicated: nothing is loaded afresh that the primary had already
//! changed, since a load keeps every count that exists. Its Redis demoted
//! again (the primary region takes buyers back and this one follows it),
//! it stands by again.

use std::time::Duration;

use flashsale_runtime::Shutdown;

use crate::{
    metrics::Metrics,
    periodic,
    store::{SaleDefinition, Store},
};

/// Checks every `every` whether `store`'s Redis takes writes, until
/// `shutdown`, and stands by or sells accordingly. `pending` is the sale
/// definition a standby start could not load yet: it is loaded on the
/// promotion, before the first sale.
pub async fn follow(
    store: Store,
    mut pending: Option<SaleDefinition>,
    metrics: Metrics,
    every: Duration,
    shutdown: Shutdown,
) {
    let mut ticks = periodic::Ticks::new(every, shutdown);
    while ticks.next().await {
        // An unreachable Redis is the readiness check's to report.
        let Ok(writable) = store.writable().await else {
            continue;
        };
        match (store.standing_by(), writable) {
            (false, false) => stand_by(&store, &metrics),
            (true, true) => {
                if let Some(def) = &pending {
                    match store.load(def).await {
                        Ok(loaded) => tracing::info!(sale = def.sale, ?loaded, "sale loaded"),
                        Err(err) => {
                            tracing::warn!(sale = def.sale, error = %err, "Redis was promoted but loading the sale failed; retrying");
                            continue;
                        }
                    }
                    pending = None;
                }
                store.set_standby(false);
                metrics.standby(false);
                tracing::info!("Redis was promoted: selling");
            }
            _ => {}
        }
    }
}

/// Makes `store` stand by, saying so.
pub fn stand_by(store: &Store, metrics: &Metrics) {
    store.set_standby(true);
    metrics.standby(true);
    tracing::warn!(
        "Redis is a read-only replica (a standby region's): standing by, refusing sales until it is promoted"
    );
}
