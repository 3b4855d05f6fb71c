//! The charts as SVG text: line charts over the run's seconds and the latency
//! histogram.
//!
//! Owns the chart geometry (size, margins), grid lines, ticks and labels, the
//! polylines with their hover points, the histogram's bars and percentile
//! markers, and a chart's legend. It must not choose what a chart shows (the
//! cards in `charts` do) nor compute scales (`plot` does).

use std::fmt::{self, Write as _};

use super::super::Report;
use super::plot::{Axis, LogAxis, log_buckets};
use super::text::{Esc, duration_label, ms, si};
use crate::os::thousands;

/// Bars of the latency histogram.
const HISTOGRAM_BINS: usize = 48;
/// Points up to which a line chart also marks each point (with a hover tooltip).
const MAX_MARKED_POINTS: usize = 90;

/// Chart size in SVG units (the page scales it to its width).
const W: f64 = 1080.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 18.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;

/// A line of a line chart; `class` picks its colour in the CSS.
pub(super) struct Series<'a> {
    pub(super) name: &'a str,
    pub(super) class: &'a str,
    pub(super) points: Vec<(f64, f64)>,
}

/// A line chart over the run's seconds, with a legend above it.
pub(super) struct LineChart<'a> {
    /// `data-chart` of the `<svg>`, for tests and styling.
    pub(super) id: &'a str,
    pub(super) label: &'a str,
    pub(super) height: f64,
    /// Drawn in order, the last on top.
    pub(super) series: Vec<Series<'a>>,
    /// The x axis (seconds since the load started); below 0 is the connect phase,
    /// drawn as a band.
    pub(super) x_min: f64,
    pub(super) x_max: f64,
    pub(super) integer_y: bool,
    pub(super) y_label: fn(f64) -> String,
    /// How a point's value reads in its tooltip.
    pub(super) value_text: fn(f64) -> String,
}

/// Legend above a chart: a colour swatch and a name per series.
fn legend(out: &mut String, series: &[(&str, &str)]) -> fmt::Result {
    out.push_str("<div class=\"legend\">");
    for (name, class) in series {
        write!(
            out,
            "<span><i class=\"sw {}\"></i>{}</span>",
            Esc(class),
            Esc(name)
        )?;
    }
    out.push_str("</div>\n");
    Ok(())
}

/// A grid line across the plot (`pw` wide) at height `y`, `label` left of it.
fn y_grid(out: &mut String, y: f64, pw: f64, label: &str) -> fmt::Result {
    write!(
        out,
        "<line class=\"grid\" x1=\"{LEFT:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/><text class=\"ytick\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
        LEFT + pw,
        LEFT - 8.0,
        y + 4.0,
        Esc(label)
    )
}

/// A tick at `x` below the plot's bottom edge (`bottom`), `label` under it.
fn x_tick(out: &mut String, x: f64, bottom: f64, label: &str) -> fmt::Result {
    write!(
        out,
        "<line class=\"tick\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{bottom:.1}\" y2=\"{:.1}\"/><text class=\"xtick\" x=\"{x:.1}\" y=\"{:.1}\">{}</text>",
        bottom + 5.0,
        bottom + 18.0,
        Esc(label)
    )
}

/// The x axis along the plot's bottom edge, `caption` (markup as it is) centred
/// under it at `caption_y`.
fn x_axis(out: &mut String, bottom: f64, pw: f64, caption_y: f64, caption: &str) -> fmt::Result {
    write!(
        out,
        "<line class=\"axis\" x1=\"{LEFT:.1}\" x2=\"{:.1}\" y1=\"{bottom:.1}\" y2=\"{bottom:.1}\"/><text class=\"xlabel\" x=\"{:.1}\" y=\"{caption_y:.1}\">{caption}</text>",
        LEFT + pw,
        LEFT + pw / 2.0,
    )
}

/// A line chart, its legend above it.
pub(super) fn line_chart(out: &mut String, c: &LineChart<'_>) -> fmt::Result {
    let h = c.height;
    let (pw, ph) = (W - LEFT - RIGHT, h - TOP - BOTTOM);
    let y_max = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let ya = Axis::nice(0.0, y_max, 5, c.integer_y);
    let xa = Axis::exact(c.x_min, c.x_max, 10);
    let x = |v: f64| LEFT + xa.frac(v) * pw;
    let y = |v: f64| TOP + (1.0 - ya.frac(v)) * ph;
    legend(
        out,
        &c.series
            .iter()
            .map(|s| (s.name, s.class))
            .collect::<Vec<_>>(),
    )?;
    writeln!(
        out,
        "<svg class=\"chart\" data-chart=\"{}\" viewBox=\"0 0 {W} {h}\" role=\"img\" aria-label=\"{}\">",
        Esc(c.id),
        Esc(c.label)
    )?;
    if xa.lo < 0.0 {
        let w = x(0.0_f64.min(xa.hi)) - LEFT;
        write!(
            out,
            "<rect class=\"band\" x=\"{LEFT:.1}\" y=\"{TOP:.1}\" width=\"{w:.1}\" height=\"{ph:.1}\"><title>connecting: {:.2} s</title></rect>",
            -xa.lo
        )?;
        if w >= 70.0 {
            write!(
                out,
                "<text class=\"band-label\" x=\"{:.1}\" y=\"{:.1}\">connecting</text>",
                LEFT + 6.0,
                TOP + 14.0
            )?;
        }
    }
    for t in ya.ticks() {
        y_grid(out, y(t), pw, &(c.y_label)(t))?;
    }
    for t in xa.ticks() {
        x_tick(out, x(t), TOP + ph, &si(t))?;
    }
    x_axis(out, TOP + ph, pw, h - 4.0, "seconds since the load started")?;
    for s in &c.series {
        if s.points.is_empty() {
            continue;
        }
        write!(out, "\n<polyline class=\"line {}\" points=\"", Esc(s.class))?;
        for (i, &(px, py)) in s.points.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(out, "{sep}{:.1},{:.1}", x(px), y(py))?;
        }
        out.push_str("\"/>");
        if s.points.len() <= MAX_MARKED_POINTS {
            write!(out, "<g class=\"dots {}\">", Esc(s.class))?;
            for &(px, py) in &s.points {
                write!(
                    out,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\"><title>{} at {:.1} s: {}</title></circle>",
                    x(px),
                    y(py),
                    Esc(s.name),
                    px,
                    Esc(&(c.value_text)(py))
                )?;
            }
            out.push_str("</g>");
        }
    }
    out.push_str("\n</svg>\n");
    Ok(())
}

/// The latency histogram on a log scale, with p50, p90 and p99 marked; a note
/// instead when there are no samples.
pub(super) fn histogram_chart(
    out: &mut String,
    pairs: &[[u64; 2]],
    report: &Report,
) -> fmt::Result {
    let l = &report.latency;
    let min = pairs.iter().filter(|p| p[1] > 0).map(|p| p[0]).min();
    let max = pairs.iter().filter(|p| p[1] > 0).map(|p| p[0]).max();
    let (Some(min), Some(max)) = (min, max) else {
        out.push_str("<p class=\"empty\">No latency samples in this run.</p>\n");
        return Ok(());
    };
    let axis = LogAxis::covering(min as f64, max as f64);
    let buckets = log_buckets(pairs, &axis, HISTOGRAM_BINS);
    let top = buckets.iter().map(|b| b.count).max().unwrap_or(0);
    let h = 280.0;
    let (pw, ph) = (W - LEFT - RIGHT, h - TOP - BOTTOM - 24.0);
    let top_y = TOP + 24.0;
    let ya = Axis::nice(0.0, top as f64, 4, true);
    let x = |v: f64| LEFT + axis.frac(v) * pw;
    let y = |v: f64| top_y + (1.0 - ya.frac(v)) * ph;
    writeln!(
        out,
        "<svg class=\"chart\" data-chart=\"histogram\" viewBox=\"0 0 {W} {h}\" role=\"img\" aria-label=\"latency histogram, log scale\">"
    )?;
    for t in ya.ticks() {
        y_grid(out, y(t), pw, &si(t))?;
    }
    for b in buckets.iter().filter(|b| b.count > 0) {
        let (x0, x1) = (x(b.from), x(b.to));
        let y0 = y(b.count as f64).min(top_y + ph - 2.0);
        write!(
            out,
            "<rect class=\"bar\" x=\"{:.1}\" y=\"{y0:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{} – {}: {} samples</title></rect>",
            x0 + 0.5,
            (x1 - x0 - 1.0).max(1.0),
            // A bar of a few samples beside one of thousands still shows.
            (top_y + ph - y0).max(2.0),
            Esc(&duration_label(b.from)),
            Esc(&duration_label(b.to)),
            thousands(b.count)
        )?;
    }
    for t in axis.ticks() {
        x_tick(out, x(t), top_y + ph, &duration_label(t))?;
    }
    x_axis(out, top_y + ph, pw, h - 4.0, "latency (log scale)")?;
    // Percentile markers, their labels in rows so that close ones do not overlap.
    let mut last_x = f64::NEG_INFINITY;
    let mut row = 0;
    for (name, us) in [("p50", l.median_us), ("p90", l.p90_us), ("p99", l.p99_us)] {
        let xx = x((us as f64).clamp(axis.lo, axis.hi));
        row = if xx - last_x < 120.0 {
            (row + 1) % 2
        } else {
            0
        };
        last_x = xx;
        let ly = TOP + 8.0 + row as f64 * 13.0;
        let (anchor, lx) = if xx > LEFT + pw - 110.0 {
            ("end", xx - 4.0)
        } else {
            ("start", xx + 4.0)
        };
        write!(
            out,
            "<line class=\"marker\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text class=\"marker-label\" text-anchor=\"{anchor}\" x=\"{lx:.1}\" y=\"{ly:.1}\">{name} {} ms</text>",
            ly - 9.0,
            top_y + ph,
            ms(us as f64)
        )?;
    }
    out.push_str("\n</svg>\n");
    Ok(())
}
