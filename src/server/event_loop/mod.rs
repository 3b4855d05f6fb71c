//! One I/O thread: an event loop that owns its listeners' accepted sockets, their
//! [`Conn`] records in a slab, and a timer wheel. It waits through its
//! [`Uring`](super::uring::Uring) (io_uring receives, and epoll polled through the
//! ring) or, without one, in epoll (via mio) alone.
//!
//! The loop only polls, dispatches and keeps time. It hands each connection's
//! received bytes (copied into one buffer shared by all its connections) to the
//! connection's handler — `http` before a handover, the transport after — and
//! writes what they answered with one syscall per read batch (corking). It
//! delivers its inbox through [`LocalSubscribers`]. Its parts, each in its file:
//! accepting ([`accept`]), handing a connection over to its transport
//! ([`open`]), io_uring completions ([`ring`]), timers ([`timers`]) and the
//! drain ([`drain`]). It must not block, hold a lock across a write, keep a buffer
//! for a connection that has nothing pending, decide what a request or message
//! means, or name a transport.

mod accept;
mod asking;
mod drain;
mod open;
mod replies;
mod ring;
mod timers;
mod tls;

use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::conn::{Conn, Handled, Mode, Phase, TlsConns};
use super::http::Next;
use super::shared::Shared;
use super::subscribers::{Follow, LocalSubscribers};
use super::timer::ticks;
use crate::broker::asked::{Answer, Asker, Ticket};
use crate::hub;
use crate::os;
use crate::stats::{LoopCounters, TurnCounts};
use crate::timing::{FAN_OUT_TIME, SLOW_TURN, close_timeout, linger_timeout};
use crate::transport::{After, Change, CloseReason};
use accept::Acceptor;
use drain::Drain;
use replies::Replies;
use ring::Ring;
use timers::{Clock, set_deadline};

/// Bytes read per `read` call, shared by every connection of the loop.
const READ_BUF: usize = 128 * 1024;
/// Reads of one connection per wake-up before others get a turn.
const READS_PER_TURN: usize = 32;

pub const WAKER: Token = Token(usize::MAX);
const LISTENER_BASE: usize = usize::MAX / 2;
/// Events taken from epoll in one poll.
const EVENTS_PER_POLL: usize = 256;

/// Buffers the loop reuses for every connection, turn after turn.
struct Buffers {
    /// What the last read brought, for the connection being served.
    read: Vec<u8>,
    /// Answers to the connection being served, written out in one go.
    out: Vec<u8>,
    /// Subscribers a fan-out could not write to, dealt with after it.
    failed: Vec<Follow>,
    /// Connections whose held replies left the loop something to do.
    next: Vec<replies::Next>,
    /// Subscriptions the connection being served asked for (a Pusher subscribe).
    changes: Vec<Change>,
    /// The broker's answers taken from the inbox, being written.
    answers: Vec<Answer>,
    /// What a TLS connection's read opened to, and what TLS itself must send.
    plain: Vec<u8>,
    sealed: Vec<u8>,
}

/// The loop's counters: shared with whoever reports them, and this turn's.
struct Tally {
    shared: Arc<LoopCounters>,
    turn: TurnCounts,
}

pub struct EventLoop {
    poll: Poll,
    accept: Acceptor,
    conns: Slab<Conn>,
    /// The TLS of each connection, on TLS listeners (see [`TlsConns`]).
    tls: TlsConns,
    clock: Clock,
    buf: Buffers,
    /// Connections that still had input when their read turn ended.
    unfinished: Vec<usize>,
    shared: Arc<Shared>,
    tally: Tally,
    /// This loop's position among the server's loops (its hub inbox).
    index: usize,
    subscribers: LocalSubscribers,
    ring: Ring,
    /// Replies held until the turn's end, to go out through the send ring.
    replies: Replies,
    drain: Drain,
    /// The thread CPU time at which this turn's fan-out time is up (set by its
    /// first delivery).
    fan_out_until: Option<Duration>,
    /// Its connections' chat buckets (`--chat-rate`), for those that chatted lately.
    chat: crate::rate::ChatLimiter,
    /// Connections with a replay of history waiting for their socket, watched
    /// for a stall (see `timing::REPLAY_STALL`).
    catch_ups: Vec<timers::CatchUp>,
    /// The number the next request served gets, for its [`Ticket`] (so that a
    /// late answer is never taken for a later request's on the same key).
    serial: u32,
}

impl EventLoop {
    pub fn new(
        poll: Poll,
        mut listeners: Vec<TcpListener>,
        shared: Arc<Shared>,
        index: usize,
    ) -> io::Result<Self> {
        for (i, listener) in listeners.iter_mut().enumerate() {
            poll.registry()
                .register(listener, Token(LISTENER_BASE + i), Interest::READABLE)?;
        }
        let compression = shared.config.compression;
        let chat_rate = shared.config.chat_rate;
        Ok(EventLoop {
            poll,
            accept: Acceptor::new(listeners),
            conns: Slab::new(),
            clock: Clock::new(&shared.config),
            buf: Buffers {
                read: vec![0; READ_BUF],
                out: Vec::with_capacity(READ_BUF),
                failed: Vec::new(),
                next: Vec::new(),
                changes: Vec::new(),
                answers: Vec::new(),
                plain: Vec::new(),
                sealed: Vec::new(),
            },
            tls: TlsConns::default(),
            unfinished: Vec::new(),
            tally: Tally {
                shared: shared.stats.loop_counters(index),
                turn: TurnCounts::default(),
            },
            shared,
            index,
            subscribers: LocalSubscribers::new(index).compressing(compression),
            ring: Ring::default(),
            replies: Replies::default(),
            drain: Drain::default(),
            fan_out_until: None,
            chat: crate::rate::ChatLimiter::new(chat_rate),
            catch_ups: Vec::new(),
            serial: 0,
        })
    }

    /// Runs until shutdown has been requested and every connection is gone (or the
    /// drain timeout has passed).
    pub fn run(mut self) -> io::Result<()> {
        hub::enter_loop(self.index);
        self.ring.start(&self.poll, &self.shared.config, self.index);
        if let Some(sends) = self.ring.send_ring(&self.shared.config, self.index) {
            self.subscribers.send_through(sends);
        }
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        loop {
            let Some(polled) = self.wait(&mut events, self.next_wait())? else {
                continue;
            };
            let woke = Instant::now();
            self.fan_out_until = None;
            self.clock.now = self.clock.wheel.now();
            self.on_completions();
            if polled {
                self.dispatch(&events);
            }
            for key in std::mem::take(&mut self.unfinished) {
                self.on_readable(key, false);
            }
            self.send_replies();
            // Publishes made during this turn (HTTP or chat) to our own inbox were
            // not signalled through the waker, and a large fan-out goes on a slice
            // a turn: deliver now.
            if self.has_deliveries() {
                self.on_answers();
                self.drain_inbox();
            }
            self.keep_time();
            self.send_replies();
            self.end_turn(woke, &events);
            if self.drain_step() {
                break;
            }
        }
        let remaining: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in remaining {
            self.drop_conn(key);
        }
        self.tally.turn.publish(&self.tally.shared);
        Ok(())
    }

    /// Whether the inbox must be looked at before the loop waits: deliveries wait,
    /// a fan-out is part done, or (with a broker whose deliveries are in the inbox
    /// before a subscribe returns) returning subscribers' live filters can go once
    /// it is taken, so that a quiet channel's returning subscribers keep none.
    fn has_deliveries(&self) -> bool {
        let inbox = self.shared.hub.inbox(self.index);
        self.subscribers.has_pending()
            || inbox.has_work()
            || inbox.has_answers()
            || (self.subscribers.has_fresh()
                && self.shared.broker.delivers_before_subscribe_returns())
    }

    /// How long the next wait may block: until the next tick when there is
    /// nothing to do, not at all when there is.
    fn next_wait(&self) -> Duration {
        if self.unfinished.is_empty() && !self.has_deliveries() && !self.clock.has_backlog() {
            self.clock
                .wheel
                .until_next_tick()
                .max(Duration::from_millis(1))
        } else {
            Duration::ZERO
        }
    }

    /// Hands each epoll event to its listener, connection or the inbox.
    fn dispatch(&mut self, events: &Events) {
        for event in events.iter() {
            match event.token() {
                WAKER => {
                    self.on_answers();
                    self.drain_inbox();
                }
                Token(t) if t >= LISTENER_BASE => {
                    if self.accept.is_open() && !self.drain.started() {
                        self.accept_from(t - LISTENER_BASE);
                    }
                }
                Token(key) => {
                    if event.is_writable() {
                        self.on_writable(key);
                    }
                    // A receive in the ring reports the peer's end and errors;
                    // reading here too could reorder the bytes.
                    let closed = event.is_read_closed() || event.is_error();
                    if event.is_readable() || closed {
                        self.on_readable(key, closed);
                    }
                }
            }
        }
    }

    /// Publishes the turn's counters, and says so when the turn was slow.
    fn end_turn(&mut self, woke: Instant, events: &Events) {
        self.tally.turn.publish(&self.tally.shared);
        let (sends, calls) = self.subscribers.ring_sends();
        if sends > 0 {
            self.tally.shared.ring_sends.store(sends, Ordering::Relaxed);
            self.tally
                .shared
                .ring_send_calls
                .store(calls, Ordering::Relaxed);
        }
        let took = woke.elapsed();
        self.tally.shared.record_turn(took);
        if took >= SLOW_TURN {
            // Every connection of this loop waited this long: say so, with
            // what the turn had to do.
            tracing::warn!(
                pid = std::process::id(),
                event_loop = self.index,
                took_ms = took.as_millis() as u64,
                events = events.iter().count(),
                connections = self.conns.len(),
                "slow event loop turn"
            );
        }
    }

    fn drop_conn(&mut self, key: usize) {
        self.subscribers
            .leave(&*self.shared.broker, key, &mut self.conns);
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        self.tls.remove(key);
        self.ring.forget(&self.poll, key, &mut conn);
        if let Mode::Open(session) = &conn.mode {
            let counters = &self.tally.shared;
            counters.sockets.fetch_sub(1, Ordering::Relaxed);
            counters.open[session.kind().index()].fetch_sub(1, Ordering::Relaxed);
            self.shared.admission.release(conn.peer);
        }
        // Dropping the socket closes it, which also removes it from epoll.
    }

    fn on_writable(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        match conn.flush(self.tls.get_mut(key), &mut self.tally.turn.bytes_sent) {
            Ok(true) if conn.phase == Phase::Closing => self.finish_close(key),
            Ok(_) => {}
            Err(_) => self.drop_conn(key),
        }
    }

    /// Reads a socket epoll called readable (or one left unfinished), unless its
    /// bytes come through the ring; a connection that read itself busy moves there.
    fn on_readable(&mut self, key: usize, peer_closed: bool) {
        if self.ring.receives(key) {
            return;
        }
        if self.read_socket(key, peer_closed) {
            self.move_to_ring_if_busy(key);
        }
    }

    /// Reads until the socket is drained; true if it was and the connection
    /// lives. `peer_closed`: the event also reported the peer's FIN, which a short
    /// read must not hide (no further edge comes).
    fn read_socket(&mut self, key: usize, peer_closed: bool) -> bool {
        for _ in 0..READS_PER_TURN {
            let Some(conn) = self.conns.get_mut(key) else {
                return false;
            };
            let n = match conn.socket.read(&mut self.buf.read) {
                Ok(0) => {
                    self.on_peer_done(key);
                    return false;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.drop_conn(key);
                    return false;
                }
            };
            conn.last_seen = self.clock.now;
            self.ring.count_read(key);
            // Closing: our goodbye is out; Lingering: we wait for EOF. Either way
            // the peer's remaining bytes are of no use.
            if conn.phase == Phase::Active {
                self.on_input(key, n);
            }
            if n < self.buf.read.len() && !peer_closed {
                // A short read drained the socket; new data raises a new edge, so
                // the extra read that would only say EAGAIN is skipped.
                return self.conns.contains(key);
            }
        }
        // The socket may still hold input: come back after others had their turn.
        self.unfinished.push(key);
        false
    }

    /// The peer is done sending. An answer still on its way to it (a last
    /// response, our close frame, a kept-alive request's answer, one the broker
    /// has yet to give) is finished first: a half-closed client still reads.
    fn on_peer_done(&mut self, key: usize) {
        if self.conns.get(key).is_some_and(|c| !c.out.is_empty()) {
            // Its last replies may be held for the turn's end: they go first,
            // as a `send` made at once would have.
            self.send_replies();
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Mode::Asking(asking) = &mut conn.mode
            && conn.phase == Phase::Active
        {
            // Its request waits on the broker: answered first, then closed.
            asking.peer_done = true;
            return;
        }
        let flushed = conn.is_flushed(self.tls.get(key));
        if !flushed && conn.phase == Phase::Closing {
            return;
        }
        if !flushed && !conn.mode.is_counted() {
            self.buf.out.clear();
            self.send_out(key, After::Close);
            return;
        }
        self.drop_conn(key);
    }

    /// Hands `buf.read[..n]` to the connection's handler.
    fn on_input(&mut self, key: usize, n: usize) {
        self.buf.out.clear();
        if self.tls.get(key).is_some() {
            self.on_tls_input(key, n);
            return;
        }
        self.feed(key, None, n);
    }

    /// Hands the connection's handler its input — `held` bytes (what came behind
    /// a request that opened a transport) or, without them, `buf.read[..n]` — and
    /// acts on what it answered.
    fn feed(&mut self, key: usize, held: Option<&mut [u8]>, n: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let input = match held {
            Some(held) => held,
            None => &mut self.buf.read[..n],
        };
        let ticket = Ticket {
            loop_index: self.index as u32,
            key: key as u32,
            serial: self.serial,
            asker: Asker::Request,
        };
        self.serial = self.serial.wrapping_add(1);
        let handled = conn.mode.on_input(
            input,
            conn.peer,
            &self.shared,
            ticket,
            &mut self.buf.out,
            &mut self.tally.turn,
            self.subscribers.chosen_name(key),
            &mut self.buf.changes,
            conn.deflate,
            &mut self.chat,
        );
        if !self.buf.changes.is_empty() {
            self.apply_changes(key);
        }
        self.after_input(key, handled);
    }

    fn after_input(&mut self, key: usize, handled: Handled) {
        match handled {
            Handled::Http(Next::KeepOpen { answered }) => {
                if answered && let Some(conn) = self.conns.get_mut(key) {
                    let due = self.clock.now + self.clock.handshake_ticks;
                    set_deadline(&mut self.clock.wheel, key, conn, due);
                }
                self.send_out(key, After::Nothing);
            }
            Handled::Http(Next::Close) => self.send_out(key, After::Close),
            Handled::Http(Next::Open {
                opening,
                leftover,
                client,
            }) => self.open_session(key, opening, leftover, client),
            Handled::Http(Next::Wait { awaited, rest }) => self.wait_on_broker(key, awaited, rest),
            Handled::Transport(after) => self.send_out(key, after),
        }
    }

    /// Writes every delivery waiting in this loop's inbox to its subscribers.
    fn drain_inbox(&mut self) {
        let inbox = self.shared.hub.inbox(self.index);
        let deadline = *self
            .fan_out_until
            .get_or_insert_with(|| os::thread_cpu_time() + FAN_OUT_TIME);
        self.subscribers.deliver(
            inbox,
            &mut self.conns,
            &mut self.tls,
            self.shared.config.max_queue,
            &mut self.tally.turn,
            &mut self.buf.failed,
            deadline,
        );
        for failed in std::mem::take(&mut self.buf.failed) {
            match failed {
                Follow::Dead(key) => self.drop_conn(key),
                Follow::Slow(key) => self.close_with(key, CloseReason::SlowConsumer),
                Follow::Terminated(key) => self.close_with(key, CloseReason::Terminated),
                Follow::Answered(key) => {
                    self.buf.out.clear();
                    self.send_out(key, After::Close);
                }
            }
        }
    }

    /// Sends what the handler left in `buf.out`, then acts on what it asked for.
    fn send_out(&mut self, key: usize, after: After) {
        let max_queue = self.shared.config.max_queue;
        let Some(conn) = self.conns.get_mut(key) else {
            self.buf.out.clear();
            return;
        };
        if !self.buf.out.is_empty() {
            let tls = self.tls.get_mut(key);
            if after == After::Nothing
                && self
                    .replies
                    .can_hold(conn, tls.as_deref(), self.buf.out.len())
                && self.subscribers.send_ring().is_some()
            {
                self.replies.hold(key, conn, &self.buf.out);
                self.buf.out.clear();
                if self
                    .subscribers
                    .send_ring()
                    .is_some_and(|ring| self.replies.len() >= ring.batch())
                {
                    self.send_replies();
                }
                return;
            }
            let sent = conn.send(&self.buf.out, tls, &mut self.tally.turn.bytes_sent);
            self.buf.out.clear();
            if sent.is_err() {
                self.drop_conn(key);
                return;
            }
        }
        if after == After::Close {
            conn.phase = Phase::Closing;
            conn.mode.stop_reading();
            // No delivery may follow our goodbye.
            self.subscribers
                .leave(&*self.shared.broker, key, &mut self.conns);
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let due = self.clock.now + ticks(close_timeout());
            set_deadline(&mut self.clock.wheel, key, conn, due);
            if conn.is_flushed(self.tls.get(key)) {
                self.finish_close(key);
            }
            return;
        }
        if conn.out.counted_bytes() > max_queue {
            if conn.mode.is_counted() {
                self.close_with(key, CloseReason::SlowConsumer);
            } else {
                // A kept-alive HTTP client that sends requests but reads no answers.
                self.drop_conn(key);
            }
        }
    }

    /// Sends the replies held this turn (see [`replies`]), then flushes or drops
    /// the connections that asks for.
    fn send_replies(&mut self) {
        if self.replies.len() == 0 {
            return;
        }
        let mut next = std::mem::take(&mut self.buf.next);
        self.replies.send(
            &mut self.conns,
            &mut self.tls,
            self.subscribers.send_ring(),
            &mut self.tally.turn,
            &mut next,
        );
        for step in next.drain(..) {
            match step {
                replies::Next::Dead(key) => self.drop_conn(key),
                replies::Next::Flush(key) => self.on_writable(key),
            }
        }
        self.buf.next = next;
    }

    /// Starts a server-initiated close; a slow consumer first loses what is not on
    /// the wire yet.
    fn close_with(&mut self, key: usize, reason: CloseReason) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.phase != Phase::Active {
            return;
        }
        if reason == CloseReason::SlowConsumer {
            conn.out.truncate_unstarted();
            self.tally.turn.slow_consumers += 1;
        }
        self.buf.out.clear();
        conn.mode.write_close(&mut self.buf.out, reason);
        self.send_out(key, After::Close);
    }

    /// Everything is flushed: send FIN and wait briefly for the peer's.
    fn finish_close(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Some(tls) = self.tls.get_mut(key) {
            conn.say_close_notify(tls, &mut self.tally.turn.bytes_sent);
        }
        if conn.socket.shutdown(std::net::Shutdown::Write).is_err() {
            self.drop_conn(key);
            return;
        }
        conn.phase = Phase::Lingering;
        let due = self.clock.now + ticks(linger_timeout());
        set_deadline(&mut self.clock.wheel, key, conn, due);
    }
}
