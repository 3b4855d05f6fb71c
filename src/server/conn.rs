//! Per-connection data: what one socket costs while it sits idle.
//!
//! A [`Conn`] is kept small on purpose (it lives in the loop's slab, one per
//! socket): its transport state is one [`Session`] variant holding only what that
//! transport needs between reads, and its outbound side is empty until the socket
//! falls behind. Registering a transport adds its variant here. Behaviour lives in
//! the event loop, `http` and the transports; this module owns the data layout.

use std::net::IpAddr;

use mio::net::TcpStream;

use super::http::{self, Next};
use super::shared::Shared;
use super::timer::Tick;
use crate::broker::{Replay, Resume};
use crate::outbound::Outbound;
use crate::stats::{Counted, TurnCounts};
use crate::transport::poll::{self, PollState};
use crate::transport::sse::{self, SseState};
use crate::transport::websocket::{self, WsState};
use crate::transport::{After, CloseReason, Ctx, Handover, Subscription};

/// A tick value meaning "no deadline" / "no wheel entry".
pub const NEVER: Tick = Tick::MAX;

/// Where a connection is in its life, whatever its transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading requests or messages.
    Active,
    /// A final response or close frame is queued; once flushed, shut down writing.
    Closing,
    /// Writing is shut down; discard input until the peer closes (so our last bytes
    /// are not lost to a reset), or until the linger deadline.
    Lingering,
}

/// A connection's transport state: one variant per transport.
#[derive(Debug)]
pub enum Session {
    /// Plain HTTP (before an upgrade, or kept alive between API requests): the bytes
    /// of a request that has not fully arrived.
    Http(Vec<u8>),
    WebSocket(WsState),
    Sse(SseState),
    /// Boxed: a waiting poll keeps what to answer on timeout, and the record of
    /// every idle WebSocket stays at 80 bytes.
    Poll(Box<PollState>),
}

/// What a session's handler made of its input.
#[derive(Debug)]
pub enum Handled {
    /// An HTTP connection's requests were served.
    Http(Next),
    /// A transport handled its client's input.
    Transport(After),
}

impl Session {
    /// The session a handed-over connection continues in.
    pub fn opened(handover: &Handover, sub: Option<Subscription>) -> Session {
        match handover {
            Handover::WebSocket { .. } => Session::WebSocket(WsState::new(sub)),
            Handover::Sse => Session::Sse(SseState { sub }),
            Handover::Poll { .. } => Session::Poll(Box::new(PollState {
                sub,
                ..PollState::default()
            })),
        }
    }

    /// Hands what the client sent to this session's handler; answers go to `out`.
    pub fn on_input(
        &mut self,
        input: &mut [u8],
        peer: IpAddr,
        shared: &Shared,
        out: &mut Vec<u8>,
        counts: &mut TurnCounts,
        chosen_name: Option<&str>,
    ) -> Handled {
        match self {
            Session::Http(pending) => {
                Handled::Http(http::serve(pending, input, shared, peer, out, counts))
            }
            Session::WebSocket(ws) => {
                let mut ctx = Ctx {
                    out,
                    broker: &*shared.broker,
                    config: &shared.config,
                    counts,
                    chosen_name,
                };
                Handled::Transport(websocket::feed(ws, input, &mut ctx))
            }
            // Receive-only: whatever the client sends after its request is ignored.
            Session::Sse(_) | Session::Poll(_) => Handled::Transport(After::Nothing),
        }
    }

    /// Appends a new subscriber's greeting (a chat welcome), if its transport has one.
    pub fn write_welcome(&self, out: &mut Vec<u8>, count: u64, chosen_name: Option<&str>) {
        match self {
            Session::Http(_) => {}
            Session::WebSocket(ws) => {
                if let Some(sub) = &ws.sub {
                    websocket::write_welcome(out, sub, count, chosen_name);
                }
            }
            Session::Sse(_) | Session::Poll(_) => {}
        }
    }

    /// Appends what a returning subscriber missed (and, where its transport can
    /// say so, the epoch and any gap), ahead of every live message.
    /// A long-poll may be answered right here, and then asks to close.
    pub fn write_replay(&mut self, out: &mut Vec<u8>, replay: Replay, resume: Resume) -> After {
        match self {
            Session::Http(_) => {}
            Session::WebSocket(ws) => {
                if let Some(sub) = &ws.sub {
                    websocket::write_replay(out, sub, replay, resume);
                }
            }
            Session::Sse(sse) => {
                if let Some(sub) = &sse.sub {
                    sse::write_replay(out, sub, replay, resume);
                }
            }
            Session::Poll(state) => return poll::write_replay(out, state, replay, resume),
        }
        After::Nothing
    }

    /// Counted as an open connection (admission, SOCKETS), to be released.
    pub fn is_counted(&self) -> bool {
        !matches!(self, Session::Http(_))
    }

    /// Whether the client is expected to send something now and then (a pong at
    /// least), so silence past `--idle-timeout` means it is gone. An event stream's
    /// client sends nothing; a dead one shows when a heartbeat cannot be written.
    pub fn expects_input(&self) -> bool {
        matches!(self, Session::WebSocket(_))
    }

    pub fn subscription(&self) -> Option<&Subscription> {
        match self {
            Session::Http(_) => None,
            Session::WebSocket(ws) => ws.sub.as_ref(),
            Session::Sse(sse) => sse.sub.as_ref(),
            Session::Poll(state) => state.sub.as_ref(),
        }
    }

    pub fn subscription_mut(&mut self) -> Option<&mut Subscription> {
        match self {
            Session::Http(_) => None,
            Session::WebSocket(ws) => ws.sub.as_mut(),
            Session::Sse(sse) => sse.sub.as_mut(),
            Session::Poll(state) => state.sub.as_mut(),
        }
    }

    pub fn take_subscription(&mut self) -> Option<Subscription> {
        match self {
            Session::Http(_) => None,
            Session::WebSocket(ws) => ws.sub.take(),
            Session::Sse(sse) => sse.sub.take(),
            Session::Poll(state) => state.sub.take(),
        }
    }

    /// Appends a keep-alive for the client, if the transport has one; a long-poll's
    /// is its empty answer, after which it closes.
    pub fn write_heartbeat(&self, out: &mut Vec<u8>) -> After {
        match self {
            Session::Http(_) => {}
            Session::WebSocket(_) => websocket::write_heartbeat(out),
            Session::Sse(_) => sse::write_heartbeat(out),
            Session::Poll(state) => {
                poll::write_timeout(out, state);
                return After::Close;
            }
        }
        After::Nothing
    }

    /// Appends the transport's goodbye for `reason`, and stops reading: after it,
    /// input is of no use.
    pub fn write_close(&mut self, out: &mut Vec<u8>, reason: CloseReason) {
        match self {
            Session::Http(pending) => *pending = Vec::new(),
            Session::WebSocket(ws) => {
                websocket::write_close(out, reason);
                ws.stop_reading();
            }
            // The stream just ends and a browser reconnects by itself; an expired
            // token is said first, since coming back with it would be refused.
            Session::Sse(_) => {
                if reason == CloseReason::TokenExpired {
                    sse::write_expired(out);
                }
            }
            // A waiting poll still gets its (empty) answer.
            Session::Poll(state) => {
                if state.sub.is_some() {
                    poll::write_timeout(out, state);
                }
            }
        }
    }

    /// Drops any half-received input.
    pub fn stop_reading(&mut self) {
        match self {
            Session::Http(pending) => *pending = Vec::new(),
            Session::WebSocket(ws) => ws.stop_reading(),
            Session::Sse(_) | Session::Poll(_) => {}
        }
    }
}

#[derive(Debug)]
pub struct Conn {
    pub socket: TcpStream,
    pub peer: IpAddr,
    pub phase: Phase,
    pub last_seen: Tick,
    pub next_ping: Tick,
    /// When the loop must next look at this connection.
    pub deadline: Tick,
    /// The tick its live timer-wheel entry is filed under (NEVER: none).
    pub timer_slot: Tick,
    pub out: Outbound,
    pub session: Session,
}

impl Conn {
    pub fn new(socket: TcpStream, peer: IpAddr, now: Tick) -> Self {
        Conn {
            socket,
            peer,
            phase: Phase::Active,
            last_seen: now,
            next_ping: NEVER,
            deadline: NEVER,
            timer_slot: NEVER,
            out: Outbound::default(),
            session: Session::Http(Vec::new()),
        }
    }

    /// Sends `bytes`, queueing what the socket does not take; adds what it took
    /// to `sent`.
    pub fn send(&mut self, bytes: &[u8], sent: &mut u64) -> std::io::Result<()> {
        self.out.send(Counted::new(&mut self.socket, sent), bytes)
    }

    /// Sends `bytes`, whose last `catch_up` are a returning subscriber's replay:
    /// what of it waits does not count against `--max-queue` until it is written.
    pub fn send_catch_up(
        &mut self,
        bytes: &[u8],
        catch_up: usize,
        sent: &mut u64,
    ) -> std::io::Result<()> {
        self.out
            .send_catch_up(Counted::new(&mut self.socket, sent), bytes, catch_up)
    }

    /// Writes what is queued; `Ok(true)` once nothing is left.
    pub fn flush(&mut self, sent: &mut u64) -> std::io::Result<bool> {
        self.out.flush(Counted::new(&mut self.socket, sent))
    }
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
}
