//! Counters every I/O thread keeps, and the seeds' stats block built from them.
//!
//! Each event loop owns one cache-line-aligned [`LoopCounters`] and is its only
//! writer, so counting a frame costs an uncontended relaxed add; readers (the stats
//! printer, later the API and metrics) sum all loops. This module must not know
//! about sockets or protocol state.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One event loop's counters.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct LoopCounters {
    /// Open connections owned by this loop (WebSocket and event streams).
    pub sockets: AtomicU64,
    /// Of those, Server-Sent Event streams.
    pub sse: AtomicU64,
    /// Of those, waiting long-polls.
    pub poll: AtomicU64,
    /// Frames received from clients (data and control).
    pub frames_in: AtomicU64,
    /// Whole data messages received from clients.
    pub messages_in: AtomicU64,
    /// Data messages written to clients.
    pub messages_out: AtomicU64,
    /// TCP connections accepted (WebSocket and plain HTTP).
    pub accepted: AtomicU64,
}

impl LoopCounters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Counts gathered during one loop turn, added to the loop's counters with one
/// atomic add each at the end of the turn.
#[derive(Debug, Default)]
pub struct TurnCounts {
    pub frames_in: u64,
    pub messages_in: u64,
    pub messages_out: u64,
}

impl TurnCounts {
    /// Adds the turn's counts to `counters` and starts afresh.
    pub fn publish(&mut self, counters: &LoopCounters) {
        let t = std::mem::take(self);
        for (counter, n) in [
            (&counters.frames_in, t.frames_in),
            (&counters.messages_in, t.messages_in),
            (&counters.messages_out, t.messages_out),
        ] {
            if n > 0 {
                LoopCounters::add(counter, n);
            }
        }
    }
}

/// Totals across all loops at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub sockets: u64,
    pub sse: u64,
    pub poll: u64,
    pub frames_in: u64,
    pub messages_in: u64,
    pub messages_out: u64,
    pub accepted: u64,
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
        let mut s = Snapshot::default();
        for l in &self.loops {
            s.sockets += l.sockets.load(Ordering::Relaxed);
            s.sse += l.sse.load(Ordering::Relaxed);
            s.poll += l.poll.load(Ordering::Relaxed);
            s.frames_in += l.frames_in.load(Ordering::Relaxed);
            s.messages_in += l.messages_in.load(Ordering::Relaxed);
            s.messages_out += l.messages_out.load(Ordering::Relaxed);
            s.accepted += l.accepted.load(Ordering::Relaxed);
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
    fn snapshot_sums_every_loop() {
        let stats = ServerStats::new(3);
        for i in 0..3 {
            LoopCounters::add(&stats.loop_counters(i).frames_in, 5);
        }
        assert_eq!(stats.snapshot().frames_in, 15);
    }
}
