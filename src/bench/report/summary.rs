//! The final [`Report`]: rates, latency, the error rate, and its text form.
//!
//! Owns how a merged [`RawResult`] becomes the figures `--json` prints and the
//! text report (the seeds' stats block first). It must not measure, sample or
//! draw: the HTML page lives in [`super::html`], the timeline in
//! [`super::timeline`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::counters::RawResult;
use super::histogram::Latency;
use super::push::{PublishSummary, PushReport};
use super::timeline::TimelineSample;

/// The final report: what `--json` prints, and what the text form shows.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: String,
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    pub conns: u64,
    pub processes: u64,
    pub threads: u64,
    pub attempted: u64,
    pub opened: u64,
    pub failed: u64,
    pub dropped: u64,
    pub failures: BTreeMap<String, u64>,
    pub connect_secs: f64,
    pub duration_secs: f64,
    pub sockets: u64,
    pub frames_total: u64,
    pub messages_total: u64,
    pub frames_per_min: f64,
    pub messages_per_min: f64,
    pub messages_sent: u64,
    pub messages_received_in_load: u64,
    pub throughput_msgs_per_sec: f64,
    pub sent_per_sec: f64,
    pub pings: u64,
    pub latency: Latency,
    /// Echo: never echoed; push: never delivered; chat: own broadcasts that never came back.
    pub lost_messages: u64,
    /// Errors / samples in percent (JMeter's "Error %"); see `error_rule`.
    pub error_rate_pct: f64,
    pub errors: u64,
    pub samples: u64,
    pub error_rule: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push: Option<PushReport>,
    pub client_cpu_secs: f64,
    pub client_cpu_pct_of_one_core: f64,
    pub client_max_rss_kb: u64,
    pub client_rss_per_conn_bytes: Option<f64>,
    /// Once a second while connecting and during the load (the driver sets it
    /// after [`Report::build`]); left out of the JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineSample>,
}

/// Inputs of [`Report::build`] that do not come from the measurement.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub mode: String,
    pub url: String,
    pub conns: u64,
    pub threads: u64,
    pub echo: bool,
    /// Chat: each sent message should come back to its sender once.
    pub chat: bool,
    /// Push: the subscribers' transport (`ws`, `sse`, `poll`); `pusher` for
    /// Pusher Channels over WebSocket (push and idle).
    pub transport: Option<String>,
}

impl Report {
    pub fn build(info: &RunInfo, raw: &RawResult, publish: Option<&PublishSummary>) -> Report {
        let c = &raw.counters;
        let load = raw.at_load_end;
        let start = raw.at_load_start;
        let secs = raw.load_secs.max(1e-9);
        let frames_load = load.frames_in.saturating_sub(start.frames_in);
        let msgs_load = load.messages_in.saturating_sub(start.messages_in);
        let sent_load = load.messages_out.saturating_sub(start.messages_out);
        let push = publish.map(|p| PushReport::build(raw, p));
        let latency = Latency::from_pairs(&raw.latency_us);
        let lost = match &push {
            Some(p) => p.lost,
            None if info.echo => c.in_flight,
            None if info.chat => c.messages_out.saturating_sub(latency.samples),
            None => 0,
        };
        let expected = match &push {
            Some(p) => p.expected_deliveries,
            None => c.messages_out,
        };
        // A delivery that came twice is as wrong as one that never came.
        let errors = c.failed
            + c.dropped
            + lost
            + push.as_ref().map_or(0, |p| p.publish_errors + p.duplicated);
        let samples = c.attempted + expected + push.as_ref().map_or(0, |p| p.publish_errors);
        let rss_per_conn = (c.opened > 0 && raw.rss_loaded_kb > 0).then(|| {
            (raw.rss_loaded_kb.saturating_sub(raw.rss_before_kb) as f64 * 1024.0) / c.opened as f64
        });
        Report {
            mode: info.mode.clone(),
            url: info.url.clone(),
            transport: info.transport.clone(),
            conns: info.conns,
            processes: raw.processes.max(1),
            threads: info.threads,
            attempted: c.attempted,
            opened: c.opened,
            failed: c.failed,
            dropped: c.dropped,
            failures: raw.failures.clone(),
            connect_secs: raw.connect_secs,
            duration_secs: raw.load_secs,
            sockets: raw.sockets_open_end,
            frames_total: c.frames_in,
            messages_total: c.messages_in,
            frames_per_min: frames_load as f64 * 60.0 / secs,
            messages_per_min: msgs_load as f64 * 60.0 / secs,
            messages_sent: c.messages_out,
            messages_received_in_load: msgs_load,
            throughput_msgs_per_sec: msgs_load as f64 / secs,
            sent_per_sec: match &push {
                Some(p) => p.published as f64 / secs,
                None => sent_load as f64 / secs,
            },
            pings: c.pings,
            latency,
            lost_messages: lost,
            error_rate_pct: if samples == 0 {
                0.0
            } else {
                errors as f64 * 100.0 / samples as f64
            },
            errors,
            samples,
            error_rule: "(failed + dropped connections + lost messages + duplicated deliveries + failed publishes) / (connect attempts + expected messages + failed publishes)",
            push,
            client_cpu_secs: raw.cpu_secs,
            client_cpu_pct_of_one_core: raw.cpu_secs * 100.0 / (raw.connect_secs + secs),
            client_max_rss_kb: raw.max_rss_kb,
            client_rss_per_conn_bytes: rss_per_conn,
            timeline: Vec::new(),
        }
    }

    /// Connections that failed or dropped: what decides the exit status.
    pub fn connection_failures(&self) -> u64 {
        self.failed + self.dropped
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let ms = |us: u64| us as f64 / 1000.0;
        let l = &self.latency;
        let _ = writeln!(
            s,
            "throng bench {}{}: {}, {} connections, {} process(es) x {} thread(s)",
            self.mode,
            self.transport
                .as_deref()
                .map_or(String::new(), |t| format!(" over {t}")),
            self.url,
            self.conns,
            self.processes,
            self.threads
        );
        let _ = writeln!(
            s,
            "connected {}/{} in {:.2} s; load window {:.2} s",
            self.opened, self.conns, self.connect_secs, self.duration_secs
        );
        let _ = writeln!(s);
        let _ = writeln!(s, "SOCKETS:          {}", self.sockets);
        let _ = writeln!(s, "FRAMES_TOTAL:     {}", self.frames_total);
        let _ = writeln!(s, "MESSAGES_TOTAL:   {}", self.messages_total);
        let _ = writeln!(s, "FRAMES_PER_MIN:   {:.1}", self.frames_per_min);
        let _ = writeln!(s, "MESSAGES_PER_MIN: {:.1}", self.messages_per_min);
        let _ = writeln!(s);
        if l.samples > 0 {
            let _ = writeln!(
                s,
                "latency (ms):     avg {:.3}  median {:.3}  p90 {:.3}  p95 {:.3}  p99 {:.3}  max {:.3}  ({} samples)",
                l.avg_us / 1000.0,
                ms(l.median_us),
                ms(l.p90_us),
                ms(l.p95_us),
                ms(l.p99_us),
                ms(l.max_us),
                l.samples
            );
        } else {
            let _ = writeln!(s, "latency (ms):     no samples");
        }
        let _ = writeln!(
            s,
            "throughput:       {:.1} messages/s received, {:.1} messages/s sent",
            self.throughput_msgs_per_sec, self.sent_per_sec
        );
        let _ = writeln!(
            s,
            "error rate:       {:.3} % ({} errors / {} samples; {} messages lost)",
            self.error_rate_pct, self.errors, self.samples, self.lost_messages
        );
        if let Some(p) = &self.push {
            let _ = writeln!(
                s,
                "fan-out:          published {} ({} failed), expected deliveries {}, delivered {}, lost {}, duplicated {}, out of order {}",
                p.published,
                p.publish_errors,
                p.expected_deliveries,
                p.delivered,
                p.lost,
                p.duplicated,
                p.out_of_order
            );
            if p.reconnects > 0 || p.server_reported_gaps > 0 {
                let _ = writeln!(
                    s,
                    "reconnects:       {} resumed during the load; {} gap(s) reported by the server",
                    p.reconnects, p.server_reported_gaps
                );
            }
            let cb = &p.comeback;
            if cb.lost > 0 {
                let _ = writeln!(
                    s,
                    "came back:        {} of {} let go by the server ({} still away at the end); away median {} ms, p99 {} ms, max {} ms; {} connect attempts, at most {} per 100 ms",
                    cb.back,
                    cb.lost,
                    cb.away_at_end,
                    cb.away_median_ms,
                    cb.away_p99_ms,
                    cb.away_max_ms,
                    cb.attempts,
                    cb.peak_attempts_per_100ms
                );
                for (reason, n) in &cb.reasons {
                    let _ = writeln!(s, "  let go: {reason}: {n}");
                }
            }
            if p.published > 0 {
                let _ = writeln!(
                    s,
                    "publish answers:  p50 {} ms, p99 {} ms, max {} ms; {} took over 1 s",
                    p.publish_answer_p50_ms,
                    p.publish_answer_p99_ms,
                    p.publish_answer_max_ms,
                    p.publish_answers_over_1s
                );
            }
            for (reason, n) in &p.publish_errors_by_reason {
                let _ = writeln!(s, "  publish failed: {reason}: {n}");
            }
            if p.foreign_seqs > 0 {
                let _ = writeln!(
                    s,
                    "  note: {} channel(s) had publishes from someone else during the run",
                    p.foreign_seqs
                );
            }
        }
        if self.pings > 0 || self.mode == "idle" {
            let _ = writeln!(s, "pings received:   {}", self.pings);
        }
        let _ = writeln!(
            s,
            "connections:      {} attempted, {} opened, {} failed, {} dropped",
            self.attempted, self.opened, self.failed, self.dropped
        );
        for (reason, n) in &self.failures {
            let _ = writeln!(s, "  {reason}: {n}");
        }
        let per_conn = self
            .client_rss_per_conn_bytes
            .map(|b| format!(", RSS per connection {b:.0} B"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "client:           cpu {:.2} s utime+stime ({:.1} % of one core), max RSS {} kB{}",
            self.client_cpu_secs, self.client_cpu_pct_of_one_core, self.client_max_rss_kb, per_conn
        );
        s
    }
}
