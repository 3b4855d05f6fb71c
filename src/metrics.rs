//! `GET /metrics`: the server's counters in the Prometheus text exposition format
//! (version 0.0.4), and the few process figures read from `/proc/self`.
//!
//! The encoder is written by hand rather than taken from a crate. The maintained
//! Rust client, `prometheus-client`, encodes OpenMetrics 1.0 only (its own content
//! type, `# EOF`, `_created` series), not the 0.0.4 text asked for here, and its
//! metric types own their storage (an atomic per metric). throng's counters are
//! per event loop ([`crate::stats::LoopCounters`]) and summed on read, so the crate
//! would only re-wrap each sum as a constant at every scrape to format it. The
//! format itself is four kinds of line (`# HELP`, `# TYPE`, a sample, a sample
//! with labels), written straight into one buffer here: a scrape costs one
//! [`crate::stats::ServerStats::snapshot`] (O(loops)), the broker's channel count
//! and health, two small reads of `/proc/self`, and about 3 KB of text. It does no
//! work per connection: `process_open_fds` is the size the kernel reports for
//! `/proc/self/fd` (Linux 6.2 and later), and only older kernels have it counted
//! entry by entry.
//!
//! This module formats; it must not count (that is [`crate::stats`]) or know about
//! routes and sockets.

use std::fmt::Write as _;
use std::time::Duration;

use crate::stats::{HandshakeFailure, LATENCY_BOUNDS, Snapshot, TURN_BOUNDS};

/// The `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a scrape shows besides the loops' counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scrape {
    pub snapshot: Snapshot,
    /// Channels the broker knows on this node.
    pub channels: u64,
    /// History bytes held across channels (the memory broker's).
    pub history_bytes: Option<u64>,
    /// `broker.healthy()`.
    pub broker_up: bool,
    pub uptime: Duration,
    pub process: Process,
    /// Pusher webhooks, when an app has any.
    pub webhooks: Option<crate::webhooks::Tally>,
    /// A replicated broker's failover counts.
    pub failover: Option<crate::broker::FailoverCounts>,
}

/// The process figures, where `/proc/self` gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Process {
    pub resident_bytes: Option<u64>,
    pub open_fds: Option<u64>,
}

impl Process {
    /// Reads `/proc/self/status` (`VmRSS`) and the size of `/proc/self/fd`.
    pub fn read() -> Process {
        let resident_bytes = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| vm_rss_bytes(&status));
        Process {
            resident_bytes,
            open_fds: open_fds(),
        }
    }
}

/// `VmRSS:   1234 kB` in bytes.
fn vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => kib.checked_mul(1024),
        _ => None,
    }
}

/// Open file descriptors: since Linux 6.2 the size of `/proc/self/fd` is their
/// number (O(1)); before, it is 0 and the entries are counted.
fn open_fds() -> Option<u64> {
    let size = std::fs::metadata("/proc/self/fd").ok()?.len();
    if size > 0 {
        return Some(size);
    }
    // The directory's own descriptor is among the entries while they are read.
    let entries = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(entries.saturating_sub(1))
}

/// Writes metric families in the text format into a `String`.
pub struct Encoder<'a> {
    out: &'a mut String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

impl<'a> Encoder<'a> {
    pub fn new(out: &'a mut String) -> Self {
        Encoder { out }
    }

    /// `# HELP` and `# TYPE` of a family.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) {
        self.out.push_str("# HELP ");
        self.out.push_str(name);
        self.out.push(' ');
        escape_into(self.out, help, false);
        self.out.push_str("\n# TYPE ");
        self.out.push_str(name);
        self.out.push(' ');
        self.out.push_str(kind.as_str());
        self.out.push('\n');
    }

    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: Value) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(label);
                self.out.push_str("=\"");
                escape_into(self.out, v, true);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        value.write(self.out);
        self.out.push('\n');
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: Value) {
        self.family(name, help, kind);
        self.sample(name, &[], value);
    }

    /// A histogram from per-bucket counts (not cumulative: `buckets[i]` counts the
    /// observations above bound `i - 1` and at most bound `i`; the last one those
    /// above every bound). `bounds` are the `le` values; `buckets` has one more.
    /// `_count` is the sum of the buckets, so it always equals the `+Inf` bucket.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        bounds: &[&str],
        buckets: &[u64],
        sum: f64,
    ) {
        debug_assert_eq!(bounds.len() + 1, buckets.len());
        self.family(name, help, Kind::Histogram);
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (i, &n) in buckets.iter().enumerate() {
            cumulative += n;
            let le = bounds.get(i).copied().unwrap_or("+Inf");
            self.sample(&bucket, &[("le", le)], Value::Int(cumulative));
        }
        self.sample(&format!("{name}_sum"), &[], Value::Float(sum));
        self.sample(&format!("{name}_count"), &[], Value::Int(cumulative));
    }
}

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl Value {
    fn write(self, out: &mut String) {
        // Writing into a String cannot fail.
        let _ = match self {
            Value::Int(n) => write!(out, "{n}"),
            Value::Float(f) if f.is_nan() => write!(out, "NaN"),
            Value::Float(f) if f == f64::INFINITY => write!(out, "+Inf"),
            Value::Float(f) if f == f64::NEG_INFINITY => write!(out, "-Inf"),
            Value::Float(f) => write!(out, "{f}"),
        };
    }
}

/// Escapes `\` and newlines (HELP text), and `"` too in label values.
fn escape_into(out: &mut String, text: &str, quote: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// The whole `/metrics` body.
pub fn render(scrape: &Scrape) -> String {
    let s = &scrape.snapshot;
    let mut text = String::with_capacity(4096);
    let mut e = Encoder::new(&mut text);

    e.family(
        "throng_connections",
        "Open client connections by transport (WebSocket, SSE stream, waiting long-poll).",
        Kind::Gauge,
    );
    for (transport, n) in crate::transport::Kind::named(&s.open) {
        e.sample(
            "throng_connections",
            &[("transport", transport)],
            Value::Int(n),
        );
    }
    e.single(
        "throng_io_uring_receivers",
        "Connections whose bytes arrive through io_uring now (--io-uring; busy ones only).",
        Kind::Gauge,
        Value::Int(s.ring_receivers),
    );
    e.single(
        "throng_io_uring_sends_total",
        "Sends made through the loops' io_uring send rings (fan-outs and held replies).",
        Kind::Counter,
        Value::Int(s.ring_sends),
    );
    e.single(
        "throng_io_uring_send_calls_total",
        "System calls (io_uring_enter) those sends took.",
        Kind::Counter,
        Value::Int(s.ring_send_calls),
    );
    e.single(
        "throng_messages_published_total",
        "Messages published through this node (HTTP API and chat members).",
        Kind::Counter,
        Value::Int(s.published),
    );
    e.single(
        "throng_messages_delivered_total",
        "Messages and channel events written to subscribers (one per subscriber; history replays not included).",
        Kind::Counter,
        Value::Int(s.delivered),
    );
    e.single(
        "throng_bytes_sent_total",
        "Bytes written to client sockets (responses, frames and events).",
        Kind::Counter,
        Value::Int(s.bytes_sent),
    );
    e.single(
        "throng_deflate_plain_bytes_total",
        "Frames sent compressed (permessage-deflate), one per recipient: the bytes they would have taken uncompressed.",
        Kind::Counter,
        Value::Int(s.deflate_plain),
    );
    e.single(
        "throng_deflate_wire_bytes_total",
        "The bytes those compressed frames took (included in throng_bytes_sent_total).",
        Kind::Counter,
        Value::Int(s.deflate_wire),
    );
    e.single(
        "throng_slow_consumer_disconnects_total",
        "Subscribers closed because more than --max-queue bytes waited for them.",
        Kind::Counter,
        Value::Int(s.slow_consumers),
    );
    e.single(
        "throng_broker_deadlines_missed_total",
        "Requests handed to the broker (publishes through Redis) answered 503 because the broker did not answer within its deadline.",
        Kind::Counter,
        Value::Int(s.broker_deadlines_missed),
    );
    e.single(
        "throng_broker_answers_late_total",
        "Broker answers that came for a request no longer waiting (past its deadline, or its client gone).",
        Kind::Counter,
        Value::Int(s.broker_answers_late),
    );
    e.family(
        "throng_handshake_failures_total",
        "Transport requests refused or never completed, by reason.",
        Kind::Counter,
    );
    for why in HandshakeFailure::ALL {
        e.sample(
            "throng_handshake_failures_total",
            &[("reason", why.as_str())],
            Value::Int(s.handshake_failures[why as usize]),
        );
    }
    e.single(
        "throng_broker_up",
        "1 while the broker is reachable (always for the memory broker), else 0.",
        Kind::Gauge,
        Value::Int(u64::from(scrape.broker_up)),
    );
    let bounds: Vec<&str> = LATENCY_BOUNDS.iter().map(|&(_, le)| le).collect();
    e.histogram(
        "throng_delivery_latency_seconds",
        "Time from the broker handing a message to the hub until an event loop wrote it to its subscribers' sockets (once per message per loop).",
        &bounds,
        &s.latency.buckets,
        s.latency.sum_ns as f64 / 1e9,
    );
    let bounds: Vec<&str> = TURN_BOUNDS.iter().map(|&(_, le)| le).collect();
    e.histogram(
        "throng_loop_turn_seconds",
        "Time an event loop spent between two waits (all of its connections wait for a turn).",
        &bounds,
        &s.turns,
        s.turn_sum_ns as f64 / 1e9,
    );
    e.single(
        "throng_loop_turn_slowest_seconds",
        "The longest turn of any event loop since the start.",
        Kind::Gauge,
        Value::Float(s.slowest_turn_ns as f64 / 1e9),
    );
    e.single(
        "throng_channels",
        "Channels the broker knows on this node.",
        Kind::Gauge,
        Value::Int(scrape.channels),
    );
    if let Some(bytes) = scrape.history_bytes {
        e.single(
            "throng_history_bytes",
            "History bytes this node holds across its channels (--history-max-bytes).",
            Kind::Gauge,
            Value::Int(bytes),
        );
    }
    e.single(
        "throng_uptime_seconds",
        "Seconds since the server started.",
        Kind::Gauge,
        Value::Float(scrape.uptime.as_secs_f64()),
    );
    if let Some(failover) = scrape.failover {
        e.single(
            "throng_redis_new_epochs_total",
            "Channels with subscribers here whose history started afresh (a Redis failover or restart that may have lost acknowledged publishes); each was told to its subscribers as a gap.",
            Kind::Counter,
            Value::Int(failover.new_epochs),
        );
        e.single(
            "throng_redis_short_waits_total",
            "Publishes whose WAIT (--redis-wait-replicas) came back in 500 ms with fewer replicas than asked.",
            Kind::Counter,
            Value::Int(failover.short_waits),
        );
    }
    if let Some(hooks) = scrape.webhooks {
        e.family(
            "throng_pusher_webhook_events_total",
            "Pusher webhook events by how they ended: delivered (2xx), failed (given up after every retry), dropped (their URL's queue was full).",
            Kind::Counter,
        );
        for (outcome, n) in [
            ("delivered", hooks.delivered),
            ("failed", hooks.failed),
            ("dropped", hooks.dropped),
        ] {
            e.sample(
                "throng_pusher_webhook_events_total",
                &[("outcome", outcome)],
                Value::Int(n),
            );
        }
        e.single(
            "throng_pusher_webhook_retries_total",
            "Pusher webhook requests that failed and were tried again.",
            Kind::Counter,
            Value::Int(hooks.retries),
        );
    }
    if let Some(bytes) = scrape.process.resident_bytes {
        e.single(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            Kind::Gauge,
            Value::Int(bytes),
        );
    }
    if let Some(fds) = scrape.process.open_fds {
        e.single(
            "process_open_fds",
            "Number of open file descriptors.",
            Kind::Gauge,
            Value::Int(fds),
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{LATENCY_BUCKETS, Latencies};

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn a_family_has_help_type_and_its_samples() {
        let mut text = String::new();
        let mut e = Encoder::new(&mut text);
        e.single("a_total", "Things.", Kind::Counter, Value::Int(7));
        e.family("g", "By kind.", Kind::Gauge);
        e.sample("g", &[("kind", "x"), ("zone", "y")], Value::Float(1.5));
        assert_eq!(
            lines(&text),
            [
                "# HELP a_total Things.",
                "# TYPE a_total counter",
                "a_total 7",
                "# HELP g By kind.",
                "# TYPE g gauge",
                r#"g{kind="x",zone="y"} 1.5"#,
            ]
        );
    }

    #[test]
    fn help_and_label_values_are_escaped() {
        let mut text = String::new();
        let mut e = Encoder::new(&mut text);
        e.family("m", "a \\ b\nc \"q\"", Kind::Gauge);
        e.sample("m", &[("l", "x\"y\\z\nw")], Value::Int(0));
        assert_eq!(
            lines(&text),
            [
                r#"# HELP m a \\ b\nc "q""#,
                "# TYPE m gauge",
                r#"m{l="x\"y\\z\nw"} 0"#,
            ]
        );
    }

    #[test]
    fn floats_are_plain_or_named_when_not_finite() {
        let mut out = String::new();
        for v in [
            Value::Float(0.25),
            Value::Float(3.0),
            Value::Float(f64::INFINITY),
            Value::Float(f64::NEG_INFINITY),
            Value::Float(f64::NAN),
            Value::Int(u64::MAX),
        ] {
            v.write(&mut out);
            out.push(' ');
        }
        assert_eq!(out, "0.25 3 +Inf -Inf NaN 18446744073709551615 ");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_count_is_the_inf_bucket() {
        let mut text = String::new();
        let mut e = Encoder::new(&mut text);
        e.histogram("h_seconds", "Latency.", &["0.1", "1"], &[2, 0, 3], 4.5);
        assert_eq!(
            lines(&text),
            [
                "# HELP h_seconds Latency.",
                "# TYPE h_seconds histogram",
                r#"h_seconds_bucket{le="0.1"} 2"#,
                r#"h_seconds_bucket{le="1"} 2"#,
                r#"h_seconds_bucket{le="+Inf"} 5"#,
                "h_seconds_sum 4.5",
                "h_seconds_count 5",
            ]
        );
    }

    #[test]
    fn the_page_shows_every_family_once_with_the_snapshot_values() {
        let mut latency = Latencies::default();
        latency.observe(Duration::from_micros(30));
        latency.observe(Duration::from_secs(10));
        let mut snapshot = Snapshot {
            sockets: 10,
            open: [5, 3, 2, 0],
            ring_receivers: 6,
            ring_sends: 512,
            ring_send_calls: 2,
            published: 4,
            delivered: 12,
            bytes_sent: 999,
            slow_consumers: 1,
            broker_deadlines_missed: 3,
            broker_answers_late: 2,
            latency,
            turns: [5, 1, 0, 0, 0, 1, 0],
            turn_sum_ns: 2_500_000_000,
            slowest_turn_ns: 2_000_000_000,
            ..Snapshot::default()
        };
        snapshot.handshake_failures[HandshakeFailure::Timeout as usize] = 2;
        let scrape = Scrape {
            snapshot,
            channels: 5,
            history_bytes: Some(1234),
            broker_up: true,
            uptime: Duration::from_millis(1500),
            process: Process {
                resident_bytes: Some(4096),
                open_fds: Some(9),
            },
            webhooks: Some(crate::webhooks::Tally {
                delivered: 3,
                ..Default::default()
            }),
            failover: Some(crate::broker::FailoverCounts {
                new_epochs: 4,
                short_waits: 1,
            }),
        };
        let text = render(&scrape);
        let has = |line: &str| text.lines().any(|l| l == line);
        assert!(has("throng_redis_new_epochs_total 4"));
        assert!(has("throng_redis_short_waits_total 1"));
        assert!(has(
            r#"throng_pusher_webhook_events_total{outcome="delivered"} 3"#
        ));
        for line in [
            r#"throng_connections{transport="websocket"} 5"#,
            r#"throng_connections{transport="sse"} 3"#,
            r#"throng_connections{transport="poll"} 2"#,
            "throng_io_uring_receivers 6",
            "throng_io_uring_sends_total 512",
            "throng_io_uring_send_calls_total 2",
            "throng_messages_published_total 4",
            "throng_messages_delivered_total 12",
            "throng_bytes_sent_total 999",
            "throng_slow_consumer_disconnects_total 1",
            r#"throng_handshake_failures_total{reason="timeout"} 2"#,
            r#"throng_handshake_failures_total{reason="bad_request"} 0"#,
            "throng_broker_up 1",
            r#"throng_delivery_latency_seconds_bucket{le="0.000025"} 0"#,
            r#"throng_delivery_latency_seconds_bucket{le="0.00005"} 1"#,
            r#"throng_delivery_latency_seconds_bucket{le="2.5"} 1"#,
            r#"throng_delivery_latency_seconds_bucket{le="+Inf"} 2"#,
            "throng_delivery_latency_seconds_sum 10.00003",
            "throng_delivery_latency_seconds_count 2",
            r#"throng_loop_turn_seconds_bucket{le="0.0001"} 5"#,
            r#"throng_loop_turn_seconds_bucket{le="1"} 6"#,
            r#"throng_loop_turn_seconds_bucket{le="10"} 7"#,
            r#"throng_loop_turn_seconds_bucket{le="+Inf"} 7"#,
            "throng_loop_turn_seconds_sum 2.5",
            "throng_loop_turn_seconds_count 7",
            "throng_loop_turn_slowest_seconds 2",
            "throng_broker_deadlines_missed_total 3",
            "throng_broker_answers_late_total 2",
            "throng_channels 5",
            "throng_history_bytes 1234",
            "throng_uptime_seconds 1.5",
            "process_resident_memory_bytes 4096",
            "process_open_fds 9",
        ] {
            assert!(has(line), "missing {line:?} in\n{text}");
        }
        // Every family has exactly one HELP and one TYPE, before its samples.
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap_or(""))
            .collect();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types.len(), 26, "{text}");
        assert_eq!(helps, types.len());
        let mut unique = types.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), types.len());
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("throng_delivery_latency_seconds_bucket"))
                .count(),
            LATENCY_BUCKETS
        );
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn missing_process_figures_are_left_out() {
        let text = render(&Scrape::default());
        assert!(!text.contains("process_"), "{text}");
        assert!(text.contains("throng_broker_up 0"));
    }

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\tthrong\nVmPeak:\t  9000 kB\nVmRSS:\t   1234 kB\nThreads:\t3\n";
        assert_eq!(vm_rss_bytes(status), Some(1234 * 1024));
        assert_eq!(vm_rss_bytes("VmRSS: lots\n"), None);
        assert_eq!(vm_rss_bytes("Name: x\n"), None);
    }

    #[test]
    fn this_process_has_figures() {
        let p = Process::read();
        assert!(p.resident_bytes.is_some_and(|b| b > 0), "{p:?}");
        assert!(p.open_fds.is_some_and(|n| n >= 3), "{p:?}");
    }
}
