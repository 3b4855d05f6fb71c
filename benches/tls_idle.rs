//! What an idle TLS connection keeps, measured on the heap: N server
//! connections are handshaken in memory against rustls's own client (each client
//! dropped as soon as its handshake is done), then held, and the bytes the
//! allocator still has out are divided by N. Three ways of holding one:
//!
//! - `rustls_buffered`: rustls's `ServerConnection`, as most servers use it;
//! - `rustls_unbuffered`: rustls's unbuffered API, the handshake throng runs;
//! - `throng_session`: what throng keeps after it (`tls::record::Session`).
//!
//! Run: `cargo bench --bench tls_idle -- [N] [tls13|tls12]` (bench/tls_idle.py
//! runs it and keeps the output with its provenance). Prints one JSON object.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConnection};
use throng::tls::handshake::{Handshake, Progress};
use throng::tls::record::Session;

/// Bytes the allocator has out right now.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded as given.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn client_config(
    cert: &rustls::pki_types::CertificateDer<'static>,
    tls12: bool,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(cert.clone())
        .expect("the test certificate is a root");
    let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS13]
    };
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .expect("ring offers both versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // No tickets kept by the client: its store would count against the server.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

fn new_client(config: &Arc<ClientConfig>) -> ClientConnection {
    ClientConnection::new(
        Arc::clone(config),
        ServerName::try_from("localhost").expect("a name"),
    )
    .expect("a client")
}

fn flight(client: &mut ClientConnection) -> Vec<u8> {
    let mut wire = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut wire).expect("to memory");
    }
    wire
}

fn take(client: &mut ClientConnection, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        client.read_tls(&mut bytes).expect("from memory");
        client.process_new_packets().expect("a good server");
    }
}

/// throng's handshake, then its record layer.
fn throng_session(server: &Arc<rustls::ServerConfig>, client: &mut ClientConnection) -> Session {
    let mut hs = Handshake::new(Arc::clone(server)).expect("a handshake");
    let (mut input, mut out) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        input.extend_from_slice(&flight(client));
        let (consumed, progress) = hs.advance(&mut input, &mut out);
        input.drain(..consumed);
        take(client, &out);
        out.clear();
        match progress {
            Progress::NeedMore => {}
            Progress::Done => {
                let (version, secrets, kernel) = hs.finish().expect("keys");
                return Session::new(version, secrets, kernel).expect("a session");
            }
            Progress::Failed(e) => panic!("handshake failed: {e}"),
        }
    }
    panic!("no handshake");
}

/// The same handshake, the unbuffered connection kept as rustls leaves it.
fn unbuffered(server: &Arc<rustls::ServerConfig>, client: &mut ClientConnection) -> Handshake {
    let mut hs = Handshake::new(Arc::clone(server)).expect("a handshake");
    let (mut input, mut out) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        input.extend_from_slice(&flight(client));
        let (consumed, progress) = hs.advance(&mut input, &mut out);
        input.drain(..consumed);
        take(client, &out);
        out.clear();
        if matches!(progress, Progress::Done) {
            return hs;
        }
    }
    panic!("no handshake");
}

fn buffered(server: &Arc<rustls::ServerConfig>, client: &mut ClientConnection) -> ServerConnection {
    let mut conn = ServerConnection::new(Arc::clone(server)).expect("a connection");
    for _ in 0..10 {
        let wire = flight(client);
        let mut rd = &wire[..];
        while !rd.is_empty() {
            conn.read_tls(&mut rd).expect("from memory");
        }
        conn.process_new_packets().expect("a good client");
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).expect("to memory");
        }
        take(client, &out);
        if !conn.is_handshaking() && !client.is_handshaking() {
            // One message each way, as a real connection would have had.
            client.writer().write_all(b"hello").expect("to memory");
            let wire = flight(client);
            conn.read_tls(&mut &wire[..]).expect("from memory");
            conn.process_new_packets().expect("a good client");
            let mut got = [0u8; 5];
            conn.reader().read_exact(&mut got).expect("hello");
            return conn;
        }
    }
    panic!("no handshake");
}

/// Bytes per held connection made by `make`.
fn per_conn<T>(n: usize, mut make: impl FnMut() -> T) -> f64 {
    let mut held = Vec::with_capacity(n);
    let before = live();
    for _ in 0..n {
        held.push(make());
    }
    let after = live();
    let bytes = (after - before) as f64 / n as f64;
    drop(held);
    bytes
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let tls12 = args.iter().any(|a| a == "tls12");
    let dir = std::env::temp_dir().join(format!("throng-tls-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).expect("cert written");
    std::fs::write(&key_path, key.serialize_pem()).expect("key written");
    let server = throng::tls::config::server_config(&cert_path, &key_path).expect("a config");
    let client = client_config(cert.der(), tls12);
    // Warm up: the configs' lazily made parts are made before counting.
    for _ in 0..20 {
        let mut c = new_client(&client);
        drop(throng_session(&server, &mut c));
        let mut c = new_client(&client);
        drop(buffered(&server, &mut c));
    }
    let sizes = [
        ("rustls_buffered", std::mem::size_of::<ServerConnection>()),
        ("rustls_unbuffered_boxed", std::mem::size_of::<Handshake>()),
        ("throng_session", std::mem::size_of::<Session>()),
    ];
    let heap_buffered = per_conn(n, || {
        let mut c = new_client(&client);
        buffered(&server, &mut c)
    });
    let heap_unbuffered = per_conn(n, || {
        let mut c = new_client(&client);
        unbuffered(&server, &mut c)
    });
    let heap_session = per_conn(n, || {
        let mut c = new_client(&client);
        throng_session(&server, &mut c)
    });
    let _ = std::fs::remove_dir_all(&dir);
    let result = serde_json::json!({
        "connections": n,
        "version": if tls12 { "TLS 1.2" } else { "TLS 1.3" },
        "provider": "ring",
        "heap_bytes_per_conn": {
            "rustls_buffered": heap_buffered,
            "rustls_unbuffered": heap_unbuffered,
            "throng_session": heap_session,
        },
        "inline_bytes": {
            "rustls_buffered": sizes[0].1,
            "rustls_unbuffered_boxed": sizes[1].1,
            "throng_session": sizes[2].1,
        },
        "total_bytes_per_conn": {
            "rustls_buffered": heap_buffered + sizes[0].1 as f64,
            "rustls_unbuffered": heap_unbuffered + sizes[1].1 as f64,
            "throng_session": heap_session + sizes[2].1 as f64,
        },
    });
    println!("{result}");
}
