//! uring-echo: a WebSocket echo server on io_uring, one thread, for one question
//! only: how much server CPU per echoed message does the io_uring interface save
//! against epoll (throng, uWebSockets) on this kernel, with the same client?
//!
//! Multishot accept, multishot receive into one shared ring of provided buffers
//! (an idle connection owns no read buffer), sends queued as submissions, and one
//! `io_uring_enter` per batch of completions. It is a probe, not a server: no
//! fragmented messages reassembled (each frame is echoed as it comes), no limits,
//! no timeouts. `GET /healthz` answers 200 so the bench scripts can wait for it.
//!
//! Usage: uring-echo [--addr 127.0.0.1:PORT] [--no-defer-taskrun]
//!
//! `--no-defer-taskrun` sets the ring up without `IORING_SETUP_DEFER_TASKRUN`: the
//! kernel then interrupts the thread to run completion work as data arrives,
//! instead of running it inside the next `io_uring_enter` (the difference is large
//! on this machine: docs/BENCHMARKS.md §15).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};

use base64::Engine;
use io_uring::types::BufRingEntry;
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use sha1::{Digest, Sha1};
use slab::Slab;

const BUF_SIZE: usize = 4096;
const BUF_COUNT: u16 = 4096;
const BUF_GROUP: u16 = 7;
const ACCEPT: u64 = u64::MAX;
const RECV: u64 = 0;
const SEND: u64 = 1;
const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// Largest frame payload taken; a larger one closes the connection.
const MAX_PAYLOAD: usize = 1 << 20;

struct Conn {
    fd: RawFd,
    upgraded: bool,
    /// Bytes received and not yet parsed (empty between whole frames).
    input: Vec<u8>,
    /// Being sent now; the kernel reads it until the send completes.
    sending: Vec<u8>,
    sent: usize,
    in_flight: bool,
    /// What to send once `sending` is done.
    queued: Vec<u8>,
    recv_armed: bool,
    closing: bool,
}

/// The provided-buffer ring: `BUF_COUNT` buffers of `BUF_SIZE` bytes, shared by
/// every connection; a buffer goes back to the ring as soon as it is parsed.
struct BufRing {
    entries: *mut BufRingEntry,
    memory: Vec<u8>,
    tail: u16,
}

impl BufRing {
    fn new(ring: &IoUring) -> io::Result<BufRing> {
        let bytes = BUF_COUNT as usize * std::mem::size_of::<BufRingEntry>();
        // SAFETY: anonymous private mapping, page-aligned as the kernel requires.
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
        let mut this = BufRing {
            entries: entries.cast(),
            memory: vec![0u8; BUF_SIZE * BUF_COUNT as usize],
            tail: 0,
        };
        // SAFETY: the mapping lives as long as the process (never unmapped).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                entries as u64,
                BUF_COUNT,
                BUF_GROUP,
                0,
            )?
        };
        for bid in 0..BUF_COUNT {
            this.give_back(bid);
        }
        Ok(this)
    }

    fn buffer(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * BUF_SIZE;
        &self.memory[start..start + len]
    }

    fn give_back(&mut self, bid: u16) {
        let slot = (self.tail & (BUF_COUNT - 1)) as usize;
        // SAFETY: slot < BUF_COUNT, inside the mapping; the kernel reads entries
        // only up to the tail published below.
        unsafe {
            let entry = &mut *self.entries.add(slot);
            entry.set_addr(self.memory.as_ptr().add(bid as usize * BUF_SIZE) as u64);
            entry.set_len(BUF_SIZE as u32);
            entry.set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field of the first entry, 2-byte aligned.
        unsafe {
            let tail = BufRingEntry::tail(self.entries) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }
}

fn user_data(key: usize, op: u64) -> u64 {
    ((key as u64) << 1) | op
}

fn main() -> io::Result<()> {
    let mut addr: SocketAddr = "127.0.0.1:8080".parse().expect("default address");
    let mut defer_taskrun = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" => {
                let value = args.next().unwrap_or_default();
                addr = value.parse().map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("bad --addr {value}"))
                })?;
            }
            "--no-defer-taskrun" => defer_taskrun = false,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "unknown argument {other}; usage: uring-echo [--addr HOST:PORT] [--no-defer-taskrun]"
                    ),
                ));
            }
        }
    }
    let listener = TcpListener::bind(addr)?;
    let listen_fd = listener.into_raw_fd();
    let mut builder = IoUring::builder();
    builder.setup_single_issuer();
    if defer_taskrun {
        builder.setup_defer_taskrun();
    }
    let mut ring = builder.build(8192)?;
    let mut bufs = BufRing::new(&ring)?;
    let mut conns: Slab<Conn> = Slab::new();
    let mut pending: Vec<squeue::Entry> = Vec::with_capacity(1024);
    let mut done: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
    pending.push(
        opcode::AcceptMulti::new(types::Fd(listen_fd))
            .build()
            .user_data(ACCEPT),
    );
    loop {
        {
            let mut sq = ring.submission();
            let mut i = 0;
            while i < pending.len() {
                // SAFETY: every buffer an entry names (a conn's `sending`) stays
                // untouched until its completion arrives.
                if unsafe { sq.push(&pending[i]) }.is_err() {
                    break;
                }
                i += 1;
            }
            pending.drain(..i);
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(
            ring.completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(data, result, flags) in &done {
            if data == ACCEPT {
                if result >= 0 {
                    let fd = result;
                    let one: libc::c_int = 1;
                    // SAFETY: setsockopt on a socket we own, with a valid int.
                    unsafe {
                        libc::setsockopt(
                            fd,
                            libc::IPPROTO_TCP,
                            libc::TCP_NODELAY,
                            (&one as *const libc::c_int).cast(),
                            std::mem::size_of::<libc::c_int>() as u32,
                        );
                    }
                    let key = conns.insert(Conn {
                        fd,
                        upgraded: false,
                        input: Vec::new(),
                        sending: Vec::new(),
                        sent: 0,
                        in_flight: false,
                        queued: Vec::new(),
                        recv_armed: true,
                        closing: false,
                    });
                    pending.push(recv(fd, key));
                }
                if !cqueue::more(flags) {
                    pending.push(
                        opcode::AcceptMulti::new(types::Fd(listen_fd))
                            .build()
                            .user_data(ACCEPT),
                    );
                }
                continue;
            }
            let key = (data >> 1) as usize;
            let Some(conn) = conns.get_mut(key) else {
                continue;
            };
            if data & 1 == RECV {
                if let Some(bid) = cqueue::buffer_select(flags) {
                    if result > 0 && !conn.closing {
                        let input = bufs.buffer(bid, result as usize);
                        on_input(conn, input);
                    }
                    bufs.give_back(bid);
                }
                if result == 0 || (result < 0 && result != -libc::ENOBUFS) {
                    conn.closing = true;
                }
                if !cqueue::more(flags) {
                    conn.recv_armed = false;
                    if !conn.closing {
                        conn.recv_armed = true;
                        pending.push(recv(conn.fd, key));
                    }
                }
            } else {
                conn.in_flight = false;
                if result < 0 {
                    conn.closing = true;
                    conn.queued.clear();
                } else {
                    conn.sent += result as usize;
                    if conn.sent < conn.sending.len() {
                        conn.in_flight = true;
                        pending.push(send(conn, key));
                        continue;
                    }
                    conn.sending.clear();
                    conn.sent = 0;
                }
            }
            if !conn.in_flight && !conn.queued.is_empty() {
                std::mem::swap(&mut conn.sending, &mut conn.queued);
                conn.in_flight = true;
                pending.push(send(conn, key));
            } else if !conn.in_flight && conn.closing {
                if conn.recv_armed {
                    // SAFETY: shutting down a socket we own ends its multishot
                    // receive with a final completion.
                    unsafe { libc::shutdown(conn.fd, libc::SHUT_RDWR) };
                } else {
                    // SAFETY: nothing in flight names this descriptor any more.
                    unsafe { libc::close(conn.fd) };
                    conns.remove(key);
                }
            }
        }
    }
}

fn recv(fd: RawFd, key: usize) -> squeue::Entry {
    opcode::RecvMulti::new(types::Fd(fd), BUF_GROUP)
        .build()
        .user_data(user_data(key, RECV))
}

fn send(conn: &Conn, key: usize) -> squeue::Entry {
    let rest = &conn.sending[conn.sent..];
    opcode::Send::new(types::Fd(conn.fd), rest.as_ptr(), rest.len() as u32)
        .build()
        .user_data(user_data(key, SEND))
}

/// Parses what arrived: the upgrade request, then frames; what to answer goes
/// to `queued` (sent when the socket's previous send is done).
fn on_input(conn: &mut Conn, input: &[u8]) {
    // Whole frames straight from the buffer when nothing is left over; a
    // partial one is kept.
    let taken;
    let data: &[u8] = if conn.input.is_empty() {
        input
    } else {
        conn.input.extend_from_slice(input);
        taken = std::mem::take(&mut conn.input);
        &taken
    };
    let used = if conn.upgraded {
        frames(conn, data)
    } else {
        handshake(conn, data)
    };
    if used < data.len() && !conn.closing {
        conn.input = data[used..].to_vec();
    }
}

fn handshake(conn: &mut Conn, data: &[u8]) -> usize {
    let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
        if data.len() > 8192 {
            conn.closing = true;
        }
        return 0;
    };
    let head = String::from_utf8_lossy(&data[..end]);
    if head.starts_with("GET /healthz") {
        conn.queued.extend_from_slice(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        );
        conn.closing = true;
        return data.len();
    }
    let key = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("sec-websocket-key")
            .then(|| value.trim().to_string())
    });
    let Some(key) = key else {
        conn.queued
            .extend_from_slice(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        conn.closing = true;
        return end + 4;
    };
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(WS_GUID.as_bytes());
    let accept = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
    conn.queued.extend_from_slice(
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        )
        .as_bytes(),
    );
    conn.upgraded = true;
    end + 4 + frames(conn, &data[end + 4..])
}

/// Echoes every whole frame in `data`; returns the bytes used.
fn frames(conn: &mut Conn, data: &[u8]) -> usize {
    let mut at = 0;
    loop {
        let rest = &data[at..];
        if rest.len() < 2 {
            return at;
        }
        let (b0, b1) = (rest[0], rest[1]);
        let mut header = 2;
        let mut len = (b1 & 0x7f) as usize;
        if len == 126 {
            if rest.len() < 4 {
                return at;
            }
            len = u16::from_be_bytes([rest[2], rest[3]]) as usize;
            header = 4;
        } else if len == 127 {
            if rest.len() < 10 {
                return at;
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&rest[2..10]);
            len = usize::try_from(u64::from_be_bytes(b)).unwrap_or(usize::MAX);
            header = 10;
        }
        if b1 & 0x80 == 0 || len > MAX_PAYLOAD {
            // Clients must mask; the probe takes no huge frames.
            conn.closing = true;
            return data.len();
        }
        if rest.len() < header + 4 + len {
            return at;
        }
        let mask = [
            rest[header],
            rest[header + 1],
            rest[header + 2],
            rest[header + 3],
        ];
        let payload = &rest[header + 4..header + 4 + len];
        let opcode = b0 & 0x0f;
        let answer_opcode = match opcode {
            0x9 => Some(0x8a), // ping: pong
            0xa => None,       // pong: nothing
            _ => Some(b0),     // data and close: echoed as they came
        };
        if let Some(first) = answer_opcode {
            let out = &mut conn.queued;
            out.push(first);
            if len < 126 {
                out.push(len as u8);
            } else if len <= u16::MAX as usize {
                out.push(126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            } else {
                out.push(127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        }
        at += header + 4 + len;
        if opcode == 0x8 {
            conn.closing = true;
            return data.len();
        }
    }
}
