//! tungstenite-echo: a plain tokio + tokio-tungstenite echo server, 2-worker
//! multi-thread runtime, one task per connection. Default WebSocket config, or
//! `--read-buffer BYTES` for a smaller per-connection read buffer (the tuned variant).
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};

fn main() {
    let mut addr = String::from("127.0.0.1:8080");
    let mut read_buffer: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" | "-addr" => addr = args.next().expect("--addr needs a value"),
            s if s.starts_with("--addr=") => addr = s["--addr=".len()..].to_string(),
            "--read-buffer" => {
                read_buffer = args.next().and_then(|v| v.parse().ok());
                if read_buffer.is_none() {
                    eprintln!("--read-buffer needs a byte count");
                    std::process::exit(2);
                }
            }
            other => {
                eprintln!("unknown argument {other}; usage: tungstenite-echo [--addr HOST:PORT]");
                std::process::exit(2);
            }
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(serve(addr, read_buffer));
}

async fn serve(addr: String, read_buffer: Option<usize>) {
    let listener = TcpListener::bind(&addr).await.expect("bind");
    eprintln!("listening on {}", listener.local_addr().unwrap());
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(handle(stream, read_buffer));
            }
            Err(e) => {
                // e.g. EMFILE: back off briefly instead of spinning
                eprintln!("accept error: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

async fn handle(stream: TcpStream, read_buffer: Option<usize>) {
    let _ = stream.set_nodelay(true);
    let config = read_buffer.map(|n| {
        tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(n)
            .write_buffer_size(0)
    });
    let Ok(mut ws) = tokio_tungstenite::accept_async_with_config(stream, config).await else {
        return;
    };
    while let Some(msg) = ws.next().await {
        let Ok(msg) = msg else { return };
        if msg.is_text() || msg.is_binary() {
            if ws.send(msg).await.is_err() {
                return;
            }
        }
    }
}
