//! The structure docs/ARCHITECTURE.md describes, checked against the source text:
//! the load generator and `tune` reach the server's code only through the modules
//! they share with it, no transport is named outside `src/transport/`, `pusher/`
//! is protocol without I/O, and no file in `src/` grows past 800 lines.

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src(under: &str) -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(under);
    let mut files = Vec::new();
    if root.is_dir() {
        rust_files(&root, &mut files);
    } else {
        files.push(root);
    }
    files
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).expect("read source");
            (p, text)
        })
        .collect()
}

#[test]
fn bench_and_tune_share_only_protocol_write_path_client_pusher_os_and_units() {
    // What the server owns alone: the load generator must work against any
    // server, and `tune` must not need a running one. `crate::pusher` (apps,
    // channel names, Pusher's signatures: no I/O) is shared, as `protocol` is.
    let server_only = [
        "crate::server",
        "crate::config",
        "crate::transport",
        "crate::hub",
        "crate::broker",
        "crate::stats",
        "crate::metrics",
        "crate::feed",
        "crate::history",
        "crate::rules",
        "crate::auth",
        "crate::proxy",
        "crate::workers",
        "crate::webhooks",
    ];
    let mut found = Vec::new();
    for under in ["bench", "tune"] {
        for (path, text) in src(under) {
            for name in server_only {
                if text.contains(name) {
                    found.push(format!("{} uses {name}", path.display()));
                }
            }
        }
    }
    for (path, text) in src("tune") {
        if text.contains("crate::bench") {
            found.push(format!("{} uses crate::bench", path.display()));
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// The lines of `text` that are code: comments and doc comments may name what
/// code must not use (to say so).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

#[test]
fn pusher_is_protocol_without_io_threads_or_delivery() {
    // `pusher/` is what the bench shares with the server: apps, channels,
    // signatures, webhook events. Sockets, files, threads and the HTTP client
    // belong to the server side (`webhooks`, `server`, `transport`).
    let not_in_protocol = [
        "std::thread",
        "std::net",
        "std::fs",
        "std::process",
        "std::sync::mpsc",
        "mio::",
        "ureq::",
        "crate::webhooks",
        "crate::server",
        "crate::transport",
    ];
    let mut found = Vec::new();
    for (path, text) in src("pusher") {
        for line in code_lines(&text) {
            for name in not_in_protocol {
                if line.contains(name) {
                    found.push(format!("{} uses {name}: {}", path.display(), line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn no_transport_is_named_outside_the_transport_folder() {
    let named = [
        "Session::WebSocket",
        "Session::Sse",
        "Session::Poll",
        "Format::Sse",
        "Format::Poll",
    ];
    let transport_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/transport");
    let mut found = Vec::new();
    for (path, text) in src("") {
        if path.starts_with(&transport_dir) {
            continue;
        }
        for name in named {
            if text.contains(name) {
                found.push(format!("{} names {name}", path.display()));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn no_source_file_is_past_800_lines() {
    let long: Vec<String> = src("")
        .into_iter()
        .filter(|(_, text)| text.lines().count() > 800)
        .map(|(path, text)| format!("{}: {} lines", path.display(), text.lines().count()))
        .collect();
    assert!(long.is_empty(), "split these by concept: {long:#?}");
}
