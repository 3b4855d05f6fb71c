//! HTTP long-polling as a transport (MegaComet-style): `GET /poll/{channel}?since=SEQ`
//! is answered at once when history holds newer messages, else it waits (subscribed,
//! holding no buffer) until the next message or its timeout, and is answered with
//! one whole JSON response: `{"messages":[{"seq","data"}],"next":SEQ,"epoch":E}`
//! (plus `"gap"` when it cannot be given everything). `next` is the `since` of the
//! client's next poll, so a loop of polls misses nothing.
//!
//! A live answer is the same bytes for every poll waiting on the channel, encoded
//! once. Each answer closes its connection. This module must not own the socket or
//! keep time.

use bytes::Bytes;

use super::{After, Subscription, json_data};
use crate::broker::{Gap, Replay, Resume};
use crate::hub::{Body, Message};
use crate::protocol::DataKind;

/// A waiting poll: its subscription, and what to answer if nothing comes.
#[derive(Debug, Default)]
pub struct PollState {
    pub sub: Option<Subscription>,
    /// The channel's last seq when the poll started waiting (its `next` if nothing
    /// comes), and the epoch it belongs to.
    pub since: u64,
    pub epoch: u64,
}

/// One message as an element of `messages`.
fn message_json(out: &mut Vec<u8>, seq: u64, payload: &[u8], kind: DataKind) {
    out.extend_from_slice(format!("{{\"seq\":{seq},\"data\":").as_bytes());
    json_data(out, payload, kind);
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
    messages: impl Iterator<Item = (u64, &'a [u8], DataKind)>,
    next: u64,
    epoch: u64,
    gap: Option<Gap>,
) {
    let mut body = b"{\"messages\":[".to_vec();
    for (i, (seq, payload, kind)) in messages.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        message_json(&mut body, seq, payload, kind);
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
        ..
    } = &message.body
    else {
        return None;
    };
    let mut out = Vec::new();
    write_answer(
        &mut out,
        std::iter::once((*seq, &payload[..], *kind)),
        *seq,
        *epoch,
        None,
    );
    Some(Bytes::from(out))
}

/// Answers at once when history holds something newer than `since` (or a gap must
/// be told); otherwise notes what to answer on timeout and waits.
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
    let next = replay.messages.last().map_or(replay.last_seq, |m| m.seq);
    let messages = replay
        .messages
        .iter()
        .map(|m| (m.seq, &m.payload[..], m.kind));
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
        let messages = [
            (4, &b"a\"b"[..], DataKind::Text),
            (5, &[0u8, 255][..], DataKind::Binary),
        ];
        let gap = Gap {
            from: 2,
            to: 3,
            reason: GapReason::TooOld,
        };
        write_answer(&mut out, messages.into_iter(), 5, 0xab, Some(gap));
        assert_eq!(
            body(&out),
            serde_json::json!({
                "messages": [
                    {"seq": 4, "data": "a\"b"},
                    {"seq": 5, "data": "AP8=", "encoding": "base64"},
                ],
                "next": 5,
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
}
