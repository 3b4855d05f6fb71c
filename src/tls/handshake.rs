//! One server-side TLS handshake, driven by rustls's unbuffered API over the
//! caller's buffers: the event loop feeds what it received, this appends what
//! must be sent, and once the handshake is done hands the traffic keys over to
//! the record layer.
//!
//! It keeps no buffer of its own between calls (only rustls's state, boxed, and
//! the client's SNI): unconsumed input stays with the caller. It must not read
//! or write a socket, nor decrypt application data: records after the client's
//! Finished are left untouched for the record layer.

use std::sync::Arc;

use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, InsufficientSizeError, UnbufferedStatus,
};
use rustls::{ExtractedSecrets, ProtocolVersion, ServerConfig};
use rustls_pki_types::DnsName;

/// TLS record header: content type, legacy version, length.
const RECORD_HEADER: usize = 5;
const CONTENT_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const SERVER_NAME_HOST: u8 = 0;

/// A fatal alert is one record; a few rounds cover the alert and its
/// TransmitTlsData without trusting a failed connection to stop by itself.
const ALERT_FLUSH_ROUNDS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum TlsHandshakeError {
    #[error("plain HTTP sent to a TLS port ({0})")]
    PlainHttp(#[source] rustls::Error),
    #[error("TLS handshake failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("the peer closed the connection during the TLS handshake")]
    PeerClosed,
    #[error("rustls offered application data before the handshake was done")]
    DataDuringHandshake,
    #[error("cannot encode a handshake record: {0}")]
    Encode(#[source] EncodeError),
}

#[derive(Debug)]
pub enum Progress {
    /// Needs more bytes from the peer (and `out` may hold bytes to send first).
    NeedMore,
    /// The handshake is done; call `finish`. Bytes of `input` past `consumed`
    /// are the peer's first records under the new keys (e.g. the HTTP request
    /// sent right after Finished): the caller keeps them for the record layer.
    Done,
    /// The handshake failed; `out` holds the alert to send (if any) and the
    /// connection must be closed.
    Failed(TlsHandshakeError),
}

/// The boxed state, so a connection in its handshake costs one pointer inline.
struct Conn {
    tls: UnbufferedServerConnection,
    /// rustls's unbuffered server does not expose the SNI, so it is read from
    /// the ClientHello on the way in.
    sni: Option<Box<str>>,
}

pub struct Handshake {
    conn: Box<Conn>,
}

/// What a rustls state asks of the loop, once the state (which borrows the
/// connection and the input) is gone.
enum Step {
    Again,
    Idle { write_traffic: bool },
    PeerClosed,
    Unexpected,
}

impl Handshake {
    pub fn new(config: Arc<ServerConfig>) -> Result<Self, TlsHandshakeError> {
        Ok(Self {
            conn: Box::new(Conn {
                tls: UnbufferedServerConnection::new(config)?,
                sni: None,
            }),
        })
    }

    /// Feeds everything received and not yet consumed (`input`, from its
    /// start; rustls may decrypt in place, hence &mut), appends whatever must
    /// be sent to `out`; returns how many bytes of `input` were consumed and
    /// the progress.
    ///
    /// Bytes past `consumed` may have been rewritten in place (a handshake
    /// message spread over several records is reassembled inside `input`):
    /// the next call must be given them exactly as they are now, followed by
    /// whatever arrived since.
    pub fn advance(&mut self, input: &mut [u8], out: &mut Vec<u8>) -> (usize, Progress) {
        let conn = &mut *self.conn;
        if conn.sni.is_none() && conn.tls.protocol_version().is_none() {
            conn.sni = sni_from_client_hello(input);
        }
        let mut consumed = 0;
        // rustls is shown one record at a time: given more, it goes on from the
        // client's Finished to decrypting the records after it within the same
        // call, and those belong to the record layer. Once the handshake is
        // over it is shown nothing at all.
        let mut limit = if conn.tls.is_handshaking() {
            record_end(input, 0)
        } else {
            0
        };
        loop {
            let UnbufferedStatus { discard, state } =
                conn.tls.process_tls_records(&mut input[consumed..limit]);
            let step = match state {
                Ok(ConnectionState::EncodeTlsData(mut data)) => match encode(&mut data, out) {
                    Ok(()) => Step::Again,
                    Err(e) => {
                        consumed += discard;
                        return (consumed, Progress::Failed(TlsHandshakeError::Encode(e)));
                    }
                },
                Ok(ConnectionState::TransmitTlsData(transmit)) => {
                    // `out` is the caller's to send; it keeps what the socket
                    // does not take, so for rustls it is sent.
                    transmit.done();
                    Step::Again
                }
                Ok(ConnectionState::BlockedHandshake) => Step::Idle {
                    write_traffic: false,
                },
                Ok(ConnectionState::WriteTraffic(_)) => Step::Idle {
                    write_traffic: true,
                },
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => Step::PeerClosed,
                Ok(_) => Step::Unexpected,
                Err(e) => {
                    consumed += discard;
                    let plain_http = matches!(e, rustls::Error::InvalidMessage(_))
                        && conn.tls.protocol_version().is_none()
                        && looks_like_http(input);
                    consumed += flush_alert(&mut conn.tls, &mut input[consumed..limit], out);
                    let err = if plain_http {
                        TlsHandshakeError::PlainHttp(e)
                    } else {
                        TlsHandshakeError::Rustls(e)
                    };
                    return (consumed, Progress::Failed(err));
                }
            };
            consumed += discard;
            match step {
                Step::Again => {}
                // In TLS 1.3 the server may send from its own Finished on, so
                // WriteTraffic also shows up while it waits for the client's.
                Step::Idle { write_traffic } => {
                    if !conn.tls.is_handshaking() {
                        if write_traffic {
                            return (consumed, Progress::Done);
                        }
                        return (consumed, Progress::NeedMore);
                    }
                    if limit < input.len() {
                        limit = record_end(input, limit);
                    } else {
                        return (consumed, Progress::NeedMore);
                    }
                }
                Step::PeerClosed => {
                    return (consumed, Progress::Failed(TlsHandshakeError::PeerClosed));
                }
                Step::Unexpected => {
                    return (
                        consumed,
                        Progress::Failed(TlsHandshakeError::DataDuringHandshake),
                    );
                }
            }
        }
    }

    /// After `Done`: hands the traffic keys over: `(rustls::ProtocolVersion,
    /// rustls::ExtractedSecrets, rustls::kernel::KernelConnection<rustls::server::ServerConnectionData>)`
    /// (the KernelConnection is kept for TLS 1.3 key updates).
    pub fn finish(
        self,
    ) -> Result<
        (
            ProtocolVersion,
            ExtractedSecrets,
            rustls::kernel::KernelConnection<ServerConnectionData>,
        ),
        TlsHandshakeError,
    > {
        let Conn { tls, .. } = *self.conn;
        let version = tls
            .protocol_version()
            .ok_or(rustls::Error::HandshakeNotComplete)?;
        let (secrets, kernel) = tls.dangerous_into_kernel_connection()?;
        Ok((version, secrets, kernel))
    }

    /// The name the client asked for (SNI), for logs.
    pub fn server_name(&self) -> Option<&str> {
        self.conn.sni.as_deref()
    }
}

/// After a fatal error rustls has queued its alert; it comes out of the next
/// call. That call is given the same unconsumed bytes as before rather than
/// an empty slice: rustls indexes the input at how far it had reassembled a
/// handshake message, and an empty slice would be out of range.
fn flush_alert(tls: &mut UnbufferedServerConnection, input: &mut [u8], out: &mut Vec<u8>) -> usize {
    let mut consumed = 0;
    for _ in 0..ALERT_FLUSH_ROUNDS {
        let UnbufferedStatus { discard, state } = tls.process_tls_records(&mut input[consumed..]);
        let more = match state {
            Ok(ConnectionState::EncodeTlsData(mut data)) => encode(&mut data, out).is_ok(),
            Ok(ConnectionState::TransmitTlsData(transmit)) => {
                transmit.done();
                true
            }
            _ => false,
        };
        consumed += discard;
        if !more {
            break;
        }
    }
    consumed
}

/// Encodes into `out`'s spare capacity, growing it to what rustls asks for.
fn encode(
    data: &mut EncodeTlsData<'_, ServerConnectionData>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.resize(out.capacity(), 0);
    let written = match data.encode(&mut out[start..]) {
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            out.resize(start + required_size, 0);
            data.encode(&mut out[start..])
        }
        other => other,
    };
    match written {
        Ok(n) => {
            out.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Where the record starting at `at` ends, or the end of `input` if it has
/// not fully arrived (rustls then waits for the rest, or rejects its header).
fn record_end(input: &[u8], at: usize) -> usize {
    let Some(header) = input.get(at..at + RECORD_HEADER) else {
        return input.len();
    };
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let end = at + RECORD_HEADER + len;
    if end <= input.len() { end } else { input.len() }
}

/// An HTTP/1.x request line starts with a method in capitals and a space; a
/// TLS record starts with a content type byte far below ASCII letters.
fn looks_like_http(input: &[u8]) -> bool {
    const METHODS: [&[u8]; 9] = [
        b"GET ", b"POST", b"HEAD", b"PUT ", b"OPTI", b"DELE", b"PATC", b"CONN", b"PRI ",
    ];
    METHODS.iter().any(|m| input.starts_with(m))
}

/// Reads a big-endian TLS structure without ever indexing past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }

    /// A vector with a length prefix of `prefix` bytes.
    fn vec(&mut self, prefix: usize) -> Option<Reader<'a>> {
        let len = match prefix {
            1 => usize::from(self.u8()?),
            _ => self.u16()?,
        };
        self.take(len).map(Reader)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The host name in a ClientHello that arrived whole in the first record.
/// Anything else (not yet complete, spread over records, no SNI, not a DNS
/// name) gives `None`: it is for logs, and rustls judges the hello itself.
fn sni_from_client_hello(input: &[u8]) -> Option<Box<str>> {
    let mut record = Reader(input);
    if record.u8()? != CONTENT_HANDSHAKE {
        return None;
    }
    record.take(2)?;
    let mut fragment = record.vec(2)?;
    if fragment.u8()? != HANDSHAKE_CLIENT_HELLO {
        return None;
    }
    let len = fragment.u24()?;
    let mut hello = Reader(fragment.take(len)?);
    hello.take(2 + 32)?; // legacy_version, random
    hello.vec(1)?; // legacy_session_id
    hello.vec(2)?; // cipher_suites
    hello.vec(1)?; // legacy_compression_methods
    let mut extensions = hello.vec(2)?;
    while !extensions.is_empty() {
        let kind = extensions.u16()?;
        let mut body = extensions.vec(2)?;
        if kind != usize::from(EXTENSION_SERVER_NAME) {
            continue;
        }
        let mut names = body.vec(2)?;
        while !names.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec(2)?;
            if name_type == SERVER_NAME_HOST {
                let name = std::str::from_utf8(name.0).ok()?;
                let name = DnsName::try_from(name).ok()?.to_lowercase_owned();
                return Some(name.as_ref().into());
            }
        }
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
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

    struct Fixture {
        _dir: TempDir,
        cert: TestCert,
        server: Arc<ServerConfig>,
    }

    fn fixture() -> Fixture {
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

    fn client_config(
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

    fn client(config: &Arc<ClientConfig>) -> ClientConnection {
        ClientConnection::new(config.clone(), ServerName::try_from("localhost").unwrap()).unwrap()
    }

    fn client_flight(client: &mut ClientConnection) -> Vec<u8> {
        let mut wire = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut wire).unwrap();
        }
        wire
    }

    fn deliver(client: &mut ClientConnection, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            client.read_tls(&mut bytes).unwrap();
            client.process_new_packets().unwrap();
        }
    }

    /// Runs the handshake, handing the server `chunk` bytes of the client's
    /// flights at a time, the way a socket might. Returns what the server left
    /// unconsumed at `Done` followed by whatever it had not been shown yet.
    fn drive(client: &mut ClientConnection, hs: &mut Handshake, chunk: usize) -> Vec<u8> {
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
        let certs = Certificates::load(&cert, &key).unwrap();
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
}
