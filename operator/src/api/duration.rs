//! Durations as SREs write them in YAML: `250ms`, `30s`, `15m`, `1h30m`.

use std::{fmt, str::FromStr};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as a sequence of `<number><unit>` with units `ms`, `s`,
/// `m`, `h` (Go's `time.ParseDuration` subset, which CEL's `duration()` also
/// reads, so rules can compare durations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

/// Pattern the apiserver enforces; CEL rules add "positive" where it matters.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,9}(ms|s|m|h))+$";

/// A duration string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (expected e.g. 250ms, 30s, 15m, 1h30m)")]
pub struct ParseDurationError {
    input: String,
    reason: &'static str,
}

impl Duration {
    /// From whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }

    /// From whole milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Self(std::time::Duration::from_millis(millis))
    }
}

impl FromStr for Duration {
    type Err = ParseDurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseDurationError {
            input: input.to_owned(),
            reason,
        };
        if input.is_empty() {
            return Err(err("empty"));
        }
        let mut total_ms: u64 = 0;
        let mut rest = input;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(err("a number must come before each unit"));
            }
            let value: u64 = rest[..digits]
                .parse()
                .map_err(|_| err("number too large"))?;
            rest = &rest[digits..];
            let (unit_ms, len) = if rest.starts_with("ms") {
                (1, 2)
            } else if rest.starts_with('s') {
                (1_000, 1)
            } else if rest.starts_with('m') {
                (60_000, 1)
            } else if rest.starts_with('h') {
                (3_600_000, 1)
            } else {
                return Err(err("unit must be one of ms, s, m, h"));
            };
            rest = &rest[len..];
            let part = value
                .checked_mul(unit_ms)
                .ok_or_else(|| err("duration too large"))?;
            total_ms = total_ms
                .checked_add(part)
                .ok_or_else(|| err("duration too large"))?;
        }
        Ok(Self(std::time::Duration::from_millis(total_ms)))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
            if ms >= size {
                write!(f, "{}{unit}", ms / size)?;
                ms %= size;
            }
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 32,
            "description": "A duration such as 250ms, 30s, 15m or 1h30m.",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        for (text, ms) in [
            ("250ms", 250),
            ("30s", 30_000),
            ("15m", 900_000),
            ("1h30m", 5_400_000),
            ("0s", 0),
        ] {
            let d: Duration = text.parse().unwrap_or_default();
            assert_eq!(d.0.as_millis(), ms, "{text}");
            assert_eq!(d.to_string(), text);
        }
        assert_eq!(
            "90s"
                .parse::<Duration>()
                .map(|d| d.to_string())
                .ok()
                .as_deref(),
            Some("1m30s")
        );
    }

    #[test]
    fn rejects_what_the_pattern_rejects() {
        let pattern = regex_lite::Regex::new(DURATION_PATTERN).ok();
        for bad in [
            "",
            "5",
            "m",
            "1d",
            "1.5h",
            "-1s",
            "10 s",
            "99999999999999999999h",
        ] {
            assert!(
                !pattern.as_ref().is_some_and(|p| p.is_match(bad)),
                "{bad:?} matches"
            );
            assert!(bad.parse::<Duration>().is_err(), "{bad:?} parsed");
        }
        for good in ["1ms", "2h", "1h2m3s4ms"] {
            assert!(good.parse::<Duration>().is_ok(), "{good:?}");
            assert!(
                pattern.as_ref().is_some_and(|p| p.is_match(good)),
                "{good:?}"
            );
        }
    }

    #[test]
    fn json_round_trip() {
        let d = Duration::from_millis(1_500);
        let json = serde_json::to_string(&d).unwrap_or_default();
        assert_eq!(json, "\"1s500ms\"");
        let back: Result<Duration, _> = serde_json::from_str(&json);
        assert_eq!(back.ok(), Some(d));
        let err = serde_json::from_str::<Duration>("\"fast\"")
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("invalid duration \"fast\"")));
    }
}
