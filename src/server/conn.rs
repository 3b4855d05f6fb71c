//! Per-connection data: what one socket costs while it sits idle.
//!
//! A [`Conn`] is kept small on purpose (it lives in the loop's slab, one per
//! socket): its [`Mode`] is plain HTTP or its transport's [`Session`] (holding
//! only what that transport needs between reads), and its outbound side is empty
//! until the socket falls behind. On a TLS listener the connection's [`Tls`]
//! is kept beside the slab (so a plain connection's record does not grow by a
//! pointer) and handed to [`Conn`]'s writes, which seal through it: no caller
//! writes a socket directly. Behaviour lives in
//! the event loop, `http` and the transports; this module owns the data layout
//! and names no transport.

use std::io::{self, IoSlice, Write};
use std::net::IpAddr;
use std::sync::Arc;

use mio::net::TcpStream;

use super::http::{self, Next};
use super::routes::Awaited;
use super::shared::Shared;
use super::timer::Tick;
use super::uring::send_ring::NOT_SENT;
use crate::broker::asked::Ticket;
use crate::protocol::http::MAX_REQUEST_HEAD;
use bytes::Bytes;

use crate::hub::Channel;
use crate::outbound::Outbound;
use crate::stats::{Counted, TurnCounts};
use crate::tls::connection::{Tls, TlsWriter};
use crate::transport::{After, Change, CloseReason, Ctx, Hooks, Session, Subscription};

/// A tick value meaning "no deadline" / "no wheel entry".
pub const NEVER: Tick = Tick::MAX;

/// Where a connection is in its life, whatever its transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading requests or messages.
    Active,
    /// A final response or close frame is queued; once flushed, shut down writing.
    Closing,
    /// Writing is shut down; discard input until the peer closes (so our last bytes
    /// are not lost to a reset), or until the linger deadline.
    Lingering,
}

/// What a connection speaks: plain HTTP until a route hands it over, then its
/// transport's session.
#[derive(Debug)]
pub enum Mode {
    /// Plain HTTP (before an upgrade, or kept alive between API requests): the bytes
    /// of a request that has not fully arrived.
    Http(Vec<u8>),
    /// Handed over to a transport.
    Open(Session),
    /// Plain HTTP, its request waiting on the broker's answer (a publish
    /// through Redis); boxed, so that no other connection's record grows.
    Asking(Box<Asking>),
}

/// An HTTP request waiting on the broker: what its answer needs, and what the
/// client sent after it, served once it is answered (at most what one request
/// may send: a waiting request holds no more than one being received).
#[derive(Debug)]
pub struct Asking {
    pub awaited: Awaited,
    pub pending: Vec<u8>,
    /// The client is done sending (half-closed): it closes after the answer.
    pub peer_done: bool,
}

/// What a connection's handler made of its input.
#[derive(Debug)]
pub enum Handled {
    /// An HTTP connection's requests were served.
    Http(Next),
    /// A transport handled its client's input.
    Transport(After),
}

impl Mode {
    /// Hands what the client sent to this connection's handler; answers go to
    /// `out`, subscriptions its transport asks for to `changes`.
    #[allow(clippy::too_many_arguments)]
    pub fn on_input(
        &mut self,
        input: &mut [u8],
        peer: IpAddr,
        shared: &Shared,
        ticket: Ticket,
        out: &mut Vec<u8>,
        counts: &mut TurnCounts,
        chosen_name: Option<&str>,
        changes: &mut Vec<Change>,
        deflate: u8,
        chat: &mut crate::rate::ChatLimiter,
    ) -> Handled {
        match self {
            Mode::Http(pending) => Handled::Http(http::serve(
                pending, input, shared, ticket, peer, out, counts,
            )),
            Mode::Asking(asking) => {
                let most = shared.config.max_message_size + MAX_REQUEST_HEAD;
                if asking.pending.len() + input.len() > most {
                    // Requests sent behind one still waiting, past what one may
                    // take: not read on, nor answered out of turn.
                    return Handled::Http(Next::Close);
                }
                asking.pending.extend_from_slice(input);
                Handled::Http(Next::KeepOpen { answered: false })
            }
            Mode::Open(session) => {
                let mut ctx = Ctx {
                    out,
                    broker: &*shared.broker,
                    ticket,
                    config: &shared.config,
                    hooks: shared.webhooks.as_deref().map(|h| h as &dyn Hooks),
                    counts,
                    chosen_name,
                    changes,
                    deflate,
                    chat,
                };
                Handled::Transport(session.transport_mut().on_input(input, &mut ctx))
            }
        }
    }

    /// The transport's session, once handed over.
    pub fn session(&self) -> Option<&Session> {
        match self {
            Mode::Http(_) | Mode::Asking(_) => None,
            Mode::Open(session) => Some(session),
        }
    }

    pub fn session_mut(&mut self) -> Option<&mut Session> {
        match self {
            Mode::Http(_) | Mode::Asking(_) => None,
            Mode::Open(session) => Some(session),
        }
    }

    /// Counted as an open connection (admission, SOCKETS), to be released.
    pub fn is_counted(&self) -> bool {
        matches!(self, Mode::Open(_))
    }

    /// Whether silence past `--idle-timeout` means the client is gone.
    pub fn expects_input(&self) -> bool {
        self.session()
            .is_some_and(|s| s.transport().expects_input())
    }

    /// The subscriptions it holds (none while it speaks plain HTTP).
    pub fn subscriptions(&self) -> &[Subscription] {
        self.session().map_or(&[], |s| s.subscriptions())
    }

    /// Its subscription of `channel`, if it has one.
    pub fn subscription_of(&self, channel: &Arc<Channel>) -> Option<&Subscription> {
        self.session()?.subscription_of(channel)
    }

    pub fn subscription_of_mut(&mut self, channel: &Arc<Channel>) -> Option<&mut Subscription> {
        self.session_mut()?.subscription_of_mut(channel)
    }

    /// Takes one of its subscriptions out: of the channel named `channel`, or any.
    pub fn take_subscription(&mut self, channel: Option<&str>) -> Option<Subscription> {
        self.session_mut()?.take_subscription(channel)
    }

    /// Appends a keep-alive for the client, if the transport has one.
    pub fn write_heartbeat(&self, out: &mut Vec<u8>) -> After {
        match self {
            Mode::Http(_) | Mode::Asking(_) => After::Nothing,
            Mode::Open(session) => session.transport().write_heartbeat(out),
        }
    }

    /// Appends the transport's goodbye for `reason`; input is of no use after it.
    pub fn write_close(&mut self, out: &mut Vec<u8>, reason: CloseReason) {
        match self {
            Mode::Http(pending) => *pending = Vec::new(),
            Mode::Asking(asking) => asking.pending = Vec::new(),
            Mode::Open(session) => session.transport_mut().write_close(out, reason),
        }
    }

    /// Drops any half-received input.
    pub fn stop_reading(&mut self) {
        match self {
            Mode::Http(pending) => *pending = Vec::new(),
            Mode::Asking(asking) => asking.pending = Vec::new(),
            Mode::Open(session) => session.transport_mut().stop_reading(),
        }
    }

    /// A plain HTTP connection with part of a request received.
    pub fn has_partial_request(&self) -> bool {
        matches!(self, Mode::Http(pending) if !pending.is_empty())
    }
}

#[derive(Debug)]
pub struct Conn {
    pub socket: TcpStream,
    pub peer: IpAddr,
    pub phase: Phase,
    /// The permessage-deflate window its WebSocket messages are compressed with
    /// (0: none negotiated). Kept here, in what would be padding, so that
    /// negotiating compression costs an idle connection nothing.
    pub deflate: u8,
    /// What its next heartbeat must know of the last (in padding too).
    pub beat: Beat,
    pub last_seen: Tick,
    pub next_ping: Tick,
    /// When the loop must next look at this connection.
    pub deadline: Tick,
    /// The tick its live timer-wheel entry is filed under (NEVER: none).
    pub timer_slot: Tick,
    pub out: Outbound,
    pub mode: Mode,
}

/// Since a connection's last heartbeat (sent or skipped): whether it was
/// skipped, whether a fan-out wrote to the connection since, and whether the
/// one due has been put off once already (the loop's timers decide from these
/// whether and when the next one goes out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Beat(u8);

impl Beat {
    const SKIPPED: u8 = 1;
    const DELIVERED: u8 = 2;
    const DEFERRED: u8 = 4;

    pub fn deferred(self) -> bool {
        self.0 & Self::DEFERRED != 0
    }

    /// The one due is put off, once.
    pub fn defer(&mut self) {
        self.0 |= Self::DEFERRED;
    }

    pub fn skipped(self) -> bool {
        self.0 & Self::SKIPPED != 0
    }

    pub fn delivered(self) -> bool {
        self.0 & Self::DELIVERED != 0
    }

    pub fn mark_delivered(&mut self) {
        self.0 |= Self::DELIVERED;
    }

    /// A heartbeat came due, and was sent or skipped.
    pub fn beat(&mut self, skipped: bool) {
        self.0 = if skipped { Self::SKIPPED } else { 0 };
    }
}

/// Where a connection's bytes go: its socket, counted, either as they are or
/// sealed by its TLS.
pub enum Wire<'a> {
    Plain(Counted<'a, &'a mut TcpStream>),
    Sealed(TlsWriter<'a, Counted<'a, &'a mut TcpStream>>),
}

impl<'a> Wire<'a> {
    pub fn new(socket: &'a mut TcpStream, tls: Option<&'a mut Tls>, sent: &'a mut u64) -> Self {
        let socket = Counted::new(socket, sent);
        match tls {
            Some(tls) => Wire::Sealed(tls.writer(socket)),
            None => Wire::Plain(socket),
        }
    }
}

impl Write for Wire<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(w) => w.write(buf),
            Wire::Sealed(w) => w.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Wire::Plain(w) => w.write_vectored(bufs),
            Wire::Sealed(w) => w.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Wire::Plain(w) => w.flush(),
            Wire::Sealed(w) => w.flush(),
        }
    }
}

impl Conn {
    pub fn new(socket: TcpStream, peer: IpAddr, now: Tick) -> Self {
        Conn {
            socket,
            peer,
            phase: Phase::Active,
            deflate: 0,
            beat: Beat::default(),
            last_seen: now,
            next_ping: NEVER,
            deadline: NEVER,
            timer_slot: NEVER,
            out: Outbound::default(),
            mode: Mode::Http(Vec::new()),
        }
    }

    /// Nothing is waiting to go out: no queued plaintext, no sealed bytes owed.
    pub fn is_flushed(&self, tls: Option<&Tls>) -> bool {
        self.out.is_empty() && tls.is_none_or(|t| t.unsent() == 0)
    }

    /// Sends `bytes`, queueing what the socket does not take; adds what it took
    /// to `sent`.
    pub fn send(
        &mut self,
        bytes: &[u8],
        tls: Option<&mut Tls>,
        sent: &mut u64,
    ) -> std::io::Result<()> {
        self.out.send(Wire::new(&mut self.socket, tls, sent), bytes)
    }

    /// Sends frames shared with other subscribers (a fan-out's).
    pub fn send_shared(
        &mut self,
        frames: &[&Bytes],
        tls: Option<&mut Tls>,
        sent: &mut u64,
    ) -> io::Result<()> {
        self.out
            .send_shared(Wire::new(&mut self.socket, tls, sent), frames)
    }

    /// Sends bytes TLS itself produced (a handshake flight, an alert): already
    /// sealed, they go after what is owed and ahead of anything queued later.
    pub fn send_sealed(&mut self, bytes: &[u8], tls: &mut Tls, sent: &mut u64) -> io::Result<()> {
        tls.send_sealed(Counted::new(&mut self.socket, sent), bytes)
    }

    /// Sealed `records` were offered to the socket elsewhere (a send ring),
    /// which answered `result`: the bytes taken or a negative errno, as
    /// `send` would, or `send_ring::NOT_SENT`. What it did not take is owed
    /// ciphertext; an untried send is made now. `Ok(true)` once all is out;
    /// an error means the stream is broken (sealed bytes did not go out).
    pub fn settle_sealed(
        &mut self,
        records: &[u8],
        result: i32,
        tls: &mut Tls,
        sent: &mut u64,
    ) -> io::Result<bool> {
        match result {
            n if n >= 0 => {
                let taken = (n as usize).min(records.len());
                *sent += taken as u64;
                tls.keep_unsent(&records[taken..]);
                Ok(taken == records.len())
            }
            e if e == -libc::EAGAIN => {
                tls.keep_unsent(records);
                Ok(false)
            }
            e if e == NOT_SENT || e == -libc::EINTR => {
                self.send_sealed(records, tls, sent)?;
                Ok(tls.unsent() == 0)
            }
            e => Err(io::Error::from_raw_os_error(
                e.checked_neg().unwrap_or(libc::EIO),
            )),
        }
    }

    /// Tells a TLS peer the stream ends here (close_notify), if the socket
    /// takes it now; writing is shut down next.
    pub fn say_close_notify(&mut self, tls: &mut Tls, sent: &mut u64) {
        tls.close_notify(Counted::new(&mut self.socket, sent));
    }

    /// Sends `bytes`, whose last `catch_up` are a returning subscriber's replay:
    /// what of it waits does not count against `--max-queue` until it is written.
    pub fn send_catch_up(
        &mut self,
        bytes: &[u8],
        catch_up: usize,
        feed: Option<Box<dyn crate::outbound::Feed>>,
        tls: Option<&mut Tls>,
        sent: &mut u64,
    ) -> std::io::Result<()> {
        self.out.send_catch_up(
            Wire::new(&mut self.socket, tls, sent),
            bytes,
            catch_up,
            feed,
        )
    }

    /// Writes what is queued (sealed bytes owed first); `Ok(true)` once
    /// nothing is left.
    pub fn flush(&mut self, mut tls: Option<&mut Tls>, sent: &mut u64) -> std::io::Result<bool> {
        if let Some(tls) = tls.as_deref_mut()
            && !tls.flush_unsent(Counted::new(&mut self.socket, &mut *sent))?
        {
            return Ok(false);
        }
        let queue_done = self
            .out
            .flush(Wire::new(&mut self.socket, tls.as_deref_mut(), sent))?;
        Ok(queue_done && self.is_flushed(tls.as_deref()))
    }
}

/// The TLS of a loop's connections, by slab key, beside the slab: empty
/// (and never grown) on a loop without TLS.
#[derive(Debug, Default)]
pub struct TlsConns(Vec<Option<Box<Tls>>>);

impl TlsConns {
    /// A connection just accepted on a TLS listener: its TLS starts fresh.
    pub fn start(&mut self, key: usize) {
        if self.0.len() <= key {
            self.0.resize_with(key + 1, || None);
        }
        self.0[key] = Some(Box::default());
    }

    pub fn get(&self, key: usize) -> Option<&Tls> {
        self.0.get(key)?.as_deref()
    }

    pub fn get_mut(&mut self, key: usize) -> Option<&mut Tls> {
        self.0.get_mut(key)?.as_deref_mut()
    }

    /// The connection is gone.
    pub fn remove(&mut self, key: usize) {
        if let Some(slot) = self.0.get_mut(key) {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_state_stays_small() {
        // The slab holds one of these per socket: keep an eye on its size.
        assert!(
            std::mem::size_of::<Conn>() <= 80,
            "Conn is {} bytes",
            std::mem::size_of::<Conn>()
        );
    }
}
