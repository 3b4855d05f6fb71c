//! Unit tests of the frame codec: every malformed input we could think of, fed whole
//! and split at every byte boundary.

use super::*;

const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
const LIMIT: usize = 1024;

#[derive(Debug, PartialEq, Eq)]
enum Owned {
    Message(DataKind, Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>, String),
}

fn own(event: Event<'_>) -> Owned {
    match event {
        Event::Message { kind, payload } => Owned::Message(kind, payload.to_vec()),
        Event::Ping(p) => Owned::Ping(p.to_vec()),
        Event::Pong(p) => Owned::Pong(p.to_vec()),
        Event::Close { code, reason } => Owned::Close(code, reason.to_string()),
    }
}

fn frame(op: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_client_frame(&mut out, op, fin, payload, MASK);
    out
}

/// Feeds `input` in pieces of `step` bytes; returns events and the first error.
fn feed_in_steps(input: &[u8], step: usize) -> (Vec<Owned>, Option<ProtocolError>, Decoder) {
    let mut decoder = Decoder::default();
    let mut events = Vec::new();
    for piece in input.chunks(step.max(1)) {
        let mut piece = piece.to_vec();
        match decoder.feed(&mut piece, LIMIT, |e| {
            events.push(own(e));
            Flow::Continue
        }) {
            Ok(_) => {}
            Err(e) => return (events, Some(e), decoder),
        }
    }
    (events, None, decoder)
}

/// The same outcome whatever the read boundaries are.
fn feed_all_ways(input: &[u8]) -> (Vec<Owned>, Option<ProtocolError>) {
    let (events, err, _) = feed_in_steps(input, input.len());
    for step in 1..input.len().min(40) {
        let (e2, err2, _) = feed_in_steps(input, step);
        assert_eq!(err2, err, "step {step}");
        if err.is_none() {
            assert_eq!(e2, events, "step {step}");
        }
    }
    (events, err)
}

#[test]
fn single_text_and_binary_messages() {
    let mut input = frame(opcode::TEXT, true, b"hello");
    input.extend(frame(opcode::BINARY, true, &[0, 1, 2, 255]));
    let (events, err) = feed_all_ways(&input);
    assert_eq!(err, None);
    assert_eq!(
        events,
        vec![
            Owned::Message(DataKind::Text, b"hello".to_vec()),
            Owned::Message(DataKind::Binary, vec![0, 1, 2, 255]),
        ]
    );
}

#[test]
fn decoder_is_idle_after_whole_frames_and_busy_inside_one() {
    let input = frame(opcode::TEXT, true, b"hello");
    let (_, _, decoder) = feed_in_steps(&input, input.len());
    assert!(decoder.is_idle());
    assert_eq!(decoder.buffered_bytes(), 0);
    let (_, _, decoder) = feed_in_steps(&input[..input.len() - 1], 100);
    assert!(!decoder.is_idle());
    let (_, _, decoder) = feed_in_steps(&input[..1], 100);
    assert!(!decoder.is_idle());
}

#[test]
fn extended_lengths_16_and_64_bit() {
    let medium = vec![b'a'; 300];
    let (events, err) = feed_all_ways(&frame(opcode::TEXT, true, &medium));
    assert_eq!(err, None);
    assert_eq!(events, vec![Owned::Message(DataKind::Text, medium)]);

    let big = vec![7u8; 70_000];
    let mut decoder = Decoder::default();
    let mut input = frame(opcode::BINARY, true, &big);
    let mut got = None;
    decoder
        .feed(&mut input, 100_000, |e| {
            got = Some(own(e));
            Flow::Continue
        })
        .unwrap();
    assert_eq!(got, Some(Owned::Message(DataKind::Binary, big)));
}

#[test]
fn fragments_with_control_frames_between_them() {
    let mut input = frame(opcode::TEXT, false, b"frag");
    input.extend(frame(opcode::PING, true, b"p"));
    input.extend(frame(opcode::CONTINUATION, false, b"men"));
    input.extend(frame(opcode::PONG, true, b""));
    input.extend(frame(opcode::CONTINUATION, true, b"ted"));
    let (events, err) = feed_all_ways(&input);
    assert_eq!(err, None);
    assert_eq!(
        events,
        vec![
            Owned::Ping(b"p".to_vec()),
            Owned::Pong(vec![]),
            Owned::Message(DataKind::Text, b"fragmented".to_vec()),
        ]
    );
}

#[test]
fn empty_messages_and_empty_fragments() {
    let mut input = frame(opcode::TEXT, true, b"");
    input.extend(frame(opcode::BINARY, false, b""));
    input.extend(frame(opcode::CONTINUATION, true, b""));
    let (events, err) = feed_all_ways(&input);
    assert_eq!(err, None);
    assert_eq!(
        events,
        vec![
            Owned::Message(DataKind::Text, vec![]),
            Owned::Message(DataKind::Binary, vec![]),
        ]
    );
}

#[test]
fn feed_stats_count_frames_and_messages() {
    let mut input = frame(opcode::TEXT, false, b"a");
    input.extend(frame(opcode::PING, true, b""));
    input.extend(frame(opcode::CONTINUATION, true, b"b"));
    let mut decoder = Decoder::default();
    let stats = decoder.feed(&mut input, LIMIT, |_| Flow::Continue).unwrap();
    assert_eq!(
        stats,
        FeedStats {
            frames: 3,
            messages: 1
        }
    );
}

#[test]
fn close_frames_parse_code_and_reason() {
    let mut payload = 1000u16.to_be_bytes().to_vec();
    payload.extend_from_slice("bye ✓".as_bytes());
    let (events, err) = feed_all_ways(&frame(opcode::CLOSE, true, &payload));
    assert_eq!(err, None);
    assert_eq!(events, vec![Owned::Close(Some(1000), "bye ✓".into())]);
    let (events, _) = feed_all_ways(&frame(opcode::CLOSE, true, b""));
    assert_eq!(events, vec![Owned::Close(None, String::new())]);
}

#[test]
fn stop_ignores_what_follows() {
    let mut input = frame(opcode::CLOSE, true, b"");
    input.extend(frame(opcode::TEXT, true, b"after"));
    let mut decoder = Decoder::default();
    let mut count = 0;
    decoder
        .feed(&mut input, LIMIT, |_| {
            count += 1;
            Flow::Stop
        })
        .unwrap();
    assert_eq!(count, 1);
}

fn error_of(input: &[u8]) -> ProtocolError {
    let (_, err) = feed_all_ways(input);
    err.expect("expected a protocol error")
}

#[test]
fn malformed_frames_fail_with_the_right_close_code() {
    let mut rsv = frame(opcode::TEXT, true, b"x");
    rsv[0] |= 0x40;
    assert_eq!(error_of(&rsv), ProtocolError::ReservedBits);

    for op in [3u8, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF] {
        assert_eq!(
            error_of(&frame(op, true, b"")),
            ProtocolError::ReservedOpcode(op)
        );
    }

    let unmasked = [0x81, 0x01, b'x'];
    assert_eq!(error_of(&unmasked), ProtocolError::Unmasked);

    assert_eq!(
        error_of(&frame(opcode::PING, false, b"")),
        ProtocolError::FragmentedControl
    );
    assert_eq!(
        error_of(&frame(opcode::PING, true, &[0; 126])),
        ProtocolError::ControlTooLong
    );
    assert_eq!(
        error_of(&frame(opcode::CONTINUATION, true, b"x")),
        ProtocolError::UnexpectedContinuation
    );
    let mut two_starts = frame(opcode::TEXT, false, b"a");
    two_starts.extend(frame(opcode::TEXT, true, b"b"));
    assert_eq!(error_of(&two_starts), ProtocolError::ExpectedContinuation);

    let mut huge = vec![0x82, 0xFF];
    huge.extend_from_slice(&(1u64 << 63).to_be_bytes());
    huge.extend_from_slice(&MASK);
    assert_eq!(error_of(&huge), ProtocolError::BadLength);

    for e in [
        ProtocolError::ReservedBits,
        ProtocolError::Unmasked,
        ProtocolError::ControlTooLong,
    ] {
        assert_eq!(e.close_code(), close_code::PROTOCOL_ERROR);
    }
}

#[test]
fn oversized_messages_fail_with_1009_before_the_payload_arrives() {
    // Header alone announces too much: rejected before any payload is buffered.
    let input = frame(opcode::BINARY, true, &vec![0; LIMIT + 1]);
    let mut header_only = input[..8].to_vec();
    let err = Decoder::default()
        .feed(&mut header_only, LIMIT, |_| Flow::Continue)
        .unwrap_err();
    assert_eq!(err, ProtocolError::MessageTooBig { limit: LIMIT });
    assert_eq!(err.close_code(), close_code::MESSAGE_TOO_BIG);

    // Fragments that add up to too much.
    let mut parts = frame(opcode::TEXT, false, &vec![b'a'; LIMIT / 2 + 1]);
    parts.extend(frame(opcode::CONTINUATION, true, &vec![b'a'; LIMIT / 2]));
    assert_eq!(
        error_of(&parts),
        ProtocolError::MessageTooBig { limit: LIMIT }
    );

    // Exactly at the limit is fine.
    let (_, err) = feed_all_ways(&frame(opcode::BINARY, true, &vec![1; LIMIT]));
    assert_eq!(err, None);
}

#[test]
fn invalid_utf8_fails_with_1007() {
    let err = error_of(&frame(opcode::TEXT, true, &[0xce, 0xba, 0xff]));
    assert_eq!(err, ProtocolError::InvalidUtf8);
    assert_eq!(err.close_code(), close_code::INVALID_PAYLOAD);

    // A character split across fragments is fine...
    let snowman = "☃".as_bytes();
    let mut split = frame(opcode::TEXT, false, &snowman[..1]);
    split.extend(frame(opcode::CONTINUATION, true, &snowman[1..]));
    let (events, err) = feed_all_ways(&split);
    assert_eq!(err, None);
    assert_eq!(
        events,
        vec![Owned::Message(DataKind::Text, snowman.to_vec())]
    );

    // ...but a message may not end inside one.
    let truncated = frame(opcode::TEXT, true, &snowman[..2]);
    assert_eq!(error_of(&truncated), ProtocolError::InvalidUtf8);
    let mut truncated_fragments = frame(opcode::TEXT, false, b"ok");
    truncated_fragments.extend(frame(opcode::CONTINUATION, true, &snowman[..2]));
    assert_eq!(error_of(&truncated_fragments), ProtocolError::InvalidUtf8);

    // Binary is never checked.
    let (_, err) = feed_all_ways(&frame(opcode::BINARY, true, &[0xff, 0xfe]));
    assert_eq!(err, None);
}

#[test]
fn invalid_utf8_fails_fast_before_the_message_ends() {
    // First fragment already holds an impossible byte: fail without waiting for more.
    let mut input = frame(opcode::TEXT, false, b"ok\xff");
    let err = Decoder::default()
        .feed(&mut input, LIMIT, |_| Flow::Continue)
        .unwrap_err();
    assert_eq!(err, ProtocolError::InvalidUtf8);

    // Inside a single frame whose payload is still arriving.
    let whole = frame(opcode::TEXT, true, b"abc\xffdefghijklmnop");
    let mut decoder = Decoder::default();
    let mut first = whole[..10].to_vec();
    assert_eq!(
        decoder.feed(&mut first, LIMIT, |_| Flow::Continue),
        Err(ProtocolError::InvalidUtf8)
    );
}

#[test]
fn close_payload_validation() {
    assert_eq!(
        error_of(&frame(opcode::CLOSE, true, &[3])),
        ProtocolError::CloseTooShort
    );
    for code in [
        0u16, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000,
    ] {
        assert_eq!(
            error_of(&frame(opcode::CLOSE, true, &code.to_be_bytes())),
            ProtocolError::InvalidCloseCode(code),
            "code {code}"
        );
    }
    for code in [
        1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999,
    ] {
        let (_, err) = feed_all_ways(&frame(opcode::CLOSE, true, &code.to_be_bytes()));
        assert_eq!(err, None, "code {code}");
    }
    let mut bad_reason = 1000u16.to_be_bytes().to_vec();
    bad_reason.extend_from_slice(&[0xff]);
    assert_eq!(
        error_of(&frame(opcode::CLOSE, true, &bad_reason)),
        ProtocolError::InvalidCloseReason
    );
}

#[test]
fn mask_resumes_at_any_offset() {
    let payload: Vec<u8> = (0..=255u8).collect();
    let mut whole = payload.clone();
    apply_mask(&mut whole, MASK, 0);
    for split in 0..payload.len() {
        let mut parts = payload.clone();
        let (a, b) = parts.split_at_mut(split);
        let offset = apply_mask(a, MASK, 0);
        apply_mask(b, MASK, offset);
        assert_eq!(parts, whole, "split {split}");
    }
}

#[test]
fn server_frames_encode_all_length_forms() {
    for len in [0usize, 125, 126, 65_535, 65_536] {
        let mut out = Vec::new();
        encode_frame(&mut out, opcode::BINARY, &vec![9; len]);
        let header = match len {
            0..=125 => 2,
            126..=65_535 => 4,
            _ => 10,
        };
        assert_eq!(out.len(), header + len);
        assert_eq!(out[0], 0x82);
    }
    let mut close = Vec::new();
    encode_close(&mut close, 1001, &"é".repeat(100));
    assert!(close.len() <= 2 + 125);
    assert!(std::str::from_utf8(&close[4..]).is_ok());
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A cheap deterministic fuzz: random-ish bytes must yield events or an error.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let len = (state % 64) as usize;
        let mut bytes = Vec::with_capacity(len);
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bytes.push(state as u8);
        }
        // Mostly masked frames so the decoder gets past the first checks.
        if let Some(b) = bytes.get_mut(1) {
            *b |= 0x80;
        }
        let _ = feed_in_steps(&bytes, 1 + (state % 7) as usize);
    }
}

#[test]
fn client_role_reads_unmasked_server_frames_and_refuses_masked_ones() {
    let mut server_frame = Vec::new();
    encode_frame(&mut server_frame, opcode::TEXT, b"from server");
    let mut decoder = Decoder::client();
    let mut got = Vec::new();
    decoder
        .feed(&mut server_frame, LIMIT, |e| {
            got.push(own(e));
            Flow::Continue
        })
        .unwrap();
    assert_eq!(
        got,
        vec![Owned::Message(DataKind::Text, b"from server".to_vec())]
    );
    // Split at every byte too.
    let mut whole = Vec::new();
    encode_frame(&mut whole, opcode::BINARY, &[7; 300]);
    let mut decoder = Decoder::client();
    let mut count = 0;
    for byte in whole.chunks(1) {
        let mut b = byte.to_vec();
        decoder
            .feed(&mut b, LIMIT, |_| {
                count += 1;
                Flow::Continue
            })
            .unwrap();
    }
    assert_eq!(count, 1);
    let mut masked = frame(opcode::TEXT, true, b"x");
    assert_eq!(
        Decoder::client().feed(&mut masked, LIMIT, |_| Flow::Continue),
        Err(ProtocolError::MaskedFromServer)
    );
}
