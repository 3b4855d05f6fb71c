//! A loop's io_uring: a multishot receive per busy connection into a ring of
//! buffers the loop provides, and a multishot poll of the loop's epoll descriptor,
//! so one wait covers received bytes and every other event (writability, listeners,
//! the waker, the quiet connections' reads). Reads that come this way skip epoll's
//! readiness walk and one `recv` system call per message (docs/BENCHMARKS.md §15).
//!
//! A connection starts out read through epoll. Once it has sent [`BUSY_READS`]
//! reads in one [`Uring::sweep`] period its receive moves to the ring; a period
//! with fewer than [`QUIET_READS`] moves it back. So a connection that mostly waits
//! (a subscriber, a held event stream) never holds an armed receive (360 B of
//! kernel memory) nor a share of the pool, and its handshake costs what it costs
//! with epoll (§16).
//!
//! A loop that handled [`COALESCE_FROM`] events (completions and epoll events) in
//! the last [`COALESCE_WINDOW`] waits for a batch: up to [`COALESCE_WAIT_US`] for
//! [`COALESCE_WANT`] completions before it wakes for fewer. Each sleep and wake-up costs the loop a few µs of CPU (a
//! guest's vCPU halts), and a busy loop slept once per few messages; waiting a
//! little for more cuts the sleeps (§17). A loop below that rate wakes for each
//! completion, so a lone message never waits.
//!
//! Owns the ring, the buffers, the submissions not made yet and, per connection
//! key, its generation and which way it reads. It knows nothing of sessions or
//! wire formats: a completion carries the key and the generation, and the event
//! loop decides what it means.
//!
//! This folder is the loop's io_uring whole: the receive ring here, the send
//! ring in [`send_ring`]; how the event loop waits through them and moves
//! connections between epoll and the ring is `event_loop/ring.rs`.

pub mod send_ring;

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use io_uring::types::{BufRingEntry, SubmitArgs, Timespec};
use io_uring::{IoUring, Probe, cqueue, opcode, squeue, types};

use crate::timing::COALESCE_WINDOW;

/// Bytes per provided buffer: a larger message arrives in several completions.
const BUF_SIZE: usize = 2048;
/// Buffers given to the kernel when the first receive is armed (128 KiB, touched
/// at once so the pool counts at its size from then on, not per connection); it
/// doubles whenever receives find it empty.
const BUFS_AT_START: u16 = 64;
/// Reads in one sweep period that move a connection's receive to the ring.
pub const BUSY_READS: u8 = 8;
/// Fewer receives than this in a sweep period move it back to epoll.
pub const QUIET_READS: u8 = 2;
/// The most buffers the pool grows to when receives find it empty (2 MiB).
const BUFS_MAX: u16 = 1024;
const BUF_GROUP: u16 = 0;
/// Events in one [`COALESCE_WINDOW`] (`timing`) from which the loop waits for batches
/// (20,000 a second): short, so a burst of handshakes gets there too.
pub const COALESCE_FROM: u32 = 200;
/// How long a coalescing loop waits for [`COALESCE_WANT`] completions before it
/// takes what has come (at least one; with none it waits on as usual).
pub const COALESCE_WAIT_US: u32 = 200;
pub const COALESCE_WANT: usize = 64;
/// Entries in the submission queue; completions get twice as many.
const RING_ENTRIES: u32 = 4096;
/// The epoll descriptor's poll; connection keys stay below it.
const EPOLL: u64 = u64::MAX;

/// What one completion says.
#[derive(Debug, Clone, Copy)]
pub enum Completion {
    /// The loop's epoll descriptor has events: poll it without waiting.
    Epoll,
    /// A receive for the connection `key` of generation `generation`.
    Received {
        key: usize,
        generation: u16,
        /// Bytes received (in `buffer`), 0 at the peer's end, or a negative errno.
        result: i32,
        buffer: Option<u16>,
        /// The receive stays armed; otherwise it must be armed again if wanted.
        more: bool,
    },
    /// Anything else (a cancellation's own answer).
    Other,
}

/// Which way a connection's bytes reach the loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Via {
    /// Epoll says the socket is readable and the loop reads it.
    #[default]
    Epoll,
    /// A multishot receive is armed in the ring.
    Ring,
    /// The ring's receive is being cancelled; its last completion moves the
    /// connection back to epoll (not sooner: bytes would be read out of order).
    Leaving,
}

/// One connection key's receive bookkeeping: 4 bytes per slab slot. A 16-bit
/// generation is plenty: a completion is stale for a turn or two, not for
/// 65,536 reuses of its key.
#[derive(Debug, Clone, Copy, Default)]
struct Receiver {
    generation: u16,
    reads: u8,
    via: Via,
}

pub struct Uring {
    ring: IoUring,
    epoll_fd: RawFd,
    /// The buffer ring's entries, shared with the kernel (page-aligned mapping).
    entries: *mut BufRingEntry,
    /// The buffers themselves: BUFS_MAX × BUF_SIZE, of which `given` are in use.
    memory: Vec<u8>,
    given: u16,
    tail: u16,
    /// The pool ran dry since the last turn: grow it before arming again.
    starved: bool,
    pending: Vec<squeue::Entry>,
    epoll_armed: bool,
    /// Per connection key; a completion of a connection that is gone (its key
    /// maybe reused) is recognised by its generation and dropped.
    receivers: Vec<Receiver>,
    /// Connections whose receive is in the ring (`Ring` or `Leaving`).
    armed: u64,
    /// The kernel can wait for a batch (`IORING_FEAT_MIN_TIMEOUT`, Linux 6.12+).
    can_coalesce: bool,
    /// Events in the window that began at `window_start`, and whether waits now
    /// ask for a batch.
    events: u32,
    window_start: Instant,
    coalesce: bool,
}

// SAFETY: the raw pointer is to a private mapping owned by this value; the loop
// that owns a `Uring` is the only thread that touches it.
unsafe impl Send for Uring {}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("buffers", &self.given)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        // The ring goes first (its fields drop after this), so the kernel no
        // longer reads the entries when they are unmapped.
        let bytes = BUFS_MAX as usize * std::mem::size_of::<BufRingEntry>();
        let _ = self.ring.submitter().unregister_buf_ring(BUF_GROUP);
        // SAFETY: the mapping made in `new`, unregistered above.
        unsafe { libc::munmap(self.entries.cast(), bytes) };
    }
}

fn read(cqe: &cqueue::Entry) -> Completion {
    let data = cqe.user_data();
    if data == EPOLL {
        return Completion::Epoll;
    }
    if data & (1 << 31) != 0 {
        return Completion::Other;
    }
    Completion::Received {
        key: (data & 0x7fff_ffff) as usize,
        generation: (data >> 32) as u16,
        result: cqe.result(),
        buffer: cqueue::buffer_select(cqe.flags()),
        more: cqueue::more(cqe.flags()),
    }
}

fn user_data(key: usize, generation: u16) -> u64 {
    ((generation as u64) << 32) | key as u64
}

impl Uring {
    /// A ring for the calling thread (it must be the only one to use it), or why
    /// this kernel cannot give one: the loop then reads through epoll alone.
    pub fn new(epoll_fd: RawFd) -> io::Result<Uring> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            // Completion work runs in our own wait, not by interrupting the thread
            // as data lands: without it this costs more than epoll (§15).
            .setup_defer_taskrun()
            .setup_cqsize(RING_ENTRIES * 2)
            .build(RING_ENTRIES)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for code in [
            opcode::RecvMulti::CODE,
            opcode::PollAdd::CODE,
            opcode::AsyncCancel::CODE,
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("io_uring opcode {code} not supported"),
                ));
            }
        }
        let bytes = BUFS_MAX as usize * std::mem::size_of::<BufRingEntry>();
        // SAFETY: an anonymous private mapping, page-aligned as the kernel needs.
        let entries = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if entries == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping outlives the registration (unregistered in Drop).
        if let Err(e) = unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(entries as u64, BUFS_MAX, BUF_GROUP, 0)
        } {
            // SAFETY: the mapping just made, never registered.
            unsafe { libc::munmap(entries, bytes) };
            return Err(e);
        }
        let can_coalesce = ring.params().is_feature_min_timeout();
        let uring = Uring {
            ring,
            epoll_fd,
            entries: entries.cast(),
            // Zeroed memory is mapped lazily: only the buffers given are touched.
            memory: vec![0u8; BUFS_MAX as usize * BUF_SIZE],
            given: 0,
            tail: 0,
            starved: false,
            pending: Vec::with_capacity(64),
            epoll_armed: false,
            receivers: Vec::new(),
            armed: 0,
            can_coalesce,
            events: 0,
            window_start: Instant::now(),
            coalesce: false,
        };
        Ok(uring)
    }

    /// Gives the kernel `more` buffers it has not had yet.
    fn grow(&mut self, more: u16) {
        let from = self.given;
        let to = from.saturating_add(more).min(BUFS_MAX);
        for bid in from..to {
            let start = bid as usize * BUF_SIZE;
            // Touched now, so the pool counts once, at its size, from here on.
            self.memory[start..start + BUF_SIZE].fill(1);
            self.put(bid);
        }
        self.given = to;
        self.publish_tail();
    }

    fn put(&mut self, bid: u16) {
        let slot = (self.tail & (BUFS_MAX - 1)) as usize;
        // SAFETY: slot < BUFS_MAX, inside the mapping; the kernel reads an entry
        // only once the tail published after it says so.
        unsafe {
            let entry = &mut *self.entries.add(slot);
            entry.set_addr(self.memory.as_ptr().add(bid as usize * BUF_SIZE) as u64);
            entry.set_len(BUF_SIZE as u32);
            entry.set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish_tail(&self) {
        // SAFETY: the tail is the first entry's last u16, 2-byte aligned, and the
        // kernel reads it with acquire semantics.
        unsafe {
            let tail = BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    /// The bytes a completion received.
    pub fn buffer(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * BUF_SIZE;
        &self.memory[start..start + len.min(BUF_SIZE)]
    }

    /// Hands a buffer back once its bytes have been used.
    pub fn give_back(&mut self, bid: u16) {
        if bid < self.given {
            self.put(bid);
            self.publish_tail();
        }
    }

    /// The pool was empty when a receive completed (`ENOBUFS`).
    pub fn starved(&mut self) {
        self.starved = true;
    }

    /// A new connection took `key`: it reads through epoll until it is busy.
    pub fn opened(&mut self, key: usize) {
        if self.receivers.len() <= key {
            self.receivers.resize(key + 1, Receiver::default());
        }
        let r = &mut self.receivers[key];
        *r = Receiver {
            generation: r.generation.wrapping_add(1),
            reads: 0,
            via: Via::Epoll,
        };
    }

    /// Which way `key`'s bytes come.
    pub fn via(&self, key: usize) -> Via {
        self.receivers.get(key).map_or(Via::Epoll, |r| r.via)
    }

    /// Counts one read (or received completion) of `key`.
    pub fn count_read(&mut self, key: usize) {
        if let Some(r) = self.receivers.get_mut(key) {
            r.reads = r.reads.saturating_add(1);
        }
    }

    /// Whether `key` reads through epoll and has become busy enough for the ring.
    pub fn is_busy(&self, key: usize) -> bool {
        self.receivers
            .get(key)
            .is_some_and(|r| r.via == Via::Epoll && r.reads >= BUSY_READS)
    }

    /// Whether a completion is of `key`'s current connection and receive.
    pub fn is_current(&self, key: usize, generation: u16) -> bool {
        self.receivers
            .get(key)
            .is_some_and(|r| r.generation == generation && r.via != Via::Epoll)
    }

    /// Receives `key`'s bytes (on `fd`) through the ring from now on, or again
    /// after its receive stopped.
    pub fn arm(&mut self, fd: RawFd, key: usize) {
        let Some(r) = self.receivers.get_mut(key) else {
            return;
        };
        if r.via == Via::Epoll {
            self.armed += 1;
        }
        r.via = Via::Ring;
        let generation = r.generation;
        if self.given == 0 || self.starved {
            // Made at the first receive, doubled when receives found it empty.
            self.starved = false;
            self.grow(self.given.max(BUFS_AT_START));
        }
        self.pending.push(
            opcode::RecvMulti::new(types::Fd(fd), BUF_GROUP)
                .build()
                .user_data(user_data(key, generation)),
        );
    }

    /// `key`'s receive ended (its completion had no "more"): `Ring` if it is to
    /// be armed again, `Epoll` if it was leaving and now reads through epoll.
    pub fn receive_ended(&mut self, key: usize) -> Via {
        let Some(r) = self.receivers.get_mut(key) else {
            return Via::Epoll;
        };
        if r.via == Via::Leaving {
            r.via = Via::Epoll;
            r.reads = 0;
            self.armed -= 1;
        }
        r.via
    }

    /// `key`'s connection is gone: true if it had a receive in the ring (now
    /// cancelled, its last completions stale).
    pub fn closed(&mut self, key: usize) -> bool {
        let Some(r) = self.receivers.get_mut(key) else {
            return false;
        };
        let was_armed = r.via != Via::Epoll;
        if was_armed {
            r.via = Via::Epoll;
            self.armed -= 1;
            let data = user_data(key, r.generation);
            self.cancel(data);
        }
        was_armed
    }

    /// Once per period: receives that were quiet in it go back to epoll, and
    /// every count starts again.
    pub fn sweep(&mut self) {
        for key in 0..self.receivers.len() {
            let r = &mut self.receivers[key];
            let quiet = r.via == Via::Ring && r.reads < QUIET_READS;
            r.reads = 0;
            if quiet {
                r.via = Via::Leaving;
                let data = user_data(key, r.generation);
                self.cancel(data);
            }
        }
    }

    /// Counts `n` events the loop took from epoll (completions count themselves).
    pub fn count_events(&mut self, n: usize) {
        self.events = self.events.saturating_add(n as u32);
    }

    /// At the end of each window: waits ask for batches while the loop is busy.
    fn reconsider(&mut self, now: Instant) {
        if now.duration_since(self.window_start) >= COALESCE_WINDOW {
            self.coalesce = self.can_coalesce && self.events >= COALESCE_FROM;
            self.events = 0;
            self.window_start = now;
        }
    }

    /// Connections whose receive is in the ring now.
    pub fn armed(&self) -> u64 {
        self.armed
    }

    fn cancel(&mut self, data: u64) {
        self.pending.push(
            opcode::AsyncCancel::new(data)
                .build()
                .user_data(data | 1 << 31),
        );
    }

    /// Submits what is pending and waits up to `timeout` (none: do not wait) for
    /// completions, which go to `out`.
    pub fn wait(&mut self, timeout: Option<Duration>, out: &mut Vec<Completion>) -> io::Result<()> {
        if !self.epoll_armed {
            self.epoll_armed = true;
            self.pending.push(
                opcode::PollAdd::new(types::Fd(self.epoll_fd), libc::POLLIN as u32)
                    .multi(true)
                    .build()
                    .user_data(EPOLL),
            );
        }
        self.push_pending()?;
        let result = match timeout {
            Some(t) if !t.is_zero() => {
                self.reconsider(Instant::now());
                let ts = Timespec::new().sec(t.as_secs()).nsec(t.subsec_nanos());
                let (want, min_wait) = if self.coalesce {
                    (COALESCE_WANT, COALESCE_WAIT_US)
                } else {
                    (1, 0)
                };
                let args = SubmitArgs::new().timespec(&ts).min_wait_usec(min_wait);
                self.ring.submitter().submit_with_args(want, &args)
            }
            // Deferred completion work runs only in an enter that asks for events.
            // SAFETY: no argument is passed.
            _ => unsafe {
                let queued = self.ring.submission().len() as u32;
                self.ring.submitter().enter::<libc::sigset_t>(
                    queued,
                    0,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            },
        };
        match result {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) => {}
            Err(e) => return Err(e),
        }
        let mut epoll_ended = false;
        let before = out.len();
        for cqe in self.ring.completion() {
            if cqe.user_data() == EPOLL && !cqueue::more(cqe.flags()) {
                epoll_ended = true;
            }
            out.push(read(&cqe));
        }
        self.events = self.events.saturating_add((out.len() - before) as u32);
        if epoll_ended {
            self.epoll_armed = false;
        }
        Ok(())
    }

    /// Moves pending submissions into the queue, submitting early if it is full.
    fn push_pending(&mut self) -> io::Result<()> {
        let mut at = 0;
        while at < self.pending.len() {
            let pushed = {
                let mut sq = self.ring.submission();
                let mut n = 0;
                for entry in &self.pending[at..] {
                    // SAFETY: no entry names memory of ours but the buffer ring,
                    // which lives as long as the ring.
                    if unsafe { sq.push(entry) }.is_err() {
                        break;
                    }
                    n += 1;
                }
                n
            };
            at += pushed;
            if at < self.pending.len() {
                self.ring.submit()?;
            }
        }
        self.pending.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    /// A ring on a fresh epoll descriptor; panics where the kernel refuses
    /// io_uring. The tests that need one are ignored by a plain `cargo test`
    /// (where there is no ring they cannot run, and must not pass):
    /// tests/python/test_io_uring.py runs them (`-- --ignored`) where it can.
    fn ring() -> (Uring, RawFd) {
        // SAFETY: plain system call; the descriptor is closed by the test.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(epoll >= 0);
        match Uring::new(epoll) {
            Ok(uring) => (uring, epoll),
            Err(e) => {
                // SAFETY: ours, unused from here.
                unsafe { libc::close(epoll) };
                panic!("io_uring unavailable here ({e}): this test needs io_uring");
            }
        }
    }

    fn received(out: &[Completion]) -> Vec<(usize, i32, bool)> {
        out.iter()
            .filter_map(|c| match *c {
                Completion::Received {
                    key, result, more, ..
                } => Some((key, result, more)),
                _ => None,
            })
            .collect()
    }

    #[test]
    #[ignore = "needs io_uring: run by scripts/test.sh"]
    fn a_connection_moves_to_the_ring_when_busy_and_back_when_quiet() {
        let (mut uring, epoll) = ring();
        let (mut peer, ours) = UnixStream::pair().unwrap();
        uring.opened(3);
        assert_eq!(uring.via(3), Via::Epoll);
        let busy: Vec<bool> = (0..BUSY_READS)
            .map(|_| {
                uring.count_read(3);
                uring.is_busy(3)
            })
            .collect();
        assert_eq!(busy.iter().filter(|&&b| b).count(), 1, "{busy:?}");
        assert!(busy[BUSY_READS as usize - 1]);
        assert_eq!(uring.given, 0, "no pool before the first receive");

        uring.arm(ours.as_raw_fd(), 3);
        assert_eq!((uring.via(3), uring.armed()), (Via::Ring, 1));
        assert_eq!(uring.given, BUFS_AT_START);
        peer.write_all(b"hello").unwrap();
        let mut out = Vec::new();
        uring.wait(Some(Duration::from_secs(5)), &mut out).unwrap();
        assert_eq!(received(&out), [(3, 5, true)]);
        let generation = uring.receivers[3].generation;
        assert!(uring.is_current(3, generation));
        assert!(!uring.is_current(3, generation.wrapping_add(1)));
        if let Some(Completion::Received {
            buffer: Some(bid), ..
        }) = out
            .iter()
            .find(|c| matches!(c, Completion::Received { .. }))
        {
            assert_eq!(uring.buffer(*bid, 5), b"hello");
            uring.give_back(*bid);
        }

        // The period it became busy in is not quiet; the next one, with fewer
        // than QUIET_READS, is: the receive is cancelled, and its last
        // completion hands the socket back to epoll.
        uring.sweep();
        assert_eq!(uring.via(3), Via::Ring);
        uring.count_read(3);
        uring.sweep();
        assert_eq!(uring.via(3), Via::Leaving);
        out.clear();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !received(&out).iter().any(|&(_, _, more)| !more) && Instant::now() < deadline {
            uring
                .wait(Some(Duration::from_millis(100)), &mut out)
                .unwrap();
        }
        let last = received(&out);
        assert_eq!(last.last().map(|r| (r.0, r.2)), Some((3, false)), "{out:?}");
        assert_eq!(uring.receive_ended(3), Via::Epoll);
        assert_eq!(uring.armed(), 0);
        assert!(!uring.is_current(3, generation), "epoll reads it now");

        // A key reused by a new connection starts over, on epoll.
        uring.opened(3);
        assert_ne!(uring.receivers[3].generation, generation);
        assert!(!uring.closed(3), "nothing armed to cancel");
        // SAFETY: ours, unused from here.
        unsafe { libc::close(epoll) };
    }

    #[test]
    #[ignore = "needs io_uring: run by scripts/test.sh"]
    fn a_busy_loop_waits_for_a_batch_but_takes_a_lone_completion() {
        let (mut uring, epoll) = ring();
        let (mut peer, ours) = UnixStream::pair().unwrap();
        let start = uring.window_start;
        uring.count_events(COALESCE_FROM as usize - 1);
        uring.reconsider(start + COALESCE_WINDOW / 2);
        assert!(!uring.coalesce, "the window is not over");
        uring.reconsider(start + COALESCE_WINDOW);
        assert!(!uring.coalesce, "below the rate: every wait wakes for one");
        uring.count_events(COALESCE_FROM as usize);
        uring.reconsider(start + COALESCE_WINDOW * 2);
        assert_eq!(uring.coalesce, uring.can_coalesce);
        assert_eq!(uring.events, 0);
        // The wait below reconsiders with the clock: give it a busy window.
        uring.window_start = Instant::now();
        uring.count_events(COALESCE_FROM as usize);
        uring.opened(0);
        uring.arm(ours.as_raw_fd(), 0);

        // One byte, far fewer than a batch: the wait takes it once the batch's
        // wait is over, not at its own 60 s timeout (half of that allowed, for
        // a slow shared machine).
        peer.write_all(b"x").unwrap();
        let mut out = Vec::new();
        let began = Instant::now();
        uring.wait(Some(Duration::from_secs(60)), &mut out).unwrap();
        assert_eq!(received(&out), [(0, 1, true)]);
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{:?}",
            began.elapsed()
        );
        assert!(uring.closed(0));
        assert_eq!(uring.armed(), 0);
        // SAFETY: ours, unused from here.
        unsafe { libc::close(epoll) };
    }
}
