//! The one write path for every socket the project writes to, the server's and the
//! load generator's alike.
//!
//! Bytes go straight to the socket, gathered into as few `writev` calls as it takes;
//! only what the socket does not take is kept, in an [`OutQueue`] of shared chunks
//! (`Bytes`), so a broadcast frame waits in many queues by reference and an idle
//! connection owns no buffer at all ([`Outbound`] is one null pointer then). A
//! catch-up (a returning subscriber's replay of history) can be marked as such
//! while it waits, so the caller's queue limit counts only what comes on top of it
//! ([`Outbound::counted_bytes`]); a long catch-up can come as a [`Feed`] that
//! makes its bytes a slice at a time as the socket takes them, so a reader that
//! does not read holds one slice, not a copy of the history it asked for. This
//! module must not know what the bytes mean:
//! framing belongs to `protocol` and the transports, deciding when a queue is too
//! long to the caller.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use bytes::{Buf, Bytes};

/// Most chunks handed to one `writev`.
const MAX_IOVECS: usize = 64;

/// About how many bytes a [`Feed`] makes at a time.
pub const FEED_SLICE: usize = 64 * 1024;

/// A catch-up made as it goes out (see [`Outbound::send_catch_up`]): it holds
/// what it is made of (shared payloads) and encodes the next part only when the
/// socket has taken the last.
pub trait Feed: Send + std::fmt::Debug {
    /// Appends the next bytes to `out`, stopping once it holds `budget` or
    /// more (at a message's end, so possibly past it); `false` once nothing is
    /// left to make.
    fn fill(&mut self, out: &mut Vec<u8>, budget: usize) -> bool;

    /// About how many bytes are left to make.
    fn remaining(&self) -> usize;
}

/// Writes `chunks` in order with as few `writev` calls as the socket allows.
/// Returns how many bytes it took before it would block (all of them: the sum).
pub fn write_chunks<W: Write, B: AsRef<[u8]>>(mut socket: W, chunks: &[B]) -> io::Result<usize> {
    let mut written = 0;
    let mut first = 0;
    let mut offset = 0;
    loop {
        while first < chunks.len() && chunks[first].as_ref().len() == offset {
            first += 1;
            offset = 0;
        }
        if first == chunks.len() {
            return Ok(written);
        }
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let mut count = 0;
        for (i, (slot, chunk)) in slices.iter_mut().zip(&chunks[first..]).enumerate() {
            let chunk = chunk.as_ref();
            *slot = IoSlice::new(if i == 0 { &chunk[offset..] } else { chunk });
            count += 1;
        }
        // One chunk goes by `send`: on a socket it skips the vectored VFS path,
        // which measurably costs more per call for small answers.
        let result = if count == 1 {
            socket.write(&slices[0])
        } else {
            socket.write_vectored(&slices[..count])
        };
        match result {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(mut n) => {
                written += n;
                while n > 0 && first < chunks.len() {
                    let rest = chunks[first].as_ref().len() - offset;
                    if n >= rest {
                        n -= rest;
                        first += 1;
                        offset = 0;
                    } else {
                        offset += n;
                        n = 0;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(written),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Outbound bytes the socket would not take yet.
#[derive(Debug, Default)]
pub struct OutQueue {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    /// The front chunk is partly on the wire already.
    front_started: bool,
    /// Bytes queued ahead of the catch-up (they count).
    ahead: usize,
    /// Bytes of a catch-up still queued, right behind `ahead`: they do not count
    /// (see [`Outbound::send_catch_up`]). `ahead + catch_up <= bytes`.
    catch_up: usize,
    /// Unsent bytes (here and in the kernel) when
    /// [`Outbound::catch_up_moved`] last looked; 0: not yet.
    unsent_seen: usize,
    /// The rest of a catch-up, made a slice at a time once `chunks` runs dry.
    feed: Option<Box<dyn Feed>>,
    /// What was sent while `feed` is on: it goes out after the catch-up.
    behind: VecDeque<Bytes>,
    /// What `feed` has left counts against the queue limit (the catch-up
    /// stalled, see [`Outbound::count_catch_up`]).
    feed_counts: bool,
}

impl OutQueue {
    fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.bytes += chunk.len();
        if self.feed.is_some() {
            self.behind.push_back(chunk);
        } else {
            self.chunks.push_back(chunk);
        }
    }

    /// Whether nothing is left: no chunk, no feed.
    fn is_done(&self) -> bool {
        self.chunks.is_empty() && self.feed.is_none()
    }

    /// What the feed has left to make, counted or not.
    fn feed_remaining(&self) -> usize {
        self.feed.as_ref().map_or(0, |f| f.remaining())
    }

    /// Once `chunks` ran dry: the feed's next slice, or, once it has made its
    /// last, what was sent behind it. `false`: nothing more to write.
    fn refill(&mut self) -> bool {
        if !self.chunks.is_empty() {
            return true;
        }
        let Some(feed) = self.feed.as_mut() else {
            return false;
        };
        let mut slice = Vec::with_capacity(FEED_SLICE);
        let more = feed.fill(&mut slice, FEED_SLICE);
        if !slice.is_empty() {
            self.bytes += slice.len();
            if self.feed_counts {
                self.ahead += slice.len();
            } else {
                self.catch_up += slice.len();
            }
            self.chunks.push_back(Bytes::from(slice));
        }
        if !more {
            self.feed = None;
            self.feed_counts = false;
            self.chunks.append(&mut self.behind);
        }
        !self.chunks.is_empty()
    }

    /// Drops `n` bytes from the front: they are on the wire.
    fn consume(&mut self, mut n: usize) {
        self.bytes -= n;
        let ahead = n.min(self.ahead);
        self.ahead -= ahead;
        self.catch_up = self.catch_up.saturating_sub(n - ahead);
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            if n >= front.len() {
                n -= front.len();
                self.chunks.pop_front();
                self.front_started = false;
            } else {
                front.advance(n);
                self.front_started = true;
                n = 0;
            }
        }
    }
}

/// A connection's outbound side: nothing while everything is on the wire, a boxed
/// [`OutQueue`] while the socket is behind.
#[derive(Debug, Default)]
pub struct Outbound(Option<Box<OutQueue>>);

impl Outbound {
    /// Whether nothing waits for the socket.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Bytes waiting for the socket.
    pub fn queued_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.bytes)
    }

    /// Bytes waiting that count against a queue limit: all of them but what is
    /// left of a catch-up (see [`Outbound::send_catch_up`]).
    pub fn counted_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |q| {
            let feed = if q.feed_counts { q.feed_remaining() } else { 0 };
            q.bytes.saturating_sub(q.catch_up) + feed
        })
    }

    /// Whether part of a catch-up still waits (see [`Outbound::send_catch_up`]).
    pub fn has_catch_up(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|q| q.catch_up > 0 || (q.feed.is_some() && !q.feed_counts))
    }

    /// Whether the reader took any of what waits since the last call (true on
    /// the first, and while no catch-up waits). `kernel_unsent` is what the kernel
    /// still holds for the socket (see [`crate::os::unsent_bytes`]): progress is
    /// the two together shrinking, since a large send buffer may take a slow
    /// reader's bytes for a long while before this queue moves. The caller looks
    /// now and then and, after long enough without progress, calls
    /// [`Outbound::count_catch_up`], so that a reader that takes nothing of its
    /// replay is held to the queue limit instead of holding its replay forever.
    pub fn catch_up_moved(&mut self, kernel_unsent: usize) -> bool {
        let Some(queue) = self.0.as_mut() else {
            return true;
        };
        if queue.catch_up == 0 && (queue.feed.is_none() || queue.feed_counts) {
            queue.unsent_seen = 0;
            return true;
        }
        let unsent = queue.bytes + queue.feed_remaining() + kernel_unsent;
        let moved = queue.unsent_seen == 0 || unsent < queue.unsent_seen;
        queue.unsent_seen = unsent;
        moved
    }

    /// What is left of a catch-up stops being exempt: from now on it counts like
    /// any queued bytes.
    pub fn count_catch_up(&mut self) {
        if let Some(queue) = self.0.as_mut() {
            queue.ahead += queue.catch_up;
            queue.catch_up = 0;
            queue.unsent_seen = 0;
            queue.feed_counts = queue.feed.is_some();
        }
    }

    /// Sends `bytes` (copied only if the socket does not take them all now).
    pub fn send<W: Write>(&mut self, socket: W, bytes: &[u8]) -> io::Result<()> {
        if let Some(queue) = self.0.as_mut() {
            queue.push(Bytes::copy_from_slice(bytes));
            return Ok(());
        }
        let written = write_chunks(socket, &[bytes])?;
        if written < bytes.len() {
            self.queue_rest(&[bytes], written, |b: &&[u8]| Bytes::copy_from_slice(b));
        }
        Ok(())
    }

    /// Sends `bytes` as [`Outbound::send`] does, where the last `catch_up` of them
    /// are a catch-up: what of those the socket does not take now waits without
    /// counting in [`Outbound::counted_bytes`], until it is written. What is sent
    /// after them counts as usual. One catch-up at a time: another one replaces
    /// what is left of the last (which then counts).
    ///
    /// `feed`, if any, is the rest of the catch-up, behind `bytes`: it is made
    /// a slice at a time as the socket takes what is before it, and what is
    /// sent meanwhile waits behind it.
    pub fn send_catch_up<W: Write>(
        &mut self,
        mut socket: W,
        bytes: &[u8],
        catch_up: usize,
        feed: Option<Box<dyn Feed>>,
    ) -> io::Result<()> {
        if self.0.as_ref().is_some_and(|q| q.feed.is_some())
            && let Some(mut feed) = feed
        {
            // A catch-up behind another one still being made (not a case any
            // transport has today): this one is made whole, and waits behind.
            let mut whole = bytes.to_vec();
            while feed.fill(&mut whole, usize::MAX) {}
            let catch_up = catch_up + (whole.len() - bytes.len());
            return self.send_catch_up(socket, &whole, catch_up, None);
        }
        let before = self.queued_bytes();
        self.send(&mut socket, bytes)?;
        if let Some(queue) = self.0.as_mut() {
            // What of `bytes` waits is their tail, at the back of the queue.
            let waiting = (queue.bytes - before).min(catch_up);
            queue.ahead = queue.bytes - waiting;
            queue.catch_up = waiting;
        }
        if let Some(feed) = feed {
            let queue = self.0.get_or_insert_with(Box::default);
            queue.feed = Some(feed);
            queue.feed_counts = false;
            self.flush(socket)?;
        }
        Ok(())
    }

    /// Sends shared chunks (a broadcast) in order: straight to the socket when nothing
    /// waits; whatever the socket does not take is queued by reference, so fan-out
    /// copies no payload per subscriber.
    pub fn send_shared<W: Write>(&mut self, socket: W, chunks: &[&Bytes]) -> io::Result<()> {
        if let Some(queue) = self.0.as_mut() {
            for chunk in chunks {
                queue.push(Bytes::clone(chunk));
            }
            return Ok(());
        }
        let written = write_chunks(socket, chunks)?;
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        if written < total {
            self.queue_rest(chunks, written, |c: &&Bytes| Bytes::clone(c));
        }
        Ok(())
    }

    /// After `chunks` were offered to the socket elsewhere (a batched send,
    /// while nothing waited here) and it took `written` bytes of them: queues the
    /// rest by reference, as [`Outbound::send_shared`] would have.
    pub fn sent_elsewhere(&mut self, chunks: &[&Bytes], written: usize) {
        debug_assert!(self.is_empty(), "a batched send while bytes wait here");
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        if written < total {
            self.queue_rest(chunks, written, |c: &&Bytes| Bytes::clone(c));
        }
    }

    /// Queues `chunk` without trying the socket (a reply held until the
    /// loop's turn ends, to be written with others in one system call): the
    /// caller must offer the queue's front to the socket before it waits again
    /// (see [`Outbound::sent_front`]). Only while nothing waits.
    pub fn hold(&mut self, chunk: Bytes) {
        debug_assert!(self.is_empty(), "a held reply behind queued bytes");
        let mut queue = OutQueue::default();
        queue.push(chunk);
        self.0 = Some(Box::new(queue));
    }

    /// The first chunk waiting, to be offered to the socket elsewhere.
    pub fn front(&self) -> Option<&Bytes> {
        self.0.as_ref()?.chunks.front()
    }

    /// The front chunk was offered to the socket elsewhere and it took
    /// `written` bytes of it: drops them. What is left of that chunk is copied
    /// out, so that a slow reader's queue does not keep the buffer it shared (a
    /// turn's reply arena) alive.
    pub fn sent_front(&mut self, written: usize) {
        let Some(queue) = self.0.as_mut() else {
            return;
        };
        let offered = queue.chunks.front().map_or(0, Bytes::len);
        queue.consume(written.min(offered));
        if queue.is_done() {
            self.0 = None;
        } else if written < offered
            && let Some(front) = queue.chunks.front_mut()
        {
            *front = Bytes::copy_from_slice(front);
        }
    }

    /// Queues what is left of `chunks` after the first `written` bytes.
    fn queue_rest<B: AsRef<[u8]>>(
        &mut self,
        chunks: &[B],
        mut written: usize,
        to_bytes: impl Fn(&B) -> Bytes,
    ) {
        let mut queue = OutQueue::default();
        for chunk in chunks {
            let len = chunk.as_ref().len();
            if written >= len {
                written -= len;
                continue;
            }
            let bytes = to_bytes(chunk);
            if written > 0 {
                queue.front_started = true;
                queue.push(bytes.slice(written..));
            } else {
                queue.push(bytes);
            }
            written = 0;
        }
        self.0 = Some(Box::new(queue));
    }

    /// Writes what waits, as far as the socket takes it. `Ok(true)`: nothing is left
    /// and the queue is gone.
    pub fn flush<W: Write>(&mut self, mut socket: W) -> io::Result<bool> {
        let Some(queue) = self.0.as_mut() else {
            return Ok(true);
        };
        while queue.refill() {
            let mut batch: [&[u8]; MAX_IOVECS] = [&[]; MAX_IOVECS];
            let mut count = 0;
            for (slot, chunk) in batch.iter_mut().zip(&queue.chunks) {
                *slot = chunk;
                count += 1;
            }
            let offered: usize = batch[..count].iter().map(|c| c.len()).sum();
            let written = write_chunks(&mut socket, &batch[..count])?;
            queue.consume(written);
            if written < offered {
                return Ok(false);
            }
        }
        self.0 = None;
        Ok(true)
    }

    /// Drops everything not yet started, keeping the front chunk if it is partly
    /// written (cutting a frame in half would corrupt the stream).
    pub fn truncate_unstarted(&mut self) {
        let Some(queue) = self.0.as_mut() else {
            return;
        };
        let keep = usize::from(queue.front_started).min(queue.chunks.len());
        queue.chunks.truncate(keep);
        queue.bytes = queue.chunks.iter().map(Bytes::len).sum();
        queue.ahead = 0;
        queue.catch_up = 0;
        queue.unsent_seen = 0;
        queue.feed = None;
        queue.feed_counts = false;
        queue.behind.clear();
        if queue.chunks.is_empty() {
            self.0 = None;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A socket that takes at most `room` bytes, then would block.
    pub(crate) struct Tight {
        pub(crate) taken: Vec<u8>,
        pub(crate) room: usize,
    }

    impl Write for Tight {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.room);
            self.taken.extend_from_slice(&buf[..n]);
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    pub(crate) fn tight(room: usize) -> Tight {
        Tight {
            taken: Vec::new(),
            room,
        }
    }

    #[test]
    fn what_the_socket_takes_is_never_queued() {
        let mut out = Outbound::default();
        let mut socket = tight(100);
        out.send(&mut socket, b"hello").unwrap();
        assert!(out.is_empty());
        assert_eq!(socket.taken, b"hello");
    }

    #[test]
    fn the_rest_is_queued_in_order_and_flushed_later() {
        let mut out = Outbound::default();
        let mut socket = tight(3);
        let a = Bytes::from_static(b"abcde");
        let b = Bytes::from_static(b"fg");
        out.send_shared(&mut socket, &[&a, &b]).unwrap();
        assert_eq!(out.queued_bytes(), 4);
        out.send(&mut socket, b"hi").unwrap();
        assert_eq!(out.queued_bytes(), 6);
        socket.room = 2;
        assert!(!out.flush(&mut socket).unwrap());
        socket.room = 100;
        assert!(out.flush(&mut socket).unwrap());
        assert!(out.is_empty());
        assert_eq!(socket.taken, b"abcdefghi");
    }

    #[test]
    fn truncate_keeps_a_started_front_chunk() {
        let mut out = Outbound::default();
        let mut socket = tight(1);
        let a = Bytes::from_static(b"abc");
        let b = Bytes::from_static(b"defg");
        out.send_shared(&mut socket, &[&a, &b]).unwrap();
        assert_eq!(out.queued_bytes(), 6);
        out.truncate_unstarted();
        assert_eq!(out.queued_bytes(), 2);
        socket.room = 2;
        assert!(out.flush(&mut socket).unwrap());
        assert_eq!(socket.taken, b"abc");
        out.send(tight(0), b"xyz").unwrap();
        out.truncate_unstarted();
        assert!(out.is_empty());
    }

    #[test]
    fn a_catch_up_that_stalls_starts_counting_when_told() {
        let mut out = Outbound::default();
        out.send_catch_up(tight(0), b"CATCHUP", 7, None).unwrap();
        assert_eq!(out.counted_bytes(), 0);
        // First look: it is new. Some of it goes out before the second look.
        assert!(out.catch_up_moved(100));
        let mut socket = tight(3);
        out.flush(&mut socket).unwrap();
        assert!(out.catch_up_moved(100));
        // The queue did not move, but the kernel passed bytes on: progress.
        assert!(out.catch_up_moved(40));
        assert_eq!(out.counted_bytes(), 0);
        // Nothing more taken anywhere since: a stall.
        assert!(!out.catch_up_moved(40));
        assert_eq!(out.counted_bytes(), 0);
        out.count_catch_up();
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (4, 4));
        assert!(!out.has_catch_up() && out.catch_up_moved(40));
    }

    #[test]
    fn a_catch_up_waits_without_counting_until_it_is_written() {
        let mut out = Outbound::default();
        let mut socket = tight(2);
        // Two bytes of head go out; the rest of the head and the catch-up wait.
        out.send_catch_up(&mut socket, b"headCATCHUP", 7, None)
            .unwrap();
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (9, 2));
        // Live bytes on top of it count.
        let live = Bytes::from_static(b"live");
        out.send_shared(&mut socket, &[&live]).unwrap();
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (13, 6));
        // The head goes first, then the catch-up: it stops being allowed as it goes.
        socket.room = 1;
        assert!(!out.flush(&mut socket).unwrap());
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (12, 5));
        socket.room = 4;
        assert!(!out.flush(&mut socket).unwrap());
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (8, 4));
        socket.room = 5;
        assert!(!out.flush(&mut socket).unwrap());
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (3, 3));
        socket.room = 100;
        assert!(out.flush(&mut socket).unwrap());
        assert_eq!(socket.taken, b"headCATCHUPlive");
        assert_eq!(out.counted_bytes(), 0);
    }

    #[test]
    fn a_catch_up_behind_a_queue_counts_only_from_its_own_bytes() {
        let mut out = Outbound::default();
        out.send(tight(0), b"waiting").unwrap();
        // Wholly queued behind seven bytes that count: none of it counts.
        out.send_catch_up(tight(0), b"oldnew", 6, None).unwrap();
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (13, 7));
        let mut socket = tight(9);
        assert!(!out.flush(&mut socket).unwrap());
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (4, 0));
        // Cutting a slow consumer's queue leaves nothing allowed.
        out.send(tight(0), b"more").unwrap();
        out.truncate_unstarted();
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (4, 4));
    }

    /// A feed of `count` numbered parts of `size` bytes each.
    #[derive(Debug)]
    struct Parts {
        next: u8,
        count: u8,
        size: usize,
    }

    impl Feed for Parts {
        fn fill(&mut self, out: &mut Vec<u8>, budget: usize) -> bool {
            let start = out.len();
            while self.next < self.count && out.len() - start < budget {
                out.extend(std::iter::repeat_n(b'a' + self.next, self.size));
                self.next += 1;
            }
            self.next < self.count
        }

        fn remaining(&self) -> usize {
            usize::from(self.count - self.next) * self.size
        }
    }

    #[test]
    fn a_fed_catch_up_is_made_as_the_socket_takes_it_and_live_bytes_wait_behind_it() {
        let mut out = Outbound::default();
        let size = FEED_SLICE / 2 + 1;
        let feed = Parts {
            next: 0,
            count: 5,
            size,
        };
        let mut socket = tight(3);
        out.send_catch_up(&mut socket, b"head", 0, Some(Box::new(feed)))
            .unwrap();
        // Three bytes went; one of head waits, and nothing of the feed is
        // made until it has gone.
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (1, 1));
        assert!(out.has_catch_up());
        out.send(&mut socket, b"live").unwrap();
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (5, 5));
        // The head goes: one slice (two parts) is made, the rest waits unmade.
        socket.room = 1;
        assert!(!out.flush(&mut socket).unwrap());
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (4 + 2 * size, 4));
        socket.room = usize::MAX;
        assert!(out.flush(&mut socket).unwrap());
        let mut expected = b"head".to_vec();
        for part in 0..5u8 {
            expected.extend(std::iter::repeat_n(b'a' + part, size));
        }
        expected.extend(b"live");
        assert_eq!(socket.taken, expected);
        assert!(out.is_empty());
    }

    #[test]
    fn a_stalled_feed_counts_what_it_has_left() {
        let mut out = Outbound::default();
        let feed = Parts {
            next: 0,
            count: 10,
            size: FEED_SLICE,
        };
        out.send_catch_up(tight(0), b"", 0, Some(Box::new(feed)))
            .unwrap();
        // One slice made, nine left, none of it counted.
        assert_eq!((out.queued_bytes(), out.counted_bytes()), (FEED_SLICE, 0));
        assert!(out.catch_up_moved(0));
        assert!(!out.catch_up_moved(0));
        out.count_catch_up();
        assert_eq!(out.counted_bytes(), 10 * FEED_SLICE);
        assert!(!out.has_catch_up());
        out.truncate_unstarted();
        assert!(out.is_empty());
    }
}
