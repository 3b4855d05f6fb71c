//! What a bench run measured, and how it is merged and printed.
//!
//! This module owns the numbers: the per-process [`RawResult`] (counters, latency
//! histogram, failures by reason, push fan-out aggregates), the seq tracker that
//! finds lost, duplicated and out-of-order deliveries, merging results from several
//! loops or child processes, the per-second [`Timeline`], and the final [`Report`]
//! (stats block, latency, error rate, throughput; text or JSON; `html` draws it as a
//! page). It must not touch sockets, threads or processes: the drivers hand it
//! numbers and print what it formats.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency the histogram holds, in microseconds (10 minutes); larger
/// samples are recorded as this value.
const MAX_LATENCY_US: u64 = 600_000_000;

/// A latency histogram in microseconds with 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant histogram bounds are valid")
}

/// The histogram as `[value, count]` pairs (what children send their parent).
pub fn histogram_pairs(h: &Histogram<u64>) -> Vec<[u64; 2]> {
    h.iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect()
}

/// Adds `[value, count]` pairs into a histogram.
pub fn add_pairs(h: &mut Histogram<u64>, pairs: &[[u64; 2]]) {
    for [value, count] in pairs {
        h.saturating_record_n((*value).clamp(1, MAX_LATENCY_US), *count);
    }
}

/// Monotonic counters one event loop (or a whole process) keeps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Connections this process was asked to open.
    pub target: u64,
    /// Connect attempts started.
    pub attempted: u64,
    /// Handshakes completed (101 with the right accept key).
    pub opened: u64,
    /// Connections that never opened (refused, rejected, timed out ...).
    pub failed: u64,
    /// Connections that opened and were lost before the end of the run.
    pub dropped: u64,
    /// WebSockets open right now.
    pub open_now: u64,
    /// Frames received (data and control).
    pub frames_in: u64,
    /// Data messages received.
    pub messages_in: u64,
    /// Data messages sent.
    pub messages_out: u64,
    /// Pings received (each answered with a pong).
    pub pings: u64,
    /// Echo: messages sent whose echo has not come back yet.
    pub in_flight: u64,
    /// Latency samples so far and their sum in µs, so a status line can show the
    /// average over its interval (the histogram gives the percentiles at the end).
    #[serde(default)]
    pub latency_samples: u64,
    #[serde(default)]
    pub latency_us_sum: u64,
    /// Push: subscribers dropped on purpose and resumed (`--reconnect`).
    #[serde(default)]
    pub reconnects: u64,
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.target += o.target;
        self.attempted += o.attempted;
        self.opened += o.opened;
        self.failed += o.failed;
        self.dropped += o.dropped;
        self.open_now += o.open_now;
        self.frames_in += o.frames_in;
        self.messages_in += o.messages_in;
        self.messages_out += o.messages_out;
        self.pings += o.pings;
        self.in_flight += o.in_flight;
        self.latency_samples += o.latency_samples;
        self.latency_us_sum += o.latency_us_sum;
        self.reconnects += o.reconnects;
    }

    /// Every connection this process was asked for has opened or failed.
    pub fn connecting_done(&self) -> bool {
        self.attempted >= self.target && self.opened + self.failed >= self.target
    }
}

/// Seq bookkeeping for one subscriber: `first` seq seen, the `next` expected, and
/// which of the 64 seqs below `next` arrived (bit i = seq `next - 1 - i`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SeqTrack {
    pub first: u64,
    pub next: u64,
    window: u64,
}

/// Delivery anomalies found while messages arrive.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqCounts {
    /// Distinct seqs received.
    pub received: u64,
    /// Seqs skipped over (a later seq arrived first); late arrivals are taken back.
    pub gaps: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Gaps the server itself reported to resuming subscribers (json or SSE
    /// `gap` events, a poll answer's `gap`): what it could no longer give.
    #[serde(default)]
    pub reported_gaps: u64,
}

impl SeqTrack {
    pub fn seen_any(&self) -> bool {
        self.next != 0
    }

    pub fn observe(&mut self, seq: u64, counts: &mut SeqCounts) {
        if self.next == 0 {
            self.first = seq;
            self.next = seq.saturating_add(1);
            self.window = 1;
            counts.received += 1;
            return;
        }
        if seq >= self.next {
            let skipped = seq - self.next;
            counts.gaps += skipped;
            let shift = skipped + 1;
            self.window = if shift >= 64 { 0 } else { self.window << shift } | 1;
            self.next = seq.saturating_add(1);
            counts.received += 1;
            return;
        }
        let age = self.next - 1 - seq;
        if seq < self.first {
            // Older than the baseline: it was never counted as a gap.
            counts.out_of_order += 1;
            counts.received += 1;
        } else if age < 64 && self.window & (1 << age) != 0 {
            counts.duplicated += 1;
        } else {
            if age < 64 {
                self.window |= 1 << age;
            }
            counts.out_of_order += 1;
            counts.received += 1;
            counts.gaps = counts.gaps.saturating_sub(1);
        }
    }
}

/// What one process's subscribers of one channel saw, summed so that the loss
/// against the publisher's seq range can be computed after merging.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelAgg {
    /// Subscribers open at the end.
    pub subs: u64,
    /// Of those, the ones that received at least one message.
    pub seen: u64,
    pub sum_first: u64,
    pub sum_next: u64,
}

impl ChannelAgg {
    pub fn add_track(&mut self, t: &SeqTrack) {
        self.subs += 1;
        if t.seen_any() {
            self.seen += 1;
            self.sum_first += t.first;
            self.sum_next += t.next;
        }
    }

    pub fn add(&mut self, o: &ChannelAgg) {
        self.subs += o.subs;
        self.seen += o.seen;
        self.sum_first += o.sum_first;
        self.sum_next += o.sum_next;
    }

    /// Messages these subscribers missed before their first and after their last
    /// delivery, given that the publisher got seqs `min..=max` for the channel.
    pub fn edge_loss(&self, published: Option<(u64, u64)>) -> u64 {
        let Some((min, max)) = published else {
            return 0;
        };
        let range = i128::from(max) - i128::from(min) + 1;
        let seen = i128::from(self.seen);
        let head = i128::from(self.sum_first) - seen * i128::from(min);
        let tail = seen * (i128::from(max) + 1) - i128::from(self.sum_next);
        let unseen = i128::from(self.subs - self.seen) * range;
        u64::try_from((head.max(0) + tail.max(0) + unseen).max(0)).unwrap_or(u64::MAX)
    }
}

/// What the publisher did, per channel: the seqs the API returned.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishSummary {
    pub published: u64,
    pub errors: u64,
    pub errors_by_reason: BTreeMap<String, u64>,
    /// Per channel: (first seq, last seq, count) of this run's publishes.
    pub channels: Vec<Option<(u64, u64, u64)>>,
}

impl PublishSummary {
    pub fn record(&mut self, channel: usize, seq: u64) {
        self.published += 1;
        if self.channels.len() <= channel {
            self.channels.resize(channel + 1, None);
        }
        let slot = &mut self.channels[channel];
        *slot = Some(match *slot {
            None => (seq, seq, 1),
            Some((lo, hi, n)) => (lo.min(seq), hi.max(seq), n + 1),
        });
    }

    pub fn merge(&mut self, o: &PublishSummary) {
        self.published += o.published;
        self.errors += o.errors;
        for (k, v) in &o.errors_by_reason {
            *self.errors_by_reason.entry(k.clone()).or_default() += v;
        }
        for (i, c) in o.channels.iter().enumerate() {
            if let Some((lo, hi, n)) = *c {
                if self.channels.len() <= i {
                    self.channels.resize(i + 1, None);
                }
                let slot = &mut self.channels[i];
                *slot = Some(match *slot {
                    None => (lo, hi, n),
                    Some((a, b, m)) => (a.min(lo), b.max(hi), m + n),
                });
            }
        }
    }
}

/// Push: subscribers the server let go of with a "come back" signal (1001, a
/// reset, a 502 from a proxy ...), and how they came back (`--backoff`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComebackTally {
    /// Times a subscriber was let go and set to come back.
    pub lost: u64,
    /// Times one was back: its request sent again on a new connection.
    pub back: u64,
    /// Connect attempts made to come back, the failed ones included.
    pub attempts: u64,
    /// Time away per return, in ms, as histogram pairs.
    pub away_ms: Vec<[u64; 2]>,
    /// Per 100 ms of wall-clock time (unix ms / 100): [lost, attempts, back].
    pub curve: BTreeMap<u64, [u64; 3]>,
    /// Why they were let go, and why tries to come back failed.
    pub reasons: BTreeMap<String, u64>,
}

impl ComebackTally {
    /// Counts one event in the 100 ms slot of `unix_ms`: 0 lost, 1 attempt, 2 back.
    pub fn mark(&mut self, unix_ms: u64, what: usize) {
        self.curve.entry(unix_ms / 100).or_default()[what] += 1;
        match what {
            0 => self.lost += 1,
            1 => self.attempts += 1,
            _ => self.back += 1,
        }
    }

    pub fn merge(&mut self, o: &ComebackTally) {
        self.lost += o.lost;
        self.back += o.back;
        self.attempts += o.attempts;
        let mut h = new_histogram();
        add_pairs(&mut h, &self.away_ms);
        add_pairs(&mut h, &o.away_ms);
        self.away_ms = histogram_pairs(&h);
        for (slot, v) in &o.curve {
            let mine = self.curve.entry(*slot).or_default();
            for (m, t) in mine.iter_mut().zip(v) {
                *m += t;
            }
        }
        for (k, v) in &o.reasons {
            *self.reasons.entry(k.clone()).or_default() += v;
        }
    }
}

/// Push: how the subscribers the server let go came back, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComebackReport {
    pub lost: u64,
    pub back: u64,
    /// Still away when the run ended.
    pub away_at_end: u64,
    pub attempts: u64,
    /// Time from being let go to being back, in ms.
    pub away_median_ms: u64,
    pub away_p99_ms: u64,
    pub away_max_ms: u64,
    /// The busiest 100 ms for connect attempts, and for returns.
    pub peak_attempts_per_100ms: u64,
    pub peak_back_per_100ms: u64,
    /// Why they were let go, and why tries to come back failed.
    pub reasons: BTreeMap<String, u64>,
    /// The reconnect curve: [unix ms, lost, attempts, back] per 100 ms slot with any.
    pub curve: Vec<[u64; 4]>,
}

impl ComebackReport {
    pub fn build(t: &ComebackTally) -> ComebackReport {
        let away = Latency::from_pairs(&t.away_ms);
        ComebackReport {
            lost: t.lost,
            back: t.back,
            away_at_end: t.lost.saturating_sub(t.back),
            attempts: t.attempts,
            away_median_ms: away.median_us,
            away_p99_ms: away.p99_us,
            away_max_ms: away.max_us,
            peak_attempts_per_100ms: t.curve.values().map(|v| v[1]).max().unwrap_or(0),
            peak_back_per_100ms: t.curve.values().map(|v| v[2]).max().unwrap_or(0),
            reasons: t.reasons.clone(),
            curve: t
                .curve
                .iter()
                .map(|(slot, v)| [slot * 100, v[0], v[1], v[2]])
                .collect(),
        }
    }
}

/// Everything one process measured; children print it as JSON for their parent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RawResult {
    pub counters: Counters,
    /// Counters when the load started and when sending stopped.
    pub at_load_start: Counters,
    pub at_load_end: Counters,
    pub load_secs: f64,
    pub connect_secs: f64,
    /// WebSockets still open when the run ended (the stats block's SOCKETS).
    pub sockets_open_end: u64,
    pub failures: BTreeMap<String, u64>,
    pub latency_us: Vec<[u64; 2]>,
    pub seq: SeqCounts,
    pub channels: Vec<ChannelAgg>,
    #[serde(default)]
    pub comeback: ComebackTally,
    pub cpu_secs: f64,
    pub max_rss_kb: u64,
    /// VmRSS before the first connect and when the load started.
    pub rss_before_kb: u64,
    pub rss_loaded_kb: u64,
    pub processes: u64,
}

impl RawResult {
    /// Adds another process's (or loop's) result; times take the maximum.
    pub fn merge(&mut self, o: &RawResult) {
        self.counters.add(&o.counters);
        self.at_load_start.add(&o.at_load_start);
        self.at_load_end.add(&o.at_load_end);
        self.load_secs = self.load_secs.max(o.load_secs);
        self.connect_secs = self.connect_secs.max(o.connect_secs);
        self.sockets_open_end += o.sockets_open_end;
        for (k, v) in &o.failures {
            *self.failures.entry(k.clone()).or_default() += v;
        }
        let mut h = new_histogram();
        add_pairs(&mut h, &self.latency_us);
        add_pairs(&mut h, &o.latency_us);
        self.latency_us = histogram_pairs(&h);
        self.seq.received += o.seq.received;
        self.seq.gaps += o.seq.gaps;
        self.seq.duplicated += o.seq.duplicated;
        self.seq.out_of_order += o.seq.out_of_order;
        self.seq.reported_gaps += o.seq.reported_gaps;
        if self.channels.len() < o.channels.len() {
            self.channels
                .resize(o.channels.len(), ChannelAgg::default());
        }
        for (mine, theirs) in self.channels.iter_mut().zip(&o.channels) {
            mine.add(theirs);
        }
        self.comeback.merge(&o.comeback);
        self.cpu_secs += o.cpu_secs;
        self.max_rss_kb += o.max_rss_kb;
        self.rss_before_kb += o.rss_before_kb;
        self.rss_loaded_kb += o.rss_loaded_kb;
        self.processes += o.processes;
    }
}

/// Latency figures in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub samples: u64,
    pub avg_us: f64,
    pub median_us: u64,
    pub p90_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Latency {
    pub fn from_pairs(pairs: &[[u64; 2]]) -> Latency {
        let mut h = new_histogram();
        add_pairs(&mut h, pairs);
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            samples: h.len(),
            avg_us: h.mean(),
            median_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p95_us: h.value_at_quantile(0.95),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
        }
    }
}

/// Push mode's fan-out check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushReport {
    pub published: u64,
    pub publish_errors: u64,
    pub publish_errors_by_reason: BTreeMap<String, u64>,
    /// Σ over subscribers open at the end of the messages published to their channel.
    pub expected_deliveries: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Channels whose seqs were not all ours (another publisher was active).
    pub foreign_seqs: u64,
    /// Subscribers dropped on purpose and resumed during the load (`--reconnect`).
    pub reconnects: u64,
    /// Gaps the server reported to resuming subscribers.
    pub server_reported_gaps: u64,
    /// Subscribers the server let go with a "come back" signal, and their return.
    #[serde(default)]
    pub comeback: ComebackReport,
}

impl PushReport {
    pub fn build(raw: &RawResult, publish: &PublishSummary) -> PushReport {
        let mut expected = 0u64;
        let mut edge = 0u64;
        let mut foreign = 0u64;
        for (i, agg) in raw.channels.iter().enumerate() {
            let range = publish.channels.get(i).copied().flatten();
            if let Some((lo, hi, n)) = range {
                expected += agg.subs * (hi - lo + 1);
                if hi - lo + 1 != n {
                    foreign += 1;
                }
            }
            edge += agg.edge_loss(range.map(|(lo, hi, _)| (lo, hi)));
        }
        PushReport {
            published: publish.published,
            publish_errors: publish.errors,
            publish_errors_by_reason: publish.errors_by_reason.clone(),
            expected_deliveries: expected,
            delivered: raw.seq.received,
            lost: raw.seq.gaps + edge,
            duplicated: raw.seq.duplicated,
            out_of_order: raw.seq.out_of_order,
            foreign_seqs: foreign,
            reconnects: raw.counters.reconnects,
            server_reported_gaps: raw.seq.reported_gaps,
            comeback: ComebackReport::build(&raw.comeback),
        }
    }
}

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
    /// Push: the subscribers' transport (`ws`, `sse`, `poll`).
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

/// Which part of the run a [`TimelineSample`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Connections are being opened; no load yet.
    Connect,
    /// Every connection is open and the load runs.
    Load,
}

/// The fleet's live counters at one moment, as rates over the interval before it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimelineSample {
    /// Seconds since the load started (the status lines' clock); negative while
    /// connecting.
    pub t_secs: f64,
    pub phase: Phase,
    /// Connections open at that moment.
    pub open: u64,
    /// Data messages received per second over the interval.
    pub received_per_sec: f64,
    /// Messages sent per second over the interval (push: published).
    pub sent_per_sec: f64,
    /// Server pings received (and answered) per second over the interval: even
    /// when the server keeps its heartbeats spread, bunched when it does not.
    pub pings_per_sec: f64,
    /// Average latency of the samples taken in the interval; none when there were none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_avg_us: Option<f64>,
    /// Connections failed and dropped so far (cumulative).
    pub failed: u64,
    pub dropped: u64,
}

/// Builds the timeline from cumulative counters the driver reads once a second:
/// each [`Timeline::record`] turns the change since the previous reading into a
/// sample.
#[derive(Debug, Default)]
pub struct Timeline {
    samples: Vec<TimelineSample>,
    /// The previous reading: (seconds since the first connect, counters, sent).
    last: (f64, Counters, u64),
}

impl Timeline {
    /// A reading shorter than this after the previous one closes a phase without
    /// a sample of its own (its rates would be noise).
    pub const MIN_PARTIAL_SECS: f64 = 0.5;

    /// Adds a sample for the interval since the previous reading. `sent` is the
    /// total sent so far by whoever sends (the connections, or push's publisher).
    pub fn record(&mut self, t_secs: f64, phase: Phase, c: &Counters, sent: u64) {
        let (last_t, last, last_sent) = self.last;
        let dt = (t_secs - last_t).max(1e-9);
        let samples = c.latency_samples.saturating_sub(last.latency_samples);
        let latency_avg_us = (samples > 0)
            .then(|| c.latency_us_sum.saturating_sub(last.latency_us_sum) as f64 / samples as f64);
        self.samples.push(TimelineSample {
            t_secs,
            phase,
            open: c.open_now,
            received_per_sec: c.messages_in.saturating_sub(last.messages_in) as f64 / dt,
            sent_per_sec: sent.saturating_sub(last_sent) as f64 / dt,
            pings_per_sec: c.pings.saturating_sub(last.pings) as f64 / dt,
            latency_avg_us,
            failed: c.failed,
            dropped: c.dropped,
        });
        self.last = (t_secs, *c, sent);
    }

    /// Ends a phase: a sample for the interval since the last reading if it is at
    /// least [`Self::MIN_PARTIAL_SECS`] long, else only a new starting point.
    pub fn close_phase(&mut self, t_secs: f64, phase: Phase, c: &Counters, sent: u64) {
        if t_secs - self.last.0 >= Self::MIN_PARTIAL_SECS {
            self.record(t_secs, phase, c, sent);
        } else {
            self.last = (t_secs, *c, sent);
        }
    }

    /// The samples, their times moved from "since the first connect" (what
    /// `record` was given) to "since the load started" at `load_start_secs`.
    pub fn into_samples(self, load_start_secs: f64) -> Vec<TimelineSample> {
        let mut samples = self.samples;
        for s in &mut samples {
            s.t_secs -= load_start_secs;
        }
        samples
    }
}

/// The machine the bench ran on, for the HTML report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    pub cores: usize,
    /// `model name` of /proc/cpuinfo; empty when unknown.
    pub cpu_model: String,
    /// `uname -r`; empty when unknown.
    pub kernel: String,
    pub memory_kb: u64,
    pub hostname: String,
}

impl Machine {
    /// Reads what Linux tells about this machine; what it cannot read stays empty.
    pub fn detect() -> Machine {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == "model name").then(|| v.trim().to_string())
                })
                .unwrap_or_default(),
            kernel: read("/proc/sys/kernel/osrelease"),
            memory_kb: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0),
            hostname: read("/proc/sys/kernel/hostname"),
        }
    }
}

/// This process's CPU time (utime + stime) in seconds.
pub fn self_cpu_secs() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to our own rusage struct.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A `/proc/self/status` field in kB (`VmRSS`, `VmHWM`); 0 when unavailable.
pub fn proc_status_kb(field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comebacks_merge_and_report_the_curve_and_time_away() {
        let mut a = ComebackTally::default();
        a.mark(1_000_050, 0);
        a.mark(1_000_120, 1);
        a.mark(1_000_180, 1);
        a.mark(1_000_250, 2);
        *a.reasons.entry("closed with code 1001".into()).or_default() += 1;
        let mut h = new_histogram();
        h.saturating_record(200);
        a.away_ms = histogram_pairs(&h);
        let mut b = ComebackTally::default();
        b.mark(1_000_099, 0);
        b.mark(1_000_130, 1);
        *b.reasons.entry("closed with code 1001".into()).or_default() += 1;
        let mut merged = a.clone();
        merged.merge(&b);
        assert_eq!((merged.lost, merged.attempts, merged.back), (2, 3, 1));
        let r = ComebackReport::build(&merged);
        assert_eq!(r.away_at_end, 1);
        assert_eq!(r.away_median_ms, 200);
        assert_eq!(r.peak_attempts_per_100ms, 3);
        assert_eq!(r.peak_back_per_100ms, 1);
        assert_eq!(r.reasons["closed with code 1001"], 2);
        assert_eq!(
            r.curve,
            vec![
                [1_000_000, 2, 0, 0],
                [1_000_100, 0, 3, 0],
                [1_000_200, 0, 0, 1]
            ]
        );
    }

    fn feed(t: &mut SeqTrack, seqs: &[u64]) -> SeqCounts {
        let mut c = SeqCounts::default();
        for &s in seqs {
            t.observe(s, &mut c);
        }
        c
    }

    #[test]
    fn in_order_delivery_has_no_anomalies() {
        let mut t = SeqTrack::default();
        let c = feed(&mut t, &[5, 6, 7, 8]);
        assert_eq!(
            c,
            SeqCounts {
                received: 4,
                ..SeqCounts::default()
            }
        );
        assert_eq!((t.first, t.next), (5, 9));
    }

    #[test]
    fn gaps_duplicates_and_late_arrivals() {
        let mut t = SeqTrack::default();
        let c = feed(&mut t, &[1, 2, 5, 5, 3, 3, 7]);
        // 3,4 skipped at 5; 6 skipped at 7; 3 arrived late (taken back), then a dup.
        assert_eq!(c.gaps, 2);
        assert_eq!(c.duplicated, 2);
        assert_eq!(c.out_of_order, 1);
        assert_eq!(c.received, 5);
    }

    #[test]
    fn far_gaps_clear_the_window() {
        let mut t = SeqTrack::default();
        let c = feed(&mut t, &[1, 200, 199, 2]);
        assert_eq!(c.out_of_order, 2);
        assert_eq!(c.gaps, 198 - 2);
        assert_eq!(c.duplicated, 0);
    }

    #[test]
    fn edge_loss_counts_head_tail_and_silent_subscribers() {
        let mut agg = ChannelAgg::default();
        let mut a = SeqTrack::default();
        feed(&mut a, &[10, 11, 12]); // published 10..=14: misses 13, 14
        let mut b = SeqTrack::default();
        feed(&mut b, &[12, 13, 14]); // misses 10, 11
        agg.add_track(&a);
        agg.add_track(&b);
        agg.add_track(&SeqTrack::default()); // saw nothing: misses 5
        assert_eq!(agg.edge_loss(Some((10, 14))), 2 + 2 + 5);
        assert_eq!(agg.edge_loss(None), 0);
    }

    #[test]
    fn timeline_turns_counter_changes_into_rates() {
        let mut timeline = Timeline::default();
        let mut c = Counters {
            open_now: 10,
            ..Counters::default()
        };
        timeline.record(1.0, Phase::Load, &c, 0);
        c.messages_in = 30;
        c.pings = 8;
        timeline.record(3.0, Phase::Load, &c, 4);
        let samples = timeline.into_samples(1.0);
        let last = samples[1];
        assert_eq!(last.t_secs, 2.0);
        assert_eq!(last.received_per_sec, 15.0);
        assert_eq!(last.pings_per_sec, 4.0);
        assert_eq!(last.sent_per_sec, 2.0);
        assert_eq!(last.open, 10);
    }

    #[test]
    fn publish_summary_tracks_ranges_and_merges() {
        let mut p = PublishSummary::default();
        p.record(1, 7);
        p.record(1, 5);
        let mut q = PublishSummary::default();
        q.record(0, 1);
        q.record(1, 9);
        p.merge(&q);
        assert_eq!(p.published, 4);
        assert_eq!(p.channels, vec![Some((1, 1, 1)), Some((5, 9, 3))]);
    }

    #[test]
    fn merging_results_adds_counters_and_histograms() {
        let mut h1 = new_histogram();
        h1.saturating_record(100);
        h1.saturating_record(200);
        let mut h2 = new_histogram();
        h2.saturating_record(1_000_000);
        let mut a = RawResult {
            latency_us: histogram_pairs(&h1),
            processes: 1,
            ..RawResult::default()
        };
        a.counters.opened = 3;
        a.failures.insert("refused".into(), 1);
        let mut b = RawResult {
            latency_us: histogram_pairs(&h2),
            processes: 1,
            load_secs: 2.0,
            ..RawResult::default()
        };
        b.counters.opened = 4;
        b.failures.insert("refused".into(), 2);
        b.failures.insert("timed out".into(), 1);
        a.merge(&b);
        assert_eq!(a.counters.opened, 7);
        assert_eq!(a.processes, 2);
        assert_eq!(a.load_secs, 2.0);
        assert_eq!(a.failures["refused"], 3);
        assert_eq!(a.failures["timed out"], 1);
        let l = Latency::from_pairs(&a.latency_us);
        assert_eq!(l.samples, 3);
        assert!(l.max_us >= 999_000 && l.max_us <= 1_001_000);
        assert!(l.median_us >= 199 && l.median_us <= 201);
    }

    #[test]
    fn timeline_samples_are_rates_over_each_interval() {
        let mut t = Timeline::default();
        let c = |open, msgs_in, lat_n, lat_sum| Counters {
            open_now: open,
            messages_in: msgs_in,
            latency_samples: lat_n,
            latency_us_sum: lat_sum,
            ..Counters::default()
        };
        t.record(1.0, Phase::Connect, &c(5, 0, 0, 0), 0);
        // A short tail of the connect phase only moves the starting point.
        t.close_phase(1.2, Phase::Connect, &c(10, 4, 0, 0), 0);
        t.record(2.2, Phase::Load, &c(10, 104, 100, 50_000), 100);
        t.close_phase(2.8, Phase::Load, &c(9, 164, 100, 50_000), 130);
        let s = t.into_samples(1.2);
        assert_eq!(s.len(), 3);
        assert!((s[0].t_secs + 0.2).abs() < 1e-9 && (s[1].t_secs - 1.0).abs() < 1e-9);
        assert_eq!((s[0].open, s[0].received_per_sec), (5, 0.0));
        assert_eq!(s[1].phase, Phase::Load);
        assert!((s[1].received_per_sec - 100.0).abs() < 1e-9);
        assert!((s[1].sent_per_sec - 100.0).abs() < 1e-9);
        assert_eq!(s[1].latency_avg_us, Some(500.0));
        assert!((s[2].received_per_sec - 100.0).abs() < 1e-6);
        assert!((s[2].sent_per_sec - 50.0).abs() < 1e-6);
        assert_eq!(s[2].latency_avg_us, None);
        assert_eq!(s[2].open, 9);
    }

    #[test]
    fn report_rates_use_the_load_window() {
        let mut raw = RawResult {
            load_secs: 10.0,
            connect_secs: 1.0,
            processes: 1,
            ..RawResult::default()
        };
        raw.counters = Counters {
            target: 10,
            attempted: 10,
            opened: 9,
            failed: 1,
            messages_in: 1200,
            messages_out: 1200,
            frames_in: 1210,
            ..Counters::default()
        };
        raw.at_load_end = Counters {
            messages_in: 1100,
            frames_in: 1100,
            messages_out: 1100,
            ..Counters::default()
        };
        raw.at_load_start.messages_in = 100;
        raw.at_load_start.frames_in = 100;
        let info = RunInfo {
            transport: None,
            mode: "echo".into(),
            url: "ws://x".into(),
            conns: 10,
            threads: 1,
            echo: true,
            chat: false,
        };
        let r = Report::build(&info, &raw, None);
        assert_eq!(r.messages_per_min, 6000.0);
        assert_eq!(r.throughput_msgs_per_sec, 100.0);
        assert_eq!(r.connection_failures(), 1);
        assert_eq!(r.errors, 1);
        assert!(r.to_text().contains("MESSAGES_PER_MIN: 6000.0"));
    }
}
