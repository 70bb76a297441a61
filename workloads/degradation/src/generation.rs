//! The generation rule of the writer.

/// The generation of the next state a writer publishes, after `previous`
/// (0 when it knows of none), at `now`: `max(previous + 1, now in Unix
/// milliseconds)`, saturating at `u64::MAX`.
///
/// Readers ignore any generation not above the one in force, so a writer
/// that lost its memory (the ConfigMap deleted and recreated, the policy
/// recreated, a new operator) must still go above every generation a reader
/// has seen, or the readers would stay at the old state. The wall clock in
/// milliseconds is such a floor without any stored state: every generation
/// published before was taken at an earlier instant, so it is below the
/// clock now (unless a writer made more than a change a millisecond for a
/// while, or the writers' clocks disagree by more than the time between two
/// changes). `previous + 1` keeps the sequence increasing when the clock
/// steps back or two changes fall in one millisecond. A clock before 1970
/// gives no floor.
pub fn next_generation(previous: u64, now: jiff::Timestamp) -> u64 {
    let floor = u64::try_from(now.as_millisecond()).unwrap_or(0);
    previous.saturating_add(1).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> jiff::Timestamp {
        rfc3339.parse().unwrap_or(jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_writer_without_memory_starts_at_the_clock() {
        let published = next_generation(0, at("2026-11-11T00:00:00.250Z"));
        assert_eq!(published, 1_794_355_200_250);
        // A writer that lost that count, a moment later, still goes above.
        assert!(next_generation(0, at("2026-11-11T00:00:00.251Z")) > published);
    }

    #[test]
    fn a_clock_behind_the_count_still_moves_it_up() {
        let now = at("2026-11-11T00:00:00Z");
        let ms = now.as_millisecond() as u64;
        // Two changes in one millisecond.
        let first = next_generation(0, now);
        assert_eq!(next_generation(first, now), ms + 1);
        // A clock stepped back by an hour.
        let earlier = at("2026-11-10T23:00:00Z");
        assert_eq!(next_generation(ms + 5, earlier), ms + 6);
        // A clock before 1970.
        assert_eq!(next_generation(7, at("1969-12-31T23:59:59Z")), 8);
    }

    #[test]
    fn the_count_saturates() {
        let now = at("2026-11-11T00:00:00Z");
        assert_eq!(next_generation(u64::MAX, now), u64::MAX);
        assert_eq!(next_generation(u64::MAX - 1, now), u64::MAX);
    }
}
