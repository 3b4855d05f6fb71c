//! The cards with charts: latency (percentiles and histogram) and the three
//! per-second timelines (messages, open connections, average latency).
//!
//! Owns what each chart shows (its series, labels, hints) and the shared x axis
//! of the timelines. It must not draw (`svg` does) nor compute scales (`plot`).

use std::fmt::{self, Write as _};

use super::super::{Phase, Report, TimelineSample};
use super::Page;
use super::plot::{downsample, interval_starts};
use super::svg::{LineChart, Series, histogram_chart, line_chart};
use super::text::{Esc, duration_label, ms, rate, si};
use crate::os::thousands;

/// Most points a line chart draws; longer timelines are averaged down to this, so a
/// day-long soak still makes a page of a few hundred kB.
pub(super) const MAX_POINTS: usize = 600;

/// The latency card: what was timed, the percentiles (each cell with its µs in
/// `data-us`) and the histogram.
pub(super) fn latency_section(out: &mut String, page: &Page<'_>) -> fmt::Result {
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

/// The per-second cards: messages, open connections and, when any latency was
/// sampled, the average latency; one note instead when there is no timeline.
pub(super) fn timeline_sections(out: &mut String, r: &Report) -> fmt::Result {
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
