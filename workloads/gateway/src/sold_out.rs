//! Sold out in RAM: once a SKU is known to be sold out (the inventory
//! refused an order as `sold_out`, or a stock reading showed none left),
//! this gateway answers that SKU's orders and item page from memory, with
//! no call to the inventory or Redis, for [`SoldOut::recheck`]. After that
//! the next order asks the inventory again, so a restock is learned within
//! the recheck interval plus the inventory's own sold-out memory
//! (`--sold-out-staleness-ms`, 200 ms by default), and no order is answered
//! "sold out" from memory for stock that came back before that.
//!
//! One flag per SKU of the sale, fixed at start: an unknown SKU is refused
//! before it gets here, so the map cannot grow.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::time::Instant;

/// The sold-out flags of one sale's SKUs.
#[derive(Debug)]
pub struct SoldOut {
    /// Per SKU: when it was found sold out, in ms since `epoch` plus one
    /// (0: not known to be).
    flags: HashMap<String, AtomicU64>,
    recheck: Duration,
    epoch: Instant,
}

impl SoldOut {
    /// Flags for `skus`, each trusted for `recheck` once set.
    pub fn new(skus: impl IntoIterator<Item = String>, recheck: Duration) -> Self {
        Self {
            flags: skus.into_iter().map(|s| (s, AtomicU64::new(0))).collect(),
            recheck,
            epoch: Instant::now(),
        }
    }

    /// How long a flag is trusted before the inventory is asked again.
    pub fn recheck(&self) -> Duration {
        self.recheck
    }

    /// Records that `sku` was found sold out at `now`.
    pub fn mark(&self, sku: &str, now: Instant) {
        if let Some(flag) = self.flags.get(sku) {
            flag.store(self.stamp(now), Ordering::Relaxed);
        }
    }

    /// Records that `sku` was found to have stock.
    pub fn clear(&self, sku: &str) {
        if let Some(flag) = self.flags.get(sku) {
            flag.store(0, Ordering::Relaxed);
        }
    }

    /// Whether `sku` is known sold out at `now`: found so less than
    /// [`Self::recheck`] ago.
    pub fn is_sold_out(&self, sku: &str, now: Instant) -> bool {
        let Some(at) = self.flags.get(sku).map(|f| f.load(Ordering::Relaxed)) else {
            return false;
        };
        at != 0 && self.stamp(now).saturating_sub(at) < duration_ms(self.recheck)
    }

    fn stamp(&self, now: Instant) -> u64 {
        duration_ms(now.saturating_duration_since(self.epoch)).saturating_add(1)
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_holds_for_the_recheck_interval_and_no_longer() {
        let flags = SoldOut::new(["A".to_owned()], Duration::from_millis(1_000));
        let t0 = Instant::now();
        assert!(!flags.is_sold_out("A", t0), "not known sold out at first");
        flags.mark("A", t0);
        assert!(flags.is_sold_out("A", t0));
        assert!(flags.is_sold_out("A", t0 + Duration::from_millis(999)));
        assert!(!flags.is_sold_out("A", t0 + Duration::from_millis(1_000)));
        // Found sold out again: trusted again.
        let t1 = t0 + Duration::from_millis(1_500);
        flags.mark("A", t1);
        assert!(flags.is_sold_out("A", t1 + Duration::from_millis(500)));
        flags.clear("A");
        assert!(!flags.is_sold_out("A", t1 + Duration::from_millis(500)));
    }

    #[test]
    fn only_the_sales_skus_have_flags() {
        let flags = SoldOut::new(["A".to_owned()], Duration::from_secs(1));
        let now = Instant::now();
        flags.mark("B", now);
        assert!(!flags.is_sold_out("B", now));
        assert!(!flags.is_sold_out("A", now));
    }
}
