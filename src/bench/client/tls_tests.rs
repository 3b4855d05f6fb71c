//! Unit tests of the loop's TLS glue (`tls.rs`) against a rustls server on a
//! loopback thread: a round trip bigger than the socket buffers (so writes
//! would block and reads need many `read_tls`), the request written before
//! the handshake ends, and a refused certificate reported with its reason.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rustls::crypto::ring;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

use super::conn::io_reason;
use super::tls;
use crate::bench::tls::{TlsTarget, Trust, client_config};

/// A self-signed certificate for `localhost` (no CA flag, so it may be its own
/// trust anchor) and its key.
fn test_cert() -> (CertificateDer<'static>, PrivateKeyDer<'static>, String) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.der().clone(), der, cert.pem())
}

/// A TLS echo server for one connection; it echoes until the client closes.
fn echo_server(
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
) -> (SocketAddr, JoinHandle<()>) {
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("server config");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handle = std::thread::spawn(move || {
        let Ok((socket, _)) = listener.accept() else {
            return;
        };
        let _ = socket.set_read_timeout(Some(Duration::from_secs(10)));
        let Ok(session) = ServerConnection::new(Arc::new(config)) else {
            return;
        };
        let mut stream = StreamOwned::new(session, socket);
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 || stream.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    (addr, handle)
}

/// A temporary PEM file, removed on drop.
struct PemFile(PathBuf);

impl PemFile {
    fn new(pem: &str) -> PemFile {
        let path = std::env::temp_dir().join(format!(
            "throng-bench-tls-{}-{}.pem",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::write(&path, pem).expect("pem written");
        PemFile(path)
    }
}

impl Drop for PemFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Connects through the glue as the loop does: the request goes out once TCP
/// is up (before the handshake), then reads until `want` bytes came back.
fn round_trip(addr: SocketAddr, target: &TlsTarget, payload: &[u8]) -> io::Result<Vec<u8>> {
    let mut poll = Poll::new()?;
    let mut events = Events::with_capacity(16);
    let mut socket = TcpStream::connect(addr)?;
    poll.registry().register(
        &mut socket,
        Token(0),
        Interest::READABLE | Interest::WRITABLE,
    )?;
    let mut session = tls::start(target).map_err(io::Error::other)?;
    let mut sent = false;
    let mut got = Vec::new();
    let mut buf = vec![0; 256 * 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < payload.len() {
        if Instant::now() > deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        for ev in events.iter() {
            if ev.is_writable() {
                if !sent && socket.peer_addr().is_ok() {
                    sent = true;
                    tls::send(&mut session, &socket, payload)?;
                } else {
                    tls::flush(&mut session, &socket)?;
                }
            }
            if ev.is_readable() {
                loop {
                    match tls::read(&mut session, &socket, &mut buf) {
                        Ok(0) => return Err(io::ErrorKind::ConnectionReset.into()),
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
    assert!(!session.is_handshaking());
    Ok(got)
}

#[test]
fn a_round_trip_larger_than_the_socket_buffers_comes_back_whole() {
    let (cert, key, pem) = test_cert();
    let ca = PemFile::new(&pem);
    let (addr, server) = echo_server(cert, key);
    let trust = Trust {
        insecure: false,
        ca: Some(ca.0.clone()),
    };
    let target =
        TlsTarget::new(client_config(&trust, true).expect("config"), "localhost").expect("target");
    let payload: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let got = round_trip(addr, &target, &payload).expect("round trip");
    assert!(
        got == payload,
        "{} bytes back of {}",
        got.len(),
        payload.len()
    );
    server.join().expect("server thread");
}

#[test]
fn insecure_takes_a_certificate_no_root_vouches_for() {
    let (cert, key, _) = test_cert();
    let (addr, server) = echo_server(cert, key);
    let trust = Trust {
        insecure: true,
        ca: None,
    };
    // An IP address: no SNI is sent, and --insecure does not check the name.
    let target =
        TlsTarget::new(client_config(&trust, true).expect("config"), "127.0.0.1").expect("target");
    let got = round_trip(addr, &target, b"GET / HTTP/1.1\r\n\r\n").expect("round trip");
    assert_eq!(got, b"GET / HTTP/1.1\r\n\r\n");
    server.join().expect("server thread");
}

#[test]
fn an_untrusted_certificate_is_a_failure_with_its_reason() {
    let (cert, key, _) = test_cert();
    let (addr, server) = echo_server(cert, key);
    // The built-in roots know nothing of a certificate made a moment ago.
    let target = TlsTarget::new(
        client_config(&Trust::default(), true).expect("config"),
        "localhost",
    )
    .expect("target");
    let e = round_trip(addr, &target, b"hello").expect_err("refused");
    let reason = io_reason(&e);
    assert!(
        reason.starts_with("tls: invalid peer certificate: UnknownIssuer")
            && reason.contains("--ca"),
        "{reason}"
    );
    server.join().expect("server thread");
}

#[test]
fn a_plain_server_is_named_as_a_likely_cause() {
    let e = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
    let reason = crate::bench::tls::reason(&e);
    assert!(
        reason.starts_with("tls: ") && reason.contains("speak TLS"),
        "{reason}"
    );
}
