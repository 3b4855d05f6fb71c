//! TLS under the client loop (`wss://`, and `https://` for SSE and long-polls):
//! rustls's buffered [`ClientConnection`] between a non-blocking socket and the
//! transports, which see plaintext only.
//!
//! - Read: socket → `read_tls` → `process_new_packets` → `reader().read` into
//!   the loop's buffer. Whatever the processing leaves to send (handshake
//!   messages, alerts, key updates, and the request written before the
//!   handshake ended) is flushed at once. The caller must read until
//!   `WouldBlock` (mio is edge-triggered, and one `read_tls` takes at most 4 KiB).
//! - Write: plaintext → `writer().write_all` → `write_tls` until the socket
//!   would block; what it would not take stays in rustls and goes out on the
//!   next writable event ([`flush`]). The WebSocket upgrade or the HTTP GET is
//!   written as soon as TCP is up: rustls holds it until the handshake is done.
//!
//! A handshake that fails is an [`io::Error`] carrying the [`rustls::Error`],
//! which `conn::io_reason` turns into the report's reason. It must not parse
//! the plaintext or decide what a failure means: the transports and
//! `lifecycle` do.

use std::io::{self, Read, Write};
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::ClientConnection;

use crate::bench::tls::{TlsTarget, reason};

/// A new client session for `target`, whose plaintext rustls buffers without a
/// limit (as the plain path's queue does: the plan bounds what is in flight).
pub(super) fn start(target: &TlsTarget) -> Result<Box<ClientConnection>, String> {
    let mut tls = ClientConnection::new(Arc::clone(&target.config), target.name.clone())
        .map_err(|e| reason(&e))?;
    tls.set_buffer_limit(None);
    Ok(Box::new(tls))
}

/// Encrypts `bytes` and writes what the socket takes now; rustls keeps the rest.
pub(super) fn send(tls: &mut ClientConnection, socket: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    tls.writer().write_all(bytes)?;
    flush(tls, socket)
}

/// Writes pending ciphertext until there is none or the socket would block.
pub(super) fn flush(tls: &mut ClientConnection, mut socket: &TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(&mut socket) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads plaintext into `buf`, as a socket read would: `Ok(0)` once the server
/// has closed (with or without `close_notify`), `WouldBlock` once the socket
/// is drained and rustls holds no plaintext.
pub(super) fn read(
    tls: &mut ClientConnection,
    mut socket: &TcpStream,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut eof = false;
    loop {
        match tls.reader().read(buf) {
            Ok(n) => return Ok(n),
            // Closed without close_notify: for the transports, as a TCP close.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && eof => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        match tls.read_tls(&mut socket) {
            // The server hung up on the handshake (see `conn::io_reason`).
            Ok(0) if tls.is_handshaking() => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(0) => eof = true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let processed = tls.process_new_packets();
        // Send what the packets asked for, and on failure the alert saying why
        // (best effort: the failure is what counts).
        let flushed = flush(tls, socket);
        if let Err(e) = processed {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        flushed?;
    }
}
