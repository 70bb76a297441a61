//! When a policy is next due for evaluation. Its own status writes wake the
//! controller too; without pacing every write would evaluate (and write)
//! again at once. Kept in memory: a new leader evaluates at once, which is
//! what it should do anyway.
//!
//! Due times are on the monotonic clock ([`flashsale_kit::clock::Clock::monotonic`]):
//! a wall clock stepped back an hour must not leave a policy unevaluated for
//! that hour.

use std::{collections::HashMap, sync::Mutex, time::Duration};

/// The next evaluation of every policy, by key.
#[derive(Debug, Default)]
pub struct Pace {
    due: Mutex<HashMap<String, (Option<i64>, Duration)>>,
}

impl Pace {
    /// How long to wait before evaluating `key` at `generation`, at `now`
    /// on the monotonic clock: `None` when it is due (its time has come, or
    /// its spec changed since, as when on-call sets an override, which must
    /// act now).
    pub fn wait(&self, key: &str, generation: Option<i64>, now: Duration) -> Option<Duration> {
        let due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        let (seen, at) = due.get(key)?;
        if *seen != generation || *at <= now {
            return None;
        }
        Some(*at - now)
    }

    /// Records that `key` at `generation` is next due at `at` on the
    /// monotonic clock.
    pub fn set(&self, key: &str, generation: Option<i64>, at: Duration) {
        self.due
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), (generation, at));
    }

    /// Forgets a policy that is gone.
    pub fn forget(&self, key: &str) {
        self.due
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn due_when_the_time_comes_or_the_spec_changes() {
        let pace = Pace::default();
        assert_eq!(pace.wait("a", Some(1), at(0)), None, "never evaluated");
        pace.set("a", Some(1), at(5_000));
        assert_eq!(
            pace.wait("a", Some(1), at(1_000)),
            Some(Duration::from_secs(4))
        );
        assert_eq!(pace.wait("a", Some(1), at(5_000)), None, "on time");
        assert_eq!(pace.wait("a", Some(2), at(1_000)), None, "spec edited");
        assert_eq!(pace.wait("b", Some(1), at(1_000)), None, "another policy");
        pace.forget("a");
        assert_eq!(pace.wait("a", Some(1), at(1_000)), None);
    }
}
