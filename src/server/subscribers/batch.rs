//! A fan-out's batched sends: the subscribers of one slice that take the same
//! frames, gathered until a [`SendRing`] writes to all of them with one system
//! call, then what each socket did not take queued as a `send` would have.
//!
//! Only a subscriber with nothing waiting in its queue and no filter of its own
//! joins a batch. Without TLS the frames are shared and go out as they are; with
//! TLS each subscriber's records are sealed into the batch's one buffer (its
//! keys are its own) and each socket is sent its part, what it did not take
//! kept as ciphertext owed, as a writer would have. It must not decide who gets
//! what (the fan-out does) nor keep anything between fan-outs: a batch is
//! written before its fan-out slice returns.

use std::os::fd::RawFd;

use bytes::Bytes;
use slab::Slab;

use super::Follow;
use crate::server::conn::{Conn, TlsConns};
use crate::server::uring::send_ring::{NOT_SENT, SendRing};
use crate::stats::TurnCounts;
use crate::tls::connection::Tls;

/// Sealed bytes a batch gathers before it is written (with one subscriber's
/// records over it at most): a 100-byte message's 256 subscribers fit.
pub(super) const SEALED_PER_BATCH: usize = 64 * 1024;
/// The plaintext a subscriber's frames may come to and still be sealed into a
/// batch; larger runs go through the connection's own writer.
pub(super) const SEAL_AT_MOST: usize = 16 * 1024;

/// The loop's send ring (if it has one) and the batch being gathered.
#[derive(Debug, Default)]
pub(super) struct Batch {
    ring: Option<SendRing>,
    keys: Vec<u32>,
    fds: Vec<RawFd>,
    results: Vec<i32>,
    /// The frames' place among the fan-out's formats (see `gathered_slot`).
    pub(super) slot: usize,
    /// TLS subscribers gathered, each with its records in `sealed`.
    sealed_keys: Vec<u32>,
    sealed_fds: Vec<RawFd>,
    sealed_ranges: Vec<(u32, u32)>,
    sealed: Vec<u8>,
}

impl Batch {
    pub(super) fn with_ring(ring: SendRing) -> Self {
        Batch {
            ring: Some(ring),
            ..Batch::default()
        }
    }

    pub(super) fn has_ring(&self) -> bool {
        self.ring.is_some()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub(super) fn has_sealed(&self) -> bool {
        !self.sealed_keys.is_empty()
    }

    pub(super) fn ring_mut(&mut self) -> Option<&mut SendRing> {
        self.ring.as_mut()
    }

    /// Adds a subscriber; true when the batch is full and must be written.
    pub(super) fn push(&mut self, key: usize, fd: RawFd) -> bool {
        self.keys.push(key as u32);
        self.fds.push(fd);
        self.ring
            .as_ref()
            .is_none_or(|ring| self.keys.len() >= ring.batch())
    }

    /// Sends and system calls made through the ring so far.
    pub(super) fn ring_counts(&self) -> (u64, u64) {
        self.ring.as_ref().map_or((0, 0), |r| (r.sends, r.enters))
    }

    /// Writes `frames` to every subscriber gathered, then empties the batch.
    pub(super) fn write(
        &mut self,
        frames: &[&Bytes],
        conns: &mut Slab<Conn>,
        max_queue: usize,
        counts: &mut TurnCounts,
        failed: &mut Vec<Follow>,
    ) {
        if self.keys.is_empty() {
            return;
        }
        offer(
            &mut self.ring,
            &mut self.results,
            self.keys.len(),
            |ring, results| ring.send_to_all(&self.fds, frames, results),
        );
        for (i, &key) in self.keys.iter().enumerate() {
            let key = key as usize;
            let Some(conn) = conns.get_mut(key) else {
                continue;
            };
            let taken = match self.results.get(i).copied().unwrap_or(NOT_SENT) {
                NOT_SENT => {
                    if conn
                        .send_shared(frames, None, &mut counts.bytes_sent)
                        .is_err()
                    {
                        failed.push(Follow::Dead(key));
                        continue;
                    }
                    None
                }
                n if n >= 0 => Some(n as usize),
                e if e == -libc::EAGAIN || e == -libc::EINTR => Some(0),
                // A failed socket, or a send the ring could not account for:
                // the subscriber is let go (it resumes from its last seq).
                _ => {
                    failed.push(Follow::Dead(key));
                    continue;
                }
            };
            if let Some(taken) = taken {
                counts.bytes_sent += taken as u64;
                conn.out.sent_elsewhere(frames, taken);
            }
            if conn.out.counted_bytes() > max_queue {
                failed.push(Follow::Slow(key));
            }
        }
        self.keys.clear();
        self.fds.clear();
    }

    /// Seals `frames` for a TLS subscriber into the batch. `Ok(None)`: its
    /// TLS may not seal for a batch now (ciphertext owed first), so it is
    /// written the usual way; `Ok(Some(true))`: the batch is full and must be
    /// written. An error means its session failed: the subscriber is dead.
    pub(super) fn seal(
        &mut self,
        key: usize,
        fd: RawFd,
        tls: &mut Tls,
        frames: &[&Bytes],
    ) -> std::io::Result<Option<bool>> {
        let start = self.sealed.len();
        match tls.seal_to(frames.iter().map(|f| &f[..]), &mut self.sealed) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) => {
                self.sealed.truncate(start);
                return Err(e);
            }
        }
        self.sealed_keys.push(key as u32);
        self.sealed_fds.push(fd);
        self.sealed_ranges
            .push((start as u32, self.sealed.len() as u32));
        let ring_full = self
            .ring
            .as_ref()
            .is_none_or(|ring| self.sealed_keys.len() >= ring.batch());
        Ok(Some(ring_full || self.sealed.len() >= SEALED_PER_BATCH))
    }

    /// Writes each TLS subscriber gathered its records, keeps what a socket
    /// did not take as ciphertext it owes, then empties the batch.
    pub(super) fn write_sealed(
        &mut self,
        conns: &mut Slab<Conn>,
        tls: &mut TlsConns,
        counts: &mut TurnCounts,
        failed: &mut Vec<Follow>,
    ) {
        if self.sealed_keys.is_empty() {
            return;
        }
        let sealed = &self.sealed;
        let parts = self
            .sealed_ranges
            .iter()
            .map(|&(start, end)| &sealed[start as usize..end as usize]);
        offer(
            &mut self.ring,
            &mut self.results,
            self.sealed_keys.len(),
            |ring, results| ring.send_slices(&self.sealed_fds, parts, results),
        );
        for (i, (&key, &(start, end))) in
            self.sealed_keys.iter().zip(&self.sealed_ranges).enumerate()
        {
            let key = key as usize;
            let records = &self.sealed[start as usize..end as usize];
            let (Some(conn), Some(tls)) = (conns.get_mut(key), tls.get_mut(key)) else {
                continue;
            };
            let result = self.results.get(i).copied().unwrap_or(NOT_SENT);
            if conn
                .settle_sealed(records, result, tls, &mut counts.bytes_sent)
                .is_err()
            {
                failed.push(Follow::Dead(key));
            }
        }
        self.sealed_keys.clear();
        self.sealed_fds.clear();
        self.sealed_ranges.clear();
        self.sealed.clear();
        // A batch of large records must not leave the loop a large buffer.
        if self.sealed.capacity() > 2 * SEALED_PER_BATCH {
            self.sealed = Vec::new();
        }
    }
}

/// Sends a batch of `count` sockets through the ring with `send`, which
/// fills `results` as the ring's calls do; a lone socket or a loop without a
/// ring leaves `results` empty (every socket not sent: a `send` of its own
/// costs what one ring entry does). A failed ring is dropped for good.
fn offer(
    ring: &mut Option<SendRing>,
    results: &mut Vec<i32>,
    count: usize,
    send: impl FnOnce(&mut SendRing, &mut Vec<i32>) -> std::io::Result<()>,
) {
    results.clear();
    let Some(active) = ring.as_mut().filter(|_| count > 1) else {
        return;
    };
    if let Err(e) = send(active, results) {
        tracing::warn!(error = %e, "the send ring failed: this loop sends with send(2) from now on");
        *ring = None;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::Duration;

    use slab::Slab;

    use super::super::tests::{
        assert_all_got, broker, connect, deliver_all, far, text, ws_subscribe,
    };
    use super::super::{Follow, LocalSubscribers};
    use crate::broker::Broker;
    use crate::server::conn::Conn;
    use crate::stats::TurnCounts;

    #[test]
    #[ignore = "needs io_uring: run by scripts/test.sh"]
    fn a_fan_out_through_the_send_ring_reaches_everyone_in_order_and_queues_what_a_full_socket_left()
     {
        use crate::server::uring::send_ring::{SendOp, SendRing};
        for op in [SendOp::Send, SendOp::SendMsg] {
            let ring = SendRing::new(op, 8).expect("io_uring here");
            let (_poll, hub, broker) = broker(0);
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut conns: Slab<Conn> = Slab::new();
            let mut subscribers = LocalSubscribers::new(0);
            subscribers.send_through(ring);
            // 21 subscribers: two full batches of 8 and a last one of 5.
            let mut clients = Vec::new();
            for _ in 0..21 {
                let (key, client) = connect(&listener, &mut conns);
                ws_subscribe(&mut subscribers, &broker, &mut conns, key, "r", None);
                clients.push((key, client));
            }
            let deliver = |subscribers: &mut LocalSubscribers,
                           conns: &mut Slab<Conn>,
                           counts: &mut TurnCounts,
                           failed: &mut Vec<Follow>| {
                deliver_all(
                    subscribers,
                    hub.inbox(0),
                    conns,
                    usize::MAX,
                    counts,
                    failed,
                    far,
                );
            };
            let (mut counts, mut failed) = (TurnCounts::default(), Vec::new());
            broker.publish("r", text("m1")).unwrap();
            deliver(&mut subscribers, &mut conns, &mut counts, &mut failed);
            // Two messages at once go out gathered (SENDMSG).
            broker.publish("r", text("m2")).unwrap();
            broker.publish("r", text("m3")).unwrap();
            deliver(&mut subscribers, &mut conns, &mut counts, &mut failed);
            assert!(failed.is_empty(), "{failed:?}");
            assert_all_got(&mut clients, b"\x81\x02m1\x81\x02m2\x81\x02m3");
            let (sends, enters) = subscribers.ring_sends();
            assert_eq!(
                sends, 42,
                "{op:?}: every subscriber, twice, through the ring"
            );
            assert_eq!(enters, 6, "{op:?}: one system call per batch");
            assert_eq!(counts.delivered, 63);

            // A subscriber that reads nothing: its socket fills, the ring's send
            // takes part or none of a message, the rest waits in its queue (where
            // the next messages go too, ahead of any ring) and reaches it in order
            // once it reads.
            let big = "x".repeat(60_000);
            let stuck_key = clients[0].0;
            let mut sent = 0;
            while conns[stuck_key].out.is_empty() && sent < 1000 {
                broker.publish("r", text(&big)).unwrap();
                deliver(&mut subscribers, &mut conns, &mut counts, &mut failed);
                sent += 1;
                for (_, other) in clients.iter_mut().skip(1) {
                    let mut frame = vec![0u8; 4 + big.len()];
                    other.read_exact(&mut frame).unwrap();
                }
            }
            let stuck = &mut clients[0].1;
            assert!(!conns[stuck_key].out.is_empty(), "the unread socket filled");
            broker.publish("r", text("last")).unwrap();
            deliver(&mut subscribers, &mut conns, &mut counts, &mut failed);
            let mut got = Vec::new();
            let want = sent * (4 + big.len()) + 6;
            stuck
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut buf = vec![0u8; 1 << 16];
            while got.len() < want {
                let _ = conns[stuck_key]
                    .flush(None, &mut counts.bytes_sent)
                    .unwrap();
                match stuck.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(got.len(), want);
            assert!(got.ends_with(b"\x81\x04last"));
            assert!(failed.is_empty(), "{failed:?}");
        }
    }
}
