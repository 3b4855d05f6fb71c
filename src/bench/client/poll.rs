//! The client side of long-polling: each poll's GET (`since` the last answer's
//! `next`; the first only asks where the channel is), finding a whole answer in
//! the bytes read, counting its messages, and polling again.
//!
//! Parsing an answer's JSON is `bench::comet`'s. It must not touch the other
//! transports' connections.

use std::io;

use super::conn::{ReadState, State, send};
use super::delivery::{observe_delivery, unix_nanos};
use super::plan::{with_query, without_param};
use super::{ClientLoop, MAX_MESSAGE, MAX_RESPONSE_HEAD, phase};
use crate::bench::comet::PollAnswer;

/// Where the body of a long-poll answer lies in `bytes` once it is all there:
/// `Ok(None)` while more is to come; `closed` when the server has closed, which
/// ends a body sent without a length.
pub(super) fn poll_answer_bounds(
    bytes: &[u8],
    closed: bool,
) -> Result<Option<std::ops::Range<usize>>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let used = match resp.parse(bytes) {
        Ok(httparse::Status::Complete(used)) => used,
        Ok(httparse::Status::Partial) => {
            if bytes.len() > MAX_RESPONSE_HEAD {
                return Err("poll: response head too large".into());
            }
            return Ok(None);
        }
        Err(e) => return Err(format!("poll: malformed response ({e})")),
    };
    let status = resp.code.unwrap_or(0);
    if status != 200 {
        return Err(format!("poll: status {status}"));
    }
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && !h.value.trim_ascii().eq_ignore_ascii_case(b"identity")
    });
    if chunked {
        return Err("poll: chunked answers are not supported (send Content-Length)".into());
    }
    let length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| {
            std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| "poll: bad Content-Length".to_string())
        })
        .transpose()?;
    let end = match length {
        Some(len) => Some(
            used.checked_add(len)
                .filter(|&end| end <= MAX_MESSAGE + MAX_RESPONSE_HEAD)
                .ok_or_else(|| "poll: answer too large".to_string())?,
        ),
        None => None,
    };
    match end {
        Some(end) if bytes.len() >= end => Ok(Some(used..end)),
        Some(_) if closed => Err("poll: closed before the answer".into()),
        Some(_) => Ok(None),
        None if closed => Ok(Some(used..bytes.len())),
        None => Ok(None),
    }
}

impl ClientLoop {
    /// Sends the next long-poll GET (`since` the last answer's `next`; the first
    /// one only asks where the channel is).
    pub(super) fn send_poll(&mut self, key: usize) -> io::Result<()> {
        let Some(conn) = self.conns.get_mut(key) else {
            return Ok(());
        };
        let host = &self.plan.host_header;
        let mut path = self.plan.path_for(u64::from(conn.index)).into_owned();
        let first = conn.cursor.is_none();
        match conn.cursor {
            Some(since) => path = with_query(&path, "since", since),
            // The first poll only asks where the channel is (answered at
            // once); what history holds from before the run is not counted.
            None => path = with_query(&without_param(&path, "timeout"), "timeout", 0),
        }
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\nUser-Agent: throng-bench\r\n\r\n",
        );
        conn.read = Some(Box::new(ReadState::Poll(Vec::new())));
        if first {
            conn.state = State::Handshake;
        } else {
            // A waiting poll is an open subscriber: the server holds it.
            self.mark_open(key);
        }
        match self.conns.get_mut(key) {
            Some(conn) => send(conn, request.as_bytes()),
            None => Ok(()),
        }
    }

    /// Takes long-poll answer bytes `buf[..n]`; a whole answer is counted and the
    /// next poll sent.
    pub(super) fn on_poll(&mut self, key: usize, n: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let Some(ReadState::Poll(bytes)) = conn.read.as_deref_mut() else {
            return false;
        };
        bytes.extend_from_slice(&self.buf[..n]);
        if bytes.len() > MAX_MESSAGE + MAX_RESPONSE_HEAD {
            self.remove(key, Some("poll: answer too large".into()));
            return false;
        }
        match poll_answer_bounds(bytes, false) {
            Ok(Some(body)) => self.on_poll_answer(key, body),
            Ok(None) => true,
            Err(why) if why.starts_with("poll: status 5") => {
                self.lost(key, why);
                false
            }
            Err(why) => {
                self.remove(key, Some(why));
                false
            }
        }
    }

    /// The server closed a poll: an answer without a length ends here.
    pub(super) fn on_poll_end(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Some(ReadState::Poll(bytes)) = conn.read.as_deref_mut() else {
            return self.lost(key, "poll: closed before the answer".into());
        };
        match poll_answer_bounds(bytes, true) {
            Ok(Some(body)) => {
                self.on_poll_answer(key, body);
            }
            Ok(None) => self.lost(key, "poll: closed before the answer".into()),
            Err(why) if why.starts_with("poll: status 5") || why.contains("closed before") => {
                self.lost(key, why)
            }
            Err(why) => self.remove(key, Some(why)),
        }
    }

    /// Counts a whole answer (body at `body` of the read bytes) and polls again.
    fn on_poll_answer(&mut self, key: usize, body: std::ops::Range<usize>) -> bool {
        let ClientLoop { conns, tally, .. } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        let bytes = match conn.read.take().map(|b| *b) {
            Some(ReadState::Poll(bytes)) => bytes,
            _ => {
                self.remove(key, Some("poll: answer without a request".into()));
                return false;
            }
        };
        let Some(text) = bytes.get(body) else {
            self.remove(key, Some("poll: bad Content-Length".into()));
            return false;
        };
        let answer = match PollAnswer::parse(text) {
            Ok(a) => a,
            Err(e) => {
                self.remove(key, Some(e.to_string()));
                return false;
            }
        };
        tally.c.frames_in += 1;
        self.came_back(key);
        let ClientLoop {
            conns,
            tally,
            plan,
            seen_phase,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key) else {
            return false;
        };
        // The first answer only tells where the channel is: what history held from
        // before the run is not this run's.
        if conn.cursor.is_some() {
            let now_unix = unix_nanos();
            for m in &answer.messages {
                tally.c.messages_in += 1;
                observe_delivery(
                    tally,
                    &mut conn.track,
                    plan.seq_from,
                    Some(m.seq),
                    &m.data,
                    now_unix,
                );
            }
            if answer.gap.is_some() {
                tally.seq.reported_gaps += 1;
            }
        }
        conn.cursor = Some(answer.next);
        if *seen_phase >= phase::CLOSE {
            return false;
        }
        self.reopen(key)
    }
}
