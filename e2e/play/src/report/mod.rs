//! The run's report: what the scenario measured, as a self-contained HTML
//! page (no external scripts or fonts) with inline SVG plots.

mod model;

pub use model::{Bar, BarPlot, Check, Marker, Report, Series, Span, TimePlot};
