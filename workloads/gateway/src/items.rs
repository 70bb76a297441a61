//! Stock status for shoppers' pages: served from a short-lived local cache,
//! refreshed by one request per SKU at a time (single flight), so a million
//! page views cost the inventory a handful of reads. Only the sale's own
//! SKUs have entries: an unknown SKU is refused before any lookup, so the
//! cache cannot be flooded with misses. The cache keeps the sale's sold-out
//! flags ([`SoldOut`]): a reading of no stock sets one, and while it holds
//! the last reading is served without a refresh.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use flashsale_inventory_api::StockLevel;
use tokio::time::Instant;

use crate::{
    inventory_client::{InventoryClient, InventoryError},
    sold_out::SoldOut,
};

/// Longest a refresh may take before the request is answered from what is
/// known (or refused).
const REFRESH_BUDGET: Duration = Duration::from_millis(500);

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
    flight: tokio::sync::Mutex<()>,
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
    refreshes: Arc<AtomicU64>,
    sold_out: Arc<SoldOut>,
}

impl ItemCache {
    /// A cache of `skus`, each answer fresh for `ttl`, and their sold-out
    /// flags, each trusted for `sold_out_recheck`.
    pub fn new(
        inventory: InventoryClient,
        skus: impl IntoIterator<Item = String>,
        ttl: Duration,
        sold_out_recheck: Duration,
    ) -> Self {
        let skus: Vec<String> = skus.into_iter().collect();
        let sold_out = Arc::new(SoldOut::new(skus.iter().cloned(), sold_out_recheck));
        let entries = skus
            .into_iter()
            .map(|sku| {
                let entry = Entry {
                    last: RwLock::new(Reading::Never),
                    flight: tokio::sync::Mutex::new(()),
                };
                (sku, entry)
            })
            .collect();
        Self {
            inventory,
            ttl,
            entries: Arc::new(entries),
            refreshes: Arc::default(),
            sold_out,
        }
    }

    /// The sale's sold-out flags.
    pub fn sold_out(&self) -> &SoldOut {
        &self.sold_out
    }

    /// Reads that went to the inventory so far.
    pub fn refreshes(&self) -> u64 {
        self.refreshes.load(Ordering::Relaxed)
    }

    /// The status of `sku`: from memory while fresh; otherwise one caller
    /// refreshes and the others wait for its answer.
    pub async fn get(&self, sku: &str) -> Result<ItemStatus, ItemError> {
        let entry = self
            .entries
            .get(sku)
            .ok_or_else(|| ItemError::UnknownSku(sku.to_owned()))?;
        if let Some(answer) = self.fresh(sku, entry) {
            return answer;
        }
        let _flight = entry.flight.lock().await;
        // Whoever held the flight before us may have refreshed already.
        if let Some(answer) = self.fresh(sku, entry) {
            return answer;
        }
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let result = self
            .inventory
            .stock(sku, Instant::now() + REFRESH_BUDGET)
            .await;
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

    /// The answer while the last reading is younger than the TTL, or shows
    /// `sku` sold out while its flag holds.
    fn fresh(&self, sku: &str, entry: &Entry) -> Option<Result<ItemStatus, ItemError>> {
        let last = *entry.last.read().unwrap_or_else(|p| p.into_inner());
        match last {
            Reading::Level { status, at } if at.elapsed() < self.ttl => Some(Ok(status)),
            Reading::Level { status, .. }
                if status.level.available == 0
                    && self.sold_out.is_sold_out(sku, Instant::now()) =>
            {
                Some(Ok(status))
            }
            Reading::Failed { at } if at.elapsed() < self.ttl => Some(Err(ItemError::Unavailable)),
            _ => None,
        }
    }
}
