//! The handshake driver against rustls's own client, in memory.

use super::*;
use crate::tls::config::tests::{TempDir, TestCert, test_cert};
use crate::tls::config::{Certificates, server_config};
use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use rustls::version::{TLS12, TLS13};
use rustls::{
    ClientConfig, ClientConnection, ConnectionTrafficSecrets, HandshakeKind, RootCertStore,
    SupportedProtocolVersion,
};
use std::io::Write;

const REQUEST: &[u8] = b"GET /ws HTTP/1.1\r\nHost: localhost\r\n\r\n";

pub(crate) struct Fixture {
    pub(crate) _dir: TempDir,
    pub(crate) cert: TestCert,
    pub(crate) server: Arc<ServerConfig>,
}

pub(crate) fn fixture() -> Fixture {
    let dir = TempDir::new("handshake");
    let cert = test_cert();
    let c = dir.write("cert.pem", &cert.cert_pem);
    let k = dir.write("key.pem", &cert.key_pem);
    let server = server_config(&c, &k).unwrap();
    Fixture {
        _dir: dir,
        cert,
        server,
    }
}

pub(crate) fn client_config(
    cert: &TestCert,
    versions: &[&'static SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(cert.cert_der.clone()).unwrap();
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

pub(crate) fn client(config: &Arc<ClientConfig>) -> ClientConnection {
    ClientConnection::new(config.clone(), ServerName::try_from("localhost").unwrap()).unwrap()
}

pub(crate) fn client_flight(client: &mut ClientConnection) -> Vec<u8> {
    let mut wire = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut wire).unwrap();
    }
    wire
}

pub(crate) fn deliver(client: &mut ClientConnection, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        client.read_tls(&mut bytes).unwrap();
        client.process_new_packets().unwrap();
    }
}

/// Runs the handshake, handing the server `chunk` bytes of the client's
/// flights at a time, the way a socket might. Returns what the server left
/// unconsumed at `Done` followed by whatever it had not been shown yet.
pub(crate) fn drive(client: &mut ClientConnection, hs: &mut Handshake, chunk: usize) -> Vec<u8> {
    let mut pending = Vec::new();
    let mut out = Vec::new();
    for _ in 0..10 {
        let wire = client_flight(client);
        assert!(!wire.is_empty(), "client has nothing to say; stuck");
        let mut pieces = wire.chunks(chunk);
        while let Some(piece) = pieces.next() {
            pending.extend_from_slice(piece);
            let (consumed, progress) = hs.advance(&mut pending, &mut out);
            assert!(consumed <= pending.len());
            pending.drain(..consumed);
            deliver(client, &out);
            out.clear();
            match progress {
                Progress::NeedMore => {}
                Progress::Done => {
                    assert!(!client.is_handshaking());
                    pieces.for_each(|p| pending.extend_from_slice(p));
                    return pending;
                }
                Progress::Failed(e) => panic!("handshake failed: {e}"),
            }
        }
    }
    panic!("no handshake after 10 flights");
}

fn expected_secrets(client: &ClientConnection) -> &'static str {
    let suite = format!("{:?}", client.negotiated_cipher_suite().unwrap().suite());
    if suite.contains("AES_128_GCM") {
        "Aes128Gcm"
    } else if suite.contains("AES_256_GCM") {
        "Aes256Gcm"
    } else {
        assert!(suite.contains("CHACHA20"), "{suite}");
        "Chacha20Poly1305"
    }
}

fn secrets_kind(s: &ConnectionTrafficSecrets) -> &'static str {
    match s {
        ConnectionTrafficSecrets::Aes128Gcm { .. } => "Aes128Gcm",
        ConnectionTrafficSecrets::Aes256Gcm { .. } => "Aes256Gcm",
        ConnectionTrafficSecrets::Chacha20Poly1305 { .. } => "Chacha20Poly1305",
        _ => "other",
    }
}

/// Opens the client's application-data records with the handed-over keys,
/// to show the bytes left unconsumed are intact and the sequence number is
/// where the record layer must start.
fn open_records(
    version: ProtocolVersion,
    (mut seq, secrets): (u64, ConnectionTrafficSecrets),
    mut wire: &[u8],
) -> Vec<u8> {
    use ring::aead;
    let (alg, key, iv) = match &secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (&aead::CHACHA20_POLY1305, key, iv)
        }
        _ => panic!("unexpected suite"),
    };
    let gcm12 = version == ProtocolVersion::TLSv1_2 && alg != &aead::CHACHA20_POLY1305;
    let key = aead::LessSafeKey::new(aead::UnboundKey::new(alg, key.as_ref()).unwrap());
    let mut plain = Vec::new();
    while !wire.is_empty() {
        let header: [u8; 5] = wire[..5].try_into().unwrap();
        assert_eq!(header[0], 0x17, "not application data");
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let mut payload = wire[5..5 + len].to_vec();
        wire = &wire[5 + len..];
        let mut nonce: [u8; 12] = iv.as_ref().try_into().unwrap();
        let body = if gcm12 {
            nonce[4..].copy_from_slice(&payload[..8]);
            payload.drain(..8);
            &mut payload[..]
        } else {
            for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
                *n ^= s;
            }
            &mut payload[..]
        };
        let nonce = aead::Nonce::assume_unique_for_key(nonce);
        let opened = if version == ProtocolVersion::TLSv1_3 {
            let inner = key
                .open_in_place(nonce, aead::Aad::from(header), body)
                .unwrap();
            let end = inner.iter().rposition(|&b| b != 0).unwrap();
            assert_eq!(inner[end], 0x17);
            inner[..end].to_vec()
        } else {
            let plain_len = (body.len() - 16) as u16;
            let mut aad = seq.to_be_bytes().to_vec();
            aad.extend_from_slice(&[0x17, 0x03, 0x03]);
            aad.extend_from_slice(&plain_len.to_be_bytes());
            key.open_in_place(nonce, aead::Aad::from(aad), body)
                .unwrap()
                .to_vec()
        };
        plain.extend_from_slice(&opened);
        seq += 1;
    }
    plain
}

fn full_handshake(versions: &[&'static SupportedProtocolVersion], want: ProtocolVersion) {
    let f = fixture();
    let config = client_config(&f.cert, versions);
    let mut c = client(&config);
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let rest = drive(&mut c, &mut hs, usize::MAX);
    assert!(rest.is_empty());
    assert_eq!(hs.server_name(), Some("localhost"));
    assert_eq!(c.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(c.handshake_kind(), Some(HandshakeKind::Full));
    let (version, secrets, _kernel) = hs.finish().unwrap();
    assert_eq!(version, want);
    assert_eq!(c.protocol_version(), Some(want));
    assert_eq!(secrets_kind(&secrets.tx.1), expected_secrets(&c));
    assert_eq!(secrets_kind(&secrets.rx.1), expected_secrets(&c));
    // The client's Finished (TLS 1.2) was read under the new keys; in
    // TLS 1.3 the application keys start fresh.
    let rx_seq = if want == ProtocolVersion::TLSv1_2 {
        1
    } else {
        0
    };
    assert_eq!(secrets.rx.0, rx_seq);

    // The handed-over keys open what the client sends next.
    c.writer().write_all(REQUEST).unwrap();
    let wire = client_flight(&mut c);
    assert_eq!(open_records(version, secrets.rx, &wire), REQUEST);
}

#[test]
fn full_handshake_tls13() {
    full_handshake(&[&TLS13], ProtocolVersion::TLSv1_3);
}

#[test]
fn full_handshake_tls12() {
    full_handshake(&[&TLS12], ProtocolVersion::TLSv1_2);
}

#[test]
fn both_versions_offered_gives_tls13() {
    full_handshake(&[&TLS13, &TLS12], ProtocolVersion::TLSv1_3);
}

#[test]
fn client_hello_one_byte_at_a_time() {
    for versions in [&[&TLS13][..], &[&TLS12][..]] {
        let f = fixture();
        let mut c = client(&client_config(&f.cert, versions));
        let mut hs = Handshake::new(f.server.clone()).unwrap();
        let hello = client_flight(&mut c);
        let mut pending = Vec::new();
        let mut out = Vec::new();
        let mut zero_consumed = 0;
        for (i, &b) in hello.iter().enumerate() {
            pending.push(b);
            let (consumed, progress) = hs.advance(&mut pending, &mut out);
            assert!(matches!(progress, Progress::NeedMore), "{progress:?}");
            pending.drain(..consumed);
            if consumed == 0 {
                zero_consumed += 1;
            }
            if i + 1 < hello.len() {
                assert!(out.is_empty(), "server spoke before the hello was whole");
            }
        }
        assert!(zero_consumed >= hello.len() - 1);
        assert!(pending.is_empty());
        assert!(!out.is_empty(), "no ServerHello");
        deliver(&mut c, &out);
        // And the rest of the handshake, still a byte at a time.
        let rest = drive(&mut c, &mut hs, 1);
        assert!(rest.is_empty());
        hs.finish().unwrap();
    }
}

#[test]
fn whole_handshake_one_byte_at_a_time() {
    for versions in [&[&TLS13][..], &[&TLS12][..]] {
        let f = fixture();
        let mut c = client(&client_config(&f.cert, versions));
        let mut hs = Handshake::new(f.server.clone()).unwrap();
        assert!(drive(&mut c, &mut hs, 1).is_empty());
        assert_eq!(hs.server_name(), Some("localhost"));
        hs.finish().unwrap();
    }
}

fn fail_with(input: &[u8]) -> (usize, TlsHandshakeError, Vec<u8>) {
    let f = fixture();
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let mut input = input.to_vec();
    let mut out = Vec::new();
    let (consumed, progress) = hs.advance(&mut input, &mut out);
    match progress {
        Progress::Failed(e) => (consumed, e, out),
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// A plaintext alert record, fatal.
fn assert_fatal_alert(out: &[u8]) {
    assert!(out.len() >= 7, "no alert: {out:?}");
    assert_eq!(out[0], 0x15, "not an alert record: {out:?}");
    assert_eq!(out[5], 2, "not fatal: {out:?}");
}

#[test]
fn plain_http_fails_with_alert() {
    let (_, err, out) = fail_with(REQUEST);
    assert!(matches!(err, TlsHandshakeError::PlainHttp(_)), "{err:?}");
    assert!(err.to_string().contains("plain HTTP"), "{err}");
    assert_fatal_alert(&out);
    // Even the first five bytes are enough to tell.
    let (_, err, out) = fail_with(&REQUEST[..5]);
    assert!(matches!(err, TlsHandshakeError::PlainHttp(_)), "{err:?}");
    assert_fatal_alert(&out);
}

#[test]
fn garbage_fails_with_alert() {
    let garbage: Vec<u8> = (0..64u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(0x99))
        .collect();
    let (_, err, out) = fail_with(&garbage);
    assert!(matches!(err, TlsHandshakeError::Rustls(_)), "{err:?}");
    assert_fatal_alert(&out);
    // A well-formed record header with a handshake message that is not a
    // ClientHello.
    let (_, err, out) = fail_with(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00]);
    assert!(matches!(err, TlsHandshakeError::Rustls(_)), "{err:?}");
    assert_fatal_alert(&out);
}

#[test]
fn garbage_after_part_of_a_fragmented_hello_fails_without_panic() {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, &[&TLS13]));
    let hello = client_flight(&mut c);
    // The same ClientHello split over two records; rustls keeps the first
    // part in the caller's buffer until the message is whole.
    let body = &hello[5..];
    let (a, b) = body.split_at(body.len() / 2);
    let mut wire = Vec::new();
    for part in [a, b] {
        wire.extend_from_slice(&[0x16, 0x03, 0x01]);
        wire.extend_from_slice(&(part.len() as u16).to_be_bytes());
        wire.extend_from_slice(part);
    }
    let first_end = 5 + a.len();

    // Whole, it works (and SNI is not read from a split hello).
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let mut out = Vec::new();
    let mut input = wire.clone();
    let (consumed, progress) = hs.advance(&mut input, &mut out);
    assert!(matches!(progress, Progress::NeedMore), "{progress:?}");
    assert_eq!(consumed, wire.len());
    assert!(!out.is_empty());
    assert_eq!(hs.server_name(), None);

    // First part, then an alien record instead of the second part.
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let mut input = wire[..first_end].to_vec();
    let (consumed, progress) = hs.advance(&mut input, &mut out);
    assert!(matches!(progress, Progress::NeedMore), "{progress:?}");
    assert_eq!(consumed, 0, "the first part stays in the caller's buffer");
    let kept = input.clone();
    // rustls sends no alert for a record interleaved with a handshake
    // message; what matters is that failing does not panic.
    input.extend_from_slice(&[0x17, 0x03, 0x03, 0x00, 0x03, 1, 2, 3]);
    out.clear();
    let (_, progress) = hs.advance(&mut input, &mut out);
    assert!(
        matches!(
            progress,
            Progress::Failed(TlsHandshakeError::Rustls(rustls::Error::PeerMisbehaved(_)))
        ),
        "{progress:?}"
    );

    // A second part that is a handshake record but nonsense is answered
    // with an alert.
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let mut input = kept;
    assert!(matches!(
        hs.advance(&mut input, &mut out).1,
        Progress::NeedMore
    ));
    input.extend_from_slice(&[0x16, 0x03, 0x01]);
    input.extend_from_slice(&(b.len() as u16).to_be_bytes());
    input.extend(std::iter::repeat_n(0xff, b.len()));
    out.clear();
    let (_, progress) = hs.advance(&mut input, &mut out);
    assert!(matches!(progress, Progress::Failed(_)), "{progress:?}");
    assert_fatal_alert(&out);
}

fn early_data_left_unconsumed(versions: &[&'static SupportedProtocolVersion], chunk: usize) {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, versions));
    // Written before the handshake: the client sends it right behind its
    // Finished, in the same flight.
    c.writer().write_all(REQUEST).unwrap();
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let rest = drive(&mut c, &mut hs, chunk);
    assert!(
        !rest.is_empty(),
        "the request was not in the client's last flight"
    );
    let (version, secrets, _kernel) = hs.finish().unwrap();
    assert_eq!(open_records(version, secrets.rx, &rest), REQUEST);
}

#[test]
fn early_application_data_left_unconsumed_tls13() {
    early_data_left_unconsumed(&[&TLS13], usize::MAX);
    early_data_left_unconsumed(&[&TLS13], 1);
    early_data_left_unconsumed(&[&TLS13], 7);
}

/// TLS 1.2 clients only send early after an abbreviated (resumed)
/// handshake, where they speak last.
#[test]
fn early_application_data_left_unconsumed_tls12_resumed() {
    let f = fixture();
    let config = client_config(&f.cert, &[&TLS12]);
    let mut first = client(&config);
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    drive(&mut first, &mut hs, usize::MAX);

    let mut second = client(&config);
    second.writer().write_all(REQUEST).unwrap();
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let rest = drive(&mut second, &mut hs, usize::MAX);
    assert_eq!(second.handshake_kind(), Some(HandshakeKind::Resumed));
    let (version, secrets, _kernel) = hs.finish().unwrap();
    assert_eq!(version, ProtocolVersion::TLSv1_2);
    assert_eq!(open_records(version, secrets.rx, &rest), REQUEST);
}

/// What the driver guards against: shown the Finished and the record after
/// it, rustls decrypts that record in place and counts it as discarded
/// before `ReadTraffic` is even returned, so not calling `next_record`
/// does not leave the bytes to anyone.
#[test]
fn rustls_consumes_app_data_before_read_traffic() {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, &[&TLS13]));
    c.writer().write_all(REQUEST).unwrap();
    let mut tls = UnbufferedServerConnection::new(f.server.clone()).unwrap();
    let mut pending = Vec::new();
    let mut out = Vec::new();
    let mut read_traffic = None;
    'flights: for _ in 0..4 {
        pending.extend_from_slice(&client_flight(&mut c));
        let before = pending.clone();
        loop {
            let UnbufferedStatus { discard, state } = tls.process_tls_records(&mut pending);
            let stop = match state.unwrap() {
                ConnectionState::EncodeTlsData(mut d) => {
                    encode(&mut d, &mut out).unwrap();
                    false
                }
                ConnectionState::TransmitTlsData(t) => {
                    t.done();
                    false
                }
                ConnectionState::ReadTraffic(r) => {
                    read_traffic = Some(r.peek_len().unwrap().get());
                    true
                }
                _ => true,
            };
            pending.drain(..discard);
            if read_traffic.is_some() {
                assert!(
                    pending.is_empty(),
                    "ReadTraffic's discard covers the record"
                );
                assert_ne!(before, pending);
                break 'flights;
            }
            if stop {
                break;
            }
        }
        deliver(&mut c, &out);
        out.clear();
    }
    assert_eq!(read_traffic, Some(REQUEST.len()));
}

fn resumes(versions: &[&'static SupportedProtocolVersion]) {
    let f = fixture();
    let config = client_config(&f.cert, versions);
    let mut first = client(&config);
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    drive(&mut first, &mut hs, usize::MAX);
    assert_eq!(first.handshake_kind(), Some(HandshakeKind::Full));
    hs.finish().unwrap();

    for _ in 0..2 {
        let mut again = client(&config);
        let mut hs = Handshake::new(f.server.clone()).unwrap();
        drive(&mut again, &mut hs, usize::MAX);
        assert_eq!(again.handshake_kind(), Some(HandshakeKind::Resumed));
        assert_eq!(again.alpn_protocol(), Some(&b"http/1.1"[..]));
        let (_, secrets, _) = hs.finish().unwrap();
        assert_eq!(secrets_kind(&secrets.rx.1), expected_secrets(&again));
    }
}

#[test]
fn resumption_tls13() {
    resumes(&[&TLS13]);
}

#[test]
fn resumption_tls12() {
    resumes(&[&TLS12]);
}

#[test]
fn no_resumption_without_a_ticket() {
    let f = fixture();
    let mut config = (*client_config(&f.cert, &[&TLS13])).clone();
    config.resumption = Resumption::disabled();
    let config = Arc::new(config);
    for _ in 0..2 {
        let mut c = client(&config);
        let mut hs = Handshake::new(f.server.clone()).unwrap();
        drive(&mut c, &mut hs, usize::MAX);
        assert_eq!(c.handshake_kind(), Some(HandshakeKind::Full));
        hs.finish().unwrap();
    }
}

#[test]
fn reload_serves_new_cert_and_still_resumes() {
    let dir = TempDir::new("hs-reload");
    let a = test_cert();
    let cert = dir.write("cert.pem", &a.cert_pem);
    let key = dir.write("key.pem", &a.key_pem);
    let certs = Certificates::load(&cert, &key, None).unwrap();
    let old_client = client_config(&a, &[&TLS13]);
    let mut c = client(&old_client);
    let mut hs = Handshake::new(certs.current()).unwrap();
    drive(&mut c, &mut hs, usize::MAX);

    let b = test_cert();
    dir.write("cert.pem", &b.cert_pem);
    dir.write("key.pem", &b.key_pem);
    certs.reload().unwrap();

    let mut fresh = client(&client_config(&b, &[&TLS13]));
    let mut hs = Handshake::new(certs.current()).unwrap();
    drive(&mut fresh, &mut hs, usize::MAX);
    assert_eq!(
        fresh.peer_certificates().unwrap()[0].as_ref(),
        b.cert_der.as_ref()
    );

    let mut resumed = client(&old_client);
    let mut hs = Handshake::new(certs.current()).unwrap();
    drive(&mut resumed, &mut hs, usize::MAX);
    assert_eq!(resumed.handshake_kind(), Some(HandshakeKind::Resumed));
}

#[test]
fn advance_after_done_stays_done() {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, &[&TLS13]));
    c.writer().write_all(REQUEST).unwrap();
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let mut rest = drive(&mut c, &mut hs, usize::MAX);
    let copy = rest.clone();
    let mut out = Vec::new();
    let (consumed, progress) = hs.advance(&mut rest, &mut out);
    assert_eq!(consumed, 0);
    assert!(matches!(progress, Progress::Done), "{progress:?}");
    assert!(out.is_empty());
    assert_eq!(rest, copy);
}

#[test]
fn finish_before_done_fails() {
    let f = fixture();
    let hs = Handshake::new(f.server.clone()).unwrap();
    assert!(matches!(
        hs.finish(),
        Err(TlsHandshakeError::Rustls(
            rustls::Error::HandshakeNotComplete
        ))
    ));
}

#[test]
fn no_alpn_overlap_fails() {
    let f = fixture();
    let mut config = (*client_config(&f.cert, &[&TLS13])).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let mut c = client(&Arc::new(config));
    let mut hs = Handshake::new(f.server.clone()).unwrap();
    let mut input = client_flight(&mut c);
    let mut out = Vec::new();
    let (_, progress) = hs.advance(&mut input, &mut out);
    assert!(
        matches!(
            progress,
            Progress::Failed(TlsHandshakeError::Rustls(
                rustls::Error::NoApplicationProtocol
            ))
        ),
        "{progress:?}"
    );
    // In TLS 1.3 ALPN is answered in EncryptedExtensions, after the
    // ServerHello went out, so the alert is the last record and encrypted:
    // 2 bytes of alert, its content type and a 16-byte tag.
    assert_eq!(out[0], 0x16, "ServerHello first");
    assert_eq!(
        &out[out.len() - 24..out.len() - 19],
        &[0x17, 0x03, 0x03, 0x00, 19]
    );
}

#[test]
fn handshake_is_one_pointer() {
    assert_eq!(std::mem::size_of::<Handshake>(), 8);
}

#[test]
fn sni_parser_never_panics_on_prefixes() {
    let f = fixture();
    let mut c = client(&client_config(&f.cert, &[&TLS13]));
    let hello = client_flight(&mut c);
    assert_eq!(sni_from_client_hello(&hello).as_deref(), Some("localhost"));
    for end in 0..hello.len() {
        assert_eq!(sni_from_client_hello(&hello[..end]), None);
    }
    let mut flipped = hello.clone();
    for i in 0..flipped.len() {
        flipped[i] ^= 0xff;
        let _ = sni_from_client_hello(&flipped);
        flipped[i] ^= 0xff;
    }
}
