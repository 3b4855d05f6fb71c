//! One client connection ([`Conn`]): its state, what it knows to resume, and its
//! read state and unsent bytes (boxed, and there only while something is
//! partial), with opening its non-blocking socket and reading and writing it
//! (through `tls.rs` when the connection speaks TLS).
//!
//! It must not count or decide: the loop's `lifecycle` moves a connection
//! between states, and each transport's file reads for it.

use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};

use mio::net::TcpStream;
use rustls::ClientConnection;
use socket2::{Domain, Protocol, Socket, Type};

use super::tls;
use crate::bench::comet::SseReader;
use crate::bench::report::SeqTrack;
use crate::outbound::Outbound;
use crate::protocol::Decoder;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Connecting,
    Handshake,
    /// Pusher: upgraded, waiting for `connection_established` and then for
    /// `subscription_succeeded`; it counts as open once subscribed.
    Subscribing,
    Open,
    /// Our close frame is sent; waiting for the server's.
    Closing,
    /// Push: let go by the server with a "come back" signal; its socket is shut
    /// and it waits out its backoff before connecting again.
    Away,
}

pub(super) enum ReadState {
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

/// One client connection. Idle, it is the socket, a few integers and three
/// `None`s (a TLS connection's session in the third).
pub(super) struct Conn {
    pub(super) socket: TcpStream,
    pub(super) index: u32,
    /// Bumped by every reconnect, so a stale connect timeout finds nothing.
    pub(super) attempt: u32,
    pub(super) state: State,
    /// It opened once (a later reconnect is not a new connection).
    pub(super) opened_once: bool,
    /// Push: failed tries to come back since it was last open (the backoff's exponent).
    pub(super) retries: u8,
    /// Poll: the `since` of the next poll (`None` before the first answer).
    pub(super) cursor: Option<u64>,
    /// Where to resume: the epoch a WebSocket was told, or the last SSE event id.
    pub(super) resume: Option<Box<str>>,
    /// Loop-clock nanoseconds (0: none). Echo: when the message in flight was
    /// sent; push: when the server let it go (it is away until it is back).
    pub(super) sent_at: u64,
    /// Push: which seqs arrived.
    pub(super) track: SeqTrack,
    pub(super) read: Option<Box<ReadState>>,
    /// Plain: what the socket would not take yet. Unused under TLS (rustls keeps it).
    pub(super) out: Outbound,
    /// `wss://`, `https://`: this socket's TLS session (a new one per reconnect).
    pub(super) tls: Option<Box<ClientConnection>>,
}

impl Conn {
    /// Reads plaintext as a socket read would (`Ok(0)`: closed; `WouldBlock`:
    /// nothing more now), straight from the socket or through TLS.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.tls.as_deref_mut() {
            Some(session) => tls::read(session, &self.socket, buf),
            None => (&self.socket).read(buf),
        }
    }
}

/// Why a connection failed or dropped; the text is the report's key. A TLS
/// failure carries rustls's error; only TLS reads end in `UnexpectedEof` (a
/// server that hung up before the handshake was done).
pub(super) fn io_reason(e: &io::Error) -> String {
    if let Some(failure) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        return crate::bench::tls::reason(failure);
    }
    match e.kind() {
        io::ErrorKind::UnexpectedEof => "tls: the server closed during the handshake".into(),
        io::ErrorKind::ConnectionRefused => "refused".into(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => "reset".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        kind => format!("i/o error: {kind}"),
    }
}

/// Opens one non-blocking TCP connection (bound to `source` first, if given).
pub(super) fn start_connect(target: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpStream> {
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

/// Writes what the socket takes now and queues the rest (under TLS, encrypted,
/// in rustls).
pub(super) fn send(conn: &mut Conn, bytes: &[u8]) -> io::Result<()> {
    match conn.tls.as_deref_mut() {
        Some(session) => tls::send(session, &conn.socket, bytes),
        None => conn.out.send(&conn.socket, bytes),
    }
}

/// Writes queued bytes; the queue goes once empty.
pub(super) fn flush(conn: &mut Conn) -> io::Result<()> {
    match conn.tls.as_deref_mut() {
        Some(session) => tls::flush(session, &conn.socket),
        None => conn.out.flush(&conn.socket).map(drop),
    }
}
