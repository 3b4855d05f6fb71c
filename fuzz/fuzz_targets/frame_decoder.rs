//! The RFC 6455 frame decoder: arbitrary bytes, fed whole, in chunks split where
//! the input says, and one byte at a time, must give the same events and the same
//! error (a read boundary must never change what the peer said), and every event
//! must respect the protocol's limits.
//!
//! Input: `flags, max, ncuts × (u16 LE cut), data`.
//! - flags bit 0: client role (unmasked server frames) instead of the server's;
//! - flags bit 1: stop at the first close frame, as the server does;
//! - flags bit 2: round trip instead: encode `data` as frames (fragmented at the
//!   cuts), decode them, and expect the message back (bit 6: as text);
//! - flags bits 3..5: how many cuts follow (0-7);
//! - flags bit 7 (server role): permessage-deflate was negotiated, so RSV1
//!   messages are inflated (within the same limit);
//! - max: the largest message, `max * 2` bytes (0-510), so the limit is hit often.

#![no_main]

use libfuzzer_sys::fuzz_target;
use throng::protocol::{
    DataKind, Decoder, Event, Flow, ProtocolError, encode_client_frame, encode_frame,
    is_valid_close_code, opcode,
};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Message(DataKind, Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>, String),
}

#[derive(Debug, PartialEq, Eq)]
enum End {
    /// All input consumed; whether the decoder is idle, frames and messages counted.
    Done {
        idle: bool,
        frames: u64,
        messages: u64,
    },
    /// The consumer stopped at a close frame.
    Stopped {
        frames: u64,
        messages: u64,
    },
    Failed(ProtocolError),
}

#[derive(Debug, PartialEq, Eq)]
struct Run {
    events: Vec<Ev>,
    end: End,
}

/// Checks one event against the protocol's limits and keeps an owned copy.
fn owned(event: Event<'_>, max: usize) -> Ev {
    match event {
        Event::Message { kind, payload } => {
            assert!(payload.len() <= max, "message of {} > {max}", payload.len());
            if kind == DataKind::Text {
                assert!(std::str::from_utf8(payload).is_ok(), "text is not UTF-8");
            }
            Ev::Message(kind, payload.to_vec())
        }
        Event::Ping(p) => {
            assert!(p.len() <= 125);
            Ev::Ping(p.to_vec())
        }
        Event::Pong(p) => {
            assert!(p.len() <= 125);
            Ev::Pong(p.to_vec())
        }
        Event::Close { code, reason } => {
            match code {
                Some(code) => assert!(is_valid_close_code(code), "close code {code}"),
                None => assert!(reason.is_empty()),
            }
            assert!(reason.len() <= 123);
            Ev::Close(code, reason.to_string())
        }
    }
}

/// Feeds `data` cut at `cuts` (sorted, may repeat: empty reads) to a new decoder.
fn run(
    data: &[u8],
    cuts: &[usize],
    (client, inflates): (bool, bool),
    max: usize,
    stop_on_close: bool,
) -> Run {
    let mut decoder = if client {
        Decoder::client()
    } else if inflates {
        Decoder::inflating()
    } else {
        Decoder::default()
    };
    let mut events = Vec::new();
    let (mut frames, mut messages) = (0, 0);
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&data.len())) {
        let mut chunk = data[start..end].to_vec();
        start = end;
        let mut stopped = false;
        let before = events.len();
        let result = decoder.feed(&mut chunk, max, |event| {
            let event = owned(event, max);
            let is_close = matches!(event, Ev::Close(..));
            events.push(event);
            if is_close && stop_on_close {
                stopped = true;
                Flow::Stop
            } else {
                Flow::Continue
            }
        });
        match result {
            Ok(stats) => {
                let delivered = events[before..]
                    .iter()
                    .filter(|e| matches!(e, Ev::Message(..)))
                    .count() as u64;
                assert_eq!(stats.messages, delivered);
                assert!(stats.frames >= (events.len() - before) as u64);
                frames += stats.frames;
                messages += stats.messages;
                if stopped {
                    return Run {
                        events,
                        end: End::Stopped { frames, messages },
                    };
                }
            }
            Err(e) => {
                assert!(matches!(e.close_code(), 1002 | 1007 | 1009), "{e:?}");
                if let ProtocolError::MessageTooBig { limit } = e {
                    assert_eq!(limit, max);
                }
                return Run {
                    events,
                    end: End::Failed(e),
                };
            }
        }
    }
    Run {
        events,
        end: End::Done {
            idle: decoder.is_idle(),
            frames,
            messages,
        },
    }
}

/// Encodes `payload` as one message fragmented at `cuts`, decodes it whole and
/// byte by byte, and expects it back.
fn round_trip(payload: &[u8], cuts: &[usize], client: bool, text: bool, mask: [u8; 4]) {
    let kind = if text {
        DataKind::Text
    } else {
        DataKind::Binary
    };
    let mut wire = Vec::new();
    let mut start = 0;
    let ends: Vec<usize> = cuts
        .iter()
        .copied()
        .chain(std::iter::once(payload.len()))
        .collect();
    for (i, &end) in ends.iter().enumerate() {
        let op = if i == 0 {
            kind.opcode()
        } else {
            opcode::CONTINUATION
        };
        let fin = i == ends.len() - 1;
        let part = &payload[start..end];
        if client {
            // A server frame: unmasked, always whole (the server never fragments).
            if i == 0 {
                encode_frame(&mut wire, kind.opcode(), payload);
            }
        } else {
            encode_client_frame(&mut wire, op, fin, part, mask);
        }
        // A ping between fragments must not disturb the message.
        if !client && !fin {
            encode_client_frame(&mut wire, opcode::PING, true, b"p", mask);
        }
        start = end;
    }
    let frames = if client { 1 } else { 2 * ends.len() as u64 - 1 };
    let pings = if client { 0 } else { ends.len() - 1 };
    let max = payload.len();
    let bytewise: Vec<usize> = (1..wire.len()).collect();
    for cuts in [&[][..], &bytewise[..]] {
        let got = run(&wire, cuts, (client, false), max, false);
        let valid = !text || std::str::from_utf8(payload).is_ok();
        if valid {
            let mut want = vec![Ev::Ping(b"p".to_vec()); pings];
            want.push(Ev::Message(kind, payload.to_vec()));
            assert_eq!(got.events, want);
            assert_eq!(
                got.end,
                End::Done {
                    idle: true,
                    frames,
                    messages: 1
                }
            );
        } else {
            assert_eq!(got.end, End::Failed(ProtocolError::InvalidUtf8));
        }
    }
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 {
        return;
    }
    let flags = input[0];
    let max = usize::from(input[1]) * 2;
    let client = flags & 1 != 0;
    let stop_on_close = flags & 2 != 0;
    let ncuts = usize::from((flags >> 3) & 7);
    let rest = &input[2..];
    if rest.len() < ncuts * 2 {
        return;
    }
    let (cut_bytes, data) = rest.split_at(ncuts * 2);
    let mut cuts: Vec<usize> = cut_bytes
        .chunks_exact(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (data.len() + 1))
        .collect();
    cuts.sort_unstable();

    if flags & 4 != 0 {
        round_trip(
            data,
            &cuts,
            client,
            flags & 0x40 != 0,
            [input[1], 0x5a, flags, 0xc3],
        );
        return;
    }

    let role = (client, flags & 0x80 != 0);
    let whole = run(data, &[], role, max, stop_on_close);
    let split = run(data, &cuts, role, max, stop_on_close);
    assert_eq!(whole, split, "cuts {cuts:?} changed the result");
    let bytewise: Vec<usize> = (1..data.len()).collect();
    let by_byte = run(data, &bytewise, role, max, stop_on_close);
    assert_eq!(whole, by_byte, "byte-by-byte reads changed the result");
});
