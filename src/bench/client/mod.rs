//! The bench's client event loop: one mio loop per thread driving many client
//! connections through connect, HTTP upgrade (or, in push mode over SSE and
//! long-polling, an HTTP request) and the mode's load. It mirrors the server's
//! `transport` folder: the client side of each transport has its own file.
//!
//! This file owns the loop ([`ClientLoop`]: polling, pacing of connects, the
//! response head of an upgrade or SSE GET, handing each read to its transport)
//! and the per-loop measurement state. The pieces:
//! - `plan`: what every loop of one process knows about the run ([`Plan`]);
//! - `control`: the driver's side: the [`phase`], [`Control`] and [`Live`];
//! - `conn`: one connection ([`Conn`](conn::Conn), kept small: read state and
//!   unsent bytes are boxed and exist only while something is partial), and
//!   opening its socket;
//! - `lifecycle`: connects, timeouts, failure reasons, drops, push mode's
//!   reconnects and come-backs, and the phases' effects (starting the load,
//!   closing);
//! - `websocket`, `sse`, `poll`: each transport's request and reading; echo round
//!   trips, answering pings and chat sends are WebSocket's;
//! - `pusher`: Pusher Channels' messages on top of WebSocket (`--protocol pusher`):
//!   subscribing once greeted, pongs, events as deliveries;
//! - `delivery`: counting a push delivery's seq and latency;
//! - `tls`: `wss://` and `https://`: rustls between the socket and the
//!   transports (every read and write of a TLS connection goes through it).
//!
//! It must not print, spawn processes or decide the run's timeline: the driver
//! (`bench/driver.rs`) moves the shared [`Control`] phase, and reads the [`Live`]
//! counters and the loop's final [`RawResult`].

mod conn;
mod control;
mod delivery;
mod lifecycle;
mod plan;
mod poll;
mod pusher;
mod sse;
#[cfg(test)]
mod tests;
mod tls;
#[cfg(test)]
mod tls_tests;
mod websocket;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::{Events, Poll, Token, Waker};
use slab::Slab;

use super::comet::SseReader;
use super::report::{self, ChannelAgg, ComebackTally, Counters, RawResult, SeqCounts};
use super::{Mode, Protocol, Transport};
use conn::{Conn, ReadState, State, flush, io_reason};

pub use control::{Control, Live, phase};
pub use delivery::unix_nanos;
pub use lifecycle::BACKOFF_CAP;
pub use plan::Plan;

const WAKER: Token = Token(usize::MAX);
/// One read buffer per loop, shared by all its connections.
const READ_BUF: usize = 256 * 1024;
/// Largest message the bench accepts from a server.
pub(super) const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Largest HTTP response head accepted during the upgrade.
pub(super) const MAX_RESPONSE_HEAD: usize = 16 * 1024;
/// How long the close phase waits for servers to answer our close frames.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// Connect attempts started per loop iteration at most (keeps the loop responsive).
const CONNECT_BATCH: u64 = 256;

/// xorshift64*: masks need to be unpredictable to middleboxes, not secure.
pub(super) fn next_mask(state: &mut u64) -> [u8; 4] {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    ((x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32).to_ne_bytes()
}

/// Per-loop measurement state the message handlers write into.
struct Tally {
    c: Counters,
    hist: Histogram<u64>,
    seq: SeqCounts,
    failures: BTreeMap<String, u64>,
    /// Push: subscribers let go and come back, and their time away (ms).
    comeback: ComebackTally,
    away: Histogram<u64>,
}

pub struct ClientLoop {
    id: usize,
    plan: Arc<Plan>,
    ctl: Arc<Control>,
    live: Arc<Live>,
    poll: Poll,
    conns: Slab<Conn>,
    buf: Vec<u8>,
    scratch: Vec<u8>,
    text: Vec<u8>,
    tally: Tally,
    epoch: Instant,
    rng: u64,
    /// Connections this loop opens, and how many it has started.
    n_local: u64,
    started: u64,
    /// Connect deadlines: (when, key, index, attempt).
    timeouts: VecDeque<(Instant, usize, u32, u32)>,
    chat_queue: VecDeque<(Instant, usize, u32)>,
    /// Push: when each `--reconnect` subscriber next drops and resumes.
    reconnect_queue: VecDeque<(Instant, usize, u32)>,
    /// Push: when each subscriber that is away tries to come back: (when, key, attempt).
    comebacks: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    seen_phase: u8,
    sockets_open_end: u64,
    channels: Vec<ChannelAgg>,
}

impl ClientLoop {
    /// Sets up loop `id`; its waker is registered with `ctl` before it runs.
    pub fn new(id: usize, plan: Arc<Plan>, ctl: Arc<Control>, live: Arc<Live>) -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        ctl.add_waker(waker);
        let threads = plan.threads.max(1) as u64;
        let n_local = if (id as u64) < plan.conns {
            (plan.conns - id as u64).div_ceil(threads)
        } else {
            0
        };
        let mut c = Counters {
            target: n_local,
            ..Counters::default()
        };
        c.target = n_local;
        let channels = if plan.mode == Mode::Push {
            vec![ChannelAgg::default(); plan.channels as usize]
        } else {
            Vec::new()
        };
        Ok(ClientLoop {
            id,
            plan,
            ctl,
            live,
            poll,
            conns: Slab::new(),
            buf: vec![0; READ_BUF],
            scratch: Vec::new(),
            text: Vec::new(),
            tally: Tally {
                c,
                hist: report::new_histogram(),
                seq: SeqCounts::default(),
                failures: BTreeMap::new(),
                comeback: ComebackTally::default(),
                away: report::new_histogram(),
            },
            epoch: Instant::now(),
            rng: rand::random::<u64>() | 1,
            n_local,
            started: 0,
            timeouts: VecDeque::new(),
            chat_queue: VecDeque::new(),
            reconnect_queue: VecDeque::new(),
            comebacks: BinaryHeap::new(),
            seen_phase: phase::CONNECTING,
            sockets_open_end: 0,
            channels,
        })
    }

    /// Runs until the driver moves to [`phase::CLOSE`] and the connections are closed.
    pub fn run(mut self) -> io::Result<RawResult> {
        let mut events = Events::with_capacity(1024);
        let per_loop_rate = self.plan.rate / self.plan.threads.max(1) as f64;
        let connect_start = Instant::now();
        let mut close_deadline: Option<Instant> = None;
        loop {
            let now = Instant::now();
            // Pacing: open what the rate allows by now.
            if self.started < self.n_local {
                let allowed = if per_loop_rate <= 0.0 {
                    self.n_local
                } else {
                    ((now - connect_start).as_secs_f64() * per_loop_rate) as u64 + 1
                };
                let upto = allowed
                    .min(self.n_local)
                    .min(self.started + CONNECT_BATCH)
                    .min(self.started + self.opening_room());
                while self.started < upto {
                    self.open_next();
                }
            }
            self.expire_timeouts(now);
            let current = self.ctl.phase();
            if current != self.seen_phase {
                self.enter_phase(current);
                if current >= phase::CLOSE && close_deadline.is_none() {
                    close_deadline = Some(Instant::now() + CLOSE_WAIT);
                }
            }
            if self.seen_phase == phase::LOAD {
                self.send_chat_due(now);
                self.reconnect_due(now);
            }
            if self.seen_phase < phase::CLOSE {
                self.comeback_due(now);
            }
            self.live.store(&self.tally.c);
            if let Some(deadline) = close_deadline
                && (self.conns.is_empty() || now >= deadline)
            {
                break;
            }

            let mut wait = Duration::from_millis(100);
            // While --max-opening is reached, a connect finishing (an event) makes room.
            if self.started < self.n_local && per_loop_rate > 0.0 && self.opening_room() > 0 {
                let next =
                    connect_start + Duration::from_secs_f64(self.started as f64 / per_loop_rate);
                wait = wait.min(next.saturating_duration_since(now));
            } else if self.started < self.n_local && self.opening_room() > 0 {
                wait = Duration::ZERO;
            }
            if let Some((at, _, _)) = self.chat_queue.front()
                && self.seen_phase == phase::LOAD
            {
                wait = wait.min(at.saturating_duration_since(now));
            }
            if let Some((at, _, _)) = self.reconnect_queue.front()
                && self.seen_phase == phase::LOAD
            {
                wait = wait.min(at.saturating_duration_since(now));
            }
            if let Some((at, _, _, _)) = self.timeouts.front() {
                wait = wait.min(at.saturating_duration_since(now));
            }
            if let Some(Reverse((at, _, _))) = self.comebacks.peek()
                && self.seen_phase < phase::CLOSE
            {
                wait = wait.min(at.saturating_duration_since(now));
            }
            if let Err(e) = self.poll.poll(&mut events, Some(wait))
                && e.kind() != io::ErrorKind::Interrupted
            {
                return Err(e);
            }
            for ev in events.iter() {
                if ev.token() == WAKER {
                    continue;
                }
                self.on_event(
                    ev.token().0,
                    ev.is_readable(),
                    ev.is_writable(),
                    ev.is_read_closed() || ev.is_error(),
                );
            }
        }
        Ok(self.finish())
    }

    fn finish(mut self) -> RawResult {
        // Whatever is still here did not answer our close in time: just drop it.
        let left: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in left {
            self.remove(key, None);
        }
        self.live.store(&self.tally.c);
        RawResult {
            counters: self.tally.c,
            sockets_open_end: self.sockets_open_end,
            failures: self.tally.failures,
            latency_us: report::histogram_pairs(&self.tally.hist),
            seq: self.tally.seq,
            channels: self.channels,
            comeback: ComebackTally {
                away_ms: report::histogram_pairs(&self.tally.away),
                ..self.tally.comeback
            },
            ..RawResult::default()
        }
    }

    /// How many more first connects this loop may start now: its share of
    /// `--max-opening` less those still connecting or upgrading.
    fn opening_room(&self) -> u64 {
        if self.plan.max_opening == 0 {
            return u64::MAX;
        }
        let share = (self.plan.max_opening / self.plan.threads.max(1) as u64).max(1);
        let c = &self.tally.c;
        let opening = c.attempted.saturating_sub(c.opened + c.failed);
        share.saturating_sub(opening)
    }

    fn on_event(&mut self, key: usize, readable: bool, writable: bool, closed: bool) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.state == State::Connecting {
            if !(writable || closed) {
                return;
            }
            match conn.socket.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => return self.lost(key, io_reason(&e)),
            }
            match conn.socket.peer_addr() {
                Ok(_) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::NotConnected
                        || e.raw_os_error() == Some(libc::EINPROGRESS) =>
                {
                    if closed {
                        return self.lost(key, "reset".into());
                    }
                    return;
                }
                Err(e) => return self.lost(key, io_reason(&e)),
            }
            if let Err(e) = self.send_request(key) {
                return self.lost(key, io_reason(&e));
            }
        }
        if writable
            && let Some(conn) = self.conns.get_mut(key)
            && let Err(e) = flush(conn)
        {
            return self.lost(key, io_reason(&e));
        }
        if readable || closed {
            self.on_readable(key, closed);
        }
    }
    /// Sends the connection's request once TCP is up: the WebSocket upgrade, or
    /// the SSE or long-poll GET, resuming where it left off after a reconnect.
    fn send_request(&mut self, key: usize) -> io::Result<()> {
        match self.plan.transport {
            Transport::Ws => self.send_upgrade(key),
            Transport::Sse => self.send_stream_request(key),
            Transport::Poll => self.send_poll(key),
        }
    }

    fn on_readable(&mut self, key: usize, closed: bool) {
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            // A short read drains a plain socket, not a TLS one (rustls reads
            // 4 KiB at a time): that is read until it would block.
            let drain = conn.tls.is_some();
            let n = match conn.read(&mut self.buf) {
                Ok(0)
                    if self.plan.transport == Transport::Poll
                        && matches!(conn.state, State::Open | State::Handshake) =>
                {
                    self.on_poll_end(key);
                    return;
                }
                Ok(0) => {
                    let reason = match conn.state {
                        State::Open if self.plan.transport == Transport::Ws => {
                            "closed without a close frame"
                        }
                        State::Open => "closed by the server",
                        State::Subscribing => "closed before subscribed",
                        _ => "reset",
                    };
                    return self.lost(key, reason.into());
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.lost(key, io_reason(&e)),
            };
            let alive = match (conn.state, self.plan.transport) {
                (State::Connecting | State::Away, _) => true,
                (State::Handshake, Transport::Poll) => self.on_poll(key, n),
                (State::Handshake, _) => self.on_http(key, n),
                (State::Open | State::Closing | State::Subscribing, Transport::Ws) => {
                    self.on_ws(key, 0, n)
                }
                (State::Open | State::Closing | State::Subscribing, Transport::Sse) => {
                    self.on_sse(key, 0, n)
                }
                (State::Open | State::Closing | State::Subscribing, Transport::Poll) => {
                    self.on_poll(key, n)
                }
            };
            if !alive || (n < self.buf.len() && !closed && !drain) {
                return;
            }
        }
    }

    /// Handles response bytes `buf[..n]` during the upgrade.
    fn on_http(&mut self, key: usize, n: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let Some(state) = conn.read.as_mut() else {
            return false;
        };
        let ReadState::Http { expect, head } = state.as_mut() else {
            return false;
        };
        let expect = *expect;
        head.extend_from_slice(&self.buf[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let (used, status, accept_ok, chunked) = match resp.parse(head) {
            Ok(httparse::Status::Complete(used)) => {
                let accept_ok = resp.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("sec-websocket-accept")
                        && h.value.trim_ascii() == expect
                });
                let chunked = resp.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("transfer-encoding")
                        && h.value
                            .to_ascii_lowercase()
                            .windows(7)
                            .any(|w| w == b"chunked")
                });
                (used, resp.code.unwrap_or(0), accept_ok, chunked)
            }
            Ok(httparse::Status::Partial) => {
                if head.len() > MAX_RESPONSE_HEAD {
                    self.remove(key, Some("handshake: response head too large".into()));
                    return false;
                }
                return true;
            }
            Err(e) => {
                self.remove(key, Some(format!("handshake: malformed response ({e})")));
                return false;
            }
        };
        let sse = self.plan.transport == Transport::Sse;
        let wanted = if sse { 200 } else { 101 };
        if status != wanted {
            let reason = format!("handshake rejected with status {status}");
            // A proxy with no server behind it (502, 504) or a draining server
            // (503) says "come back"; a refusal (401, 403, 404 ...) is final.
            if status >= 500 {
                self.lost(key, reason);
            } else {
                self.remove(key, Some(reason));
            }
            return false;
        }
        if !sse && !accept_ok {
            self.remove(key, Some("handshake: wrong Sec-WebSocket-Accept".into()));
            return false;
        }
        // Bytes after the head are already WebSocket frames (a welcome, say).
        let rest = head.len() - used;
        let extra = if rest > 0 {
            let tail = head[used..].to_vec();
            self.buf[..rest].copy_from_slice(&tail);
            rest
        } else {
            0
        };
        conn.read = sse.then(|| Box::new(ReadState::Sse(SseReader::new(chunked))));
        if self.plan.protocol == Protocol::Pusher {
            // Open once subscribed: the server greets first.
            conn.state = State::Subscribing;
        } else {
            self.mark_open(key);
        }
        if extra > 0 {
            return if sse {
                self.on_sse(key, 0, extra)
            } else {
                self.on_ws(key, 0, extra)
            };
        }
        true
    }
}
