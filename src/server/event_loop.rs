//! One I/O thread: an event loop that owns its listeners' accepted sockets, their
//! [`Conn`] records in a slab, and a timer wheel. It waits through its
//! [`Uring`] (io_uring receives, and epoll polled through the ring) or, without
//! one, in epoll (via mio) alone.
//!
//! The loop hands each connection's received bytes (copied into one buffer shared
//! by all its connections) to the connection's handler — [`http`] before an
//! upgrade, the transport after — and writes what they answered with one syscall per
//! read batch (corking). It delivers its inbox through [`LocalSubscribers`], and
//! keeps time: handshake, ping, idle, close and linger deadlines, accept back-off,
//! drain. It must not block, hold a lock across a write, keep a buffer for a
//! connection that has nothing pending, or decide what a request or message means.

use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::conn::{Conn, Handled, NEVER, Phase, Session};
use super::http::Next;
use super::shared::Shared;
use super::subscribers::{Follow, LocalSubscribers};
use super::timer::{Tick, TimerWheel, next_in_phase, ticks};
use super::uring::{Completion, Uring, Via};
use crate::hub;
use crate::protocol::http::write_error;
use crate::stats::{HandshakeFailure, LoopCounters, TurnCounts};
use crate::transport::{After, CloseReason, Opening};

/// Bytes read per `read` call, shared by every connection of the loop.
const READ_BUF: usize = 128 * 1024;
/// Reads of one connection per wake-up before others get a turn.
const READS_PER_TURN: usize = 32;
/// How long a closing connection may take to flush and say goodbye.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for the peer's FIN after ours.
const LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before retrying accept when out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Accept failures are logged at most this often.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);
/// How often loop 0 gives the broker its housekeeping turn.
const MAINTAIN_EVERY: Duration = Duration::from_secs(10);
/// How often a loop with io_uring weighs which connections are busy enough to
/// receive through the ring (`Uring::sweep`).
const RECEIVE_SWEEP_EVERY: Duration = Duration::from_secs(1);
/// A turn at least this long is logged (at most four lines a second per loop).
const SLOW_TURN: Duration = Duration::from_millis(250);
/// During a drain, plain HTTP connections (a proxy's kept-alive ones, those just
/// taken from the accept queue) get this long to send a request already on its
/// way; it is answered with `Connection: close`, the idle ones then close.
const DRAIN_GRACE: Duration = Duration::from_millis(250);

pub const WAKER: Token = Token(usize::MAX);
const LISTENER_BASE: usize = usize::MAX / 2;
/// Events taken from epoll in one poll.
const EVENTS_PER_POLL: usize = 1024;

/// The listeners and the accept back-off at the open-files limit.
struct Acceptor {
    listeners: Vec<TcpListener>,
    paused_until: Option<Tick>,
    failures: u64,
    log_at: Tick,
}

pub struct EventLoop {
    poll: Poll,
    accept: Acceptor,
    conns: Slab<Conn>,
    wheel: TimerWheel,
    read_buf: Vec<u8>,
    /// Answers to the connection being served, written out in one go.
    out: Vec<u8>,
    expired: Vec<(u32, Tick)>,
    /// Connections that still had input when their read turn ended.
    unfinished: Vec<usize>,
    shared: Arc<Shared>,
    counters: Arc<LoopCounters>,
    turn: TurnCounts,
    /// This loop's position among the server's loops (its hub inbox).
    index: usize,
    subscribers: LocalSubscribers,
    /// Subscribers a fan-out could not write to, dealt with after it.
    failed: Vec<Follow>,
    next_maintain: Tick,
    next_receive_sweep: Tick,
    ping_ticks: Tick,
    idle_ticks: Tick,
    handshake_ticks: Tick,
    ping_seq: u32,
    drain_deadline: Option<Instant>,
    /// Until when plain HTTP connections may still send a request during a drain.
    drain_grace: Option<Instant>,
    now: Tick,
    /// Receives through io_uring for busy connections (made by `run`, in the
    /// loop's own thread); none: epoll reports every readable socket.
    uring: Option<Uring>,
    completions: Vec<Completion>,
    /// Epoll filled a whole batch: poll it again next turn without being told.
    epoll_again: bool,
}

impl EventLoop {
    pub fn new(
        poll: Poll,
        mut listeners: Vec<TcpListener>,
        shared: Arc<Shared>,
        index: usize,
    ) -> io::Result<Self> {
        let counters = shared.stats.loop_counters(index);
        for (i, listener) in listeners.iter_mut().enumerate() {
            poll.registry()
                .register(listener, Token(LISTENER_BASE + i), Interest::READABLE)?;
        }
        let config = &shared.config;
        Ok(EventLoop {
            ping_ticks: ticks(config.ping_interval),
            idle_ticks: ticks(config.idle_timeout),
            handshake_ticks: ticks(config.handshake_timeout).max(1),
            poll,
            accept: Acceptor {
                listeners,
                paused_until: None,
                failures: 0,
                log_at: 0,
            },
            conns: Slab::new(),
            wheel: TimerWheel::new(),
            read_buf: vec![0; READ_BUF],
            out: Vec::with_capacity(READ_BUF),
            expired: Vec::new(),
            unfinished: Vec::new(),
            shared,
            counters,
            turn: TurnCounts::default(),
            index,
            subscribers: LocalSubscribers::new(index),
            failed: Vec::new(),
            next_maintain: ticks(MAINTAIN_EVERY),
            next_receive_sweep: ticks(RECEIVE_SWEEP_EVERY),
            ping_seq: 0,
            drain_deadline: None,
            drain_grace: None,
            now: 0,
            uring: None,
            completions: Vec::new(),
            epoll_again: false,
        })
    }

    /// Runs until shutdown has been requested and every connection is gone (or the
    /// drain timeout has passed).
    pub fn run(mut self) -> io::Result<()> {
        hub::enter_loop(self.index);
        if self.shared.config.io_uring {
            match Uring::new(self.poll.as_raw_fd()) {
                Ok(uring) => self.uring = Some(uring),
                Err(e) => {
                    if self.index == 0 {
                        tracing::info!(error = %e, "io_uring unavailable: receiving through epoll");
                    }
                }
            }
        }
        let mut events = Events::with_capacity(EVENTS_PER_POLL);
        loop {
            let idle = self.unfinished.is_empty()
                && !self.subscribers.has_pending()
                && !self.shared.hub.inbox(self.index).has_work();
            let timeout = if idle {
                self.wheel.until_next_tick().max(Duration::from_millis(1))
            } else {
                Duration::ZERO
            };
            let mut completions = std::mem::take(&mut self.completions);
            completions.clear();
            let polled = match &mut self.uring {
                None => {
                    match self.poll.poll(&mut events, Some(timeout)) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                    true
                }
                Some(uring) => {
                    let wait = (!self.epoll_again).then_some(timeout);
                    uring.wait(wait, &mut completions)?;
                    let ready = self.epoll_again
                        || completions.iter().any(|c| matches!(c, Completion::Epoll));
                    if ready {
                        match self.poll.poll(&mut events, Some(Duration::ZERO)) {
                            Ok(()) => {}
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                        // A full batch may leave events behind, and the poll of
                        // the epoll descriptor fires on new ones only.
                        let taken = events.iter().count();
                        self.epoll_again = taken >= EVENTS_PER_POLL;
                        uring.count_events(taken);
                    }
                    ready
                }
            };
            let woke = Instant::now();
            self.now = self.wheel.now();
            for &completion in &completions {
                if let Completion::Received {
                    key,
                    generation,
                    result,
                    buffer,
                    more,
                } = completion
                {
                    self.on_received(key, generation, result, buffer, more);
                }
            }
            self.completions = completions;
            for event in events.iter().filter(|_| polled) {
                match event.token() {
                    WAKER => self.drain_inbox(),
                    Token(t) if t >= LISTENER_BASE => {
                        if self.accept.paused_until.is_none() && self.drain_deadline.is_none() {
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
            for key in std::mem::take(&mut self.unfinished) {
                self.on_readable(key, false);
            }
            // Publishes made during this turn (HTTP or chat) to our own inbox were
            // not signalled through the waker, and a large fan-out goes on a slice
            // a turn: deliver now.
            if self.subscribers.has_pending() || self.shared.hub.inbox(self.index).has_work() {
                self.drain_inbox();
            }
            // Pings and timeouts wait while a fan-out is part done, as they did when
            // a fan-out was one turn: the slices make room for requests and
            // handshakes, and a ping can wait a second where a broadcast cannot.
            if !self.subscribers.has_pending() {
                self.run_timers();
            }
            self.expire_tokens();
            self.resume_accepting();
            if self.now >= self.next_receive_sweep {
                self.next_receive_sweep = self.now + ticks(RECEIVE_SWEEP_EVERY);
                if let Some(uring) = &mut self.uring {
                    uring.sweep();
                    self.counters
                        .ring_receivers
                        .store(uring.armed(), Ordering::Relaxed);
                }
            }
            if self.index == 0 && self.now >= self.next_maintain {
                self.next_maintain = self.now + ticks(MAINTAIN_EVERY);
                self.shared.broker.maintain();
            }
            self.turn.publish(&self.counters);
            let took = woke.elapsed();
            self.counters.record_turn(took);
            if took >= SLOW_TURN {
                // Every connection of this loop waited this long: say so, with
                // what the turn had to do.
                tracing::warn!(
                    event_loop = self.index,
                    took_ms = took.as_millis() as u64,
                    events = events.iter().count(),
                    connections = self.conns.len(),
                    "slow event loop turn"
                );
            }

            if self.shared.shutdown.load(Ordering::Acquire) && self.drain_deadline.is_none() {
                self.begin_drain();
            }
            if let Some(grace) = self.drain_grace
                && Instant::now() >= grace
            {
                self.drain_grace = None;
                self.close_idle_http();
            }
            if let Some(deadline) = self.drain_deadline
                && (self.conns.is_empty() || Instant::now() >= deadline)
            {
                break;
            }
        }
        let remaining: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in remaining {
            self.drop_conn(key);
        }
        self.turn.publish(&self.counters);
        Ok(())
    }

    fn accept_from(&mut self, index: usize) {
        loop {
            let Some(listener) = self.accept.listeners.get(index) else {
                return;
            };
            match listener.accept() {
                Ok((socket, addr)) => self.add_conn(socket, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    // EMFILE/ENFILE/ENOMEM: wait for descriptors to free up rather
                    // than spin on a listener that stays readable. Logged at most
                    // every ACCEPT_LOG_EVERY, with how often it happened meanwhile.
                    let accept = &mut self.accept;
                    accept.failures += 1;
                    if self.now >= accept.log_at {
                        tracing::warn!(
                            error = %e,
                            failures = accept.failures,
                            "accept failed (at the open-files limit?); pausing accepts for {ACCEPT_BACKOFF:?} at a time"
                        );
                        accept.failures = 0;
                        accept.log_at = self.now + ticks(ACCEPT_LOG_EVERY);
                    }
                    accept.paused_until = Some(self.now + ticks(ACCEPT_BACKOFF).max(1));
                    return;
                }
            }
        }
    }

    fn resume_accepting(&mut self) {
        if let Some(until) = self.accept.paused_until
            && self.now >= until
            && self.drain_deadline.is_none()
        {
            self.accept.paused_until = None;
            // Edge-triggered listeners will not report connections that queued
            // while we were paused: look at every listener once.
            for index in 0..self.accept.listeners.len() {
                self.accept_from(index);
            }
        }
    }

    fn add_conn(&mut self, mut socket: TcpStream, addr: SocketAddr) {
        LoopCounters::add(&self.counters.accepted, 1);
        let _ = socket.set_nodelay(true);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if let Err(e) = self.poll.registry().register(
            &mut socket,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!(error = %e, "cannot register a new connection");
            return;
        }
        if let Some(uring) = &mut self.uring {
            uring.opened(key);
        }
        let conn = entry.insert(Conn::new(socket, addr.ip(), self.now));
        let due = self.now + self.handshake_ticks;
        set_deadline(&mut self.wheel, key, conn, due);
        // The listener defers accepts until the request's first bytes are in
        // (`os::defer_accept`): read them in this turn, not after another wait.
        self.unfinished.push(key);
    }

    fn drop_conn(&mut self, key: usize) {
        self.subscribers
            .leave(&*self.shared.broker, key, &mut self.conns);
        let Some(mut conn) = self.conns.try_remove(key) else {
            return;
        };
        if let Some(uring) = &mut self.uring
            && uring.closed(key)
        {
            // The armed receive holds the socket open until it is cancelled; its
            // registration would outlive the descriptor's number meanwhile.
            let _ = self.poll.registry().deregister(&mut conn.socket);
        }
        if conn.session.is_counted() {
            self.counters.sockets.fetch_sub(1, Ordering::Relaxed);
            match conn.session {
                Session::Sse(_) => self.counters.sse.fetch_sub(1, Ordering::Relaxed),
                Session::Poll(_) => self.counters.poll.fetch_sub(1, Ordering::Relaxed),
                _ => 0,
            };
            self.shared.admission.release(conn.peer);
        }
        // Dropping the socket closes it, which also removes it from epoll.
    }

    fn on_writable(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        match conn.flush(&mut self.turn.bytes_sent) {
            Ok(true) if conn.phase == Phase::Closing => self.finish_close(key),
            Ok(_) => {}
            Err(_) => self.drop_conn(key),
        }
    }

    /// Reads a socket epoll called readable (or one left unfinished), unless its
    /// bytes come through the ring; a connection that read itself busy moves there.
    fn on_readable(&mut self, key: usize, peer_closed: bool) {
        if let Some(uring) = &self.uring
            && uring.via(key) != Via::Epoll
        {
            return;
        }
        if !self.read_socket(key, peer_closed) {
            return;
        }
        let (Some(conn), Some(uring)) = (self.conns.get_mut(key), &mut self.uring) else {
            return;
        };
        if !uring.is_busy(key) {
            return;
        }
        // From here epoll only says when the socket can take more output. What
        // the socket holds now, the ring's receive takes first.
        if self
            .poll
            .registry()
            .reregister(&mut conn.socket, Token(key), Interest::WRITABLE)
            .is_ok()
        {
            uring.arm(conn.socket.as_raw_fd(), key);
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
            let n = match conn.socket.read(&mut self.read_buf) {
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
            conn.last_seen = self.now;
            if let Some(uring) = &mut self.uring {
                uring.count_read(key);
            }
            // Closing: our goodbye is out; Lingering: we wait for EOF. Either way
            // the peer's remaining bytes are of no use.
            if conn.phase == Phase::Active {
                self.on_input(key, n);
            }
            if n < self.read_buf.len() && !peer_closed {
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
    /// response, our close frame, a kept-alive request's answer) is finished
    /// first: a half-closed client still reads.
    fn on_peer_done(&mut self, key: usize) {
        let Some(conn) = self.conns.get(key) else {
            return;
        };
        if !conn.out.is_empty() && conn.phase == Phase::Closing {
            return;
        }
        if !conn.out.is_empty() && matches!(conn.session, Session::Http(_)) {
            self.out.clear();
            self.send_out(key, After::Close);
            return;
        }
        self.drop_conn(key);
    }

    /// What io_uring received for connection `key`: bytes, its end, or an error.
    fn on_received(
        &mut self,
        key: usize,
        generation: u16,
        result: i32,
        buffer: Option<u16>,
        more: bool,
    ) {
        let Some(uring) = &mut self.uring else {
            return;
        };
        let live = self.conns.contains(key) && uring.is_current(key, generation);
        let mut received = 0;
        if let Some(bid) = buffer {
            if live && result > 0 {
                let bytes = uring.buffer(bid, result as usize);
                received = bytes.len();
                self.read_buf[..received].copy_from_slice(bytes);
            }
            uring.give_back(bid);
        }
        if result == -libc::ENOBUFS {
            uring.starved();
        }
        if !live {
            return;
        }
        if received > 0 {
            uring.count_read(key);
            if let Some(conn) = self.conns.get_mut(key) {
                conn.last_seen = self.now;
                // Closing: our goodbye is out; Lingering: we wait for EOF.
                // Either way the peer's remaining bytes are of no use.
                if conn.phase == Phase::Active {
                    self.on_input(key, received);
                }
            }
        } else if result == 0 {
            self.on_peer_done(key);
            return;
        } else if result < 0
            && ![libc::ENOBUFS, libc::EINTR, libc::EAGAIN, libc::ECANCELED].contains(&-result)
        {
            self.drop_conn(key);
            return;
        }
        if more {
            return;
        }
        let (Some(conn), Some(uring)) = (self.conns.get_mut(key), &mut self.uring) else {
            return;
        };
        if !uring.is_current(key, generation) {
            return;
        }
        match uring.receive_ended(key) {
            // It stopped (the pool ran dry, or the kernel ended it): armed again.
            Via::Ring => uring.arm(conn.socket.as_raw_fd(), key),
            // It was cancelled for being quiet: epoll reads the socket again,
            // starting with whatever arrived since.
            Via::Epoll => {
                let interest = Interest::READABLE | Interest::WRITABLE;
                if self
                    .poll
                    .registry()
                    .reregister(&mut conn.socket, Token(key), interest)
                    .is_err()
                {
                    self.drop_conn(key);
                    return;
                }
                self.unfinished.push(key);
            }
            Via::Leaving => {}
        }
    }

    /// Hands `read_buf[..n]` to the connection's handler.
    fn on_input(&mut self, key: usize, n: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        self.out.clear();
        let handled = conn.session.on_input(
            &mut self.read_buf[..n],
            conn.peer,
            &self.shared,
            &mut self.out,
            &mut self.turn,
            self.subscribers.chosen_name(key),
        );
        self.after_input(key, handled);
    }

    fn after_input(&mut self, key: usize, handled: Handled) {
        match handled {
            Handled::Http(Next::KeepOpen { answered }) => {
                if answered && let Some(conn) = self.conns.get_mut(key) {
                    let due = self.now + self.handshake_ticks;
                    set_deadline(&mut self.wheel, key, conn, due);
                }
                self.send_out(key, After::Nothing);
            }
            Handled::Http(Next::Close) => self.send_out(key, After::Close),
            Handled::Http(Next::Open { opening, leftover }) => {
                self.open_session(key, opening, leftover)
            }
            Handled::Transport(after) => self.send_out(key, after),
        }
    }

    /// Hands a connection over to its transport: admission, the transport's answer
    /// (the 101), the subscription (with its greeting), the first heartbeat; then
    /// handles what the client sent right behind its request. `out` may already
    /// hold answers to pipelined requests.
    fn open_session(&mut self, key: usize, opening: Opening, mut leftover: Vec<u8>) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Err(refusal) = self.shared.admission.try_admit(conn.peer) {
            self.turn.handshake_failed(if refusal.status == 429 {
                HandshakeFailure::MaxConnsPerIp
            } else {
                HandshakeFailure::MaxConns
            });
            write_error(&mut self.out, refusal.status, &refusal.reason, &[]);
            self.send_out(key, After::Close);
            return;
        }
        conn.session = Session::opened(&opening.handover, None);
        self.counters.sockets.fetch_add(1, Ordering::Relaxed);
        match conn.session {
            Session::Sse(_) => LoopCounters::add(&self.counters.sse, 1),
            Session::Poll(_) => LoopCounters::add(&self.counters.poll, 1),
            _ => {}
        }
        let head_at = self.out.len();
        opening.handover.write_head(&mut self.out);
        if let Some(subscribe) = opening.subscribe {
            let client = self.shared.next_client_id();
            let joined = self.subscribers.join(
                &*self.shared.broker,
                &self.shared.config.namespaces,
                key,
                &subscribe,
                client,
            );
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            match joined {
                Ok((sub, count, replay)) => {
                    conn.session = Session::opened(&opening.handover, Some(sub));
                    conn.session
                        .write_welcome(&mut self.out, count, subscribe.name.as_deref());
                    if let (Some(replay), Some(resume)) = (replay, subscribe.resume) {
                        let start = self.out.len();
                        if conn.session.write_replay(&mut self.out, replay, resume) == After::Close
                        {
                            // Answered from history at once (a long-poll).
                            self.send_out(key, After::Close);
                            return;
                        }
                        // The replay goes out now, ahead of anything live. It is at
                        // most --history-size messages, and a socket that cannot
                        // take it at once is not a slow consumer for that: only
                        // what comes on top of it counts against --max-queue.
                        let catch_up = self.out.len() - start;
                        let sent =
                            conn.send_catch_up(&self.out, catch_up, &mut self.turn.bytes_sent);
                        self.out.clear();
                        if sent.is_err() {
                            self.drop_conn(key);
                            return;
                        }
                    }
                }
                Err(e) => {
                    let channel = subscribe.channel;
                    tracing::warn!(error = %e, channel, "subscribe failed");
                    self.turn
                        .handshake_failed(HandshakeFailure::BrokerUnavailable);
                    if matches!(conn.session, Session::WebSocket(_)) {
                        conn.session
                            .write_close(&mut self.out, CloseReason::Unavailable);
                    } else {
                        // SSE and long-poll have not answered yet: a 503 instead of
                        // their head says "come back" to EventSource, proxies and
                        // clients alike (an empty 200 stream or a bare EOF would not).
                        self.out.truncate(head_at);
                        write_error(
                            &mut self.out,
                            503,
                            "broker unavailable, retry later",
                            &[("Retry-After", "1")],
                        );
                    }
                    self.send_out(key, After::Close);
                    return;
                }
            }
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.last_seen = self.now;
        self.ping_seq = self.ping_seq.wrapping_add(1);
        if let Some(wait) = opening.handover.answer_within() {
            conn.next_ping = self.now + ticks(wait).max(1);
        } else if self.ping_ticks > 0 {
            // Golden-ratio spacing spreads first pings evenly over the interval even
            // when thousands of clients connect in the same instant.
            let spread = (u64::from(self.ping_seq.wrapping_mul(0x9E37_79B9))
                * u64::from(self.ping_ticks))
                >> 32;
            conn.next_ping = self.now + 1 + spread as Tick;
        }
        let due = next_due(conn, self.idle_ticks);
        set_deadline(&mut self.wheel, key, conn, due);
        if leftover.is_empty() {
            self.send_out(key, After::Nothing);
            return;
        }
        let handled = conn.session.on_input(
            &mut leftover,
            conn.peer,
            &self.shared,
            &mut self.out,
            &mut self.turn,
            self.subscribers.chosen_name(key),
        );
        self.after_input(key, handled);
    }

    /// Writes every delivery waiting in this loop's inbox to its subscribers.
    fn drain_inbox(&mut self) {
        let inbox = self.shared.hub.inbox(self.index);
        self.subscribers.deliver(
            inbox,
            &mut self.conns,
            self.shared.config.max_queue,
            &mut self.turn,
            &mut self.failed,
        );
        for failed in std::mem::take(&mut self.failed) {
            match failed {
                Follow::Dead(key) => self.drop_conn(key),
                Follow::Slow(key) => self.close_with(key, CloseReason::SlowConsumer),
                Follow::Answered(key) => {
                    self.out.clear();
                    self.send_out(key, After::Close);
                }
            }
        }
    }

    /// Sends what the handler left in `out`, then acts on what it asked for.
    fn send_out(&mut self, key: usize, after: After) {
        let max_queue = self.shared.config.max_queue;
        let Some(conn) = self.conns.get_mut(key) else {
            self.out.clear();
            return;
        };
        if !self.out.is_empty() {
            let sent = conn.send(&self.out, &mut self.turn.bytes_sent);
            self.out.clear();
            if sent.is_err() {
                self.drop_conn(key);
                return;
            }
        }
        if after == After::Close {
            conn.phase = Phase::Closing;
            conn.session.stop_reading();
            // No delivery may follow our goodbye.
            self.subscribers
                .leave(&*self.shared.broker, key, &mut self.conns);
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let due = self.now + ticks(CLOSE_TIMEOUT);
            set_deadline(&mut self.wheel, key, conn, due);
            if conn.out.is_empty() {
                self.finish_close(key);
            }
            return;
        }
        if conn.out.counted_bytes() > max_queue {
            if conn.session.is_counted() {
                self.close_with(key, CloseReason::SlowConsumer);
            } else {
                // A kept-alive HTTP client that sends requests but reads no answers.
                self.drop_conn(key);
            }
        }
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
            self.turn.slow_consumers += 1;
        }
        self.out.clear();
        conn.session.write_close(&mut self.out, reason);
        self.send_out(key, After::Close);
    }

    /// Everything is flushed: send FIN and wait briefly for the peer's.
    fn finish_close(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.socket.shutdown(std::net::Shutdown::Write).is_err() {
            self.drop_conn(key);
            return;
        }
        conn.phase = Phase::Lingering;
        let due = self.now + ticks(LINGER_TIMEOUT);
        set_deadline(&mut self.wheel, key, conn, due);
    }

    fn run_timers(&mut self) {
        self.wheel.expire(self.now, &mut self.expired);
        let mut expired = std::mem::take(&mut self.expired);
        for &(key, tick) in &expired {
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
            if conn.deadline > self.now {
                let due = conn.deadline;
                set_deadline(&mut self.wheel, key, conn, due);
                continue;
            }
            // An HTTP request, a close or a linger that ran out of time ends here;
            // an open connection is due a ping or has been idle too long.
            let open = conn.phase == Phase::Active && conn.session.is_counted();
            if open {
                self.on_open_timer(key);
            } else {
                // A request begun and not finished in time (a kept-alive connection
                // idle between requests has nothing pending).
                if conn.phase == Phase::Active
                    && matches!(&conn.session, Session::Http(pending) if !pending.is_empty())
                {
                    self.turn.handshake_failed(HandshakeFailure::Timeout);
                }
                self.drop_conn(key);
            }
        }
        expired.clear();
        self.expired = expired;
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

    fn on_open_timer(&mut self, key: usize) {
        let now = self.now;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if self.idle_ticks > 0
            && conn.session.expects_input()
            && now.saturating_sub(conn.last_seen) >= self.idle_ticks
        {
            self.close_with(key, CloseReason::IdleTimeout);
            return;
        }
        if conn.next_ping != NEVER && now >= conn.next_ping {
            conn.next_ping = if self.ping_ticks > 0 {
                next_in_phase(conn.next_ping, now, self.ping_ticks)
            } else {
                NEVER
            };
            let due = next_due(conn, self.idle_ticks);
            set_deadline(&mut self.wheel, key, conn, due);
            // A replay the reader took nothing of for a whole interval counts
            // against --max-queue from now on (send_out checks it). Only a
            // connection with a replay waiting asks the kernel anything.
            if conn.out.has_catch_up() {
                let kernel_unsent =
                    crate::os::unsent_bytes(std::os::fd::AsRawFd::as_raw_fd(&conn.socket));
                conn.out.expire_stalled_catch_up(kernel_unsent);
            }
            self.out.clear();
            let after = conn.session.write_heartbeat(&mut self.out);
            self.send_out(key, after);
            return;
        }
        let due = next_due(conn, self.idle_ticks);
        set_deadline(&mut self.wheel, key, conn, due);
    }

    fn begin_drain(&mut self) {
        let now = Instant::now();
        self.drain_deadline = Some(now + self.shared.config.drain_timeout);
        self.drain_grace = Some(now + DRAIN_GRACE);
        // Closing a listener resets the connections still in its accept queue,
        // requests and all: take them in first, to answer them.
        if self.accept.paused_until.is_none() {
            for index in 0..self.accept.listeners.len() {
                self.accept_from(index);
            }
        }
        for mut listener in self.accept.listeners.drain(..) {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        let keys: Vec<(usize, bool)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.phase == Phase::Active)
            .map(|(k, c)| (k, c.session.is_counted()))
            .collect();
        for (key, open) in keys {
            if !open {
                // A request already in the socket is answered first (with
                // `Connection: close`, as the server drains): closing over unread
                // input resets the connection, and a proxy cannot retry a POST
                // that met a reset.
                self.on_readable(key, false);
            }
            let Some(conn) = self.conns.get(key) else {
                continue;
            };
            if conn.phase != Phase::Active {
                // Closing after its last answer.
                continue;
            }
            if conn.session.is_counted() {
                self.close_with(key, CloseReason::Shutdown);
            }
            // Plain HTTP connections get DRAIN_GRACE for a request on its way.
        }
    }

    /// The drain's grace is over: closes the plain HTTP connections that are idle
    /// (one answering its last request closes when that is written).
    fn close_idle_http(&mut self) {
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.phase == Phase::Active && !c.session.is_counted() && c.out.is_empty()
            })
            .map(|(k, _)| k)
            .collect();
        for key in idle {
            self.drop_conn(key);
        }
    }
}

/// When an open connection must next be looked at: its next ping or its idle limit.
fn next_due(conn: &Conn, idle_ticks: Tick) -> Tick {
    let idle = if idle_ticks > 0 && conn.session.expects_input() {
        conn.last_seen.saturating_add(idle_ticks)
    } else {
        NEVER
    };
    conn.next_ping.min(idle)
}

/// Sets a connection's deadline, filing a wheel entry only if none would come
/// round in time (later deadlines are found lazily when the old entry fires).
fn set_deadline(wheel: &mut TimerWheel, key: usize, conn: &mut Conn, due: Tick) {
    conn.deadline = due;
    if due == NEVER {
        return;
    }
    if conn.timer_slot == NEVER || due < conn.timer_slot {
        conn.timer_slot = wheel.schedule(key as u32, due);
    }
}
