use std::io::{Read, Write};

use super::*;

/// Deterministic bytes without a dependency (xorshift64).
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.max(1);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A JSON-like message of about `len` bytes, as a channel would publish.
fn json_like(len: usize) -> Vec<u8> {
    let mut s = String::from("{\"event\":\"update\",\"channel\":\"prices\",\"data\":[");
    let mut i = 0u64;
    while s.len() < len {
        let _ = write!(
            s,
            "{{\"id\":{i},\"symbol\":\"SYM{}\",\"bid\":{}.{:02},\"ask\":{}.{:02}}},",
            i % 37,
            100 + i * 7 % 13,
            i * 31 % 100,
            101 + i * 5 % 11,
            i * 17 % 100
        );
        i += 1;
    }
    s.truncate(len.saturating_sub(2));
    s.push_str("]}");
    s.into_bytes()
}

/// The payload set every round trip runs on.
fn payloads() -> Vec<(&'static str, Vec<u8>)> {
    // 1 MiB that repeats with a period of 1000 bytes: the repeats lie beyond a
    // 9-bit window, so a compressor that ignored its window would be caught.
    let period = random_bytes(7, 1000);
    let repetitive: Vec<u8> = period.iter().copied().cycle().take(1 << 20).collect();
    vec![
        ("empty", Vec::new()),
        ("one byte", b"x".to_vec()),
        ("125 bytes", json_like(125)),
        ("1 KiB json", json_like(1024)),
        ("2 KiB json", json_like(2048)),
        ("64 KiB random", random_bytes(42, 64 * 1024)),
        ("1 MiB repetitive", repetitive),
    ]
}

fn compressed(payload: &[u8], window_bits: u8, level: u32) -> Vec<u8> {
    let mut out = Vec::new();
    compress(payload, window_bits, level, &mut out).expect("compress");
    out
}

/// Inflates with a fresh raw decompressor made for `window_bits`, 256 bytes of
/// output per call. This is a second decoder, not a window check: zlib-rs gives
/// every inflater a 32 KiB window whatever it is asked for, so it reads references
/// beyond a small window (see `the_compressor_keeps_inside_its_window`).
fn inflate_with_window(data: &[u8], window_bits: u8) -> Result<Vec<u8>, flate2::DecompressError> {
    let mut d = Decompress::new_with_window_bits(false, window_bits);
    let mut input = [data, &SYNC_TAIL[..]].concat();
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let (in_before, out_before) = (d.total_in(), d.total_out());
        d.decompress(&input, &mut buf, FlushDecompress::Sync)?;
        let read = (d.total_in() - in_before) as usize;
        let wrote = (d.total_out() - out_before) as usize;
        out.extend_from_slice(&buf[..wrote]);
        input.drain(..read);
        if input.is_empty() && wrote < buf.len() {
            return Ok(out);
        }
    }
}

/// Inflates with flate2's own stream decoder: the tail plus a final empty stored
/// block (BFINAL=1, LEN=0) make a complete raw DEFLATE stream of the message.
fn inflate_with_flate2_reader(data: &[u8]) -> Vec<u8> {
    let stream = [data, &SYNC_TAIL[..], &[0x01, 0x00, 0x00, 0xff, 0xff]].concat();
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(&stream[..])
        .read_to_end(&mut out)
        .expect("flate2 reads it");
    out
}

// ---- negotiation ----

fn agreement(server: u8, requested: bool, client: Option<u8>) -> Option<Agreement> {
    Some(Agreement {
        server_window_bits: server,
        server_window_bits_requested: requested,
        client_window_bits: client,
    })
}

#[test]
fn browsers_node_ws_and_python_websockets_default_offer_is_accepted() {
    // Chrome, Firefox, Node's ws and Python websockets (17.4, checked with
    // ClientPerMessageDeflateFactory(compress_settings={'memLevel': 5})
    // .get_request_params() == [('client_max_window_bits', None)]) all send this.
    let got = negotiate("permessage-deflate; client_max_window_bits");
    assert_eq!(got, agreement(15, false, Some(15)));
    assert_eq!(
        got.map(|a| a.response()).as_deref(),
        Some(
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; client_max_window_bits=15"
        )
    );
}

#[test]
fn gorilla_and_bare_offers_get_no_window_params_back() {
    let expected = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
    for offer in [
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        "permessage-deflate",
        "permessage-deflate; client_no_context_takeover",
    ] {
        let got = negotiate(offer);
        assert_eq!(got, agreement(15, false, None), "{offer}");
        assert_eq!(
            got.map(|a| a.response()).as_deref(),
            Some(expected),
            "{offer}"
        );
    }
}

#[test]
fn window_sizes_the_client_asks_for_are_honoured_and_echoed() {
    let got = negotiate("permessage-deflate; server_max_window_bits=12; client_max_window_bits=12");
    assert_eq!(got, agreement(12, true, Some(12)));
    assert_eq!(
        got.map(|a| a.response()).as_deref(),
        Some(
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=12; client_max_window_bits=12"
        )
    );
    // Named at 15, it is still answered: websockets fails a response without it.
    let got = negotiate("permessage-deflate; server_max_window_bits=15");
    assert_eq!(got, agreement(15, true, None));
    assert!(got.is_some_and(|a| a.response().ends_with("; server_max_window_bits=15")));
    // A client window of 8 is the client's business: we inflate with 15 anyway.
    assert_eq!(
        negotiate("permessage-deflate; client_max_window_bits=8"),
        agreement(15, false, Some(8))
    );
    for bits in 9..=15u8 {
        let offer = format!("permessage-deflate; server_max_window_bits={bits}");
        assert_eq!(negotiate(&offer), agreement(bits, true, None), "{offer}");
    }
}

#[test]
fn server_window_of_8_is_declined_for_the_next_offer() {
    assert_eq!(
        negotiate("permessage-deflate; server_max_window_bits=8"),
        None
    );
    assert_eq!(
        negotiate(
            "permessage-deflate; server_max_window_bits=8, permessage-deflate; server_max_window_bits=9"
        ),
        agreement(9, true, None)
    );
}

#[test]
fn the_first_acceptable_offer_wins_and_others_are_skipped() {
    let cases = [
        // Autobahn-style lists of several offers.
        (
            "permessage-deflate; client_no_context_takeover; client_max_window_bits=9, permessage-deflate; client_max_window_bits, permessage-deflate",
            agreement(15, false, Some(9)),
        ),
        (
            "x-webkit-deflate-frame, permessage-deflate; mux, permessage-deflate; server_max_window_bits=10",
            agreement(10, true, None),
        ),
        (
            "permessage-deflate; server_max_window_bits=10, permessage-deflate",
            agreement(10, true, None),
        ),
        (
            "permessage-deflate; server_max_window_bits=abc, permessage-deflate; client_max_window_bits",
            agreement(15, false, Some(15)),
        ),
        // A comma inside a quoted value does not split the list.
        (
            "permessage-deflate; foo=\"a,b\", permessage-deflate",
            agreement(15, false, None),
        ),
        // Empty list elements are legal and skipped.
        (",, permessage-deflate ,,", agreement(15, false, None)),
        // Several header lines joined by the caller.
        (
            "foo, bar; baz=2, permessage-deflate; server_max_window_bits=11",
            agreement(11, true, None),
        ),
    ];
    for (offers, expected) in cases {
        assert_eq!(negotiate(offers), expected, "{offers}");
    }
}

#[test]
fn whitespace_quotes_and_case_are_tolerated() {
    let cases = [
        (
            "  permessage-deflate ;server_max_window_bits = 11 ;\tclient_max_window_bits  ",
            agreement(11, true, Some(15)),
        ),
        (
            "permessage-deflate; server_max_window_bits=\"12\"",
            agreement(12, true, None),
        ),
        (
            "permessage-deflate; client_max_window_bits=\"1\\3\"",
            agreement(15, false, Some(13)),
        ),
        (
            "PerMessage-Deflate; Client_Max_Window_Bits; SERVER_NO_CONTEXT_TAKEOVER",
            agreement(15, false, Some(15)),
        ),
    ];
    for (offers, expected) in cases {
        assert_eq!(negotiate(offers), expected, "{offers}");
    }
}

#[test]
fn malformed_or_unacceptable_offers_are_declined() {
    let declined = [
        "",
        "   ",
        ",",
        ",,",
        ";",
        "permessage-deflate;",
        "permessage-deflate; ",
        "permessage-deflate; ;client_max_window_bits",
        "permessage-deflate;; client_max_window_bits",
        "permessage-deflate x",
        "permessage-deflate=1",
        "\"permessage-deflate\"",
        "permessage-deflaté",
        "x-webkit-deflate-frame",
        "permessage-deflate; mux",
        "permessage-deflate; client_max_window_bits; foo",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_max_window_bits=7",
        "permessage-deflate; server_max_window_bits=0",
        "permessage-deflate; server_max_window_bits=09",
        "permessage-deflate; server_max_window_bits=+9",
        "permessage-deflate; server_max_window_bits=1 2",
        "permessage-deflate; server_max_window_bits=abc",
        "permessage-deflate; server_max_window_bits=",
        "permessage-deflate; server_max_window_bits=\"\"",
        "permessage-deflate; server_max_window_bits=\"12",
        "permessage-deflate; server_max_window_bits=\"12\\",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; client_max_window_bits=16",
        "permessage-deflate; client_max_window_bits=\"\"",
        "permessage-deflate; client_max_window_bits=",
        "permessage-deflate; server_no_context_takeover=1",
        "permessage-deflate; client_no_context_takeover=\"\"",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
        "permessage-deflate; server_max_window_bits=10; server_max_window_bits=10",
        "permessage-deflate; client_max_window_bits; client_max_window_bits=10",
        "permessage-deflate; server_max_window_bits=8; client_max_window_bits",
    ];
    for offers in declined {
        assert_eq!(negotiate(offers), None, "{offers:?}");
    }
}

#[test]
fn list_elements_split_only_outside_quotes() {
    let split: Vec<&str> = Elements {
        rest: Some("a, b; x=\"1,\\\"2\", , c"),
    }
    .collect();
    assert_eq!(split, ["a", " b; x=\"1,\\\"2\"", " ", " c"]);
}

// ---- compression ----

#[test]
fn every_window_and_payload_round_trips() {
    for (name, payload) in payloads() {
        for bits in MIN_COMPRESS_WINDOW_BITS..=MAX_WINDOW_BITS {
            let data = compressed(&payload, bits, 6);
            assert!(
                !data.ends_with(&SYNC_TAIL),
                "{name} w{bits}: tail not stripped"
            );
            let windowed = inflate_with_window(&data, bits);
            assert!(
                windowed.ok().as_deref() == Some(&payload[..]),
                "{name} w{bits}"
            );
            assert!(
                inflate_with_flate2_reader(&data) == payload,
                "{name} w{bits}"
            );
            let mut ours = Vec::new();
            assert_eq!(
                inflate(&data, payload.len(), &mut ours),
                Ok(()),
                "{name} w{bits}"
            );
            assert!(ours == payload, "{name} w{bits}");
        }
    }
}

#[test]
fn the_compressor_keeps_inside_its_window() {
    // Random data that repeats with a period just past the window: a compressor
    // that keeps to its window finds nothing to refer to, one with a larger
    // window shrinks it to almost nothing. (zlib's longest reach is the window
    // less 262 bytes, so a period of exactly the window is already out of reach.)
    for bits in MIN_COMPRESS_WINDOW_BITS..MAX_WINDOW_BITS {
        let period = random_bytes(u64::from(bits), (1 << bits) + 1);
        let payload: Vec<u8> = period.iter().copied().cycle().take(200_000).collect();
        let inside = compressed(&payload, bits, 9).len();
        let wider = compressed(&payload, bits + 1, 9).len();
        assert!(inside > payload.len() * 95 / 100, "w{bits}: {inside} bytes");
        assert!(wider < payload.len() / 5, "w{}: {wider} bytes", bits + 1);
    }
}

#[test]
fn every_level_round_trips() {
    let payload = json_like(2048);
    for level in 0..=9 {
        let data = compressed(&payload, 15, level);
        let mut out = Vec::new();
        assert_eq!(
            inflate(&data, usize::MAX, &mut out),
            Ok(()),
            "level {level}"
        );
        assert!(out == payload, "level {level}");
    }
}

#[test]
fn the_same_message_compresses_to_the_same_bytes() {
    // Needed to share one frame among subscribers; also across levels in between
    // and across threads, since each thread has its own compressor.
    for (name, payload) in payloads() {
        let first = compressed(&payload, 15, 6);
        let _ = compressed(&payload, 15, 1);
        let _ = compressed(b"something else entirely", 15, 6);
        assert!(compressed(&payload, 15, 6) == first, "{name}");
        let other_thread = std::thread::spawn({
            let payload = payload.clone();
            move || compressed(&payload, 15, 6)
        })
        .join()
        .expect("thread");
        assert!(other_thread == first, "{name}");
    }
}

#[test]
fn compression_appends_and_shrinks_what_it_should() {
    // The empty message is one empty stored block's first byte (§7.2.3).
    assert_eq!(compressed(b"", 15, 6), [0x00]);
    let mut out = b"head".to_vec();
    compress(b"hello hello hello", 15, 6, &mut out).expect("compress");
    assert!(out.starts_with(b"head"));
    let mut back = Vec::new();
    assert_eq!(inflate(&out[4..], 100, &mut back), Ok(()));
    assert_eq!(back, b"hello hello hello");

    let repetitive = payloads().pop().expect("payloads").1;
    assert!(compressed(&repetitive, 15, 6).len() < repetitive.len() / 50);
    let random = random_bytes(42, 64 * 1024);
    assert!(compressed(&random, 15, 6).len() < random.len() + 64);
}

#[test]
fn bad_compression_parameters_are_errors_not_panics() {
    let mut out = b"kept".to_vec();
    assert_eq!(
        compress(b"x", 8, 6, &mut out),
        Err(DeflateError::WindowBits(8))
    );
    assert_eq!(
        compress(b"x", 16, 6, &mut out),
        Err(DeflateError::WindowBits(16))
    );
    assert_eq!(
        compress(b"x", 0, 6, &mut out),
        Err(DeflateError::WindowBits(0))
    );
    assert_eq!(
        compress(b"x", 15, 10, &mut out),
        Err(DeflateError::Level(10))
    );
    assert_eq!(out, b"kept");
}

// ---- inflation ----

#[test]
fn a_decompression_bomb_stops_at_the_budget() {
    let zeros = vec![0u8; 10_000_000];
    let bomb = compressed(&zeros, 15, 9);
    assert!(bomb.len() < 20_000, "bomb is {} bytes", bomb.len());
    let max = 1 << 20;

    let mut out = b"kept".to_vec();
    assert_eq!(
        inflate(&bomb, max, &mut out),
        Err(InflateError::TooLarge { limit: max })
    );
    assert_eq!(out, b"kept", "a failed message leaves out as it was");

    // On a decompressor of our own: how far did it get before stopping?
    let mut d = Decompress::new_with_window_bits(false, MAX_WINDOW_BITS);
    let mut out = Vec::new();
    assert_eq!(
        inflate_with(&mut d, &bomb, max, &mut out),
        Err(InflateError::TooLarge { limit: max })
    );
    assert!(out.len() <= max + 1, "produced {}", out.len());
    assert!(d.total_out() <= (max + 1) as u64);
    // It stopped early in the input too: bounded work, not a full inflate.
    assert!(
        d.total_in() < bomb.len() as u64 / 4,
        "read {} of {}",
        d.total_in(),
        bomb.len()
    );
}

#[test]
fn the_budget_is_inclusive() {
    let payload = json_like(1000);
    let data = compressed(&payload, 15, 6);
    let mut out = Vec::new();
    assert_eq!(inflate(&data, 1000, &mut out), Ok(()));
    assert_eq!(out.len(), 1000);
    let mut out = Vec::new();
    assert_eq!(
        inflate(&data, 999, &mut out),
        Err(InflateError::TooLarge { limit: 999 })
    );
    let mut out = Vec::new();
    assert_eq!(inflate(&compressed(b"", 15, 6), 0, &mut out), Ok(()));
    assert!(out.is_empty());
    assert_eq!(
        inflate(&compressed(b"x", 15, 6), 0, &mut out),
        Err(InflateError::TooLarge { limit: 0 })
    );
}

#[test]
fn inflates_what_other_compressors_send() {
    let payload = json_like(5000);
    // A stream ended with BFINAL (flate2's finish), as §7.2.1 allows a sender.
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(&payload).expect("write");
    let mut finished = enc.finish().expect("finish");
    let mut out = Vec::new();
    assert_eq!(inflate(&finished, usize::MAX, &mut out), Ok(()));
    assert!(out == payload);
    // With the empty block the sender appends after it, tail stripped: one 0x00.
    finished.push(0x00);
    let mut out = Vec::new();
    assert_eq!(inflate(&finished, usize::MAX, &mut out), Ok(()));
    assert!(out == payload);

    // Several sync-flushed pieces in one message, from a 9-bit compressor.
    let mut c = Compress::new_with_window_bits(flate2::Compression::fast(), false, 9);
    let mut data = Vec::with_capacity(payload.len() * 2);
    for piece in payload.chunks(700) {
        c.compress_vec(piece, &mut data, FlushCompress::Sync)
            .expect("compress");
    }
    assert!(data.ends_with(&SYNC_TAIL));
    data.truncate(data.len() - 4);
    let mut out = Vec::new();
    assert_eq!(inflate(&data, usize::MAX, &mut out), Ok(()));
    assert!(out == payload);

    // Uncompressed (stored) blocks, as a level-0 sender makes.
    let data = compressed(&payload, 12, 0);
    let mut out = Vec::new();
    assert_eq!(inflate(&data, usize::MAX, &mut out), Ok(()));
    assert!(out == payload);
}

#[test]
fn garbage_is_corrupt_and_never_panics() {
    let corrupt: [&[u8]; 5] = [
        // BTYPE 11 is reserved.
        &[0x07],
        &[0xff; 100],
        // A stored block whose NLEN is not LEN's complement.
        &[0x00, 0x05, 0x00, 0x00, 0x00, b'h', b'e', b'l', b'l', b'o'],
        // A zlib header is not raw DEFLATE.
        &[0x78, 0x9c, 0xff, 0xff, 0xff],
        // Dynamic Huffman header with impossible code lengths.
        &[0x05, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    ];
    for data in corrupt {
        let mut out = b"kept".to_vec();
        assert_eq!(
            inflate(data, 1 << 20, &mut out),
            Err(InflateError::Corrupt),
            "{data:x?}"
        );
        assert_eq!(out, b"kept");
    }
    // Random input of every small length: any answer but a panic or a hang.
    for seed in 1..2000u64 {
        let data = random_bytes(seed, (seed % 300) as usize);
        let mut out = Vec::new();
        match inflate(&data, 1 << 16, &mut out) {
            Ok(()) => assert!(out.len() <= 1 << 16),
            Err(_) => assert!(out.is_empty()),
        }
    }
    // Truncations of a good message: shorter output or Corrupt, never a panic.
    let payload = json_like(3000);
    let data = compressed(&payload, 15, 6);
    for cut in 0..data.len() {
        let mut out = Vec::new();
        // The tail put back is read as block data, so the output is not
        // necessarily a prefix; it only has to stay within the budget.
        if inflate(&data[..cut], 1 << 16, &mut out).is_ok() {
            assert!(out.len() <= 1 << 16, "cut at {cut}");
        }
    }
    // A failure leaves nothing behind for the next message on this thread.
    let mut out = Vec::new();
    assert_eq!(inflate(&data, 1 << 16, &mut out), Ok(()));
    assert!(out == payload);
}

#[test]
fn inflate_errors_map_to_close_codes() {
    assert_eq!(
        InflateError::TooLarge { limit: 1 }.close_code(),
        close_code::MESSAGE_TOO_BIG
    );
    assert_eq!(
        InflateError::Corrupt.close_code(),
        close_code::INVALID_PAYLOAD
    );
}
