//! The loop's waits and its io_uring side: waiting in epoll alone or through the
//! ring, the ring's receive completions, and which connections receive through
//! it (the busy ones) or through epoll reads. It must not interpret the bytes:
//! they go to the connection's handler as epoll's reads do.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mio::{Events, Interest, Poll, Token};

use super::{EVENTS_PER_POLL, EventLoop};
use crate::config::ServeConfig;
use crate::server::conn::{Conn, Phase};
use crate::server::uring::send_ring::{self, SendOp, SendRing};
use crate::server::uring::{Completion, Uring, Via};
use crate::stats::LoopCounters;

/// Receives through io_uring for busy connections (made by `start`, in the
/// loop's own thread); none: epoll reports every readable socket.
#[derive(Default)]
pub(super) struct Ring {
    uring: Option<Uring>,
    completions: Vec<Completion>,
    /// Epoll filled a whole batch: poll it again next turn without being told.
    epoll_again: bool,
}

impl Ring {
    /// Makes the ring when `--io-uring` asks for one and the kernel has it.
    pub(super) fn start(&mut self, poll: &Poll, config: &ServeConfig, index: usize) {
        if !config.io_uring {
            return;
        }
        match Uring::new(poll.as_raw_fd()) {
            Ok(uring) => self.uring = Some(uring),
            Err(e) => {
                if index == 0 {
                    tracing::info!(error = %e, "io_uring unavailable: receiving through epoll");
                }
            }
        }
    }

    /// The loop's ring for batched fan-out sends, when `--io-uring` allows one
    /// and the kernel makes it (`THRONG_SEND_RING=off` declines it, and
    /// `THRONG_SEND_RING=sendmsg` or a batch size choose how it sends, to
    /// measure one against another: docs/BENCHMARKS.md §29).
    pub(super) fn send_ring(&self, config: &ServeConfig, index: usize) -> Option<SendRing> {
        if !config.io_uring {
            return None;
        }
        let how = std::env::var("THRONG_SEND_RING").unwrap_or_default();
        if how == "off" {
            return None;
        }
        let op = if how.starts_with("sendmsg") {
            SendOp::SendMsg
        } else {
            SendOp::Send
        };
        let batch = how
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(send_ring::BATCH);
        match SendRing::new(op, batch) {
            Ok(ring) => Some(ring),
            Err(e) => {
                if index == 0 {
                    tracing::info!(error = %e, "no send ring: fan-outs send with send(2)");
                }
                None
            }
        }
    }

    /// Whether `key`'s bytes come through the ring (not epoll's reads).
    pub(super) fn receives(&self, key: usize) -> bool {
        self.uring
            .as_ref()
            .is_some_and(|u| u.via(key) != Via::Epoll)
    }

    pub(super) fn opened(&mut self, key: usize) {
        if let Some(uring) = &mut self.uring {
            uring.opened(key);
        }
    }

    pub(super) fn count_read(&mut self, key: usize) {
        if let Some(uring) = &mut self.uring {
            uring.count_read(key);
        }
    }

    /// A connection leaves: its armed receive holds the socket open until it is
    /// cancelled, and its registration would outlive the descriptor's number
    /// meanwhile.
    pub(super) fn forget(&mut self, poll: &Poll, key: usize, conn: &mut Conn) {
        if let Some(uring) = &mut self.uring
            && uring.closed(key)
        {
            let _ = poll.registry().deregister(&mut conn.socket);
        }
    }

    /// Weighs which connections are busy enough to receive through the ring.
    pub(super) fn sweep(&mut self, counters: &LoopCounters) {
        if let Some(uring) = &mut self.uring {
            uring.sweep();
            counters
                .ring_receivers
                .store(uring.armed(), Ordering::Relaxed);
        }
    }
}

impl EventLoop {
    /// Waits for events (and ring completions) at most `timeout`. `None`: epoll's
    /// wait was interrupted, wait again; `Some(polled)`: whether `events` holds
    /// this turn's epoll events.
    pub(super) fn wait(
        &mut self,
        events: &mut Events,
        timeout: Duration,
    ) -> io::Result<Option<bool>> {
        let ring = &mut self.ring;
        ring.completions.clear();
        let Some(uring) = &mut ring.uring else {
            return match self.poll.poll(events, Some(timeout)) {
                Ok(()) => Ok(Some(true)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
                Err(e) => Err(e),
            };
        };
        let wait = (!ring.epoll_again).then_some(timeout);
        uring.wait(wait, &mut ring.completions)?;
        let ready = ring.epoll_again
            || ring
                .completions
                .iter()
                .any(|c| matches!(c, Completion::Epoll));
        if ready {
            match self.poll.poll(events, Some(Duration::ZERO)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            // A full batch may leave events behind, and the poll of the epoll
            // descriptor fires on new ones only.
            let taken = events.iter().count();
            ring.epoll_again = taken >= EVENTS_PER_POLL;
            uring.count_events(taken);
        }
        Ok(Some(ready))
    }

    /// Hands each receive the ring completed to its connection.
    pub(super) fn on_completions(&mut self) {
        let completions = std::mem::take(&mut self.ring.completions);
        for &completion in &completions {
            if let Completion::Received {
                key,
                generation,
                result,
                buffer,
                more,
            } = completion
            {
                self.on_received(key, generation, result, buffer, more);
            }
        }
        self.ring.completions = completions;
    }

    /// A connection epoll read itself busy moves to the ring: from here epoll
    /// only says when its socket can take more output, and what the socket holds
    /// now, the ring's receive takes first.
    pub(super) fn move_to_ring_if_busy(&mut self, key: usize) {
        let (Some(conn), Some(uring)) = (self.conns.get_mut(key), &mut self.ring.uring) else {
            return;
        };
        if !uring.is_busy(key) {
            return;
        }
        if self
            .poll
            .registry()
            .reregister(&mut conn.socket, Token(key), Interest::WRITABLE)
            .is_ok()
        {
            uring.arm(conn.socket.as_raw_fd(), key);
        }
    }

    /// What io_uring received for connection `key`: bytes, its end, or an error.
    fn on_received(
        &mut self,
        key: usize,
        generation: u16,
        result: i32,
        buffer: Option<u16>,
        more: bool,
    ) {
        let Some(uring) = &mut self.ring.uring else {
            return;
        };
        let live = self.conns.contains(key) && uring.is_current(key, generation);
        let mut received = 0;
        if let Some(bid) = buffer {
            if live && result > 0 {
                let bytes = uring.buffer(bid, result as usize);
                received = bytes.len();
                self.buf.read[..received].copy_from_slice(bytes);
            }
            uring.give_back(bid);
        }
        if result == -libc::ENOBUFS {
            uring.starved();
        }
        if !live {
            return;
        }
        if received > 0 {
            uring.count_read(key);
            if let Some(conn) = self.conns.get_mut(key) {
                conn.last_seen = self.clock.now;
                // Closing: our goodbye is out; Lingering: we wait for EOF.
                // Either way the peer's remaining bytes are of no use.
                if conn.phase == Phase::Active {
                    self.on_input(key, received);
                }
            }
        } else if result == 0 {
            self.on_peer_done(key);
            return;
        } else if result < 0
            && ![libc::ENOBUFS, libc::EINTR, libc::EAGAIN, libc::ECANCELED].contains(&-result)
        {
            self.drop_conn(key);
            return;
        }
        if more {
            return;
        }
        self.receive_ended(key, generation);
    }

    /// A connection's multishot receive ended: armed again, or back to epoll.
    fn receive_ended(&mut self, key: usize, generation: u16) {
        let (Some(conn), Some(uring)) = (self.conns.get_mut(key), &mut self.ring.uring) else {
            return;
        };
        if !uring.is_current(key, generation) {
            return;
        }
        match uring.receive_ended(key) {
            // It stopped (the pool ran dry, or the kernel ended it): armed again.
            Via::Ring => uring.arm(conn.socket.as_raw_fd(), key),
            // It was cancelled for being quiet: epoll reads the socket again,
            // starting with whatever arrived since.
            Via::Epoll => {
                let interest = Interest::READABLE | Interest::WRITABLE;
                if self
                    .poll
                    .registry()
                    .reregister(&mut conn.socket, Token(key), interest)
                    .is_err()
                {
                    self.drop_conn(key);
                    return;
                }
                self.unfinished.push(key);
            }
            Via::Leaving => {}
        }
    }
}
