//! A bar plot: groups of vertical bars on one value axis from zero, each
//! bar labelled with its value, coloured by its name.

use std::fmt::{self, Write};

use super::{
    escape::escape,
    model::{Bar, BarPlot},
    number::{self, Px},
    scale::{Linear, Ticks, extent},
    svg::{self, Frame, Legend, LegendItem, Side, Swatch},
};

/// The share of a group's band its bars take.
const FILL: f64 = 0.72;
/// The widest a bar gets.
const MAX_BAR: f64 = 80.0;
/// The space between bars of one group.
const BAR_GAP: f64 = 3.0;
/// About how wide one character of a group label is, in pixels.
const CHAR_WIDTH: f64 = 6.8;
/// Size of the value labels.
const VALUE: f64 = 10.5;
/// The narrowest bar a value label is drawn on, turned upright: a line of
/// text is this wide. Narrower bars carry their value in their tooltip.
const UPRIGHT_LINE: f64 = 14.0;

/// How the value labels are set: across above each bar, or turned to read
/// upwards where a label is wider than its bar (so neighbours never touch).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Values {
    Across,
    Upright,
    Hidden,
}

/// Draws `plot` as an `<svg>`.
pub(crate) fn bar_plot(out: &mut String, plot: &BarPlot) -> fmt::Result {
    let names = bar_names(plot);
    let color = |name: &str| svg::color(names.iter().position(|n| *n == name).unwrap_or(0));
    let legend = legend(plot, &names);
    let staggered = staggered_labels(plot);
    let (values_set, widest) = value_labels(plot);
    // Upright labels stand above the bars: room for the longest.
    let above = if values_set == Values::Upright {
        (widest - 14.0).max(0.0)
    } else {
        0.0
    };
    let frame = Frame::new(
        68.0,
        24.0,
        26.0 + legend.height() + above,
        if staggered { 56.0 } else { 40.0 },
    );

    let values = plot
        .groups
        .iter()
        .flat_map(|(_, bars)| bars.iter().map(|b| b.value));
    let (lo, hi) = extent(values).unwrap_or((0.0, 0.0));
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let ticks = Ticks::nice(lo, hi, 5);
    let y = Linear::new((ticks.lo, ticks.hi), (frame.y1, frame.y0));
    let zero = y.map(0.0);

    svg::open(out, &plot.id, &plot.title)?;
    svg::value_axis(out, frame, &ticks, &y, Side::Left, &plot.unit)?;
    write!(
        out,
        r#"<line class="axis" x1="{}" x2="{}" y1="{z}" y2="{z}"/>"#,
        Px(frame.x0),
        Px(frame.x1),
        z = Px(zero),
    )?;
    let band = (frame.x1 - frame.x0) / plot.groups.len().max(1) as f64;
    for (g, (group, bars)) in plot.groups.iter().enumerate() {
        let centre = frame.x0 + band * (g as f64 + 0.5);
        group_bars(out, &y, (centre, band), (group, bars), values_set, &color)?;
        write!(
            out,
            r#"<text class="group" x="{}" y="{}" text-anchor="middle">{}</text>"#,
            Px(centre),
            Px(frame.y1 + if staggered && g % 2 == 1 { 36.0 } else { 20.0 }),
            escape(group),
        )?;
    }
    if plot.groups.iter().all(|(_, bars)| bars.is_empty()) {
        svg::no_data(out, frame)?;
    }
    legend.draw(out, frame.x0, 6.0)?;
    out.push_str("</svg>");
    Ok(())
}

/// The bar names, in order of first appearance: one colour per name.
fn bar_names(plot: &BarPlot) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for (_, bars) in &plot.groups {
        for bar in bars {
            if !names.contains(&bar.name.as_str()) {
                names.push(&bar.name);
            }
        }
    }
    names
}

/// A legend of the bar names, or none when every group has one bar at
/// most (the group label then names it).
fn legend(plot: &BarPlot, names: &[&str]) -> Legend {
    if !plot.groups.iter().any(|(_, bars)| bars.len() > 1) {
        return Legend::default();
    }
    let items = names.iter().enumerate().map(|(i, name)| LegendItem {
        label: (*name).to_owned(),
        color: svg::color(i),
        swatch: Swatch::Box,
    });
    Legend::new(items.collect(), svg::WIDTH - 140.0)
}

/// Whether the group labels alternate between two rows: they do when one
/// is wider than its band, so neighbours never overlap.
fn staggered_labels(plot: &BarPlot) -> bool {
    let bands = plot.groups.len().max(1) as f64;
    let widest = plot
        .groups
        .iter()
        .map(|(label, _)| label.chars().count() as f64 * CHAR_WIDTH)
        .fold(0.0, f64::max);
    widest > (svg::WIDTH - 68.0 - 24.0) / bands - 6.0
}

/// The bars' width in a group of `bars` in a band `band` wide, and the
/// gap between them.
fn slot(band: f64, bars: usize) -> (f64, f64) {
    let slot = (band * FILL / bars.max(1) as f64).min(MAX_BAR);
    let gap = if bars > 1 { BAR_GAP } else { 0.0 };
    (slot, gap)
}

/// How the value labels are set, and the widest one's width.
fn value_labels(plot: &BarPlot) -> (Values, f64) {
    let band = (svg::WIDTH - 68.0 - 24.0) / plot.groups.len().max(1) as f64;
    let mut narrowest = f64::MAX;
    let mut widest: f64 = 0.0;
    let mut across = true;
    for (_, bars) in &plot.groups {
        let (slot, gap) = slot(band, bars.len());
        narrowest = narrowest.min(slot - gap);
        for bar in bars {
            let width = svg::text_width(&number::value(bar.value), VALUE);
            widest = widest.max(width);
            across &= width + 4.0 <= slot - gap + BAR_GAP;
        }
    }
    let set = if across {
        Values::Across
    } else if narrowest >= UPRIGHT_LINE {
        Values::Upright
    } else {
        Values::Hidden
    };
    (set, widest)
}

/// One group's bars, side by side around the band's centre, each with its
/// value above it (below one that goes down), set as `values` says. `band`
/// is (centre, width).
fn group_bars(
    out: &mut String,
    y: &Linear,
    (centre, band): (f64, f64),
    (group, bars): (&str, &[Bar]),
    values: Values,
    color: &impl Fn(&str) -> &'static str,
) -> fmt::Result {
    let (slot, gap) = slot(band, bars.len());
    let start = centre - slot * bars.len() as f64 / 2.0;
    for (b, bar) in bars.iter().enumerate() {
        let value = if bar.value.is_finite() {
            bar.value
        } else {
            0.0
        };
        let left = start + slot * b as f64 + gap / 2.0;
        let width = slot - gap;
        let top = y.map(value.max(0.0));
        let bottom = y.map(value.min(0.0));
        write!(
            out,
            r#"<rect data-series="{}" x="{}" y="{}" width="{}" height="{}" rx="2" fill="{}"><title>{}: {}</title></rect>"#,
            escape(&bar.name),
            Px(left),
            Px(top),
            Px(width),
            Px(bottom - top),
            color(&bar.name),
            escape(group),
            number::value(value),
        )?;
        let x = left + width / 2.0;
        let text = number::value(value);
        match (values, value < 0.0) {
            (Values::Hidden, _) => {}
            (Values::Across, down) => write!(
                out,
                r#"<text class="value" x="{}" y="{}" text-anchor="middle">{text}</text>"#,
                Px(x),
                Px(if down { bottom + 13.0 } else { top - 5.0 }),
            )?,
            // Turned a quarter anticlockwise about its anchor, reading
            // upwards from the bar's top (downwards from a negative bar's
            // end), centred on the bar.
            (Values::Upright, down) => {
                let (at, anchor) = if down {
                    (bottom + 4.0, "end")
                } else {
                    (top - 4.0, "start")
                };
                write!(
                    out,
                    r#"<text class="value" x="{x}" y="{y}" text-anchor="{anchor}" dominant-baseline="central" transform="rotate(-90 {x} {y})">{text}</text>"#,
                    x = Px(x),
                    y = Px(at),
                )?;
            }
        }
    }
    Ok(())
}
