//! The admission frontier as this replica last read it, so status polls
//! answer from memory: every replica's background advance (every ~100 ms)
//! refreshes it, and a poll reads Redis only when it is older than the
//! allowed age. However often clients poll, a replica then costs Redis at
//! most one frontier read per that age.

use std::time::{Duration, Instant};

use super::store::Frontier;

/// One reading of the frontier and when it arrived.
#[derive(Debug, Clone, Copy)]
pub(super) struct Known {
    frontier: Frontier,
    read_at: Instant,
}

impl Known {
    /// `frontier`, read by a call sent at `read_at`.
    pub(super) fn new(frontier: Frontier, read_at: Instant) -> Self {
        Self { frontier, read_at }
    }

    /// The frontier at `now` if this reading is at most `max_age` old, with
    /// the Redis clock moved on by the time since the call was sent. (The
    /// clock is then ahead of Redis by at most the call's latency, never
    /// behind: a ticket is never taken for fresh past its lifetime, and a
    /// pass lasts that fraction of a millisecond longer.)
    pub(super) fn at(&self, now: Instant, max_age: Duration) -> Option<Frontier> {
        let age = now.checked_duration_since(self.read_at)?;
        if age > max_age {
            return None;
        }
        let age_us = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
        Some(Frontier {
            now_us: self.frontier.now_us.saturating_add(age_us),
            ..self.frontier
        })
    }

    /// Whether `other` is a later reading of the Redis clock than this one
    /// (two replica tasks may read at once and store out of order).
    pub(super) fn is_older_than(&self, other: &Self) -> bool {
        self.frontier.now_us <= other.frontier.now_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(now_us: u64) -> Frontier {
        Frontier {
            admitted: 7,
            issued: 10,
            now_us,
        }
    }

    #[test]
    fn a_recent_reading_answers_with_its_clock_moved_on() {
        let read_at = Instant::now();
        let known = Known::new(reading(1_000_000), read_at);
        let max_age = Duration::from_millis(250);
        let at = |ms| known.at(read_at + Duration::from_millis(ms), max_age);
        let now = at(0).map(|f| (f.admitted, f.issued, f.now_us));
        assert_eq!(now, Some((7, 10, 1_000_000)));
        assert_eq!(at(100).map(|f| f.now_us), Some(1_100_000));
        assert_eq!(at(250).map(|f| f.now_us), Some(1_250_000));
        assert!(at(251).is_none(), "too old: read Redis again");
        // A reading from the future (another task stored it meanwhile) is
        // not trusted for the past.
        if let Some(before) = read_at.checked_sub(Duration::from_millis(1)) {
            assert!(known.at(before, max_age).is_none());
        }
    }

    #[test]
    fn readings_order_by_the_redis_clock() {
        let at = Instant::now();
        let (early, late) = (Known::new(reading(5), at), Known::new(reading(6), at));
        assert!(early.is_older_than(&late));
        assert!(!late.is_older_than(&early));
    }
}
