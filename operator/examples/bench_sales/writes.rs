//! The operator's writes, object by object, from its log: run with
//! `--log-format json --log-filter warn,flashsale_operator::writes=debug`,
//! every write is one JSON line under the `flashsale_operator::writes`
//! target naming its verb, kind and object. Each write is counted for the
//! sale whose name prefixes the object's (`bench-0007-gateway`, or the sale
//! `bench-0007` itself for status writes).

use std::{collections::BTreeMap, path::Path};

use anyhow::Context as _;
use flashsale_bench::Recorder;
use serde_json::Value;

/// The log target of the operator's write lines.
pub const TARGET: &str = "flashsale_operator::writes";
/// The operator's log filter that keeps warnings and every write.
pub const LOG_FILTER: &str = "warn,flashsale_operator::writes=debug";

/// Name of the benchmark's `index`-th sale.
pub fn sale_name(index: usize) -> String {
    format!("bench-{index:04}")
}

/// The index of the sale an object belongs to: `bench-<digits>` followed by
/// the end of the name or `-<suffix>`.
fn sale_of(object: &str) -> Option<usize> {
    // "namespace/name"; a bare name is taken as is.
    let name = object.rsplit_once('/').map_or(object, |(_, name)| name);
    let rest = name.strip_prefix("bench-")?;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (number, tail) = rest.split_at(digits);
    if number.is_empty() || !(tail.is_empty() || tail.starts_with('-')) {
        return None;
    }
    number.parse().ok()
}

/// The writes of one window of the log.
#[derive(Debug, Clone, Default)]
pub struct Writes {
    /// Write lines in the window.
    pub total: u64,
    /// Writes per sale, by index; sales without any count 0.
    pub per_sale: Vec<u64>,
    /// Writes of objects that are no sale's.
    pub other: u64,
    /// Writes by (verb, kind).
    pub by_verb_kind: BTreeMap<(String, String), u64>,
    /// Lines of the writes target that did not parse.
    pub unparsed: u64,
}

impl Writes {
    /// Per-sale distribution: min, p50, p90, max (NaN without sales).
    pub fn distribution(&self) -> [f64; 4] {
        let counts: Recorder<u64> = self.per_sale.iter().copied().collect();
        [0.0, 0.5, 0.9, 1.0].map(|q| counts.quantile(q).map_or(f64::NAN, |n| n as f64))
    }

    /// Writes per sale in the window, on average.
    pub fn mean_per_sale(&self) -> f64 {
        if self.per_sale.is_empty() {
            f64::NAN
        } else {
            self.total as f64 / self.per_sale.len() as f64
        }
    }

    /// `verb kind count (per sale)` for each (verb, kind), most first.
    pub fn split(&self) -> Vec<String> {
        let sales = self.per_sale.len().max(1) as f64;
        let mut rows: Vec<_> = self.by_verb_kind.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        rows.into_iter()
            .map(|((verb, kind), n)| format!("{verb} {kind} {n} ({:.1}/sale)", *n as f64 / sales))
            .collect()
    }

    /// Prints the window's writes, indented, under `title`.
    pub fn print(&self, title: &str) {
        let [min, p50, p90, max] = self.distribution();
        println!(
            "  {title}: {} writes ({:.1} per sale; {} of no sale{}); per sale min {min:.0}, \
             p50 {p50:.0}, p90 {p90:.0}, max {max:.0}",
            self.total,
            self.mean_per_sale(),
            self.other,
            if self.unparsed > 0 {
                format!(", {} lines unreadable", self.unparsed)
            } else {
                String::new()
            }
        );
        for line in self.split().chunks(4) {
            println!("    {}", line.join(", "));
        }
    }
}

/// The write lines of the log at `path` that start at a byte offset in
/// `from..to`, attributed to `sales` sales. Offsets are taken while the
/// operator runs; a line counts for the window it started in, so a line
/// being written at the cut is counted once.
pub fn read(path: &Path, sales: usize, from: u64, to: u64) -> anyhow::Result<Writes> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut writes = Writes {
        per_sale: vec![0; sales],
        ..Writes::default()
    };
    let mut start = 0u64;
    for line in bytes.split(|&b| b == b'\n') {
        let at = start;
        start += line.len() as u64 + 1;
        if at < from || at >= to {
            continue;
        }
        let line = String::from_utf8_lossy(line);
        if !line.contains(TARGET) {
            continue;
        }
        let Some((verb, kind, object)) = parse_line(&line) else {
            writes.unparsed += 1;
            continue;
        };
        writes.total += 1;
        *writes.by_verb_kind.entry((verb, kind)).or_default() += 1;
        match sale_of(&object).and_then(|i| writes.per_sale.get_mut(i)) {
            Some(count) => *count += 1,
            None => writes.other += 1,
        }
    }
    Ok(writes)
}

/// Verb, kind and object of a write line; `None` for any other line. The
/// JSON layer may put an event's fields at the top level or under "fields".
fn parse_line(line: &str) -> Option<(String, String, String)> {
    let value: Value = serde_json::from_str(line.trim()).ok()?;
    if value.get("target")?.as_str()? != TARGET {
        return None;
    }
    let fields = value.get("fields").unwrap_or(&value);
    let text = |key: &str| Some(fields.get(key)?.as_str()?.to_owned());
    Some((text("verb")?, text("kind")?, text("object")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_go_to_the_sale_their_name_starts_with() {
        assert_eq!(sale_of("ns/bench-0007-gateway"), Some(7));
        assert_eq!(sale_of("ns/bench-0007"), Some(7));
        assert_eq!(sale_of("ns/bench-12345-order-writer"), Some(12345));
        assert_eq!(sale_of("ns/bench-0007x"), None);
        assert_eq!(sale_of("ns/other"), None);
    }

    #[test]
    fn a_write_line_is_read_flat_or_nested() {
        let flat = r#"{"timestamp":"t","level":"DEBUG","message":"wrote","controller":"flashsale","verb":"apply","kind":"Service","object":"ns/bench-0001-gateway","target":"flashsale_operator::writes"}"#;
        let nested = r#"{"timestamp":"t","level":"DEBUG","fields":{"message":"wrote","verb":"status","kind":"FlashSale","object":"ns/bench-0001"},"target":"flashsale_operator::writes"}"#;
        assert_eq!(
            parse_line(flat),
            Some((
                "apply".into(),
                "Service".into(),
                "ns/bench-0001-gateway".into()
            ))
        );
        assert_eq!(
            parse_line(nested),
            Some(("status".into(), "FlashSale".into(), "ns/bench-0001".into()))
        );
    }
}
