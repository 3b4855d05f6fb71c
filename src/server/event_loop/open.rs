//! Handing a connection over to its transport: admission, the transport's answer
//! (a 101, an event stream's head), the subscription with its greeting and what a
//! returning subscriber missed, the first heartbeat's time; then what the client
//! sent right behind its request. What each step writes is the transport's; this
//! file only orders them and names no transport.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::EventLoop;
use super::timers::{next_due, set_deadline};
use crate::broker::BrokerError;
use crate::protocol::http::write_error;
use crate::server::conn::Mode;
use crate::server::subscribers::Joined;
use crate::server::timer::{Tick, ticks};
use crate::stats::{HandshakeFailure, LoopCounters};
use crate::transport::{After, Change, Deflater, Opening, Replayed, Subscribe};

impl EventLoop {
    /// Opens `opening` on connection `key` for `client` (its peer, or whom a
    /// trusted proxy forwards for: per-IP admission counts that address). `buf.out`
    /// may already hold answers to pipelined requests.
    pub(super) fn open_session(
        &mut self,
        key: usize,
        mut opening: Opening,
        mut leftover: Vec<u8>,
        client: IpAddr,
    ) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.peer = client;
        if let Err(refusal) = self.shared.admission.try_admit(conn.peer) {
            self.tally.turn.handshake_failed(if refusal.status == 429 {
                HandshakeFailure::MaxConnsPerIp
            } else {
                HandshakeFailure::MaxConns
            });
            write_error(&mut self.buf.out, refusal.status, &refusal.reason, &[]);
            self.send_out(key, After::Close);
            return;
        }
        if !self.shared.config.permessage_deflate {
            opening.handover.decline_deflate();
        }
        let session = opening.handover.session(None);
        let counters = &self.tally.shared;
        counters.sockets.fetch_add(1, Ordering::Relaxed);
        LoopCounters::add(&counters.open[session.kind().index()], 1);
        conn.mode = Mode::Open(session);
        conn.deflate = opening.handover.deflate_window();
        let head_at = self.buf.out.len();
        opening.handover.write_head(&mut self.buf.out);
        // The client's id: its chat name (`c<id>`), its Pusher socket id.
        let client_id = self.shared.next_client_id();
        if let Mode::Open(session) = &mut conn.mode {
            let greeted = session
                .transport_mut()
                .write_opened(&mut self.buf.out, client_id);
            if greeted == After::Close {
                self.send_out(key, After::Close);
                return;
            }
        }
        if let Some(subscribe) = opening.subscribe
            && !self.subscribe(key, subscribe, client_id, head_at)
        {
            return;
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.last_seen = self.clock.now;
        self.clock.ping_seq = self.clock.ping_seq.wrapping_add(1);
        if let Some(wait) = opening.handover.answer_within() {
            conn.next_ping = self.clock.now + ticks(wait).max(1);
        } else if self.clock.ping_ticks > 0 {
            // Golden-ratio spacing spreads first pings evenly over the interval even
            // when thousands of clients connect in the same instant.
            let spread = (u64::from(self.clock.ping_seq.wrapping_mul(0x9E37_79B9))
                * u64::from(self.clock.ping_ticks))
                >> 32;
            conn.next_ping = self.clock.now + 1 + spread as Tick;
        }
        let due = next_due(conn, self.clock.idle_ticks);
        set_deadline(&mut self.clock.wheel, key, conn, due);
        if leftover.is_empty() {
            self.send_out(key, After::Nothing);
            return;
        }
        self.feed(key, Some(&mut leftover), 0);
    }

    /// Joins the channel `subscribe` asks for, with the transport's greeting and
    /// replay; false when that already answered or ended the connection (a
    /// long-poll answered from history, a broker refusal, a dead socket).
    fn subscribe(&mut self, key: usize, subscribe: Subscribe, client: u32, head_at: usize) -> bool {
        let joined = self.join(key, &subscribe, client);
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let Some(session) = conn.mode.session_mut() else {
            return false;
        };
        let (sub, count, replay) = match joined {
            Ok(joined) => (joined.sub, joined.count, joined.replay),
            Err(e) => {
                let channel = subscribe.channel;
                tracing::warn!(error = %e, channel, "subscribe failed");
                self.tally
                    .turn
                    .handshake_failed(HandshakeFailure::BrokerUnavailable);
                session
                    .transport_mut()
                    .write_unavailable(&mut self.buf.out, head_at);
                self.send_out(key, After::Close);
                return false;
            }
        };
        let transport = session.transport_mut();
        transport.add_subscription(sub);
        transport.write_welcome(&mut self.buf.out, count, subscribe.name.as_deref());
        let (Some(replay), Some(resume)) = (replay, subscribe.resume) else {
            return true;
        };
        let start = self.buf.out.len();
        let mut deflater = Deflater {
            window_bits: conn.deflate,
            compression: self.shared.config.compression,
            counts: &mut self.tally.turn,
            shared: Some(&self.tally.shared),
        };
        let feed = match transport.write_replay(&mut self.buf.out, replay, resume, &mut deflater) {
            Replayed::Written(After::Close) => {
                // Answered from history at once (a long-poll).
                self.send_out(key, After::Close);
                return false;
            }
            Replayed::Written(After::Nothing) => None,
            Replayed::Fed(feed) => Some(feed),
        };
        // The replay goes out now, ahead of anything live. It is at most
        // --history-size messages, and a socket that cannot take it at once is
        // not a slow consumer for that: only what comes on top of it counts
        // against --max-queue. Past its first slice it is framed as the socket
        // takes it, so a reader that reads nothing holds the kept messages
        // (shared with history), not a copy of them as frames.
        let catch_up = self.buf.out.len() - start;
        let tls = self.tls.get_mut(key);
        let sent = conn.send_catch_up(
            &self.buf.out,
            catch_up,
            feed,
            tls,
            &mut self.tally.turn.bytes_sent,
        );
        self.buf.out.clear();
        if sent.is_err() {
            self.drop_conn(key);
            return false;
        }
        if conn.out.has_catch_up() {
            self.watch_catch_up(key);
        }
        true
    }

    /// Joins connection `key` (of `client`) to the channel `subscribe` names,
    /// through the broker and by its namespace's rules: the one way in, for a
    /// transport's own subscription and for a join its client asks for later.
    fn join(
        &mut self,
        key: usize,
        subscribe: &Subscribe,
        client: u32,
    ) -> Result<Joined, BrokerError> {
        self.subscribers.join(
            &*self.shared.broker,
            &self.shared.config.namespaces,
            key,
            subscribe,
            client,
        )
    }

    /// Carries out the subscriptions connection `key`'s transport asked for
    /// while its input was handled, each answered by the transport.
    pub(super) fn apply_changes(&mut self, key: usize) {
        let mut changes = std::mem::take(&mut self.buf.changes);
        for change in changes.drain(..) {
            match change {
                Change::Join { subscribe, client } => {
                    let joined = self.join(key, &subscribe, client);
                    let session = self.conns.get_mut(key).and_then(|c| c.mode.session_mut());
                    let Some(transport) = session.map(|s| s.transport_mut()) else {
                        // The connection being served is not closed while its own
                        // input is handled.
                        continue;
                    };
                    match joined {
                        Ok(joined) => {
                            let channel = Arc::clone(&joined.sub.channel);
                            transport.add_subscription(joined.sub);
                            let members = joined.members.as_ref();
                            transport.write_joined(&mut self.buf.out, &channel, members);
                        }
                        Err(e) => {
                            let channel = subscribe.channel;
                            if !matches!(e, BrokerError::PresenceFull(_)) {
                                tracing::warn!(error = %e, channel, "subscribe failed");
                            }
                            transport.write_join_refused(&mut self.buf.out, &channel, &e);
                        }
                    }
                }
                Change::Leave(channel) => {
                    self.subscribers.leave_channel(
                        &*self.shared.broker,
                        key,
                        &channel,
                        &mut self.conns,
                    );
                }
            }
        }
        self.buf.changes = changes;
    }
}
