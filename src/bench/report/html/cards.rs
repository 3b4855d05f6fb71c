//! The page's cards of figures: the summary strip, errors, fan-out, totals,
//! settings and machine.
//!
//! Owns which figures each card shows and how they read. It must not draw charts
//! (`charts` and `svg` do) nor lay the cards out (the template in `web/` does).

use std::fmt::{self, Write as _};

use super::super::Report;
use super::Page;
use super::text::{Esc, ms, rate, si, utc};
use crate::os::thousands;

/// One figure of the summary strip: a label, a value with its unit, a note.
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

/// The strip of big figures under the header.
pub(super) fn summary_strip(out: &mut String, r: &Report) -> fmt::Result {
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

/// A table of (name, value) rows.
fn kv_rows(out: &mut String, rows: &[(&str, String)]) -> fmt::Result {
    out.push_str("<table class=\"kv\">");
    for (k, v) in rows {
        write!(out, "<tr><th>{}</th><td>{}</td></tr>", Esc(k), Esc(v))?;
    }
    out.push_str("</table>\n");
    Ok(())
}

/// Errors: the rate, the reasons by count, and the rule behind the rate.
pub(super) fn failures_section(out: &mut String, r: &Report) -> fmt::Result {
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

/// Push: what was published against what was delivered.
pub(super) fn fanout_section(out: &mut String, r: &Report) -> fmt::Result {
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

/// The seeds' stats block and the client's own CPU and memory.
pub(super) fn totals_section(out: &mut String, r: &Report) -> fmt::Result {
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

/// The run's settings, as asked for.
pub(super) fn settings_section(out: &mut String, page: &Page<'_>) -> fmt::Result {
    out.push_str("<section class=\"card\" id=\"settings\"><h2>Settings</h2><p class=\"hint\">The run as it was asked for.</p>\n");
    let rows: Vec<(&str, String)> = page.settings.iter().map(|(k, v)| (*k, v.clone())).collect();
    kv_rows(out, &rows)?;
    out.push_str("</section>\n");
    Ok(())
}

/// Where the bench ran.
pub(super) fn machine_section(out: &mut String, page: &Page<'_>) -> fmt::Result {
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
