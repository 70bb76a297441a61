//! The report as one self-contained HTML page: inline CSS and inline SVG,
//! nothing fetched from anywhere.

use std::fmt::{self, Write};

use super::{bar_plot::bar_plot, escape::escape, model::Report, time_plot::time_plot};

/// The page's style: system fonts, a calm palette, printable.
const STYLE: &str = r#"
:root {
  --ink: #1f2328; --muted: #5f6670; --faint: #8c939c; --line: #e3e5e8;
  --paper: #ffffff; --page: #f6f7f9; --pass: #2f7d4f; --fail: #b3383e;
}
* { box-sizing: border-box; }
html { background: var(--page); }
body {
  margin: 0; color: var(--ink);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", "Noto Sans", "Liberation Sans", Arial, sans-serif;
  -webkit-font-smoothing: antialiased;
}
main { max-width: 980px; margin: 0 auto; padding: 40px 32px 56px; }
header { margin-bottom: 28px; }
h1 { font-size: 26px; line-height: 1.25; font-weight: 650; margin: 0 0 6px; letter-spacing: -0.01em; }
.subtitle { margin: 0; color: var(--muted); }
h2 {
  font-size: 13px; font-weight: 650; text-transform: uppercase; letter-spacing: 0.06em;
  color: var(--muted); margin: 36px 0 12px;
}
h2 .count { text-transform: none; letter-spacing: 0; font-weight: 500; margin-left: 8px; }
.card { background: var(--paper); border: 1px solid var(--line); border-radius: 10px; }
table.summary { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
.summary th, .summary td { padding: 8px 16px; border-top: 1px solid var(--line); text-align: left; vertical-align: top; }
.summary tr:first-child th, .summary tr:first-child td { border-top: 0; }
.summary th { font-weight: 500; color: var(--muted); width: 40%; }
.summary td { font-weight: 600; }
ul.checks { list-style: none; margin: 0; padding: 4px 0; }
.checks li { display: flex; gap: 12px; padding: 10px 16px; border-top: 1px solid var(--line); }
.checks li:first-child { border-top: 0; }
.mark {
  flex: none; width: 22px; height: 22px; border-radius: 50%; margin-top: 1px;
  display: inline-flex; align-items: center; justify-content: center;
  font-size: 13px; font-weight: 700; color: #fff;
}
.pass .mark { background: var(--pass); }
.fail .mark { background: var(--fail); }
.verdict { font-size: 12px; font-weight: 650; text-transform: uppercase; letter-spacing: 0.05em; margin-left: 8px; }
.pass .verdict { color: var(--pass); }
.fail .verdict { color: var(--fail); }
.check-name { font-weight: 600; }
.detail { margin: 2px 0 0; color: var(--muted); font-size: 14px; overflow-wrap: anywhere; }
figure { margin: 0 0 20px; padding: 18px 20px 12px; }
figcaption { font-weight: 600; font-size: 16px; margin-bottom: 4px; }
svg.plot { display: block; width: 100%; height: auto; font-family: inherit; }
svg.plot text { font-size: 11px; fill: var(--muted); }
svg.plot .grid { stroke: #eceef1; }
svg.plot .axis { stroke: #b9bec5; }
svg.plot .axis-label { font-size: 11.5px; fill: var(--muted); }
svg.plot .legend { font-size: 12px; fill: var(--ink); }
svg.plot .value { font-size: 10.5px; fill: var(--ink); font-variant-numeric: tabular-nums; }
svg.plot .group { font-size: 12px; fill: var(--ink); }
svg.plot .note { paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; fill: #3d4248; }
svg.plot .span-label { fill: var(--muted); }
svg.plot .empty { font-size: 13px; fill: var(--faint); }
@media print {
  html, .card { background: #fff; }
  main { padding: 0; max-width: none; }
  figure, .checks li, tr { break-inside: avoid; }
}
"#;

/// The report as a self-contained HTML page.
pub fn render_html(report: &Report) -> String {
    let mut out = String::with_capacity(64 * 1024);
    // Formatting into a String cannot fail.
    let _ = page(&mut out, report);
    out
}

fn page(out: &mut String, report: &Report) -> fmt::Result {
    let title = escape(&report.title);
    write!(
        out,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title><style>{STYLE}</style></head><body><main><header><h1>{title}</h1><p class="subtitle">{}</p></header>"#,
        escape(&report.subtitle),
    )?;
    summary(out, report)?;
    checks(out, report)?;
    if !report.time_plots.is_empty() || !report.bar_plots.is_empty() {
        out.push_str(r#"<section class="plots"><h2>Plots</h2>"#);
        for plot in &report.time_plots {
            figure(out, &plot.title, |out| time_plot(out, plot))?;
        }
        for plot in &report.bar_plots {
            figure(out, &plot.title, |out| bar_plot(out, plot))?;
        }
        out.push_str("</section>");
    }
    out.push_str("</main></body></html>\n");
    Ok(())
}

fn summary(out: &mut String, report: &Report) -> fmt::Result {
    if report.summary.is_empty() {
        return Ok(());
    }
    out.push_str(r#"<section><h2>Summary</h2><div class="card"><table class="summary"><tbody>"#);
    for (label, value) in &report.summary {
        write!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(label),
            escape(value)
        )?;
    }
    out.push_str("</tbody></table></div></section>");
    Ok(())
}

fn checks(out: &mut String, report: &Report) -> fmt::Result {
    if report.checks.is_empty() {
        return Ok(());
    }
    let passed = report.checks.iter().filter(|c| c.passed).count();
    write!(
        out,
        r#"<section><h2>Checks<span class="count">{passed} of {} passed</span></h2><ul class="checks card">"#,
        report.checks.len(),
    )?;
    for check in &report.checks {
        let (class, mark, verdict) = if check.passed {
            ("pass", "✓", "passed")
        } else {
            ("fail", "✗", "failed")
        };
        write!(
            out,
            r#"<li class="{class}" data-check="{class}"><span class="mark" aria-hidden="true">{mark}</span><div><span class="check-name">{}</span><span class="verdict">{verdict}</span><p class="detail">{}</p></div></li>"#,
            escape(&check.name),
            escape(&check.detail),
        )?;
    }
    out.push_str("</ul></section>");
    Ok(())
}

/// A plot in a card, its title as the caption.
fn figure(
    out: &mut String,
    title: &str,
    plot: impl FnOnce(&mut String) -> fmt::Result,
) -> fmt::Result {
    write!(
        out,
        r#"<figure class="card"><figcaption>{}</figcaption>"#,
        escape(title)
    )?;
    plot(out)?;
    out.push_str("</figure>");
    Ok(())
}
