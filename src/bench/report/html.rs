//! `throng bench --report FILE.html`: the run's report as one self-contained page.
//!
//! This module owns that page: its layout and CSS, the SVG charts (drawn here as
//! text: axis scaling with "nice" ticks, the latency histogram's log-scale buckets,
//! the per-second line charts) and the escaping of every string put in it. The page
//! loads nothing (no script, font, stylesheet or image from anywhere), so it opens
//! the same from a laptop, a CI artifact or an archive years later.
//!
//! It must not measure, run or print anything: the driver hands it a finished
//! [`Report`], the histogram's `[value, count]` pairs and the settings, and writes
//! the string [`render`] returns.

use std::fmt::{self, Display, Write as _};

use super::{Machine, Phase, Report, TimelineSample};
use crate::os::thousands;

/// Everything one page shows.
pub struct Page<'a> {
    pub report: &'a Report,
    /// The merged latency histogram in µs, as `[value, count]` pairs.
    pub latency_pairs: &'a [[u64; 2]],
    /// The run's settings, in the order shown: (name, value).
    pub settings: &'a [(&'static str, String)],
    pub machine: &'a Machine,
    /// The command line, as [`command_line`] writes it.
    pub command: &'a str,
    /// When the run started (seconds since the Unix epoch).
    pub started_unix_secs: u64,
}

/// Most points a line chart draws; longer timelines are averaged down to this, so a
/// day-long soak still makes a page of a few hundred kB.
const MAX_POINTS: usize = 600;
/// Bars of the latency histogram.
const HISTOGRAM_BINS: usize = 48;
/// Points up to which a line chart also marks each point (with a hover tooltip).
const MAX_MARKED_POINTS: usize = 90;

// ------------------------------------------------------------------ escaping

/// Text made safe to put in HTML text and in quoted attribute values: `& < > " '`
/// become entities, control characters (but tab and newline) U+FFFD.
pub struct Esc<'a>(pub &'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(|c: char| {
            matches!(c, '&' | '<' | '>' | '"' | '\'') || (c.is_control() && c != '\n' && c != '\t')
        }) {
            f.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().unwrap_or('\u{FFFD}');
            f.write_str(match c {
                '&' => "&amp;",
                '<' => "&lt;",
                '>' => "&gt;",
                '"' => "&quot;",
                '\'' => "&#39;",
                _ => "\u{FFFD}",
            })?;
            rest = &rest[i + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// [`Esc`] as a `String`.
pub fn escape(s: &str) -> String {
    Esc(s).to_string()
}

/// The command line for the page: the program as `throng`, arguments quoted for a
/// POSIX shell, and the values of `--api-key` and `--token` (secrets) replaced by
/// `***`.
const SECRET_FLAGS: [&str; 2] = ["--api-key", "--token"];

pub fn command_line(argv: &[String]) -> String {
    let mut out = vec!["throng".to_string()];
    let mut hide_next = false;
    for arg in argv.iter().skip(1) {
        if hide_next {
            out.push("***".into());
            hide_next = false;
        } else if SECRET_FLAGS.contains(&arg.as_str()) {
            out.push(arg.clone());
            hide_next = true;
        } else if let Some(flag) = SECRET_FLAGS.iter().find(|f| {
            arg.strip_prefix(**f)
                .is_some_and(|rest| rest.starts_with('='))
        }) {
            out.push(format!("{flag}=***"));
        } else {
            out.push(shell_quote(arg));
        }
    }
    out.join(" ")
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=,@%+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

// ------------------------------------------------------------------ numbers

/// A tick label or a big number: 950, 1.5k, 12k, 3.2M.
fn si(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if x.abs() >= 100.0 || x.fract() == 0.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{x:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    format!("{text}{unit}")
}

/// A rate for the summary: thousands separators from 100 up, one decimal below.
fn rate(v: f64) -> String {
    if v >= 100.0 {
        thousands(v.round() as u64)
    } else {
        format!("{v:.1}")
    }
}

/// Microseconds as milliseconds with three decimals (the text report's form).
fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

/// A latency axis label: 250 µs, 1.5 ms, 2 s.
fn duration_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", si(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", si(us / 1e3))
    } else {
        format!("{} µs", si(us))
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` for seconds since the Unix epoch.
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

// ------------------------------------------------------------------ scaling

/// The smallest 1, 2 or 5 × 10^k at least `raw` (> 0).
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let f = raw / p;
    let n = if f <= 1.0 + 1e-9 {
        1.0
    } else if f <= 2.0 + 1e-9 {
        2.0
    } else if f <= 5.0 + 1e-9 {
        5.0
    } else {
        10.0
    };
    n * p
}

/// A linear axis from `lo` to `hi`, ticks every `step`; all three "nice" numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
}

impl Axis {
    /// Covers `min..=max` with about `ticks` intervals; `integer` keeps the step
    /// at 1 or more (counts of things).
    fn nice(min: f64, max: f64, ticks: usize, integer: bool) -> Axis {
        let (min, max) = if min.is_finite() && max.is_finite() && max > min {
            (min, max)
        } else {
            let m = if min.is_finite() { min } else { 0.0 };
            (m, m + 1.0)
        };
        let mut step = nice_step((max - min) / ticks.max(1) as f64);
        if integer {
            step = step.max(1.0);
        }
        let lo = (min / step).floor() * step;
        let mut hi = (max / step).ceil() * step;
        if hi <= lo {
            hi = lo + step;
        }
        Axis { lo, hi, step }
    }

    /// Exactly `min..=max` (a time axis that ends where the data ends), ticks on
    /// the multiples of a nice step inside it.
    fn exact(min: f64, max: f64, ticks: usize) -> Axis {
        let nice = Axis::nice(min, max, ticks, true);
        let (lo, hi) = if max > min {
            (min, max)
        } else {
            (nice.lo, nice.hi)
        };
        Axis {
            lo,
            hi,
            step: nice.step,
        }
    }

    /// The multiples of `step` from `lo` to `hi`.
    fn ticks(&self) -> Vec<f64> {
        let first = (self.lo / self.step - 1e-9).ceil() as i64;
        let last = (self.hi / self.step + 1e-9).floor() as i64;
        // Rounded to the step's decimals: 3 × 0.1 is 0.30000000000000004.
        let scale = 10f64.powi((-self.step.log10().floor()).max(0.0) as i32);
        (first..=last)
            .map(|i| {
                let v = (i as f64 * self.step * scale).round() / scale;
                if v == 0.0 { 0.0 } else { v }
            })
            .collect()
    }

    /// Where `v` sits, 0 at `lo` and 1 at `hi`.
    fn frac(&self, v: f64) -> f64 {
        (v - self.lo) / (self.hi - self.lo)
    }
}

/// A log-scale axis between two 1-2-5 values `lo < hi`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LogAxis {
    lo: f64,
    hi: f64,
}

/// The 1-2-5 values of decade `10^e`.
fn one_two_five(e: i32) -> [f64; 3] {
    let p = 10f64.powi(e);
    [p, 2.0 * p, 5.0 * p]
}

impl LogAxis {
    /// From the largest 1-2-5 value at most `min` to the smallest above `max`, so
    /// that buckets `[from, to)` hold every value.
    fn covering(min: f64, max: f64) -> LogAxis {
        let min = min.max(1.0);
        let max = max.max(min);
        let e = min.log10().floor() as i32;
        let lo = (e - 1..=e + 1)
            .flat_map(one_two_five)
            .filter(|&v| v <= min * (1.0 + 1e-12))
            .fold(1.0, f64::max);
        let e = max.log10().floor() as i32;
        let hi = (e..=e + 1)
            .flat_map(one_two_five)
            .find(|&v| v > max)
            .unwrap_or(max * 2.0);
        LogAxis { lo, hi }
    }

    fn frac(&self, v: f64) -> f64 {
        (v / self.lo).ln() / (self.hi / self.lo).ln()
    }

    /// Tick values: 1-2-5 per decade over up to 2.5 decades, powers of ten over
    /// more; a narrow axis (fewer than 3 of those) gets linear ticks instead.
    fn ticks(&self) -> Vec<f64> {
        let decades = (self.hi / self.lo).log10();
        let (e0, e1) = (
            self.lo.log10().floor() as i32,
            self.hi.log10().ceil() as i32,
        );
        let inside = |v: &f64| *v >= self.lo * (1.0 - 1e-9) && *v <= self.hi * (1.0 + 1e-9);
        let mut t: Vec<f64> = if decades <= 2.5 {
            (e0..=e1).flat_map(one_two_five).filter(inside).collect()
        } else {
            (e0..=e1).map(|e| 10f64.powi(e)).filter(inside).collect()
        };
        if t.len() < 3 {
            t = Axis::nice(self.lo, self.hi, 5, false)
                .ticks()
                .into_iter()
                .filter(|v| *v > 0.0 && inside(v))
                .collect();
        }
        t
    }
}

/// One histogram bar: the samples in `[from, to)` µs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    from: f64,
    to: f64,
    count: u64,
}

/// The histogram's `[value, count]` pairs summed into `bins` buckets of equal
/// width on `axis`'s log scale.
fn log_buckets(pairs: &[[u64; 2]], axis: &LogAxis, bins: usize) -> Vec<Bucket> {
    let bins = bins.max(1);
    let ratio = axis.hi / axis.lo;
    let mut out: Vec<Bucket> = (0..bins)
        .map(|i| Bucket {
            from: axis.lo * ratio.powf(i as f64 / bins as f64),
            to: axis.lo * ratio.powf((i + 1) as f64 / bins as f64),
            count: 0,
        })
        .collect();
    for &[value, count] in pairs {
        let i = (axis.frac(value.max(1) as f64) * bins as f64).floor();
        let i = (i.max(0.0) as usize).min(bins - 1);
        out[i].count += count;
    }
    out
}

/// A timeline averaged down to at most `max` samples (groups of consecutive
/// samples: rates and latency averaged, counts as of the group's end).
fn downsample(samples: &[TimelineSample], max: usize) -> Vec<TimelineSample> {
    if samples.len() <= max || max == 0 {
        return samples.to_vec();
    }
    let group = samples.len().div_ceil(max);
    samples
        .chunks(group)
        .filter_map(|chunk| {
            let last = *chunk.last()?;
            let n = chunk.len() as f64;
            let lat: Vec<f64> = chunk.iter().filter_map(|s| s.latency_avg_us).collect();
            Some(TimelineSample {
                received_per_sec: chunk.iter().map(|s| s.received_per_sec).sum::<f64>() / n,
                sent_per_sec: chunk.iter().map(|s| s.sent_per_sec).sum::<f64>() / n,
                pings_per_sec: chunk.iter().map(|s| s.pings_per_sec).sum::<f64>() / n,
                latency_avg_us: (!lat.is_empty())
                    .then(|| lat.iter().sum::<f64>() / lat.len() as f64),
                ..last
            })
        })
        .collect()
}

// ------------------------------------------------------------------ charts

/// Chart size in SVG units (the page scales it to its width).
const W: f64 = 1080.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 18.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;

/// A line of a line chart; `class` picks its colour in the CSS.
struct Series<'a> {
    name: &'a str,
    class: &'a str,
    points: Vec<(f64, f64)>,
}

struct LineChart<'a> {
    /// `data-chart` of the `<svg>`, for tests and styling.
    id: &'a str,
    label: &'a str,
    height: f64,
    /// Drawn in order, the last on top.
    series: Vec<Series<'a>>,
    /// The x axis (seconds since the load started); below 0 is the connect phase,
    /// drawn as a band.
    x_min: f64,
    x_max: f64,
    integer_y: bool,
    y_label: fn(f64) -> String,
    /// How a point's value reads in its tooltip.
    value_text: fn(f64) -> String,
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

fn line_chart(out: &mut String, c: &LineChart<'_>) -> fmt::Result {
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
        let yy = y(t);
        write!(
            out,
            "<line class=\"grid\" x1=\"{LEFT:.1}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/><text class=\"ytick\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + pw,
            LEFT - 8.0,
            yy + 4.0,
            Esc(&(c.y_label)(t))
        )?;
    }
    for t in xa.ticks() {
        let xx = x(t);
        write!(
            out,
            "<line class=\"tick\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text class=\"xtick\" x=\"{xx:.1}\" y=\"{:.1}\">{}</text>",
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 18.0,
            Esc(&si(t))
        )?;
    }
    write!(
        out,
        "<line class=\"axis\" x1=\"{LEFT:.1}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text class=\"xlabel\" x=\"{:.1}\" y=\"{:.1}\">seconds since the load started</text>",
        LEFT + pw,
        TOP + ph,
        TOP + ph,
        LEFT + pw / 2.0,
        h - 4.0
    )?;
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

fn histogram_chart(out: &mut String, pairs: &[[u64; 2]], report: &Report) -> fmt::Result {
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
        let yy = y(t);
        write!(
            out,
            "<line class=\"grid\" x1=\"{LEFT:.1}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/><text class=\"ytick\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + pw,
            LEFT - 8.0,
            yy + 4.0,
            Esc(&si(t))
        )?;
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
        let xx = x(t);
        write!(
            out,
            "<line class=\"tick\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text class=\"xtick\" x=\"{xx:.1}\" y=\"{:.1}\">{}</text>",
            top_y + ph,
            top_y + ph + 5.0,
            top_y + ph + 18.0,
            Esc(&duration_label(t))
        )?;
    }
    write!(
        out,
        "<line class=\"axis\" x1=\"{LEFT:.1}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text class=\"xlabel\" x=\"{:.1}\" y=\"{:.1}\">latency (log scale)</text>",
        LEFT + pw,
        top_y + ph,
        top_y + ph,
        LEFT + pw / 2.0,
        h - 4.0
    )?;
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

// ------------------------------------------------------------------ the page

const CSS: &str = r#"
:root{--bg:#f3f5f9;--card:#fff;--ink:#18212f;--muted:#5f6b7a;--faint:#8a95a5;--line:#e6e9ef;
--blue:#2f6fdf;--green:#16a06a;--violet:#7b4fd8;--amber:#d48806;--red:#d64545}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1180px;margin:0 auto;padding:30px 28px 36px}
header{display:flex;justify-content:space-between;align-items:flex-end;gap:24px;flex-wrap:wrap}
h1{font-size:26px;line-height:1.2;margin:0 0 6px;font-weight:700;letter-spacing:-.015em}
h1 .mode{color:var(--blue)}
.sub{color:var(--muted);word-break:break-all}
.sub b{color:var(--ink);font-weight:600}
.badge{display:inline-block;padding:5px 12px;border-radius:999px;font-size:13px;font-weight:650;white-space:nowrap}
.badge.ok{background:#ddf4e8;color:#0d7a4e}.badge.bad{background:#fde4e4;color:#b42323}
.strip{display:grid;grid-template-columns:repeat(auto-fit,minmax(190px,1fr));gap:14px;margin:22px 0 18px}
.stat,.card{background:var(--card);border-radius:14px;box-shadow:0 1px 2px rgba(20,30,50,.06),0 2px 8px rgba(20,30,50,.04)}
.stat{padding:14px 18px;border-top:3px solid var(--blue)}
.stat.green{border-top-color:var(--green)}.stat.violet{border-top-color:var(--violet)}
.stat.amber{border-top-color:var(--amber)}.stat.red{border-top-color:var(--red)}
.stat .label{color:var(--muted);font-size:11.5px;font-weight:600;text-transform:uppercase;letter-spacing:.06em}
.stat .value{font-size:30px;font-weight:700;line-height:1.25;margin-top:2px;font-variant-numeric:tabular-nums;white-space:nowrap}
.stat .unit{font-size:14px;color:var(--muted);font-weight:500;margin-left:4px}
.stat .note{color:var(--muted);font-size:12.5px}
.card{padding:18px 22px 14px;margin:0 0 16px}
h2{font-size:16px;margin:0 0 2px;font-weight:650}
.hint{color:var(--muted);font-size:12.5px;margin:0 0 10px}
.cols{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:0 16px;align-items:start}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
tr:last-child>td,tr:last-child>th{border-bottom:0}
.num{text-align:right;white-space:nowrap}
table.kv th{color:var(--muted);font-weight:500;width:44%}
table.kv td{word-break:break-word}
table.pct{margin:6px 0 14px}
table.pct th{color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.05em;text-align:right}
table.pct td{font-size:20px;font-weight:650;text-align:right}
table.pct td small{font-size:12px;color:var(--muted);font-weight:500;margin-left:2px}
.legend{display:flex;gap:18px;font-size:12.5px;color:var(--muted);margin:4px 0 2px;justify-content:flex-end}
.sw{display:inline-block;width:14px;height:4px;border-radius:2px;margin-right:6px;vertical-align:middle;background:currentColor}
svg.chart{display:block;width:100%;height:auto;overflow:visible}
svg text{font-size:11.5px;fill:var(--muted);font-family:inherit}
svg .ytick{text-anchor:end}svg .xtick,svg .xlabel{text-anchor:middle}
svg .xlabel{fill:var(--faint)}
svg .grid{stroke:var(--line);stroke-width:1}
svg .tick{stroke:#b8c0cc}svg .axis{stroke:#9aa4b2;stroke-width:1}
svg .band{fill:#eef1f6}svg .band-label{fill:var(--faint);font-size:11px}
svg .line{fill:none;stroke-width:2.2;stroke-linejoin:round;stroke-linecap:round}
svg .line.sent{stroke-dasharray:7 5;stroke-width:2}
svg .dots circle{stroke:#fff;stroke-width:1.5}
svg .bar{fill:var(--blue);opacity:.85}svg .bar:hover{opacity:1}
svg .marker{stroke:var(--ink);stroke-width:1;stroke-dasharray:3 3;opacity:.55}
svg .marker-label{fill:var(--ink);font-size:11px;font-weight:600}
.recv{color:var(--blue);stroke:var(--blue);fill:var(--blue)}
.sent{color:var(--green);stroke:var(--green);fill:var(--green)}
.open{color:var(--violet);stroke:var(--violet);fill:var(--violet)}
.lost{color:var(--red);stroke:var(--red);fill:var(--red)}
.lat{color:var(--amber);stroke:var(--amber);fill:var(--amber)}
.ping{color:var(--faint);stroke:var(--faint);fill:var(--faint)}
svg .line.ping{stroke-dasharray:2 4;stroke-width:1.6}
svg .line.recv,svg .line.sent,svg .line.open,svg .line.lost,svg .line.lat,svg .line.ping{fill:none}
.good{color:#0d7a4e}.badtext{color:#b42323}
.empty{color:var(--muted);margin:6px 0 10px}
.rule{color:var(--faint);font-size:12px;margin:8px 0 0}
footer{color:var(--muted);font-size:12.5px;margin-top:8px}
code{font:12.5px/1.6 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#e9edf3;color:var(--ink);
padding:6px 10px;border-radius:8px;display:block;white-space:pre-wrap;word-break:break-all;margin:6px 0 10px}
@media (max-width:760px){.cols{grid-template-columns:1fr}}
@media print{body{background:#fff}.stat,.card{box-shadow:none;border:1px solid var(--line)}}
"#;

/// The whole page.
pub fn render(page: &Page<'_>) -> String {
    let mut out = String::with_capacity(64 * 1024);
    // Writing into a String cannot fail.
    let _ = write_page(&mut out, page);
    out
}

fn write_page(out: &mut String, page: &Page<'_>) -> fmt::Result {
    let r = page.report;
    let title = format!(
        "throng bench {}{} · {} connections",
        r.mode,
        r.transport
            .as_deref()
            .map_or(String::new(), |t| format!(" over {t}")),
        thousands(r.conns)
    );
    writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>",
        Esc(&title)
    )?;
    header(out, page)?;
    summary_strip(out, r)?;
    latency_section(out, page)?;
    timeline_sections(out, r)?;
    // Two columns of cards: errors and push's fan-out (or the totals) side by
    // side, then the settings beside the machine (and push's totals).
    out.push_str("<div class=\"cols\">\n<div>\n");
    failures_section(out, r)?;
    out.push_str("</div>\n<div>\n");
    if r.push.is_some() {
        fanout_section(out, r)?;
    } else {
        totals_section(out, r)?;
    }
    out.push_str("</div>\n</div>\n<div class=\"cols\">\n<div>\n");
    settings_section(out, page)?;
    out.push_str("</div>\n<div>\n");
    machine_section(out, page)?;
    if r.push.is_some() {
        totals_section(out, r)?;
    }
    out.push_str("</div>\n</div>\n");
    writeln!(
        out,
        "<footer>Command:<code>{}</code>Made by throng {} · every figure is counted on the client side; the JSON report (<b>--json</b>) holds the same numbers.</footer>\n</main>\n</body>\n</html>",
        Esc(page.command),
        env!("CARGO_PKG_VERSION")
    )
}

fn header(out: &mut String, page: &Page<'_>) -> fmt::Result {
    let r = page.report;
    let transport = r
        .transport
        .as_deref()
        .map_or(String::new(), |t| format!(" over {t}"));
    let (class, verdict) = if r.errors == 0 {
        ("ok", "no errors".to_string())
    } else {
        (
            "bad",
            format!(
                "{} error{}",
                thousands(r.errors),
                if r.errors == 1 { "" } else { "s" }
            ),
        )
    };
    writeln!(
        out,
        "<header><div><h1>throng bench <span class=\"mode\">{}</span>{}</h1><div class=\"sub\"><b>{}</b> · {} connections · {:.1} s of load · {}</div></div><span class=\"badge {class}\">{}</span></header>",
        Esc(&r.mode),
        Esc(&transport),
        Esc(&r.url),
        thousands(r.conns),
        r.duration_secs,
        Esc(&utc(page.started_unix_secs)),
        Esc(&verdict)
    )
}

fn stat(
    out: &mut String,
    color: &str,
    label: &str,
    value: &str,
    unit: &str,
    note: &str,
) -> fmt::Result {
    writeln!(
        out,
        "<div class=\"stat {}\"><div class=\"label\">{}</div><div class=\"value\">{}<span class=\"unit\">{}</span></div><div class=\"note\">{}</div></div>",
        Esc(color),
        Esc(label),
        Esc(value),
        Esc(unit),
        Esc(note)
    )
}

fn summary_strip(out: &mut String, r: &Report) -> fmt::Result {
    out.push_str("<section class=\"strip\">\n");
    stat(
        out,
        "violet",
        "Connections open",
        &thousands(r.opened),
        &format!("/ {}", thousands(r.conns)),
        &if r.dropped > 0 {
            format!(
                "{} failed · {} dropped",
                thousands(r.failed),
                thousands(r.dropped)
            )
        } else {
            format!(
                "in {:.2} s · {} failed",
                r.connect_secs,
                thousands(r.failed)
            )
        },
    )?;
    let sent_name = if r.push.is_some() {
        "published"
    } else {
        "sent"
    };
    stat(
        out,
        "",
        "Received",
        &rate(r.throughput_msgs_per_sec),
        "msg/s",
        &format!("{sent_name} {} msg/s", rate(r.sent_per_sec)),
    )?;
    let l = &r.latency;
    if l.samples > 0 {
        stat(
            out,
            "amber",
            "Latency p50",
            &ms(l.median_us as f64),
            "ms",
            &format!("p99 {} · max {}", ms(l.p99_us as f64), ms(l.max_us as f64)),
        )?;
    } else {
        stat(out, "amber", "Latency", "–", "", "no latency samples")?;
    }
    stat(
        out,
        if r.errors == 0 { "green" } else { "red" },
        "Error rate",
        &format!("{:.3}", r.error_rate_pct),
        "%",
        &format!(
            "{} errors / {} samples",
            thousands(r.errors),
            thousands(r.samples)
        ),
    )?;
    if let Some(p) = &r.push {
        let pct = if p.expected_deliveries > 0 {
            format!(
                "{:.2}",
                p.delivered as f64 * 100.0 / p.expected_deliveries as f64
            )
        } else {
            "–".into()
        };
        stat(
            out,
            if p.lost + p.duplicated == 0 {
                "green"
            } else {
                "red"
            },
            "Delivered",
            &pct,
            "%",
            &format!(
                "{} lost · {} duplicated",
                thousands(p.lost),
                thousands(p.duplicated)
            ),
        )?;
    } else if r.mode == "idle" {
        stat(
            out,
            "green",
            "Pings answered",
            &thousands(r.pings),
            "",
            &format!("{} sockets open at the end", thousands(r.sockets)),
        )?;
    } else {
        stat(
            out,
            "green",
            "Messages",
            &si(r.messages_total as f64),
            "received",
            &format!("{} sent", thousands(r.messages_sent)),
        )?;
    }
    out.push_str("</section>\n");
    Ok(())
}

fn latency_section(out: &mut String, page: &Page<'_>) -> fmt::Result {
    let l = &page.report.latency;
    let what = match page.report.mode.as_str() {
        "echo" => "From sending a message to its echo",
        "push" => "From publishing to delivery",
        "chat" => "From sending to the sender's own copy of the broadcast",
        _ => "Idle connections send nothing and measure no latency; they answer pings",
    };
    out.push_str("<section class=\"card\" id=\"latency\"><h2>Latency</h2>");
    if l.samples > 0 {
        writeln!(
            out,
            "<p class=\"hint\">{}, over {} samples (HDR histogram, 3 significant digits).</p>",
            Esc(what),
            thousands(l.samples)
        )?;
    } else {
        writeln!(out, "<p class=\"hint\">{}.</p>", Esc(what))?;
    }
    if l.samples > 0 {
        out.push_str("<table class=\"pct\"><tr>");
        let cells = [
            ("avg", "avg_us", l.avg_us.to_string(), l.avg_us),
            (
                "p50",
                "median_us",
                l.median_us.to_string(),
                l.median_us as f64,
            ),
            ("p90", "p90_us", l.p90_us.to_string(), l.p90_us as f64),
            ("p95", "p95_us", l.p95_us.to_string(), l.p95_us as f64),
            ("p99", "p99_us", l.p99_us.to_string(), l.p99_us as f64),
            ("max", "max_us", l.max_us.to_string(), l.max_us as f64),
        ];
        for (name, ..) in &cells {
            write!(out, "<th>{name}</th>")?;
        }
        out.push_str("</tr><tr>");
        for (_, key, raw, us) in &cells {
            write!(
                out,
                "<td data-key=\"{key}\" data-us=\"{}\">{}<small>ms</small></td>",
                Esc(raw),
                ms(*us)
            )?;
        }
        out.push_str("</tr></table>\n");
    }
    histogram_chart(out, page.latency_pairs, page.report)?;
    out.push_str("</section>\n");
    Ok(())
}

/// Where each sample's interval starts: at the previous sample, but not before its
/// phase began (the load at 0, the connect phase at `-connect_secs`).
fn interval_starts(samples: &[TimelineSample], connect_secs: f64) -> Vec<f64> {
    let mut prev = -connect_secs;
    samples
        .iter()
        .map(|s| {
            let phase_start = match s.phase {
                Phase::Connect => -connect_secs,
                Phase::Load => 0.0,
            };
            let start = prev.max(phase_start).min(s.t_secs);
            prev = s.t_secs;
            start
        })
        .collect()
}

fn timeline_sections(out: &mut String, r: &Report) -> fmt::Result {
    let samples = downsample(&r.timeline, MAX_POINTS);
    if samples.is_empty() {
        out.push_str("<section class=\"card\"><h2>Over time</h2><p class=\"empty\">The run was too short for a per-second timeline.</p></section>\n");
        return Ok(());
    }
    let connecting = samples.iter().any(|s| s.phase == Phase::Connect);
    let starts = interval_starts(&samples, r.connect_secs);
    let x_min = if connecting {
        starts.first().copied().unwrap_or(0.0).min(0.0)
    } else {
        0.0
    };
    let x_max = samples.last().map_or(1.0, |s| s.t_secs).max(x_min + 1e-3);
    // Rates and averages belong to their interval: drawn at its middle. Counts of
    // open connections are as of the sample's moment.
    let over_interval = |f: &dyn Fn(&TimelineSample) -> Option<f64>| -> Vec<(f64, f64)> {
        samples
            .iter()
            .zip(&starts)
            .filter_map(|(s, start)| Some(((start + s.t_secs) / 2.0, f(s)?)))
            .collect()
    };
    let at_moment = |f: &dyn Fn(&TimelineSample) -> f64| -> Vec<(f64, f64)> {
        samples.iter().map(|s| (s.t_secs, f(s))).collect()
    };
    let per_sec = |v: f64| format!("{} msg/s", rate(v));
    let sent_name = if r.push.is_some() {
        "published"
    } else {
        "sent"
    };
    let averaged = if samples.len() < r.timeline.len() {
        " (averaged to fit)"
    } else {
        ""
    };
    let band = if connecting {
        "; the shaded band is the connect phase"
    } else {
        ""
    };
    writeln!(
        out,
        "<section class=\"card\" id=\"throughput\"><h2>Messages per second</h2><p class=\"hint\">Data messages received by the connections, and {sent_name} {}, in each second{averaged}{band}; dotted, the server's pings the connections answered, when it sent any.</p>",
        if r.push.is_some() {
            "by the publisher"
        } else {
            "by them"
        },
    )?;
    let mut series = vec![
        Series {
            name: "received",
            class: "recv",
            points: over_interval(&|s| Some(s.received_per_sec)),
        },
        Series {
            name: sent_name,
            class: "sent",
            points: over_interval(&|s| Some(s.sent_per_sec)),
        },
    ];
    // The server's pings, when it sent any: spread evenly they are a flat line,
    // bunched (a server that lets a stall synchronise them) a comb.
    if samples.iter().any(|s| s.pings_per_sec > 0.0) {
        series.push(Series {
            name: "server pings",
            class: "ping",
            points: over_interval(&|s| Some(s.pings_per_sec)),
        });
    }
    line_chart(
        out,
        &LineChart {
            id: "throughput",
            label: "messages per second over time",
            height: 260.0,
            series,
            x_min,
            x_max,
            integer_y: false,
            y_label: si,
            value_text: per_sec,
        },
    )?;
    out.push_str("</section>\n");

    let mut series = vec![Series {
        name: "open",
        class: "open",
        points: at_moment(&|s| s.open as f64),
    }];
    if samples.iter().any(|s| s.failed + s.dropped > 0) {
        series.push(Series {
            name: "failed + dropped (so far)",
            class: "lost",
            points: at_moment(&|s| (s.failed + s.dropped) as f64),
        });
    }
    writeln!(
        out,
        "<section class=\"card\" id=\"connections\"><h2>Open connections</h2><p class=\"hint\">Connections open at the end of each second{band}.</p>"
    )?;
    line_chart(
        out,
        &LineChart {
            id: "connections",
            label: "open connections over time",
            height: 230.0,
            series,
            x_min,
            x_max,
            integer_y: true,
            y_label: si,
            value_text: |v| thousands(v as u64),
        },
    )?;
    out.push_str("</section>\n");

    let latency = over_interval(&|s| s.latency_avg_us);
    if !latency.is_empty() {
        out.push_str("<section class=\"card\" id=\"latency-timeline\"><h2>Average latency per second</h2><p class=\"hint\">The mean of the latency samples taken in each second (the percentiles above are over the whole run).</p>\n");
        line_chart(
            out,
            &LineChart {
                id: "latency-timeline",
                label: "average latency per second",
                height: 220.0,
                series: vec![Series {
                    name: "average latency",
                    class: "lat",
                    points: latency,
                }],
                x_min,
                x_max,
                integer_y: false,
                y_label: duration_label,
                value_text: duration_label,
            },
        )?;
        out.push_str("</section>\n");
    }
    Ok(())
}

fn kv_rows(out: &mut String, rows: &[(&str, String)]) -> fmt::Result {
    out.push_str("<table class=\"kv\">");
    for (k, v) in rows {
        write!(out, "<tr><th>{}</th><td>{}</td></tr>", Esc(k), Esc(v))?;
    }
    out.push_str("</table>\n");
    Ok(())
}

fn failures_section(out: &mut String, r: &Report) -> fmt::Result {
    writeln!(
        out,
        "<section class=\"card\" id=\"failures\"><h2>Errors</h2><p class=\"hint\">Error rate <b class=\"{}\">{:.3} %</b>: {} errors over {} samples.</p>",
        if r.errors == 0 { "good" } else { "badtext" },
        r.error_rate_pct,
        thousands(r.errors),
        thousands(r.samples)
    )?;
    let mut reasons: Vec<(String, u64)> = r.failures.iter().map(|(k, v)| (k.clone(), *v)).collect();
    if let Some(p) = &r.push {
        reasons.extend(
            p.publish_errors_by_reason
                .iter()
                .map(|(k, v)| (format!("publish: {k}"), *v)),
        );
    }
    if r.dropped > 0 {
        reasons.push(("dropped after opening".into(), r.dropped));
    }
    if r.lost_messages > 0 {
        reasons.push(("messages lost".into(), r.lost_messages));
    }
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if reasons.is_empty() {
        out.push_str(
            "<p class=\"good\">No connection failed or dropped, no message was lost.</p>\n",
        );
    } else {
        out.push_str("<table><tr><th>reason</th><th class=\"num\">count</th></tr>");
        for (reason, n) in &reasons {
            write!(
                out,
                "<tr><td>{}</td><td class=\"num\">{}</td></tr>",
                Esc(reason),
                thousands(*n)
            )?;
        }
        out.push_str("</table>\n");
    }
    writeln!(
        out,
        "<p class=\"rule\">Error rate = {}.</p></section>",
        Esc(r.error_rule)
    )
}

fn fanout_section(out: &mut String, r: &Report) -> fmt::Result {
    let Some(p) = &r.push else {
        return Ok(());
    };
    out.push_str("<section class=\"card\" id=\"fanout\"><h2>Fan-out</h2><p class=\"hint\">Checked from each delivery's place in its channel.</p>\n");
    let mut rows = vec![
        ("published", thousands(p.published)),
        ("publishes failed", thousands(p.publish_errors)),
        ("expected deliveries", thousands(p.expected_deliveries)),
        ("delivered", thousands(p.delivered)),
        ("lost", thousands(p.lost)),
        ("duplicated", thousands(p.duplicated)),
        ("out of order", thousands(p.out_of_order)),
        ("reconnects", thousands(p.reconnects)),
        (
            "gaps reported by the server",
            thousands(p.server_reported_gaps),
        ),
    ];
    if p.foreign_seqs > 0 {
        rows.push(("channels with others' publishes", thousands(p.foreign_seqs)));
    }
    if p.comeback.lost > 0 {
        let cb = &p.comeback;
        rows.push(("let go by the server", thousands(cb.lost)));
        rows.push(("came back", thousands(cb.back)));
        rows.push((
            "time away (median / p99 / max)",
            format!(
                "{} / {} / {} ms",
                cb.away_median_ms, cb.away_p99_ms, cb.away_max_ms
            ),
        ));
        rows.push((
            "reconnect attempts (peak per 100 ms)",
            format!(
                "{} ({})",
                thousands(cb.attempts),
                thousands(cb.peak_attempts_per_100ms)
            ),
        ));
    }
    kv_rows(out, &rows)?;
    out.push_str("</section>\n");
    Ok(())
}

fn totals_section(out: &mut String, r: &Report) -> fmt::Result {
    out.push_str("<section class=\"card\" id=\"totals\"><h2>Totals</h2><p class=\"hint\">The seeds' stats block and the client's own cost.</p>\n");
    let mut rows = vec![
        ("sockets open at the end", thousands(r.sockets)),
        ("frames received", thousands(r.frames_total)),
        ("messages received", thousands(r.messages_total)),
        ("messages per minute", rate(r.messages_per_min)),
        ("messages sent", thousands(r.messages_sent)),
        (
            "connections",
            format!(
                "{} attempted, {} opened",
                thousands(r.attempted),
                thousands(r.opened)
            ),
        ),
    ];
    if r.pings > 0 {
        rows.push(("pings received", thousands(r.pings)));
    }
    rows.push((
        "client CPU",
        format!(
            "{:.2} s ({:.1} % of one core)",
            r.client_cpu_secs, r.client_cpu_pct_of_one_core
        ),
    ));
    rows.push((
        "client max RSS",
        format!(
            "{} kB{}",
            thousands(r.client_max_rss_kb),
            r.client_rss_per_conn_bytes
                .map(|b| format!(" ({b:.0} B per connection)"))
                .unwrap_or_default()
        ),
    ));
    kv_rows(out, &rows)?;
    out.push_str("</section>\n");
    Ok(())
}

fn settings_section(out: &mut String, page: &Page<'_>) -> fmt::Result {
    out.push_str("<section class=\"card\" id=\"settings\"><h2>Settings</h2><p class=\"hint\">The run as it was asked for.</p>\n");
    let rows: Vec<(&str, String)> = page.settings.iter().map(|(k, v)| (*k, v.clone())).collect();
    kv_rows(out, &rows)?;
    out.push_str("</section>\n");
    Ok(())
}

fn machine_section(out: &mut String, page: &Page<'_>) -> fmt::Result {
    let m = page.machine;
    let r = page.report;
    let or_unknown = |s: &str| {
        if s.is_empty() {
            "unknown".to_string()
        } else {
            s.to_string()
        }
    };
    out.push_str("<section class=\"card\" id=\"machine\"><h2>Machine</h2><p class=\"hint\">Where the bench ran (the client side).</p>\n");
    kv_rows(
        out,
        &[
            ("host", or_unknown(&m.hostname)),
            ("cores", m.cores.to_string()),
            ("CPU", or_unknown(&m.cpu_model)),
            ("kernel", or_unknown(&m.kernel)),
            (
                "memory",
                if m.memory_kb > 0 {
                    format!("{:.1} GiB", m.memory_kb as f64 / 1024.0 / 1024.0)
                } else {
                    "unknown".into()
                },
            ),
            (
                "bench processes × threads",
                format!("{} × {}", r.processes, r.threads),
            ),
            ("started", utc(page.started_unix_secs)),
        ],
    )?;
    out.push_str("</section>\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_quotes_and_control_characters() {
        assert_eq!(
            escape(r#"<script>alert("x&'y')</script>"#),
            "&lt;script&gt;alert(&quot;x&amp;&#39;y&#39;)&lt;/script&gt;"
        );
        assert_eq!(escape("plain µs text"), "plain µs text");
        assert_eq!(escape("a\u{0}b\u{1b}c\nd"), "a\u{FFFD}b\u{FFFD}c\nd");
        assert_eq!(escape(""), "");
        assert_eq!(format!("<td>{}</td>", Esc("é<")), "<td>é&lt;</td>");
    }

    #[test]
    fn command_lines_are_quoted_and_hide_the_api_key() {
        let argv: Vec<String> = [
            "/x/throng",
            "bench",
            "push",
            "--url",
            "http://h:1/sse/{channel}",
            "--api-key",
            "s3cret",
            "--api-key=other",
            "--token=eyJ.x.y",
            "--token",
            "eyJ.z.w",
            "it's",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let c = command_line(&argv);
        assert_eq!(
            c,
            r"throng bench push --url 'http://h:1/sse/{channel}' --api-key *** --api-key=*** --token=*** --token *** 'it'\''s'"
        );
        assert!(!c.contains("s3cret") && !c.contains("other") && !c.contains("eyJ"));
    }

    #[test]
    fn nice_steps_and_linear_axes() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(17.4), 20.0);
        assert_eq!(nice_step(2000.0), 2000.0);
        let a = Axis::nice(0.0, 87.0, 5, false);
        assert_eq!((a.lo, a.hi, a.step), (0.0, 100.0, 20.0));
        assert_eq!(a.ticks(), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(a.frac(50.0), 0.5);
        // Small ranges: fractional steps, or 1 for counts.
        let a = Axis::nice(0.0, 0.3, 5, false);
        assert_eq!(a.ticks(), vec![0.0, 0.1, 0.2, 0.3]);
        let a = Axis::nice(0.0, 2.0, 5, true);
        assert_eq!((a.step, a.hi), (1.0, 2.0));
        // Nothing to show: still an axis.
        let a = Axis::nice(0.0, 0.0, 5, true);
        assert!(a.hi > a.lo && a.ticks().len() >= 2);
        // A max on a step stays the top.
        assert_eq!(Axis::nice(0.0, 10.0, 10, true).hi, 10.0);
    }

    #[test]
    fn exact_axes_end_where_the_data_ends() {
        let a = Axis::exact(-2.8, 4.0, 10);
        assert_eq!((a.lo, a.hi, a.step), (-2.8, 4.0, 1.0));
        assert_eq!(a.ticks(), vec![-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!((a.frac(0.0) - 2.8 / 6.8).abs() < 1e-12);
        let a = Axis::exact(0.0, 125.0, 10);
        assert_eq!(a.step, 20.0);
        assert_eq!(a.ticks().last(), Some(&120.0));
        assert_eq!(a.hi, 125.0);
    }

    #[test]
    fn sample_intervals_start_at_the_previous_sample_or_their_phase() {
        let at = |t: f64, phase| TimelineSample {
            t_secs: t,
            phase,
            open: 0,
            received_per_sec: 0.0,
            sent_per_sec: 0.0,
            pings_per_sec: 0.0,
            latency_avg_us: None,
            failed: 0,
            dropped: 0,
        };
        let s = [
            at(-1.8, Phase::Connect),
            at(-0.8, Phase::Connect),
            at(1.0, Phase::Load),
            at(2.0, Phase::Load),
        ];
        assert_eq!(interval_starts(&s, 2.8), vec![-2.8, -1.8, 0.0, 1.0]);
        assert_eq!(interval_starts(&s[2..], 0.05), vec![0.0, 1.0]);
    }

    #[test]
    fn log_axes_snap_to_one_two_five_and_hold_the_max() {
        let a = LogAxis::covering(130.0, 870.0);
        assert_eq!((a.lo, a.hi), (100.0, 1000.0));
        assert_eq!(a.ticks(), vec![100.0, 200.0, 500.0, 1000.0]);
        // The max lies strictly inside, so the last bucket holds it.
        let a = LogAxis::covering(100.0, 500.0);
        assert_eq!((a.lo, a.hi), (100.0, 1000.0));
        assert!((a.frac(100.0)).abs() < 1e-12 && (a.frac(1000.0) - 1.0).abs() < 1e-12);
        // Many decades: powers of ten only.
        let a = LogAxis::covering(3.0, 2_000_000.0);
        assert_eq!((a.lo, a.hi), (2.0, 5_000_000.0));
        assert_eq!(
            a.ticks(),
            vec![10.0, 100.0, 1000.0, 10_000.0, 100_000.0, 1_000_000.0]
        );
        // Narrow: linear ticks inside the range.
        let a = LogAxis::covering(105.0, 130.0);
        assert_eq!((a.lo, a.hi), (100.0, 200.0));
        let t = a.ticks();
        assert!(
            t.len() >= 3 && t.iter().all(|v| (100.0..=200.0).contains(v)),
            "{t:?}"
        );
    }

    #[test]
    fn log_buckets_keep_every_sample_in_its_place() {
        let pairs = [[100, 5], [150, 3], [999, 2], [1000, 1], [20_000, 4]];
        let axis = LogAxis::covering(100.0, 20_000.0);
        assert_eq!((axis.lo, axis.hi), (100.0, 50_000.0));
        let b = log_buckets(&pairs, &axis, 30);
        assert_eq!(b.len(), 30);
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 15);
        for &[v, n] in &pairs {
            let v = v as f64;
            let holder = b.iter().find(|b| b.from <= v && v < b.to).unwrap();
            assert!(holder.count >= n, "{v} not in its bucket");
        }
        assert_eq!(b[0].count, 5);
        // Buckets are equally wide on the log scale.
        let r0 = b[0].to / b[0].from;
        assert!(b.iter().all(|x| (x.to / x.from - r0).abs() < 1e-9));
    }

    #[test]
    fn long_timelines_are_averaged_down() {
        let s: Vec<TimelineSample> = (0..1500)
            .map(|i| TimelineSample {
                t_secs: i as f64 + 1.0,
                phase: Phase::Load,
                open: i,
                received_per_sec: 10.0,
                sent_per_sec: (i % 2) as f64,
                pings_per_sec: 40.0,
                latency_avg_us: (i % 3 == 0).then_some(300.0),
                failed: 0,
                dropped: 0,
            })
            .collect();
        let d = downsample(&s, 600);
        assert!(d.len() <= 600 && d.len() >= 500, "{}", d.len());
        assert_eq!(d.last().unwrap().t_secs, 1500.0);
        assert_eq!(d.last().unwrap().open, 1499);
        assert!(d.iter().all(|x| x.received_per_sec == 10.0));
        assert!(d.iter().all(|x| x.pings_per_sec == 40.0));
        assert!(d.iter().all(|x| x.latency_avg_us == Some(300.0)));
        assert_eq!(downsample(&s[..10], 600).len(), 10);
    }

    #[test]
    fn a_day_long_run_still_makes_a_small_page() {
        use crate::bench::report::{RawResult, RunInfo};
        let info = RunInfo {
            mode: "echo".into(),
            url: "ws://h:1/<x>".into(),
            conns: 100_000,
            threads: 2,
            echo: true,
            chat: false,
            transport: None,
        };
        let mut report = Report::build(&info, &RawResult::default(), None);
        report.timeline = (0..86_400)
            .map(|i| TimelineSample {
                t_secs: i as f64 + 1.0,
                phase: Phase::Load,
                open: 100_000,
                received_per_sec: 123_456.0 + (i % 7) as f64,
                sent_per_sec: 123_456.0,
                pings_per_sec: 40_000.0,
                latency_avg_us: Some(250.0 + (i % 13) as f64),
                failed: 0,
                dropped: i / 1000,
            })
            .collect();
        // Every value the histogram can hold, from 1 µs to 10 minutes.
        let pairs: Vec<[u64; 2]> = (0..60)
            .map(|i| [10u64.pow(i / 7).max(1) * (1 + i as u64 % 7), 1])
            .collect();
        let settings = [("url", "ws://h:1/<x>".to_string())];
        let html = render(&Page {
            report: &report,
            latency_pairs: &pairs,
            settings: &settings,
            machine: &Machine::default(),
            command: "throng bench echo --url 'ws://h:1/<x>'",
            started_unix_secs: 0,
        });
        assert!(html.len() < 200 * 1024, "{} bytes", html.len());
        assert!(html.contains("ws://h:1/&lt;x&gt;") && !html.contains("<x>"));
        for points in html.split("points=\"").skip(1) {
            let n = points.split('"').next().unwrap().split(' ').count();
            assert!(n <= MAX_POINTS, "{n} points");
        }
        assert!(html.matches("class=\"bar\"").count() > 10);
        assert!(html.contains("server pings"), "the pings' series is drawn");
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(si(0.0), "0");
        assert_eq!(si(950.0), "950");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(12_000.0), "12k");
        assert_eq!(si(2_500_000.0), "2.5M");
        assert_eq!(si(0.25), "0.25");
        assert_eq!(duration_label(250.0), "250 µs");
        assert_eq!(duration_label(1500.0), "1.5 ms");
        assert_eq!(duration_label(2_000_000.0), "2 s");
        assert_eq!(rate(12_345.6), "12,346");
        assert_eq!(rate(47.64), "47.6");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }
}
