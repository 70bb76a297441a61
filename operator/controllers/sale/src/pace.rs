//! How often a sale's inventory is asked for its stock. A reachable
//! inventory is read at every refresh; one that did not answer is asked
//! again after a backoff (the refresh, doubling, capped), so that hundreds
//! of sales whose inventories are down or still starting do not spend the
//! controller's bounded reconciles waiting for timeouts, and their status is
//! not rewritten with each new way of failing. An inventory with no ready
//! replica is not asked at all: nothing could answer.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use jiff::{SignedDuration, Timestamp};

/// The longest wait between two readings of an unreachable inventory.
pub const CAP: Duration = Duration::from_secs(120);

/// Per sale (by `namespace/name`): when to ask next, and the failures in a
/// row.
#[derive(Debug, Default)]
pub struct StockPace {
    failed: Mutex<HashMap<String, (Timestamp, u32)>>,
}

impl StockPace {
    fn failed_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Timestamp, u32)>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the stock of sale `key` should be read at `now`.
    pub fn due(&self, key: &str, now: Timestamp) -> bool {
        self.failed_map()
            .get(key)
            .is_none_or(|(next, _)| *next <= now)
    }

    /// Records a reading: a success forgets the failures, a failure sets
    /// when to ask next, `refresh` doubling per failure in a row up to
    /// [`CAP`].
    pub fn read(&self, key: &str, ok: bool, now: Timestamp, refresh: Duration) {
        let mut failed = self.failed_map();
        if ok {
            failed.remove(key);
            return;
        }
        let count = failed.get(key).map_or(0, |(_, count)| *count);
        let wait = refresh
            .saturating_mul(1u32.checked_shl(count).unwrap_or(u32::MAX))
            .min(CAP);
        let next = now
            .checked_add(SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX))
            .unwrap_or(now);
        failed.insert(key.to_owned(), (next, count.saturating_add(1)));
    }

    /// Forgets a sale (deleted, or its inventory scaled to zero).
    pub fn forget(&self, key: &str) {
        self.failed_map().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn an_unreachable_inventory_is_asked_less_and_less_often_until_it_answers() {
        let pace = StockPace::default();
        let refresh = Duration::from_secs(15);
        assert!(pace.due("ns/s", at(0)), "never failed");
        let mut asked = Vec::new();
        for second in 0..600 {
            if pace.due("ns/s", at(second)) {
                asked.push(second);
                pace.read("ns/s", false, at(second), refresh);
            }
        }
        assert_eq!(asked, [0, 15, 45, 105, 225, 345, 465, 585]);
        pace.read("ns/s", true, at(600), refresh);
        assert!(pace.due("ns/s", at(600)), "an answer resets it");
        assert!(pace.due("ns/other", at(1)), "per sale");
    }
}
