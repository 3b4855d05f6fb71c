//! Echo, chat, json envelopes, closes and compression of the WebSocket transport.

use std::sync::Arc;

use super::*;
use crate::broker::{Broker, Member, MemoryBroker};
use crate::config::ServeConfig;
use crate::hub::{ConnRef, Hub};
use crate::protocol::encode_client_frame;
use crate::rules::ChannelRules;
use crate::stats::TurnCounts;

/// A broker over a one-loop hub, and a member of `chat:r` listening on it.
fn chat_room() -> (MemoryBroker, Arc<Hub>, mio::Poll) {
    let poll = mio::Poll::new().unwrap();
    let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
    let hub = Arc::new(Hub::new(vec![waker]));
    let history = crate::history::Limits {
        size: 0,
        ttl: std::time::Duration::ZERO,
    };
    let broker = MemoryBroker::new(Arc::clone(&hub), history, Default::default());
    (broker, hub, poll)
}

/// Feeds client frames to a WebSocket in `state`; returns the answer bytes.
fn feed_frames(
    state: &mut WsState,
    frames: &[(u8, &[u8])],
    broker: &dyn Broker,
    config: &ServeConfig,
) -> (Vec<u8>, After) {
    let mut input = Vec::new();
    for (op, payload) in frames {
        encode_client_frame(&mut input, *op, true, payload, [1, 2, 3, 4]);
    }
    let mut out = Vec::new();
    let mut counts = TurnCounts::default();
    let mut ctx = Ctx {
        ticket: crate::broker::asked::Ticket {
            loop_index: 0,
            key: 0,
            serial: 0,
            asker: crate::broker::asked::Asker::Request,
        },
        out: &mut out,
        broker,
        config,
        hooks: None,
        counts: &mut counts,
        chosen_name: None,
        changes: &mut Vec::new(),
        deflate: 0,
        chat: &mut crate::rate::ChatLimiter::default(),
    };
    let after = feed(state, &mut input, &mut ctx);
    (out, after)
}

fn subscriber(broker: &MemoryBroker, channel: &str) -> WsState {
    let member = Member {
        conn: ConnRef {
            loop_index: 0,
            key: 1,
        },
        listens: true,
        announce: None,
        presence: None,
    };
    let joined = broker.subscribe(channel, member, None).unwrap();
    WsState::new(Some(Subscription {
        channel: joined.channel,
        client: 7,
        expires: 0,
        index: 0,
        format: Format::WsJson,
        rules: ChannelRules::for_name(channel),
    }))
}

#[test]
fn echo_answers_each_message_with_the_prefix_and_pings_with_pongs() {
    let (broker, _hub, _poll) = chat_room();
    let config = ServeConfig {
        echo_prefix: "> ".into(),
        ..ServeConfig::default()
    };
    let mut state = WsState::default();
    let frames: [(u8, &[u8]); 3] = [
        (opcode::TEXT, b"hi"),
        (opcode::PING, b"p"),
        (opcode::BINARY, &[0, 1]),
    ];
    let (out, after) = feed_frames(&mut state, &frames, &broker, &config);
    assert_eq!(after, After::Nothing);
    assert_eq!(out, b"\x81\x04> hi\x8a\x01p\x82\x02\x00\x01");
}

#[test]
fn a_chat_member_publishes_in_its_name_and_a_push_subscriber_is_refused() {
    let (broker, hub, _poll) = chat_room();
    let config = ServeConfig::default();
    let mut member = subscriber(&broker, "chat:r");
    let (out, after) = feed_frames(&mut member, &[(opcode::TEXT, b"yo")], &broker, &config);
    assert_eq!((out.len(), after), (0, After::Nothing));
    let mut batch = Vec::new();
    hub.inbox(0).take(&mut batch);
    let frame = Format::WsJson.frame(&batch[0]).unwrap();
    let text = String::from_utf8_lossy(&frame[2..]).into_owned();
    assert!(
        text.contains(r#""seq":1"#) && text.contains(r#""from":"c7""#),
        "{text}"
    );

    let mut pushed = subscriber(&broker, "news");
    let (out, after) = feed_frames(&mut pushed, &[(opcode::TEXT, b"no")], &broker, &config);
    assert_eq!(after, After::Close);
    assert_eq!(&out[2..4], &close_code::POLICY_VIOLATION.to_be_bytes());
    assert!(String::from_utf8_lossy(&out).contains("push-only"));
    assert_eq!(broker.channel_info("news").last_seq, 0);
}

/// The payloads of the short server frames in `out`.
fn frame_payloads(mut out: &[u8]) -> Vec<&[u8]> {
    let mut payloads = Vec::new();
    while out.len() >= 2 {
        let len = usize::from(out[1]);
        assert!(len < 126, "a short frame");
        payloads.push(&out[2..2 + len]);
        out = &out[2 + len..];
    }
    payloads
}

#[test]
fn a_replayed_chat_message_says_who_sent_it_in_json_only() {
    let (broker, _hub, _poll) = chat_room();
    let stored = |seq, payload: &'static [u8], from: Option<&str>| crate::history::Stored {
        seq,
        payload: Bytes::from_static(payload),
        kind: DataKind::Text,
        from: from.map(Box::from),
        event: None,
        skip: None,
    };
    let replay = || Replay {
        messages: vec![stored(1, b"hi", Some("c3")), stored(2, b"ho", None)],
        last_seq: 2,
        oldest: 1,
        epoch: 1,
    };
    let resume = Resume {
        since: 0,
        epoch: Some(1),
    };
    let mut member = subscriber(&broker, "chat:r");
    let Some(sub) = member.sub.as_mut() else {
        panic!("a subscriber");
    };
    let mut counts = TurnCounts::default();
    let mut plain = Deflater {
        window_bits: 0,
        compression: ServeConfig::default().compression,
        counts: &mut counts,
        shared: None,
    };
    let mut out = Vec::new();
    write_replay(&mut out, sub, replay(), resume, &mut plain);
    let frames = frame_payloads(&out);
    assert_eq!(frames.len(), 3, "the epoch, then two messages");
    assert_eq!(
        frames[1],
        br#"{"channel":"chat:r","seq":1,"data":"hi","from":"c3"}"#
    );
    assert_eq!(frames[2], br#"{"channel":"chat:r","seq":2,"data":"ho"}"#);

    sub.format = Format::WsRaw;
    let mut out = Vec::new();
    write_replay(&mut out, sub, replay(), resume, &mut plain);
    assert_eq!(frame_payloads(&out), vec![&b"hi"[..], &b"ho"[..]]);

    // With permessage-deflate, messages past the minimum size go compressed.
    let mut compressing = Deflater {
        window_bits: 15,
        compression: Compression {
            min_size: 2,
            level: 6,
        },
        counts: &mut counts,
        shared: None,
    };
    let long = Replay {
        messages: vec![stored(1, "hi ".repeat(100).leak().as_bytes(), None)],
        last_seq: 1,
        oldest: 1,
        epoch: 1,
    };
    let mut out = Vec::new();
    write_replay(&mut out, sub, long, resume, &mut compressing);
    assert_eq!(out[0], 0xC0 | opcode::TEXT, "RSV1 set");
    let mut inflated = Vec::new();
    crate::protocol::deflate::inflate(&out[2..], 1 << 20, &mut inflated).unwrap();
    assert_eq!(inflated, "hi ".repeat(100).as_bytes());
    assert_eq!(counts.deflate_wire, out.len() as u64);
}

#[test]
fn a_protocol_error_closes_with_its_code() {
    let (broker, _hub, _poll) = chat_room();
    let mut state = WsState::default();
    let mut input = vec![0x81, 0x02, b'h', b'i']; // unmasked client frame
    let mut out = Vec::new();
    let mut counts = TurnCounts::default();
    let config = ServeConfig::default();
    let mut ctx = Ctx {
        ticket: crate::broker::asked::Ticket {
            loop_index: 0,
            key: 0,
            serial: 0,
            asker: crate::broker::asked::Asker::Request,
        },
        out: &mut out,
        broker: &broker,
        config: &config,
        hooks: None,
        counts: &mut counts,
        chosen_name: None,
        changes: &mut Vec::new(),
        deflate: 0,
        chat: &mut crate::rate::ChatLimiter::default(),
    };
    assert_eq!(feed(&mut state, &mut input, &mut ctx), After::Close);
    assert_eq!(&out[2..4], &close_code::PROTOCOL_ERROR.to_be_bytes());
}

#[test]
fn json_envelopes() {
    let f = json_message_frame(
        "news",
        7,
        b"he said \"hi\"",
        DataKind::Text,
        Tags::default(),
    );
    assert_eq!(
        &f[2..],
        br#"{"channel":"news","seq":7,"data":"he said \"hi\""}"#
    );
    let c9 = Tags {
        from: Some("c9"),
        event: None,
    };
    let f = json_message_frame("chat:r", 1, &[0, 255], DataKind::Binary, c9);
    assert_eq!(
        &f[2..],
        br#"{"channel":"chat:r","seq":1,"data":"AP8=","encoding":"base64","from":"c9"}"#
    );
    let f = json_event_frame("chat:r", "join", "c2", 3);
    assert_eq!(f[0], 0x81);
    let v: serde_json::Value = serde_json::from_slice(&f[2..]).unwrap();
    assert_eq!(v["event"], "join");
    assert_eq!(v["count"], 3);
}

#[test]
fn raw_frames_carry_the_payload_alone() {
    assert_eq!(&frame_bytes(opcode::TEXT, b"x")[..], b"\x81\x01x");
    assert_eq!(
        &frame_bytes(opcode::BINARY, &[1, 2])[..],
        b"\x82\x02\x01\x02"
    );
}

#[test]
fn server_closes_say_why() {
    let mut out = Vec::new();
    write_close(&mut out, CloseReason::SlowConsumer);
    assert_eq!(&out[..4], &[0x88, 15, 0x03, 0xF0]);
    assert_eq!(&out[4..], b"slow consumer");
}

/// Feeds `input` (client frames) to an echo WebSocket that negotiated
/// permessage-deflate with a 15-bit window; returns the answer bytes.
fn feed_compressed(input: &mut [u8], config: &ServeConfig) -> (Vec<u8>, After, TurnCounts) {
    feed_echo(input, config, 15)
}

/// Feeds `input` to an echo WebSocket whose permessage-deflate window is
/// `deflate` (0: it did not negotiate the extension).
fn feed_echo(input: &mut [u8], config: &ServeConfig, deflate: u8) -> (Vec<u8>, After, TurnCounts) {
    let (broker, _hub, _poll) = chat_room();
    let mut state = WsState::default();
    let mut out = Vec::new();
    let mut counts = TurnCounts::default();
    let mut ctx = Ctx {
        ticket: crate::broker::asked::Ticket {
            loop_index: 0,
            key: 0,
            serial: 0,
            asker: crate::broker::asked::Asker::Request,
        },
        out: &mut out,
        broker: &broker,
        config,
        hooks: None,
        counts: &mut counts,
        chosen_name: None,
        changes: &mut Vec::new(),
        deflate,
        chat: &mut crate::rate::ChatLimiter::default(),
    };
    let after = feed(&mut state, input, &mut ctx);
    (out, after, counts)
}

/// A client frame with RSV1 set around `payload` compressed.
fn compressed_client_frame(op: u8, payload: &[u8]) -> Vec<u8> {
    let mut packed = Vec::new();
    crate::protocol::deflate::compress(payload, 15, 6, &mut packed).unwrap();
    let mut frame = Vec::new();
    encode_client_frame(&mut frame, op, true, &packed, [9, 8, 7, 6]);
    frame[0] |= 0x40;
    frame
}

#[test]
fn a_compressed_echo_is_inflated_and_answered_compressed_past_the_minimum_size() {
    let config = ServeConfig::default();
    let long = "tick EURUSD 1.0842 ".repeat(40);
    let mut input = compressed_client_frame(opcode::TEXT, long.as_bytes());
    input.extend(compressed_client_frame(opcode::TEXT, b"short"));
    let (out, after, counts) = feed_compressed(&mut input, &config);
    assert_eq!(after, After::Nothing);
    // The long echo: RSV1 set, and it inflates to what was sent.
    assert_eq!(out[0], 0x80 | 0x40 | opcode::TEXT);
    let len = usize::from(out[1] & 0x7F);
    assert!(
        len < 126 && len < long.len() / 4,
        "compressed to {len} bytes"
    );
    let mut inflated = Vec::new();
    crate::protocol::deflate::inflate(&out[2..2 + len], 1 << 20, &mut inflated).unwrap();
    assert_eq!(inflated, long.as_bytes());
    // The short one (below --deflate-min-size) goes plain.
    assert_eq!(&out[2 + len..], &[0x81, 5, b's', b'h', b'o', b'r', b't']);
    assert_eq!(counts.deflate_wire, 2 + len as u64);
    assert_eq!(counts.deflate_plain, 4 + long.len() as u64);
}

#[test]
fn a_decompression_bomb_closes_1009_and_bad_data_1007() {
    let config = ServeConfig {
        max_message_size: 64 << 10,
        ..ServeConfig::default()
    };
    let mut bomb = compressed_client_frame(opcode::BINARY, &vec![0u8; 10 << 20]);
    assert!(bomb.len() < 64 << 10);
    let (out, after, _) = feed_compressed(&mut bomb, &config);
    assert_eq!(after, After::Close);
    assert_eq!(&out[2..4], &close_code::MESSAGE_TOO_BIG.to_be_bytes());

    let mut corrupt = Vec::new();
    encode_client_frame(&mut corrupt, opcode::TEXT, true, &[0xff; 12], [1, 2, 3, 4]);
    corrupt[0] |= 0x40;
    let (out, after, _) = feed_compressed(&mut corrupt, &config);
    assert_eq!(after, After::Close);
    assert_eq!(&out[2..4], &close_code::INVALID_PAYLOAD.to_be_bytes());
}

#[test]
fn rsv1_without_deflate_or_on_a_control_frame_closes_1002() {
    let config = ServeConfig::default();
    let mut frame = compressed_client_frame(opcode::TEXT, b"hello hello hello");
    let (out, after, _) = feed_echo(&mut frame, &config, 0);
    assert_eq!(after, After::Close);
    assert_eq!(&out[2..4], &close_code::PROTOCOL_ERROR.to_be_bytes());

    let mut ping = Vec::new();
    encode_client_frame(&mut ping, opcode::PING, true, b"p", [1, 2, 3, 4]);
    ping[0] |= 0x40;
    let (out, after, _) = feed_compressed(&mut ping, &config);
    assert_eq!(after, After::Close);
    assert_eq!(&out[2..4], &close_code::PROTOCOL_ERROR.to_be_bytes());
}

#[test]
fn a_compressed_message_may_come_in_fragments_with_rsv1_on_the_first_only() {
    let config = ServeConfig::default();
    let text = "fragmented and compressed ".repeat(30);
    let mut packed = Vec::new();
    crate::protocol::deflate::compress(text.as_bytes(), 15, 6, &mut packed).unwrap();
    let (a, b) = packed.split_at(packed.len() / 2);
    let mut input = Vec::new();
    encode_client_frame(&mut input, opcode::TEXT, false, a, [1, 2, 3, 4]);
    input[0] |= 0x40;
    encode_client_frame(&mut input, opcode::CONTINUATION, true, b, [4, 3, 2, 1]);
    let (out, after, _) = feed_compressed(&mut input, &config);
    assert_eq!(after, After::Nothing);
    let len = usize::from(out[1] & 0x7F);
    let mut inflated = Vec::new();
    crate::protocol::deflate::inflate(&out[2..2 + len], 1 << 20, &mut inflated).unwrap();
    assert_eq!(inflated, text.as_bytes());

    // RSV1 on a continuation frame is a protocol error.
    let mut input = Vec::new();
    encode_client_frame(&mut input, opcode::TEXT, false, a, [1, 2, 3, 4]);
    input[0] |= 0x40;
    encode_client_frame(&mut input, opcode::CONTINUATION, true, b, [4, 3, 2, 1]);
    let second = 2 + 4 + a.len();
    input[second] |= 0x40;
    let (out, after, _) = feed_compressed(&mut input, &config);
    assert_eq!(after, After::Close);
    assert_eq!(&out[2..4], &close_code::PROTOCOL_ERROR.to_be_bytes());
}

#[test]
fn a_chat_member_over_its_rate_is_told_in_the_close_and_not_published() {
    let (broker, _hub, _poll) = chat_room();
    let config = ServeConfig::default();
    let mut member = subscriber(&broker, "chat:r");
    let mut input = Vec::new();
    for word in [&b"one"[..], b"two", b"three", b"four"] {
        encode_client_frame(&mut input, opcode::TEXT, true, word, [1, 2, 3, 4]);
    }
    let mut out = Vec::new();
    let mut counts = TurnCounts::default();
    let mut chat = crate::rate::ChatLimiter::new(crate::rate::ChatRate {
        per_second: 1,
        burst: 2,
    });
    let mut ctx = Ctx {
        ticket: crate::broker::asked::Ticket {
            loop_index: 0,
            key: 0,
            serial: 0,
            asker: crate::broker::asked::Asker::Request,
        },
        out: &mut out,
        broker: &broker,
        config: &config,
        hooks: None,
        counts: &mut counts,
        chosen_name: None,
        changes: &mut Vec::new(),
        deflate: 0,
        chat: &mut chat,
    };
    assert_eq!(feed(&mut member, &mut input, &mut ctx), After::Close);
    assert_eq!(&out[2..4], &close_code::POLICY_VIOLATION.to_be_bytes());
    let said = String::from_utf8_lossy(&out[4..]).into_owned();
    assert_eq!(said, "chat rate limit: at most 1/s, 2 at once");
    // The burst went out; the third was refused, and nothing after it was read.
    assert_eq!(broker.channel_info("chat:r").last_seq, 2);
    assert_eq!(counts.published, 2);
}
