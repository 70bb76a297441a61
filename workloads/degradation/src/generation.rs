//! The generation rule of the writer, and what readers take as a
//! generation at all.

/// How far a generation may lie ahead of a reader's or writer's clock
/// (Unix milliseconds) and still be believed: a day.
///
/// Every generation a writer publishes is the clock of some writer in
/// milliseconds, or one more than the last one (see [`next_generation`]),
/// so a real one is never far ahead of the clock: only by the writers'
/// clock skew, and by one per change made faster than a change a
/// millisecond. A generation beyond this horizon was not written by the
/// rule: a hand edit (`"generation": "18446744073709551615"`) or a corrupt
/// value. Were it believed, every later state would be below it and every
/// gateway would stay at that state for good.
pub const HORIZON_MS: u64 = 24 * 60 * 60 * 1000;

/// Whether `generation` can have come from the generation rule, seen at
/// `now`: it is at most [`HORIZON_MS`] ahead of the clock.
pub fn plausible(generation: u64, now: jiff::Timestamp) -> bool {
    generation <= clock_ms(now).saturating_add(HORIZON_MS)
}

/// Whether a reader with `in_force` takes a state of generation `next` at
/// `now`: only a plausible generation ([`plausible`]), and only above the
/// one in force — unless the one in force is itself beyond belief, which
/// any plausible state then replaces, so a reader that took a bad
/// generation (before this rule, or from a clock that jumped back a day)
/// is not stuck behind it.
pub fn supersedes(next: u64, in_force: u64, now: jiff::Timestamp) -> bool {
    plausible(next, now) && (next > in_force || !plausible(in_force, now))
}

/// The generation of the next state a writer publishes, after `previous`
/// (0 when it knows of none), at `now`: `max(previous + 1, now in Unix
/// milliseconds)`, saturating at `u64::MAX`. A `previous` that is not
/// [`plausible`] is not built upon: the writer starts again at the clock.
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
    let previous = if plausible(previous, now) {
        previous
    } else {
        0
    };
    previous.saturating_add(1).max(clock_ms(now))
}

/// `now` in Unix milliseconds; 0 before 1970.
fn clock_ms(now: jiff::Timestamp) -> u64 {
    u64::try_from(now.as_millisecond()).unwrap_or(0)
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
    fn a_generation_beyond_belief_is_not_built_upon() {
        let now = at("2026-11-11T00:00:00Z");
        let ms = now.as_millisecond() as u64;
        // A hand edit to the largest number: the writer starts again at the
        // clock instead of saturating there for good.
        for edited in [u64::MAX, u64::MAX - 1, ms + HORIZON_MS + 1] {
            assert_eq!(next_generation(edited, now), ms, "{edited}");
        }
        // A day ahead is still believed (clock skew between writers).
        assert_eq!(next_generation(ms + HORIZON_MS, now), ms + HORIZON_MS + 1);
    }

    #[test]
    fn readers_take_only_plausible_states_and_leave_a_bad_one_behind() {
        let now = at("2026-11-11T00:00:00Z");
        let ms = now.as_millisecond() as u64;
        // (next, in force, taken)
        let cases = [
            (ms, ms - 1, true),
            (ms - 1, ms, false),
            (ms, ms, false),
            // A hand-edited generation is refused...
            (u64::MAX, ms, false),
            // ...and one taken before is left for the next real state.
            (ms, u64::MAX, true),
            (5, u64::MAX, true),
            (u64::MAX, u64::MAX, false),
            // A restarted reader (0) takes what is current.
            (ms, 0, true),
        ];
        for (next, in_force, taken) in cases {
            assert_eq!(
                supersedes(next, in_force, now),
                taken,
                "{next} over {in_force}"
            );
        }
    }
}
