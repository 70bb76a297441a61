//! The median of per-run figures.

/// The median of the finite `values`: the middle one in order, or the mean
/// of the two middle ones when their number is even; `None` when there is
/// none. Non-finite values (a ratio over zero, a run without calls) are
/// left out rather than counted at either end.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => values.get(middle).copied(),
        _ => Some(f64::midpoint(
            *values.get(middle - 1)?,
            *values.get(middle)?,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn an_odd_count_takes_the_middle_value() {
        assert_eq!(median([5.0, 1.0, 3.0]), Some(3.0));
    }

    #[test]
    fn an_even_count_takes_the_mean_of_the_two_middle_values() {
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn non_finite_values_are_left_out() {
        assert_eq!(median([f64::NAN, 2.0, f64::INFINITY, 4.0]), Some(3.0));
        assert_eq!(median([f64::NAN]), None);
        assert_eq!(median(Vec::new()), None);
    }
}
