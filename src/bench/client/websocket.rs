//! The client side of WebSocket: the upgrade request (resuming with `since` and
//! `epoch` after a reconnect), reading frames, and each mode's messages: echo
//! round trips, answering pings, push deliveries in throng's JSON envelope (or a
//! bare published body), chat sends and the latency of our own broadcasts, and
//! answering the server's close. Under `--protocol pusher` every text message
//! goes to `pusher.rs` instead.
//!
//! It must not touch the other transports' connections or the loop's pacing.

use std::borrow::Cow;
use std::io;
use std::time::Instant;

use base64::Engine as _;
use serde::Deserialize;

use super::conn::{ReadState, State, io_reason, send};
use super::delivery::{leading_number, observe_delivery, unix_nanos};
use super::plan::with_query;
use super::pusher::{self, Step, code_says_come_back};
use super::{ClientLoop, MAX_MESSAGE, next_mask, phase};
use crate::bench::{Mode, Protocol, SeqFrom};
use crate::protocol::handshake::accept_key;
use crate::protocol::{Decoder, Event, Flow, close_code, encode_client_frame, opcode};

/// The envelope throng (and similar servers) wrap channel messages in, and the
/// events a resuming json subscriber gets (`epoch`, `gap`).
#[derive(Deserialize)]
struct Envelope<'a> {
    seq: Option<u64>,
    #[serde(borrow)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow)]
    event: Option<Cow<'a, str>>,
    #[serde(borrow)]
    epoch: Option<Cow<'a, str>>,
}

/// Whether a WebSocket close says "come back" (the README's close-code table):
/// going away, a server error, a restart, try again later, or a slow consumer.
pub(super) fn close_says_come_back(code: Option<u16>, reason: &str) -> bool {
    match code {
        None | Some(1001 | 1006 | 1011 | 1012 | 1013) => true,
        Some(1008) => reason == "slow consumer",
        Some(_) => false,
    }
}

/// Builds a text payload: `prefix` padded with `x` to `size` bytes.
pub(super) fn padded(out: &mut Vec<u8>, prefix: &str, size: usize) {
    out.clear();
    out.extend_from_slice(prefix.as_bytes());
    if out.len() < size {
        out.resize(size, b'x');
    }
}

impl ClientLoop {
    /// Sends the WebSocket upgrade; a subscriber coming back asks to resume after
    /// the last seq it got (`since`, and the `epoch` it was told).
    pub(super) fn send_upgrade(&mut self, key: usize) -> io::Result<()> {
        let Some(conn) = self.conns.get_mut(key) else {
            return Ok(());
        };
        let host = &self.plan.host_header;
        let mut path = self.plan.path_for(u64::from(conn.index)).into_owned();
        // Pusher cannot resume: a subscriber coming back starts afresh.
        if self.plan.protocol == Protocol::Throng && conn.opened_once && conn.track.seen_any() {
            path = with_query(&path, "since", conn.track.next - 1);
            if let Some(epoch) = &conn.resume {
                path = with_query(&path, "epoch", epoch);
            }
        }
        let raw: [u8; 16] = rand::random();
        let key_b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key_b64}\r\nSec-WebSocket-Version: 13\r\nUser-Agent: throng-bench\r\n\r\n",
        );
        conn.state = State::Handshake;
        conn.read = Some(Box::new(ReadState::Http {
            expect: accept_key(key_b64.as_bytes()),
            head: Vec::new(),
        }));
        send(conn, request.as_bytes())
    }

    /// Feeds `buf[start..end]` to the connection's decoder and acts on the events.
    pub(super) fn on_ws(&mut self, key: usize, start: usize, end: usize) -> bool {
        let ClientLoop {
            conns,
            buf,
            scratch,
            tally,
            plan,
            epoch,
            rng,
            seen_phase,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        let mut dec = match conn.read.take().map(|b| *b) {
            Some(ReadState::Ws(d)) => d,
            _ => Decoder::client(),
        };
        scratch.clear();
        // The close code, and whether it says "come back".
        let mut close: Option<(Option<u16>, bool)> = None;
        let mut echoed = false;
        let mode = plan.mode;
        let seq_from = plan.seq_from;
        let is_pusher = plan.protocol == Protocol::Pusher;
        // Pusher: what its messages ask of the connection once they are read.
        let mut step = Step::Nothing;
        let now_mono = epoch.elapsed().as_nanos() as u64;
        let mut now_unix = 0;
        let result = dec.feed(&mut buf[start..end], MAX_MESSAGE, |ev| {
            match ev {
                Event::Message { payload, .. } if is_pusher => {
                    match pusher::on_message(
                        payload,
                        conn,
                        plan,
                        tally,
                        scratch,
                        rng,
                        &mut now_unix,
                    ) {
                        Step::Nothing => {}
                        Step::Subscribed => step = Step::Subscribed,
                        other => {
                            step = other;
                            return Flow::Stop;
                        }
                    }
                }
                Event::Message { payload, .. } => match mode {
                    Mode::Echo => {
                        if conn.sent_at != 0 {
                            let us = now_mono.saturating_sub(conn.sent_at) / 1000;
                            tally.hist.saturating_record(us.max(1));
                            tally.c.latency_samples += 1;
                            tally.c.latency_us_sum += us;
                            conn.sent_at = 0;
                            tally.c.in_flight = tally.c.in_flight.saturating_sub(1);
                            echoed = true;
                        }
                    }
                    Mode::Push | Mode::Chat => {
                        let Ok(env) = serde_json::from_slice::<Envelope<'_>>(payload) else {
                            // A server without envelopes (Nchan's WebSocket
                            // subscriber) sends the published body as it is; the
                            // payload's stamp says the rest.
                            if mode == Mode::Push
                                && seq_from == SeqFrom::Payload
                                && let Ok(data) = std::str::from_utf8(payload)
                            {
                                if now_unix == 0 {
                                    now_unix = unix_nanos();
                                }
                                observe_delivery(
                                    tally,
                                    &mut conn.track,
                                    seq_from,
                                    None,
                                    data,
                                    now_unix,
                                );
                            }
                            return Flow::Continue;
                        };
                        match env.event.as_deref() {
                            Some("epoch") => conn.resume = env.epoch.map(|e| e.as_ref().into()),
                            Some("gap") => tally.seq.reported_gaps += 1,
                            _ => {}
                        }
                        let Some(data) = env.data else {
                            return Flow::Continue;
                        };
                        if now_unix == 0 {
                            now_unix = unix_nanos();
                        }
                        if mode == Mode::Push {
                            observe_delivery(
                                tally,
                                &mut conn.track,
                                seq_from,
                                env.seq,
                                &data,
                                now_unix,
                            );
                            return Flow::Continue;
                        }
                        let sent = {
                            // Chat: only our own broadcasts ("b<index>:<nanos>:...").
                            data.strip_prefix('b')
                                .and_then(|r| r.split_once(':'))
                                .filter(|(idx, _)| idx.parse::<u32>().ok() == Some(conn.index))
                                .and_then(|(_, r)| leading_number(r))
                        };
                        if let Some(sent) = sent {
                            let us = now_unix.saturating_sub(sent) / 1000;
                            tally.hist.saturating_record(us.max(1));
                            tally.c.latency_samples += 1;
                            tally.c.latency_us_sum += us;
                        }
                    }
                    Mode::Idle | Mode::Handshakes => {}
                },
                Event::Ping(p) => {
                    tally.c.pings += 1;
                    encode_client_frame(scratch, opcode::PONG, true, p, next_mask(rng));
                }
                Event::Pong(_) => {}
                Event::Close { code, reason } => {
                    let come_back = close_says_come_back(code, reason)
                        || (is_pusher && code_says_come_back(code));
                    close = Some((code, come_back));
                    return Flow::Stop;
                }
            }
            Flow::Continue
        });
        let stats = match result {
            Ok(stats) => stats,
            Err(e) => {
                self.remove(key, Some(format!("protocol error: {e}")));
                return false;
            }
        };
        tally.c.frames_in += stats.frames;
        if !is_pusher {
            // Pusher's handler counts its events only, not its control messages.
            tally.c.messages_in += stats.messages;
        }
        if !dec.is_idle() {
            conn.read = Some(Box::new(ReadState::Ws(dec)));
        }
        if let Some((code, come_back)) = close {
            if conn.state == State::Open {
                // Answer the close handshake before letting go.
                scratch.clear();
                let payload = code.unwrap_or(close_code::NORMAL).to_be_bytes();
                encode_client_frame(scratch, opcode::CLOSE, true, &payload, next_mask(rng));
                let _ = send(conn, scratch);
            }
            let reason = match code {
                Some(c) => format!("closed with code {c}"),
                None => "closed with code (none)".into(),
            };
            if come_back {
                self.lost(key, reason);
            } else {
                self.remove(key, Some(reason));
            }
            return false;
        }
        if !scratch.is_empty()
            && let Err(e) = send(conn, scratch)
        {
            self.lost(key, io_reason(&e));
            return false;
        }
        let load = *seen_phase == phase::LOAD;
        match step {
            Step::Nothing => {}
            Step::Subscribed => self.mark_open(key),
            Step::Refused(reason) => {
                self.remove(key, Some(reason));
                return false;
            }
            Step::ComeBack(reason) => {
                self.lost(key, reason);
                return false;
            }
        }
        if echoed && load {
            return self.send_echo(key);
        }
        true
    }

    pub(super) fn send_echo(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        if conn.state != State::Open {
            return true;
        }
        if self.text.len() != self.plan.size {
            padded(&mut self.text, "", self.plan.size);
        }
        conn.sent_at = (self.epoch.elapsed().as_nanos() as u64).max(1);
        self.tally.c.in_flight += 1;
        self.send_text(key)
    }

    /// Sends `self.text` as one masked text frame; false if the connection died.
    fn send_text(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        self.scratch.clear();
        encode_client_frame(
            &mut self.scratch,
            opcode::TEXT,
            true,
            &self.text,
            next_mask(&mut self.rng),
        );
        self.tally.c.messages_out += 1;
        if let Err(e) = send(conn, &self.scratch) {
            self.lost(key, io_reason(&e));
            return false;
        }
        true
    }

    fn send_chat(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        if conn.state != State::Open {
            return false;
        }
        let prefix = format!("b{}:{}:", conn.index, unix_nanos());
        padded(&mut self.text, &prefix, self.plan.size);
        self.send_text(key)
    }

    pub(super) fn send_chat_due(&mut self, now: Instant) {
        while let Some(&(at, key, index)) = self.chat_queue.front() {
            if at > now {
                break;
            }
            self.chat_queue.pop_front();
            let same = self.conns.get(key).is_some_and(|c| c.index == index);
            if same && self.send_chat(key) {
                self.chat_queue
                    .push_back((at + self.plan.send_interval, key, index));
            }
        }
    }
}
