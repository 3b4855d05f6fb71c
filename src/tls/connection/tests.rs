//! One connection's TLS against rustls's own client, in memory: the handshake
//! fed as a socket might, the request behind it, the answer sealed, goodbyes.

use super::*;
use crate::tls::handshake::tests::{client, client_config, client_flight, deliver, fixture};
use rustls::version::{TLS12, TLS13};
use std::io::Read;

const REQUEST: &[u8] = b"GET /ws HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// Feeds the client's flights to `tls` `chunk` bytes at a time until the
/// client has nothing more to say; returns the plaintext the server opened.
fn converse(
    c: &mut rustls::ClientConnection,
    tls: &mut Tls,
    config: &Arc<ServerConfig>,
    chunk: usize,
) -> Vec<u8> {
    let mut plain = Vec::new();
    for _ in 0..10 {
        let wire = client_flight(c);
        if wire.is_empty() {
            break;
        }
        for piece in wire.chunks(chunk) {
            let mut piece = piece.to_vec();
            let mut send = Vec::new();
            tls.receive(|| config.clone(), &mut piece, &mut plain, &mut send)
                .unwrap();
            deliver(c, &send);
        }
    }
    plain
}

#[test]
fn a_request_sent_with_the_clients_finished_comes_out_and_the_answer_goes_back() {
    let f = fixture();
    for versions in [&[&TLS13][..], &[&TLS12][..]] {
        for chunk in [1, 7, 100, 100_000] {
            let mut c = client(&client_config(&f.cert, versions));
            c.writer().write_all(REQUEST).unwrap();
            let mut tls = Tls::new();
            assert!(!tls.is_handshaking() && !tls.is_open());
            let plain = converse(&mut c, &mut tls, &f.server, chunk);
            assert!(tls.is_open(), "chunk {chunk}");
            assert_eq!(plain, REQUEST, "chunk {chunk}");
            assert_eq!(tls.leftover.partial(), 0);

            let mut wire = Vec::new();
            tls.writer(&mut wire)
                .write_all(b"HTTP/1.1 101 ok\r\n\r\n")
                .unwrap();
            let parts = [
                IoSlice::new(b"one,"),
                IoSlice::new(b""),
                IoSlice::new(b"two"),
            ];
            let n = tls.writer(&mut wire).write_vectored(&parts).unwrap();
            assert_eq!(n, 7);
            deliver(&mut c, &wire);
            let mut got = Vec::new();
            let _ = c.reader().read_to_end(&mut got);
            assert_eq!(got, b"HTTP/1.1 101 ok\r\n\r\none,two");
        }
    }
}

#[test]
fn nothing_goes_out_in_plaintext_before_the_handshake_is_done() {
    let mut tls = Tls::new();
    let mut wire = Vec::new();
    let err = tls
        .writer(&mut wire)
        .write(b"HTTP/1.1 408\r\n\r\n")
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotConnected);
    assert!(wire.is_empty());
}

#[test]
fn plain_http_to_a_tls_port_fails_with_a_reason_and_no_state_is_kept() {
    let f = fixture();
    let mut tls = Tls::new();
    let mut input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    let (mut plain, mut send) = (Vec::new(), Vec::new());
    let err = tls
        .receive(|| f.server.clone(), &mut input, &mut plain, &mut send)
        .unwrap_err();
    assert!(
        matches!(err, TlsError::Handshake(TlsHandshakeError::PlainHttp(_))),
        "{err}"
    );
    assert!(plain.is_empty());
    assert!(tls.leftover.is_empty());
    let answer = String::from_utf8(send.clone()).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(
        head.contains(&format!("Content-Length: {}", body.len())),
        "{answer}"
    );
    assert!(body.contains("https://"), "{answer}");
    // Whatever comes after is ignored, not opened.
    let mut more = b"more".to_vec();
    let r = tls
        .receive(|| f.server.clone(), &mut more, &mut plain, &mut send)
        .unwrap();
    assert_eq!(r, Received::default());
    assert!(plain.is_empty());
}

#[test]
fn a_truncated_client_hello_waits_and_a_garbled_one_fails() {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, &[&TLS13]));
    let hello = client_flight(&mut c);
    let mut tls = Tls::new();
    let (mut plain, mut send) = (Vec::new(), Vec::new());
    let mut head = hello[..hello.len() / 2].to_vec();
    tls.receive(|| f.server.clone(), &mut head, &mut plain, &mut send)
        .unwrap();
    assert!(tls.is_handshaking());
    assert!(send.is_empty());
    assert_eq!(tls.leftover.partial(), head.len());

    let mut garbled = hello[hello.len() / 2..].to_vec();
    for b in garbled.iter_mut().step_by(3) {
        *b ^= 0x5a;
    }
    let result = tls.receive(|| f.server.clone(), &mut garbled, &mut plain, &mut send);
    assert!(result.is_err(), "a garbled ClientHello was accepted");
    assert!(!tls.is_handshaking());
    assert!(tls.leftover.is_empty());
}

#[test]
fn close_notify_reaches_the_client_and_a_tampered_record_is_refused_with_an_alert() {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, &[&TLS13]));
    let mut tls = Tls::new();
    converse(&mut c, &mut tls, &f.server, 100_000);
    assert!(tls.is_open());

    // The client's record with one bit flipped.
    c.writer().write_all(b"hello").unwrap();
    let mut wire = client_flight(&mut c);
    let last = wire.len() - 1;
    wire[last] ^= 1;
    let (mut plain, mut send) = (Vec::new(), Vec::new());
    let err = tls
        .receive(|| f.server.clone(), &mut wire, &mut plain, &mut send)
        .unwrap_err();
    assert!(
        matches!(err, TlsError::Record(RecordError::BadRecordMac)),
        "{err}"
    );
    assert!(plain.is_empty());
    assert!(!send.is_empty(), "no alert for the peer");
    let mut c2 = client(&client_config(&f.cert, &[&TLS13]));
    let mut tls2 = Tls::new();
    converse(&mut c2, &mut tls2, &f.server, 100_000);
    let mut out = Vec::new();
    tls2.close_notify(&mut out);
    assert!(!tls2.is_open());
    deliver(&mut c2, &out);
    let mut got = Vec::new();
    // A clean end: read_to_end returns without an error once close_notify came.
    c2.reader().read_to_end(&mut got).unwrap();
    assert!(got.is_empty());
}

#[test]
fn the_clients_close_notify_is_reported() {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, &[&TLS12]));
    let mut tls = Tls::new();
    converse(&mut c, &mut tls, &f.server, 100_000);
    c.send_close_notify();
    let mut wire = client_flight(&mut c);
    let (mut plain, mut send) = (Vec::new(), Vec::new());
    let r = tls
        .receive(|| f.server.clone(), &mut wire, &mut plain, &mut send)
        .unwrap();
    assert!(r.peer_closed);
}
