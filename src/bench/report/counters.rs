//! What one event loop or process counts, and how results add up.
//!
//! Owns [`Counters`] (the live, monotonic counts the driver samples) and
//! [`RawResult`] (everything one process measured, what a child sends its parent)
//! with the merge of several of them. It must not compute rates or verdicts:
//! [`super::Report`] does that from the merged result.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::comeback::ComebackTally;
use super::histogram::{add_pairs, histogram_pairs, new_histogram};
use super::seq::{ChannelAgg, SeqCounts};

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
