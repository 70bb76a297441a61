//! A plot over time: lines on the left axis, steps on the right one,
//! dashed thresholds, marked moments and shaded stretches.

use std::fmt::{self, Write};

use super::{
    escape::escape,
    model::{Series, TimePlot},
    number::{self, Px},
    scale::{Linear, Ticks, extent},
    svg::{self, Frame, Legend, LegendItem, PathData, Placement, Side, Swatch, TextBox},
};

/// Shades for spans, one per label.
const SPAN_FILLS: [&str; 4] = ["#e9eff6", "#f6eee3", "#e8f2eb", "#f2ecf5"];
/// Threshold lines and their labels.
const THRESHOLD: &str = "#b4474d";
/// Marker lines.
const MARKER: &str = "#4a4a4a";
/// Height of a row of labels.
const LABEL_ROW: f64 = 14.0;
/// Size of the notes: threshold, marker and span labels.
const NOTE: f64 = 11.0;

/// Draws `plot` as an `<svg>`.
pub(crate) fn time_plot(out: &mut String, plot: &TimePlot) -> fmt::Result {
    let (from, to) = time_range(plot);
    let seconds = |t: i64| t.saturating_sub(from) as f64 / 1000.0;
    let shown = |t: i64| t >= from && t <= to;
    let has_right = !plot.right.is_empty() || !plot.right_label.is_empty();

    let legend = Legend::new(legend_items(plot), svg::WIDTH - 140.0);
    let frame = Frame::new(
        68.0,
        if has_right { 68.0 } else { 24.0 },
        16.0 + legend.height(),
        46.0,
    );
    let x = Linear::new((0.0, seconds(to)), (frame.x0, frame.x1));
    let left_values = shown_values(&plot.left, shown);
    let right_values = shown_values(&plot.right, shown);
    let thresholds: Vec<_> = plot
        .thresholds
        .iter()
        .filter(|(v, _)| v.is_finite())
        .collect();
    let left_ticks = axis_ticks(
        left_values
            .iter()
            .copied()
            .chain(thresholds.iter().map(|(v, _)| *v)),
    );
    let y_left = Linear::new((left_ticks.lo, left_ticks.hi), (frame.y1, frame.y0));
    let right_ticks = right_axis_ticks(&right_values);
    let y_right = Linear::new((right_ticks.lo, right_ticks.hi), (frame.y1, frame.y0));

    svg::open(out, &plot.id, &plot.title)?;
    let spans = shown_spans(plot, (from, to), |t| x.map(seconds(t)));
    span_shades(out, frame, &spans)?;
    svg::value_axis(
        out,
        frame,
        &left_ticks,
        &y_left,
        Side::Left,
        &plot.left_label,
    )?;
    if has_right {
        svg::value_axis(
            out,
            frame,
            &right_ticks,
            &y_right,
            Side::Right,
            &plot.right_label,
        )?;
    }
    time_axis(out, frame, &x, seconds(to))?;
    threshold_lines(out, frame, &y_left, &thresholds)?;
    let place = |y: Linear| move |t: i64, v: f64| (x.map(seconds(t)), y.map(v));
    series_paths(out, plot, shown, place(y_left), place(y_right))?;
    let markers: Vec<_> = plot
        .markers
        .iter()
        .filter(|m| shown(m.at_ms))
        .map(|m| (x.map(seconds(m.at_ms)), m.label.as_str()))
        .collect();
    marker_lines(out, frame, &markers)?;

    // Labels last, so lines never cross them; each where no other is.
    let mut placement = Placement::default();
    threshold_labels(out, frame, &y_left, &thresholds, &mut placement)?;
    marker_labels(out, frame, &markers, &mut placement)?;
    span_labels(out, frame, &spans, &mut placement)?;
    if left_values
        .iter()
        .chain(&right_values)
        .all(|v| !v.is_finite())
    {
        svg::no_data(out, frame)?;
    }
    legend.draw(out, frame.x0, 8.0)?;
    out.push_str("</svg>");
    Ok(())
}

/// The values of `series`' points at the times `shown` keeps.
fn shown_values(series: &[Series], shown: impl Fn(i64) -> bool) -> Vec<f64> {
    series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(t, _)| shown(*t))
        .map(|(_, v)| *v)
        .collect()
}

/// The spans' stretches within `range`, as (left, right, label) with the
/// ends placed by `place`; a span outside it is left out.
fn shown_spans(
    plot: &TimePlot,
    (from, to): (i64, i64),
    place: impl Fn(i64) -> f64,
) -> Vec<(f64, f64, &str)> {
    plot.spans
        .iter()
        .filter_map(|s| {
            let (a, b) = (s.from_ms.max(from), s.to_ms.min(to));
            (a < b).then(|| (place(a), place(b), s.label.as_str()))
        })
        .collect()
}

/// The series' paths, each in its legend colour: the left ones as lines
/// placed by `left`, the right ones as steps placed by `right`.
fn series_paths(
    out: &mut String,
    plot: &TimePlot,
    shown: impl Fn(i64) -> bool + Copy,
    left: impl Fn(i64, f64) -> (f64, f64),
    right: impl Fn(i64, f64) -> (f64, f64),
) -> fmt::Result {
    for (i, series) in plot.left.iter().enumerate() {
        let d = trace(series, shown, Draw::Line, &left);
        series_path(out, series, &d, svg::color(i), "1.75")?;
    }
    for (j, series) in plot.right.iter().enumerate() {
        let d = trace(series, shown, Draw::Step, &right);
        series_path(out, series, &d, svg::color(plot.left.len() + j), "2")?;
    }
    Ok(())
}

/// Ticks for the right axis: whole ones when every value is whole (tiers
/// and counts).
fn right_axis_ticks(values: &[f64]) -> Ticks {
    let ticks = axis_ticks(values.iter().copied());
    if values.iter().all(|v| v.fract() == 0.0 || !v.is_finite()) {
        ticks.whole()
    } else {
        ticks
    }
}

/// The thresholds' dashed lines across the plot, on the left axis.
fn threshold_lines(
    out: &mut String,
    frame: Frame,
    y: &Linear,
    thresholds: &[&(f64, String)],
) -> fmt::Result {
    for (value, _) in thresholds {
        write!(
            out,
            r#"<line x1="{}" x2="{}" y1="{py}" y2="{py}" stroke="{THRESHOLD}" stroke-width="1.25" stroke-dasharray="6 4"/>"#,
            Px(frame.x0),
            Px(frame.x1),
            py = Px(y.map(*value)),
        )?;
    }
    Ok(())
}

/// The thresholds' labels, right-aligned just above their lines: fixed,
/// the other labels make way for them.
fn threshold_labels(
    out: &mut String,
    frame: Frame,
    y: &Linear,
    thresholds: &[&(f64, String)],
    placement: &mut Placement,
) -> fmt::Result {
    for (value, label) in thresholds {
        let anchor = (frame.x1 - 6.0, y.map(*value) - 5.0);
        placement.fix(TextBox::of(label, NOTE, anchor, "end"));
        write!(
            out,
            r#"<text class="note" x="{}" y="{}" text-anchor="end" fill="{THRESHOLD}">{}</text>"#,
            Px(anchor.0),
            Px(anchor.1),
            escape(label),
        )?;
    }
    Ok(())
}

/// The markers' vertical lines, top to bottom of the plot.
fn marker_lines(out: &mut String, frame: Frame, markers: &[(f64, &str)]) -> fmt::Result {
    for (px, _) in markers {
        write!(
            out,
            r#"<line x1="{px}" x2="{px}" y1="{}" y2="{}" stroke="{MARKER}" stroke-width="1.25"/>"#,
            Px(frame.y0),
            Px(frame.y1),
            px = Px(*px),
        )?;
    }
    Ok(())
}

/// The time shown: the plot's range, or else the data's, or else a second.
fn time_range(plot: &TimePlot) -> (i64, i64) {
    let (from, to) = plot.range_ms;
    if from < to {
        return (from, to);
    }
    let times = plot
        .left
        .iter()
        .chain(&plot.right)
        .flat_map(|s| s.points.iter().map(|(t, _)| *t));
    match (times.clone().min(), times.max()) {
        (Some(first), Some(last)) if first < last => (first, last),
        (Some(first), _) => (first, first.saturating_add(1000)),
        _ => (from, from.saturating_add(1000)),
    }
}

/// Ticks for a value axis: from zero, with a little headroom above the
/// data so lines clear the plot's top edge.
fn axis_ticks(values: impl IntoIterator<Item = f64>) -> Ticks {
    let (lo, hi) = extent(values).unwrap_or((0.0, 0.0));
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    Ticks::nice(lo, hi + (hi - lo) * 0.08, 5)
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy)]
enum Draw {
    /// Straight lines between points.
    Line,
    /// Steps: a value holds until the next point.
    Step,
}

/// The path data of `series`' shown points, placed by `point`, broken at
/// gaps (NaN or infinite values).
fn trace(
    series: &Series,
    shown: impl Fn(i64) -> bool,
    draw: Draw,
    point: impl Fn(i64, f64) -> (f64, f64),
) -> String {
    let mut path = PathData::default();
    for &(t, v) in series.points.iter().filter(|(t, _)| shown(*t)) {
        if !v.is_finite() {
            path.lift();
            continue;
        }
        let (px, py) = point(t, v);
        match draw {
            Draw::Line => path.line_to(px, py),
            Draw::Step => path.step_to(px, py),
        }
    }
    path.finish()
}

/// A data series' `<path>`, marked with its name.
fn series_path(
    out: &mut String,
    series: &Series,
    d: &str,
    color: &str,
    width: &str,
) -> fmt::Result {
    write!(
        out,
        r#"<path data-series="{}" d="{d}" fill="none" stroke="{color}" stroke-width="{width}" stroke-linejoin="round" stroke-linecap="round"/>"#,
        escape(&series.name),
    )
}

/// The legend: left series as lines, right series as steps.
fn legend_items(plot: &TimePlot) -> Vec<LegendItem> {
    let left = plot.left.iter().enumerate().map(|(i, s)| LegendItem {
        label: s.name.clone(),
        color: svg::color(i),
        swatch: Swatch::Line,
    });
    let right = plot.right.iter().enumerate().map(|(j, s)| LegendItem {
        label: format!("{} (right axis)", s.name),
        color: svg::color(plot.left.len() + j),
        swatch: Swatch::Step,
    });
    left.chain(right).collect()
}

/// The time axis: seconds since the range's start.
fn time_axis(out: &mut String, frame: Frame, x: &Linear, duration: f64) -> fmt::Result {
    write!(
        out,
        r#"<line class="axis" x1="{}" x2="{}" y1="{y}" y2="{y}"/>"#,
        Px(frame.x0),
        Px(frame.x1),
        y = Px(frame.y1),
    )?;
    let ticks = Ticks::nice(0.0, duration, 8);
    for value in ticks.within(0.0, duration) {
        let px = Px(x.map(value));
        write!(
            out,
            r#"<line class="axis" x1="{px}" x2="{px}" y1="{}" y2="{}"/><text class="tick" x="{px}" y="{}" text-anchor="middle">{}</text>"#,
            Px(frame.y1),
            Px(frame.y1 + 4.0),
            Px(frame.y1 + 17.0),
            number::tick(value, ticks.decimals()),
        )?;
    }
    write!(
        out,
        r#"<text class="axis-label" x="{}" y="{}" text-anchor="middle">time since start (s)</text>"#,
        Px((frame.x0 + frame.x1) / 2.0),
        Px(svg::HEIGHT - 8.0),
    )
}

/// The spans' shaded rectangles: one shade per label, so a tier that comes
/// back looks the same.
fn span_shades(out: &mut String, frame: Frame, spans: &[(f64, f64, &str)]) -> fmt::Result {
    let mut labels: Vec<&str> = Vec::new();
    for (left, right, label) in spans {
        let shade = labels.iter().position(|l| l == label).unwrap_or_else(|| {
            labels.push(label);
            labels.len() - 1
        });
        write!(
            out,
            r#"<rect class="span" x="{}" y="{}" width="{}" height="{}" fill="{}"/>"#,
            Px(*left),
            Px(frame.y0),
            Px(right - left),
            Px(frame.y1 - frame.y0),
            SPAN_FILLS[shade % SPAN_FILLS.len()],
        )?;
    }
    Ok(())
}

/// Marker labels along the top, beside their line, each in the highest
/// row where it touches no other label.
fn marker_labels(
    out: &mut String,
    frame: Frame,
    markers: &[(f64, &str)],
    placement: &mut Placement,
) -> fmt::Result {
    let rows = label_rows(frame);
    for &(px, label) in markers {
        let width = svg::text_width(label, NOTE);
        // Beside the line, on its left when the right edge is too near.
        let (x, anchor) = if px + 5.0 + width <= frame.x1 {
            (px + 5.0, "start")
        } else {
            (px - 5.0, "end")
        };
        let baseline = |row: usize| frame.y0 + 12.0 + row as f64 * LABEL_ROW;
        let candidates: Vec<_> = (0..rows)
            .map(|row| TextBox::of(label, NOTE, (x, baseline(row)), anchor))
            .collect();
        let row = placement.first_free(&candidates);
        write!(
            out,
            r#"<text class="note" x="{}" y="{}" text-anchor="{anchor}">{}</text>"#,
            Px(x),
            Px(baseline(row)),
            escape(label),
        )?;
    }
    Ok(())
}

/// Span labels along the bottom, centred in their span, each in the lowest
/// row where it touches no other label.
fn span_labels(
    out: &mut String,
    frame: Frame,
    spans: &[(f64, f64, &str)],
    placement: &mut Placement,
) -> fmt::Result {
    let rows = label_rows(frame);
    for &(left, right, label) in spans {
        let x = (left + right) / 2.0;
        let baseline = |row: usize| frame.y1 - 7.0 - row as f64 * LABEL_ROW;
        let candidates: Vec<_> = (0..rows)
            .map(|row| TextBox::of(label, NOTE, (x, baseline(row)), "middle"))
            .collect();
        let row = placement.first_free(&candidates);
        write!(
            out,
            r#"<text class="note span-label" x="{}" y="{}" text-anchor="middle">{}</text>"#,
            Px(x),
            Px(baseline(row)),
            escape(label),
        )?;
    }
    Ok(())
}

/// How many rows of notes fit in half the plot's height: markers fill it
/// from the top, spans from the bottom.
fn label_rows(frame: Frame) -> usize {
    (((frame.y1 - frame.y0) / 2.0 / LABEL_ROW).floor() as usize).max(1)
}
