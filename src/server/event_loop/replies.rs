//! Replies held until the loop's turn ends: what a connection's handler
//! answered (an echo, a pong, an API answer, a heartbeat) goes out with the
//! turn's other replies through the loop's send ring, one system call for up to
//! a ring's batch of sockets, instead of one `send` each as it is made.
//!
//! A held reply waits in its connection's `Outbound`, as bytes the socket has
//! not taken yet, so every other write to that connection (a fan-out, a
//! heartbeat, a close) queues behind it and order is kept with no further
//! rule: the loop only has to offer every held queue to its socket before it
//! waits again. The replies are copied into one arena per loop and shared from
//! there; what a socket does not take is copied out of it, so the arena is free
//! again once the turn's replies are sent, and a connection holds nothing here
//! between turns. A reply is held only while its connection has nothing queued
//! (nor, over TLS, ciphertext owed) and the loop has a send ring. A TLS reply
//! waits as plaintext like any other and is sealed when it is offered, into
//! the batch's one buffer; what its socket did not take is already sealed and
//! stays with its TLS as ciphertext owed, as after its writer's `send`. This
//! module must not decide what is answered nor close anything: it tells the
//! loop which connections failed and which have more to write.

use std::os::fd::{AsRawFd, RawFd};

use bytes::{Bytes, BytesMut};
use slab::Slab;

use crate::server::conn::{Conn, Phase, TlsConns};
use crate::server::uring::send_ring::{NOT_SENT, SendRing};
use crate::stats::TurnCounts;
use crate::tls::connection::Tls;

/// The arena's size: a turn's replies at echo sizes, one block or two.
const ARENA: usize = 16 * 1024;
/// A larger reply is sent at once: copying it would cost what the batch saves.
const HOLD_AT_MOST: usize = 16 * 1024;

/// What the loop must do for a connection once its held reply was offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Its socket failed (or the ring could not say what it took): drop it.
    Dead(usize),
    /// The socket took all it was offered and more waits (or it is closing):
    /// flush it as a writable socket is.
    Flush(usize),
}

#[derive(Debug, Default)]
pub(super) struct Replies {
    arena: BytesMut,
    /// Connections with a held reply (a key may repeat once a slot is reused).
    keys: Vec<u32>,
    /// One batch's sockets, the bytes offered to each, and what each took.
    fds: Vec<RawFd>,
    offered: Vec<Bytes>,
    offered_keys: Vec<u32>,
    /// A TLS reply's records, sealed for this batch: its range of `sealed`
    /// (`None` for a plain reply, offered as it is).
    sealed_ranges: Vec<Option<(u32, u32)>>,
    sealed: Vec<u8>,
    results: Vec<i32>,
    /// The ring failed once: nothing is held from then on.
    ring_failed: bool,
}

impl Replies {
    /// Whether a reply of `len` bytes to `conn` (with its TLS, if any) can be
    /// held (the caller knows the loop has a send ring).
    pub(super) fn can_hold(&self, conn: &Conn, tls: Option<&Tls>, len: usize) -> bool {
        !self.ring_failed
            && len <= HOLD_AT_MOST
            && conn.out.is_empty()
            && tls.is_none_or(|t| t.is_open() && t.unsent() == 0)
    }

    /// Holds `reply` for connection `key` until [`Replies::send`].
    pub(super) fn hold(&mut self, key: usize, conn: &mut Conn, reply: &[u8]) {
        if self.arena.capacity() < reply.len() {
            self.arena.reserve(ARENA.max(reply.len()));
        }
        self.arena.extend_from_slice(reply);
        conn.out.hold(self.arena.split().freeze());
        self.keys.push(key as u32);
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Offers each held connection's first waiting chunk to its socket, a
    /// ring's batch per system call; what a socket did not take stays queued
    /// (its socket raises a writable edge once it drains). `next` gets the
    /// connections the loop must deal with.
    pub(super) fn send(
        &mut self,
        conns: &mut Slab<Conn>,
        tls: &mut TlsConns,
        ring: Option<&mut SendRing>,
        counts: &mut TurnCounts,
        next: &mut Vec<Next>,
    ) {
        if self.keys.is_empty() {
            return;
        }
        self.keys.sort_unstable();
        self.keys.dedup();
        let mut ring = ring.filter(|_| !self.ring_failed);
        let batch = ring.as_ref().map_or(1, |r| r.batch());
        let keys = std::mem::take(&mut self.keys);
        for chunk in keys.chunks(batch) {
            for &key in chunk {
                let Some(front) = conns.get(key as usize).and_then(|c| c.out.front()) else {
                    continue;
                };
                let mut range = None;
                if let Some(tls) = tls.get_mut(key as usize) {
                    if ring.is_none() {
                        // Its writer seals and sends it.
                        next.push(Next::Flush(key as usize));
                        continue;
                    }
                    let start = self.sealed.len();
                    match tls.seal_to([&front[..]], &mut self.sealed) {
                        Ok(true) => range = Some((start as u32, self.sealed.len() as u32)),
                        // Ciphertext owed came first: its writer sends both.
                        Ok(false) => {
                            next.push(Next::Flush(key as usize));
                            continue;
                        }
                        Err(_) => {
                            self.sealed.truncate(start);
                            next.push(Next::Dead(key as usize));
                            continue;
                        }
                    }
                }
                self.offered.push(front.clone());
                self.sealed_ranges.push(range);
                self.fds.push(conns[key as usize].socket.as_raw_fd());
                self.offered_keys.push(key);
            }
            match ring.as_deref_mut() {
                Some(ring) => {
                    let sealed = &self.sealed;
                    let bufs =
                        self.offered
                            .iter()
                            .zip(&self.sealed_ranges)
                            .map(|(plain, range)| {
                                range.map_or(&plain[..], |(start, end)| {
                                    &sealed[start as usize..end as usize]
                                })
                            });
                    if let Err(e) = ring.send_slices(&self.fds, bufs, &mut self.results) {
                        tracing::warn!(error = %e, "the send ring failed: replies go by send(2) from now on");
                        self.ring_failed = true;
                    }
                }
                None => {
                    self.results.clear();
                    self.results.resize(self.fds.len(), NOT_SENT);
                }
            }
            self.settle(conns, tls, counts, next);
            if self.ring_failed {
                ring = None;
            }
        }
        self.keys = keys;
        self.keys.clear();
    }

    /// Takes one batch's results: what each socket took leaves its queue.
    fn settle(
        &mut self,
        conns: &mut Slab<Conn>,
        tls: &mut TlsConns,
        counts: &mut TurnCounts,
        next: &mut Vec<Next>,
    ) {
        for (i, &key) in self.offered_keys.iter().enumerate() {
            let key = key as usize;
            let Some(conn) = conns.get_mut(key) else {
                continue;
            };
            let offered = self.offered[i].len();
            let result = self.results.get(i).copied().unwrap_or(NOT_SENT);
            if let Some((start, end)) = self.sealed_ranges[i] {
                let records = &self.sealed[start as usize..end as usize];
                let Some(tls) = tls.get_mut(key) else {
                    continue;
                };
                // Sealed, the reply's plaintext is spent whatever the socket took.
                conn.out.sent_front(offered);
                match conn.settle_sealed(records, result, tls, &mut counts.bytes_sent) {
                    // Out: what waits behind it (or a close) goes as a writable socket's.
                    Ok(true) if !conn.out.is_empty() || conn.phase != Phase::Active => {
                        next.push(Next::Flush(key));
                    }
                    // Out, or owed until the full socket's writable edge.
                    Ok(_) => {}
                    Err(_) => next.push(Next::Dead(key)),
                }
                continue;
            }
            match result {
                n if n >= 0 => {
                    let taken = n as usize;
                    counts.bytes_sent += taken as u64;
                    conn.out.sent_front(taken);
                    if taken == offered && (!conn.out.is_empty() || conn.phase != Phase::Active) {
                        next.push(Next::Flush(key));
                    }
                }
                e if e == -libc::EAGAIN => conn.out.sent_front(0),
                // Not tried: no writable edge will come for it.
                e if e == NOT_SENT || e == -libc::EINTR => {
                    conn.out.sent_front(0);
                    next.push(Next::Flush(key));
                }
                // A failed socket, or a send the ring could not account for:
                // the connection is let go rather than risk a doubled reply.
                _ => next.push(Next::Dead(key)),
            }
        }
        self.fds.clear();
        self.offered.clear();
        self.offered_keys.clear();
        self.sealed_ranges.clear();
        self.sealed.clear();
        // Large replies must not leave the loop a large buffer.
        if self.sealed.capacity() > 4 * ARENA {
            self.sealed = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;
    use crate::server::uring::send_ring::SendOp;

    fn connect(listener: &TcpListener, conns: &mut Slab<Conn>) -> (usize, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let socket = mio::net::TcpStream::from_std(server);
        let key = conns.insert(Conn::new(socket, [127, 0, 0, 1].into(), 0));
        (key, client)
    }

    /// The turn's end for connections without TLS.
    fn offer_held(
        replies: &mut Replies,
        conns: &mut Slab<Conn>,
        ring: &mut SendRing,
        counts: &mut TurnCounts,
        next: &mut Vec<Next>,
    ) {
        replies.send(conns, &mut TlsConns::default(), Some(ring), counts, next);
    }

    fn read_exactly(client: &mut TcpStream, len: usize) -> Vec<u8> {
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut got = vec![0u8; len];
        client.read_exact(&mut got).unwrap();
        got
    }

    #[test]
    #[ignore = "needs io_uring: run by scripts/test.sh"]
    fn held_replies_go_out_in_one_enter_in_order_and_a_full_socket_keeps_its_own_copy() {
        let mut ring = SendRing::new(SendOp::Send, 8).expect("io_uring here");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conns: Slab<Conn> = Slab::new();
        let mut clients: Vec<_> = (0..6).map(|_| connect(&listener, &mut conns)).collect();
        let mut replies = Replies::default();
        let (mut counts, mut next) = (TurnCounts::default(), Vec::new());

        // Every connection's reply is held; the first one's second answer
        // (made after the hold, as a heartbeat or a fan-out would be) queues
        // behind it.
        for (i, (key, _)) in clients.iter().enumerate() {
            let conn = &mut conns[*key];
            assert!(replies.can_hold(conn, None, 5));
            replies.hold(*key, conn, format!("re:{i}").as_bytes());
        }
        let first = clients[0].0;
        assert!(
            !replies.can_hold(&conns[first], None, 5),
            "one held reply each"
        );
        conns[first]
            .send(b"+late", None, &mut counts.bytes_sent)
            .unwrap();
        // A repeated key (a slot reused within the turn) is offered once.
        replies.keys.push(first as u32);
        offer_held(&mut replies, &mut conns, &mut ring, &mut counts, &mut next);
        assert_eq!((ring.sends, ring.enters), (6, 1), "one system call");
        assert_eq!(next, vec![Next::Flush(first)], "the late answer waits");
        assert!(conns[first].flush(None, &mut counts.bytes_sent).unwrap());
        assert_eq!(read_exactly(&mut clients[0].1, 9), b"re:0+late");
        for (i, (key, client)) in clients.iter_mut().enumerate().skip(1) {
            assert_eq!(read_exactly(client, 4), format!("re:{i}").as_bytes());
            assert!(conns[*key].out.is_empty());
        }

        // A socket nobody reads: its reply stays queued, copied out of the
        // arena (the arena's bytes are no longer shared with it).
        let (stuck, _stuck_client) = connect(&listener, &mut conns);
        let filler = vec![b'x'; 1 << 16];
        while conns[stuck].socket.write(&filler).is_ok() {}
        replies.hold(stuck, &mut conns[stuck], b"waits");
        next.clear();
        offer_held(&mut replies, &mut conns, &mut ring, &mut counts, &mut next);
        assert!(next.is_empty(), "{next:?}");
        assert_eq!(conns[stuck].out.queued_bytes(), 5);
        let front = conns[stuck].out.front().unwrap();
        assert_eq!(&front[..], b"waits");
        assert!(front.is_unique(), "the queue holds its own copy");

        // A reset peer: its held reply's send fails and the loop is told.
        let (gone, gone_client) = connect(&listener, &mut conns);
        drop(gone_client);
        let mut dead = false;
        for _ in 0..50 {
            replies.hold(gone, &mut conns[gone], b"bye");
            next.clear();
            offer_held(&mut replies, &mut conns, &mut ring, &mut counts, &mut next);
            if next == vec![Next::Dead(gone)] {
                dead = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(dead, "a send to a closed peer fails");
    }
}
