//! Stock status for shoppers' pages, served from a local cache so that no
//! read waits on the inventory: a reading is served for `ttl`, and a read in
//! the last quarter of that (the refresh-ahead window) starts one refresh in
//! the background and is answered at once from the reading it has. Only a
//! SKU nobody read for a whole `ttl` waits, on one refresh per SKU (single
//! flight), so a million page views cost the inventory a handful of reads.
//! The inventory read is hedged: a second request after [`HEDGE_AFTER`],
//! the whole read given up [`FALLBACK`] later when a reading is there to be
//! served instead. Only the sale's own SKUs have entries: an unknown SKU is
//! refused before any lookup, so the cache cannot be flooded with misses.
//! The cache keeps the sale's sold-out flags ([`SoldOut`]): a reading of no
//! stock sets one, and while it holds the last reading is served without a
//! refresh.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use flashsale_inventory_api::StockLevel;
use tokio::time::Instant;

use crate::{
    inventory_client::{InventoryClient, InventoryError},
    metrics::{GatewayMetrics, RefreshMode},
    sold_out::SoldOut,
};

/// How long the first inventory request of a refresh has before a second
/// one is sent alongside it.
pub const HEDGE_AFTER: Duration = Duration::from_millis(10);

/// How long a refresh goes on after the hedge when a reading is there to
/// be served instead (the seed's 10 ms primary, 100 ms fallback).
pub const FALLBACK: Duration = Duration::from_millis(100);

/// Longest the first reading of a SKU may take: with nothing to serve
/// instead, waiting beats refusing.
const FIRST_READING_BUDGET: Duration = Duration::from_millis(500);

/// One cached answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemStatus {
    /// The stock as last read.
    pub level: StockLevel,
    /// True when the refresh failed and this is an older reading.
    pub stale: bool,
}

/// What a refresh left behind; each is kept for the cache's TTL, so a
/// failing inventory is asked once per TTL, not once per request.
#[derive(Clone, Copy)]
enum Reading {
    Never,
    Level { status: ItemStatus, at: Instant },
    Failed { at: Instant },
}

struct Entry {
    last: RwLock<Reading>,
    /// Held by whoever reads the inventory for this SKU.
    flight: tokio::sync::Mutex<()>,
    /// True while a background refresh is started or running.
    ahead: AtomicBool,
}

/// What a lookup found.
enum Lookup {
    /// An answer, and whether to refresh behind it.
    Answer(Result<ItemStatus, ItemError>, bool),
    /// Nothing to answer with: refresh first.
    Refresh,
}

/// Why there is no answer.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    /// Not one of the sale's SKUs.
    #[error("the sale has no SKU {0:?}")]
    UnknownSku(String),
    /// No reading yet and the inventory did not answer.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// No reading yet and the last refresh failed moments ago.
    #[error("stock status is unavailable; the inventory did not answer")]
    Unavailable,
}

/// The cache; cheap to clone.
#[derive(Clone)]
pub struct ItemCache {
    inventory: InventoryClient,
    ttl: Duration,
    entries: Arc<HashMap<String, Entry>>,
    sold_out: Arc<SoldOut>,
    metrics: GatewayMetrics,
}

impl ItemCache {
    /// A cache of `skus`, each answer fresh for `ttl`, and their sold-out
    /// flags, each trusted for `sold_out_recheck`; its reads are counted
    /// in `metrics`.
    pub fn new(
        inventory: InventoryClient,
        skus: impl IntoIterator<Item = String>,
        ttl: Duration,
        sold_out_recheck: Duration,
        metrics: GatewayMetrics,
    ) -> Self {
        let skus: Vec<String> = skus.into_iter().collect();
        let sold_out = Arc::new(SoldOut::new(skus.iter().cloned(), sold_out_recheck));
        let entries = skus
            .into_iter()
            .map(|sku| {
                let entry = Entry {
                    last: RwLock::new(Reading::Never),
                    flight: tokio::sync::Mutex::new(()),
                    ahead: AtomicBool::new(false),
                };
                (sku, entry)
            })
            .collect();
        Self {
            inventory,
            ttl,
            entries: Arc::new(entries),
            sold_out,
            metrics,
        }
    }

    /// The sale's sold-out flags.
    pub fn sold_out(&self) -> &SoldOut {
        &self.sold_out
    }

    /// The status of `sku`: from memory while the reading is younger than
    /// the TTL (refreshing it behind the answer in the refresh-ahead
    /// window); otherwise one caller refreshes and the others wait for its
    /// answer.
    pub async fn get(&self, sku: &str) -> Result<ItemStatus, ItemError> {
        let entry = self
            .entries
            .get(sku)
            .ok_or_else(|| ItemError::UnknownSku(sku.to_owned()))?;
        if let Lookup::Answer(answer, ahead) = self.lookup(sku, entry, Instant::now()) {
            if ahead {
                self.refresh_behind(sku, entry);
            }
            return answer;
        }
        let _flight = entry.flight.lock().await;
        // Whoever held the flight before us may have refreshed already.
        if let Lookup::Answer(answer, _) = self.lookup(sku, entry, Instant::now()) {
            return answer;
        }
        self.refresh(sku, entry, RefreshMode::Waited).await
    }

    /// Starts one background refresh of `sku` unless one is under way.
    fn refresh_behind(&self, sku: &str, entry: &Entry) {
        if entry.ahead.swap(true, Ordering::AcqRel) {
            return;
        }
        let (cache, sku) = (self.clone(), sku.to_owned());
        tokio::spawn(async move {
            let Some(entry) = cache.entries.get(&sku) else {
                return;
            };
            {
                let _flight = entry.flight.lock().await;
                // A waiting reader may have refreshed meanwhile.
                let due = match cache.lookup(&sku, entry, Instant::now()) {
                    Lookup::Answer(_, ahead) => ahead,
                    Lookup::Refresh => true,
                };
                if due {
                    // Its outcome is in the entry; a failure is logged there.
                    let _ = cache.refresh(&sku, entry, RefreshMode::Ahead).await;
                }
            }
            entry.ahead.store(false, Ordering::Release);
        });
    }

    /// Reads `sku` from the inventory into its entry; the caller holds the
    /// flight.
    async fn refresh(
        &self,
        sku: &str,
        entry: &Entry,
        mode: RefreshMode,
    ) -> Result<ItemStatus, ItemError> {
        let had = *entry.last.read().unwrap_or_else(|p| p.into_inner());
        let budget = match had {
            Reading::Level { .. } => HEDGE_AFTER + FALLBACK,
            Reading::Never | Reading::Failed { .. } => FIRST_READING_BUDGET,
        };
        let (result, hedged) = self
            .inventory
            .stock_hedged(sku, HEDGE_AFTER, Instant::now() + budget)
            .await;
        if hedged {
            self.metrics.item_read_hedged();
        }
        if result.is_err() {
            self.metrics.item_refresh_failed();
        }
        self.metrics.item_refresh(mode);
        let mut last = entry.last.write().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match (result, *last) {
            (Ok(level), _) => {
                if level.available == 0 {
                    self.sold_out.mark(sku, now);
                } else {
                    self.sold_out.clear(sku);
                }
                let status = ItemStatus {
                    level,
                    stale: false,
                };
                *last = Reading::Level { status, at: now };
                Ok(status)
            }
            (Err(err), Reading::Level { status, .. }) => {
                tracing::warn!(sku, error = %err, "stock refresh failed; serving the last reading");
                let status = ItemStatus {
                    stale: true,
                    ..status
                };
                *last = Reading::Level { status, at: now };
                Ok(status)
            }
            (Err(err), Reading::Never | Reading::Failed { .. }) => {
                *last = Reading::Failed { at: now };
                Err(err.into())
            }
        }
    }

    /// What `sku`'s entry answers at `now`.
    fn lookup(&self, sku: &str, entry: &Entry, now: Instant) -> Lookup {
        let last = *entry.last.read().unwrap_or_else(|p| p.into_inner());
        let sold_out = || self.sold_out.is_sold_out(sku, now);
        plan(last, now, self.ttl, sold_out)
    }
}

/// What a reading answers at `now`: a reading is served for `ttl` and
/// refreshed behind the answer in the last quarter of it; a reading of no
/// stock is served while the SKU's sold-out flag holds; a failure is
/// answered for `ttl`, so a failing inventory is asked once per TTL.
fn plan(last: Reading, now: Instant, ttl: Duration, sold_out: impl Fn() -> bool) -> Lookup {
    let age = |at: Instant| now.saturating_duration_since(at);
    match last {
        Reading::Level { status, at } if age(at) < ttl => {
            Lookup::Answer(Ok(status), age(at) >= ttl - ttl / 4)
        }
        Reading::Level { status, .. } if status.level.available == 0 && sold_out() => {
            Lookup::Answer(Ok(status), false)
        }
        Reading::Failed { at } if age(at) < ttl => {
            Lookup::Answer(Err(ItemError::Unavailable), false)
        }
        _ => Lookup::Refresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(available: u64) -> Reading {
        Reading::Level {
            status: ItemStatus {
                level: StockLevel {
                    stock: 10,
                    available,
                    reserved: 0,
                    sold: 10 - available,
                },
                stale: false,
            },
            at: Instant::now(),
        }
    }

    /// Whether the plan answers, and whether it refreshes behind.
    fn outcome(lookup: Lookup) -> Option<bool> {
        match lookup {
            Lookup::Answer(_, ahead) => Some(ahead),
            Lookup::Refresh => None,
        }
    }

    #[test]
    fn a_reading_is_served_for_its_ttl_and_refreshed_ahead_in_the_last_quarter() {
        let reading = level(5);
        let Reading::Level { at, .. } = reading else {
            unreachable!("a level")
        };
        let ttl = Duration::from_millis(1_000);
        let at_ms = |ms| at + Duration::from_millis(ms);
        let never = || false;
        assert_eq!(outcome(plan(reading, at_ms(0), ttl, never)), Some(false));
        assert_eq!(outcome(plan(reading, at_ms(749), ttl, never)), Some(false));
        assert_eq!(outcome(plan(reading, at_ms(750), ttl, never)), Some(true));
        assert_eq!(outcome(plan(reading, at_ms(999), ttl, never)), Some(true));
        assert_eq!(outcome(plan(reading, at_ms(1_000), ttl, never)), None);
    }

    #[test]
    fn sold_out_is_served_while_its_flag_holds_and_a_failure_for_the_ttl() {
        let ttl = Duration::from_millis(100);
        let later = Instant::now() + Duration::from_secs(5);
        assert_eq!(outcome(plan(level(0), later, ttl, || true)), Some(false));
        assert_eq!(outcome(plan(level(0), later, ttl, || false)), None);
        assert_eq!(outcome(plan(level(3), later, ttl, || true)), None);
        let failed = Reading::Failed { at: Instant::now() };
        let Lookup::Answer(answer, false) = plan(failed, Instant::now(), ttl, || false) else {
            panic!("a recent failure is answered")
        };
        assert!(matches!(answer, Err(ItemError::Unavailable)));
        assert_eq!(outcome(plan(failed, later, ttl, || false)), None);
    }
}
