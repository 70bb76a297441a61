//! Axis scales: nice tick steps (1, 2 or 5 × 10^k) and the linear map from
//! values to pixels, safe for empty, constant and non-finite data.

/// An axis domain rounded out to whole tick steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ticks {
    /// The first tick, at or below the data's minimum.
    pub lo: f64,
    /// The last tick, at or above the data's maximum.
    pub hi: f64,
    /// The distance between ticks.
    pub step: f64,
}

impl Ticks {
    /// About `target` ticks covering `min..=max`. Empty or non-finite input
    /// gives 0..1; a constant gives a range around it.
    pub fn nice(min: f64, max: f64, target: usize) -> Self {
        let (min, max) = if min.is_finite() && max.is_finite() && min <= max {
            (min, max)
        } else {
            (0.0, 1.0)
        };
        let (min, max) = if max > min {
            (min, max)
        } else if min == 0.0 {
            (0.0, 1.0)
        } else {
            // A constant sits inside its own axis, from zero when positive.
            let pad = min.abs() * 0.1;
            (
                if min > 0.0 { 0.0 } else { min - pad },
                if min < 0.0 { 0.0 } else { max + pad },
            )
        };
        let step = nice_step((max - min) / target.max(1) as f64);
        if !step.is_finite() || step <= 0.0 {
            return Self::nice(0.0, 1.0, target);
        }
        Self {
            lo: (min / step).floor() * step,
            hi: (max / step).ceil() * step,
            step,
        }
    }

    /// The same ticks, with a step of at least one (for counts and tiers).
    pub fn whole(self) -> Self {
        if self.step >= 1.0 {
            return self;
        }
        Self {
            lo: self.lo.floor(),
            hi: self.hi.ceil(),
            step: 1.0,
        }
    }

    /// The tick values from `lo` to `hi`.
    pub fn values(&self) -> impl Iterator<Item = f64> + '_ {
        let first = (self.lo / self.step).round();
        let count = ((self.hi - self.lo) / self.step).round() as usize;
        // Multiples of the step, so 0.1 × 3 is not drifted by repeated adds.
        (0..=count).map(move |i| (first + i as f64) * self.step)
    }

    /// The tick values that fall inside `min..=max` (for an axis whose
    /// domain is fixed, like a time range).
    pub fn within(&self, min: f64, max: f64) -> impl Iterator<Item = f64> + '_ {
        let slack = self.step * 1e-9;
        self.values()
            .filter(move |v| *v >= min - slack && *v <= max + slack)
    }

    /// How many decimals tick labels need to tell ticks apart.
    pub fn decimals(&self) -> usize {
        (-self.step.log10().floor()).max(0.0) as usize
    }
}

/// The step of 1, 2 or 5 × 10^k nearest to `raw` on a log scale.
fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    // Geometric midpoints between 1, 2, 5 and 10.
    let nice = if fraction >= 50f64.sqrt() {
        10.0
    } else if fraction >= 10f64.sqrt() {
        5.0
    } else if fraction >= 2f64.sqrt() {
        2.0
    } else {
        1.0
    };
    nice * magnitude
}

/// The smallest and largest finite values, if any.
pub(crate) fn extent(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((f64::min(lo, v), f64::max(hi, v))),
        })
}

/// A linear map from a domain to pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Linear {
    domain: (f64, f64),
    range: (f64, f64),
}

impl Linear {
    /// Maps `domain` onto `range` (either may run backwards).
    pub fn new(domain: (f64, f64), range: (f64, f64)) -> Self {
        Self { domain, range }
    }

    /// The pixel for `value`; an empty domain maps to the range's middle.
    pub fn map(&self, value: f64) -> f64 {
        let (d0, d1) = self.domain;
        let (r0, r1) = self.range;
        let width = d1 - d0;
        if width == 0.0 || !width.is_finite() {
            return (r0 + r1) / 2.0;
        }
        r0 + (value - d0) / width * (r1 - r0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticks(min: f64, max: f64) -> (Ticks, Vec<f64>) {
        let t = Ticks::nice(min, max, 5);
        (t, t.values().collect())
    }

    #[test]
    fn zero_to_one_steps_by_fifths() {
        let (t, values) = ticks(0.0, 1.0);
        assert_eq!(t.step, 0.2);
        assert_eq!(values.len(), 6);
        assert_eq!(values.first(), Some(&0.0));
        assert!((values[5] - 1.0).abs() < 1e-12, "{values:?}");
        assert_eq!(t.decimals(), 1);
    }

    #[test]
    fn zero_to_37_steps_by_tens_up_to_40() {
        let (t, values) = ticks(0.0, 37.0);
        assert_eq!((t.lo, t.hi, t.step), (0.0, 40.0, 10.0));
        assert_eq!(values, vec![0.0, 10.0, 20.0, 30.0, 40.0]);
        assert_eq!(t.decimals(), 0);
    }

    #[test]
    fn zero_to_1234_steps_by_two_hundreds() {
        let (t, values) = ticks(0.0, 1234.0);
        assert_eq!((t.lo, t.hi, t.step), (0.0, 1400.0, 200.0));
        assert_eq!(values.len(), 8);
    }

    #[test]
    fn a_range_off_zero_rounds_out_to_whole_steps() {
        let (t, _) = ticks(0.13, 0.87);
        assert_eq!(t.step, 0.2);
        assert!(
            (t.lo - 0.0).abs() < 1e-12 && (t.hi - 1.0).abs() < 1e-12,
            "{t:?}"
        );
        let (t, _) = ticks(-37.0, 12.0);
        assert_eq!((t.lo, t.hi, t.step), (-40.0, 20.0, 10.0));
    }

    #[test]
    fn every_step_is_one_two_or_five_times_a_power_of_ten() {
        for (min, max) in [(0.0, 0.003), (2.0, 9.0), (0.0, 77.0), (10.0, 123_456.0)] {
            let t = Ticks::nice(min, max, 5);
            let mantissa = t.step / 10f64.powf(t.step.log10().floor());
            assert!(
                [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-9),
                "{min}..{max}: step {}",
                t.step
            );
            assert!(t.lo <= min && t.hi >= max, "{t:?} covers {min}..{max}");
        }
    }

    #[test]
    fn a_constant_gets_an_axis_around_it() {
        let (t, values) = ticks(42.0, 42.0);
        assert!(t.lo <= 42.0 && t.hi > 42.0 && t.step > 0.0, "{t:?}");
        assert!(values.len() >= 2);
        let (t, _) = ticks(-3.0, -3.0);
        assert!(t.lo < -3.0 && t.hi >= 0.0, "{t:?}");
        let (t, _) = ticks(0.0, 0.0);
        assert_eq!((t.lo, t.hi), (0.0, 1.0));
    }

    #[test]
    fn empty_or_non_finite_input_gives_zero_to_one() {
        let empty = extent(Vec::new());
        assert_eq!(empty, None);
        for (min, max) in [(f64::NAN, 1.0), (0.0, f64::INFINITY), (5.0, 1.0)] {
            let (t, values) = ticks(min, max);
            assert_eq!((t.lo, t.hi), (0.0, 1.0), "{min}..{max}");
            assert!(values.iter().all(|v| v.is_finite()));
        }
    }

    #[test]
    fn whole_ticks_step_by_at_least_one() {
        let t = Ticks::nice(0.0, 3.0, 5).whole();
        assert_eq!(t.values().collect::<Vec<_>>(), vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(Ticks::nice(0.0, 300.0, 5).whole().step, 50.0);
    }

    #[test]
    fn ticks_within_a_fixed_domain_stay_inside_it() {
        let t = Ticks::nice(0.0, 305.0, 6);
        let inside: Vec<f64> = t.within(0.0, 305.0).collect();
        assert_eq!(inside, vec![0.0, 50.0, 100.0, 150.0, 200.0, 250.0, 300.0]);
    }

    #[test]
    fn extent_skips_gaps() {
        assert_eq!(
            extent([3.0, f64::NAN, -1.0, f64::INFINITY, 2.0]),
            Some((-1.0, 3.0))
        );
    }

    #[test]
    fn linear_maps_and_survives_an_empty_domain() {
        let y = Linear::new((0.0, 10.0), (200.0, 0.0));
        assert_eq!(y.map(0.0), 200.0);
        assert_eq!(y.map(5.0), 100.0);
        assert_eq!(Linear::new((3.0, 3.0), (0.0, 100.0)).map(3.0), 50.0);
    }
}
