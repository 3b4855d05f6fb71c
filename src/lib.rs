//! throng: one binary that holds huge numbers of concurrent real-time connections.
//!
//! # Layout
//! - [`protocol`]: RFC 6455 framing and the HTTP upgrade, as pure functions and a
//!   per-connection decoder (no I/O), so they can be unit-tested and fuzzed.
//! - [`server`]: listeners, one mio event loop per I/O thread, per-connection state
//!   ([`server::conn`]), the timer wheel, routes, admission limits, shutdown.
//! - [`hub`]: channels, per-channel `seq`, subscriber counts per loop, fan-out of
//!   frames encoded once; [`broker`]: the seam publishing goes through (memory now,
//!   Redis later).
//! - [`config`]: `serve` flags, `THRONG_*` variables and the TOML config file.
//! - [`stats`]: per-loop counters and the seeds' stats block.
//! - [`client`]: a minimal HTTP/1.1 client for the API (`throng pub`).
//! - [`os`]: the open-files limit and the connection ceiling it gives.
//!
//! Later capabilities slot in beside these: history in the hub, a Redis broker behind
//! the broker seam, SSE and long-poll transports as further routes, `bench` and
//! `tune` as commands in `main`.

pub mod bench;
pub mod broker;
pub mod client;
pub mod config;
pub mod hub;
pub mod os;
pub mod outbound;
pub mod protocol;
pub mod rules;
pub mod server;
pub mod stats;
pub mod transport;
