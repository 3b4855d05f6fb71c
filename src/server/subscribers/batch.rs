//! A fan-out's batched sends: the subscribers of one slice that take the same
//! frames, gathered until a [`SendRing`] writes to all of them with one system
//! call, then what each socket did not take queued as a `send` would have.
//!
//! Only a subscriber with nothing waiting in its queue, no TLS and no filter of
//! its own joins a batch: the frames are shared and go out as they are. It must
//! not decide who gets what (the fan-out does) nor keep anything between fan-outs:
//! a batch is written before its fan-out slice returns.

use std::os::fd::RawFd;

use bytes::Bytes;
use slab::Slab;

use super::Follow;
use crate::server::conn::Conn;
use crate::server::send_ring::{NOT_SENT, SendRing};
use crate::stats::TurnCounts;

/// The loop's send ring (if it has one) and the batch being gathered.
#[derive(Debug, Default)]
pub(super) struct Batch {
    ring: Option<SendRing>,
    keys: Vec<u32>,
    fds: Vec<RawFd>,
    results: Vec<i32>,
    /// The frames' place among the fan-out's formats (see `gathered_slot`).
    pub(super) slot: usize,
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
        let lone = self.keys.len() == 1;
        match (&mut self.ring, lone) {
            // One socket: a `send` costs what one ring entry does.
            (Some(_), true) | (None, _) => self.results.clear(),
            (Some(ring), false) => {
                if let Err(e) = ring.send_to_all(&self.fds, frames, &mut self.results) {
                    tracing::warn!(error = %e, "the send ring failed: this loop sends with send(2) from now on");
                    self.ring = None;
                }
            }
        }
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
}
