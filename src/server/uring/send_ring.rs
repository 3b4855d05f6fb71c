//! A loop's batched sends: one shared set of frames written to many sockets with
//! one `io_uring_enter` for a whole batch, instead of one `send` system call per
//! subscriber.
//!
//! Each socket gets one `IORING_OP_SEND` (one frame) or `IORING_OP_SENDMSG` (a
//! run of frames, gathered) pointing at the same shared bytes: nothing is copied
//! per subscriber. The sockets are non-blocking, so every send is tried at once
//! in the kernel and completes in the same `io_uring_enter` (a full socket
//! answers `EAGAIN`, as `send` would); the batch is over when the call returns,
//! and no submission outlives it. The caller queues what a socket did not take,
//! exactly as after a `send`.
//!
//! Owns its own small ring (not the receive ring, whose completions must not mix
//! with these), made once per loop: a connection holds nothing here, sending or
//! not. It knows file descriptors and bytes only, not connections or formats.

use std::io;
use std::os::fd::RawFd;

use bytes::Bytes;
use io_uring::{IoUring, opcode, types};

/// Sends per `io_uring_enter`: the ring's submission queue.
pub const BATCH: usize = 256;
/// The largest batch a ring may be made for (to measure against `BATCH`).
const MAX_BATCH: usize = 1024;
/// Frames one gathered send carries at most (as `writev` does in `outbound`).
const MAX_FRAMES: usize = 64;

/// A send whose outcome the ring did not report (it failed itself).
pub const UNKNOWN: i32 = i32::MIN;
/// A send the ring never made (it failed before submitting): send it otherwise.
pub const NOT_SENT: i32 = i32::MIN + 1;

/// Which operation a batch of one frame uses (`SENDMSG` always, to compare).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// `IORING_OP_SEND` for one frame, `SENDMSG` for several.
    Send,
    /// `IORING_OP_SENDMSG` always.
    SendMsg,
}

pub struct SendRing {
    ring: IoUring,
    op: SendOp,
    batch: usize,
    /// Sends attempted and system calls made, for the loop's counters.
    pub sends: u64,
    pub enters: u64,
}

impl std::fmt::Debug for SendRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRing")
            .field("op", &self.op)
            .field("batch", &self.batch)
            .finish()
    }
}

impl SendRing {
    /// A ring for batches of at most `batch` sends (1..=1024).
    pub fn new(op: SendOp, batch: usize) -> io::Result<Self> {
        let batch = batch.clamp(1, MAX_BATCH);
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .build(batch as u32)?;
        Ok(SendRing {
            ring,
            op,
            batch,
            sends: 0,
            enters: 0,
        })
    }

    /// The most sockets one [`SendRing::send_to_all`] call takes.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Writes `frames` (in order) to each socket of `fds`, at most
    /// [`SendRing::batch`] of them, with one system call; `results[i]` becomes
    /// what `send` would have returned for `fds[i]`: the bytes taken, or a
    /// negative errno (`-EAGAIN`: none, the socket is full). An error of the
    /// ring itself leaves [`UNKNOWN`] for the sends whose fate it did not tell:
    /// the caller must not trust the ring again.
    pub fn send_to_all(
        &mut self,
        fds: &[RawFd],
        frames: &[&Bytes],
        results: &mut Vec<i32>,
    ) -> io::Result<()> {
        results.clear();
        results.resize(fds.len(), 0);
        if fds.is_empty() || frames.is_empty() {
            return Ok(());
        }
        assert!(fds.len() <= self.batch, "a batch larger than the ring");
        let frames = &frames[..frames.len().min(MAX_FRAMES)];
        // One gathered message for every socket: the kernel reads it during the
        // call, which is over before these go out of scope.
        let mut iovecs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_FRAMES];
        for (slot, frame) in iovecs.iter_mut().zip(frames) {
            slot.iov_base = frame.as_ptr() as *mut libc::c_void;
            slot.iov_len = frame.len();
        }
        // SAFETY: msghdr is plain old data; zeroed is its empty value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iovecs.as_mut_ptr();
        msg.msg_iovlen = frames.len() as _;
        let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        let single = frames.len() == 1 && self.op == SendOp::Send;
        {
            let mut sq = self.ring.submission();
            for (i, &fd) in fds.iter().enumerate() {
                let entry = if single {
                    opcode::Send::new(types::Fd(fd), frames[0].as_ptr(), frames[0].len() as u32)
                        .flags(flags)
                        .build()
                } else {
                    opcode::SendMsg::new(types::Fd(fd), &msg)
                        .flags(flags as u32)
                        .build()
                };
                // SAFETY: the buffers, iovecs and msghdr the entry points to
                // live until every completion has been taken below.
                unsafe { sq.push(&entry.user_data(i as u64)) }
                    .map_err(|_| io::Error::other("send ring: submission queue full"))?;
            }
        }
        self.complete(fds.len(), results)
    }

    /// Writes each socket its own bytes, the `i`th of `bufs` to `fds[i]`
    /// (held replies, a fan-out's TLS records sealed for each subscriber), at
    /// most [`SendRing::batch`] of them, with one system call; `results` as
    /// for [`SendRing::send_to_all`].
    pub fn send_slices<'b>(
        &mut self,
        fds: &[RawFd],
        bufs: impl Iterator<Item = &'b [u8]>,
        results: &mut Vec<i32>,
    ) -> io::Result<()> {
        results.clear();
        results.resize(fds.len(), 0);
        if fds.is_empty() {
            return Ok(());
        }
        assert!(fds.len() <= self.batch, "a batch larger than the ring");
        let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        let mut queued = 0;
        {
            let mut sq = self.ring.submission();
            for (i, (&fd, bytes)) in fds.iter().zip(bufs).enumerate() {
                let len = bytes.len().min(u32::MAX as usize) as u32;
                let entry = opcode::Send::new(types::Fd(fd), bytes.as_ptr(), len)
                    .flags(flags)
                    .build();
                // SAFETY: the bytes are borrowed for this call, which takes
                // every completion before it returns.
                unsafe { sq.push(&entry.user_data(i as u64)) }
                    .map_err(|_| io::Error::other("send ring: submission queue full"))?;
                queued += 1;
            }
        }
        // Sockets the buffers ran out before were never sent to.
        results[queued..].fill(NOT_SENT);
        self.complete(queued, &mut results[..queued])
    }

    /// Submits the `count` entries queued and takes all their completions.
    fn complete(&mut self, count: usize, results: &mut [i32]) -> io::Result<()> {
        results.fill(UNKNOWN);
        let mut done = 0;
        while done < count {
            // Submits (the first time) and waits for the rest: non-blocking
            // sockets complete inside the call, so one enter normally suffices.
            let want = count - done;
            match self.ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    if self.ring.submission().len() == count {
                        // Nothing was taken: none of these went out.
                        results.fill(NOT_SENT);
                    }
                    return Err(e);
                }
            }
            self.enters += 1;
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                if let Some(slot) = results.get_mut(i) {
                    *slot = cqe.result();
                    done += 1;
                }
            }
        }
        self.sends += count as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (server, client)
    }

    /// These tests need io_uring: `cargo test` skips them (they must not pass
    /// without it), and tests/python/test_io_uring.py runs them where it is.
    fn ring(op: SendOp) -> SendRing {
        SendRing::new(op, 8).expect("io_uring here")
    }

    #[test]
    #[ignore = "needs io_uring: run by scripts/test.sh"]
    fn one_enter_sends_the_shared_frames_to_every_socket_in_order() {
        for op in [SendOp::Send, SendOp::SendMsg] {
            let mut ring = ring(op);
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let pairs: Vec<_> = (0..5).map(|_| pair(&listener)).collect();
            let fds: Vec<RawFd> = pairs.iter().map(|(s, _)| s.as_raw_fd()).collect();
            let a = Bytes::from_static(b"\x81\x02m1");
            let b = Bytes::from_static(b"\x81\x02m2");
            let mut results = Vec::new();
            ring.send_to_all(&fds, &[&a], &mut results).unwrap();
            assert_eq!(results, vec![4; 5]);
            ring.send_to_all(&fds, &[&a, &b], &mut results).unwrap();
            assert_eq!(results, vec![8; 5]);
            for (_, mut client) in pairs {
                let mut got = [0u8; 12];
                client.read_exact(&mut got).unwrap();
                assert_eq!(&got, b"\x81\x02m1\x81\x02m1\x81\x02m2");
            }
            assert_eq!(ring.sends, 10);
        }
    }

    #[test]
    #[ignore = "needs io_uring: run by scripts/test.sh"]
    fn a_full_socket_answers_eagain_or_part_and_a_closed_one_an_error() {
        let mut ring = ring(SendOp::Send);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (full, _full_client) = pair(&listener);
        let (open, mut open_client) = pair(&listener);
        let (gone, gone_client) = pair(&listener);
        drop(gone_client);
        let big = Bytes::from(vec![7u8; 1 << 20]);
        let fds = [full.as_raw_fd()];
        let mut results = Vec::new();
        // Fill the first socket until the kernel takes nothing more.
        let mut blocked = false;
        for _ in 0..256 {
            ring.send_to_all(&fds, &[&big], &mut results).unwrap();
            if results[0] == -libc::EAGAIN {
                blocked = true;
                break;
            }
            assert!(results[0] > 0);
        }
        assert!(blocked, "a socket nobody reads fills up");
        // A reset peer: the send after the RST fails (the first may still land).
        let small = Bytes::from_static(b"hello");
        let fds = [full.as_raw_fd(), open.as_raw_fd(), gone.as_raw_fd()];
        let mut failed = false;
        for _ in 0..50 {
            ring.send_to_all(&fds, &[&small], &mut results).unwrap();
            assert_eq!(results[0], -libc::EAGAIN);
            assert_eq!(results[1], 5);
            if results[2] < 0 {
                assert!([-libc::EPIPE, -libc::ECONNRESET].contains(&results[2]));
                failed = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(failed, "a send to a closed peer fails");
        let mut got = vec![0u8; 5];
        open_client.read_exact(&mut got).unwrap();
        assert_eq!(got, b"hello");
    }
}
