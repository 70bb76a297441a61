//! Pieces the plots share: the frame, the value axis, the legend, paths
//! with gaps and the placement of labels that could overlap.

use std::fmt::{self, Write};

use super::{
    escape::escape,
    number::{self, Px},
    scale::{Linear, Ticks},
};

/// A plot's size in pixels (the page scales it to fit).
pub(crate) const WIDTH: f64 = 900.0;
/// See [`WIDTH`].
pub(crate) const HEIGHT: f64 = 300.0;

/// Series colours: calm, and told apart by most colour-blind readers.
const PALETTE: [&str; 8] = [
    "#3b6ea5", "#e08a3c", "#4c9a6a", "#c4555a", "#7a68a6", "#4aa3a8", "#a57c52", "#c9a227",
];

/// Height of one legend row.
const LEGEND_ROW: f64 = 18.0;

/// The colour of the `index`th series.
pub(crate) fn color(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

/// About how wide `text` is at `size` px in a system sans-serif font.
pub(crate) fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.6
}

/// Where the data is drawn inside the plot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    /// Left edge.
    pub x0: f64,
    /// Right edge.
    pub x1: f64,
    /// Top edge.
    pub y0: f64,
    /// Bottom edge.
    pub y1: f64,
}

impl Frame {
    /// The plot area left by margins on each side.
    pub fn new(left: f64, right: f64, top: f64, bottom: f64) -> Self {
        Self {
            x0: left,
            x1: WIDTH - right,
            y0: top,
            y1: HEIGHT - bottom,
        }
    }
}

/// Opens a plot's `<svg>`, marked with its id for the page and its tests.
pub(crate) fn open(out: &mut String, id: &str, title: &str) -> fmt::Result {
    let id = escape(id);
    write!(
        out,
        r#"<svg class="plot" id="{id}" data-plot="{id}" viewBox="0 0 {w} {h}" role="img" aria-label="{title}">"#,
        w = Px(WIDTH),
        h = Px(HEIGHT),
        title = escape(title),
    )
}

/// Which side a value axis is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Left, with grid lines across the plot.
    Left,
    /// Right, labels only.
    Right,
}

/// A value axis: tick labels, its rotated label and, on the left, grid lines.
pub(crate) fn value_axis(
    out: &mut String,
    frame: Frame,
    ticks: &Ticks,
    y: &Linear,
    side: Side,
    label: &str,
) -> fmt::Result {
    let decimals = ticks.decimals();
    let mut widest: f64 = 0.0;
    for value in ticks.values() {
        let py = Px(y.map(value));
        let text = number::tick(value, decimals);
        widest = widest.max(text_width(&text, 11.0));
        match side {
            Side::Left => write!(
                out,
                r#"<line class="grid" x1="{}" x2="{}" y1="{py}" y2="{py}"/><text class="tick" x="{}" y="{py}" dy="0.32em" text-anchor="end">{text}</text>"#,
                Px(frame.x0),
                Px(frame.x1),
                Px(frame.x0 - 8.0),
            )?,
            Side::Right => write!(
                out,
                r#"<text class="tick" x="{}" y="{py}" dy="0.32em">{text}</text>"#,
                Px(frame.x1 + 8.0),
            )?,
        }
    }
    let middle = Px((frame.y0 + frame.y1) / 2.0);
    // Just clear of the widest tick label.
    let (x, angle) = match side {
        Side::Left => ((frame.x0 - widest - 22.0).max(12.0), -90),
        Side::Right => ((frame.x1 + widest + 22.0).min(WIDTH - 12.0), 90),
    };
    write!(
        out,
        r#"<text class="axis-label" transform="translate({} {middle}) rotate({angle})" text-anchor="middle">{}</text>"#,
        Px(x),
        escape(label),
    )
}

/// How a legend entry shows its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Swatch {
    /// A short line.
    Line,
    /// A small step.
    Step,
    /// A filled square.
    Box,
}

/// One legend entry.
#[derive(Debug, Clone)]
pub(crate) struct LegendItem {
    /// What it names.
    pub label: String,
    /// The series' colour.
    pub color: &'static str,
    /// How the series is drawn.
    pub swatch: Swatch,
}

/// Legend entries laid out in rows that fit a width.
#[derive(Debug, Default)]
pub(crate) struct Legend {
    /// Each row's entries with their offset from the row's start.
    rows: Vec<Vec<(f64, LegendItem)>>,
}

impl Legend {
    /// Lays `items` out left to right, wrapping at `width`.
    pub fn new(items: Vec<LegendItem>, width: f64) -> Self {
        let mut rows: Vec<Vec<(f64, LegendItem)>> = Vec::new();
        let mut offset = 0.0;
        for item in items {
            let item_width = 24.0 + text_width(&item.label, 12.0) + 18.0;
            match rows.last_mut() {
                Some(row) if offset + item_width <= width => row.push((offset, item)),
                _ => {
                    rows.push(vec![(0.0, item)]);
                    offset = 0.0;
                }
            }
            offset += item_width;
        }
        Self { rows }
    }

    /// The height the legend takes (nothing when it is empty).
    pub fn height(&self) -> f64 {
        self.rows.len() as f64 * LEGEND_ROW
    }

    /// Draws the legend with its first row's top left at (`x`, `y`).
    pub fn draw(&self, out: &mut String, x: f64, y: f64) -> fmt::Result {
        for (r, row) in self.rows.iter().enumerate() {
            let middle = y + LEGEND_ROW * (r as f64 + 0.5);
            for (offset, item) in row {
                let left = x + offset;
                let color = item.color;
                match item.swatch {
                    Swatch::Line => write!(
                        out,
                        r#"<line x1="{}" x2="{}" y1="{my}" y2="{my}" stroke="{color}" stroke-width="2.5" stroke-linecap="round"/>"#,
                        Px(left + 1.0),
                        Px(left + 17.0),
                        my = Px(middle),
                    )?,
                    Swatch::Step => write!(
                        out,
                        r#"<path d="M{} {}H{}V{}H{}" fill="none" stroke="{color}" stroke-width="2" stroke-linejoin="round"/>"#,
                        Px(left + 1.0),
                        Px(middle + 4.0),
                        Px(left + 9.0),
                        Px(middle - 4.0),
                        Px(left + 17.0),
                    )?,
                    Swatch::Box => write!(
                        out,
                        r#"<rect x="{}" y="{}" width="12" height="12" rx="2" fill="{color}"/>"#,
                        Px(left + 3.0),
                        Px(middle - 6.0),
                    )?,
                }
                write!(
                    out,
                    r#"<text class="legend" x="{}" y="{}" dy="0.32em">{}</text>"#,
                    Px(left + 24.0),
                    Px(middle),
                    escape(&item.label),
                )?;
            }
        }
        Ok(())
    }
}

/// An SVG path's data, with gaps: a line breaks where the pen is lifted.
#[derive(Debug, Default)]
pub(crate) struct PathData {
    d: String,
    /// Points drawn since the pen last went down.
    run: usize,
}

impl PathData {
    /// Draws a line to (`x`, `y`), or starts one after a gap.
    pub fn line_to(&mut self, x: f64, y: f64) {
        let command = if self.run == 0 { 'M' } else { 'L' };
        self.push(command, x, y);
    }

    /// Draws a step to (`x`, `y`): across at the old level, then up or
    /// down; or starts one after a gap.
    pub fn step_to(&mut self, x: f64, y: f64) {
        if self.run == 0 {
            self.push('M', x, y);
        } else {
            let _ = write!(self.d, "H{}V{}", Px(x), Px(y));
            self.run += 1;
        }
    }

    /// Breaks the line here.
    pub fn lift(&mut self) {
        // A lone point between gaps shows as a dot (with round caps).
        if self.run == 1 {
            self.d.push_str("h0");
        }
        self.run = 0;
    }

    /// The `d` attribute (empty when nothing was drawn).
    pub fn finish(mut self) -> String {
        self.lift();
        self.d
    }

    fn push(&mut self, command: char, x: f64, y: f64) {
        // Writing into a String cannot fail.
        let _ = write!(self.d, "{command}{} {}", Px(x), Px(y));
        self.run += 1;
    }
}

/// A note in the middle of a plot without data.
pub(crate) fn no_data(out: &mut String, frame: Frame) -> fmt::Result {
    write!(
        out,
        r#"<text class="empty" x="{}" y="{}" text-anchor="middle">no data</text>"#,
        Px((frame.x0 + frame.x1) / 2.0),
        Px((frame.y0 + frame.y1) / 2.0),
    )
}

/// The box a text line takes, as the page's fonts draw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TextBox {
    /// Left edge.
    pub left: f64,
    /// Right edge.
    pub right: f64,
    /// Top edge.
    pub top: f64,
    /// Bottom edge.
    pub bottom: f64,
}

impl TextBox {
    /// The box of `text` at `size` pixels whose anchor point, on the
    /// baseline, is `(x, baseline)`; `anchor` is SVG's `text-anchor`.
    pub fn of(text: &str, size: f64, (x, baseline): (f64, f64), anchor: &str) -> Self {
        let width = text_width(text, size);
        let left = match anchor {
            "end" => x - width,
            "middle" => x - width / 2.0,
            _ => x,
        };
        // Ascent and descent of the system sans-serif fonts.
        Self {
            left,
            right: left + width,
            top: baseline - size * 0.93,
            bottom: baseline + size * 0.24,
        }
    }

    /// Whether the two boxes overlap, or come closer side by side than a
    /// small gap.
    fn near(&self, other: &Self) -> bool {
        const GAP: f64 = 3.0;
        self.left < other.right + GAP
            && other.left < self.right + GAP
            && self.top < other.bottom
            && other.top < self.bottom
    }
}

/// Labels placed on a plot so that none touches another.
#[derive(Debug, Default)]
pub(crate) struct Placement(Vec<TextBox>);

impl Placement {
    /// Takes `place` whatever else is there (a label that cannot move).
    pub fn fix(&mut self, place: TextBox) {
        self.0.push(place);
    }

    /// Takes the first of `candidates` that touches nothing placed so far
    /// and returns its index; the last one when every one does.
    pub fn first_free(&mut self, candidates: &[TextBox]) -> usize {
        let index = candidates
            .iter()
            .position(|c| !self.0.iter().any(|taken| taken.near(c)))
            .unwrap_or(candidates.len().saturating_sub(1));
        if let Some(&chosen) = candidates.get(index) {
            self.0.push(chosen);
        }
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_break_at_gaps_and_show_lone_points() {
        let mut path = PathData::default();
        path.line_to(0.0, 10.0);
        path.line_to(5.0, 12.26);
        path.lift();
        path.line_to(20.0, 1.0);
        path.lift();
        path.lift();
        assert_eq!(path.finish(), "M0 10L5 12.3M20 1h0");
    }

    #[test]
    fn steps_go_across_then_up_or_down() {
        let mut path = PathData::default();
        path.step_to(0.0, 50.0);
        path.step_to(10.0, 40.0);
        path.step_to(30.0, 40.0);
        assert_eq!(path.finish(), "M0 50H10V40H30V40");
    }

    #[test]
    fn an_empty_path_has_no_data() {
        assert_eq!(PathData::default().finish(), "");
    }

    #[test]
    fn a_label_takes_the_first_place_free_of_every_other() {
        let at =
            |x: f64, row: f64| TextBox::of("chaos gone", 11.0, (x, 20.0 + 14.0 * row), "start");
        let rows = |x: f64| [at(x, 0.0), at(x, 1.0), at(x, 2.0), at(x, 3.0)];
        let mut placed = Placement::default();
        placed.fix(TextBox::of("abort guard", 11.0, (100.0, 34.0), "start"));
        // Row 0 is free; row 1 holds the fixed label, so the next close
        // one skips it; one far to the right takes row 0 again.
        assert_eq!(placed.first_free(&rows(0.0)), 0);
        assert_eq!(placed.first_free(&rows(40.0)), 2);
        assert_eq!(placed.first_free(&rows(60.0)), 3);
        assert_eq!(placed.first_free(&rows(400.0)), 0);
        // With no free place, the last candidate.
        assert_eq!(placed.first_free(&rows(50.0)), 3);
    }

    #[test]
    fn legends_wrap_to_fit() {
        let item = |label: &str| LegendItem {
            label: label.to_owned(),
            color: color(0),
            swatch: Swatch::Line,
        };
        let legend = Legend::new(vec![item("requests per second"); 6], 400.0);
        assert_eq!(legend.height(), 3.0 * LEGEND_ROW);
        assert_eq!(Legend::new(Vec::new(), 400.0).height(), 0.0);
    }
}
