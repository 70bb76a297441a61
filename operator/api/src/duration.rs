//! Durations as SREs write them in YAML: `250ms`, `30s`, `15m`, `1h30m`.

use std::{fmt, str::FromStr};

use kube::core::Rule;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as a sequence of `<number><unit>` with units `ms`, `s`,
/// `m`, `h` (Go's `time.ParseDuration` subset, which CEL's `duration()` also
/// reads, so rules can compare durations). Numbers have at most 5 digits and
/// the whole at most [`DURATION_MAX_LENGTH`] characters, so every accepted
/// duration stays far below the 292 years where Go's durations, and thus
/// CEL's `duration()`, overflow (5 × `99999h` is 57 years).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

/// The syntax of a duration, checked by the CEL rule every duration field
/// carries; rules that call `duration()` are guarded by it.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,5}(ms|s|m|h))+$";

/// Longest duration text; it also bounds the CEL cost of the rules.
pub const DURATION_MAX_LENGTH: usize = 32;

/// Most digits of one number of a duration.
const MAX_DIGITS: usize = 5;

/// What the apiserver answers for a malformed duration, after the field path.
pub const DURATION_MESSAGE: &str = "must be a duration such as 250ms, 30s, 15m or 1h30m";

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
        if input.len() > DURATION_MAX_LENGTH {
            return Err(err("longer than 32 characters"));
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
            if digits > MAX_DIGITS {
                return Err(err("a number has at most 5 digits"));
            }
            let value: u64 = rest[..digits].parse().map_err(|_| err("not a number"))?;
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

    // The syntax is a CEL rule rather than an OpenAPI `pattern`: a pattern
    // failure does not stop the apiserver from running CEL on the value, so a
    // pattern would add a second, cryptic error ("should match '^(…'") next
    // to the rule's message, which says what a duration looks like.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": DURATION_MAX_LENGTH,
            "description": "A duration such as 250ms, 30s, 15m or 1h30m.",
            "x-kubernetes-validations": [{
                "rule": well_formed("self"),
                "message": DURATION_MESSAGE,
            }],
        })
    }
}

/// CEL: `value` (an expression such as `self` or `self.interval`) is a
/// well-formed duration, so `duration(value)` cannot fail.
fn well_formed(value: &str) -> String {
    format!("{value}.matches('{DURATION_PATTERN}')")
}

/// A CEL rule whose `condition` calls `duration()` on `values`: it holds
/// when `condition` does or when one of `values` is malformed. The apiserver
/// runs every rule even on a value that failed another check, and
/// `duration()` of a malformed string fails with a type-conversion error;
/// the guard leaves a malformed value to the duration's own rule and its
/// readable message.
pub fn rule(values: &[&str], condition: &str) -> Rule {
    let guards: Vec<String> = values
        .iter()
        .map(|value| format!("!{}", well_formed(value)))
        .collect();
    Rule::new(format!("{} || ({condition})", guards.join(" || ")))
}

/// A rule on a duration field: it must be above zero.
pub fn positive() -> Rule {
    rule(&["self"], "duration(self) > duration('0s')")
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

    /// What the apiserver accepts: the length bound and the rule's pattern.
    fn apiserver_accepts(text: &str) -> bool {
        let pattern = regex_lite::Regex::new(DURATION_PATTERN).ok();
        text.len() <= DURATION_MAX_LENGTH && pattern.is_some_and(|p| p.is_match(text))
    }

    #[test]
    fn rejects_what_the_apiserver_rejects() {
        for bad in [
            "",
            "5",
            "m",
            "1d",
            "1.5h",
            "-1s",
            "10 s",
            "15 minutes",
            "99999999999999999999h",
            "100000ms",
            "99999h99999h99999h99999h99999h10s",
        ] {
            assert!(!apiserver_accepts(bad), "{bad:?} accepted by the apiserver");
            assert!(bad.parse::<Duration>().is_err(), "{bad:?} parsed");
        }
        for good in ["1ms", "2h", "1h2m3s4ms", "99999ms", "1h1h"] {
            assert!(good.parse::<Duration>().is_ok(), "{good:?}");
            assert!(apiserver_accepts(good), "{good:?}");
        }
    }

    #[test]
    fn the_longest_duration_fits_cel() {
        // Go's time.Duration, which CEL's duration() returns, ends at 2562047h.
        let longest = "99999h99999h99999h99999h99999h";
        assert!(apiserver_accepts(longest));
        let hours = longest.parse::<Duration>().map(|d| d.0.as_secs() / 3600);
        assert_eq!(hours, Ok(499_995));
        assert!(hours.is_ok_and(|h| h < 2_562_047));
    }

    #[test]
    fn rules_guard_duration_calls() {
        let pattern = format!("matches('{DURATION_PATTERN}')");
        assert_eq!(
            positive().rule,
            format!("!self.{pattern} || (duration(self) > duration('0s'))")
        );
        let both = rule(
            &["self.a", "self.b"],
            "duration(self.a) >= duration(self.b)",
        );
        assert_eq!(
            both.rule,
            format!(
                "!self.a.{pattern} || !self.b.{pattern} || (duration(self.a) >= duration(self.b))"
            )
        );
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
