//! The adapters against rustls's client: sealed bytes through a socket that
//! takes a little at a time, and records opened from reads split anywhere.

use super::*;
use crate::outbound::tests::tight;
use crate::tls::handshake::tests::client_flight;
use crate::tls::record::tests::against_rustls::{SUITES, client_reads, established};

#[test]
fn what_the_socket_cannot_take_is_kept_sealed_and_goes_first() {
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    for suite in SUITES {
        let (mut client, mut session, _) = established(suite);
        let mut leftover = Leftover::default();
        let mut scratch = Vec::new();
        let mut socket = tight(1000);
        let (mut sent, mut blocked, mut kept) = (0, 0, false);
        while sent < big.len() {
            let mut w = SealingWriter {
                socket: &mut socket,
                session: &mut session,
                leftover: &mut leftover,
                scratch: &mut scratch,
            };
            match w.write(&big[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => blocked += 1,
                Err(e) => panic!("{e}"),
            }
            kept |= leftover.unsent() > 0;
            // The peer reads a little; the socket takes a little more.
            socket.room = 7_000;
        }
        while !leftover.flush_unsent(&mut socket).unwrap() {
            socket.room = 7_000;
        }
        assert!(
            blocked > 0 && kept,
            "{suite:?}: the socket never pushed back"
        );
        assert!(leftover.is_empty());
        assert_eq!(client_reads(&mut client, &socket.taken), big, "{suite:?}");
    }
}

#[test]
fn records_split_anywhere_open_whole_and_nothing_is_kept_after() {
    for suite in [SUITES[0], SUITES[5]] {
        let (mut client, mut session, _) = established(suite);
        let message: Vec<u8> = (0..40_000u32).map(|i| (i % 241) as u8).collect();
        client.writer().write_all(&message).unwrap();
        let wire = client_flight(&mut client);
        let mut leftover = Leftover::default();
        let (mut plain, mut answer) = (Vec::new(), Vec::new());
        let mut most_kept = 0;
        for piece in wire.chunks(777) {
            let mut piece = piece.to_vec();
            open(
                &mut session,
                &mut leftover,
                &mut piece,
                &mut plain,
                &mut answer,
            )
            .unwrap();
            most_kept = most_kept.max(leftover.partial());
        }
        assert_eq!(plain, message, "{suite:?}");
        assert!(answer.is_empty());
        assert!(
            leftover.is_empty(),
            "nothing kept once every record is whole"
        );
        assert!(most_kept > 0 && most_kept < 16_384 + 256 + 5, "{most_kept}");
        // Then byte by byte, a second message on the same connection.
        client.writer().write_all(b"one byte at a time").unwrap();
        let wire = client_flight(&mut client);
        plain.clear();
        for b in &wire {
            open(
                &mut session,
                &mut leftover,
                &mut [*b],
                &mut plain,
                &mut answer,
            )
            .unwrap();
        }
        assert_eq!(plain, b"one byte at a time");
        assert!(leftover.is_empty());
    }
}

#[test]
fn a_close_notify_ends_the_stream_and_keeps_nothing_behind_it() {
    let (mut client, mut session, _) = established(SUITES[0]);
    client.writer().write_all(b"last words").unwrap();
    client.send_close_notify();
    let mut wire = client_flight(&mut client);
    wire.extend_from_slice(b"junk after the close");
    let mut leftover = Leftover::default();
    let (mut plain, mut answer) = (Vec::new(), Vec::new());
    let opened = open(
        &mut session,
        &mut leftover,
        &mut wire,
        &mut plain,
        &mut answer,
    )
    .unwrap();
    assert!(opened.peer_closed);
    assert_eq!(plain, b"last words");
    assert!(leftover.is_empty());
}
