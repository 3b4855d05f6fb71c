//! The per-second timeline: the fleet's counters turned into rates.
//!
//! Owns [`Phase`], [`TimelineSample`] and [`Timeline`], which the driver feeds
//! once a second while connecting and during the load. It must not read clocks or
//! the fleet itself: the driver passes the time and the counters in.

use serde::Serialize;

use super::counters::Counters;

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
