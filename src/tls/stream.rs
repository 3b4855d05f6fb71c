//! A TLS connection's bytes between turns, and the two adapters the event loop
//! reads and writes an established TLS connection through.
//!
//! What a connection keeps besides its keys is [`Leftover`]: ciphertext the
//! socket would not take yet (already sealed, so its sequence numbers are
//! spent), and the start of a record not fully received. Each exists only while
//! it is not empty, so an idle connection keeps one null pointer here.
//! [`SealingWriter`] is a `Write` over the socket that seals what it is given:
//! the plaintext the socket does not take stays in the caller's queue of shared
//! chunks, as for a plain connection, and only ciphertext already sealed is
//! kept. [`open`] opens what a read brought, with what was left from before.
//!
//! It must not decide when to read or write, nor know what the plaintext means.

use std::io::{self, IoSlice, Write};

use super::record::{Opened, RecordError, Session};

/// Most plaintext sealed per `write`: four full records, so one write call
/// makes a few large system calls rather than many small ones.
pub const SEAL_PER_WRITE: usize = 4 * super::record::MAX_PLAINTEXT;

/// Bytes a TLS connection holds between turns; boxed, and only while any.
#[derive(Debug, Default)]
pub struct Leftover(Option<Box<Parts>>);

#[derive(Debug, Default)]
struct Parts {
    /// Sealed, not yet taken by the socket: goes out before anything else.
    unsent: Vec<u8>,
    /// The start of a record whose end has not come yet.
    partial: Vec<u8>,
}

impl Leftover {
    /// Ciphertext waiting for the socket.
    pub fn unsent(&self) -> usize {
        self.0.as_ref().map_or(0, |p| p.unsent.len())
    }

    /// Bytes of a record received in part.
    pub fn partial(&self) -> usize {
        self.0.as_ref().map_or(0, |p| p.partial.len())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    fn parts(&mut self) -> &mut Parts {
        self.0.get_or_insert_with(Box::default)
    }

    /// Gives the box back once both parts are empty.
    fn tidy(&mut self) {
        if self
            .0
            .as_ref()
            .is_some_and(|p| p.unsent.is_empty() && p.partial.is_empty())
        {
            self.0 = None;
        }
    }

    /// Sends ciphertext sealed outside a writer (a handshake flight, an
    /// alert): after what is owed, and what the socket does not take is owed.
    pub fn send_sealed<W: Write>(&mut self, mut socket: W, bytes: &[u8]) -> io::Result<()> {
        let n = if self.unsent() == 0 {
            write_some(&mut socket, bytes)?
        } else {
            0
        };
        if n < bytes.len() {
            self.parts().unsent.extend_from_slice(&bytes[n..]);
        }
        Ok(())
    }

    /// Keeps ciphertext sealed and sent elsewhere (a loop's send ring) that
    /// the socket did not take: it goes out before anything else.
    pub fn keep_unsent(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.parts().unsent.extend_from_slice(bytes);
        }
    }

    /// Takes the start of a record (or handshake flight) kept from earlier
    /// reads, leaving none; empty when there was none.
    pub(super) fn take_partial(&mut self) -> Vec<u8> {
        let taken = self
            .0
            .as_mut()
            .map(|p| std::mem::take(&mut p.partial))
            .unwrap_or_default();
        self.tidy();
        taken
    }

    /// Keeps `bytes` (the start of what is still incomplete) for the next read.
    pub(super) fn keep_partial(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.parts().partial.extend_from_slice(bytes);
        }
    }

    /// Writes the ciphertext owed; `Ok(true)` once none is left.
    pub fn flush_unsent<W: Write>(&mut self, mut socket: W) -> io::Result<bool> {
        let Some(parts) = self.0.as_mut() else {
            return Ok(true);
        };
        let n = write_some(&mut socket, &parts.unsent)?;
        parts.unsent.drain(..n);
        let done = parts.unsent.is_empty();
        if done {
            parts.unsent = Vec::new();
            self.tidy();
        }
        Ok(done)
    }
}

/// Writes as much of `bytes` as the socket takes before it would block.
fn write_some<W: Write>(socket: &mut W, bytes: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match socket.write(&bytes[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

fn record_error(e: RecordError) -> io::Error {
    io::Error::other(e)
}

/// A `Write` over a TLS connection's socket: what it accepts is sealed and
/// either on the wire or in the connection's [`Leftover`]; what it refuses
/// (`WouldBlock`, while ciphertext is still owed) stays plaintext with the caller.
pub struct SealingWriter<'a, W: Write> {
    pub socket: W,
    pub session: &'a mut Session,
    pub leftover: &'a mut Leftover,
    /// The loop's scratch for sealing; emptied each time, never kept here.
    pub scratch: &'a mut Vec<u8>,
}

impl<W: Write> Write for SealingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Seals several buffers (a fan-out's queued frames) and writes them in
    /// one system call: a record each, up to [`SEAL_PER_WRITE`] in all.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if !self.leftover.flush_unsent(&mut self.socket)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.scratch.clear();
        let mut taken = 0;
        for buf in bufs.iter().filter(|b| !b.is_empty()) {
            let room = SEAL_PER_WRITE - taken;
            if room == 0 {
                break;
            }
            let take = buf.len().min(room);
            self.session
                .seal(&buf[..take], self.scratch)
                .map_err(record_error)?;
            taken += take;
        }
        if taken == 0 {
            return Ok(0);
        }
        let n = write_some(&mut self.socket, self.scratch)?;
        if n < self.scratch.len() {
            // Sealed is spent: the rest must go out as it is, before anything else.
            self.leftover
                .parts()
                .unsent
                .extend_from_slice(&self.scratch[n..]);
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.leftover.flush_unsent(&mut self.socket)? {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }
}

/// Opens what a read brought (`input`, opened in place), after what an
/// earlier read left of a record; application data goes to `plain`, what must
/// be sent back (a key update) to `answer`. The start of a record still
/// incomplete is kept in `leftover`.
pub fn open(
    session: &mut Session,
    leftover: &mut Leftover,
    input: &mut [u8],
    plain: &mut Vec<u8>,
    answer: &mut Vec<u8>,
) -> Result<Opened, RecordError> {
    if leftover.partial() == 0 {
        let opened = session.open(input, plain, answer)?;
        if opened.consumed < input.len() && !opened.peer_closed {
            leftover
                .parts()
                .partial
                .extend_from_slice(&input[opened.consumed..]);
        }
        return Ok(opened);
    }
    let parts = leftover.parts();
    parts.partial.extend_from_slice(input);
    let result = session.open(&mut parts.partial, plain, answer);
    if let Ok(opened) = &result {
        parts.partial.drain(..opened.consumed);
        if opened.peer_closed || parts.partial.is_empty() {
            parts.partial = Vec::new();
        }
    }
    leftover.tidy();
    result
}

#[cfg(test)]
mod tests;
