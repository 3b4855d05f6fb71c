//! One I/O thread: an epoll loop (via mio) that owns its listeners' accepted
//! sockets, their [`Conn`] state in a slab, and a timer wheel.
//!
//! The loop reads into one buffer shared by all its connections, feeds the bytes to
//! the protocol decoder, and answers through one scratch buffer written with a single
//! syscall per read batch (corking). It must not block, hold a lock across a write,
//! or keep a buffer for a connection that has nothing pending. Routing lives in
//! `routes`, framing in `protocol`; this file only moves bytes and keeps time.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::Shared;
use super::conn::{
    Conn, NEVER, OutQueue, Phase, ReadState, Subscription, send_shared, write_direct,
};
use super::routes::{self, Outcome, RouteContext, WsRoute};
use super::timer::{Tick, TimerWheel, ticks};
use crate::broker::Outgoing;
use crate::hub::{self, Channel, ConnRef, Delivery, Format};
use crate::protocol::handshake::{self, ParseError};
use crate::protocol::{
    Decoder, Event, Flow, close_code, encode_close, encode_frame, encode_header, opcode,
};
use crate::stats::LoopCounters;

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
/// How often loop 0 forgets channels nobody uses.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How long an unused channel (no subscribers, no publishes) keeps its `seq`.
const CHANNEL_RETENTION: Duration = Duration::from_secs(300);
/// Deliveries of one channel gathered into one write per subscriber.
const MAX_FRAMES_PER_WRITE: usize = 64;

pub const WAKER: Token = Token(usize::MAX);
const LISTENER_BASE: usize = usize::MAX / 2;

/// What a connection's feed asked the loop to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    Nothing,
    /// A close frame or final response is in the output: flush, then shut down.
    Close,
}

/// A loop's subscribers of one channel.
struct LocalChannel {
    /// Keeps the channel alive while this loop has subscribers.
    _channel: Arc<Channel>,
    conns: Vec<u32>,
}

/// Channels are keyed by the address of their shared state: unique while alive.
fn channel_key(channel: &Arc<Channel>) -> usize {
    Arc::as_ptr(channel) as usize
}

/// Counts gathered during one loop turn, published with one atomic add each.
#[derive(Debug, Default)]
struct TurnCounts {
    frames_in: u64,
    messages_in: u64,
    messages_out: u64,
}

pub struct EventLoop {
    poll: Poll,
    listeners: Vec<TcpListener>,
    conns: Slab<Conn>,
    wheel: TimerWheel,
    read_buf: Vec<u8>,
    /// Responses of the connection being served, written out in one go.
    out: Vec<u8>,
    expired: Vec<(u32, Tick)>,
    /// Connections that still had input when their read turn ended.
    unfinished: Vec<usize>,
    shared: Arc<Shared>,
    counters: Arc<LoopCounters>,
    turn: TurnCounts,
    /// This loop's position among the server's loops (its hub inbox).
    index: usize,
    /// This loop's subscribers, by channel.
    local: HashMap<usize, LocalChannel>,
    /// Reused buffer for inbox batches.
    batch: Vec<Delivery>,
    /// Subscribers found dead or too slow during a fan-out, dealt with after it.
    doomed: Vec<(usize, bool)>,
    next_sweep: Tick,
    ping_ticks: Tick,
    idle_ticks: Tick,
    handshake_ticks: Tick,
    ping_seq: u32,
    accept_paused_until: Option<Tick>,
    accept_failures: u64,
    accept_log_at: Tick,
    drain_deadline: Option<Instant>,
    now: Tick,
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
            listeners,
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
            local: HashMap::new(),
            batch: Vec::new(),
            doomed: Vec::new(),
            next_sweep: ticks(SWEEP_EVERY),
            ping_seq: 0,
            accept_paused_until: None,
            accept_failures: 0,
            accept_log_at: 0,
            drain_deadline: None,
            now: 0,
        })
    }

    /// Runs until shutdown has been requested and every connection is gone (or the
    /// drain timeout has passed).
    pub fn run(mut self) -> io::Result<()> {
        hub::enter_loop(self.index);
        let mut events = Events::with_capacity(1024);
        loop {
            let idle = self.unfinished.is_empty() && !self.shared.hub.inbox(self.index).has_work();
            let timeout = if idle {
                self.wheel.until_next_tick().max(Duration::from_millis(1))
            } else {
                Duration::ZERO
            };
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            self.now = self.wheel.now();
            for event in events.iter() {
                match event.token() {
                    WAKER => self.drain_inbox(),
                    Token(t) if t >= LISTENER_BASE => {
                        if self.accept_paused_until.is_none() && self.drain_deadline.is_none() {
                            self.accept(t - LISTENER_BASE);
                        }
                    }
                    Token(key) => {
                        if event.is_writable() {
                            self.on_writable(key);
                        }
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
            // not signalled through the waker: deliver them now.
            if self.shared.hub.inbox(self.index).has_work() {
                self.drain_inbox();
            }
            self.run_timers();
            self.resume_accepting();
            if self.index == 0 && self.now >= self.next_sweep {
                self.next_sweep = self.now + ticks(SWEEP_EVERY);
                self.shared.hub.sweep(CHANNEL_RETENTION);
            }
            self.publish_counts();

            if self.shared.shutdown.load(Ordering::Acquire) && self.drain_deadline.is_none() {
                self.begin_drain();
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
        self.publish_counts();
        Ok(())
    }

    fn publish_counts(&mut self) {
        let t = std::mem::take(&mut self.turn);
        if t.frames_in > 0 {
            LoopCounters::add(&self.counters.frames_in, t.frames_in);
        }
        if t.messages_in > 0 {
            LoopCounters::add(&self.counters.messages_in, t.messages_in);
        }
        if t.messages_out > 0 {
            LoopCounters::add(&self.counters.messages_out, t.messages_out);
        }
    }

    fn accept(&mut self, index: usize) {
        loop {
            let Some(listener) = self.listeners.get(index) else {
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
                    self.accept_failures += 1;
                    if self.now >= self.accept_log_at {
                        tracing::warn!(
                            error = %e,
                            failures = self.accept_failures,
                            "accept failed (at the open-files limit?); pausing accepts for {ACCEPT_BACKOFF:?} at a time"
                        );
                        self.accept_failures = 0;
                        self.accept_log_at = self.now + ticks(ACCEPT_LOG_EVERY);
                    }
                    self.accept_paused_until = Some(self.now + ticks(ACCEPT_BACKOFF).max(1));
                    return;
                }
            }
        }
    }

    fn resume_accepting(&mut self) {
        if let Some(until) = self.accept_paused_until
            && self.now >= until
            && self.drain_deadline.is_none()
        {
            self.accept_paused_until = None;
            // Edge-triggered listeners will not report connections that queued
            // while we were paused: look at every listener once.
            for index in 0..self.listeners.len() {
                self.accept(index);
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
        let conn = entry.insert(Conn::new(socket, addr.ip(), self.now));
        let due = self.now + self.handshake_ticks;
        set_deadline(&mut self.wheel, key, conn, due);
    }

    fn drop_conn(&mut self, key: usize) {
        self.unsubscribe(key);
        if let Some(conn) = self.conns.try_remove(key)
            && conn.websocket
        {
            self.counters.sockets.fetch_sub(1, Ordering::Relaxed);
            self.shared.admission.release(conn.peer);
        }
        // Dropping the socket closes it, which also removes it from epoll.
    }

    fn on_writable(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Some(queue) = conn.out.as_mut() else {
            return;
        };
        match queue.flush(&mut conn.socket) {
            Ok(true) => {
                conn.out = None;
                if conn.phase == Phase::Closing {
                    self.finish_close(key);
                }
            }
            Ok(false) => {}
            Err(_) => self.drop_conn(key),
        }
    }

    /// Reads until the socket is drained. `peer_closed`: the event also reported
    /// the peer's FIN, which a short read must not hide (no further edge comes).
    fn on_readable(&mut self, key: usize, peer_closed: bool) {
        for _ in 0..READS_PER_TURN {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let n = match conn.socket.read(&mut self.read_buf) {
                Ok(0) => {
                    self.drop_conn(key);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.drop_conn(key);
                    return;
                }
            };
            conn.last_seen = self.now;
            match conn.phase {
                Phase::Http => self.on_http_bytes(key, n),
                Phase::Open => {
                    let EventLoop {
                        conns,
                        read_buf,
                        out,
                        shared,
                        turn,
                        ..
                    } = self;
                    if let Some(conn) = conns.get_mut(key) {
                        let after = feed_websocket(conn, &mut read_buf[..n], out, shared, turn);
                        self.after_feed(key, after);
                    }
                }
                // Closing: our close is out; Lingering: we wait for EOF. Either way
                // the peer's remaining bytes are of no use.
                Phase::Closing | Phase::Lingering => {}
            }
            if n < self.read_buf.len() && !peer_closed {
                // A short read drained the socket; new data raises a new edge, so
                // the extra read that would only say EAGAIN is skipped.
                return;
            }
        }
        // The socket may still hold input: come back after others had their turn.
        self.unfinished.push(key);
    }

    fn on_http_bytes(&mut self, key: usize, mut n: usize) {
        // Each turn handles one request; a kept-alive connection whose read held
        // the next request too (pipelining) goes round again on what is left.
        while let Some(rest) = self.on_http_request(key, n) {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let due = self.now + self.handshake_ticks;
            set_deadline(&mut self.wheel, key, conn, due);
            if rest.is_empty() {
                return;
            }
            conn.read = Some(Box::new(ReadState::Http(rest)));
            n = 0;
        }
    }

    /// Handles the request at the start of the connection's input (pending bytes
    /// plus `read_buf[..n]`). Returns the bytes after it when the connection stays
    /// open for another request.
    fn on_http_request(&mut self, key: usize, n: usize) -> Option<Vec<u8>> {
        let EventLoop {
            conns,
            read_buf,
            out,
            shared,
            ..
        } = self;
        let conn = conns.get_mut(key)?;
        let mut pending = match conn.read.take().map(|b| *b) {
            Some(ReadState::Http(mut pending)) => {
                pending.extend_from_slice(&read_buf[..n]);
                Some(pending)
            }
            _ => None,
        };
        let data: &[u8] = match &pending {
            Some(pending) => pending,
            None => &read_buf[..n],
        };
        out.clear();
        let (upgrade, leftover) = match handshake::parse_request(data) {
            Ok(None) => {
                let pending = pending.take().unwrap_or_else(|| read_buf[..n].to_vec());
                conn.read = Some(Box::new(ReadState::Http(pending)));
                return None;
            }
            Err(ParseError::TooLarge) => {
                handshake::write_error(out, 431, &ParseError::TooLarge.to_string(), &[]);
                (None, Vec::new())
            }
            Err(e @ ParseError::Malformed(_)) => {
                handshake::write_error(out, 400, &e.to_string(), &[]);
                (None, Vec::new())
            }
            Ok(Some((request, head_len))) => {
                let ctx = RouteContext {
                    shared,
                    peer: conn.peer,
                    body: &data[head_len..],
                    head_len,
                };
                match routes::route(&request, ctx, out) {
                    Outcome::NeedBody => {
                        let pending = pending.take().unwrap_or_else(|| read_buf[..n].to_vec());
                        conn.read = Some(Box::new(ReadState::Http(pending)));
                        return None;
                    }
                    Outcome::Responded => (None, Vec::new()),
                    Outcome::KeepAlive { consumed } => {
                        let rest = data.get(consumed..).unwrap_or_default().to_vec();
                        drop(pending);
                        self.after_feed(key, After::Nothing);
                        return Some(rest);
                    }
                    Outcome::Upgrade(upgrade) => (Some(upgrade), data[head_len..].to_vec()),
                }
            }
        };
        drop(pending);
        let Some(upgrade) = upgrade else {
            self.after_feed(key, After::Close);
            return None;
        };
        if let Err(refusal) = shared.admission.try_admit(conn.peer) {
            handshake::write_error(out, refusal.status, &refusal.reason, &[]);
            self.after_feed(key, After::Close);
            return None;
        }
        conn.websocket = true;
        self.counters.sockets.fetch_add(1, Ordering::Relaxed);
        conn.phase = Phase::Open;
        handshake::write_switching_protocols(out, &upgrade.accept);
        if let WsRoute::Subscribe { channel, json } = upgrade.route {
            let format = if json { Format::WsJson } else { Format::WsRaw };
            self.subscribe(key, &channel, format);
        }
        let conn = self.conns.get_mut(key)?;
        conn.last_seen = self.now;
        self.ping_seq = self.ping_seq.wrapping_add(1);
        if self.ping_ticks > 0 {
            // Golden-ratio spacing spreads first pings evenly over the interval even
            // when thousands of clients connect in the same instant.
            let spread = (u64::from(self.ping_seq.wrapping_mul(0x9E37_79B9))
                * u64::from(self.ping_ticks))
                >> 32;
            conn.next_ping = self.now + 1 + spread as Tick;
        }
        let due = next_due(conn, self.idle_ticks);
        set_deadline(&mut self.wheel, key, conn, due);
        let mut after = After::Nothing;
        if !leftover.is_empty() {
            // Frames pipelined behind the request: their answers follow the 101.
            let mut leftover = leftover;
            let EventLoop {
                conns,
                out,
                shared,
                turn,
                ..
            } = self;
            if let Some(conn) = conns.get_mut(key) {
                after = feed_websocket_appending(conn, &mut leftover, out, shared, turn);
            }
        }
        self.after_feed(key, after);
        None
    }

    /// Joins a channel: the hub counts the subscriber, this loop lists it, and a
    /// json chat member gets its welcome (after the 101 already in `out`).
    fn subscribe(&mut self, key: usize, channel: &str, format: Format) {
        let hub = &self.shared.hub;
        let client = hub.next_client_id();
        let name = hub::client_name(client);
        let me = ConnRef {
            loop_index: self.index,
            key,
        };
        let joined = hub.subscribe(channel, self.index, format, Some((me, &name)));
        let list = self
            .local
            .entry(channel_key(&joined.channel))
            .or_insert_with(|| LocalChannel {
                _channel: Arc::clone(&joined.channel),
                conns: Vec::new(),
            });
        let index = list.conns.len() as u32;
        list.conns.push(key as u32);
        if format.shows_events() && joined.channel.kind().join_leave {
            let welcome = hub::json_event_frame(channel, "welcome", &name, joined.count);
            self.out.extend_from_slice(&welcome);
        }
        if let Some(conn) = self.conns.get_mut(key) {
            conn.sub = Some(Subscription {
                channel: joined.channel,
                index,
                format,
                client,
            });
        }
    }

    /// Leaves the connection's channel, if any: O(1) by swapping the last
    /// subscriber into its place.
    fn unsubscribe(&mut self, key: usize) {
        let Some(sub) = self.conns.get_mut(key).and_then(|c| c.sub.take()) else {
            return;
        };
        let ckey = channel_key(&sub.channel);
        if let Some(list) = self.local.get_mut(&ckey) {
            let index = sub.index as usize;
            if index < list.conns.len() && list.conns[index] as usize == key {
                list.conns.swap_remove(index);
                if let Some(&moved) = list.conns.get(index)
                    && let Some(other) = self.conns.get_mut(moved as usize)
                    && let Some(other_sub) = other.sub.as_mut()
                {
                    other_sub.index = index as u32;
                }
            }
            if list.conns.is_empty() {
                self.local.remove(&ckey);
            }
        }
        let name = sub
            .channel
            .kind()
            .join_leave
            .then(|| hub::client_name(sub.client));
        self.shared
            .hub
            .unsubscribe(&sub.channel, self.index, sub.format, name.as_deref());
    }

    /// Writes every delivery waiting in this loop's inbox to its subscribers.
    fn drain_inbox(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        self.shared.hub.inbox(self.index).take(&mut batch);
        let mut start = 0;
        while start < batch.len() {
            let ckey = channel_key(&batch[start].channel);
            let mut end = start + 1;
            while end < batch.len()
                && end - start < MAX_FRAMES_PER_WRITE
                && channel_key(&batch[end].channel) == ckey
                && batch[end].exclude.is_none()
                && batch[start].exclude.is_none()
            {
                end += 1;
            }
            self.fan_out(ckey, &batch[start..end]);
            start = end;
        }
        batch.clear();
        self.batch = batch;
        for (key, slow) in std::mem::take(&mut self.doomed) {
            if slow {
                self.slow_consumer(key);
            } else {
                self.drop_conn(key);
            }
        }
    }

    /// Sends a run of deliveries of one channel to this loop's subscribers: each
    /// subscriber gets all of them in one write, by reference to the shared frames.
    fn fan_out(&mut self, ckey: usize, group: &[Delivery]) {
        let EventLoop {
            local,
            conns,
            turn,
            doomed,
            shared,
            index,
            ..
        } = self;
        let Some(list) = local.get(&ckey) else {
            return;
        };
        // Each format's frames are gathered (and encoded) only if a subscriber here
        // uses it.
        let mut by_format: [Option<Vec<&Bytes>>; 2] = [None, None];
        let exclude = group
            .first()
            .and_then(|d| d.exclude)
            .filter(|e| e.loop_index == *index)
            .map(|e| e.key);
        let max_queue = shared.config.max_queue;
        for &key in &list.conns {
            let key = key as usize;
            if Some(key) == exclude {
                continue;
            }
            let Some(conn) = conns.get_mut(key) else {
                continue;
            };
            let format = conn.sub.as_ref().map_or(Format::WsRaw, |s| s.format);
            let frames = by_format[format as usize]
                .get_or_insert_with(|| group.iter().filter_map(|m| m.encoded(format)).collect());
            if frames.is_empty() || conn.phase != Phase::Open {
                continue;
            }
            turn.messages_out += frames.len() as u64;
            if send_shared(conn, frames).is_err() {
                doomed.push((key, false));
            } else if conn.queued_bytes() > max_queue {
                doomed.push((key, true));
            }
        }
    }

    /// Sends what the feed left in `out`, then acts on what it asked for.
    fn after_feed(&mut self, key: usize, after: After) {
        let max_queue = self.shared.config.max_queue;
        let Some(conn) = self.conns.get_mut(key) else {
            self.out.clear();
            return;
        };
        if !self.out.is_empty() {
            let sent = send(conn, &self.out);
            self.out.clear();
            if sent.is_err() {
                self.drop_conn(key);
                return;
            }
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if after == After::Close {
            conn.phase = Phase::Closing;
            // No delivery may follow our close frame.
            self.unsubscribe(key);
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let due = self.now + ticks(CLOSE_TIMEOUT);
            set_deadline(&mut self.wheel, key, conn, due);
            if conn.out.is_none() {
                self.finish_close(key);
            }
            return;
        }
        if conn.queued_bytes() > max_queue {
            match conn.phase {
                Phase::Open => self.slow_consumer(key),
                // A kept-alive HTTP client that sends requests but reads no answers.
                Phase::Http => self.drop_conn(key),
                Phase::Closing | Phase::Lingering => {}
            }
        }
    }

    /// Past `--max-queue`: drop what is not on the wire yet and say why.
    fn slow_consumer(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Some(queue) = conn.out.as_mut() {
            queue.truncate_unstarted();
        }
        self.close_with(key, close_code::POLICY_VIOLATION, "slow consumer");
    }

    /// Starts a server-initiated close handshake.
    fn close_with(&mut self, key: usize, code: u16, reason: &str) {
        self.out.clear();
        encode_close(&mut self.out, code, reason);
        self.after_feed(key, After::Close);
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
        conn.read = None;
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
            match conn.phase {
                Phase::Http | Phase::Closing | Phase::Lingering => self.drop_conn(key),
                Phase::Open => self.on_open_timer(key),
            }
        }
        expired.clear();
        self.expired = expired;
    }

    fn on_open_timer(&mut self, key: usize) {
        let now = self.now;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if self.idle_ticks > 0 && now.saturating_sub(conn.last_seen) >= self.idle_ticks {
            self.close_with(key, close_code::GOING_AWAY, "idle timeout");
            return;
        }
        if self.ping_ticks > 0 && now >= conn.next_ping {
            conn.next_ping = now + self.ping_ticks;
            let due = next_due(conn, self.idle_ticks);
            set_deadline(&mut self.wheel, key, conn, due);
            self.out.clear();
            encode_frame(&mut self.out, opcode::PING, b"");
            self.after_feed(key, After::Nothing);
            return;
        }
        let due = next_due(conn, self.idle_ticks);
        set_deadline(&mut self.wheel, key, conn, due);
    }

    fn begin_drain(&mut self) {
        self.drain_deadline = Some(Instant::now() + self.shared.config.drain_timeout);
        for mut listener in self.listeners.drain(..) {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        let keys: Vec<(usize, Phase)> = self.conns.iter().map(|(k, c)| (k, c.phase)).collect();
        for (key, phase) in keys {
            match phase {
                Phase::Http => self.drop_conn(key),
                Phase::Open => self.close_with(key, close_code::GOING_AWAY, "server shutting down"),
                Phase::Closing | Phase::Lingering => {}
            }
        }
    }
}

/// When an open connection must next be looked at: its next ping or its idle limit.
fn next_due(conn: &Conn, idle_ticks: Tick) -> Tick {
    let idle = if idle_ticks > 0 {
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

/// Writes `bytes` to the connection, queueing whatever the socket does not take.
fn send(conn: &mut Conn, bytes: &[u8]) -> Result<(), ()> {
    match conn.out.as_mut() {
        Some(queue) => queue.push(Bytes::copy_from_slice(bytes)),
        None => {
            let written = write_direct(&mut conn.socket, bytes).map_err(|_| ())?;
            if written < bytes.len() {
                conn.out = Some(Box::new(OutQueue::with_partial(
                    Bytes::copy_from_slice(&bytes[written..]),
                    written > 0,
                )));
            }
        }
    }
    Ok(())
}

fn feed_websocket(
    conn: &mut Conn,
    data: &mut [u8],
    out: &mut Vec<u8>,
    shared: &Shared,
    turn: &mut TurnCounts,
) -> After {
    out.clear();
    feed_websocket_appending(conn, data, out, shared, turn)
}

/// Runs the decoder over `data`, appending every answer (echoes, pongs, close) to `out`.
fn feed_websocket_appending(
    conn: &mut Conn,
    data: &mut [u8],
    out: &mut Vec<u8>,
    shared: &Shared,
    turn: &mut TurnCounts,
) -> After {
    let config = &shared.config;
    let mut decoder = match conn.read.take().map(|b| *b) {
        Some(ReadState::Ws(d)) => d,
        _ => Decoder::default(),
    };
    let prefix = config.echo_prefix.as_bytes();
    let subscription = conn
        .sub
        .as_ref()
        .map(|s| (Arc::clone(&s.channel), s.client));
    let mut after = After::Nothing;
    let mut echoed = 0u64;
    let result = decoder.feed(data, config.max_message_size, |event| match event {
        Event::Message { kind, payload } => match &subscription {
            None => {
                let op = kind.opcode();
                if op == opcode::TEXT && !prefix.is_empty() {
                    encode_header(out, op, prefix.len() + payload.len());
                    out.extend_from_slice(prefix);
                    out.extend_from_slice(payload);
                } else {
                    encode_frame(out, op, payload);
                }
                echoed += 1;
                Flow::Continue
            }
            Some((channel, client)) if channel.kind().client_publish => {
                let from = hub::client_name(*client);
                let message = Outgoing {
                    payload,
                    kind,
                    from: Some(&from),
                };
                match shared.broker.publish(channel, message) {
                    Ok(_) => Flow::Continue,
                    Err(e) => {
                        encode_close(out, close_code::TRY_AGAIN_LATER, &e.to_string());
                        after = After::Close;
                        Flow::Stop
                    }
                }
            }
            Some(_) => {
                encode_close(
                    out,
                    close_code::POLICY_VIOLATION,
                    "push-only channel: clients cannot publish",
                );
                after = After::Close;
                Flow::Stop
            }
        },
        Event::Ping(payload) => {
            encode_frame(out, opcode::PONG, payload);
            Flow::Continue
        }
        Event::Pong(_) => Flow::Continue,
        Event::Close { code, .. } => {
            match code {
                Some(code) => encode_close(out, code, ""),
                None => encode_frame(out, opcode::CLOSE, b""),
            }
            after = After::Close;
            Flow::Stop
        }
    });
    turn.messages_out += echoed;
    match result {
        Ok(stats) => {
            turn.frames_in += stats.frames;
            turn.messages_in += stats.messages;
            if after == After::Nothing && !decoder.is_idle() {
                conn.read = Some(Box::new(ReadState::Ws(decoder)));
            }
            after
        }
        Err(error) => {
            tracing::debug!(peer = %conn.peer, %error, "protocol error");
            encode_close(out, error.close_code(), &error.to_string());
            After::Close
        }
    }
}
