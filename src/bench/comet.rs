//! The client side of the comet transports for push mode: reading a
//! `text/event-stream` (plain or chunked) into events, and reading one long-poll
//! answer (`{"messages":[{"seq","data"}],"next","epoch"}`).
//!
//! It owns parsing only: bytes in, events or answers out. It must not touch
//! sockets, counters or the run's timeline; the client loop feeds it what it read
//! and decides what each event means for the measurement.

use std::borrow::Cow;

use serde::Deserialize;

/// Longest SSE line (or event) the bench accepts from a server.
const MAX_LINE: usize = 16 * 1024 * 1024;
/// Longest chunk-size line of a chunked body (hex digits and extensions).
const MAX_CHUNK_LINE: usize = 1024;

/// Why a stream or an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CometError {
    #[error("sse: line longer than 16 MiB")]
    LineTooLong,
    #[error("sse: malformed chunked encoding ({0})")]
    BadChunk(&'static str),
    #[error("poll: malformed answer ({0})")]
    BadAnswer(String),
}

/// One dispatched server-sent event.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty for a plain message.
    pub kind: String,
    /// The `id:` field of this event, if it had one.
    pub id: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk-size line.
    Size,
    /// Inside a chunk: bytes left.
    Data(u64),
    /// The CRLF after a chunk's data: bytes left of it.
    DataEnd(u8),
    /// The last (zero) chunk was read: the stream is over.
    Done,
}

/// An event stream being read: the chunked decoding (when the response used it),
/// the line being assembled and the event being built.
#[derive(Debug, Default)]
pub struct SseReader {
    chunk: Option<Chunk>,
    chunk_line: Vec<u8>,
    line: Vec<u8>,
    /// The last byte fed was a CR that ended a line (a following LF belongs to it).
    after_cr: bool,
    event: SseEvent,
    has_data: bool,
}

impl SseReader {
    /// A reader for a body sent with `Transfer-Encoding: chunked` if `chunked`.
    pub fn new(chunked: bool) -> SseReader {
        SseReader {
            chunk: chunked.then_some(Chunk::Size),
            ..SseReader::default()
        }
    }

    /// Feeds body bytes; calls `on_event` for every complete event.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        on_event: &mut dyn FnMut(&SseEvent),
    ) -> Result<(), CometError> {
        if self.chunk.is_none() {
            return self.feed_body(bytes, on_event);
        }
        while !bytes.is_empty() {
            let Some(state) = self.chunk else {
                return Ok(());
            };
            match state {
                Chunk::Done => return Ok(()),
                Chunk::Size => {
                    let Some(nl) = bytes.iter().position(|&b| b == b'\n') else {
                        self.chunk_line.extend_from_slice(bytes);
                        if self.chunk_line.len() > MAX_CHUNK_LINE {
                            return Err(CometError::BadChunk("size line too long"));
                        }
                        return Ok(());
                    };
                    self.chunk_line.extend_from_slice(&bytes[..nl]);
                    bytes = &bytes[nl + 1..];
                    let size = chunk_size(&self.chunk_line)?;
                    self.chunk_line.clear();
                    self.chunk = Some(if size == 0 {
                        Chunk::Done
                    } else {
                        Chunk::Data(size)
                    });
                }
                Chunk::Data(left) => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
                    self.feed_body(&bytes[..take], on_event)?;
                    bytes = &bytes[take..];
                    let left = left - take as u64;
                    self.chunk = Some(if left == 0 {
                        Chunk::DataEnd(2)
                    } else {
                        Chunk::Data(left)
                    });
                }
                Chunk::DataEnd(left) => {
                    let expected: &[u8] = if left == 2 { b"\r\n" } else { b"\n" };
                    if bytes[0] != expected[0] {
                        return Err(CometError::BadChunk("no CRLF after a chunk"));
                    }
                    bytes = &bytes[1..];
                    self.chunk = Some(if left == 1 {
                        Chunk::Size
                    } else {
                        Chunk::DataEnd(1)
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether the server ended a chunked stream with its last chunk.
    pub fn ended(&self) -> bool {
        self.chunk == Some(Chunk::Done)
    }

    fn feed_body(
        &mut self,
        mut bytes: &[u8],
        on_event: &mut dyn FnMut(&SseEvent),
    ) -> Result<(), CometError> {
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') else {
                if self.line.len() + bytes.len() > MAX_LINE {
                    return Err(CometError::LineTooLong);
                }
                self.line.extend_from_slice(bytes);
                return Ok(());
            };
            self.after_cr = bytes[end] == b'\r';
            if self.line.is_empty() {
                self.on_line(&bytes[..end], on_event)?;
            } else {
                self.line.extend_from_slice(&bytes[..end]);
                let line = std::mem::take(&mut self.line);
                self.on_line(&line, on_event)?;
                self.line = line;
                self.line.clear();
            }
            bytes = &bytes[end + 1..];
        }
        Ok(())
    }

    fn on_line(
        &mut self,
        line: &[u8],
        on_event: &mut dyn FnMut(&SseEvent),
    ) -> Result<(), CometError> {
        if line.is_empty() {
            if self.has_data {
                // The spec drops the data's last newline; we never add it.
                on_event(&self.event);
            }
            self.event.kind.clear();
            self.event.data.clear();
            self.event.id = None;
            self.has_data = false;
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                if self.has_data {
                    self.event.data.push('\n');
                }
                if self.event.data.len() + value.len() > MAX_LINE {
                    return Err(CometError::LineTooLong);
                }
                self.event.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event.kind = value.into_owned(),
            b"id" => self.event.id = Some(value.into_owned()),
            // `retry` and unknown fields change nothing the bench measures.
            _ => {}
        }
        Ok(())
    }
}

/// The size in a chunk-size line (`1a;ext=1\r`).
fn chunk_size(line: &[u8]) -> Result<u64, CometError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let hex = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let text = std::str::from_utf8(hex).map_err(|_| CometError::BadChunk("size not hex"))?;
    u64::from_str_radix(text, 16).map_err(|_| CometError::BadChunk("size not hex"))
}

/// One message of a long-poll answer.
#[derive(Debug, Deserialize)]
pub struct PollMessage<'a> {
    pub seq: u64,
    #[serde(borrow)]
    pub data: Cow<'a, str>,
}

/// A whole long-poll answer.
#[derive(Debug, Deserialize)]
pub struct PollAnswer<'a> {
    #[serde(borrow)]
    pub messages: Vec<PollMessage<'a>>,
    /// The `since` of the next poll.
    pub next: u64,
    /// Present when the server could not give everything after `since`.
    #[serde(default)]
    pub gap: Option<serde_json::Value>,
}

impl<'a> PollAnswer<'a> {
    pub fn parse(body: &'a [u8]) -> Result<PollAnswer<'a>, CometError> {
        serde_json::from_slice(body).map_err(|e| CometError::BadAnswer(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(reader: &mut SseReader, parts: &[&[u8]]) -> Result<Vec<SseEvent>, CometError> {
        let mut got = Vec::new();
        for part in parts {
            reader.feed(part, &mut |e| got.push(e.clone()))?;
        }
        Ok(got)
    }

    #[test]
    fn plain_stream_split_anywhere_gives_the_same_events() {
        let stream = b"retry: 2000\n\n:\n\nid: 7:00ab\ndata: hello\ndata: world\n\nevent: gap\ndata: {\"from\":1}\r\n\r\nid: 8\rdata:x\r\r";
        let whole = events(&mut SseReader::new(false), &[stream]).unwrap();
        assert_eq!(
            whole,
            vec![
                SseEvent {
                    kind: String::new(),
                    id: Some("7:00ab".into()),
                    data: "hello\nworld".into()
                },
                SseEvent {
                    kind: "gap".into(),
                    id: None,
                    data: "{\"from\":1}".into()
                },
                SseEvent {
                    kind: String::new(),
                    id: Some("8".into()),
                    data: "x".into()
                },
            ]
        );
        for cut in 1..stream.len() {
            let (a, b) = stream.split_at(cut);
            let split = events(&mut SseReader::new(false), &[a, b]).unwrap();
            assert_eq!(split, whole, "cut at {cut}");
        }
    }

    #[test]
    fn chunked_stream_is_decoded_across_reads() {
        let body = b"id: 1\ndata: one\n\nid: 2\ndata: two\n\n";
        let mut chunked = Vec::new();
        chunked.extend_from_slice(format!("{:x};ext=1\r\n", 10).as_bytes());
        chunked.extend_from_slice(&body[..10]);
        chunked.extend_from_slice(b"\r\n");
        chunked.extend_from_slice(format!("{:X}\r\n", body.len() - 10).as_bytes());
        chunked.extend_from_slice(&body[10..]);
        chunked.extend_from_slice(b"\r\n0\r\n\r\n");
        for cut in 1..chunked.len() {
            let (a, b) = chunked.split_at(cut);
            let mut r = SseReader::new(true);
            let got = events(&mut r, &[a, b]).unwrap();
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[1].data, "two");
            assert!(r.ended());
        }
    }

    #[test]
    fn bad_chunks_are_errors() {
        let mut r = SseReader::new(true);
        assert_eq!(
            events(&mut r, &[b"zz\r\n"]),
            Err(CometError::BadChunk("size not hex"))
        );
        let mut r = SseReader::new(true);
        assert_eq!(
            events(&mut r, &[b"2\r\nabXY"]),
            Err(CometError::BadChunk("no CRLF after a chunk"))
        );
    }

    #[test]
    fn poll_answers_parse_or_say_why_not() {
        let a = PollAnswer::parse(
            br#"{"messages":[{"seq":4,"data":"12 1 x"}],"next":4,"epoch":"00000000000000ab"}"#,
        )
        .unwrap();
        assert_eq!(a.messages.len(), 1);
        assert_eq!((a.messages[0].seq, a.next), (4, 4));
        assert!(a.gap.is_none());
        let g = PollAnswer::parse(
            br#"{"messages":[],"next":9,"epoch":"01","gap":{"from":1,"to":3,"reason":"too old"}}"#,
        )
        .unwrap();
        assert!(g.gap.is_some());
        assert!(matches!(
            PollAnswer::parse(b"{\"next\":1"),
            Err(CometError::BadAnswer(_))
        ));
    }
}
