//! The loop's time: the clock and its wheel, every connection's deadline
//! (handshake, ping, idle, close, linger, a long-poll's answer), token expiry, and
//! the periodic turns (the ring's receive sweep, the watch on replays waiting for
//! a stalled reader, the broker's housekeeping). It
//! must not write a transport's bytes itself: a heartbeat or goodbye is the
//! transport's, through the connection's mode.

use super::EventLoop;
use crate::config::ServeConfig;
use crate::server::conn::{Beat, Conn, Mode, NEVER, Phase};
use crate::server::timer::{Tick, TimerWheel, next_in_phase, ticks};
use crate::stats::HandshakeFailure;
use crate::timing::{
    CATCH_UP_SWEEP_EVERY, LATE_PING, RECEIVE_SWEEP_EVERY, REPLAY_STALL, maintain_every,
};
use crate::transport::CloseReason;

/// Timers one turn handles at most; the rest in the next turns. A broadcast
/// that held a loop's pings back left thousands due at once, and one turn
/// sending them all kept a publisher waiting for seconds on a crowded box.
const TIMERS_PER_TURN: usize = 256;

/// The loop's clock, its wheel and the periods it keeps.
pub(super) struct Clock {
    pub(super) wheel: TimerWheel,
    /// The tick of the current turn.
    pub(super) now: Tick,
    pub(super) ping_ticks: Tick,
    pub(super) idle_ticks: Tick,
    pub(super) handshake_ticks: Tick,
    /// Counts opened connections, to spread their first pings.
    pub(super) ping_seq: u32,
    /// What the wheel gave back (kept for its allocation), and how much of it
    /// has been handled: the rest is due and waits for the next turns.
    expired: Vec<(u32, Tick)>,
    expired_done: usize,
    next_maintain: Tick,
    next_receive_sweep: Tick,
    next_catch_up_sweep: Tick,
}

/// A connection whose replay waits for its socket, and when it last moved.
#[derive(Debug, Clone, Copy)]
pub(super) struct CatchUp {
    key: u32,
    moved_at: Tick,
}

impl Clock {
    pub(super) fn new(config: &ServeConfig) -> Self {
        Clock {
            wheel: TimerWheel::new(),
            now: 0,
            ping_ticks: ticks(config.ping_interval),
            idle_ticks: ticks(config.idle_timeout),
            handshake_ticks: ticks(config.handshake_timeout).max(1),
            ping_seq: 0,
            expired: Vec::new(),
            expired_done: 0,
            next_maintain: ticks(maintain_every()),
            next_receive_sweep: ticks(RECEIVE_SWEEP_EVERY),
            next_catch_up_sweep: ticks(CATCH_UP_SWEEP_EVERY),
        }
    }

    /// Whether timers that are due wait for a turn.
    pub(super) fn has_backlog(&self) -> bool {
        self.expired_done < self.expired.len()
    }
}

impl EventLoop {
    /// The turn's timekeeping, after its I/O.
    pub(super) fn keep_time(&mut self) {
        // Pings and timeouts wait while a fan-out is part done: a ping can wait
        // a second where a broadcast cannot. At a million connections on two
        // cores the heartbeats alone take most of the machine, and sending them
        // between a broadcast's slices made it reach everyone 3x later
        // (docs/BENCHMARKS.md §29). What the peers send (their pings, requests,
        // a publish) is still served between slices.
        if !self.subscribers.has_pending() {
            self.run_timers(TIMERS_PER_TURN);
        }
        self.expire_tokens();
        self.resume_accepting();
        let now = self.clock.now;
        if now >= self.clock.next_receive_sweep {
            self.clock.next_receive_sweep = now + ticks(RECEIVE_SWEEP_EVERY);
            self.ring.sweep(&self.tally.shared);
        }
        if now >= self.clock.next_catch_up_sweep {
            self.clock.next_catch_up_sweep = now + ticks(CATCH_UP_SWEEP_EVERY);
            self.sweep_catch_ups();
        }
        if self.index == 0 && now >= self.clock.next_maintain {
            self.clock.next_maintain = now + ticks(maintain_every());
            self.shared.broker.maintain();
        }
    }

    /// Connection `key` has a replay waiting for its socket: watch it for a
    /// stall from now on (see [`REPLAY_STALL`]).
    pub(super) fn watch_catch_up(&mut self, key: usize) {
        // A key reused since an earlier entry: one entry per connection.
        self.catch_ups.retain(|c| c.key as usize != key);
        self.catch_ups.push(CatchUp {
            key: key as u32,
            moved_at: self.clock.now,
        });
    }

    /// Gives up on the replays whose readers took nothing for [`REPLAY_STALL`];
    /// forgets those that are written (or whose connection is gone).
    fn sweep_catch_ups(&mut self) {
        if self.catch_ups.is_empty() {
            return;
        }
        let now = self.clock.now;
        let stall = ticks(REPLAY_STALL);
        let max_queue = self.shared.config.max_queue;
        let mut stalled = Vec::new();
        let conns = &mut self.conns;
        self.catch_ups.retain_mut(|c| {
            let Some(conn) = conns.get_mut(c.key as usize) else {
                return false;
            };
            if !conn.out.has_catch_up() {
                return false;
            }
            let kernel_unsent =
                crate::os::unsent_bytes(std::os::fd::AsRawFd::as_raw_fd(&conn.socket));
            if conn.out.catch_up_moved(kernel_unsent) {
                c.moved_at = now;
                return true;
            }
            if now.saturating_sub(c.moved_at) < stall {
                return true;
            }
            conn.out.count_catch_up();
            if conn.out.counted_bytes() > max_queue {
                stalled.push(c.key as usize);
            }
            false
        });
        for key in stalled {
            self.tally.turn.slow_consumers += 1;
            self.drop_conn(key);
        }
    }

    /// Handles at most `most` of the timers that are due.
    fn run_timers(&mut self, most: usize) {
        let now = self.clock.now;
        let mut expired = std::mem::take(&mut self.clock.expired);
        if self.clock.expired_done >= expired.len() {
            expired.clear();
            self.clock.expired_done = 0;
            self.clock.wheel.expire(now, &mut expired);
        }
        let from = self.clock.expired_done;
        let until = expired.len().min(from + most);
        self.clock.expired_done = until;
        for &(key, tick) in &expired[from..until] {
            let key = key as usize;
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if conn.timer_slot != tick {
                continue; // superseded by an earlier entry
            }
            conn.timer_slot = NEVER;
            if conn.deadline == NEVER {
                continue;
            }
            if conn.deadline > now {
                let due = conn.deadline;
                set_deadline(&mut self.clock.wheel, key, conn, due);
                continue;
            }
            if conn.phase == Phase::Active && matches!(conn.mode, Mode::Asking(_)) {
                self.on_broker_late(key);
                continue;
            }
            // An HTTP request, a close or a linger that ran out of time ends here;
            // an open connection is due a ping or has been idle too long.
            let open = conn.phase == Phase::Active && conn.mode.is_counted();
            if open {
                self.on_open_timer(key);
            } else {
                // A request begun and not finished in time (a kept-alive connection
                // idle between requests has nothing pending).
                if self.tls.get(key).is_some_and(|t| t.is_handshaking()) {
                    self.tally.turn.handshake_failed(HandshakeFailure::Tls);
                } else if conn.phase == Phase::Active && conn.mode.has_partial_request() {
                    self.tally.turn.handshake_failed(HandshakeFailure::Timeout);
                }
                self.drop_conn(key);
            }
        }
        self.clock.expired = expired;
    }

    /// Closes the subscriptions whose token has expired (`--token-secret`).
    fn expire_tokens(&mut self) {
        if !self.subscribers.has_expiring() {
            return;
        }
        let mut expired = Vec::new();
        self.subscribers
            .take_expired(crate::auth::now_secs(), &self.conns, &mut expired);
        for key in expired {
            self.close_with(key, CloseReason::TokenExpired);
        }
    }

    /// An open connection's deadline: it has been idle too long, or is due its
    /// heartbeat (a long-poll's is its answer).
    fn on_open_timer(&mut self, key: usize) {
        let now = self.clock.now;
        let (ping_ticks, idle_ticks) = (self.clock.ping_ticks, self.clock.idle_ticks);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let silent = idle_ticks > 0
            && conn.mode.expects_input()
            && now.saturating_sub(conn.last_seen) >= idle_ticks;
        // A ping this loop sends late (it was busy with fan-outs, which pings
        // wait for) is not the client's fault: its silence is counted from the
        // ping on, with one interval to answer, instead of closing a client that
        // was never asked.
        let ping_late =
            conn.next_ping != NEVER && now.saturating_sub(conn.next_ping) >= ticks(LATE_PING);
        if silent && !ping_late {
            self.close_with(key, CloseReason::IdleTimeout);
            return;
        }
        if silent {
            conn.last_seen = seen_until_asked(conn.last_seen, now, ping_ticks, idle_ticks);
        }
        if conn.next_ping != NEVER && now >= conn.next_ping {
            let action = due_beat(
                now - conn.next_ping,
                conn.beat,
                conn.mode.expects_input(),
                ping_ticks,
            );
            conn.next_ping = match action {
                BeatAction::Defer(by) => now.saturating_add(by),
                _ if ping_ticks > 0 => next_in_phase(conn.next_ping, now, ping_ticks),
                _ => NEVER,
            };
            match action {
                BeatAction::Defer(_) => conn.beat.defer(),
                _ => conn.beat.beat(action == BeatAction::Skip),
            }
            if action != BeatAction::Send {
                conn.last_seen =
                    seen_until_asked(conn.last_seen, conn.next_ping, ping_ticks, idle_ticks);
            }
            let due = next_due(conn, idle_ticks);
            set_deadline(&mut self.clock.wheel, key, conn, due);
            if matches!(action, BeatAction::Defer(_)) {
                return;
            }
            // Bytes waiting for a writable edge are offered again once an
            // interval: a send the kernel refused for want of memory rather
            // than a full socket raises no edge while nothing of the socket's is
            // in flight, and they would wait for the peer's next move.
            if !conn.out.is_empty()
                && conn
                    .flush(self.tls.get_mut(key), &mut self.tally.turn.bytes_sent)
                    .is_err()
            {
                self.drop_conn(key);
                return;
            }
            if action == BeatAction::Skip {
                return;
            }
            self.buf.out.clear();
            let after = conn.mode.write_heartbeat(&mut self.buf.out);
            self.send_out(key, after);
            return;
        }
        let due = next_due(conn, idle_ticks);
        set_deadline(&mut self.clock.wheel, key, conn, due);
    }
}

/// What a heartbeat that came due does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BeatAction {
    Send,
    Skip,
    /// Put off by this many ticks, once.
    Defer(Tick),
}

/// What a heartbeat does that came due `late_by` ago.
///
/// A loop late with pings was busy: a broadcast's slices come first, and pings
/// wait for them. Sending every ping it held up at once, after a million's
/// broadcast, took half the machine while other loops' broadcasts were still
/// going out; and so did the on-time pings of loops that had finished, to
/// clients that had just been sent the broadcast (docs/BENCHMARKS.md §32).
///
/// So a ping is skipped when the loop comes to it over a second late, or when a
/// fan-out wrote to the connection since the last one: a message is the
/// keep-alive a ping is, for the client and any proxy between. What a message
/// does not show is that the client is there, so two are never skipped in a
/// row, and a client that pongs (WebSocket, Pusher) is asked at least every
/// other interval. A late one that may not be skipped is put off by as long as
/// it was late (an interval at most), once: the pings a stall held up then go
/// out over as long as the stall lasted, at the pace they came due, not at once.
/// One that may not be skipped after a message is put off half an interval
/// more, once: the million's second broadcast met the pings owed since the
/// first, and they slowed its tail by a second (docs/BENCHMARKS.md §33); half
/// an interval later the broadcast is out, and the client is still asked.
/// An event stream's heartbeat is how a dead client shows and a long-poll's is
/// its answer: they are sent, however late.
pub(super) fn due_beat(
    late_by: Tick,
    beat: Beat,
    expects_input: bool,
    ping_ticks: Tick,
) -> BeatAction {
    let late = late_by >= ticks(LATE_PING);
    if !expects_input {
        return BeatAction::Send;
    }
    let needless = late || beat.delivered();
    if needless && !beat.skipped() && !beat.deferred() {
        return BeatAction::Skip;
    }
    if needless && !beat.deferred() && ping_ticks > 0 {
        let after_message = if beat.delivered() { ping_ticks / 2 } else { 0 };
        return BeatAction::Defer(late_by.min(ping_ticks) + after_message);
    }
    BeatAction::Send
}

/// A client must not be closed as silent before it has been asked: one whose
/// ping comes late, or is skipped or put off, gets an interval after the ping
/// at `asked_at` to answer.
pub(super) fn seen_until_asked(
    last_seen: Tick,
    asked_at: Tick,
    ping_ticks: Tick,
    idle_ticks: Tick,
) -> Tick {
    if idle_ticks == 0 || asked_at == NEVER {
        return last_seen;
    }
    let answer_within = ping_ticks.clamp(1, idle_ticks);
    last_seen.max(
        asked_at
            .saturating_add(answer_within)
            .saturating_sub(idle_ticks),
    )
}

/// When an open connection must next be looked at: its next ping or its idle limit.
pub(super) fn next_due(conn: &Conn, idle_ticks: Tick) -> Tick {
    let idle = if idle_ticks > 0 && conn.mode.expects_input() {
        conn.last_seen.saturating_add(idle_ticks)
    } else {
        NEVER
    };
    conn.next_ping.min(idle)
}

/// Sets a connection's deadline, filing a wheel entry only if none would come
/// round in time (later deadlines are found lazily when the old entry fires).
pub(super) fn set_deadline(wheel: &mut TimerWheel, key: usize, conn: &mut Conn, due: Tick) {
    conn.deadline = due;
    if due == NEVER {
        return;
    }
    if conn.timer_slot == NEVER || due < conn.timer_slot {
        conn.timer_slot = wheel.schedule(key as u32, due);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_needless_ping_is_skipped_once_a_late_one_is_put_off_once_and_only_a_pong_s() {
        let late = ticks(LATE_PING);
        let fresh = Beat::default();
        let mut delivered = Beat::default();
        delivered.mark_delivered();
        let mut skipped = Beat::default();
        skipped.beat(true);
        let mut skipped_and_delivered = skipped;
        skipped_and_delivered.mark_delivered();
        let mut put_off = skipped;
        put_off.defer();
        assert_eq!(
            due_beat(0, fresh, true, 250),
            BeatAction::Send,
            "on time, nothing sent since"
        );
        assert_eq!(due_beat(0, delivered, true, 250), BeatAction::Skip);
        assert_eq!(due_beat(late, fresh, true, 250), BeatAction::Skip);
        // Never two in a row: on time it goes, late it is put off as long as it
        // was late, an interval at most, and only once.
        assert_eq!(due_beat(0, skipped, true, 250), BeatAction::Send);
        assert_eq!(due_beat(late, skipped, true, 250), BeatAction::Defer(late));
        assert_eq!(due_beat(900, skipped, true, 250), BeatAction::Defer(250));
        assert_eq!(due_beat(late, put_off, true, 250), BeatAction::Send);
        // After a message, half an interval more, and still only once.
        assert_eq!(
            due_beat(0, skipped_and_delivered, true, 250),
            BeatAction::Defer(125)
        );
        assert_eq!(
            due_beat(late, skipped_and_delivered, true, 250),
            BeatAction::Defer(late + 125)
        );
        let mut put_off_after_message = skipped_and_delivered;
        put_off_after_message.defer();
        assert_eq!(
            due_beat(0, put_off_after_message, true, 250),
            BeatAction::Send
        );
        // An event stream's and a long-poll's are sent, however late.
        assert_eq!(due_beat(late, delivered, false, 250), BeatAction::Send);
    }

    #[test]
    fn a_client_not_yet_asked_has_an_interval_after_its_ping_to_answer() {
        // Pinged every 30, closed after 60 silent: the pong of 10 would run
        // out at 70, the very tick of the next ping after the skipped 40.
        assert_eq!(seen_until_asked(10, 70, 30, 60), 40);
        // Nothing to move when the limit is far enough already.
        assert_eq!(seen_until_asked(50, 70, 25, 60), 50);
        // No idle limit, no pings: nothing to keep.
        assert_eq!(seen_until_asked(10, 70, 30, 0), 10);
        assert_eq!(seen_until_asked(10, NEVER, 0, 60), 10);
    }
}
