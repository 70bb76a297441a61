//! What may be committed, and the events parked until their order is stored.
//!
//! A `paid` or `expired` event can reach the writer before the `created`
//! event of its order: they come from different producers. Such an event is
//! parked and retried, after [`FIRST_RETRY`] and then with doubling delays,
//! and also whenever the writer reads another event of the same order (its
//! `created` event most likely). After [`RETRIES`] retries that still find no
//! order, the writer gives up on it: a `paid` event is dead-lettered (reason
//! `missing_order`), an `expired` one acknowledged as nothing to expire.
//!
//! Meanwhile the partition goes on: events after a parked one are stored and
//! its neighbours' partitions are untouched. Only the commit waits: a
//! partition's position is the offset after the last message handled, held
//! back to the first parked event. An event leaves the ledger once stored,
//! dead-lettered or (an `expired` one) given up, so an offset is never
//! committed past an event that is none of these, and a crash replays it
//! (and what follows it, as no-ops).
//!
//! Pure bookkeeping, time as an argument: the writer does the I/O.

use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

/// Delay before the first retry of a parked event; each later one doubles.
pub(super) const FIRST_RETRY: Duration = Duration::from_millis(125);

/// Retries of a parked event before the writer gives up on it: with
/// [`FIRST_RETRY`], the last is about 15.9 s after the first miss. A
/// `created` event comes from the inventory's outbox relay, which another
/// replica takes over 10 s after one died holding it (`CLAIM_IDLE` there),
/// so a `paid` event that overtook it is not given up before it arrives.
pub(super) const RETRIES: u32 = 7;

/// A partition and an offset in it.
pub(super) type Position = (i32, i64);

/// A parked event.
#[derive(Debug)]
struct Parked<T> {
    item: T,
    order_id: String,
    /// Scheduled retries that missed so far.
    retries: u32,
    /// When the next scheduled retry is due.
    due: Instant,
    /// When it first missed.
    since: Instant,
}

/// What [`Ledger::missed`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Parked, to be retried.
    Parked,
    /// Retried enough: dead-letter it (or, an `expired` event, count it),
    /// then [`Ledger::settled`].
    GiveUp {
        /// Times its order was looked for.
        attempts: u32,
        /// Since the first miss.
        waited: Duration,
    },
}

/// Per partition of this member: what was handled, what was committed, and
/// what is parked. `T` is whatever the writer needs to retry an event.
#[derive(Debug)]
pub(super) struct Ledger<T> {
    /// Partition → offset after the last message handled (stored,
    /// dead-lettered or parked).
    handled: BTreeMap<i32, i64>,
    /// Partition → position last handed to a commit.
    committed: BTreeMap<i32, i64>,
    parked: BTreeMap<Position, Parked<T>>,
}

impl<T> Default for Ledger<T> {
    fn default() -> Self {
        Self {
            handled: BTreeMap::new(),
            committed: BTreeMap::new(),
            parked: BTreeMap::new(),
        }
    }
}

impl<T: Clone> Ledger<T> {
    /// The message at `at` was stored, dead-lettered or parked.
    pub(super) fn handled(&mut self, (partition, offset): Position) {
        let next = self.handled.entry(partition).or_insert(0);
        *next = (*next).max(offset.saturating_add(1));
    }

    /// The event at `at` found no order at `now`: parks it, or counts a
    /// retry of a parked one. A retry before it was due (pulled in by
    /// another event of its order) does not count.
    pub(super) fn missed(
        &mut self,
        at: Position,
        order_id: &str,
        item: T,
        now: Instant,
    ) -> Verdict {
        let Some(parked) = self.parked.get_mut(&at) else {
            self.parked.insert(
                at,
                Parked {
                    item,
                    order_id: order_id.to_owned(),
                    retries: 0,
                    due: now + FIRST_RETRY,
                    since: now,
                },
            );
            return Verdict::Parked;
        };
        if now < parked.due {
            return Verdict::Parked;
        }
        parked.retries += 1;
        if parked.retries >= RETRIES {
            return Verdict::GiveUp {
                attempts: parked.retries + 1,
                waited: now.saturating_duration_since(parked.since),
            };
        }
        parked.due = now + FIRST_RETRY * 2_u32.pow(parked.retries);
        Verdict::Parked
    }

    /// The event at `at` was stored, dead-lettered or given up: its
    /// partition's commit may pass it.
    pub(super) fn settled(&mut self, at: Position) {
        self.parked.remove(&at);
    }

    /// Parked events to write again now, oldest first: those due, and those
    /// of an order for which `seen` holds (an event of it was just read).
    pub(super) fn retries(&self, now: Instant, seen: impl Fn(&str) -> bool) -> Vec<T> {
        self.parked
            .values()
            .filter(|p| p.due <= now || seen(&p.order_id))
            .map(|p| p.item.clone())
            .collect()
    }

    /// When the earliest parked event is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.parked.values().map(|p| p.due).min()
    }

    /// Events parked.
    pub(super) fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Partition → the offset a commit may name: after the last handled
    /// message, but not past the first parked event.
    pub(super) fn positions(&self) -> BTreeMap<i32, i64> {
        let mut positions = self.handled.clone();
        for &(partition, offset) in self.parked.keys() {
            let position = positions.entry(partition).or_insert(offset);
            *position = (*position).min(offset);
        }
        positions
    }

    /// The positions that moved since the last call, for the partitions
    /// `assigned` to this member. A partition no longer assigned is
    /// forgotten, parked events included: its new owner starts from the
    /// group's commit, which is not past them, and handles them itself.
    pub(super) fn advanced(&mut self, assigned: impl Fn(i32) -> bool) -> BTreeMap<i32, i64> {
        self.handled.retain(|&p, _| assigned(p));
        self.committed.retain(|&p, _| assigned(p));
        self.parked.retain(|&(p, _), _| assigned(p));
        let mut moved = self.positions();
        moved.retain(|p, position| self.committed.get(p) != Some(position));
        self.committed.extend(&moved);
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger<&'static str> {
        Ledger::default()
    }

    #[test]
    fn positions_follow_handled_messages() {
        let mut l = ledger();
        l.handled((0, 4));
        l.handled((0, 2));
        l.handled((1, 0));
        assert_eq!(l.positions(), BTreeMap::from([(0, 5), (1, 1)]));
    }

    #[test]
    fn a_parked_event_holds_its_partition_back_and_only_it() {
        let (mut l, now) = (ledger(), Instant::now());
        for offset in 0..10 {
            l.handled((0, offset));
            l.handled((1, offset));
        }
        assert_eq!(l.missed((0, 3), "o3", "e3", now), Verdict::Parked);
        assert_eq!(l.missed((0, 7), "o7", "e7", now), Verdict::Parked);
        assert_eq!(l.positions(), BTreeMap::from([(0, 3), (1, 10)]));
        l.settled((0, 3));
        assert_eq!(l.positions(), BTreeMap::from([(0, 7), (1, 10)]));
        l.settled((0, 7));
        assert_eq!(l.positions(), BTreeMap::from([(0, 10), (1, 10)]));
    }

    #[test]
    fn retries_back_off_then_give_up_after_about_sixteen_seconds() {
        let (mut l, start) = (ledger(), Instant::now());
        l.handled((0, 0));
        assert_eq!(l.missed((0, 0), "o", "e", start), Verdict::Parked);
        let (mut due_times, mut gave_up) = (Vec::new(), None);
        while let Some(due) = l.next_due() {
            due_times.push(due - start);
            assert_eq!(l.retries(due, |_| false), vec!["e"]);
            if let Verdict::GiveUp { attempts, waited } = l.missed((0, 0), "o", "e", due) {
                gave_up = Some((attempts, waited));
                break;
            }
        }
        assert_eq!(gave_up, Some((RETRIES + 1, Duration::from_millis(15_875))));
        let ms: Vec<u128> = due_times.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![125, 375, 875, 1_875, 3_875, 7_875, 15_875]);
        // Given up is not settled: the commit still waits for the dead letter.
        assert_eq!(l.positions(), BTreeMap::from([(0, 0)]));
        l.settled((0, 0));
        assert_eq!(l.positions(), BTreeMap::from([(0, 1)]));
    }

    #[test]
    fn an_event_of_the_same_order_pulls_a_parked_one_in_early_for_free() {
        let (mut l, now) = (ledger(), Instant::now());
        l.missed((0, 0), "o1", "paid o1", now);
        l.missed((0, 1), "o2", "paid o2", now);
        assert!(l.retries(now, |_| false).is_empty(), "nothing is due yet");
        assert_eq!(l.retries(now, |o| o == "o2"), vec!["paid o2"]);
        // Missing again before it was due costs no retry.
        let early = now + Duration::from_millis(10);
        assert_eq!(l.missed((0, 1), "o2", "paid o2", early), Verdict::Parked);
        assert_eq!(l.next_due(), Some(now + FIRST_RETRY));
    }

    #[test]
    fn only_moved_positions_of_assigned_partitions_are_committed() {
        let (mut l, now) = (ledger(), Instant::now());
        l.handled((0, 0));
        l.handled((1, 0));
        assert_eq!(l.advanced(|_| true), BTreeMap::from([(0, 1), (1, 1)]));
        assert!(l.advanced(|_| true).is_empty(), "nothing moved");
        l.handled((0, 1));
        l.handled((0, 2));
        l.missed((0, 2), "o", "e", now);
        assert_eq!(l.advanced(|_| true), BTreeMap::from([(0, 2)]));
        // Partition 0 goes to another member: forgotten, parked event too.
        l.handled((1, 1));
        assert_eq!(l.advanced(|p| p == 1), BTreeMap::from([(1, 2)]));
        assert_eq!(l.parked(), 0);
        assert_eq!(l.positions(), BTreeMap::from([(1, 2)]));
    }
}
