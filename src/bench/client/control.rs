//! The seam between the driver and the loops: the run's [`phase`] (moved by the
//! driver only, read by every loop), [`Control`] (which holds it and wakes the
//! loops when it changes) and [`Live`] (each loop's counters, for the driver's
//! status lines and timeline).
//!
//! It must not hold connections or decide anything: it only carries values
//! across threads.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mio::Waker;

use crate::bench::report::Counters;

/// Phases of a run, moved forward by the driver only.
pub mod phase {
    /// Opening connections; no load yet.
    pub const CONNECTING: u8 = 0;
    /// All connections are open: send load.
    pub const LOAD: u8 = 1;
    /// Stop sending; keep receiving what is in flight.
    pub const DRAIN: u8 = 2;
    /// Close every connection and return the results.
    pub const CLOSE: u8 = 3;
}

/// The phase the driver set, and how to wake the loops when it changes.
#[derive(Debug, Default)]
pub struct Control {
    phase: AtomicU8,
    wakers: Mutex<Vec<Arc<Waker>>>,
}

impl Control {
    pub fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    pub fn set_phase(&self, p: u8) {
        self.phase.store(p, Ordering::Release);
        if let Ok(wakers) = self.wakers.lock() {
            for w in wakers.iter() {
                // A loop that already exited cannot be woken; nothing to do then.
                let _ = w.wake();
            }
        }
    }

    pub(super) fn add_waker(&self, w: Arc<Waker>) {
        if let Ok(mut wakers) = self.wakers.lock() {
            wakers.push(w);
        }
    }
}

/// A loop's counters as the driver sees them while the run goes on.
#[derive(Debug, Default)]
pub struct Live {
    fields: [AtomicU64; 14],
}

impl Live {
    pub(super) fn store(&self, c: &Counters) {
        let values = [
            c.target,
            c.attempted,
            c.opened,
            c.failed,
            c.dropped,
            c.open_now,
            c.frames_in,
            c.messages_in,
            c.messages_out,
            c.pings,
            c.in_flight,
            c.latency_samples,
            c.latency_us_sum,
            c.reconnects,
        ];
        for (f, v) in self.fields.iter().zip(values) {
            f.store(v, Ordering::Relaxed);
        }
    }

    pub fn load(&self) -> Counters {
        let v = |i: usize| self.fields[i].load(Ordering::Relaxed);
        Counters {
            target: v(0),
            attempted: v(1),
            opened: v(2),
            failed: v(3),
            dropped: v(4),
            open_now: v(5),
            frames_in: v(6),
            messages_in: v(7),
            messages_out: v(8),
            pings: v(9),
            in_flight: v(10),
            latency_samples: v(11),
            latency_us_sum: v(12),
            reconnects: v(13),
        }
    }
}
