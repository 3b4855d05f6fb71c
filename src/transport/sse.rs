//! Server-Sent Events as a transport: a `text/event-stream` response that stays
//! open, one event per channel message, a comment line as the heartbeat.
//!
//! Each message is `id: SEQ:EPOCH` (so a browser's `EventSource` sends it back as
//! `Last-Event-ID` and the server can tell a seq of another epoch), then its payload
//! as `data:` lines (binary payloads base64, as `event: binary`). Like the raw
//! WebSocket format, `data:` is the payload alone, live or replayed: a chat
//! message's sender (`from`) is not shown (json WebSocket and long-poll show it).
//! Chat events are `event: join|leave` with a json `data:`. A returning client that cannot be given
//! everything gets `event: gap`. The stream is receive-only: what the client sends
//! after its request is ignored. This module must not own the socket or keep time.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;

use super::replay::ReplayFeed;
use super::request::{Endpoint, Gate, Path, Refused, admit_get, resume_param};
use super::{After, CloseReason, Format, Handover, Opening, Subscribe, Subscription, Transport};
use crate::broker::{GapReason, Replay, Resume, Stored};
use crate::hub::{Body, Message};
use crate::protocol::DataKind;
use crate::protocol::http::Request;
use crate::stats::TurnCounts;

/// How long a browser waits before reconnecting, in milliseconds (`retry:`).
const RETRY_MS: u32 = 2000;

/// An open event stream: only its subscription.
#[derive(Debug, Default)]
pub struct SseState {
    pub sub: Option<Subscription>,
}

/// `GET /sse/{channel}`.
pub const ENDPOINTS: &[Endpoint] = &[Endpoint {
    path: Path::Prefix("/sse/"),
    open,
}];

/// An event stream of the channel. A browser coming back sends `Last-Event-ID`,
/// which wins over a `since=` still in its URL.
fn open(req: &Request<'_>, channel: &str, gate: &dyn Gate) -> Result<Opening, Refused> {
    let grant = admit_get(req, channel, gate)?;
    let last_event_id = req
        .header("last-event-id")
        .map(|v| std::str::from_utf8(v).ok().and_then(parse_event_id));
    let resume = match last_event_id {
        Some(Some(resume)) => Some(resume),
        Some(None) => {
            return Err(Refused::bad(
                "Last-Event-ID must be SEQ or SEQ:EPOCH (16 hex digits), as the server sent it",
            ));
        }
        None => resume_param(req).map_err(Refused::bad)?,
    };
    Ok(Opening {
        handover: Handover::Sse,
        subscribe: Some(Subscribe {
            channel: channel.to_string(),
            format: Format::Sse,
            resume,
            name: None,
            expires: grant.map(|g| g.expires),
            presence: None,
        }),
    })
}

impl Transport for SseState {
    super::one_subscription!();

    fn write_replay(
        &mut self,
        out: &mut Vec<u8>,
        replay: Replay,
        resume: Resume,
        deflater: &mut super::Deflater<'_>,
    ) -> super::Replayed {
        if self.sub.is_none() {
            return super::Replayed::Written(After::Nothing);
        }
        write_replay(out, replay, resume, deflater)
    }

    fn write_heartbeat(&self, out: &mut Vec<u8>) -> After {
        write_heartbeat(out);
        After::Nothing
    }

    /// The stream just ends and a browser reconnects by itself; an expired token
    /// is said first, since coming back with it would be refused.
    fn write_close(&mut self, out: &mut Vec<u8>, reason: CloseReason) {
        if reason == CloseReason::TokenExpired {
            write_expired(out);
        }
    }
}

/// The response head that opens the stream, and the reconnect delay. No length:
/// the stream ends when the connection does.
pub fn write_opening(out: &mut Vec<u8>) {
    out.extend_from_slice(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\n",
    );
    out.extend_from_slice(format!("retry: {RETRY_MS}\n\n").as_bytes());
}

/// The last event of a stream whose token expired (`event: expired`), before it
/// ends: the page must come back with a fresh token.
pub fn write_expired(out: &mut Vec<u8>) {
    json_event(
        out,
        "expired",
        &serde_json::json!({"reason": "token expired", "code": 4001}),
    );
}

/// A heartbeat: a comment line, which clients ignore and proxies see as traffic.
pub fn write_heartbeat(out: &mut Vec<u8>) {
    out.extend_from_slice(b":\n\n");
}

/// Appends one `data:` line per line of `text` (CR, LF and CRLF all end a line).
fn data_lines(out: &mut Vec<u8>, text: &[u8]) {
    let mut rest = text;
    loop {
        let end = rest.iter().position(|&b| b == b'\n' || b == b'\r');
        out.extend_from_slice(b"data: ");
        match end {
            None => {
                out.extend_from_slice(rest);
                out.push(b'\n');
                return;
            }
            Some(i) => {
                out.extend_from_slice(&rest[..i]);
                out.push(b'\n');
                let skip = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = &rest[i + skip..];
            }
        }
    }
}

/// One message as an event.
fn message_event(out: &mut Vec<u8>, seq: u64, epoch: u64, payload: &[u8], kind: DataKind) {
    // Seq 0 (published straight into Redis, never sequenced) has no id, so a
    // browser keeps resuming from the last message that had one.
    if seq != 0 {
        out.extend_from_slice(format!("id: {seq}:{epoch:016x}\n").as_bytes());
    }
    match kind {
        DataKind::Text => data_lines(out, payload),
        DataKind::Binary => {
            out.extend_from_slice(b"event: binary\n");
            data_lines(out, BASE64.encode(payload).as_bytes());
        }
    }
    out.push(b'\n');
}

/// A named event with a json body.
fn json_event(out: &mut Vec<u8>, event: &str, body: &serde_json::Value) {
    out.extend_from_slice(format!("event: {event}\n").as_bytes());
    data_lines(out, body.to_string().as_bytes());
    out.push(b'\n');
}

/// The message as an event, encoded once and shared by every SSE subscriber.
pub fn encode(message: &Message) -> Option<Bytes> {
    let mut out = Vec::new();
    match &message.body {
        Body::Data {
            seq,
            epoch,
            payload,
            kind,
            ..
        } => message_event(&mut out, *seq, *epoch, payload, *kind),
        Body::Event {
            event,
            client,
            count,
        } => json_event(
            &mut out,
            event,
            &serde_json::json!({ "client": &**client, "count": count }),
        ),
        Body::NewEpoch { epoch, next_seq } => json_event(
            &mut out,
            "gap",
            &serde_json::json!({
                "from": 1,
                "to": next_seq.saturating_sub(1),
                "reason": GapReason::NewEpoch.as_str(),
                "epoch": format!("{epoch:016x}"),
            }),
        ),
        // Pusher's presence: for Pusher subscribers only.
        Body::Presence { .. } | Body::CloseAll => return None,
    }
    Some(Bytes::from(out))
}

/// A returning client's catch-up: the gap if it cannot be given everything, then
/// every message history holds for it, with the same ids as live ones (past the
/// first slice, made as the socket takes them: [`super::replay`]).
pub fn write_replay(
    out: &mut Vec<u8>,
    replay: Replay,
    resume: Resume,
    deflater: &mut super::Deflater<'_>,
) -> super::Replayed {
    let (replay, gap) = replay.for_resume(resume);
    if let Some(gap) = gap {
        let body = serde_json::json!({
            "from": gap.from,
            "to": gap.to,
            "reason": gap.reason.as_str(),
            "epoch": format!("{:016x}", replay.epoch),
        });
        json_event(out, "gap", &body);
    }
    let epoch = replay.epoch;
    let encode = move |out: &mut Vec<u8>, m: &Stored, _: &mut TurnCounts| {
        message_event(out, m.seq, epoch, &m.payload, m.kind);
    };
    let shared = deflater.shared.cloned();
    ReplayFeed::new(replay.messages, shared, encode).start(out, deflater.counts)
}

/// Reads `Last-Event-ID` (or `since=` with an optional epoch): `SEQ` or `SEQ:EPOCH`.
pub fn parse_event_id(id: &str) -> Option<Resume> {
    let (seq, epoch) = match id.split_once(':') {
        Some((seq, epoch)) => {
            if epoch.len() != 16 || !epoch.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            (seq, Some(u64::from_str_radix(epoch, 16).ok()?))
        }
        None => (id, None),
    };
    Some(Resume {
        since: seq.trim().parse().ok()?,
        epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_a_payload_is_a_data_line() {
        let mut out = Vec::new();
        message_event(
            &mut out,
            7,
            0xab,
            b"one\ntwo\r\nthree\rfour",
            DataKind::Text,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "id: 7:00000000000000ab\ndata: one\ndata: two\ndata: three\ndata: four\n\n"
        );
        let mut out = Vec::new();
        message_event(&mut out, 1, 0, &[0, 255], DataKind::Binary);
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("event: binary\ndata: AP8=\n\n")
        );
    }

    #[test]
    fn event_ids_carry_the_seq_and_maybe_the_epoch() {
        assert_eq!(
            parse_event_id("12:00000000000000ff"),
            Some(Resume {
                since: 12,
                epoch: Some(255)
            })
        );
        assert_eq!(
            parse_event_id("12"),
            Some(Resume {
                since: 12,
                epoch: None
            })
        );
        for bad in ["", "x", "-1", "3:zz", "3:123"] {
            assert_eq!(parse_event_id(bad), None, "{bad}");
        }
    }
}
