//! Per-connection data: what one socket costs while it sits idle.
//!
//! A [`Conn`] is kept small on purpose (it lives in the loop's slab, one per
//! socket): the read state and the outbound queue are boxed and exist only while
//! a partial request/frame or unsent bytes exist. Behaviour lives in the event
//! loop; this module owns the data layout and the queue's write mechanics.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::IpAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use mio::net::TcpStream;

use super::timer::Tick;
use crate::hub::{Channel, Format};
use crate::protocol::Decoder;

/// A tick value meaning "no deadline" / "no wheel entry".
pub const NEVER: Tick = Tick::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the HTTP request head.
    Http,
    /// WebSocket open.
    Open,
    /// A final response or close frame is queued; once flushed, shut down writing.
    Closing,
    /// Writing is shut down; discard input until the peer closes (so our last bytes
    /// are not lost to a reset), or until the linger deadline.
    Lingering,
}

/// Bytes received but not yet complete enough to act on.
#[derive(Debug)]
pub enum ReadState {
    Http(Vec<u8>),
    Ws(Decoder),
}

#[derive(Debug)]
pub struct Conn {
    pub socket: TcpStream,
    pub phase: Phase,
    /// Counted as an open WebSocket (admission, SOCKETS) and must be released.
    pub websocket: bool,
    pub peer: IpAddr,
    pub last_seen: Tick,
    pub next_ping: Tick,
    /// When the loop must next look at this connection.
    pub deadline: Tick,
    /// The tick its live timer-wheel entry is filed under (NEVER: none).
    pub timer_slot: Tick,
    pub read: Option<Box<ReadState>>,
    pub out: Option<Box<OutQueue>>,
    /// The channel this connection subscribes to (`/ws/{channel}`), if any.
    pub sub: Option<Subscription>,
}

/// A subscriber's place in its channel.
#[derive(Debug)]
pub struct Subscription {
    pub channel: Arc<Channel>,
    /// Position in the loop's subscriber list of the channel, for O(1) removal.
    pub index: u32,
    pub format: Format,
    /// The client's id, its name in chat (`c<id>`).
    pub client: u64,
}

impl Conn {
    pub fn new(socket: TcpStream, peer: IpAddr, now: Tick) -> Self {
        Conn {
            socket,
            phase: Phase::Http,
            websocket: false,
            peer,
            last_seen: now,
            next_ping: NEVER,
            deadline: NEVER,
            timer_slot: NEVER,
            read: None,
            out: None,
            sub: None,
        }
    }

    pub fn queued_bytes(&self) -> usize {
        self.out.as_ref().map_or(0, |q| q.bytes)
    }
}

/// Outbound bytes the socket would not take yet. Chunks are shared (`Bytes`), so a
/// broadcast frame is queued by reference, not copied.
#[derive(Debug, Default)]
pub struct OutQueue {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    /// The front chunk is partly on the wire already.
    front_started: bool,
}

/// Most chunks handed to one `writev`.
const MAX_IOVECS: usize = 64;

impl OutQueue {
    /// A queue that starts with the unwritten tail of a frame already partly sent.
    pub fn with_partial(tail: Bytes, started: bool) -> Self {
        let mut q = OutQueue::default();
        q.push(tail);
        q.front_started = started;
        q
    }

    pub fn push(&mut self, chunk: Bytes) {
        self.bytes += chunk.len();
        self.chunks.push_back(chunk);
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Drops everything not yet started, keeping the front chunk if it is partly
    /// written (cutting a frame in half would corrupt the stream).
    pub fn truncate_unstarted(&mut self) {
        let keep = usize::from(self.front_started).min(self.chunks.len());
        self.chunks.truncate(keep);
        self.bytes = self.chunks.iter().map(Bytes::len).sum();
    }

    /// Writes as much as the socket takes. `Ok(true)`: the queue is empty.
    pub fn flush(&mut self, socket: &mut TcpStream) -> io::Result<bool> {
        while !self.chunks.is_empty() {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let mut count = 0;
            for (slot, chunk) in slices.iter_mut().zip(self.chunks.iter()) {
                *slot = IoSlice::new(chunk);
                count += 1;
            }
            match socket.write_vectored(&slices[..count]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut written) => {
                    self.bytes -= written;
                    while written > 0 {
                        let Some(front) = self.chunks.front_mut() else {
                            break;
                        };
                        if written >= front.len() {
                            written -= front.len();
                            self.chunks.pop_front();
                            self.front_started = false;
                        } else {
                            front.advance(written);
                            self.front_started = true;
                            written = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Writes shared frames (a broadcast) to the connection: straight to the socket,
/// gathered into one `writev`, when nothing is queued; whatever the socket does not
/// take is queued by reference, so fan-out copies no payload per subscriber.
pub fn send_shared(conn: &mut Conn, frames: &[&Bytes]) -> io::Result<()> {
    if let Some(queue) = conn.out.as_mut() {
        for frame in frames {
            queue.push(Bytes::clone(frame));
        }
        return Ok(());
    }
    let mut first = 0;
    let mut offset = 0;
    while first < frames.len() {
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let mut count = 0;
        for (i, (slot, frame)) in slices.iter_mut().zip(&frames[first..]).enumerate() {
            *slot = IoSlice::new(if i == 0 { &frame[offset..] } else { frame });
            count += 1;
        }
        match conn.socket.write_vectored(&slices[..count]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(mut written) => {
                while written > 0 && first < frames.len() {
                    let rest = frames[first].len() - offset;
                    if written >= rest {
                        written -= rest;
                        first += 1;
                        offset = 0;
                    } else {
                        offset += written;
                        written = 0;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if first < frames.len() {
        let mut queue = OutQueue::with_partial(frames[first].slice(offset..), offset > 0);
        for frame in &frames[first + 1..] {
            queue.push(Bytes::clone(frame));
        }
        conn.out = Some(Box::new(queue));
    }
    Ok(())
}

/// Writes `bytes` straight to the socket; returns how many it took before it
/// would block.
pub fn write_direct(socket: &mut TcpStream, bytes: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match socket.write(&bytes[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_state_stays_small() {
        // The slab holds one of these per socket: keep an eye on its size.
        assert!(
            std::mem::size_of::<Conn>() <= 80,
            "Conn is {} bytes",
            std::mem::size_of::<Conn>()
        );
    }

    #[test]
    fn truncate_keeps_a_started_front_chunk() {
        let mut q = OutQueue::with_partial(Bytes::from_static(b"abc"), true);
        q.push(Bytes::from_static(b"defg"));
        q.truncate_unstarted();
        assert_eq!(q.bytes, 3);
        q.front_started = false;
        q.truncate_unstarted();
        assert!(q.is_empty());
        assert_eq!(q.bytes, 0);
    }
}
