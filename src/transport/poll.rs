//! HTTP long-polling as a transport (MegaComet-style): `GET /poll/{channel}?since=SEQ`
//! is answered at once when history holds newer messages, else it waits (subscribed,
//! holding no buffer) until the next message or its timeout, and is answered with
//! one whole JSON response: `{"messages":[{"seq","data"}],"next":SEQ,"epoch":E}`
//! (plus `"gap"` when it cannot be given everything). A chat message also carries
//! `"from"`, its sender's name, whether it comes live or from history. `next` is the
//! `since` of the client's next poll, so a loop of polls misses nothing.
//!
//! A live answer is the same bytes for every poll waiting on the channel, encoded
//! once. Each answer closes its connection. This module must not own the socket or
//! keep time.

use bytes::Bytes;

use super::request::{
    Endpoint, Gate, Path, Refused, admit_get, query_param, resume_param, truncate,
};
use super::{
    After, CloseReason, Format, Handover, Opening, Subscribe, Subscription, Transport, json_data,
};
use crate::broker::{Gap, Replay, Resume};
use crate::hub::{Body, Message};
use crate::protocol::DataKind;
use crate::protocol::http::Request;

/// A waiting poll: its subscription, and what to answer if nothing comes.
#[derive(Debug, Default)]
pub struct PollState {
    pub sub: Option<Subscription>,
    /// The channel's last seq when the poll started waiting (its `next` if nothing
    /// comes), and the epoch it belongs to.
    pub since: u64,
    pub epoch: u64,
}

/// `GET /poll/{channel}`.
pub const ENDPOINTS: &[Endpoint] = &[Endpoint {
    path: Path::Prefix("/poll/"),
    open,
}];

/// Longest a long-poll may wait, in seconds.
const MAX_POLL_TIMEOUT: u64 = 60;
/// How long a long-poll waits when it does not say.
const DEFAULT_POLL_TIMEOUT: u64 = 30;

/// `GET /poll/{channel}?since=SEQ[&epoch=E]&timeout=S`: answered at once if anything
/// is newer than SEQ (0 when absent: everything history holds), else within S
/// seconds (default 30, at most 60).
fn open(req: &Request<'_>, channel: &str, gate: &dyn Gate) -> Result<Opening, Refused> {
    let grant = admit_get(req, channel, gate)?;
    let timeout = match query_param(req, "timeout") {
        None => DEFAULT_POLL_TIMEOUT,
        Some(v) => match v.parse::<u64>() {
            Ok(s) if s <= MAX_POLL_TIMEOUT => s,
            _ => {
                return Err(Refused::bad(format!(
                    "timeout must be whole seconds from 0 to {MAX_POLL_TIMEOUT}, not '{}'",
                    truncate(v, 40)
                )));
            }
        },
    };
    let resume = resume_param(req).map_err(Refused::bad)?.unwrap_or(Resume {
        since: 0,
        epoch: None,
    });
    Ok(Opening {
        handover: Handover::Poll {
            timeout: std::time::Duration::from_secs(timeout),
        },
        subscribe: Some(Subscribe {
            channel: channel.to_string(),
            format: Format::Poll,
            resume: Some(resume),
            name: None,
            expires: grant.map(|g| g.expires),
            presence: None,
        }),
    })
}

/// Boxed in its session: a waiting poll keeps what to answer on timeout, and the
/// record of every idle WebSocket stays small.
impl Transport for Box<PollState> {
    super::one_subscription!();

    fn write_replay(
        &mut self,
        out: &mut Vec<u8>,
        replay: Replay,
        resume: Resume,
        _: &mut super::Deflater<'_>,
    ) -> super::Replayed {
        super::Replayed::Written(write_replay(out, self, replay, resume))
    }

    /// Its heartbeat is its empty answer, after which it closes.
    fn write_heartbeat(&self, out: &mut Vec<u8>) -> After {
        write_timeout(out, self);
        After::Close
    }

    /// A waiting poll still gets its (empty) answer.
    fn write_close(&mut self, out: &mut Vec<u8>, _reason: CloseReason) {
        if self.sub.is_some() {
            write_timeout(out, self);
        }
    }
}

/// One message of an answer, as a borrowed view of a live or a kept message.
#[derive(Debug, Clone, Copy)]
struct Item<'a> {
    seq: u64,
    payload: &'a [u8],
    kind: DataKind,
    /// The chat client that sent it.
    from: Option<&'a str>,
    /// The event name it was published with.
    event: Option<&'a str>,
}

/// One message as an element of `messages`: `{"seq","data"[,"from"][,"name"]}`.
fn message_json(out: &mut Vec<u8>, item: Item<'_>) {
    out.extend_from_slice(format!("{{\"seq\":{},\"data\":", item.seq).as_bytes());
    json_data(out, item.payload, item.kind);
    if let Some(from) = item.from {
        out.extend_from_slice(b",\"from\":");
        // Serializing a str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, from);
    }
    if let Some(event) = item.event {
        out.extend_from_slice(b",\"name\":");
        let _ = serde_json::to_writer(&mut *out, event);
    }
    out.push(b'}');
}

/// A whole HTTP answer around a JSON body that already holds `messages`.
fn respond(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(body);
}

/// `{"messages":[…],"next":N,"epoch":E[,"gap":{…}]}` as a whole answer.
fn write_answer<'a>(
    out: &mut Vec<u8>,
    messages: impl Iterator<Item = Item<'a>>,
    next: u64,
    epoch: u64,
    gap: Option<Gap>,
) {
    let mut body = b"{\"messages\":[".to_vec();
    for (i, item) in messages.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        message_json(&mut body, item);
    }
    body.extend_from_slice(format!("],\"next\":{next},\"epoch\":\"{epoch:016x}\"").as_bytes());
    if let Some(gap) = gap {
        body.extend_from_slice(
            format!(
                ",\"gap\":{{\"from\":{},\"to\":{},\"reason\":\"{}\"}}",
                gap.from,
                gap.to,
                gap.reason.as_str()
            )
            .as_bytes(),
        );
    }
    body.push(b'}');
    respond(out, &body);
}

/// A live message as the answer to every poll waiting on its channel.
pub fn encode(message: &Message) -> Option<Bytes> {
    let Body::Data {
        seq,
        epoch,
        payload,
        kind,
        from,
        event,
        ..
    } = &message.body
    else {
        return None;
    };
    if *seq == 0 {
        // Published straight into Redis and never sequenced: a poll could not say
        // where to poll next, so polls do not get it.
        return None;
    }
    let item = Item {
        seq: *seq,
        payload,
        kind: *kind,
        from: from.as_deref(),
        event: event.as_deref(),
    };
    let mut out = Vec::new();
    write_answer(&mut out, std::iter::once(item), *seq, *epoch, None);
    Some(Bytes::from(out))
}

/// Most payload bytes one answer from history carries (always at least one
/// message): a reader is told `next` as the last seq carried and gets the rest
/// by polling again, so a request that is never read pins at most this much.
pub const ANSWER_BYTES: usize = 256 * 1024;

/// Answers at once when history holds something newer than `since` (or a gap must
/// be told), with at most [`ANSWER_BYTES`] of it; otherwise notes what to
/// answer on timeout and waits.
pub fn write_replay(
    out: &mut Vec<u8>,
    state: &mut PollState,
    replay: Replay,
    resume: Resume,
) -> After {
    let (replay, gap) = replay.for_resume(resume);
    if replay.messages.is_empty() && gap.is_none() {
        state.since = replay.last_seq;
        state.epoch = replay.epoch;
        return After::Nothing;
    }
    let mut carried = 0;
    let mut taken = 0;
    for m in &replay.messages {
        if taken > 0 && carried + m.payload.len() > ANSWER_BYTES {
            break;
        }
        carried += m.payload.len();
        taken += 1;
    }
    let messages = &replay.messages[..taken];
    let next = messages.last().map_or(replay.last_seq, |m| m.seq);
    let messages = messages.iter().map(|m| Item {
        seq: m.seq,
        payload: &m.payload,
        kind: m.kind,
        from: m.from.as_deref(),
        event: m.event.as_deref(),
    });
    write_answer(out, messages, next, replay.epoch, gap);
    After::Close
}

/// Nothing came in time (or the server is shutting down): the empty answer.
pub fn write_timeout(out: &mut Vec<u8>, state: &PollState) {
    write_answer(out, std::iter::empty(), state.since, state.epoch, None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::GapReason;

    fn body(out: &[u8]) -> serde_json::Value {
        let text = String::from_utf8_lossy(out);
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK") && head.contains("Connection: close"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn answers_carry_messages_next_epoch_and_gap() {
        let mut out = Vec::new();
        let item = |seq, payload, kind, from| Item {
            seq,
            payload,
            kind,
            from,
            event: None,
        };
        let messages = [
            item(4, &b"a\"b"[..], DataKind::Text, None),
            item(5, &[0u8, 255][..], DataKind::Binary, None),
            item(6, &b"hi"[..], DataKind::Text, Some("c12")),
        ];
        let gap = Gap {
            from: 2,
            to: 3,
            reason: GapReason::TooOld,
        };
        write_answer(&mut out, messages.into_iter(), 6, 0xab, Some(gap));
        assert_eq!(
            body(&out),
            serde_json::json!({
                "messages": [
                    {"seq": 4, "data": "a\"b"},
                    {"seq": 5, "data": "AP8=", "encoding": "base64"},
                    {"seq": 6, "data": "hi", "from": "c12"},
                ],
                "next": 6,
                "epoch": "00000000000000ab",
                "gap": {"from": 2, "to": 3, "reason": "too old"},
            })
        );
        let mut out = Vec::new();
        let waiting = PollState {
            sub: None,
            since: 9,
            epoch: 1,
        };
        write_timeout(&mut out, &waiting);
        assert_eq!(
            body(&out),
            serde_json::json!({"messages": [], "next": 9, "epoch": "0000000000000001"})
        );
    }

    #[test]
    fn chat_messages_say_who_sent_them_live_and_from_history() {
        use std::sync::Arc;

        use crate::broker::{Broker, Member, MemoryBroker, Outgoing};
        use crate::hub::{ConnRef, Hub};

        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let hub = Arc::new(Hub::new(vec![waker]));
        let limits = crate::history::Limits {
            size: 10,
            ttl: std::time::Duration::from_secs(60),
        };
        let broker = MemoryBroker::new(Arc::clone(&hub), limits, Default::default());
        let member = Member {
            conn: ConnRef {
                loop_index: 0,
                key: 1,
            },
            listens: false,
            announce: None,
            presence: None,
        };
        broker.subscribe("chat:r", member, None).unwrap();
        let said = Outgoing {
            payload: b"hello",
            kind: DataKind::Text,
            from: Some("c5"),
            event: None,
            skip: None,
        };
        broker.publish("chat:r", said).unwrap();
        let mut batch = Vec::new();
        hub.inbox(0).take(&mut batch);
        let live = encode(&batch[0]).unwrap();
        assert_eq!(
            body(&live)["messages"],
            serde_json::json!([{"seq": 1, "data": "hello", "from": "c5"}])
        );

        let replay = broker.history("chat:r", 0).unwrap();
        let resume = Resume {
            since: 0,
            epoch: None,
        };
        let mut out = Vec::new();
        let mut state = PollState::default();
        assert_eq!(
            write_replay(&mut out, &mut state, replay, resume),
            After::Close
        );
        assert_eq!(
            body(&out)["messages"],
            serde_json::json!([{"seq": 1, "data": "hello", "from": "c5"}])
        );
    }
}
