//! When a sale is in which phase: a pure function of its spec and the time,
//! so every transition is tested without waiting for it, a controller wakes
//! exactly at the next one, and every reader (the sale's own controller, a
//! drill's "Live" check) means the same instants.

use jiff::{SignedDuration, Timestamp};

use crate::flashsale::{FlashSaleSpec, SalePhase};

/// The instants a sale's life turns on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    /// `start − warmUp`: scale to live size, inventory loaded.
    pub warm_up_at: Timestamp,
    /// The sale opens.
    pub start: Timestamp,
    /// The sale closes.
    pub end: Timestamp,
    /// `end + reservationTTL`: no reservation can be paid any more, so once
    /// the order-writer has drained, nothing is left to do.
    pub settled_at: Timestamp,
}

impl Timeline {
    /// The timeline of a spec. Durations too large for the calendar saturate
    /// (a warm-up of years starts "at the beginning of time").
    pub fn of(spec: &FlashSaleSpec) -> Self {
        let start = spec.schedule.start.0;
        let end = spec.schedule.end.0;
        let shift = |at: Timestamp, by: std::time::Duration, forward: bool| {
            let by = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
            let by = if forward { by } else { -by };
            at.saturating_add(by).unwrap_or(at)
        };
        Self {
            warm_up_at: shift(start, spec.schedule.warm_up.0, false),
            start,
            end,
            settled_at: shift(end, spec.reservation_ttl.0, true),
        }
    }

    /// The scheduled phase at `now` and when the next change is due (`None`
    /// once settled: nothing more happens by time alone).
    pub fn phase_at(&self, now: Timestamp) -> (SalePhase, Option<Timestamp>) {
        if now < self.warm_up_at {
            (SalePhase::Pending, Some(self.warm_up_at))
        } else if now < self.start {
            (SalePhase::WarmingUp, Some(self.start))
        } else if now < self.end {
            (SalePhase::Live, Some(self.end))
        } else if now < self.settled_at {
            (SalePhase::Ended, Some(self.settled_at))
        } else {
            (SalePhase::Ended, None)
        }
    }

    /// Whether every reservation of the sale has been paid or has expired.
    pub fn settled(&self, now: Timestamp) -> bool {
        now >= self.settled_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flashsale::FlashSale;

    fn spec() -> FlashSaleSpec {
        let yaml = include_str!("../../../crds/examples/flashsale-singles-day.yaml");
        match serde_yaml_ng::from_str::<FlashSale>(yaml) {
            Ok(sale) => sale.spec,
            Err(err) => panic!("example does not parse: {err}"),
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse()
            .unwrap_or_else(|err| panic!("bad time {text}: {err}"))
    }

    #[test]
    fn the_example_walks_every_phase_at_its_exact_instant() {
        // start 2026-11-11T00:00+08:00, warm-up 30m, end +2h, TTL 15m.
        let timeline = Timeline::of(&spec());
        let cases = [
            (
                "2026-11-10T15:29:59.999Z",
                SalePhase::Pending,
                Some("2026-11-10T15:30:00Z"),
            ),
            (
                "2026-11-10T15:30:00Z",
                SalePhase::WarmingUp,
                Some("2026-11-10T16:00:00Z"),
            ),
            (
                "2026-11-10T15:59:59Z",
                SalePhase::WarmingUp,
                Some("2026-11-10T16:00:00Z"),
            ),
            (
                "2026-11-10T16:00:00Z",
                SalePhase::Live,
                Some("2026-11-10T18:00:00Z"),
            ),
            (
                "2026-11-10T18:00:00Z",
                SalePhase::Ended,
                Some("2026-11-10T18:15:00Z"),
            ),
            ("2026-11-10T18:15:00Z", SalePhase::Ended, None),
        ];
        for (now, phase, next) in cases {
            assert_eq!(
                timeline.phase_at(at(now)),
                (phase, next.map(at)),
                "at {now}"
            );
        }
        assert!(!timeline.settled(at("2026-11-10T18:14:59Z")));
        assert!(timeline.settled(at("2026-11-10T18:15:00Z")));
    }

    #[test]
    fn a_warm_up_longer_than_the_calendar_saturates_instead_of_failing() {
        let mut spec = spec();
        spec.schedule.warm_up = crate::Duration(std::time::Duration::from_secs(u64::MAX));
        let timeline = Timeline::of(&spec);
        assert!(timeline.warm_up_at <= spec.schedule.start.0);
        assert_eq!(timeline.phase_at(spec.schedule.start.0).0, SalePhase::Live);
    }
}
