//! `throng bench --report FILE.html`: the run's report as one self-contained page.
//!
//! This module owns that page. The skeleton and the stylesheet are files in
//! `web/` (`report.html`, `report.css`), embedded at build time; [`render`] fills
//! the skeleton's `{{slots}}` with the parts drawn here:
//! - `template`: the embedded files and the slot filling;
//! - `cards`: the summary strip and the cards of figures (errors, fan-out,
//!   totals, settings, machine);
//! - `charts`: the latency card and the per-second timelines, what each chart
//!   shows;
//! - `svg`: the charts drawn as SVG text;
//! - `plot`: the maths behind them (axes with "nice" ticks, the histogram's
//!   log-scale buckets, averaging long timelines down);
//! - `text`: escaping every string put in the page, the command line, numbers.
//!
//! The page loads nothing (no script, font, stylesheet or image from anywhere), so
//! it opens the same from a laptop, a CI artifact or an archive years later.
//!
//! It must not measure, run or print anything: the driver hands it a finished
//! [`Report`], the histogram's `[value, count]` pairs and the settings, and writes
//! the string [`render`] returns.

mod cards;
mod charts;
mod plot;
mod svg;
mod template;
mod text;

use std::fmt;

use super::{Machine, Report};
use crate::os::thousands;
use text::utc;
pub use text::{Esc, command_line, escape};

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

/// The whole page: the template with every slot filled.
pub fn render(page: &Page<'_>) -> String {
    let r = page.report;
    let transport = r
        .transport
        .as_deref()
        .map_or(String::new(), |t| format!(" over {t}"));
    let title = format!(
        "throng bench {}{transport} · {} connections",
        r.mode,
        thousands(r.conns)
    );
    let (verdict_class, verdict) = if r.errors == 0 {
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
    // Two columns of cards: errors beside push's fan-out (or the totals), then
    // the settings beside the machine (and push's totals).
    let fanout_or_totals = block(|out| match r.push {
        Some(_) => cards::fanout_section(out, r),
        None => cards::totals_section(out, r),
    });
    let machine = block(|out| {
        cards::machine_section(out, page)?;
        if r.push.is_some() {
            cards::totals_section(out, r)?;
        }
        Ok(())
    });
    template::fill(
        template::TEMPLATE,
        &[
            ("title", &escape(&title)),
            ("css", as_block(template::CSS)),
            ("mode", &escape(&r.mode)),
            ("transport", &escape(&transport)),
            ("url", &escape(&r.url)),
            ("conns", &thousands(r.conns)),
            ("load_secs", &format!("{:.1}", r.duration_secs)),
            ("started", &escape(&utc(page.started_unix_secs))),
            ("verdict_class", verdict_class),
            ("verdict", &escape(&verdict)),
            ("summary", &block(|out| cards::summary_strip(out, r))),
            ("latency", &block(|out| charts::latency_section(out, page))),
            ("timeline", &block(|out| charts::timeline_sections(out, r))),
            ("errors", &block(|out| cards::failures_section(out, r))),
            ("fanout_or_totals", &fanout_or_totals),
            ("settings", &block(|out| cards::settings_section(out, page))),
            ("machine", &machine),
            ("command", &escape(page.command)),
            ("version", env!("CARGO_PKG_VERSION")),
        ],
    )
}

/// A part of the page as `write` draws it, for a slot on a line of its own in the
/// template (which writes that line's newline).
fn block(write: impl FnOnce(&mut String) -> fmt::Result) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail.
    let _ = write(&mut out);
    as_block(&out).to_string()
}

/// `s` without its final newline: the template's line ends it.
fn as_block(s: &str) -> &str {
    s.strip_suffix('\n').unwrap_or(s)
}

#[cfg(test)]
mod tests;
