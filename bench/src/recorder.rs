//! The recorder every benchmark takes its percentiles from.

use std::{marker::PhantomData, time::Duration};

use hdrhistogram::Histogram;

use crate::{ms, us};

/// Significant digits the histogram keeps: values are told apart to 0.1 %.
const SIGNIFICANT_DIGITS: u8 = 3;

/// A kind of value a [`Recorder`] records, and how it maps to the
/// histogram's whole numbers.
pub trait Recorded: Copy {
    /// The value as the histogram holds it.
    fn to_histogram(self) -> u64;
    /// The value of a whole number of the histogram.
    fn from_histogram(value: u64) -> Self;
}

/// Durations, in whole microseconds (longer than `u64::MAX` µs saturate).
impl Recorded for Duration {
    fn to_histogram(self) -> u64 {
        u64::try_from(self.as_micros()).unwrap_or(u64::MAX)
    }

    fn from_histogram(value: u64) -> Self {
        Duration::from_micros(value)
    }
}

/// Counts, as they are.
impl Recorded for u64 {
    fn to_histogram(self) -> u64 {
        self
    }

    fn from_histogram(value: u64) -> Self {
        value
    }
}

/// Recorded values (durations by default) and their quantiles, with the one
/// definition the crate documents.
#[derive(Debug, Clone)]
pub struct Recorder<T: Recorded = Duration> {
    histogram: Histogram<u64>,
    kind: PhantomData<T>,
}

impl<T: Recorded> Default for Recorder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Recorded> Recorder<T> {
    /// An empty recorder; it grows to whatever is recorded.
    pub fn new() -> Self {
        Self {
            // `Histogram::new` refuses only more than 5 digits.
            histogram: Histogram::new(SIGNIFICANT_DIGITS)
                .unwrap_or_else(|error| unreachable!("{SIGNIFICANT_DIGITS} digits: {error}")),
            kind: PhantomData,
        }
    }

    /// Records one value.
    pub fn record(&mut self, value: T) {
        self.record_n(value, 1);
    }

    /// Records `count` values of `value` (values known only to a bucket).
    pub fn record_n(&mut self, value: T, count: u64) {
        // An auto-resizing histogram takes every u64 value.
        let _ = self.histogram.record_n(value.to_histogram(), count);
    }

    /// Adds every value of `other`.
    pub fn add(&mut self, other: &Self) {
        // Both auto-resize: adding cannot run out of range.
        let _ = self.histogram.add(&other.histogram);
    }

    /// How many values were recorded.
    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The `q` quantile (0 to 1) as the crate defines it; `None` when
    /// nothing was recorded.
    pub fn quantile(&self, q: f64) -> Option<T> {
        (!self.is_empty()).then(|| T::from_histogram(self.histogram.value_at_quantile(q)))
    }
}

impl Recorder<Duration> {
    /// Durations given in milliseconds (what several benchmarks keep);
    /// values that are no duration (negative, NaN) are left out.
    pub fn of_ms(values: impl IntoIterator<Item = f64>) -> Self {
        values
            .into_iter()
            .filter_map(|ms| Duration::try_from_secs_f64(ms / 1e3).ok())
            .collect()
    }

    /// The `q` quantile in milliseconds; NaN when nothing was recorded.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.quantile(q).map_or(f64::NAN, ms)
    }

    /// The `q` quantile in microseconds; NaN when nothing was recorded.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.quantile(q).map_or(f64::NAN, us)
    }
}

impl<T: Recorded> Extend<T> for Recorder<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, values: I) {
        for value in values {
            self.record(value);
        }
    }
}

impl<T: Recorded> FromIterator<T> for Recorder<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> Self {
        let mut recorder = Self::new();
        recorder.extend(values);
        recorder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(values: impl IntoIterator<Item = u64>) -> Recorder<u64> {
        values.into_iter().collect()
    }

    #[test]
    fn a_quantile_is_the_nearest_rank_value() {
        let one_to_hundred = counts(1..=100);
        assert_eq!(one_to_hundred.quantile(0.5), Some(50));
        assert_eq!(one_to_hundred.quantile(0.9), Some(90));
        assert_eq!(one_to_hundred.quantile(0.99), Some(99));
        assert_eq!(one_to_hundred.quantile(0.991), Some(100));
        assert_eq!(one_to_hundred.quantile(1.0), Some(100));
        assert_eq!(one_to_hundred.quantile(0.0), Some(1));
    }

    #[test]
    fn p50_of_an_even_count_is_the_lower_middle_value() {
        let four = counts([4, 1, 3, 2]);
        assert_eq!(four.quantile(0.5), Some(2));
        assert_eq!(four.quantile(0.75), Some(3));
        assert_eq!(four.quantile(0.76), Some(4));
    }

    #[test]
    fn durations_are_kept_to_the_microsecond() {
        let recorder: Recorder = [
            Duration::from_nanos(1_999),
            Duration::from_micros(500),
            Duration::from_micros(1_500),
        ]
        .into_iter()
        .collect();
        assert_eq!(recorder.quantile(0.0), Some(Duration::from_micros(1)));
        assert_eq!(recorder.quantile(0.5), Some(Duration::from_micros(500)));
        assert_eq!(recorder.quantile(1.0), Some(Duration::from_micros(1_500)));
    }

    #[test]
    fn large_values_are_within_a_thousandth() {
        let recorder: Recorder = [Duration::from_millis(123_456)].into_iter().collect();
        let p99 = recorder.quantile(0.99).unwrap_or_default();
        assert!(p99 >= Duration::from_millis(123_456), "{p99:?}");
        assert!(p99 <= Duration::from_millis(123_456 + 124), "{p99:?}");
    }

    #[test]
    fn counts_recorded_in_bulk_weigh_as_many() {
        let mut recorder = Recorder::<u64>::new();
        recorder.record_n(10, 98);
        recorder.record_n(20, 2);
        assert_eq!(recorder.len(), 100);
        assert_eq!(recorder.quantile(0.98), Some(10));
        assert_eq!(recorder.quantile(0.99), Some(20));
    }

    #[test]
    fn recorders_add_up() {
        let mut first = counts([1, 2]);
        first.add(&counts([3, 4]));
        assert_eq!(first.len(), 4);
        assert_eq!(first.quantile(1.0), Some(4));
    }

    #[test]
    fn milliseconds_are_read_as_durations() {
        let recorder = Recorder::of_ms([1.5, -1.0, f64::NAN, 0.25]);
        assert_eq!(recorder.len(), 2);
        assert_eq!(recorder.quantile_ms(1.0), 1.5);
        assert_eq!(recorder.quantile_us(0.0), 250.0);
    }

    #[test]
    fn an_empty_recorder_has_no_quantile() {
        assert_eq!(Recorder::<u64>::new().quantile(0.5), None);
        assert!(Recorder::<Duration>::new().is_empty());
        assert!(Recorder::new().quantile_ms(0.5).is_nan());
    }
}
