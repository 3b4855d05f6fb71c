//! The client side of Server-Sent Events: the event-stream GET (with
//! `Last-Event-ID` when a subscriber comes back) and reading the open stream's
//! events into push deliveries.
//!
//! The response head is read by the loop (`mod.rs`), as for a WebSocket upgrade;
//! parsing the stream itself is `bench::comet`'s. It must not touch the other
//! transports' connections.

use std::io;

use super::ClientLoop;
use super::conn::{ReadState, State, send};
use super::delivery::{leading_number, observe_delivery, unix_nanos};
use crate::bench::SeqFrom;
use crate::bench::comet::SseEvent;

impl ClientLoop {
    /// Sends the event-stream GET; a subscriber coming back sends `Last-Event-ID`.
    pub(super) fn send_stream_request(&mut self, key: usize) -> io::Result<()> {
        let Some(conn) = self.conns.get_mut(key) else {
            return Ok(());
        };
        let host = &self.plan.host_header;
        let path = self.plan.path_for(u64::from(conn.index)).into_owned();
        let last_id = match &conn.resume {
            Some(epoch) if epoch.starts_with(':') && conn.track.seen_any() => {
                format!("Last-Event-ID: {}{epoch}\r\n", conn.track.next - 1)
            }
            Some(epoch) if epoch.starts_with(':') => String::new(),
            Some(id) => format!("Last-Event-ID: {id}\r\n"),
            None => String::new(),
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n{last_id}User-Agent: throng-bench\r\n\r\n",
        );
        conn.state = State::Handshake;
        conn.read = Some(Box::new(ReadState::Http {
            expect: [0; 28],
            head: Vec::new(),
        }));
        send(conn, request.as_bytes())
    }

    /// Feeds event-stream bytes `buf[start..end]` to the connection's reader.
    pub(super) fn on_sse(&mut self, key: usize, start: usize, end: usize) -> bool {
        let ClientLoop {
            conns,
            buf,
            tally,
            plan,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        let Some(mut state) = conn.read.take() else {
            return false;
        };
        let ReadState::Sse(reader) = state.as_mut() else {
            return false;
        };
        let mut now_unix = 0;
        let seq_from = plan.seq_from;
        let resumes = plan.reconnect > 0.0 || !plan.comeback_backoff.is_zero();
        let result = reader.feed(&buf[start..end], &mut |ev: &SseEvent| {
            match ev.kind.as_str() {
                "" | "message" => {
                    if now_unix == 0 {
                        now_unix = unix_nanos();
                    }
                    tally.c.frames_in += 1;
                    tally.c.messages_in += 1;
                    let seq = ev.id.as_deref().and_then(leading_number);
                    observe_delivery(tally, &mut conn.track, seq_from, seq, &ev.data, now_unix);
                }
                "gap" => tally.seq.reported_gaps += 1,
                _ => {}
            }
            // Only a subscriber that will reconnect needs its last id (kept
            // without an allocation per delivery otherwise).
            if resumes && let Some(id) = &ev.id {
                match (seq_from, id.find(':')) {
                    // throng's ids are SEQ:EPOCH and the tracker has the seq: keep
                    // ":EPOCH", which changes (and allocates) only with the epoch.
                    (SeqFrom::Server, Some(at)) => {
                        if conn.resume.as_deref() != Some(&id[at..]) {
                            conn.resume = Some(id[at..].into());
                        }
                    }
                    _ => conn.resume = Some(id.as_str().into()),
                }
            }
        });
        let ended = reader.ended();
        conn.read = Some(state);
        match result {
            Err(e) => {
                self.remove(key, Some(e.to_string()));
                false
            }
            Ok(()) if ended => {
                self.lost(key, "sse: the server ended the stream".into());
                false
            }
            Ok(()) => true,
        }
    }
}
