//! A lazy timer wheel for one event loop: handshake deadlines, pings, idle and
//! linger timeouts for every connection at four bytes per connection.
//!
//! Each connection has at most one live entry (its key), filed under the tick it
//! should next be looked at. Activity does not touch the wheel: when an entry comes
//! due, the loop checks the connection's real deadlines and files it again. Entries
//! for deadlines beyond the wheel's horizon are filed at the horizon and refiled
//! when they come round. This module knows ticks and keys, nothing of connections.

use std::time::{Duration, Instant};

use crate::timing::WHEEL_TICK;

/// Slots in the wheel (must be a power of two); the horizon is SLOTS × WHEEL_TICK (~82 s).
const SLOTS: usize = 4096;

/// Time in ticks since the loop started; u32 lasts 2.7 years at 20 ms.
pub type Tick = u32;

pub fn ticks(d: Duration) -> Tick {
    let t = d.as_millis() / WHEEL_TICK.as_millis();
    Tick::try_from(t).unwrap_or(Tick::MAX / 2)
}

/// The first tick after `now` that is a whole number of `every` past `due`: a
/// periodic deadline that fired late (a stalled loop) keeps its phase, so deadlines
/// spread over the interval stay spread instead of all falling due together one
/// interval after the stall.
pub fn next_in_phase(due: Tick, now: Tick, every: Tick) -> Tick {
    let every = every.max(1);
    let late_by = now.saturating_sub(due);
    due.saturating_add(every.saturating_mul(late_by / every + 1))
}

#[derive(Debug)]
pub struct TimerWheel {
    start: Instant,
    slots: Vec<Vec<u32>>,
    /// The last tick whose slot has been drained.
    done: Tick,
}

impl TimerWheel {
    pub fn new() -> Self {
        TimerWheel {
            start: Instant::now(),
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            done: 0,
        }
    }

    pub fn now(&self) -> Tick {
        ticks(self.start.elapsed())
    }

    /// Files `key` to be looked at on `due` (or the horizon, if further away).
    /// Returns the tick it was actually filed under, for the stale-entry check.
    pub fn schedule(&mut self, key: u32, due: Tick) -> Tick {
        let earliest = self.done.wrapping_add(1);
        let latest = self.done.wrapping_add(SLOTS as Tick - 1);
        let at = due.clamp(earliest, latest);
        self.slots[at as usize & (SLOTS - 1)].push(key);
        at
    }

    /// Takes the keys of every slot from the last drained tick up to `now`, with the
    /// tick each was filed under. `out` is reused to avoid allocating per tick.
    pub fn expire(&mut self, now: Tick, out: &mut Vec<(u32, Tick)>) {
        while self.done < now {
            self.done += 1;
            let tick = self.done;
            let slot = &mut self.slots[tick as usize & (SLOTS - 1)];
            out.extend(slot.drain(..).map(|k| (k, tick)));
            if slot.capacity() > 1024 && slot.capacity() > 4 * slot.len().max(1) {
                // A burst of connections must not pin its peak forever.
                slot.shrink_to_fit();
            }
        }
    }

    /// Time until the next tick, for the poll timeout.
    pub fn until_next_tick(&self) -> Duration {
        let next = WHEEL_TICK * (self.done + 1);
        next.saturating_sub(self.start.elapsed())
    }
}

impl Default for TimerWheel {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_due_on_their_tick() {
        let mut wheel = TimerWheel::new();
        let a = wheel.schedule(1, 5);
        let b = wheel.schedule(2, 10);
        assert_eq!((a, b), (5, 10));
        let mut out = Vec::new();
        wheel.expire(4, &mut out);
        assert!(out.is_empty());
        wheel.expire(7, &mut out);
        assert_eq!(out, vec![(1, 5)]);
        out.clear();
        wheel.expire(10, &mut out);
        assert_eq!(out, vec![(2, 10)]);
    }

    #[test]
    fn past_and_far_deadlines_are_clamped() {
        let mut wheel = TimerWheel::new();
        let mut out = Vec::new();
        wheel.expire(100, &mut out);
        assert_eq!(wheel.schedule(1, 3), 101);
        assert_eq!(wheel.schedule(2, 1_000_000), 100 + SLOTS as Tick - 1);
    }

    #[test]
    fn a_late_periodic_deadline_keeps_its_phase() {
        // On time, or a tick late: one interval after the deadline.
        assert_eq!(next_in_phase(100, 100, 50), 150);
        assert_eq!(next_in_phase(100, 101, 50), 150);
        // A stall of several intervals skips the missed rounds, keeping the phase.
        assert_eq!(next_in_phase(100, 260, 50), 300);
        assert_eq!(next_in_phase(100, 250, 50), 300);
        // Two deadlines a tick apart stay apart however long the stall was.
        assert_eq!(next_in_phase(101, 260, 50), 301);
        assert_eq!(next_in_phase(100, 100, 0), 101);
    }
}
