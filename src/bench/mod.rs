//! `throng bench`: a load generator for any RFC 6455 WebSocket server (and, in
//! push mode, for Server-Sent Events and long-polling servers; with `--protocol
//! pusher`, for Pusher Channels servers).
//!
//! This module is the command's front: its error type and the names the rest of
//! the crate uses ([`BenchArgs`], [`run`]). The pieces:
//! - `args`: the flags ([`BenchArgs`]), their value types and parsers, the URL;
//! - `setup`: what the flags mean for a run: validation, each process's loop
//!   [`Plan`](client::Plan), children's arguments, the publisher's plan, the
//!   settings the HTML report lists;
//! - `driver`: the run's timeline: open every connection at `--rate` (progress
//!   bar), start the load once all are open, print a status line every
//!   `--interval`, stop after `--duration`, let in-flight messages land, close,
//!   and report;
//! - [`client`]: the mio event loops that hold the connections and run each mode
//!   (and, with `--protocol pusher`, speak Pusher Channels over WebSocket);
//! - `comet`: reading event streams and long-poll answers for push mode;
//! - `fleet`: this process's loops, or `--procs` child processes and their protocol;
//! - `publish`: push mode's HTTP publisher (throng's API, or Pusher's signed one);
//! - `tls`: what `wss://` and `https://` trust (`--insecure`, `--ca`) and the
//!   server name; `https`: blocking HTTPS for the publisher and `handshakes`;
//! - `handshakes`: `throng bench handshakes`, full and resumed TLS handshakes/s;
//! - [`report`]: counters, seq tracking, histogram merging, the timeline, the
//!   printed report;
//! - [`html`] (in `report/`): the report as one self-contained HTML page
//!   (`--report FILE.html`).
//!
//! It must not touch the server's code or state; it talks to servers only over
//! the network, so it works against throng and any other WebSocket server. It
//! may use [`crate::tune`] (its hints), which imports nothing from here, and
//! [`crate::pusher`] (apps and Pusher's signatures, pure functions the server's
//! Pusher side shares).

mod args;
pub mod client;
mod comet;
mod driver;
mod fleet;
mod handshakes;
mod https;
mod publish;
pub mod report;
mod setup;
#[cfg(test)]
mod tests;
mod tls;

pub use args::{BenchArgs, Mode, PortRange, Protocol, SeqFrom, SourceIps, Transport, WsUrl};
pub use driver::run;
pub use report::html;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag's value makes no sense; nothing was started.
    #[error("{0}")]
    BadArgs(String),
    #[error("cannot start the bench")]
    Io(#[from] std::io::Error),
    #[error("bench child process {index}: {reason}")]
    Child { index: usize, reason: String },
    #[error("bench event loop failed: {0}")]
    Loop(String),
    /// The run completed and its report was printed, but `--report` could not be written.
    #[error("cannot write the HTML report to {path}")]
    Report {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The run completed, but connections failed or dropped, messages were lost or
    /// publishes failed (the report says which and why).
    #[error(
        "{0} error(s): failed or dropped connections, lost messages or failed publishes (see the report); --allow-failures exits 0"
    )]
    Failures(u64),
}
