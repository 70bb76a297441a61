//! Whether the standby region can take the sale over, as a pure function of
//! what one look read ([`Readings`]) and the previous verdict: the standby
//! sale exists and is Ready, its ready gateways carry both regions' load
//! with the headroom asked, each replication is within its bound, and the
//! global endpoint sees it healthy and, asked, answers from the primary
//! region while the primary sale is Ready (else a false failover).
//!
//! A replication lag smooths like an alert's `for`: above its bound it is
//! reported at once (value, bound, since when), and fails the check only
//! once it stayed above for `lagGrace`. A spike shorter than that never
//! flips readiness; a lag that stays up does, `lagGrace` after it rose.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use flashsale_api::{
    chaosdrill::{FailoverCheck, FailoverStatus, ReadinessCheck},
    common::truncate,
    reasons::DrillReason,
};

/// The standby sale as read.
#[derive(Debug, Clone, PartialEq)]
pub enum StandbySaleReading {
    /// Absent, or its cluster could not be asked; why.
    Missing(String),
    /// Present but not Ready; its Ready condition's message.
    NotReady(String),
    /// Ready, with this many ready gateways.
    Ready {
        /// Ready gateway replicas.
        gateways: i32,
    },
    /// Another sale: it keys its stock, orders and request ids by another
    /// sale id than the primary, so it would sell stock of its own rather
    /// than what is replicated from the primary.
    OtherSale {
        /// The primary's sale id.
        primary: String,
        /// The standby's.
        standby: String,
    },
}

/// The loads of both regions, requests per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Loads {
    /// The primary region's sale.
    pub primary: f64,
    /// The standby region's sale.
    pub standby: f64,
}

/// One replication's lag as read.
#[derive(Debug, Clone, PartialEq)]
pub enum LagReading {
    /// The lag, and a detail for the message (e.g. bytes behind).
    Lag(Duration, Option<String>),
    /// The replication is broken (no replica online); why.
    Broken(String),
}

/// Which region answered through the global endpoint, and what it should
/// have been.
#[derive(Debug, Clone, PartialEq)]
pub struct Serving {
    /// The answer's status.
    pub status: u16,
    /// The region the answer names (`flashsale-region`), if any.
    pub answered_by: Option<String>,
    /// The primary sale's region.
    pub primary_region: String,
    /// Whether the primary sale is Ready.
    pub primary_ready: bool,
}

/// What one readiness look read; `Err` is a read that failed, in a
/// sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct Readings {
    /// The standby sale.
    pub standby: StandbySaleReading,
    /// Both loads, when `capacity` is set.
    pub loads: Option<Result<Loads, String>>,
    /// Each replication's lag, in the spec's order.
    pub lags: Vec<Result<LagReading, String>>,
    /// Whether the endpoint sees the standby healthy and what it says,
    /// when `endpoint` is set.
    pub endpoint: Option<Result<(bool, String), String>>,
    /// Which region answers through the endpoint, when `endpoint.url` is
    /// set.
    pub serving: Option<Result<Serving, String>>,
}

/// The verdict: the status to record, and the condition's reason and
/// message (the first failed check's, or every check passed).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// `status.failover`.
    pub status: FailoverStatus,
    /// `StandbyReady`'s reason.
    pub reason: DrillReason,
    /// `StandbyReady`'s message.
    pub message: String,
}

impl Verdict {
    /// Whether the standby is ready.
    pub fn ready(&self) -> bool {
        self.status.ready
    }
}

/// The readiness of `spec`'s standby from `readings` at `now`, carrying
/// each lag's `aboveSince` over from `previous`.
pub fn assess(
    spec: &FailoverCheck,
    readings: &Readings,
    previous: Option<&FailoverStatus>,
    now: Timestamp,
) -> Verdict {
    let mut checks: Vec<(ReadinessCheck, Option<DrillReason>)> = Vec::new();
    let gateways = match &readings.standby {
        StandbySaleReading::Ready { gateways } => Some(*gateways),
        _ => None,
    };
    checks.push(standby_check(spec, &readings.standby));
    if let (Some(capacity), Some(loads)) = (&spec.capacity, &readings.loads) {
        let per = capacity.per_gateway_rps;
        checks.push(capacity_check(per, capacity.headroom, gateways, loads));
    }
    for (lag, reading) in spec.replication.iter().zip(&readings.lags) {
        let name = format!("replication/{}", lag.name);
        let before = previous
            .and_then(|p| p.checks.iter().find(|c| c.name == name))
            .and_then(|c| c.above_since.as_ref())
            .map(|t| t.0);
        let bounds = LagBounds {
            max: lag.max_lag.0,
            grace: spec.lag_grace.0,
        };
        checks.push(lag_check(name, bounds, reading, before, now));
    }
    if let Some(endpoint) = &readings.endpoint {
        checks.push(endpoint_check(endpoint));
    }
    if let Some(serving) = &readings.serving {
        checks.push(serving_check(serving));
    }
    let failed = checks.iter().find_map(|(check, reason)| {
        reason
            .filter(|_| !check.passed)
            .map(|r| (r, check.message.clone()))
    });
    let (reason, message) = failed.unwrap_or_else(|| {
        let passed = checks.len();
        (
            DrillReason::StandbyReady,
            format!("every readiness check passed ({passed})"),
        )
    });
    Verdict {
        status: FailoverStatus {
            checked_at: Some(Time(now)),
            ready: reason == DrillReason::StandbyReady,
            checks: checks.into_iter().map(|(check, _)| check).collect(),
            request: None,
        },
        reason,
        message,
    }
}

/// A check and the reason it gives when it failed.
type Checked = (ReadinessCheck, Option<DrillReason>);

/// The longest message a check carries (the status field's bound).
const MESSAGE_BOUND: usize = 512;

fn check(name: &str, passed: bool, mut message: String) -> ReadinessCheck {
    truncate(&mut message, MESSAGE_BOUND);
    ReadinessCheck {
        name: name.to_owned(),
        passed,
        message,
        ..ReadinessCheck::default()
    }
}

fn standby_check(spec: &FailoverCheck, reading: &StandbySaleReading) -> Checked {
    let sale = format!("{}/{}", spec.standby.namespace, spec.standby.name);
    match reading {
        StandbySaleReading::Missing(why) => (
            check("standby", false, format!("standby sale {sale}: {why}")),
            Some(DrillReason::StandbyMissing),
        ),
        StandbySaleReading::NotReady(why) => (
            check(
                "standby",
                false,
                format!("standby sale {sale} is not Ready: {why}"),
            ),
            Some(DrillReason::StandbyNotReady),
        ),
        StandbySaleReading::OtherSale { primary, standby } => (
            check(
                "standby",
                false,
                format!(
                    "standby sale {sale} is sale {standby:?}, the primary is sale {primary:?}: \
                     it would sell stock of its own, not the stock replicated from the primary; \
                     give both FlashSales the same spec.saleID"
                ),
            ),
            Some(DrillReason::StandbyOtherSale),
        ),
        StandbySaleReading::Ready { gateways } => (
            ReadinessCheck {
                value: Some(format!("{gateways} ready gateways")),
                ..check(
                    "standby",
                    true,
                    format!("standby sale {sale} is Ready with {gateways} ready gateways"),
                )
            },
            None,
        ),
    }
}

fn capacity_check(
    per_gateway: f64,
    headroom: f64,
    gateways: Option<i32>,
    loads: &Result<Loads, String>,
) -> Checked {
    let loads = match loads {
        Ok(loads) => loads,
        Err(why) => {
            let message = format!("the load could not be read: {why}");
            return (
                check("capacity", false, message),
                Some(DrillReason::ReadinessUnknown),
            );
        }
    };
    let gateways = gateways.unwrap_or(0);
    let capacity = f64::from(gateways) * per_gateway;
    let needed = (loads.primary + loads.standby) * headroom;
    let passed = capacity >= needed;
    let verdict = if passed { "covers" } else { "is short of" };
    let message = format!(
        "{gateways} ready standby gateways × {per_gateway} rps = {capacity:.0} rps {verdict} \
         (primary {:.1} + standby {:.1} rps) × {headroom} = {needed:.1} rps",
        loads.primary, loads.standby
    );
    (
        ReadinessCheck {
            value: Some(format!("{capacity:.0} rps")),
            bound: Some(format!(">= {needed:.1} rps")),
            ..check("capacity", passed, message)
        },
        Some(DrillReason::CapacityShort),
    )
}

/// How far behind a replication may be, and for how long above that.
struct LagBounds {
    max: Duration,
    grace: Duration,
}

fn lag_check(
    name: String,
    bounds: LagBounds,
    reading: &Result<LagReading, String>,
    above_before: Option<Timestamp>,
    now: Timestamp,
) -> Checked {
    let bound = Some(format!("<= {}", flashsale_api::Duration(bounds.max)));
    // A read that fails, or a replication that broke, does not restart the
    // grace of a lag that was already above its bound.
    let above_since = above_before.map(Time);
    let (lag, detail) = match reading {
        Err(why) => {
            let message = format!("{name} could not be read: {why}");
            return (
                ReadinessCheck {
                    bound,
                    above_since,
                    ..check(&name, false, message)
                },
                Some(DrillReason::ReadinessUnknown),
            );
        }
        Ok(LagReading::Broken(why)) => {
            let message = format!("{name} is broken: {why}");
            return (
                ReadinessCheck {
                    bound,
                    above_since: above_since.or(Some(Time(now))),
                    ..check(&name, false, message)
                },
                Some(DrillReason::ReplicationLagging),
            );
        }
        Ok(LagReading::Lag(lag, detail)) => (*lag, detail),
    };
    let shown = flashsale_api::Duration(lag);
    let detail = detail
        .as_ref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    let value = Some(format!("{shown}{}", detail));
    if lag <= bounds.max {
        let message = format!("{name} is {shown} behind{detail}, within its bound");
        return (
            ReadinessCheck {
                value,
                bound,
                ..check(&name, true, message)
            },
            Some(DrillReason::ReplicationLagging),
        );
    }
    let since = above_before.unwrap_or(now);
    let above_for = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    let passed = above_for < bounds.grace;
    let message = format!(
        "{name} is {shown} behind{detail}, above its bound for {} (lagGrace {}){}",
        flashsale_api::Duration(above_for),
        flashsale_api::Duration(bounds.grace),
        if passed { ": a spike so far" } else { "" }
    );
    (
        ReadinessCheck {
            value,
            bound,
            above_since: Some(Time(since)),
            ..check(&name, passed, message)
        },
        Some(DrillReason::ReplicationLagging),
    )
}

fn endpoint_check(reading: &Result<(bool, String), String>) -> Checked {
    match reading {
        Err(why) => (
            check(
                "endpoint",
                false,
                format!("the endpoint could not be read: {why}"),
            ),
            Some(DrillReason::ReadinessUnknown),
        ),
        Ok((healthy, said)) => {
            let verdict = if *healthy { "healthy" } else { "not healthy" };
            (
                ReadinessCheck {
                    value: Some(said.chars().take(64).collect()),
                    ..check(
                        "endpoint",
                        *healthy,
                        format!("the global endpoint sees the standby {verdict} ({said})"),
                    )
                },
                Some(DrillReason::EndpointStandbyDown),
            )
        }
    }
}

/// The endpoint answers from the primary region while the primary sale is
/// Ready; from another only once the primary is not (a failover).
fn serving_check(reading: &Result<Serving, String>) -> Checked {
    let serving = match reading {
        Ok(serving) => serving,
        Err(why) => {
            let message = format!("the global endpoint could not be asked: {why}");
            return (
                check("serving", false, message),
                Some(DrillReason::ReadinessUnknown),
            );
        }
    };
    let primary = &serving.primary_region;
    let Some(region) = &serving.answered_by else {
        let message = format!(
            "the global endpoint's answer ({}) names no region: no gateway answered",
            serving.status
        );
        return (
            check("serving", false, message),
            Some(DrillReason::ReadinessUnknown),
        );
    };
    let value = Some(region.clone());
    let (passed, message) = if region == primary {
        (true, format!("the primary region {primary} answers"))
    } else if serving.primary_ready {
        (
            false,
            format!(
                "region {region} answers while the primary sale (region {primary}) is Ready: \
                 a false failover"
            ),
        )
    } else {
        (
            true,
            format!("region {region} answers while the primary sale is not Ready: a failover"),
        )
    };
    (
        ReadinessCheck {
            value,
            bound: Some(primary.clone()),
            ..check("serving", passed, message)
        },
        Some(DrillReason::FalseFailover),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_api::chaosdrill::{
        CapacityCheck, EndpointCheck, FailoverMode, ReplicationLag, StandbySale,
    };

    fn spec() -> FailoverCheck {
        FailoverCheck {
            mode: FailoverMode::Active,
            max_rto: flashsale_api::Duration::from_secs(30),
            max_rpo: 0,
            standby: StandbySale {
                namespace: "region-b".into(),
                name: "singles-day".into(),
                kubeconfig_secret_ref: None,
                gateway_url: None,
            },
            capacity: Some(CapacityCheck {
                per_gateway_rps: 100.0,
                headroom: 1.25,
                load: "sum(rate(x[1m]))".into(),
            }),
            replication: vec![ReplicationLag {
                name: "inventory".into(),
                max_lag: flashsale_api::Duration::from_secs(1),
                query: Some("lag".into()),
                redis_url_secret_ref: None,
                promote_redis_url_secret_ref: None,
            }],
            orders: None,
            endpoint: Some(EndpointCheck {
                query: Some("up".into()),
                haproxy_stats_url: None,
                server: None,
                url: Some("http://endpoint".into()),
            }),
            check_every: flashsale_api::Duration::from_secs(15),
            lag_grace: flashsale_api::Duration::from_secs(10),
        }
    }

    fn healthy() -> Readings {
        Readings {
            standby: StandbySaleReading::Ready { gateways: 4 },
            loads: Some(Ok(Loads {
                primary: 200.0,
                standby: 100.0,
            })),
            lags: vec![Ok(LagReading::Lag(Duration::ZERO, None))],
            endpoint: Some(Ok((true, "UP".into()))),
            serving: Some(Ok(serving("a", true))),
        }
    }

    fn serving(answered_by: &str, primary_ready: bool) -> Serving {
        Serving {
            status: 404,
            answered_by: Some(answered_by.into()),
            primary_region: "a".into(),
            primary_ready,
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn every_check_passing_is_ready_with_the_numbers() {
        let verdict = assess(&spec(), &healthy(), None, at(0));
        assert!(verdict.ready(), "{verdict:?}");
        assert_eq!(verdict.reason, DrillReason::StandbyReady);
        let capacity = &verdict.status.checks[1];
        assert_eq!(capacity.value.as_deref(), Some("400 rps"));
        assert_eq!(capacity.bound.as_deref(), Some(">= 375.0 rps"));
        assert_eq!(verdict.status.checks.len(), 5);
        let serving = &verdict.status.checks[4];
        assert_eq!(
            (serving.value.as_deref(), serving.bound.as_deref()),
            (Some("a"), Some("a"))
        );
    }

    #[test]
    fn another_region_answering_is_a_false_failover_only_while_the_primary_is_ready() {
        let mut readings = healthy();
        readings.serving = Some(Ok(serving("b", true)));
        let verdict = assess(&spec(), &readings, None, at(0));
        assert_eq!(verdict.reason, DrillReason::FalseFailover);
        assert!(
            verdict
                .message
                .contains("region b answers while the primary sale (region a) is Ready"),
            "{}",
            verdict.message
        );
        readings.serving = Some(Ok(serving("b", false)));
        let verdict = assess(&spec(), &readings, None, at(0));
        assert!(verdict.ready(), "a real failover: {}", verdict.message);
        assert!(verdict.status.checks[4].message.contains("a failover"));
    }

    #[test]
    fn an_answer_naming_no_region_or_none_is_unknown() {
        let mut readings = healthy();
        readings.serving = Some(Ok(Serving {
            answered_by: None,
            status: 503,
            ..serving("a", true)
        }));
        let verdict = assess(&spec(), &readings, None, at(0));
        assert_eq!(verdict.reason, DrillReason::ReadinessUnknown);
        assert!(
            verdict.message.contains("(503) names no region"),
            "{}",
            verdict.message
        );
        readings.serving = Some(Err("connection refused".into()));
        let verdict = assess(&spec(), &readings, None, at(0));
        assert_eq!(verdict.reason, DrillReason::ReadinessUnknown);
    }

    #[test]
    fn each_failure_names_its_own_reason() {
        type Break = fn(&mut Readings);
        let cases: [(Break, DrillReason); 8] = [
            (
                |r| r.standby = StandbySaleReading::Missing("not found".into()),
                DrillReason::StandbyMissing,
            ),
            (
                |r| {
                    r.standby = StandbySaleReading::OtherSale {
                        primary: "shop.sale.0123abcd".into(),
                        standby: "shop-b.sale.4567ef01".into(),
                    };
                },
                DrillReason::StandbyOtherSale,
            ),
            (
                |r| r.standby = StandbySaleReading::NotReady("1/3 workloads".into()),
                DrillReason::StandbyNotReady,
            ),
            (
                |r| r.standby = StandbySaleReading::Ready { gateways: 3 },
                DrillReason::CapacityShort,
            ),
            (
                |r| r.lags[0] = Ok(LagReading::Broken("no replica online".into())),
                DrillReason::ReplicationLagging,
            ),
            (
                |r| r.endpoint = Some(Ok((false, "DOWN".into()))),
                DrillReason::EndpointStandbyDown,
            ),
            (
                |r| r.serving = Some(Ok(serving("b", true))),
                DrillReason::FalseFailover,
            ),
            (
                |r| r.loads = Some(Err("Prometheus did not answer".into())),
                DrillReason::ReadinessUnknown,
            ),
        ];
        for (break_it, reason) in cases {
            let mut readings = healthy();
            break_it(&mut readings);
            let verdict = assess(&spec(), &readings, None, at(0));
            assert!(!verdict.ready());
            assert_eq!(verdict.reason, reason, "{}", verdict.message);
        }
    }

    #[test]
    fn a_missing_standby_also_fails_capacity_since_it_has_no_gateways() {
        let mut readings = healthy();
        readings.standby = StandbySaleReading::Missing("not found".into());
        let verdict = assess(&spec(), &readings, None, at(0));
        assert_eq!(verdict.reason, DrillReason::StandbyMissing);
        assert!(!verdict.status.checks[1].passed);
    }

    #[test]
    fn a_lag_spike_shorter_than_the_grace_is_reported_but_stays_ready() {
        let spec = spec();
        let mut readings = healthy();
        readings.lags[0] = Ok(LagReading::Lag(Duration::from_secs(3), None));
        // Above at 0 s, still above at 9 s: ready, with since when.
        let first = assess(&spec, &readings, None, at(0));
        assert!(first.ready());
        assert_eq!(first.status.checks[2].above_since, Some(Time(at(0))));
        let later = assess(&spec, &readings, Some(&first.status), at(9));
        assert!(later.ready(), "{}", later.status.checks[2].message);
        assert_eq!(later.status.checks[2].above_since, Some(Time(at(0))));
        // Back under the bound: the spike is forgotten.
        let back = assess(&spec, &healthy(), Some(&later.status), at(12));
        assert!(back.ready());
        assert_eq!(back.status.checks[2].above_since, None);
        // A new rise counts from itself, not from the old spike.
        let again = assess(&spec, &readings, Some(&back.status), at(13));
        assert_eq!(again.status.checks[2].above_since, Some(Time(at(13))));
    }

    #[test]
    fn a_failed_read_mid_lag_keeps_the_grace_running_and_long_messages_are_cut() {
        let spec = spec();
        let mut readings = healthy();
        readings.lags[0] = Ok(LagReading::Lag(Duration::from_secs(3), None));
        let rose = assess(&spec, &readings, None, at(0));
        let mut unread = healthy();
        unread.lags[0] = Err("x".repeat(2000));
        let blind = assess(&spec, &unread, Some(&rose.status), at(4));
        assert_eq!(blind.status.checks[2].above_since, Some(Time(at(0))));
        assert!(blind.status.checks[2].message.len() <= MESSAGE_BOUND);
        let held = assess(&spec, &readings, Some(&blind.status), at(10));
        assert_eq!(
            held.reason,
            DrillReason::ReplicationLagging,
            "{}",
            held.message
        );
    }

    #[test]
    fn a_lag_above_its_bound_for_the_grace_fails() {
        let spec = spec();
        let mut readings = healthy();
        readings.lags[0] = Ok(LagReading::Lag(Duration::from_secs(3), None));
        let first = assess(&spec, &readings, None, at(0));
        let held = assess(&spec, &readings, Some(&first.status), at(10));
        assert!(!held.ready());
        assert_eq!(held.reason, DrillReason::ReplicationLagging);
        assert!(
            held.message
                .contains("above its bound for 10s (lagGrace 10s)"),
            "{}",
            held.message
        );
    }
}
