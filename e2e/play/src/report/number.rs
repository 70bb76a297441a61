//! Numbers as the page shows them: tick labels, value labels and SVG
//! coordinates. Non-finite numbers never reach the output.

use std::fmt;

/// A tick label with `decimals` decimals and thousands separators.
pub(crate) fn tick(value: f64, decimals: usize) -> String {
    grouped(&format!("{:.*}", decimals, finite(value)))
}

/// A value label: whole numbers as they are, others to three significant
/// digits, trailing zeros dropped.
pub(crate) fn value(value: f64) -> String {
    let value = finite(value);
    if value.fract() == 0.0 && value.abs() < 1e15 {
        return grouped(&format!("{value:.0}"));
    }
    let decimals = (2.0 - value.abs().log10().floor()).clamp(0.0, 6.0) as usize;
    let text = format!("{value:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    grouped(text)
}

/// An SVG coordinate or length: one decimal, ".0" dropped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Px(pub f64);

impl fmt::Display for Px {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{:.1}", finite(self.0));
        let text = text.strip_suffix(".0").unwrap_or(&text);
        f.write_str(if text == "-0" { "0" } else { text })
    }
}

/// Zero in place of NaN or an infinity.
fn finite(value: f64) -> f64 {
    if value.is_finite() { value + 0.0 } else { 0.0 }
}

/// `digits` ("-1234.5") with its whole part grouped by thousands.
fn grouped(digits: &str) -> String {
    let (sign, rest) = match digits.strip_prefix('-') {
        // "-0" and "-0.00" are zero.
        Some(rest) if rest.bytes().any(|b| (b'1'..=b'9').contains(&b)) => ("-", rest),
        Some(rest) => ("", rest),
        None => ("", digits),
    };
    let (whole, fraction) = rest.split_at(rest.find('.').unwrap_or(rest.len()));
    let mut out = String::from(sign);
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out.push_str(fraction);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_keep_their_decimals_and_group_thousands() {
        assert_eq!(tick(0.6000000000000001, 1), "0.6");
        assert_eq!(tick(1400.0, 0), "1,400");
        assert_eq!(tick(-1_234_567.0, 0), "-1,234,567");
        assert_eq!(tick(-0.0, 1), "0.0");
        assert_eq!(tick(f64::NAN, 0), "0");
    }

    #[test]
    fn values_show_three_significant_digits() {
        assert_eq!(value(12_000.0), "12,000");
        assert_eq!(value(123.456), "123");
        assert_eq!(value(12.5), "12.5");
        assert_eq!(value(0.01234), "0.0123");
        assert_eq!(value(f64::INFINITY), "0");
    }

    #[test]
    fn coordinates_have_one_decimal_at_most() {
        assert_eq!(Px(12.0).to_string(), "12");
        assert_eq!(Px(12.345).to_string(), "12.3");
        assert_eq!(Px(-0.04).to_string(), "0");
        assert_eq!(Px(-0.26).to_string(), "-0.3");
        assert_eq!(Px(-3.5).to_string(), "-3.5");
        assert_eq!(Px(f64::NAN).to_string(), "0");
    }
}
