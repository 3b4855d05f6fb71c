//! The bench's client event loop: one mio loop per thread driving many client
//! connections through connect, HTTP upgrade (or, in push mode over SSE and
//! long-polling, an HTTP request) and the mode's load.
//!
//! It owns the per-connection state ([`Conn`], kept small: read state and unsent
//! bytes are boxed and exist only while something is partial), pacing of connects,
//! connect/handshake timeouts, failure reasons, and each mode's per-message logic
//! (echo round trips, answering pings, push seq tracking, chat sends), and push
//! mode's reconnects that resume where a subscriber left off. It must not
//! print, spawn processes or decide the run's timeline: the driver in `mod.rs` moves
//! the shared [`Control`] phase, and reads the [`Live`] counters and the loop's
//! final [`RawResult`].

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::io::{self, Read};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use serde::Deserialize;
use slab::Slab;
use socket2::{Domain, Protocol, Socket, Type};

use super::comet::{PollAnswer, SseEvent, SseReader};
use super::report::{self, ChannelAgg, ComebackTally, Counters, RawResult, SeqCounts, SeqTrack};
use super::{Mode, SeqFrom, Transport};
use crate::outbound::Outbound;
use crate::protocol::handshake::accept_key;
use crate::protocol::{Decoder, Event, Flow, close_code, encode_client_frame, opcode};

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

const WAKER: Token = Token(usize::MAX);
/// One read buffer per loop, shared by all its connections.
const READ_BUF: usize = 256 * 1024;
/// Largest message the bench accepts from a server.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Largest HTTP response head accepted during the upgrade.
const MAX_RESPONSE_HEAD: usize = 16 * 1024;
/// How long the close phase waits for servers to answer our close frames.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// Connect attempts started per loop iteration at most (keeps the loop responsive).
const CONNECT_BATCH: u64 = 256;
/// The longest a subscriber waits before trying to come back.
const BACKOFF_CAP: Duration = Duration::from_secs(15);

/// What every loop of one process needs to know about the run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: Mode,
    pub ip: IpAddr,
    pub first_port: u16,
    pub last_port: u16,
    /// The `Host` header value.
    pub host_header: String,
    /// Request path; `{channel}` is replaced in push and chat modes.
    pub path: String,
    /// Source addresses this process binds to, round-robin.
    pub source_ips: Vec<IpAddr>,
    pub size: usize,
    pub connect_timeout: Duration,
    pub send_interval: Duration,
    pub room_size: u64,
    pub senders: f64,
    pub channels: u64,
    pub channel_prefix: String,
    pub room_prefix: String,
    /// Push: how subscribers connect, and where a delivery's position comes from.
    pub transport: Transport,
    pub seq_from: SeqFrom,
    /// Push: the fraction of subscribers that drop and resume every interval.
    pub reconnect: f64,
    pub reconnect_interval: Duration,
    /// Push: the first backoff of a subscriber the server lets go with a "come
    /// back" signal; it doubles per failed try (zero: such a subscriber is dropped).
    pub comeback_backoff: Duration,
    /// Global index of this process's first connection (children get a slice).
    pub conn_offset: u64,
    /// Connections this process opens.
    pub conns: u64,
    pub threads: usize,
    /// Connects per second for this process (0: as fast as possible).
    pub rate: f64,
    /// Connections of this process opening at once (0: no limit), shared by its loops.
    pub max_opening: u64,
}

impl Plan {
    fn target(&self, global: u64) -> SocketAddr {
        let span = u64::from(self.last_port - self.first_port) + 1;
        let port = self.first_port + (global % span) as u16;
        SocketAddr::new(self.ip, port)
    }

    fn source(&self, local: u64) -> Option<IpAddr> {
        if self.source_ips.is_empty() {
            return None;
        }
        Some(self.source_ips[(local % self.source_ips.len() as u64) as usize])
    }

    /// Push: the channel index a connection subscribes to.
    pub fn channel_of(&self, global: u64) -> usize {
        (global % self.channels.max(1)) as usize
    }

    /// Chat: whether this connection is one of the `--senders` fraction. Spreads
    /// senders evenly so every room gets its share.
    pub fn is_sender(&self, global: u64) -> bool {
        in_fraction(global, self.senders)
    }

    /// Push: whether this subscriber is one of the `--reconnect` fraction.
    pub fn is_reconnecter(&self, global: u64) -> bool {
        in_fraction(global, self.reconnect)
    }

    /// The request path for one connection.
    pub fn path_for(&self, global: u64) -> Cow<'_, str> {
        match self.mode {
            Mode::Push => Cow::Owned(self.path.replace(
                "{channel}",
                &format!("{}{}", self.channel_prefix, self.channel_of(global)),
            )),
            Mode::Chat => Cow::Owned(self.path.replace(
                "{channel}",
                &format!(
                    "chat:{}{}",
                    self.room_prefix,
                    global / self.room_size.max(1)
                ),
            )),
            Mode::Echo | Mode::Idle => Cow::Borrowed(&self.path),
        }
    }
}

/// Whether `index` is one of an evenly spread `fraction` of all indexes.
fn in_fraction(index: u64, fraction: f64) -> bool {
    let f = fraction.clamp(0.0, 1.0);
    ((index + 1) as f64 * f).floor() > (index as f64 * f).floor()
}

/// `path` without any `name=` parameter in its query.
fn without_param(path: &str, name: &str) -> String {
    let Some((base, query)) = path.split_once('?') else {
        return path.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| p.split('=').next() != Some(name))
        .collect();
    if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// `path` with `name=value` added to its query.
fn with_query(path: &str, name: &str, value: impl std::fmt::Display) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}{name}={value}")
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

    fn add_waker(&self, w: Arc<Waker>) {
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
    fn store(&self, c: &Counters) {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Connecting,
    Handshake,
    Open,
    /// Our close frame is sent; waiting for the server's.
    Closing,
    /// Push: let go by the server with a "come back" signal; its socket is shut
    /// and it waits out its backoff before connecting again.
    Away,
}

enum ReadState {
    /// The response head; `expect` is the WebSocket accept key (unused for SSE).
    Http {
        expect: [u8; 28],
        head: Vec<u8>,
    },
    Ws(Decoder),
    /// An open event stream.
    Sse(SseReader),
    /// A long-poll's answer so far (head and body).
    Poll(Vec<u8>),
}

/// One client connection. Idle, it is the socket, a few integers and two `None`s.
struct Conn {
    socket: TcpStream,
    index: u32,
    /// Bumped by every reconnect, so a stale connect timeout finds nothing.
    attempt: u32,
    state: State,
    /// It opened once (a later reconnect is not a new connection).
    opened_once: bool,
    /// Push: failed tries to come back since it was last open (the backoff's exponent).
    retries: u8,
    /// Poll: the `since` of the next poll (`None` before the first answer).
    cursor: Option<u64>,
    /// Where to resume: the epoch a WebSocket was told, or the last SSE event id.
    resume: Option<Box<str>>,
    /// Loop-clock nanoseconds (0: none). Echo: when the message in flight was
    /// sent; push: when the server let it go (it is away until it is back).
    sent_at: u64,
    /// Push: which seqs arrived.
    track: SeqTrack,
    read: Option<Box<ReadState>>,
    out: Outbound,
}

/// Why a connection failed or dropped; the text is the report's key.
fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "refused".into(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => "reset".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        kind => format!("i/o error: {kind}"),
    }
}

/// Opens one non-blocking TCP connection (bound to `source` first, if given).
fn start_connect(target: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpStream> {
    let socket = Socket::new(
        Domain::for_address(target),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    if let Some(ip) = source {
        if ip.is_ipv4() {
            // Let connect() pick the port per destination, so many destinations
            // share one source address's port space (IP_BIND_ADDRESS_NO_PORT).
            // Best effort: without it bind() picks a port, as before.
            let _ = crate::os::set_int_option(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                1,
            );
        }
        socket.bind(&SocketAddr::new(ip, 0).into())?;
    }
    match socket.connect(&target.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from_std(std::net::TcpStream::from(socket)))
}

/// Writes what the socket takes now and queues the rest.
fn send(conn: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    conn.out.send(&conn.socket, bytes)
}

/// Writes queued bytes; the queue goes once empty.
fn flush(conn: &mut Conn) -> io::Result<()> {
    conn.out.flush(&conn.socket).map(drop)
}

/// The envelope throng (and similar servers) wrap channel messages in, and the
/// events a resuming json subscriber gets (`epoch`, `gap`).
#[derive(Deserialize)]
struct Envelope<'a> {
    seq: Option<u64>,
    #[serde(borrow)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow)]
    event: Option<Cow<'a, str>>,
    #[serde(borrow)]
    epoch: Option<Cow<'a, str>>,
}

/// A published payload's stamp: `<unix ns> <count> ...` (the count is the
/// publisher's own numbering of the channel's messages).
fn publish_stamp(data: &str) -> (Option<u64>, Option<u64>) {
    let sent = leading_number(data);
    let count = data
        .split_once(' ')
        .and_then(|(_, rest)| leading_number(rest));
    (sent, count)
}

/// Counts one push delivery: its position (the server's seq or the payload's
/// count, as the plan says) and its latency from the publish time it carries.
fn observe_delivery(
    tally: &mut Tally,
    track: &mut SeqTrack,
    seq_from: SeqFrom,
    server_seq: Option<u64>,
    data: &str,
    now_unix: u64,
) {
    let (sent, count) = publish_stamp(data);
    let seq = match seq_from {
        SeqFrom::Server => server_seq,
        SeqFrom::Payload => count,
    };
    if let Some(seq) = seq {
        track.observe(seq, &mut tally.seq);
    }
    if let Some(sent) = sent {
        let us = now_unix.saturating_sub(sent) / 1000;
        tally.hist.saturating_record(us.max(1));
        tally.c.latency_samples += 1;
        tally.c.latency_us_sum += us;
    }
}

/// Leading decimal digits of `s` as a number.
fn leading_number(s: &str) -> Option<u64> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// xorshift64*: masks need to be unpredictable to middleboxes, not secure.
fn next_mask(state: &mut u64) -> [u8; 4] {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    ((x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32).to_ne_bytes()
}

/// Full jitter: a uniform delay in [0, min(cap, base * 2^retries)), so clients
/// let go together come back spread out, not as a storm.
fn backoff_delay(base: Duration, retries: u8, rng: &mut u64) -> Duration {
    let ceiling = base
        .saturating_mul(1u32 << retries.min(20))
        .min(BACKOFF_CAP);
    let unit = f64::from(u32::from_ne_bytes(next_mask(rng))) / (f64::from(u32::MAX) + 1.0);
    ceiling.mul_f64(unit)
}

/// Whether a WebSocket close says "come back" (the README's close-code table):
/// going away, a server error, a restart, try again later, or a slow consumer.
fn close_says_come_back(code: Option<u16>, reason: &str) -> bool {
    match code {
        None | Some(1001 | 1006 | 1011 | 1012 | 1013) => true,
        Some(1008) => reason == "slow consumer",
        Some(_) => false,
    }
}

/// Builds a text payload: `prefix` padded with `x` to `size` bytes.
fn padded(out: &mut Vec<u8>, prefix: &str, size: usize) {
    out.clear();
    out.extend_from_slice(prefix.as_bytes());
    if out.len() < size {
        out.resize(size, b'x');
    }
}

/// Where the body of a long-poll answer lies in `bytes` once it is all there:
/// `Ok(None)` while more is to come; `closed` when the server has closed, which
/// ends a body sent without a length.
fn poll_answer_bounds(
    bytes: &[u8],
    closed: bool,
) -> Result<Option<std::ops::Range<usize>>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let used = match resp.parse(bytes) {
        Ok(httparse::Status::Complete(used)) => used,
        Ok(httparse::Status::Partial) => {
            if bytes.len() > MAX_RESPONSE_HEAD {
                return Err("poll: response head too large".into());
            }
            return Ok(None);
        }
        Err(e) => return Err(format!("poll: malformed response ({e})")),
    };
    let status = resp.code.unwrap_or(0);
    if status != 200 {
        return Err(format!("poll: status {status}"));
    }
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && !h.value.trim_ascii().eq_ignore_ascii_case(b"identity")
    });
    if chunked {
        return Err("poll: chunked answers are not supported (send Content-Length)".into());
    }
    let length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| {
            std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| "poll: bad Content-Length".to_string())
        })
        .transpose()?;
    let end = match length {
        Some(len) => Some(
            used.checked_add(len)
                .filter(|&end| end <= MAX_MESSAGE + MAX_RESPONSE_HEAD)
                .ok_or_else(|| "poll: answer too large".to_string())?,
        ),
        None => None,
    };
    match end {
        Some(end) if bytes.len() >= end => Ok(Some(used..end)),
        Some(_) if closed => Err("poll: closed before the answer".into()),
        Some(_) => Ok(None),
        None if closed => Ok(Some(used..bytes.len())),
        None => Ok(None),
    }
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

    fn open_next(&mut self) {
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
    fn reopen(&mut self, key: usize) -> bool {
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
    fn lost(&mut self, key: usize, reason: String) {
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
        let delay = backoff_delay(base, conn.retries, &mut self.rng);
        conn.retries = conn.retries.saturating_add(1);
        self.comebacks
            .push(Reverse((Instant::now() + delay, key, conn.attempt)));
    }

    /// Connects again the subscribers whose backoff is over.
    fn comeback_due(&mut self, now: Instant) {
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
    fn reconnect_due(&mut self, now: Instant) {
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

    fn expire_timeouts(&mut self, now: Instant) {
        while let Some(&(at, key, index, attempt)) = self.timeouts.front() {
            if at > now {
                break;
            }
            self.timeouts.pop_front();
            let pending = self.conns.get(key).is_some_and(|c| {
                c.index == index
                    && c.attempt == attempt
                    && matches!(c.state, State::Connecting | State::Handshake)
            });
            if pending {
                self.remove(key, Some("timed out".into()));
            }
        }
    }

    /// Drops a connection; `reason` counts it as failed (not yet open) or dropped.
    fn remove(&mut self, key: usize, reason: Option<String>) {
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
        let Some(conn) = self.conns.get_mut(key) else {
            return Ok(());
        };
        let host = &self.plan.host_header;
        let mut path = self.plan.path_for(u64::from(conn.index)).into_owned();
        match self.plan.transport {
            Transport::Ws => {
                if conn.opened_once && conn.track.seen_any() {
                    path = with_query(&path, "since", conn.track.next - 1);
                    if let Some(epoch) = &conn.resume {
                        path = with_query(&path, "epoch", epoch);
                    }
                }
                let raw: [u8; 16] = rand::random();
                let key_b64 = base64::engine::general_purpose::STANDARD.encode(raw);
                let request = format!(
                    "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key_b64}\r\nSec-WebSocket-Version: 13\r\nUser-Agent: throng-bench\r\n\r\n",
                );
                conn.state = State::Handshake;
                conn.read = Some(Box::new(ReadState::Http {
                    expect: accept_key(key_b64.as_bytes()),
                    head: Vec::new(),
                }));
                send(conn, request.as_bytes())
            }
            Transport::Sse => {
                let last_id = match &conn.resume {
                    Some(epoch) if epoch.starts_with(':') && conn.track.seen_any() => {
                        format!("Last-Event-ID: {}{epoch}\r\n", conn.track.next - 1)
                    }
                    Some(epoch) if epoch.starts_with(':') => String::new(),
                    Some(id) => format!("Last-Event-ID: {id}\r\n"),
                    None => String::new(),
                };
                let request = format!(
                    "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n{last_id}User-Agent: throng-bench\r\n\r\n",
                );
                conn.state = State::Handshake;
                conn.read = Some(Box::new(ReadState::Http {
                    expect: [0; 28],
                    head: Vec::new(),
                }));
                send(conn, request.as_bytes())
            }
            Transport::Poll => {
                let first = conn.cursor.is_none();
                match conn.cursor {
                    Some(since) => path = with_query(&path, "since", since),
                    // The first poll only asks where the channel is (answered at
                    // once); what history holds from before the run is not counted.
                    None => path = with_query(&without_param(&path, "timeout"), "timeout", 0),
                }
                let request = format!(
                    "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\nUser-Agent: throng-bench\r\n\r\n",
                );
                conn.read = Some(Box::new(ReadState::Poll(Vec::new())));
                if first {
                    conn.state = State::Handshake;
                } else {
                    // A waiting poll is an open subscriber: the server holds it.
                    self.mark_open(key);
                }
                match self.conns.get_mut(key) {
                    Some(conn) => send(conn, request.as_bytes()),
                    None => Ok(()),
                }
            }
        }
    }

    /// The connection is open: counted once, however often it reconnects.
    fn mark_open(&mut self, key: usize) {
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
    fn came_back(&mut self, key: usize) {
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

    fn on_readable(&mut self, key: usize, closed: bool) {
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            let n = match (&conn.socket).read(&mut self.buf) {
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
                (State::Open | State::Closing, Transport::Ws) => self.on_ws(key, 0, n),
                (State::Open | State::Closing, Transport::Sse) => self.on_sse(key, 0, n),
                (State::Open | State::Closing, Transport::Poll) => self.on_poll(key, n),
            };
            if !alive || (n < self.buf.len() && !closed) {
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
        self.mark_open(key);
        if extra > 0 {
            return if sse {
                self.on_sse(key, 0, extra)
            } else {
                self.on_ws(key, 0, extra)
            };
        }
        true
    }

    /// Feeds event-stream bytes `buf[start..end]` to the connection's reader.
    fn on_sse(&mut self, key: usize, start: usize, end: usize) -> bool {
        let ClientLoop {
            conns,
            buf,
            tally,
            plan,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        let Some(mut state) = conn.read.take() else {
            return false;
        };
        let ReadState::Sse(reader) = state.as_mut() else {
            return false;
        };
        let mut now_unix = 0;
        let seq_from = plan.seq_from;
        let resumes = plan.reconnect > 0.0 || !plan.comeback_backoff.is_zero();
        let result = reader.feed(&buf[start..end], &mut |ev: &SseEvent| {
            match ev.kind.as_str() {
                "" | "message" => {
                    if now_unix == 0 {
                        now_unix = unix_nanos();
                    }
                    tally.c.frames_in += 1;
                    tally.c.messages_in += 1;
                    let seq = ev.id.as_deref().and_then(leading_number);
                    observe_delivery(tally, &mut conn.track, seq_from, seq, &ev.data, now_unix);
                }
                "gap" => tally.seq.reported_gaps += 1,
                _ => {}
            }
            // Only a subscriber that will reconnect needs its last id (kept
            // without an allocation per delivery otherwise).
            if resumes && let Some(id) = &ev.id {
                match (seq_from, id.find(':')) {
                    // throng's ids are SEQ:EPOCH and the tracker has the seq: keep
                    // ":EPOCH", which changes (and allocates) only with the epoch.
                    (SeqFrom::Server, Some(at)) => {
                        if conn.resume.as_deref() != Some(&id[at..]) {
                            conn.resume = Some(id[at..].into());
                        }
                    }
                    _ => conn.resume = Some(id.as_str().into()),
                }
            }
        });
        let ended = reader.ended();
        conn.read = Some(state);
        match result {
            Err(e) => {
                self.remove(key, Some(e.to_string()));
                false
            }
            Ok(()) if ended => {
                self.lost(key, "sse: the server ended the stream".into());
                false
            }
            Ok(()) => true,
        }
    }

    /// Takes long-poll answer bytes `buf[..n]`; a whole answer is counted and the
    /// next poll sent.
    fn on_poll(&mut self, key: usize, n: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let Some(ReadState::Poll(bytes)) = conn.read.as_deref_mut() else {
            return false;
        };
        bytes.extend_from_slice(&self.buf[..n]);
        if bytes.len() > MAX_MESSAGE + MAX_RESPONSE_HEAD {
            self.remove(key, Some("poll: answer too large".into()));
            return false;
        }
        match poll_answer_bounds(bytes, false) {
            Ok(Some(body)) => self.on_poll_answer(key, body),
            Ok(None) => true,
            Err(why) if why.starts_with("poll: status 5") => {
                self.lost(key, why);
                false
            }
            Err(why) => {
                self.remove(key, Some(why));
                false
            }
        }
    }

    /// The server closed a poll: an answer without a length ends here.
    fn on_poll_end(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Some(ReadState::Poll(bytes)) = conn.read.as_deref_mut() else {
            return self.lost(key, "poll: closed before the answer".into());
        };
        match poll_answer_bounds(bytes, true) {
            Ok(Some(body)) => {
                self.on_poll_answer(key, body);
            }
            Ok(None) => self.lost(key, "poll: closed before the answer".into()),
            Err(why) if why.starts_with("poll: status 5") || why.contains("closed before") => {
                self.lost(key, why)
            }
            Err(why) => self.remove(key, Some(why)),
        }
    }

    /// Counts a whole answer (body at `body` of the read bytes) and polls again.
    fn on_poll_answer(&mut self, key: usize, body: std::ops::Range<usize>) -> bool {
        let ClientLoop { conns, tally, .. } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        let bytes = match conn.read.take().map(|b| *b) {
            Some(ReadState::Poll(bytes)) => bytes,
            _ => {
                self.remove(key, Some("poll: answer without a request".into()));
                return false;
            }
        };
        let Some(text) = bytes.get(body) else {
            self.remove(key, Some("poll: bad Content-Length".into()));
            return false;
        };
        let answer = match PollAnswer::parse(text) {
            Ok(a) => a,
            Err(e) => {
                self.remove(key, Some(e.to_string()));
                return false;
            }
        };
        tally.c.frames_in += 1;
        self.came_back(key);
        let ClientLoop {
            conns,
            tally,
            plan,
            seen_phase,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        // The first answer only tells where the channel is: what history held from
        // before the run is not this run's.
        if conn.cursor.is_some() {
            let now_unix = unix_nanos();
            for m in &answer.messages {
                tally.c.messages_in += 1;
                observe_delivery(
                    tally,
                    &mut conn.track,
                    plan.seq_from,
                    Some(m.seq),
                    &m.data,
                    now_unix,
                );
            }
            if answer.gap.is_some() {
                tally.seq.reported_gaps += 1;
            }
        }
        conn.cursor = Some(answer.next);
        if *seen_phase >= phase::CLOSE {
            return false;
        }
        self.reopen(key)
    }

    /// Feeds `buf[start..end]` to the connection's decoder and acts on the events.
    fn on_ws(&mut self, key: usize, start: usize, end: usize) -> bool {
        let ClientLoop {
            conns,
            buf,
            scratch,
            tally,
            plan,
            epoch,
            rng,
            seen_phase,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        let mut dec = match conn.read.take().map(|b| *b) {
            Some(ReadState::Ws(d)) => d,
            _ => Decoder::client(),
        };
        scratch.clear();
        // The close code, and whether it says "come back".
        let mut close: Option<(Option<u16>, bool)> = None;
        let mut echoed = false;
        let mode = plan.mode;
        let seq_from = plan.seq_from;
        let now_mono = epoch.elapsed().as_nanos() as u64;
        let mut now_unix = 0;
        let result = dec.feed(&mut buf[start..end], MAX_MESSAGE, |ev| {
            match ev {
                Event::Message { payload, .. } => match mode {
                    Mode::Echo => {
                        if conn.sent_at != 0 {
                            let us = now_mono.saturating_sub(conn.sent_at) / 1000;
                            tally.hist.saturating_record(us.max(1));
                            tally.c.latency_samples += 1;
                            tally.c.latency_us_sum += us;
                            conn.sent_at = 0;
                            tally.c.in_flight = tally.c.in_flight.saturating_sub(1);
                            echoed = true;
                        }
                    }
                    Mode::Push | Mode::Chat => {
                        let Ok(env) = serde_json::from_slice::<Envelope<'_>>(payload) else {
                            // A server without envelopes (Nchan's WebSocket
                            // subscriber) sends the published body as it is; the
                            // payload's stamp says the rest.
                            if mode == Mode::Push
                                && seq_from == SeqFrom::Payload
                                && let Ok(data) = std::str::from_utf8(payload)
                            {
                                if now_unix == 0 {
                                    now_unix = unix_nanos();
                                }
                                observe_delivery(
                                    tally,
                                    &mut conn.track,
                                    seq_from,
                                    None,
                                    data,
                                    now_unix,
                                );
                            }
                            return Flow::Continue;
                        };
                        match env.event.as_deref() {
                            Some("epoch") => conn.resume = env.epoch.map(|e| e.as_ref().into()),
                            Some("gap") => tally.seq.reported_gaps += 1,
                            _ => {}
                        }
                        let Some(data) = env.data else {
                            return Flow::Continue;
                        };
                        if now_unix == 0 {
                            now_unix = unix_nanos();
                        }
                        if mode == Mode::Push {
                            observe_delivery(
                                tally,
                                &mut conn.track,
                                seq_from,
                                env.seq,
                                &data,
                                now_unix,
                            );
                            return Flow::Continue;
                        }
                        let sent = {
                            // Chat: only our own broadcasts ("b<index>:<nanos>:...").
                            data.strip_prefix('b')
                                .and_then(|r| r.split_once(':'))
                                .filter(|(idx, _)| idx.parse::<u32>().ok() == Some(conn.index))
                                .and_then(|(_, r)| leading_number(r))
                        };
                        if let Some(sent) = sent {
                            let us = now_unix.saturating_sub(sent) / 1000;
                            tally.hist.saturating_record(us.max(1));
                            tally.c.latency_samples += 1;
                            tally.c.latency_us_sum += us;
                        }
                    }
                    Mode::Idle => {}
                },
                Event::Ping(p) => {
                    tally.c.pings += 1;
                    encode_client_frame(scratch, opcode::PONG, true, p, next_mask(rng));
                }
                Event::Pong(_) => {}
                Event::Close { code, reason } => {
                    close = Some((code, close_says_come_back(code, reason)));
                    return Flow::Stop;
                }
            }
            Flow::Continue
        });
        let stats = match result {
            Ok(stats) => stats,
            Err(e) => {
                self.remove(key, Some(format!("protocol error: {e}")));
                return false;
            }
        };
        tally.c.frames_in += stats.frames;
        tally.c.messages_in += stats.messages;
        if !dec.is_idle() {
            conn.read = Some(Box::new(ReadState::Ws(dec)));
        }
        if let Some((code, come_back)) = close {
            if conn.state == State::Open {
                // Answer the close handshake before letting go.
                scratch.clear();
                let payload = code.unwrap_or(close_code::NORMAL).to_be_bytes();
                encode_client_frame(scratch, opcode::CLOSE, true, &payload, next_mask(rng));
                let _ = send(conn, scratch);
            }
            let reason = match code {
                Some(c) => format!("closed with code {c}"),
                None => "closed with code (none)".into(),
            };
            if come_back {
                self.lost(key, reason);
            } else {
                self.remove(key, Some(reason));
            }
            return false;
        }
        if !scratch.is_empty()
            && let Err(e) = send(conn, scratch)
        {
            self.lost(key, io_reason(&e));
            return false;
        }
        if echoed && *seen_phase == phase::LOAD {
            return self.send_echo(key);
        }
        true
    }

    fn send_echo(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        if conn.state != State::Open {
            return true;
        }
        if self.text.len() != self.plan.size {
            padded(&mut self.text, "", self.plan.size);
        }
        conn.sent_at = (self.epoch.elapsed().as_nanos() as u64).max(1);
        self.tally.c.in_flight += 1;
        self.send_text(key)
    }

    /// Sends `self.text` as one masked text frame; false if the connection died.
    fn send_text(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        self.scratch.clear();
        encode_client_frame(
            &mut self.scratch,
            opcode::TEXT,
            true,
            &self.text,
            next_mask(&mut self.rng),
        );
        self.tally.c.messages_out += 1;
        if let Err(e) = send(conn, &self.scratch) {
            self.lost(key, io_reason(&e));
            return false;
        }
        true
    }

    fn send_chat(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        if conn.state != State::Open {
            return false;
        }
        let prefix = format!("b{}:{}:", conn.index, unix_nanos());
        padded(&mut self.text, &prefix, self.plan.size);
        self.send_text(key)
    }

    fn send_chat_due(&mut self, now: Instant) {
        while let Some(&(at, key, index)) = self.chat_queue.front() {
            if at > now {
                break;
            }
            self.chat_queue.pop_front();
            let same = self.conns.get(key).is_some_and(|c| c.index == index);
            if same && self.send_chat(key) {
                self.chat_queue
                    .push_back((at + self.plan.send_interval, key, index));
            }
        }
    }

    fn enter_phase(&mut self, p: u8) {
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
                Mode::Idle | Mode::Push => {}
            }
        }
        if p >= phase::CLOSE && from < phase::CLOSE {
            self.begin_close();
        }
    }

    fn begin_close(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(mode: Mode) -> Plan {
        Plan {
            mode,
            ip: IpAddr::from([127, 0, 0, 1]),
            first_port: 9000,
            last_port: 9002,
            host_header: "h".into(),
            path: "/ws/{channel}?format=json".into(),
            source_ips: vec![IpAddr::from([127, 0, 0, 2]), IpAddr::from([127, 0, 0, 3])],
            size: 32,
            connect_timeout: Duration::from_secs(1),
            send_interval: Duration::from_secs(1),
            room_size: 10,
            senders: 0.8,
            channels: 4,
            channel_prefix: "bench-".into(),
            room_prefix: "room-".into(),
            transport: Transport::Ws,
            seq_from: SeqFrom::Server,
            reconnect: 0.0,
            reconnect_interval: Duration::from_secs(2),
            comeback_backoff: Duration::from_millis(500),
            conn_offset: 0,
            conns: 100,
            threads: 2,
            rate: 0.0,
            max_opening: 0,
        }
    }

    #[test]
    fn backoff_is_full_jitter_doubling_up_to_the_cap() {
        let base = Duration::from_millis(500);
        let mut rng = 0x1234_5678_9abc_def1;
        for retries in 0..12u8 {
            let ceiling = (base * (1u32 << retries)).min(BACKOFF_CAP);
            let delays: Vec<Duration> = (0..2000)
                .map(|_| backoff_delay(base, retries, &mut rng))
                .collect();
            assert!(delays.iter().all(|d| *d < ceiling), "retries {retries}");
            // Spread over the whole window, not bunched: both ends are reached.
            assert!(
                delays.iter().any(|d| *d < ceiling / 10),
                "retries {retries}"
            );
            assert!(
                delays.iter().any(|d| *d > ceiling * 9 / 10),
                "retries {retries}"
            );
        }
        assert!(backoff_delay(base, 255, &mut rng) < BACKOFF_CAP);
        assert_eq!(backoff_delay(Duration::ZERO, 3, &mut rng), Duration::ZERO);
    }

    #[test]
    fn close_codes_say_come_back_or_stop_as_the_readme_table_does() {
        for code in [1001, 1006, 1011, 1012, 1013] {
            assert!(close_says_come_back(Some(code), ""), "{code}");
        }
        assert!(close_says_come_back(None, ""));
        assert!(close_says_come_back(Some(1008), "slow consumer"));
        for code in [1000, 1002, 1003, 1007, 1008, 1009, 4001] {
            assert!(!close_says_come_back(Some(code), "other"), "{code}");
        }
    }

    #[test]
    fn connections_spread_over_ports_sources_and_channels() {
        let p = plan(Mode::Push);
        assert_eq!(p.target(0).port(), 9000);
        assert_eq!(p.target(4).port(), 9001);
        assert_eq!(p.source(3), Some(IpAddr::from([127, 0, 0, 3])));
        assert_eq!(p.path_for(5), "/ws/bench-1?format=json");
        let c = plan(Mode::Chat);
        assert_eq!(c.path_for(25), "/ws/chat:room-2?format=json");
    }

    #[test]
    fn sender_fraction_is_exact_per_room() {
        let p = plan(Mode::Chat);
        let senders = (0..100).filter(|&i| p.is_sender(i)).count();
        assert_eq!(senders, 80);
        let first_room = (0..10).filter(|&i| p.is_sender(i)).count();
        assert_eq!(first_room, 8);
    }

    #[test]
    fn payload_helpers() {
        let mut v = Vec::new();
        padded(&mut v, "b1:2:", 8);
        assert_eq!(v, b"b1:2:xxx");
        padded(&mut v, "longer than size", 4);
        assert_eq!(v, b"longer than size");
        assert_eq!(leading_number("123 abc"), Some(123));
        assert_eq!(leading_number("abc"), None);
        assert_eq!(publish_stamp("1700 42 xx"), (Some(1700), Some(42)));
        assert_eq!(publish_stamp("1700"), (Some(1700), None));
        assert_eq!(
            with_query("/p?timeout=30", "since", 5),
            "/p?timeout=30&since=5"
        );
        assert_eq!(with_query("/ws/a", "since", 5), "/ws/a?since=5");
        assert_eq!(without_param("/p?timeout=30&x=1", "timeout"), "/p?x=1");
        assert_eq!(without_param("/p?timeout=30", "timeout"), "/p");
        assert_eq!(without_param("/p", "timeout"), "/p");
        let mut s = 7;
        assert_ne!(next_mask(&mut s), next_mask(&mut s));
    }
}
