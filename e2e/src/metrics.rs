//! Reading Prometheus text (what `/metrics` serves): one series' value, or
//! the sum of a metric's samples.

/// The value of the sample line `series` (a name with its labels exactly
/// as exposed, `name{a="b"}`, or a bare name), if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// The sum of every sample of `name` whose labels contain `label` (any
/// labels when empty); 0 when there is none.
pub fn sum_samples(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = if let Some(labelled) = rest.strip_prefix('{') {
                let (labels, value) = labelled.split_once("} ")?;
                if !labels.contains(label) {
                    return None;
                }
                value
            } else if label.is_empty() {
                rest.strip_prefix(' ')?
            } else {
                return None;
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        // An empty sum of floats is -0.0.
        .fold(0.0, |sum, v| sum + v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str =
        "# TYPE a counter\na_total{x=\"1\"} 2\na_total{x=\"2\"} 3\nb 7 1700000000000\n";

    #[test]
    fn a_series_is_read_by_its_exact_name_and_labels() {
        assert_eq!(sample(TEXT, "a_total{x=\"2\"}"), Some(3.0));
        assert_eq!(sample(TEXT, "b"), Some(7.0));
        assert_eq!(sample(TEXT, "a_total"), None);
    }

    #[test]
    fn samples_are_summed_over_labels_or_a_label() {
        assert_eq!(sum_samples(TEXT, "a_total", ""), 5.0);
        assert_eq!(sum_samples(TEXT, "a_total", "x=\"1\""), 2.0);
        assert_eq!(sum_samples(TEXT, "b", ""), 7.0);
        assert_eq!(sum_samples(TEXT, "c", ""), 0.0);
    }
}
