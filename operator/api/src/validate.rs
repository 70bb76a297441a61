//! Checks of what CEL cannot express: cron syntax, time-zone names, PromQL,
//! and the addresses a FlashSale's workloads would otherwise crash on.
//! Controllers report the outcome as the `Stalled` condition, so a bad spec
//! waits for an edit instead of failing in a loop.

use std::fmt;

use crate::{ChaosDrillSpec, DegradationPolicySpec, FlashSaleSpec};

/// One problem in a spec, with the field it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// Path of the field, as the apiserver writes it (`spec.schedule.cron`).
    pub field: String,
    /// What is wrong, for a human.
    pub message: String,
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> SpecProblem {
    SpecProblem {
        field: field.into(),
        message: message.into(),
    }
}

/// A standard five-field cron expression (no seconds, no years), as the
/// ChaosDrill calendar runs it.
pub fn cron(field: &str, expression: &str) -> Option<SpecProblem> {
    crate::calendar::check_cron(expression).err().map(|err| {
        problem(
            field,
            format!("invalid cron expression {expression:?}: {err}"),
        )
    })
}

/// An IANA time-zone name known to the bundled tz database.
pub fn time_zone(field: &str, name: &str) -> Option<SpecProblem> {
    jiff::tz::TimeZone::get(name).err().map(|_| {
        problem(
            field,
            format!("unknown time zone {name:?} (use an IANA name such as Asia/Tokyo)"),
        )
    })
}

/// A PromQL expression.
pub fn promql(field: &str, query: &str) -> Option<SpecProblem> {
    promql_parser::parser::parse(query)
        .err()
        .map(|err| problem(field, format!("invalid PromQL: {}", err.trim())))
}

/// A Kafka bootstrap address: `host:port`, port 1-65535.
pub fn broker(field: &str, address: &str) -> Option<SpecProblem> {
    let valid = address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains(char::is_whitespace)
            && port.parse::<u16>().is_ok_and(|p| p > 0)
    });
    (!valid).then(|| {
        problem(
            field,
            format!("{address:?} is not a host:port Kafka address"),
        )
    })
}

/// A Redis URL the inventory and gateway can connect with.
pub fn redis_url(field: &str, url: &str) -> Option<SpecProblem> {
    match url::Url::parse(url) {
        Ok(parsed) if parsed.host_str().is_some_and(|h| !h.is_empty()) => None,
        Ok(_) => Some(problem(field, format!("{url:?} names no host"))),
        Err(err) => Some(problem(field, format!("{url:?} is not a URL: {err}"))),
    }
}

/// Problems of a FlashSale spec: what the schema lets through but the
/// workloads would crash on at start.
pub fn flash_sale(spec: &FlashSaleSpec) -> Vec<SpecProblem> {
    let mut problems: Vec<SpecProblem> = spec
        .order_writer
        .kafka
        .brokers
        .iter()
        .enumerate()
        .filter_map(|(i, b)| broker(&format!("spec.orderWriter.kafka.brokers[{i}]"), b))
        .collect();
    if let Some(url) = spec.gateway.redis.as_ref().and_then(|r| r.url.as_ref()) {
        problems.extend(redis_url("spec.gateway.redis.url", url));
    }
    if let Some(url) = &spec.inventory.redis.url {
        problems.extend(redis_url("spec.inventory.redis.url", url));
    }
    problems
}

/// Problems of a DegradationPolicy spec.
pub fn degradation_policy(spec: &DegradationPolicySpec) -> Vec<SpecProblem> {
    promql("spec.signal.query", &spec.signal.query)
        .into_iter()
        .collect()
}

/// Problems of a ChaosDrill spec.
pub fn chaos_drill(spec: &ChaosDrillSpec) -> Vec<SpecProblem> {
    let mut problems: Vec<SpecProblem> = [
        cron("spec.schedule.cron", &spec.schedule.cron),
        time_zone("spec.schedule.timeZone", &spec.schedule.time_zone),
    ]
    .into_iter()
    .flatten()
    .collect();
    for (i, objective) in spec.slo_guard.objectives.iter().enumerate() {
        problems.extend(promql(
            &format!("spec.sloGuard.objectives[{i}].query"),
            &objective.query,
        ));
    }
    if let Some(failover) = &spec.failover {
        let queries = failover
            .capacity
            .iter()
            .map(|c| ("spec.failover.capacity.load".to_owned(), &c.load))
            .chain(
                failover
                    .replication
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| {
                        let query = r.query.as_ref()?;
                        Some((format!("spec.failover.replication[{i}].query"), query))
                    }),
            )
            .chain(failover.endpoint.iter().filter_map(|e| {
                Some(("spec.failover.endpoint.query".to_owned(), e.query.as_ref()?))
            }));
        for (field, query) in queries {
            problems.extend(promql(&field, query));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChaosDrill, DegradationPolicy};

    #[test]
    fn cron_accepts_five_fields_and_rejects_the_rest() {
        for good in [
            "30 14 * * 2,4",
            "*/5 * * * *",
            "0 0 1 1 *",
            "0 14 * * TUE,THU",
        ] {
            assert_eq!(cron("f", good), None, "{good}");
        }
        for bad in [
            "",
            "every tuesday",
            "61 * * * *",
            "0 14 * * 2,4 2027",
            "0 0 14 * * 2",
            "* * *",
        ] {
            let found = cron("spec.schedule.cron", bad);
            assert!(
                found
                    .as_ref()
                    .is_some_and(|p| p.field == "spec.schedule.cron"),
                "{bad:?} -> {found:?}"
            );
        }
    }

    #[test]
    fn time_zones_must_be_iana_names() {
        for good in ["Asia/Tokyo", "UTC", "Europe/Berlin", "America/Sao_Paulo"] {
            assert_eq!(time_zone("f", good), None, "{good}");
        }
        for bad in ["Mars/Olympus", "JST+9", ""] {
            let found = time_zone("spec.schedule.timeZone", bad)
                .map(|p| p.to_string())
                .unwrap_or_default();
            assert!(
                found.starts_with("spec.schedule.timeZone: unknown time zone"),
                "{bad:?} -> {found}"
            );
        }
    }

    #[test]
    fn sale_addresses_must_be_usable() {
        for good in ["kafka:9092", "10.0.0.1:19092", "[::1]:9092"] {
            assert_eq!(broker("f", good), None, "{good}");
        }
        for bad in [
            "kafka",
            "kafka:",
            ":9092",
            "kafka:0",
            "kafka:99999",
            "kaf ka:9092",
        ] {
            assert!(broker("f", bad).is_some(), "{bad}");
        }
        assert_eq!(redis_url("f", "redis://redis:6379/0"), None);
        assert!(redis_url("f", "redis://").is_some());
        assert!(redis_url("f", "redis://exa mple:6379").is_some());
    }

    #[test]
    fn promql_is_parsed() {
        assert_eq!(
            promql(
                "f",
                r#"sum(rate(gateway_requests_total{code=~"5.."}[30s])) / 0.035"#
            ),
            None
        );
        let found = promql("spec.signal.query", "sum(rate(x[30s]")
            .map(|p| p.to_string())
            .unwrap_or_default();
        assert!(
            found.starts_with("spec.signal.query: invalid PromQL"),
            "{found}"
        );
    }

    #[test]
    fn the_policy_example_passes_the_operators_checks() {
        let policy: DegradationPolicy = match serde_yaml_ng::from_str(include_str!(
            "../../../crds/examples/degradationpolicy-two-tier.yaml"
        )) {
            Ok(p) => p,
            Err(e) => panic!("example: {e}"),
        };
        assert_eq!(degradation_policy(&policy.spec), []);
    }

    #[test]
    fn drill_problems_name_each_field() {
        let mut drill: ChaosDrill = match serde_yaml_ng::from_str(include_str!(
            "../../../crds/examples/chaosdrill-pod-kill.yaml"
        )) {
            Ok(d) => d,
            Err(e) => panic!("example: {e}"),
        };
        assert!(chaos_drill(&drill.spec).is_empty());

        drill.spec.schedule.cron = "61 14 * * *".to_owned();
        drill.spec.schedule.time_zone = "Asia/Atlantis".to_owned();
        drill.spec.slo_guard.objectives[1].query = "histogram_quantile(0.99".to_owned();
        let problems = chaos_drill(&drill.spec);
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.schedule.cron",
                "spec.schedule.timeZone",
                "spec.sloGuard.objectives[1].query"
            ]
        );
        let zone = problems[1].to_string();
        assert!(
            zone.starts_with("spec.schedule.timeZone: unknown time zone \"Asia/Atlantis\""),
            "{zone}"
        );
    }
}
