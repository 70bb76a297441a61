//! What a report holds: plain data the scenario fills from the run's own
//! Prometheus series, the buyers' tally and the checks.

use serde::{Deserialize, Serialize};

/// A whole report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Page title, e.g. "flash sale flashsale-demo/play".
    pub title: String,
    /// One line under the title: when and how the run was played.
    pub subtitle: String,
    /// Key figures as (label, value), shown as a table at the top.
    pub summary: Vec<(String, String)>,
    /// The checks, in the order they were made.
    pub checks: Vec<Check>,
    /// Plots over time, drawn in this order.
    pub time_plots: Vec<TimePlot>,
    /// Bar plots, drawn after the time plots.
    pub bar_plots: Vec<BarPlot>,
}

/// One check of the run's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked, e.g. "stock is conserved".
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

/// Values over time: (Unix milliseconds, value), in time order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Legend name.
    pub name: String,
    /// The points; NaN values are gaps.
    pub points: Vec<(i64, f64)>,
}

/// A moment marked on a time plot (a vertical line with a label).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// Unix milliseconds.
    pub at_ms: i64,
    /// Label, e.g. "chaos injected".
    pub label: String,
}

/// A stretch of time shaded on a time plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// Unix milliseconds.
    pub from_ms: i64,
    /// Unix milliseconds.
    pub to_ms: i64,
    /// Label, e.g. "tier 2".
    pub label: String,
}

/// A plot over time with a left axis and, optionally, a right one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimePlot {
    /// Stable id, unique in the report (the page marks the plot with it).
    pub id: String,
    /// Heading.
    pub title: String,
    /// Left axis label, with its unit.
    pub left_label: String,
    /// Series on the left axis, drawn as lines.
    pub left: Vec<Series>,
    /// Right axis label (empty when there is no right axis).
    pub right_label: String,
    /// Series on the right axis, drawn as steps (tiers, counts).
    pub right: Vec<Series>,
    /// Horizontal reference lines on the left axis: (value, label).
    pub thresholds: Vec<(f64, String)>,
    /// Moments to mark.
    pub markers: Vec<Marker>,
    /// Stretches to shade.
    pub spans: Vec<Span>,
    /// The time range shown: (from, to) Unix milliseconds.
    pub range_ms: (i64, i64),
}

/// A bar plot: groups of labelled bars sharing one axis.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BarPlot {
    /// Stable id, unique in the report.
    pub id: String,
    /// Heading.
    pub title: String,
    /// Value axis label, with its unit.
    pub unit: String,
    /// The groups, drawn in this order (e.g. one per funnel stage, or one
    /// per route with a bar per percentile).
    pub groups: Vec<(String, Vec<Bar>)>,
}

/// One bar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bar {
    /// Legend name, e.g. "p99".
    pub name: String,
    /// Its value.
    pub value: f64,
}
