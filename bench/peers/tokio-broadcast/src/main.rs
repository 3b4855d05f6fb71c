//! tokio-broadcast: a fan-out peer for throng's benchmark, written the way a
//! tokio/axum service commonly does pub/sub: one `tokio::sync::broadcast`
//! channel (capacity 1024) per channel name, created on first use and kept in
//! a `Mutex<HashMap>`; each subscriber is a task that does `rx.recv()` then
//! `ws.send(..)`. A receiver that lags behind by more than the capacity loses
//! the overwritten messages: they are counted and the subscriber keeps going.
//!
//! Same API as throng's channel endpoints (raw format only):
//!   WebSocket  /ws/{channel}               each published payload as one frame
//!   POST       /api/publish/{channel}      body = payload; `{"seq":N}` (per channel)
//!   GET        /api/stats                  subscribers, published, lagged counters
//!   GET        /healthz                    ok
//!
//! Usage: tokio-broadcast [--addr 127.0.0.1:8080]
//! Runtime: tokio multi-thread with 2 worker threads.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::ws::{Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::broadcast::{self, error::RecvError};

const CAPACITY: usize = 1024;

struct Chan {
    tx: broadcast::Sender<Message>,
    // Held while sending so that seq order equals delivery order.
    seq: Mutex<u64>,
}

#[derive(Default)]
struct Hub {
    channels: Mutex<HashMap<String, Arc<Chan>>>,
    subscribers: AtomicU64,
    published: AtomicU64,
    lagged_messages: AtomicU64,
    lag_events: AtomicU64,
}

impl Hub {
    fn channel(&self, name: &str) -> Arc<Chan> {
        let mut map = self.channels.lock().unwrap();
        if let Some(c) = map.get(name) {
            return c.clone();
        }
        let (tx, _) = broadcast::channel(CAPACITY);
        let c = Arc::new(Chan { tx, seq: Mutex::new(0) });
        map.insert(name.to_owned(), c.clone());
        c
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:@".contains(&b))
}

async fn subscribe(Path(name): Path<String>, State(hub): State<Arc<Hub>>, ws: WebSocketUpgrade) -> Response {
    if !valid_name(&name) {
        return (StatusCode::BAD_REQUEST, "bad channel name").into_response();
    }
    // Subscribe before answering 101, so a client that saw the handshake
    // complete is sure to get every message published after it.
    let rx = hub.channel(&name).tx.subscribe();
    ws.on_upgrade(move |socket| subscriber(socket, rx, hub))
}

async fn subscriber(mut ws: WebSocket, mut rx: broadcast::Receiver<Message>, hub: Arc<Hub>) {
    hub.subscribers.fetch_add(1, Relaxed);
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Ok(msg) => {
                    if ws.send(msg).await.is_err() {
                        break;
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    hub.lagged_messages.fetch_add(n, Relaxed);
                    hub.lag_events.fetch_add(1, Relaxed);
                }
                Err(RecvError::Closed) => break,
            },
            m = ws.recv() => match m {
                // Pings are answered by the library; data frames are ignored.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
        }
    }
    hub.subscribers.fetch_sub(1, Relaxed);
}

async fn publish(Path(name): Path<String>, State(hub): State<Arc<Hub>>, headers: HeaderMap, body: Bytes) -> Response {
    if !valid_name(&name) {
        return (StatusCode::BAD_REQUEST, "bad channel name").into_response();
    }
    let is_text = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/"));
    let msg = if is_text {
        match Utf8Bytes::try_from(body) {
            Ok(t) => Message::Text(t),
            Err(_) => return (StatusCode::BAD_REQUEST, "text body is not UTF-8").into_response(),
        }
    } else {
        Message::Binary(body)
    };
    let chan = hub.channel(&name);
    let seq = {
        let mut seq = chan.seq.lock().unwrap();
        *seq += 1;
        let _ = chan.tx.send(msg); // Err only when nobody is subscribed
        *seq
    };
    hub.published.fetch_add(1, Relaxed);
    ([(header::CONTENT_TYPE, "application/json")], format!("{{\"seq\":{seq}}}")).into_response()
}

fn stats_json(hub: &Hub) -> String {
    format!(
        "{{\"subscribers\":{},\"channels\":{},\"published\":{},\"lagged_messages\":{},\"lag_events\":{}}}",
        hub.subscribers.load(Relaxed),
        hub.channels.lock().unwrap().len(),
        hub.published.load(Relaxed),
        hub.lagged_messages.load(Relaxed),
        hub.lag_events.load(Relaxed)
    )
}

async fn stats(State(hub): State<Arc<Hub>>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], stats_json(&hub)).into_response()
}

fn main() {
    let mut addr = "127.0.0.1:8080".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" => addr = args.next().expect("--addr needs a value"),
            _ => {
                eprintln!("usage: tokio-broadcast [--addr HOST:PORT]");
                std::process::exit(2);
            }
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let hub = Arc::new(Hub::default());
        let app = Router::new()
            .route("/ws/{channel}", get(subscribe))
            .route("/api/publish/{channel}", post(publish))
            .route("/api/stats", get(stats))
            .route("/healthz", get(|| async { "ok" }))
            .with_state(hub.clone());
        let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
        eprintln!("tokio-broadcast listening on {addr}");
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        tokio::select! {
            r = axum::serve(listener, app) => { if let Err(e) = r { eprintln!("serve: {e}"); } }
            _ = shutdown => {}
        }
        eprintln!("tokio-broadcast stats {}", stats_json(&hub));
    });
    // Open subscriber tasks are dropped with the runtime.
    rt.shutdown_background();
}
