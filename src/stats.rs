//! Counters every I/O thread keeps, and the seeds' stats block built from them.
//!
//! Each event loop owns one cache-line-aligned [`LoopCounters`] and is its only
//! writer, so counting costs an uncontended relaxed add; most counts are first
//! gathered in the loop's plain [`TurnCounts`] and added once per loop turn.
//! Readers (the stats printer, `/api/stats`, `/metrics`) sum all loops, so a read
//! costs O(loops), never O(connections). This module must not know about sockets
//! or protocol state (its [`Counted`] writer only counts the bytes a socket took).

use std::fmt::Write as _;
use std::io::{self, IoSlice, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why a request for a transport (a WebSocket upgrade, an SSE stream, a
/// long-poll) was refused, or an HTTP request never completed: the reasons the
/// server tells apart, each a label value of `throng_handshake_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// A malformed or unparseable request (400, 405 or 431): a defective upgrade,
    /// a bad channel name or parameter, not HTTP at all.
    BadRequest,
    /// A WebSocket version other than 13 (426).
    UnsupportedVersion,
    /// Over `--max-conns` (503).
    MaxConns,
    /// Over `--max-conns-per-ip` (429).
    MaxConnsPerIp,
    /// A request begun but not complete within `--handshake-timeout` (slowloris).
    /// A kept-alive connection idle between requests is not one.
    Timeout,
    /// The broker could not take the subscription (Redis down).
    BrokerUnavailable,
    /// No valid token, or one not granting the channel (401, 403).
    Unauthorized,
    /// A browser page from an origin `--allowed-origin` does not list (403).
    Origin,
    /// A TLS handshake that failed (plain HTTP to a TLS port, a broken or
    /// truncated ClientHello, no common version or cipher) or did not finish
    /// within `--handshake-timeout`.
    Tls,
}

impl HandshakeFailure {
    pub const COUNT: usize = 9;
    pub const ALL: [HandshakeFailure; Self::COUNT] = [
        HandshakeFailure::BadRequest,
        HandshakeFailure::UnsupportedVersion,
        HandshakeFailure::MaxConns,
        HandshakeFailure::MaxConnsPerIp,
        HandshakeFailure::Timeout,
        HandshakeFailure::BrokerUnavailable,
        HandshakeFailure::Unauthorized,
        HandshakeFailure::Origin,
        HandshakeFailure::Tls,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            HandshakeFailure::BadRequest => "bad_request",
            HandshakeFailure::UnsupportedVersion => "unsupported_version",
            HandshakeFailure::MaxConns => "max_conns",
            HandshakeFailure::MaxConnsPerIp => "max_conns_per_ip",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::BrokerUnavailable => "broker_unavailable",
            HandshakeFailure::Unauthorized => "unauthorized",
            HandshakeFailure::Origin => "origin",
            HandshakeFailure::Tls => "tls",
        }
    }
}

/// Upper bounds of the delivery-latency buckets, in nanoseconds, with the same
/// bound in seconds as the `le` label shows it. A last bucket (`+Inf`) follows.
pub const LATENCY_BOUNDS: [(u64, &str); 16] = [
    (25_000, "0.000025"),
    (50_000, "0.00005"),
    (100_000, "0.0001"),
    (250_000, "0.00025"),
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
    (2_500_000_000, "2.5"),
];
/// Buckets of the latency histogram: one per bound and `+Inf`.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS.len() + 1;

/// Upper bounds of the loop-turn buckets, in nanoseconds and as the `le` label. A
/// turn is an event loop's work between two waits: every connection of the loop
/// waits for it, so a long turn is late answers for all of them.
pub const TURN_BOUNDS: [(u64, &str); 6] = [
    (100_000, "0.0001"),
    (1_000_000, "0.001"),
    (10_000_000, "0.01"),
    (100_000_000, "0.1"),
    (1_000_000_000, "1"),
    (10_000_000_000, "10"),
];
/// Buckets of the turn histogram: one per bound and `+Inf`.
pub const TURN_BUCKETS: usize = TURN_BOUNDS.len() + 1;
/// The first bucket of turns longer than 100 ms, and of those longer than 1 s.
pub const TURN_OVER_100MS: usize = 4;
pub const TURN_OVER_1S: usize = 5;
const _: () = assert!(TURN_BOUNDS[TURN_OVER_100MS - 1].0 == 100_000_000);
const _: () = assert!(TURN_BOUNDS[TURN_OVER_1S - 1].0 == 1_000_000_000);

/// A loop turn's latency observations: plain counts per bucket (not cumulative)
/// and their sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latencies {
    pub buckets: [u64; LATENCY_BUCKETS],
    pub sum_ns: u64,
}

impl Latencies {
    /// Counts one observation: a scan of 16 bounds and two adds.
    pub fn observe(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS
            .iter()
            .position(|&(bound, _)| ns <= bound)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.buckets[bucket] += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    /// How many observations there are (the `+Inf` bucket's cumulative count).
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// Slots for per-transport counts: at least as many as there are transports
/// (`transport::Kind` checks), so adding one does not touch the counters.
pub const OPEN_KINDS: usize = 4;

/// One event loop's counters.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct LoopCounters {
    /// Open connections owned by this loop (WebSocket and event streams).
    pub sockets: AtomicU64,
    /// Of those, how many each transport holds, indexed by `transport::Kind`.
    pub open: [AtomicU64; OPEN_KINDS],
    /// Of those, connections receiving through io_uring now (busy ones; as of the
    /// loop's last sweep).
    pub ring_receivers: AtomicU64,
    /// Sends made through the loop's send ring (fan-outs and held replies), and
    /// the system calls they took (totals, stored by the loop each turn).
    pub ring_sends: AtomicU64,
    pub ring_send_calls: AtomicU64,
    /// Frames received from clients (data and control).
    pub frames_in: AtomicU64,
    /// Whole data messages received from clients.
    pub messages_in: AtomicU64,
    /// Data messages written to clients.
    pub messages_out: AtomicU64,
    /// TCP connections accepted (WebSocket and plain HTTP).
    pub accepted: AtomicU64,
    /// Messages this loop's clients published (HTTP API, chat members).
    pub published: AtomicU64,
    /// Channel messages and events written to subscribers (live fan-out; replays
    /// of history not included).
    pub delivered: AtomicU64,
    /// Bytes the sockets of this loop took (every response, frame and event).
    pub bytes_sent: AtomicU64,
    /// Frames sent compressed (permessage-deflate), one per recipient: the bytes
    /// they would have taken plain, and the bytes they took.
    pub deflate_plain: AtomicU64,
    pub deflate_wire: AtomicU64,
    /// Subscribers closed for passing `--max-queue`.
    pub slow_consumers: AtomicU64,
    /// Requests handed to the broker that got no answer by their deadline
    /// (answered 503), and answers that came for a request no longer waiting.
    pub broker_deadlines_missed: AtomicU64,
    pub broker_answers_late: AtomicU64,
    /// Refused or unfinished handshakes, by [`HandshakeFailure`].
    pub handshake_failures: [AtomicU64; HandshakeFailure::COUNT],
    /// Delivery latency per bucket (not cumulative), see [`Latencies`].
    pub latency_buckets: [AtomicU64; LATENCY_BUCKETS],
    pub latency_sum_ns: AtomicU64,
    /// Turns per bucket (not cumulative), see [`TURN_BOUNDS`], their total time
    /// and the longest.
    pub turn_buckets: [AtomicU64; TURN_BUCKETS],
    pub turn_sum_ns: AtomicU64,
    pub slowest_turn_ns: AtomicU64,
}

impl LoopCounters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one turn of the loop that took `took` (only that loop writes).
    pub fn record_turn(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = TURN_BOUNDS
            .iter()
            .position(|&(bound, _)| ns <= bound)
            .unwrap_or(TURN_BOUNDS.len());
        Self::add(&self.turn_buckets[bucket], 1);
        Self::add(&self.turn_sum_ns, ns);
        if ns > self.slowest_turn_ns.load(Ordering::Relaxed) {
            self.slowest_turn_ns.store(ns, Ordering::Relaxed);
        }
    }
}

/// Counts gathered during one loop turn, added to the loop's counters with one
/// atomic add each (of those that moved) at the end of the turn.
#[derive(Debug, Default)]
pub struct TurnCounts {
    pub frames_in: u64,
    pub messages_in: u64,
    pub messages_out: u64,
    pub published: u64,
    pub delivered: u64,
    pub bytes_sent: u64,
    pub deflate_plain: u64,
    pub deflate_wire: u64,
    pub slow_consumers: u64,
    pub broker_deadlines_missed: u64,
    pub broker_answers_late: u64,
    pub handshake_failures: [u64; HandshakeFailure::COUNT],
    pub latency: Latencies,
}

impl TurnCounts {
    pub fn handshake_failed(&mut self, why: HandshakeFailure) {
        self.handshake_failures[why as usize] += 1;
    }

    /// Adds the turn's counts to `counters` and starts afresh.
    pub fn publish(&mut self, counters: &LoopCounters) {
        let t = std::mem::take(self);
        let add = |counter: &AtomicU64, n: u64| {
            if n > 0 {
                LoopCounters::add(counter, n);
            }
        };
        add(&counters.frames_in, t.frames_in);
        add(&counters.messages_in, t.messages_in);
        add(&counters.messages_out, t.messages_out);
        add(&counters.published, t.published);
        add(&counters.delivered, t.delivered);
        add(&counters.bytes_sent, t.bytes_sent);
        add(&counters.deflate_plain, t.deflate_plain);
        add(&counters.deflate_wire, t.deflate_wire);
        add(&counters.slow_consumers, t.slow_consumers);
        add(&counters.broker_deadlines_missed, t.broker_deadlines_missed);
        add(&counters.broker_answers_late, t.broker_answers_late);
        for (counter, n) in counters.handshake_failures.iter().zip(t.handshake_failures) {
            add(counter, n);
        }
        if t.latency.sum_ns > 0 || t.latency.buckets.iter().any(|&n| n > 0) {
            for (counter, n) in counters.latency_buckets.iter().zip(t.latency.buckets) {
                add(counter, n);
            }
            add(&counters.latency_sum_ns, t.latency.sum_ns);
        }
    }
}

/// A writer that counts the bytes `inner` took, for the loop's `bytes_sent`.
/// Vectored writes stay vectored.
pub struct Counted<'a, W> {
    inner: W,
    bytes: &'a mut u64,
}

impl<'a, W: Write> Counted<'a, W> {
    pub fn new(inner: W, bytes: &'a mut u64) -> Self {
        Counted { inner, bytes }
    }
}

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        *self.bytes += n as u64;
        Ok(n)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = self.inner.write_vectored(bufs)?;
        *self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Totals across all loops at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub sockets: u64,
    /// Open connections by transport, indexed by `transport::Kind`.
    pub open: [u64; OPEN_KINDS],
    pub ring_receivers: u64,
    pub ring_sends: u64,
    pub ring_send_calls: u64,
    pub frames_in: u64,
    pub messages_in: u64,
    pub messages_out: u64,
    pub accepted: u64,
    pub published: u64,
    pub delivered: u64,
    pub bytes_sent: u64,
    /// Frames sent compressed: their plain size and their size on the wire.
    pub deflate_plain: u64,
    pub deflate_wire: u64,
    pub slow_consumers: u64,
    pub broker_deadlines_missed: u64,
    pub broker_answers_late: u64,
    pub handshake_failures: [u64; HandshakeFailure::COUNT],
    pub latency: Latencies,
    /// Loop turns per bucket of [`TURN_BOUNDS`] (not cumulative), their total
    /// time, and the longest turn of any loop.
    pub turns: [u64; TURN_BUCKETS],
    pub turn_sum_ns: u64,
    pub slowest_turn_ns: u64,
}

/// Every loop's counters, shared with whoever reports them.
#[derive(Debug)]
pub struct ServerStats {
    loops: Vec<Arc<LoopCounters>>,
    pub started: Instant,
}

impl ServerStats {
    pub fn new(loops: usize) -> Self {
        ServerStats {
            loops: (0..loops)
                .map(|_| Arc::new(LoopCounters::default()))
                .collect(),
            started: Instant::now(),
        }
    }

    pub fn loop_counters(&self, index: usize) -> Arc<LoopCounters> {
        Arc::clone(&self.loops[index])
    }

    pub fn snapshot(&self) -> Snapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut s = Snapshot::default();
        for l in &self.loops {
            s.sockets += load(&l.sockets);
            for (sum, open) in s.open.iter_mut().zip(&l.open) {
                *sum += load(open);
            }
            s.ring_receivers += load(&l.ring_receivers);
            s.ring_sends += load(&l.ring_sends);
            s.ring_send_calls += load(&l.ring_send_calls);
            s.frames_in += load(&l.frames_in);
            s.messages_in += load(&l.messages_in);
            s.messages_out += load(&l.messages_out);
            s.accepted += load(&l.accepted);
            s.published += load(&l.published);
            s.delivered += load(&l.delivered);
            s.bytes_sent += load(&l.bytes_sent);
            s.deflate_plain += load(&l.deflate_plain);
            s.deflate_wire += load(&l.deflate_wire);
            s.slow_consumers += load(&l.slow_consumers);
            s.broker_deadlines_missed += load(&l.broker_deadlines_missed);
            s.broker_answers_late += load(&l.broker_answers_late);
            for (sum, c) in s.handshake_failures.iter_mut().zip(&l.handshake_failures) {
                *sum += load(c);
            }
            for (sum, c) in s.latency.buckets.iter_mut().zip(&l.latency_buckets) {
                *sum += load(c);
            }
            s.latency.sum_ns += load(&l.latency_sum_ns);
            for (sum, c) in s.turns.iter_mut().zip(&l.turn_buckets) {
                *sum += load(c);
            }
            s.turn_sum_ns += load(&l.turn_sum_ns);
            s.slowest_turn_ns = s.slowest_turn_ns.max(load(&l.slowest_turn_ns));
        }
        s
    }
}

/// The block the seeds print: totals, and rates per minute over the last interval.
pub fn format_block(now: &Snapshot, before: &Snapshot, seconds: f64) -> String {
    let per_min = |a: u64, b: u64| {
        if seconds > 0.0 {
            a.saturating_sub(b) as f64 * 60.0 / seconds
        } else {
            0.0
        }
    };
    let mut out = String::new();
    let _ = writeln!(out, "SOCKETS:          {}", now.sockets);
    let _ = writeln!(out, "FRAMES_TOTAL:     {}", now.frames_in);
    let _ = writeln!(out, "MESSAGES_TOTAL:   {}", now.messages_in);
    let _ = writeln!(
        out,
        "FRAMES_PER_MIN:   {:.1}",
        per_min(now.frames_in, before.frames_in)
    );
    let _ = writeln!(
        out,
        "MESSAGES_PER_MIN: {:.1}",
        per_min(now.messages_in, before.messages_in)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_has_the_seed_layout_and_rates() {
        let before = Snapshot::default();
        let now = Snapshot {
            sockets: 4,
            frames_in: 120,
            messages_in: 60,
            ..Snapshot::default()
        };
        let block = format_block(&now, &before, 30.0);
        assert_eq!(
            block,
            "SOCKETS:          4\nFRAMES_TOTAL:     120\nMESSAGES_TOTAL:   60\nFRAMES_PER_MIN:   240.0\nMESSAGES_PER_MIN: 120.0\n"
        );
    }

    #[test]
    fn latencies_fall_in_the_first_bucket_that_holds_them() {
        let mut l = Latencies::default();
        l.observe(Duration::from_nanos(25_000)); // on the first bound
        l.observe(Duration::from_nanos(25_001));
        l.observe(Duration::from_millis(3));
        l.observe(Duration::from_secs(60)); // past every bound
        assert_eq!(l.buckets[0], 1);
        assert_eq!(l.buckets[1], 1);
        assert_eq!(l.buckets[7], 1, "3 ms is at most 5 ms");
        assert_eq!(l.buckets[LATENCY_BUCKETS - 1], 1);
        assert_eq!(l.count(), 4);
        assert_eq!(l.sum_ns, 25_000 + 25_001 + 3_000_000 + 60_000_000_000);
    }

    #[test]
    fn turns_land_in_their_buckets_and_the_slowest_is_kept() {
        let stats = ServerStats::new(2);
        let zero = stats.loop_counters(0);
        let one = stats.loop_counters(1);
        zero.record_turn(Duration::from_micros(50));
        zero.record_turn(Duration::from_millis(100));
        zero.record_turn(Duration::from_millis(101));
        one.record_turn(Duration::from_secs(3));
        one.record_turn(Duration::from_secs(11));
        one.record_turn(Duration::from_micros(10));
        let s = stats.snapshot();
        assert_eq!(s.turns, [2, 0, 0, 1, 1, 1, 1]);
        assert_eq!(s.turns[TURN_OVER_100MS..].iter().sum::<u64>(), 3);
        assert_eq!(s.turns[TURN_OVER_1S..].iter().sum::<u64>(), 2);
        assert_eq!(s.slowest_turn_ns, 11_000_000_000);
        assert_eq!(
            s.turn_sum_ns,
            50_000 + 100_000_000 + 101_000_000 + 3_000_000_000 + 11_000_000_000 + 10_000
        );
    }

    #[test]
    fn a_turn_adds_every_count_once_and_starts_afresh() {
        let counters = LoopCounters::default();
        let mut turn = TurnCounts {
            published: 2,
            delivered: 6,
            bytes_sent: 100,
            slow_consumers: 1,
            ..TurnCounts::default()
        };
        turn.handshake_failed(HandshakeFailure::Timeout);
        turn.latency.observe(Duration::from_micros(10));
        turn.publish(&counters);
        turn.publish(&counters);
        let stats = ServerStats {
            loops: vec![Arc::new(counters)],
            started: Instant::now(),
        };
        let s = stats.snapshot();
        assert_eq!(
            (s.published, s.delivered, s.bytes_sent, s.slow_consumers),
            (2, 6, 100, 1)
        );
        assert_eq!(s.handshake_failures[HandshakeFailure::Timeout as usize], 1);
        assert_eq!(s.handshake_failures.iter().sum::<u64>(), 1);
        assert_eq!((s.latency.count(), s.latency.sum_ns), (1, 10_000));
    }

    #[test]
    fn counted_writes_add_what_the_writer_took() {
        /// Takes at most `room` bytes per call.
        struct Tight {
            room: usize,
            vectored_calls: usize,
        }
        impl Write for Tight {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                Ok(buf.len().min(self.room))
            }
            fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                self.vectored_calls += 1;
                let total: usize = bufs.iter().map(|b| b.len()).sum();
                Ok(total.min(self.room))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut inner = Tight {
            room: 5,
            vectored_calls: 0,
        };
        let mut sent = 0;
        let mut w = Counted::new(&mut inner, &mut sent);
        assert_eq!(w.write(b"abc").unwrap(), 3);
        assert_eq!(w.write(b"abcdefgh").unwrap(), 5);
        let bufs = [IoSlice::new(b"ab"), IoSlice::new(b"cd")];
        assert_eq!(w.write_vectored(&bufs).unwrap(), 4);
        assert_eq!(sent, 12);
        assert_eq!(inner.vectored_calls, 1, "vectored writes stay vectored");
    }

    #[test]
    fn snapshot_sums_every_loop() {
        let stats = ServerStats::new(3);
        for i in 0..3 {
            LoopCounters::add(&stats.loop_counters(i).frames_in, 5);
        }
        assert_eq!(stats.snapshot().frames_in, 15);
    }
}
