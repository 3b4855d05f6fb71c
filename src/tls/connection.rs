//! One connection's TLS, from its first byte to its close_notify: what the
//! event loop keeps per TLS socket ([`Tls`], boxed behind one pointer) and the
//! three things it asks of it: open what a read brought ([`Tls::receive`]),
//! seal what goes out ([`Tls::writer`]), and say goodbye ([`Tls::close_notify`]).
//!
//! Until the client's first bytes it holds nothing but its state tag; during
//! the handshake, rustls's unbuffered state and the start of a flight not yet
//! whole; after it, the record layer's keys and whatever [`Leftover`] is owed.
//! It must not decide when to read, write or close a socket, nor know what the
//! plaintext means.

use std::cell::RefCell;
use std::io::{self, IoSlice, Write};
use std::sync::Arc;

use rustls::ServerConfig;

use super::handshake::{Handshake, Progress, TlsHandshakeError};
use super::record::{RecordError, Session, alert};
use super::stream::{self, Leftover, SealingWriter};

/// Most bytes of an unfinished handshake kept between reads: a ClientHello
/// and its certificate-free follow-ups are far smaller; more is an attack.
const MAX_HANDSHAKE_PENDING: usize = 64 * 1024;

/// The answer to a plain HTTP request on a TLS port.
const PLAIN_HTTP_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
Content-Type: text/plain; charset=utf-8\r\n\
Content-Length: 58\r\n\
Connection: close\r\n\r\n\
This port speaks TLS: use https:// or wss:// to reach it.\n";

thread_local! {
    /// Where a loop seals before writing: one per thread, reused by every
    /// connection, so sealing allocates nothing per message.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Handshake(#[from] TlsHandshakeError),
    #[error("TLS record layer: {0}")]
    Record(#[from] RecordError),
    #[error("a TLS handshake sent more than {MAX_HANDSHAKE_PENDING} bytes without completing")]
    HandshakeTooLarge,
}

enum State {
    /// Accepted; the client has sent nothing yet.
    Fresh,
    Handshaking(Handshake),
    Open(Session),
    /// Failed or closed: nothing more is opened or sealed.
    Done,
}

/// A TLS connection's state, boxed by its owner so a plain connection pays
/// one null pointer.
pub struct Tls {
    state: State,
    leftover: Leftover,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Fresh => "fresh",
            State::Handshaking(_) => "handshaking",
            State::Open(_) => "open",
            State::Done => "done",
        };
        f.debug_struct("Tls")
            .field("state", &state)
            .field("unsent", &self.leftover.unsent())
            .field("partial", &self.leftover.partial())
            .finish()
    }
}

/// What a read came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The handshake finished during this read.
    pub established: bool,
    /// The peer sent close_notify: it sends nothing more.
    pub peer_closed: bool,
}

impl Default for Tls {
    fn default() -> Self {
        Self::new()
    }
}

impl Tls {
    /// A connection just accepted: no handshake state until it speaks.
    pub fn new() -> Self {
        Tls {
            state: State::Fresh,
            leftover: Leftover::default(),
        }
    }

    /// The handshake has begun (the client sent something) and is not done:
    /// timing out now is a failed TLS handshake.
    pub fn is_handshaking(&self) -> bool {
        matches!(self.state, State::Handshaking(_))
    }

    /// Application data can flow.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open(_))
    }

    /// Ciphertext sealed and not yet taken by the socket.
    pub fn unsent(&self) -> usize {
        self.leftover.unsent()
    }

    /// Opens what a read brought. Application data is appended to `plain`;
    /// what must go back to the client (the handshake's flights, a key update,
    /// an alert after a failure) to `send`, to be sent before anything else.
    /// `config` is asked for only when a handshake starts. After an error the
    /// connection must be closed once `send` is out.
    pub fn receive(
        &mut self,
        config: impl FnOnce() -> Arc<ServerConfig>,
        input: &mut [u8],
        plain: &mut Vec<u8>,
        send: &mut Vec<u8>,
    ) -> Result<Received, TlsError> {
        let result = self.receive_inner(config, input, plain, send);
        if let Err(TlsError::Handshake(TlsHandshakeError::PlainHttp(_))) = &result {
            // Someone typed http:// for an https:// port: an HTTP answer they
            // can read says so, where a TLS alert would be noise to them.
            send.clear();
            send.extend_from_slice(PLAIN_HTTP_ANSWER);
        }
        if let Err(e) = &result {
            if let (State::Open(session), TlsError::Record(record)) = (&mut self.state, e)
                && let Some(description) = record.alert()
            {
                // Best effort: the alert only tells the peer why.
                let _ = session.seal_alert(description, send);
            }
            self.state = State::Done;
            self.leftover.take_partial();
        }
        result
    }

    fn receive_inner(
        &mut self,
        config: impl FnOnce() -> Arc<ServerConfig>,
        input: &mut [u8],
        plain: &mut Vec<u8>,
        send: &mut Vec<u8>,
    ) -> Result<Received, TlsError> {
        if let State::Fresh = self.state {
            self.state = State::Handshaking(Handshake::new(config())?);
        }
        match &mut self.state {
            State::Fresh | State::Done => Ok(Received::default()),
            State::Open(session) => {
                let opened = stream::open(session, &mut self.leftover, input, plain, send)?;
                Ok(Received {
                    established: false,
                    peer_closed: opened.peer_closed,
                })
            }
            State::Handshaking(_) => {
                let mut pending = self.leftover.take_partial();
                if pending.is_empty() {
                    self.handshake(input, plain, send)
                } else {
                    pending.extend_from_slice(input);
                    self.handshake(&mut pending, plain, send)
                }
            }
        }
    }

    /// Drives the handshake with everything received and not yet consumed; once
    /// it is done, the records behind the client's Finished are opened too.
    fn handshake(
        &mut self,
        input: &mut [u8],
        plain: &mut Vec<u8>,
        send: &mut Vec<u8>,
    ) -> Result<Received, TlsError> {
        let State::Handshaking(handshake) = &mut self.state else {
            return Ok(Received::default());
        };
        let (consumed, progress) = handshake.advance(input, send);
        match progress {
            Progress::NeedMore => {
                let rest = &input[consumed..];
                if rest.len() > MAX_HANDSHAKE_PENDING {
                    return Err(TlsError::HandshakeTooLarge);
                }
                self.leftover.keep_partial(rest);
                Ok(Received::default())
            }
            Progress::Failed(e) => Err(e.into()),
            Progress::Done => {
                let State::Handshaking(handshake) = std::mem::replace(&mut self.state, State::Done)
                else {
                    return Ok(Received::default());
                };
                let (version, secrets, kernel) = handshake.finish()?;
                let mut session = Session::new(version, secrets, kernel)?;
                let opened = stream::open(
                    &mut session,
                    &mut self.leftover,
                    &mut input[consumed..],
                    plain,
                    send,
                )?;
                self.state = State::Open(session);
                Ok(Received {
                    established: true,
                    peer_closed: opened.peer_closed,
                })
            }
        }
    }

    /// Sends ciphertext `receive` asked for, in order after what is owed.
    pub fn send_sealed<W: Write>(&mut self, socket: W, bytes: &[u8]) -> io::Result<()> {
        self.leftover.send_sealed(socket, bytes)
    }

    /// Writes the ciphertext owed; `Ok(true)` once none is left.
    pub fn flush_unsent<W: Write>(&mut self, socket: W) -> io::Result<bool> {
        self.leftover.flush_unsent(socket)
    }

    /// Seals `frames` (a record each, as a writer would) onto `out`, for a
    /// send made elsewhere (a loop's send ring), which hands back what the
    /// socket does not take through [`Tls::keep_unsent`]. `Ok(false)`, with
    /// nothing sealed, while that may not happen: no open session, or
    /// ciphertext owed that must go first. On an error `out` may hold part of
    /// the records, and the connection must be closed.
    pub fn seal_to<'f>(
        &mut self,
        frames: impl IntoIterator<Item = &'f [u8]>,
        out: &mut Vec<u8>,
    ) -> io::Result<bool> {
        let State::Open(session) = &mut self.state else {
            return Ok(false);
        };
        if self.leftover.unsent() > 0 {
            return Ok(false);
        }
        for frame in frames {
            session.seal(frame, out).map_err(io::Error::other)?;
        }
        Ok(true)
    }

    /// Keeps what the socket did not take of bytes [`Tls::seal_to`] sealed:
    /// already sealed, they go out as they are, before anything else.
    pub fn keep_unsent(&mut self, bytes: &[u8]) {
        self.leftover.keep_unsent(bytes);
    }

    /// A `Write` that seals what it is given onto `socket`. Before the
    /// handshake is done (or after a failure) it refuses: nothing may go out
    /// in plaintext on a TLS port.
    pub fn writer<W: Write>(&mut self, socket: W) -> TlsWriter<'_, W> {
        TlsWriter { socket, tls: self }
    }

    /// Seals close_notify and sends it if the socket takes it now; the caller
    /// shuts down writing next, so nothing is kept for later.
    pub fn close_notify<W: Write>(&mut self, socket: W) {
        let State::Open(session) = &mut self.state else {
            return;
        };
        if self.leftover.unsent() > 0 {
            return;
        }
        let mut alert_record = Vec::new();
        if session
            .seal_alert(alert::CLOSE_NOTIFY, &mut alert_record)
            .is_ok()
        {
            let _ = self.leftover.send_sealed(socket, &alert_record);
        }
        self.state = State::Done;
    }
}

/// See [`Tls::writer`].
pub struct TlsWriter<'a, W: Write> {
    socket: W,
    tls: &'a mut Tls,
}

impl<W: Write> TlsWriter<'_, W> {
    fn with_sealer<T>(
        &mut self,
        f: impl FnOnce(&mut SealingWriter<'_, &mut W>) -> io::Result<T>,
    ) -> io::Result<T> {
        let State::Open(session) = &mut self.tls.state else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "no TLS session to seal with",
            ));
        };
        SCRATCH.with_borrow_mut(|scratch| {
            let mut sealer = SealingWriter {
                socket: &mut self.socket,
                session,
                leftover: &mut self.tls.leftover,
                scratch,
            };
            let result = f(&mut sealer);
            // One large write must not leave the thread a large buffer.
            if scratch.capacity() > 2 * stream::SEAL_PER_WRITE {
                *scratch = Vec::new();
            }
            result
        })
    }
}

impl<W: Write> Write for TlsWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.with_sealer(|s| s.write(buf))
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.with_sealer(|s| s.write_vectored(bufs))
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.tls.leftover.flush_unsent(&mut self.socket)? {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }
}

#[cfg(test)]
mod tests;
