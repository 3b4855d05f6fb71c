//! tungstenite-echo: a plain tokio + tokio-tungstenite echo server, default
//! WebSocket config, 2-worker multi-thread runtime, one task per connection.
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};

fn main() {
    let mut addr = String::from("127.0.0.1:8080");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" | "-addr" => addr = args.next().expect("--addr needs a value"),
            s if s.starts_with("--addr=") => addr = s["--addr=".len()..].to_string(),
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
    rt.block_on(serve(addr));
}

async fn serve(addr: String) {
    let listener = TcpListener::bind(&addr).await.expect("bind");
    eprintln!("listening on {}", listener.local_addr().unwrap());
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(handle(stream));
            }
            Err(e) => {
                // e.g. EMFILE: back off briefly instead of spinning
                eprintln!("accept error: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

async fn handle(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
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
