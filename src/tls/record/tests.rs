//! The record layer: its parts alone, then against rustls's own client after
//! a real handshake (every suite, both versions, key updates, closing, tampering).

use super::*;

#[test]
fn nonces_fold_the_sequence_into_the_iv() {
    let mut d = Direction {
        cipher: Cipher::Aes128Gcm,
        key: [0; 32],
        iv: [0xff; 12],
        seq: 0,
    };
    assert_eq!(d.nonce_bytes(), [0xff; 12]);
    d.seq = 0x0102;
    let n = d.nonce_bytes();
    assert_eq!(&n[..10], &[0xff; 10]);
    assert_eq!(&n[10..], &[0xff ^ 1, 0xff ^ 2]);
    d.seq = u64::MAX;
    assert_eq!(d.advance(), Err(RecordError::Exhausted));
}

#[test]
fn key_updates_are_the_only_post_handshake_message() {
    assert_eq!(key_update(&[24, 0, 0, 1, 0], Version::Tls13), Ok(false));
    assert_eq!(key_update(&[24, 0, 0, 1, 1], Version::Tls13), Ok(true));
    assert!(matches!(
        key_update(&[24, 0, 0, 1, 2], Version::Tls13),
        Err(RecordError::Malformed(_))
    ));
    assert!(matches!(
        key_update(&[4, 0, 0, 0], Version::Tls13),
        Err(RecordError::Unexpected(_))
    ));
    assert!(matches!(
        key_update(&[24, 0, 0, 1, 0], Version::Tls12),
        Err(RecordError::Unexpected(_))
    ));
}

#[test]
fn an_idle_session_keeps_little() {
    let size = std::mem::size_of::<Session>();
    assert!(size <= 136, "Session is {size} bytes");
}

pub(crate) mod against_rustls {
    use super::super::*;
    use crate::tls::handshake::tests::{client, client_flight, deliver, drive, fixture};
    use crate::tls::handshake::{Handshake, Progress};
    use rustls::crypto::ring::{cipher_suite, default_provider};
    use rustls::pki_types::ServerName;
    use rustls::version::{TLS12, TLS13};
    use rustls::{ClientConfig, ClientConnection, RootCertStore, SupportedCipherSuite};
    use std::io::{Read, Write};
    use std::sync::Arc;

    /// A client that offers only `suite`, and the server's record layer after
    /// a handshake with it; with what the client sent after its Finished.
    pub(crate) fn established(suite: SupportedCipherSuite) -> (ClientConnection, Session, Vec<u8>) {
        let f = fixture();
        let mut roots = RootCertStore::empty();
        roots.add(f.cert.cert_der.clone()).unwrap();
        let provider = rustls::crypto::CryptoProvider {
            cipher_suites: vec![suite],
            ..default_provider()
        };
        let version = if suite.version() == &TLS13 {
            &TLS13
        } else {
            &TLS12
        };
        let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut c =
            ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
                .unwrap();
        let mut hs = Handshake::new(f.server.clone()).unwrap();
        let left = drive(&mut c, &mut hs, usize::MAX);
        let (version, secrets, kernel) = hs.finish().unwrap();
        (c, Session::new(version, secrets, kernel).unwrap(), left)
    }

    pub(crate) const SUITES: [SupportedCipherSuite; 6] = [
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ];

    /// Feeds `wire` to the session `chunk` bytes at a time, as a socket would,
    /// keeping a partial record for the next read.
    fn open_all(session: &mut Session, wire: &[u8], chunk: usize) -> (Vec<u8>, Vec<u8>, bool) {
        let (mut pending, mut plain, mut answer) = (Vec::new(), Vec::new(), Vec::new());
        let mut closed = false;
        for piece in wire.chunks(chunk) {
            pending.extend_from_slice(piece);
            let opened = session.open(&mut pending, &mut plain, &mut answer).unwrap();
            pending.drain(..opened.consumed);
            closed |= opened.peer_closed;
        }
        assert!(pending.is_empty() || closed, "a partial record left over");
        (plain, answer, closed)
    }

    pub(crate) fn client_reads(c: &mut ClientConnection, mut wire: &[u8]) -> Vec<u8> {
        // A record at a time, reading as it goes: rustls holds little plaintext.
        let mut got = Vec::new();
        while !wire.is_empty() {
            c.read_tls(&mut wire).unwrap();
            c.process_new_packets().unwrap();
            match c.reader().read_to_end(&mut got) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        got
    }

    #[test]
    fn every_suite_carries_data_both_ways_and_closes_cleanly() {
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for suite in SUITES {
            let (mut c, mut s, left) = established(suite);
            assert!(left.is_empty(), "{suite:?}");
            // rustls buffers at most 64 KiB unsent: write in pieces.
            let mut wire = Vec::new();
            for piece in big.chunks(30_000) {
                c.writer().write_all(piece).unwrap();
                wire.extend_from_slice(&client_flight(&mut c));
            }
            let (plain, answer, closed) = open_all(&mut s, &wire, 1000);
            assert_eq!(plain, big, "{suite:?}");
            assert!(answer.is_empty() && !closed);
            let mut wire = Vec::new();
            s.seal(&big, &mut wire).unwrap();
            assert_eq!(wire.len(), s.sealed_len(big.len()), "{suite:?}");
            assert_eq!(client_reads(&mut c, &wire), big, "{suite:?}");
            // Ours, then theirs.
            let mut bye = Vec::new();
            s.seal_alert(alert::CLOSE_NOTIFY, &mut bye).unwrap();
            deliver(&mut c, &bye);
            let mut rest = Vec::new();
            assert_eq!(c.reader().read_to_end(&mut rest).unwrap(), 0, "{suite:?}");
            c.send_close_notify();
            let (_, _, closed) = open_all(&mut s, &client_flight(&mut c), 7);
            assert!(closed && s.peer_closed(), "{suite:?}");
        }
    }

    #[test]
    fn what_the_client_sent_after_its_finished_opens_first() {
        let f = fixture();
        let config = crate::tls::handshake::tests::client_config(&f.cert, &[&TLS13]);
        let mut c = client(&config);
        let mut hs = Handshake::new(f.server.clone()).unwrap();
        let (mut pending, mut out) = (Vec::new(), Vec::new());
        loop {
            pending.extend_from_slice(&client_flight(&mut c));
            let (consumed, progress) = hs.advance(&mut pending, &mut out);
            pending.drain(..consumed);
            deliver(&mut c, &out);
            out.clear();
            if !c.is_handshaking() {
                // The client's request goes out right behind its Finished.
                c.writer().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
                pending.extend_from_slice(&client_flight(&mut c));
                let (consumed, progress) = hs.advance(&mut pending, &mut out);
                pending.drain(..consumed);
                assert!(matches!(progress, Progress::Done));
                break;
            }
            assert!(matches!(progress, Progress::NeedMore));
        }
        deliver(&mut c, &out);
        let (version, secrets, kernel) = hs.finish().unwrap();
        let mut s = Session::new(version, secrets, kernel).unwrap();
        let (plain, _, _) = open_all(&mut s, &pending, pending.len());
        assert_eq!(plain, b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn a_key_update_the_client_asks_for_is_answered_and_both_sides_go_on() {
        for suite in &SUITES[..3] {
            let (mut c, mut s, _) = established(*suite);
            for round in 0..3 {
                c.refresh_traffic_keys().unwrap();
                c.writer().write_all(b"after the update").unwrap();
                let (plain, answer, _) = open_all(&mut s, &client_flight(&mut c), 3);
                assert_eq!(plain, b"after the update", "{suite:?} round {round}");
                assert!(!answer.is_empty(), "our KeyUpdate goes back");
                let mut wire = answer;
                s.seal(b"and back", &mut wire).unwrap();
                assert_eq!(
                    client_reads(&mut c, &wire),
                    b"and back",
                    "{suite:?} round {round}"
                );
            }
        }
    }

    #[test]
    fn a_tampered_record_is_refused_with_bad_record_mac() {
        for suite in SUITES {
            let (mut c, mut s, _) = established(suite);
            c.writer().write_all(b"hello").unwrap();
            let mut wire = client_flight(&mut c);
            let last = wire.len() - 1;
            wire[last] ^= 1;
            let err = s
                .open(&mut wire, &mut Vec::new(), &mut Vec::new())
                .unwrap_err();
            assert_eq!(err, RecordError::BadRecordMac, "{suite:?}");
            assert_eq!(err.alert(), Some(alert::BAD_RECORD_MAC));
        }
    }

    #[test]
    fn bad_headers_are_refused_before_any_key_work() {
        let (_c, mut s, _) = established(SUITES[0]);
        let mut huge = vec![23, 3, 3, 0x50, 0x00];
        assert_eq!(
            s.open(&mut huge, &mut Vec::new(), &mut Vec::new()),
            Err(RecordError::Overflow(0x5000))
        );
        let mut plaintext_alert = vec![21, 3, 3, 0, 2, 2, 40];
        assert!(matches!(
            s.open(&mut plaintext_alert, &mut Vec::new(), &mut Vec::new()),
            Err(RecordError::Unexpected(_))
        ));
        let mut short = vec![23, 3, 3, 0, 4, 1, 2, 3, 4];
        assert!(matches!(
            s.open(&mut short, &mut Vec::new(), &mut Vec::new()),
            Err(RecordError::Malformed(_))
        ));
        // A partial record waits, consuming nothing.
        let mut partial = vec![23, 3, 3, 0, 40, 1, 2];
        let opened = s
            .open(&mut partial, &mut Vec::new(), &mut Vec::new())
            .unwrap();
        assert_eq!(opened.consumed, 0);
    }

    #[test]
    fn a_fatal_alert_from_the_peer_ends_it_without_an_answer() {
        let (mut c, mut s, _) = established(SUITES[0]);
        // rustls sends a fatal alert when it sees a record it cannot open.
        let _ = c.read_tls(
            &mut &[
                23u8, 3, 3, 0, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ][..],
        );
        let _ = c.process_new_packets();
        let mut wire = client_flight(&mut c);
        let err = s
            .open(&mut wire, &mut Vec::new(), &mut Vec::new())
            .unwrap_err();
        assert!(matches!(err, RecordError::PeerAlert(_)), "{err:?}");
        assert_eq!(err.alert(), None);
    }
}
