//! The report's plots, made from the run's own Prometheus data (the series
//! the stack's Prometheus scraped from the sale's pods) and from what the
//! scenario logged itself.

use anyhow::Context;
use flashsale_api::chaosdrill::RunRecord;
use jiff::Timestamp;
use prometheus_http_query::Client;

use super::{
    plan::{Plan, SLO, TIER1, TIER2},
    tiers::TierLog,
};
use crate::report::{Bar, BarPlot, Marker, Series, Span, TimePlot};

/// The stretch of the run the plots show.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// The load's first buyer.
    pub from: Timestamp,
    /// The load's end.
    pub to: Timestamp,
}

impl Window {
    fn range_ms(self) -> (i64, i64) {
        (self.from.as_millisecond(), self.to.as_millisecond())
    }

    /// Seconds the window spans, at least one.
    pub fn seconds(self) -> i64 {
        (self.to.as_second() - self.from.as_second()).max(1)
    }

    /// One point per second for runs up to ten minutes, fewer beyond.
    fn step(self) -> f64 {
        (self.seconds() as f64 / 600.0).ceil().max(1.0)
    }
}

/// Reads series for one sale from Prometheus.
pub struct Source<'a> {
    /// The Prometheus client.
    pub prometheus: &'a Client,
    /// The plan (sale name, peak).
    pub plan: &'a Plan,
    /// The sale's namespace.
    pub namespace: &'a str,
    /// The time shown.
    pub window: Window,
}

impl Source<'_> {
    /// One series per result of `query` over the window, named `name`
    /// (results beyond the first get their labels appended).
    async fn range(&self, name: &str, query: &str) -> anyhow::Result<Vec<Series>> {
        let w = self.window;
        let answer = self
            .prometheus
            .query_range(query, w.from.as_second(), w.to.as_second(), w.step())
            .get()
            .await
            .with_context(|| format!("Prometheus range query {query}"))?;
        let matrix = answer
            .data()
            .as_matrix()
            .map(Vec::as_slice)
            .unwrap_or_default();
        Ok(matrix
            .iter()
            .enumerate()
            .map(|(i, result)| Series {
                name: if i == 0 {
                    name.to_owned()
                } else {
                    format!("{name} {:?}", result.metric())
                },
                points: result
                    .samples()
                    .iter()
                    .map(|s| ((s.timestamp() * 1000.0) as i64, s.value()))
                    .collect(),
            })
            .collect())
    }

    /// The value of `query` at the window's end, per result, keyed by the
    /// value of `label` (empty when absent).
    async fn at_end(&self, query: &str, label: &str) -> anyhow::Result<Vec<(String, f64)>> {
        let answer = self
            .prometheus
            .query(query)
            .at(self.window.to.as_second())
            .get()
            .await
            .with_context(|| format!("Prometheus query {query}"))?;
        Ok(answer
            .data()
            .as_vector()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|v| {
                (
                    v.metric().get(label).cloned().unwrap_or_default(),
                    v.sample().value(),
                )
            })
            .collect())
    }

    /// The sum of `query` at the window's end (0 when it has no result).
    pub async fn total(&self, query: &str) -> anyhow::Result<f64> {
        Ok(self
            .at_end(query, "")
            .await?
            .into_iter()
            .map(|(_, v)| v)
            .filter(|v| v.is_finite())
            .sum())
    }

    fn gateways(&self) -> String {
        self.plan.gateways(self.namespace)
    }

    /// Requests per second and the tier over time, with the tiers' entry
    /// thresholds in requests per second.
    pub async fn load(&self, tiers: &TierLog, run: Option<&RunRecord>) -> anyhow::Result<TimePlot> {
        let g = self.gateways();
        let mut left = Vec::new();
        for (name, filter) in [
            ("requests/s", String::new()),
            ("rate-limited (429)/s", r#", code="429""#.to_owned()),
            ("queued (202)/s", r#", code="202""#.to_owned()),
            ("errors (5xx)/s", r#", code=~"5..""#.to_owned()),
        ] {
            let query = format!("sum(rate(gateway_requests_total{{{g}{filter}}}[10s]))");
            left.extend(self.range(name, &query).await?);
        }
        let right = self
            .range(
                "tier in force (gateways)",
                &format!("max(gateway_degradation_tier{{{g}}})"),
            )
            .await?;
        let peak = self.plan.peak_rps();
        let mut markers: Vec<Marker> = tiers
            .changes
            .iter()
            .skip(1)
            .map(|c| Marker {
                at_ms: c.at.as_millisecond(),
                label: format!("tier {}", c.tier),
            })
            .collect();
        markers.extend(chaos_markers(run).into_iter().take(1));
        Ok(TimePlot {
            id: "load".into(),
            title: "Load and degradation tier".into(),
            left_label: "requests per second".into(),
            left,
            right_label: "tier".into(),
            right,
            thresholds: vec![
                (TIER1.0 * peak, "tier 1 above".into()),
                (TIER2.0 * peak, "tier 2 above".into()),
            ],
            markers,
            spans: tier_spans(tiers, self.window),
            range_ms: self.window.range_ms(),
        })
    }

    /// Active buyers (as the load generator sampled them) and the waiting
    /// room's depth.
    pub async fn buyers(&self, active: Vec<(i64, f64)>) -> anyhow::Result<TimePlot> {
        let mut left = vec![Series {
            name: "active buyers".into(),
            points: active,
        }];
        let depth = format!("max(gateway_waiting_room_depth{{{}}})", self.gateways());
        left.extend(self.range("waiting room depth", &depth).await?);
        Ok(TimePlot {
            id: "buyers".into(),
            title: "Buyers and the waiting room".into(),
            left_label: "buyers".into(),
            left,
            range_ms: self.window.range_ms(),
            ..TimePlot::default()
        })
    }

    /// The drill's SLO as Prometheus saw it, with the injection, the
    /// detection, the decision and the end of the chaos marked.
    pub async fn slo(&self, run: Option<&RunRecord>) -> anyhow::Result<TimePlot> {
        let left = self
            .range("gateways up", &self.plan.slo_query(self.namespace))
            .await?;
        let spans = run
            .and_then(|r| {
                Some(Span {
                    from_ms: r.injected_at.as_ref()?.0.as_millisecond(),
                    to_ms: r.gone_at.as_ref()?.0.as_millisecond(),
                    label: "chaos".into(),
                })
            })
            .into_iter()
            .collect();
        Ok(TimePlot {
            id: "slo".into(),
            title: format!("SLO \"{SLO}\" and the chaos drill"),
            left_label: "gateways up".into(),
            left,
            thresholds: vec![(2.0, "SLO: both gateways up".into())],
            markers: chaos_markers(run),
            spans,
            range_ms: self.window.range_ms(),
            ..TimePlot::default()
        })
    }

    /// p50, p95 and p99 latency per route over the whole load, in ms.
    pub async fn latency(&self) -> anyhow::Result<BarPlot> {
        let g = self.gateways();
        let seconds = self.window.seconds();
        let mut routes: Vec<(String, Vec<Bar>)> = Vec::new();
        for (name, q) in [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)] {
            let query = format!(
                "histogram_quantile({q}, sum by (le, route) \
                 (increase(gateway_request_duration_seconds_bucket{{{g}}}[{seconds}s])))"
            );
            for (route, value) in self.at_end(&query, "route").await? {
                let route = route.strip_prefix("/api/v1").unwrap_or(&route).to_owned();
                if !value.is_finite() {
                    continue;
                }
                let bar = Bar {
                    name: name.into(),
                    value: value * 1000.0,
                };
                match routes.iter_mut().find(|(r, _)| *r == route) {
                    Some((_, bars)) => bars.push(bar),
                    None => routes.push((route, vec![bar])),
                }
            }
        }
        routes.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(BarPlot {
            id: "latency".into(),
            title: "Latency per route over the load".into(),
            unit: "milliseconds".into(),
            groups: routes,
        })
    }

    /// Reservations the inventory made over the load (its `ok` results).
    pub async fn reserved(&self) -> anyhow::Result<u64> {
        let query = format!(
            // The counters start with the pods, just before the sale: their
            // highest value is what each pod reserved (no `increase`
            // extrapolation).
            r#"sum(max_over_time(inventory_reservations_total{{namespace="{}", pod=~"{}-inventory-.*", result="ok"}}[{}s]))"#,
            self.namespace,
            self.plan.sale,
            self.window.seconds()
        );
        Ok(self.total(&query).await?.round().max(0.0) as u64)
    }
}

fn chaos_markers(run: Option<&RunRecord>) -> Vec<Marker> {
    let Some(run) = run else {
        return Vec::new();
    };
    [
        (&run.injected_at, "chaos injected"),
        (&run.decided_at, "guard aborts"),
        (&run.gone_at, "chaos gone"),
    ]
    .into_iter()
    .filter_map(|(at, label)| {
        Some(Marker {
            at_ms: at.as_ref()?.0.as_millisecond(),
            label: label.into(),
        })
    })
    .collect()
}

/// A shaded span per stretch at tier 1 or above.
fn tier_spans(tiers: &TierLog, window: Window) -> Vec<Span> {
    let mut spans = Vec::new();
    for (i, change) in tiers.changes.iter().enumerate() {
        if change.tier == 0 {
            continue;
        }
        let to = tiers.changes.get(i + 1).map_or(window.to, |next| next.at);
        spans.push(Span {
            from_ms: change.at.as_millisecond(),
            to_ms: to.as_millisecond(),
            label: format!("tier {}", change.tier),
        });
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::tiers::TierChange;

    #[test]
    fn tier_spans_run_from_each_entry_to_the_next_change() -> anyhow::Result<()> {
        let at = |s: i64| Timestamp::from_second(s);
        let mut log = TierLog::default();
        for (tier, s) in [(0, 0), (1, 10), (2, 20), (1, 30), (0, 40)] {
            log.changes.push(TierChange {
                tier,
                at: at(s)?,
                reason: "Signal".into(),
                value: None,
            });
        }
        let window = Window {
            from: at(0)?,
            to: at(60)?,
        };
        let spans = tier_spans(&log, window);
        let got: Vec<(i64, i64, &str)> = spans
            .iter()
            .map(|s| (s.from_ms / 1000, s.to_ms / 1000, s.label.as_str()))
            .collect();
        assert_eq!(
            got,
            [(10, 20, "tier 1"), (20, 30, "tier 2"), (30, 40, "tier 1")]
        );
        assert_eq!(window.step(), 1.0);
        Ok(())
    }
}
