//! What every binary's metrics share: histogram buckets as a family's
//! constructor, and the text exposition, so no crate rebuilds either.

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        family::MetricConstructor,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// Exponential histogram buckets `start × factor^k`, k < `count`; as a
/// [`MetricConstructor`] it gives every label set of a `Family` the same
/// buckets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Buckets {
    /// Upper bound of the first bucket.
    pub start: f64,
    /// Ratio between neighbouring bounds.
    pub factor: f64,
    /// Number of buckets (besides `+Inf`).
    pub count: u16,
}

impl Buckets {
    /// Buckets `start × factor^k` for k < `count`.
    pub const fn exponential(start: f64, factor: f64, count: u16) -> Self {
        Self {
            start,
            factor,
            count,
        }
    }

    /// A histogram with these buckets.
    pub fn histogram(&self) -> Histogram {
        Histogram::new(exponential_buckets(self.start, self.factor, self.count))
    }
}

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        self.histogram()
    }
}

/// The registry in the Prometheus text format, as `/metrics` serves it.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    encode(&mut text, registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::family::Family;

    use super::*;

    #[test]
    fn every_label_set_gets_the_same_buckets() -> Result<(), std::fmt::Error> {
        let family: Family<Vec<(String, String)>, Histogram, Buckets> =
            Family::new_with_constructor(Buckets::exponential(0.5, 2.0, 3));
        family
            .get_or_create(&vec![("route".into(), "a".into())])
            .observe(0.7);
        family
            .get_or_create(&vec![("route".into(), "b".into())])
            .observe(3.0);
        let mut registry = Registry::default();
        registry.register("latency", "test", family);
        let text = render(&registry)?;
        for bound in ["0.5", "1.0", "2.0", "+Inf"] {
            let lines = text
                .lines()
                .filter(|l| l.contains(&format!("le=\"{bound}\"")))
                .count();
            assert_eq!(lines, 2, "bucket {bound} for both routes in\n{text}");
        }
        assert!(!text.contains("le=\"4.0\""), "{text}");
        Ok(())
    }
}
