//! A connection's life in the loop: the first connect (at the plan's rate and
//! within `--max-opening`), connect and upgrade timeouts, being counted open,
//! failed or dropped (and why), push mode's `--reconnect` drops and its come-backs
//! after a jittered backoff when the server lets a subscriber go, and what each
//! phase change does (start the load, close everything).
//!
//! It must not parse what a connection reads: each transport's file does, and
//! calls [`ClientLoop::lost`] or [`ClientLoop::remove`] when one ends.

use std::cmp::Reverse;
use std::net::Shutdown;
use std::time::{Duration, Instant};

use mio::{Interest, Token};

use super::conn::{Conn, State, io_reason, send, start_connect};
use super::delivery::unix_nanos;
use super::tls;
use super::{ClientLoop, next_mask, phase};
use crate::bench::report::SeqTrack;
use crate::bench::{Mode, Transport};
use crate::outbound::Outbound;
use crate::protocol::{close_code, encode_client_frame, opcode};

/// The longest a subscriber waits before trying to come back, unless
/// `--backoff-cap` says otherwise (its default is this).
pub const BACKOFF_CAP: Duration = Duration::from_secs(15);

/// Full jitter: a uniform delay in [0, min(cap, base * 2^retries)), so clients
/// let go together come back spread out, not as a storm.
pub(super) fn backoff_delay(base: Duration, cap: Duration, retries: u8, rng: &mut u64) -> Duration {
    let ceiling = base.saturating_mul(1u32 << retries.min(20)).min(cap);
    let unit = f64::from(u32::from_ne_bytes(next_mask(rng))) / (f64::from(u32::MAX) + 1.0);
    ceiling.mul_f64(unit)
}

impl ClientLoop {
    pub(super) fn open_next(&mut self) {
        let threads = self.plan.threads.max(1) as u64;
        let local = self.id as u64 + self.started * threads;
        let global = self.plan.conn_offset + local;
        self.started += 1;
        self.tally.c.attempted += 1;
        let target = self.plan.target(global);
        let stream = start_connect(target, self.plan.source(local));
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                self.tally.c.failed += 1;
                *self.tally.failures.entry(io_reason(&e)).or_default() += 1;
                return;
            }
        };
        let tls = match self.plan.tls.as_ref().map(tls::start).transpose() {
            Ok(t) => t,
            Err(reason) => {
                self.tally.c.failed += 1;
                *self.tally.failures.entry(reason).or_default() += 1;
                return;
            }
        };
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            self.tally.c.failed += 1;
            *self.tally.failures.entry(io_reason(&e)).or_default() += 1;
            return;
        }
        entry.insert(Conn {
            socket: stream,
            index: global as u32,
            attempt: 0,
            state: State::Connecting,
            opened_once: false,
            retries: 0,
            cursor: None,
            resume: None,
            sent_at: 0,
            track: SeqTrack::default(),
            read: None,
            out: Outbound::default(),
            tls,
        });
        self.timeouts.push_back((
            Instant::now() + self.plan.connect_timeout,
            key,
            global as u32,
            0,
        ));
    }

    /// Replaces a connection's socket by a new connect to the same server, keeping
    /// what it knows (its seqs, where to resume). False if the connection is gone.
    pub(super) fn reopen(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        // Deregistering can only fail if the fd is gone; the drop closes it anyway.
        let _ = self.poll.registry().deregister(&mut conn.socket);
        if matches!(conn.state, State::Open | State::Closing) {
            self.tally.c.open_now = self.tally.c.open_now.saturating_sub(1);
        }
        conn.state = State::Connecting;
        let global = u64::from(conn.index);
        let local = global.saturating_sub(self.plan.conn_offset);
        // A new socket, a new TLS session (which resumes the last one's when
        // the server gave it a ticket).
        conn.tls = match self.plan.tls.as_ref().map(tls::start).transpose() {
            Ok(t) => t,
            Err(reason) => {
                self.lost(key, reason);
                return false;
            }
        };
        let stream =
            start_connect(self.plan.target(global), self.plan.source(local)).and_then(|mut s| {
                self.poll.registry().register(
                    &mut s,
                    Token(key),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                Ok(s)
            });
        match stream {
            Ok(s) => {
                conn.socket = s;
                conn.read = None;
                conn.out = Outbound::default();
                conn.attempt = conn.attempt.wrapping_add(1);
                self.timeouts.push_back((
                    Instant::now() + self.plan.connect_timeout,
                    key,
                    conn.index,
                    conn.attempt,
                ));
                true
            }
            Err(e) => {
                self.lost(key, format!("reconnect: {}", io_reason(&e)));
                false
            }
        }
    }

    /// The server let a subscriber go in a way that says "come back" (1001, a
    /// reset, a refused connect, a proxy's 5xx ...). A push subscriber then
    /// returns after a jittered backoff and resumes where it was; anything else
    /// is dropped with `reason`.
    pub(super) fn lost(&mut self, key: usize, reason: String) {
        let base = self.plan.comeback_backoff;
        let returns = self.plan.mode == Mode::Push
            && !base.is_zero()
            && self.seen_phase < phase::CLOSE
            && self.conns.get(key).is_some_and(|c| c.opened_once);
        if !returns {
            return self.remove(key, Some(reason));
        }
        let now_mono = (self.epoch.elapsed().as_nanos() as u64).max(1);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        // Deregistering can only fail if the fd is gone; shutting it down the same.
        let _ = self.poll.registry().deregister(&mut conn.socket);
        let _ = conn.socket.shutdown(Shutdown::Both);
        if matches!(conn.state, State::Open | State::Closing) {
            self.tally.c.open_now = self.tally.c.open_now.saturating_sub(1);
        }
        if conn.sent_at == 0 {
            conn.sent_at = now_mono;
            self.tally.comeback.mark(unix_nanos() / 1_000_000, 0);
        }
        *self.tally.comeback.reasons.entry(reason).or_default() += 1;
        conn.state = State::Away;
        conn.read = None;
        conn.out = Outbound::default();
        conn.tls = None;
        let delay = backoff_delay(
            base,
            self.plan.comeback_backoff_cap,
            conn.retries,
            &mut self.rng,
        );
        conn.retries = conn.retries.saturating_add(1);
        self.comebacks
            .push(Reverse((Instant::now() + delay, key, conn.attempt)));
    }

    /// Connects again the subscribers whose backoff is over.
    pub(super) fn comeback_due(&mut self, now: Instant) {
        while let Some(&Reverse((at, key, attempt))) = self.comebacks.peek() {
            if at > now {
                break;
            }
            self.comebacks.pop();
            let waiting = self
                .conns
                .get(key)
                .is_some_and(|c| c.attempt == attempt && c.state == State::Away);
            if waiting {
                self.tally.comeback.mark(unix_nanos() / 1_000_000, 1);
                self.reopen(key);
            }
        }
    }

    /// Drops and resumes the `--reconnect` subscribers whose turn it is.
    pub(super) fn reconnect_due(&mut self, now: Instant) {
        while let Some(&(at, key, index)) = self.reconnect_queue.front() {
            if at > now {
                break;
            }
            self.reconnect_queue.pop_front();
            let Some(conn) = self.conns.get(key).filter(|c| c.index == index) else {
                continue;
            };
            // Only a subscriber that knows where it is can prove it resumed.
            let knows_position = match self.plan.transport {
                Transport::Ws => conn.track.seen_any(),
                Transport::Sse => conn.resume.is_some(),
                Transport::Poll => conn.cursor.is_some(),
            };
            let next = at + self.plan.reconnect_interval;
            if conn.state != State::Open || !knows_position {
                self.reconnect_queue.push_back((next, key, index));
                continue;
            }
            if self.reopen(key) {
                self.tally.c.reconnects += 1;
                self.reconnect_queue.push_back((next, key, index));
            }
        }
    }

    pub(super) fn expire_timeouts(&mut self, now: Instant) {
        while let Some(&(at, key, index, attempt)) = self.timeouts.front() {
            if at > now {
                break;
            }
            self.timeouts.pop_front();
            let pending = self.conns.get(key).is_some_and(|c| {
                c.index == index
                    && c.attempt == attempt
                    && matches!(
                        c.state,
                        State::Connecting | State::Handshake | State::Subscribing
                    )
            });
            if pending {
                self.remove(key, Some("timed out".into()));
            }
        }
    }

    /// Drops a connection; `reason` counts it as failed (not yet open) or dropped.
    pub(super) fn remove(&mut self, key: usize, reason: Option<String>) {
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        // Deregistering can only fail if the fd is gone; the drop closes it anyway.
        let _ = self.poll.registry().deregister(&mut conn.socket);
        let c = &mut self.tally.c;
        if matches!(conn.state, State::Open | State::Closing) {
            c.open_now = c.open_now.saturating_sub(1);
            if conn.sent_at != 0 && self.plan.mode == Mode::Echo {
                c.in_flight = c.in_flight.saturating_sub(1);
            }
        }
        // A subscriber that fails while reconnecting was open before: dropped.
        let was_open = conn.opened_once;
        // `None`: a quiet removal (end of run); an open connection closing during
        // the close phase is the end of the run too, whatever the server said.
        let Some(reason) = reason else {
            return;
        };
        if was_open && self.seen_phase >= phase::CLOSE {
            return;
        }
        if was_open {
            c.dropped += 1;
        } else {
            c.failed += 1;
        }
        *self.tally.failures.entry(reason).or_default() += 1;
    }
    /// The connection is open: counted once, however often it reconnects.
    pub(super) fn mark_open(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.state = State::Open;
        if !conn.opened_once {
            conn.opened_once = true;
            self.tally.c.opened += 1;
        }
        self.tally.c.open_now += 1;
        // A poll is back when its answer comes (a 503 may come instead).
        if self.plan.transport != Transport::Poll {
            self.came_back(key);
        }
    }

    /// A subscriber let go is subscribed again: its time away is counted and its
    /// backoff starts over.
    pub(super) fn came_back(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if self.plan.mode == Mode::Push && conn.sent_at != 0 {
            let away = (self.epoch.elapsed().as_nanos() as u64).saturating_sub(conn.sent_at);
            self.tally.away.saturating_record((away / 1_000_000).max(1));
            self.tally.comeback.mark(unix_nanos() / 1_000_000, 2);
            conn.sent_at = 0;
        }
        conn.retries = 0;
    }
    pub(super) fn enter_phase(&mut self, p: u8) {
        let from = self.seen_phase;
        self.seen_phase = p;
        if from < phase::LOAD && p == phase::LOAD {
            let open: Vec<(usize, u32)> = self
                .conns
                .iter()
                .filter(|(_, c)| c.opened_once)
                .map(|(k, c)| (k, c.index))
                .collect();
            match self.plan.mode {
                Mode::Echo => {
                    for (key, _) in open {
                        self.send_echo(key);
                    }
                }
                Mode::Chat => {
                    let senders: Vec<(usize, u32)> = open
                        .into_iter()
                        .filter(|(_, i)| self.plan.is_sender(u64::from(*i)))
                        .collect();
                    let n = senders.len().max(1) as u32;
                    let start = Instant::now();
                    for (i, (key, index)) in senders.into_iter().enumerate() {
                        // Spread the first sends over one interval.
                        let at = start + self.plan.send_interval * i as u32 / n;
                        self.chat_queue.push_back((at, key, index));
                    }
                }
                Mode::Push if self.plan.reconnect > 0.0 => {
                    let chosen: Vec<(usize, u32)> = open
                        .into_iter()
                        .filter(|(_, i)| self.plan.is_reconnecter(u64::from(*i)))
                        .collect();
                    let n = chosen.len().max(1) as u32;
                    let interval = self.plan.reconnect_interval;
                    // Everyone gets one interval of messages first, then the drops
                    // are spread evenly over each interval.
                    let start = Instant::now() + interval;
                    for (i, (key, index)) in chosen.into_iter().enumerate() {
                        let at = start + interval * i as u32 / n;
                        self.reconnect_queue.push_back((at, key, index));
                    }
                }
                Mode::Idle | Mode::Push | Mode::Handshakes => {}
            }
        }
        if p >= phase::CLOSE && from < phase::CLOSE {
            self.begin_close();
        }
    }

    pub(super) fn begin_close(&mut self) {
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if !conn.opened_once {
                // Still connecting when the run ends.
                self.remove(key, Some("not open when the run ended".into()));
                continue;
            }
            if conn.state != State::Away {
                self.sockets_open_end += 1;
            }
            if self.plan.mode == Mode::Push {
                let ch = self.plan.channel_of(u64::from(conn.index));
                if let Some(agg) = self.channels.get_mut(ch) {
                    agg.add_track(&conn.track);
                }
            }
            if self.plan.transport != Transport::Ws || conn.state != State::Open {
                // No close handshake: a stream or a poll just ends (and so does a
                // subscriber caught between two connections).
                self.remove(key, None);
                continue;
            }
            self.scratch.clear();
            encode_client_frame(
                &mut self.scratch,
                opcode::CLOSE,
                true,
                &close_code::NORMAL.to_be_bytes(),
                next_mask(&mut self.rng),
            );
            conn.state = State::Closing;
            if send(conn, &self.scratch).is_err() {
                self.remove(key, None);
            }
        }
    }
}
