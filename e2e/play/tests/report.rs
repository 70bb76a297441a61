//! The report page: self-contained, escaped, every plot drawn with its data,
//! as headless Chromium sees it.
//!
//! Set `REPORT_OUT_DIR` to keep the rendered page and its screenshot there.

use std::path::{Path, PathBuf};

use flashsale_e2e::browser::{Chromium, file_url};
use flashsale_play::report::{
    Bar, BarPlot, Check, Marker, Report, Series, Span, TimePlot, render_html,
};

/// When the fixture run starts: 2025-10-09T08:53:20Z.
const START: i64 = 1_760_000_000_000;
/// Its length: five minutes.
const LENGTH: i64 = 300_000;
/// A title with every character HTML gives meaning to.
const TITLE: &str = r#"Flash sale flashsale-demo/play <&> "drop #1""#;
/// A failed check's detail with the same characters.
const DETAIL: &str = r#"p99 was 412 ms > 300 ms on "checkout" <&> during chaos"#;

fn at(seconds: f64) -> i64 {
    START + (seconds * 1000.0) as i64
}

/// Two hundred points over the run, one every 1.5 s.
fn over_time(value: impl Fn(f64) -> f64) -> Vec<(i64, f64)> {
    (0..200)
        .map(|i| {
            let s = f64::from(i) * 1.5;
            (at(s), value(s))
        })
        .collect()
}

fn tier(s: f64) -> f64 {
    match s {
        s if s < 60.0 => 0.0,
        s if s < 120.0 => 1.0,
        s if s < 150.0 => 2.0,
        s if s < 220.0 => 3.0,
        s if s < 260.0 => 1.0,
        _ => 0.0,
    }
}

/// What a played sale reports: load with degradation tiers, the SLO with
/// the chaos drill aborted by its guard, the funnel and latencies by route.
fn report() -> Report {
    let markers = drill_markers();
    Report {
        title: TITLE.into(),
        subtitle: "played 2025-10-09 08:53:20 UTC for 5 min on the local cluster; 20,000 buyers"
            .into(),
        summary: [
            ("buyers", "20,000"),
            ("orders paid", "4,870"),
            ("stock", "5,000 → 130 left"),
            ("peak load", "5,790 req/s"),
            ("highest tier", "3 (read-only catalogue)"),
            ("chaos drill", "aborted after 12 s by its SLO guard"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        checks: checks(),
        time_plots: vec![load_plot(markers.clone()), slo_plot(markers)],
        bar_plots: vec![funnel_plot(), latency_plot()],
    }
}

/// The drill's moments: chaos injected, then aborted by its guard.
fn drill_markers() -> Vec<Marker> {
    vec![
        Marker {
            at_ms: at(170.0),
            label: "chaos injected".into(),
        },
        Marker {
            at_ms: at(182.0),
            label: "aborted".into(),
        },
    ]
}

/// The stretches of each degradation tier above 0.
fn tier_spans() -> Vec<Span> {
    [
        (60.0, 120.0, "tier 1"),
        (120.0, 150.0, "tier 2"),
        (150.0, 220.0, "tier 3"),
        (220.0, 260.0, "tier 1"),
    ]
    .into_iter()
    .map(|(from, to, label)| Span {
        from_ms: at(from),
        to_ms: at(to),
        label: label.into(),
    })
    .collect()
}

/// The offered load at `s` seconds, peaking at 150 s.
fn demand(s: f64) -> f64 {
    600.0 + 5200.0 * (-((s - 150.0) / 70.0).powi(2)).exp() + 180.0 * (s / 7.0).sin()
}

/// Offered and admitted load against capacity, with the tiers on the right
/// axis.
fn load_plot(markers: Vec<Marker>) -> TimePlot {
    TimePlot {
        id: "load".into(),
        title: "Load & degradation".into(),
        left_label: "requests per second".into(),
        left: vec![
            Series {
                name: "offered".into(),
                // A scrape gap from 90 s to 96 s.
                points: over_time(|s| {
                    if (90.0..96.0).contains(&s) {
                        f64::NAN
                    } else {
                        demand(s)
                    }
                }),
            },
            Series {
                name: "admitted".into(),
                points: over_time(|s| (0.96 * demand(s)).min(4000.0 - 900.0 * tier(s))),
            },
        ],
        right_label: "degradation tier".into(),
        right: vec![Series {
            name: "tier".into(),
            points: over_time(tier),
        }],
        thresholds: vec![(4000.0, "capacity 4,000 req/s".into())],
        markers,
        spans: tier_spans(),
        range_ms: (START, START + LENGTH),
    }
}

/// Order latency against the SLO and the drill's abort guard; one series
/// has no points.
fn slo_plot(markers: Vec<Marker>) -> TimePlot {
    TimePlot {
        id: "slo".into(),
        title: "Order latency against the SLO".into(),
        left_label: "latency (ms)".into(),
        left: vec![
            Series {
                name: "p99".into(),
                points: over_time(|s| {
                    let chaos = if (170.0..186.0).contains(&s) {
                        330.0
                    } else {
                        0.0
                    };
                    120.0
                        + 60.0 * (-((s - 150.0) / 50.0).powi(2)).exp()
                        + chaos
                        + 12.0 * (s / 3.0).sin()
                }),
            },
            Series {
                name: "p50".into(),
                points: over_time(|_| 38.0),
            },
            Series {
                name: "shed".into(),
                points: Vec::new(),
            },
        ],
        thresholds: vec![
            (300.0, "SLO p99 300 ms".into()),
            (450.0, "abort guard 450 ms".into()),
        ],
        markers,
        range_ms: (START, START + LENGTH),
        ..TimePlot::default()
    }
}

/// The buyer funnel: one bar per stage.
fn funnel_plot() -> BarPlot {
    BarPlot {
        id: "funnel".into(),
        title: "Buyer funnel".into(),
        unit: "buyers".into(),
        groups: [
            ("visited", 20_000.0),
            ("queued", 14_250.0),
            ("admitted", 9_800.0),
            ("ordered", 5_012.0),
            ("paid", 4_870.0),
        ]
        .into_iter()
        .map(|(stage, value)| {
            (
                stage.to_owned(),
                vec![Bar {
                    name: "buyers".into(),
                    value,
                }],
            )
        })
        .collect(),
    }
}

/// Latency by route: three percentiles per route.
fn latency_plot() -> BarPlot {
    BarPlot {
        id: "latency".into(),
        title: "Latency by route".into(),
        unit: "milliseconds".into(),
        groups: [
            ("GET /queue", 4.2),
            ("POST /orders", 31.0),
            ("GET /orders/{id}", 6.5),
            ("POST /pay", 48.0),
        ]
        .into_iter()
        .map(|(route, p50): (&str, f64)| {
            let bars = [("p50", 1.0), ("p95", 3.4), ("p99", 7.9)]
                .into_iter()
                .map(|(name, factor)| Bar {
                    name: name.into(),
                    value: (p50 * factor * 10.0).round() / 10.0,
                })
                .collect();
            (route.to_owned(), bars)
        })
        .collect(),
    }
}

/// Three checks that held and one that failed, its detail full of
/// characters HTML gives meaning to.
fn checks() -> Vec<Check> {
    let check = |name: &str, passed: bool, detail: &str| Check {
        name: name.into(),
        passed,
        detail: detail.into(),
    };
    vec![
        check("stock is conserved", true, "5,000 = 4,870 sold + 130 left"),
        check(
            "no order is paid twice",
            true,
            "4,870 payments, 4,870 distinct orders",
        ),
        check(
            "the drill was aborted by its guard",
            true,
            "p99 451 ms > 450 ms at 182 s",
        ),
        check("p99 stays under the SLO", false, DETAIL),
    ]
}

/// Every series name of a report, per plot id.
fn plot_series(report: &Report) -> Vec<(String, Vec<String>)> {
    let time = report.time_plots.iter().map(|p| {
        let names = p.left.iter().chain(&p.right).map(|s| s.name.clone());
        (p.id.clone(), names.collect())
    });
    let bars = report.bar_plots.iter().map(|p| {
        let names = p
            .groups
            .iter()
            .flat_map(|(_, bars)| bars.iter().map(|b| b.name.clone()));
        (p.id.clone(), names.collect())
    });
    time.chain(bars).collect()
}

/// The opening tags `<name ...>` in `html`.
fn tags<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("<{name} ");
    html.match_indices(&open)
        .filter_map(|(start, _)| {
            html[start..]
                .find('>')
                .map(|end| &html[start..=start + end])
        })
        .collect()
}

/// An attribute's value in an opening tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    tag[start..].find('"').map(|end| &tag[start..start + end])
}

/// The markup of the plot with `id`, from its `<svg>` to its `</svg>`.
fn plot<'a>(html: &'a str, id: &str) -> Option<&'a str> {
    let start = html.find(&format!("data-plot=\"{id}\""))?;
    let start = html[..start].rfind("<svg")?;
    let end = html[start..].find("</svg>")?;
    Some(&html[start..start + end])
}

/// The names in a plot's legend.
fn legend(svg: &str) -> Vec<&str> {
    svg.split("<text class=\"legend\"")
        .skip(1)
        .filter_map(|rest| rest.split_once('>')?.1.split_once("</text>"))
        .map(|(name, _)| name)
        .collect()
}

/// Whether a plot's markup draws at least one series with data.
fn draws_data(svg: &str) -> bool {
    let line = tags(svg, "path").into_iter().any(|p| {
        attr(p, "data-series").is_some() && attr(p, "d").is_some_and(|d| !d.trim().is_empty())
    });
    let bar = tags(svg, "rect").into_iter().any(|r| {
        attr(r, "data-series").is_some()
            && attr(r, "height")
                .and_then(|h| h.parse::<f64>().ok())
                .is_some_and(|h| h > 0.0)
    });
    line || bar
}

/// Every number in the geometry attributes of `html`'s SVG is finite.
fn assert_finite_geometry(html: &str) {
    let names = [
        "x",
        "y",
        "x1",
        "x2",
        "y1",
        "y2",
        "width",
        "height",
        "d",
        "viewBox",
        "transform",
    ];
    for tag in ["svg", "path", "rect", "line", "text"]
        .into_iter()
        .flat_map(|t| tags(html, t))
    {
        for name in names {
            let Some(value) = attr(tag, name) else {
                continue;
            };
            let numbers = value
                .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
                .filter(|n| !n.is_empty());
            for number in numbers {
                assert!(
                    number.parse::<f64>().is_ok_and(f64::is_finite),
                    "{name}={value:?} in {tag}"
                );
            }
        }
    }
}

#[test]
fn the_page_is_self_contained() {
    let html = render_html(&report());
    for external in [
        "<script", "<link", "@import", "url(", "http://", "https://", "<img", "src=",
    ] {
        assert!(!html.contains(external), "{external} in the page");
    }
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<style>"), "the style is inline");
}

#[test]
fn every_text_is_escaped() {
    let html = render_html(&report());
    assert!(
        !html.contains(TITLE) && !html.contains(DETAIL),
        "raw text in the page"
    );
    let escaped_title = "Flash sale flashsale-demo/play &lt;&amp;&gt; &quot;drop #1&quot;";
    assert_eq!(
        html.matches(escaped_title).count(),
        2,
        "in <title> and <h1>"
    );
    assert!(
        html.contains(
            "p99 was 412 ms &gt; 300 ms on &quot;checkout&quot; &lt;&amp;&gt; during chaos"
        )
    );
    assert!(html.contains("Load &amp; degradation"), "plot titles too");
}

#[test]
fn the_header_summary_and_checks_are_shown() {
    let report = report();
    let html = render_html(&report);
    assert!(html.contains(&format!("<p class=\"subtitle\">{}</p>", report.subtitle)));
    for (label, value) in &report.summary {
        assert!(
            html.contains(&format!("<tr><th>{label}</th><td>{value}</td></tr>")),
            "{label}"
        );
    }
    assert_eq!(html.matches("data-check=\"pass\"").count(), 3);
    assert_eq!(html.matches("data-check=\"fail\"").count(), 1);
    assert!(html.contains("3 of 4 passed"));
}

#[test]
fn every_plot_is_marked_once_and_draws_each_series() {
    let report = report();
    let html = render_html(&report);
    for (id, series) in plot_series(&report) {
        assert_eq!(
            html.matches(&format!("data-plot=\"{id}\"")).count(),
            1,
            "{id}"
        );
        assert_eq!(html.matches(&format!(" id=\"{id}\"")).count(), 1, "{id}");
        let svg = plot(&html, &id).unwrap_or_default();
        assert!(draws_data(svg), "{id} draws data");
        for name in series {
            assert!(
                svg.contains(&format!("data-series=\"{name}\"")),
                "{id}: {name}"
            );
            assert!(
                svg.contains(&format!(">{name}")),
                "{id}: {name} in the legend or labels"
            );
        }
        let caption = report
            .time_plots
            .iter()
            .map(|p| (&p.id, &p.title))
            .chain(report.bar_plots.iter().map(|p| (&p.id, &p.title)))
            .find(|(pid, _)| **pid == id)
            .map(|(_, title)| title.replace('&', "&amp;"))
            .unwrap_or_default();
        assert!(
            html.contains(&format!("<figcaption>{caption}</figcaption>")),
            "{id}"
        );
    }
}

#[test]
fn time_plots_show_thresholds_markers_spans_and_the_right_axis() {
    let html = render_html(&report());
    let load = plot(&html, "load").unwrap_or_default();
    for label in [
        "capacity 4,000 req/s",
        "chaos injected",
        "aborted",
        "tier 1",
        "tier 2",
        "tier 3",
        "tier (right axis)",
        "degradation tier",
        "time since start (s)",
    ] {
        assert!(load.contains(&format!(">{label}</text>")), "{label}");
    }
    assert!(load.contains("stroke-dasharray"), "thresholds are dashed");
    assert_eq!(
        tags(load, "rect")
            .iter()
            .filter(|r| r.contains("class=\"span\""))
            .count(),
        4
    );
    // The gap in "offered" breaks its line: two runs, each starting with a move.
    let offered = tags(load, "path")
        .into_iter()
        .find(|p| attr(p, "data-series") == Some("offered"));
    let d = offered.and_then(|p| attr(p, "d")).unwrap_or_default();
    assert_eq!(d.matches('M').count(), 2, "{d}");
    // The tier is drawn in steps.
    let tier = tags(load, "path")
        .into_iter()
        .find(|p| attr(p, "data-series") == Some("tier"));
    assert!(
        tier.and_then(|p| attr(p, "d"))
            .is_some_and(|d| d.contains('H') && d.contains('V'))
    );
}

#[test]
fn bar_plots_label_values_and_name_series_in_a_legend() {
    let html = render_html(&report());
    let funnel = plot(&html, "funnel").unwrap_or_default();
    assert_eq!(
        tags(funnel, "rect")
            .iter()
            .filter(|r| r.contains("data-series=\"buyers\""))
            .count(),
        5
    );
    assert!(funnel.contains(">20,000</text>") && funnel.contains(">4,870</text>"));
    assert!(
        legend(funnel).is_empty(),
        "one bar per group needs no legend"
    );
    let latency = plot(&html, "latency").unwrap_or_default();
    for name in ["p50", "p95", "p99"] {
        assert_eq!(
            tags(latency, "rect")
                .iter()
                .filter(|r| r.contains(&format!("data-series=\"{name}\"")))
                .count(),
            4
        );
    }
    assert_eq!(legend(latency), ["p50", "p95", "p99"]);
    assert!(latency.contains(">GET /orders/{id}</text>") && latency.contains(">379</text>"));
}

#[test]
fn no_number_in_the_output_is_nan_or_infinite() {
    let html = render_html(&report());
    assert!(!html.contains("NaN") && !html.contains("inf"));
    assert_finite_geometry(&html);
}

#[test]
fn empty_constant_and_broken_data_render_cleanly() {
    let report = Report {
        title: "degenerate".into(),
        time_plots: degenerate_time_plots(),
        bar_plots: degenerate_bar_plots(),
        ..Report::default()
    };
    let html = render_html(&report);
    assert!(!html.contains("NaN") && !html.contains("inf"), "{html}");
    assert_finite_geometry(&html);
    for id in ["nothing", "odd", "clipped", "no-groups", "zeros"] {
        assert_eq!(
            html.matches(&format!("data-plot=\"{id}\"")).count(),
            1,
            "{id}"
        );
    }
    assert!(plot(&html, "nothing").is_some_and(|svg| svg.contains(">no data</text>")));
    assert!(plot(&html, "no-groups").is_some_and(|svg| svg.contains(">no data</text>")));
    let odd = plot(&html, "odd").unwrap_or_default();
    assert!(
        !odd.contains("before") && !odd.contains("backwards") && !odd.contains("nan threshold")
    );
    let clipped = plot(&html, "clipped").unwrap_or_default();
    assert!(
        !clipped.contains("1,000,000,000"),
        "points outside the range do not stretch the axis"
    );
    assert!(draws_data(clipped));
}

/// A series named `name` with `points`.
fn series(name: &str, points: Vec<(i64, f64)>) -> Series {
    Series {
        name: name.into(),
        points,
    }
}

/// Time plots with no data ("nothing"), no range, constant, broken and
/// out-of-range data ("odd"), and points before their range ("clipped").
fn degenerate_time_plots() -> Vec<TimePlot> {
    vec![
        TimePlot {
            id: "nothing".into(),
            left: vec![series("empty", Vec::new())],
            ..TimePlot::default()
        },
        TimePlot {
            id: "odd".into(),
            // No range: the data's own.
            range_ms: (START, START),
            left: vec![
                series("constant", vec![(START, 7.0), (START + 1000, 7.0)]),
                series(
                    "gaps",
                    vec![
                        (START, f64::NAN),
                        (START + 500, f64::INFINITY),
                        (START + 700, 3.0),
                    ],
                ),
            ],
            right: vec![series("zero", vec![(START, 0.0), (START + 1000, 0.0)])],
            thresholds: vec![(f64::NAN, "nan threshold".into())],
            markers: vec![Marker {
                at_ms: START - 1,
                label: "before".into(),
            }],
            spans: vec![Span {
                from_ms: START + 900,
                to_ms: START + 100,
                label: "backwards".into(),
            }],
            ..TimePlot::default()
        },
        TimePlot {
            id: "clipped".into(),
            range_ms: (START, START + 1000),
            left: vec![series(
                "partly outside",
                vec![(START - 5000, 1e9), (START, 1.0), (START + 500, 2.0)],
            )],
            ..TimePlot::default()
        },
    ]
}

/// Bar plots with no groups, and with zero, NaN, negative and missing bars.
fn degenerate_bar_plots() -> Vec<BarPlot> {
    vec![
        BarPlot {
            id: "no-groups".into(),
            ..BarPlot::default()
        },
        BarPlot {
            id: "zeros".into(),
            groups: vec![
                (
                    "a".into(),
                    vec![Bar {
                        name: "x".into(),
                        value: 0.0,
                    }],
                ),
                (
                    "b".into(),
                    vec![
                        Bar {
                            name: "x".into(),
                            value: f64::NAN,
                        },
                        Bar {
                            name: "y".into(),
                            value: -2.0,
                        },
                    ],
                ),
                ("c".into(), Vec::new()),
            ],
            ..BarPlot::default()
        },
    ]
}

/// Where the page and its screenshot go: `REPORT_OUT_DIR`, or a temp dir.
fn out_dir() -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match std::env::var_os("REPORT_OUT_DIR") {
        Some(dir) => {
            let dir = std::path::absolute(dir)?;
            std::fs::create_dir_all(&dir)?;
            Ok((dir, None))
        }
        None => {
            let temp = tempfile::tempdir()?;
            Ok((temp.path().to_owned(), Some(temp)))
        }
    }
}

fn write_page(dir: &Path) -> anyhow::Result<String> {
    let page = dir.join("report.html");
    std::fs::write(&page, render_html(&report()))?;
    Ok(file_url(&page)?)
}

#[tokio::test]
async fn chromium_renders_every_plot_with_its_data() -> anyhow::Result<()> {
    let chromium = Chromium::find().await?;
    let (dir, _temp) = out_dir()?;
    let dom = chromium.dump_dom(&write_page(&dir)?).await?;
    for (id, series) in plot_series(&report()) {
        let svg =
            plot(&dom, &id).ok_or_else(|| anyhow::anyhow!("no plot {id} in the DOM: {dom}"))?;
        assert!(draws_data(svg), "{id} draws data in the DOM: {svg}");
        for name in series {
            assert!(
                svg.contains(&format!("data-series=\"{name}\"")),
                "{id}: {name}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn chromium_screenshots_the_page() -> anyhow::Result<()> {
    let chromium = Chromium::find().await?;
    let (dir, _temp) = out_dir()?;
    let png = dir.join("report.png");
    chromium
        .screenshot(&write_page(&dir)?, &png, 1040, 2400)
        .await?;
    let bytes = std::fs::read(&png)?;
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
    assert!(
        bytes.len() > 10_000,
        "a real picture, not a blank: {} bytes",
        bytes.len()
    );
    Ok(())
}

/// A run whose drill ended by the end of the load, as a short scenario's
/// does: four moments within 12 s of each other at the SLO plot's right
/// edge, tiers changing every few seconds at the load plot's end, and
/// latencies whose value labels are wider than their bars and close in
/// height.
fn crowded_report() -> Report {
    let mut report = report();
    let end = LENGTH as f64 / 1000.0;
    let markers: Vec<Marker> = [
        (end - 12.0, "chaos injected"),
        (end - 8.0, "guard aborts"),
        (end - 7.5, "chaos gone"),
        (end - 1.0, "gateways up"),
    ]
    .into_iter()
    .map(|(s, label)| Marker {
        at_ms: at(s),
        label: label.into(),
    })
    .collect();
    for plot in &mut report.time_plots {
        plot.markers = markers.clone();
    }
    report.time_plots[0].spans = [
        (end - 20.0, end - 15.0, "tier 1"),
        (end - 15.0, end - 11.0, "tier 2"),
        (end - 11.0, end - 7.0, "tier 3"),
        (end - 7.0, end - 3.0, "tier 2"),
    ]
    .into_iter()
    .map(|(from, to, label)| Span {
        from_ms: at(from),
        to_ms: at(to),
        label: label.into(),
    })
    .collect();
    report.bar_plots[1].groups = [
        "/chat/messages",
        "/games",
        "/items/{sku}",
        "/orders",
        "/orders/history",
        "/orders/{id}/pay",
        "/payments/callback",
        "/queue/status",
        "/recommendations",
    ]
    .iter()
    .enumerate()
    .map(|(i, route)| {
        let base = 0.81 + 0.023 * i as f64;
        let bars = [("p50", 1.0), ("p95", 1.04), ("p99", 1.09)]
            .into_iter()
            .map(|(name, factor)| Bar {
                name: name.into(),
                value: base * factor,
            })
            .collect();
        ((*route).to_owned(), bars)
    })
    .collect();
    report
}

/// A script that lists every pair of `<text>` elements of one plot whose
/// boxes, as Chromium lays them out, intersect, into `<pre id="overlaps">`.
const OVERLAPS: &str = r#"<script>
(() => {
  const found = [];
  for (const svg of document.querySelectorAll('svg')) {
    const boxes = [...svg.querySelectorAll('text')]
      .map(t => [t.textContent, t.getBoundingClientRect()])
      .filter(([, r]) => r.width > 0 && r.height > 0);
    for (let i = 0; i < boxes.length; i++) {
      for (let j = i + 1; j < boxes.length; j++) {
        const [a, r] = boxes[i];
        const [b, s] = boxes[j];
        const w = Math.min(r.right, s.right) - Math.max(r.left, s.left);
        const h = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
        if (w > 0.5 && h > 0.5) found.push(`${svg.id}: "${a}" and "${b}"`);
      }
    }
  }
  const out = document.createElement('pre');
  out.id = 'overlaps';
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
})();
</script>"#;

#[tokio::test]
async fn no_two_labels_overlap_in_chromium_even_when_moments_and_values_crowd() -> anyhow::Result<()>
{
    let chromium = Chromium::find().await?;
    let (dir, _temp) = out_dir()?;
    for (name, report) in [("report", report()), ("crowded", crowded_report())] {
        let page = dir.join(format!("{name}-overlaps.html"));
        let html = render_html(&report).replace("</body>", &format!("{OVERLAPS}</body>"));
        std::fs::write(&page, html)?;
        let dom = chromium.dump_dom(&file_url(&page)?).await?;
        let start = dom
            .find(r#"<pre id="overlaps">"#)
            .ok_or_else(|| anyhow::anyhow!("the script did not run: {dom}"))?;
        let listed = &dom[start + r#"<pre id="overlaps">"#.len()..];
        let listed = &listed[..listed.find("</pre>").unwrap_or(listed.len())];
        let listed = listed
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&");
        let overlaps: Vec<String> = serde_json::from_str(&listed)?;
        assert!(overlaps.is_empty(), "{name}: labels overlap: {overlaps:#?}");
    }
    Ok(())
}
