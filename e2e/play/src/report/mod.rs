//! The run's report: what the scenario measured, as a self-contained HTML
//! page (no external scripts or fonts) with inline SVG plots, and its checks
//! as JUnit XML.

mod bar_plot;
mod escape;
mod html;
mod junit;
mod model;
mod number;
mod scale;
mod svg;
mod time_plot;

pub use html::render_html;
pub use junit::render_junit;
pub use model::{Bar, BarPlot, Check, Marker, Report, Series, Span, TimePlot};
