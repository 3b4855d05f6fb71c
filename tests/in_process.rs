//! The server started in this process on port 0 (the mini-redis way), driven by a
//! WebSocket client others wrote (`tungstenite`) and plain HTTP over a std socket,
//! and stopped through its handle. Every wait is bounded by a socket timeout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use throng::config::ServeConfig;
use throng::server::{self, ServerHandle};
use tungstenite::Message;
use tungstenite::protocol::frame::coding::CloseCode;

const WAIT: Duration = Duration::from_secs(5);

type Client = tungstenite::WebSocket<TcpStream>;

fn start(echo_prefix: &str) -> (ServerHandle, SocketAddr) {
    let mut config = ServeConfig::default();
    config.listen = vec![SocketAddr::from(([127, 0, 0, 1], 0))];
    config.threads = 2;
    config.stats_interval = Duration::ZERO;
    config.drain_timeout = Duration::from_secs(3);
    config.echo_prefix = echo_prefix.to_string();
    let handle = server::start(config).expect("the server starts on port 0");
    let addr = handle.local_addrs()[0];
    assert_ne!(addr.port(), 0, "port 0 is resolved");
    (handle, addr)
}

fn stop(handle: ServerHandle) {
    handle.shutdown();
    handle.join().expect("every I/O thread ends cleanly");
}

fn connect(addr: SocketAddr, path: &str) -> Client {
    let socket = TcpStream::connect(addr).expect("connect");
    socket.set_read_timeout(Some(WAIT)).expect("read timeout");
    socket.set_write_timeout(Some(WAIT)).expect("write timeout");
    let (client, response) =
        tungstenite::client(format!("ws://{addr}{path}"), socket).expect("handshake");
    assert_eq!(response.status(), 101);
    client
}

/// The next data message, skipping pings (tungstenite answers them itself).
fn next_text(client: &mut Client) -> String {
    loop {
        match client.read().expect("a message before the timeout") {
            Message::Text(text) => return text.as_str().to_string(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected text, got {other:?}"),
        }
    }
}

/// One HTTP/1.1 request with `Connection: close`; returns status and body.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut socket = TcpStream::connect(addr).expect("connect");
    socket.set_read_timeout(Some(WAIT)).expect("read timeout");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).expect("send request");
    let mut answer = String::new();
    socket.read_to_string(&mut answer).expect("read answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn echo_round_trip_carries_the_prefix() {
    let (handle, addr) = start("Hello from oatpp!");
    let mut client = connect(addr, "/echo");
    client.send(Message::text("hi")).expect("send");
    assert_eq!(next_text(&mut client), "Hello from oatpp!hi");
    client
        .send(Message::binary(vec![0u8, 1, 2]))
        .expect("send binary");
    match client.read().expect("binary echo") {
        Message::Binary(data) => assert_eq!(&data[..], &[0, 1, 2]),
        other => panic!("expected binary, got {other:?}"),
    }
    drop(client);
    stop(handle);
}

#[test]
fn a_subscriber_receives_a_published_message_in_its_envelope() {
    let (handle, addr) = start("");
    let mut client = connect(addr, "/ws/news?format=json");
    // The subscription is in place once the 101 is read; publish after it.
    let (status, body) = http(addr, "POST", "/api/publish/news", "hello");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, r#"{"seq":1}"#);
    let envelope: serde_json::Value =
        serde_json::from_str(&next_text(&mut client)).expect("json envelope");
    assert_eq!(
        envelope,
        serde_json::json!({"channel": "news", "seq": 1, "data": "hello"})
    );
    let (status, body) = http(addr, "GET", "/api/channels/news", "");
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (info["subscribers"].as_u64(), info["last_seq"].as_u64()),
        (Some(1), Some(1))
    );
    drop(client);
    stop(handle);
}

#[test]
fn healthz_answers_ok() {
    let (handle, addr) = start("");
    assert_eq!(http(addr, "GET", "/healthz", ""), (200, "ok".to_string()));
    stop(handle);
}

#[test]
fn shutdown_closes_open_clients_with_1001() {
    let (handle, addr) = start("");
    let mut client = connect(addr, "/echo");
    handle.shutdown();
    let code = loop {
        match client.read() {
            Ok(Message::Close(Some(frame))) => break frame.code,
            Ok(Message::Close(None)) => panic!("close without a code"),
            Ok(_) => continue,
            Err(e) => panic!("no close frame before the connection ended: {e}"),
        }
    };
    assert_eq!(code, CloseCode::Away);
    // Finish the close handshake and hang up, so the server's drain ends at once.
    while client.read().is_ok() {}
    drop(client);
    handle.join().expect("every I/O thread ends cleanly");
}
