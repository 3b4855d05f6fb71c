//! A TLS connection's reads: what came is opened by its [`Tls`] (the handshake
//! first, then records), what TLS itself must answer goes out sealed ahead of
//! anything else, and the plaintext is handed on as a plain connection's bytes
//! would be. A failed handshake is counted and closed; nobody else waits. It
//! must not look at the plaintext, nor write a socket but through [`Conn`].
//!
//! [`Tls`]: crate::tls::connection::Tls
//! [`Conn`]: crate::server::conn::Conn

use super::EventLoop;
use crate::stats::HandshakeFailure;
use crate::transport::After;

/// A read buffer past this is given back after use (one large request must
/// not leave the loop a large buffer for good).
const KEEP_PLAIN: usize = 256 * 1024;

impl EventLoop {
    /// Opens `buf.read[..n]` for TLS connection `key` and hands on its plaintext.
    pub(super) fn on_tls_input(&mut self, key: usize, n: usize) {
        let (Some(tls), Some(certificates)) = (self.tls.get_mut(key), self.shared.tls.as_deref())
        else {
            return;
        };
        let mut plain = std::mem::take(&mut self.buf.plain);
        let mut sealed = std::mem::take(&mut self.buf.sealed);
        plain.clear();
        sealed.clear();
        let before_open = !tls.is_open();
        let received = tls.receive(
            || certificates.current(),
            &mut self.buf.read[..n],
            &mut plain,
            &mut sealed,
        );
        let mut alive = true;
        if !sealed.is_empty()
            && let Some(conn) = self.conns.get_mut(key)
        {
            alive = conn
                .send_sealed(&sealed, tls, &mut self.tally.turn.bytes_sent)
                .is_ok();
        }
        match received {
            _ if !alive => self.drop_conn(key),
            Err(e) => {
                let peer = self.conns.get(key).map(|c| c.peer);
                if before_open {
                    self.tally.turn.handshake_failed(HandshakeFailure::Tls);
                    tracing::debug!(?peer, error = %e, "TLS handshake failed");
                } else {
                    tracing::debug!(?peer, error = %e, "TLS connection failed");
                }
                // The alert (if any) goes out, then the connection closes.
                self.buf.out.clear();
                self.send_out(key, After::Close);
            }
            Ok(received) => {
                if !plain.is_empty() {
                    self.buf.out.clear();
                    self.feed(key, Some(&mut plain), 0);
                }
                if received.peer_closed {
                    self.on_peer_done(key);
                }
            }
        }
        if plain.capacity() <= KEEP_PLAIN {
            self.buf.plain = plain;
        }
        if sealed.capacity() <= KEEP_PLAIN {
            self.buf.sealed = sealed;
        }
    }
}
