//! throng: one binary that holds huge numbers of concurrent real-time connections.
//!
//! # Layout
//! A published message travels one way: `server::routes` (or a chat member's
//! frame in `transport::websocket`) → [`broker`] (chooses `seq`) → [`hub`] (the loops
//! with subscribers) → `server::subscribers` on each loop → [`transport`] (encodes
//! each format once) → [`outbound`] → the socket.
//!
//! - [`protocol`]: RFC 6455 framing, the upgrade handshake and HTTP/1.1 heads and
//!   responses, as pure functions and a per-connection decoder (no I/O).
//! - [`server`]: listeners, one mio event loop per I/O thread, per-connection
//!   state, HTTP connections, routes, per-loop subscribers, admission, shutdown.
//! - [`transport`]: the transport seam: WebSocket, SSE, long-poll and the Pusher
//!   protocol, one file each behind one trait and one registration table; their
//!   endpoints, formats, what a connection holds while idle, heartbeat, close.
//! - [`pusher`]: Pusher apps, channel names and kinds (and which throng channels
//!   are an app's), socket ids, signatures, what a webhook is (protocol only: no
//!   I/O, no thread); [`webhooks`]: their delivery (a thread and a bounded queue
//!   per URL, HTTP POSTs, retries, counts); [`tls`]: TLS on the
//!   listeners (rustls config and reload, the handshake over the loop's buffers,
//!   the record layer).
//! - [`rules`]: channel names, namespaces (chat rooms, push-only channels), client
//!   names, and what a client's message means, as pure decisions.
//! - [`broker`]: a channel's life: `seq`, subscribe/unsubscribe, presence, history
//!   (in this process, or shared by every node through Redis); [`history`]: a
//!   channel's kept messages; [`hub`]: the local,
//!   transport-neutral hand-off
//!   of each message to the event loops with subscribers; [`ids`]: what names a
//!   connection across the cluster (socket ids, node tags) and history epochs.
//! - [`outbound`]: the one write path (writev, a queue of shared chunks only while
//!   the socket is behind), used by the server and the load generator.
//! - [`config`]: `serve` flags, `THRONG_*` variables and the TOML config file;
//!   [`auth`]: who may subscribe (JWT tokens, allowed origins); [`proxy`]: the
//!   client's address behind a `--trusted-proxy`; [`site`]: which `Host` names
//!   and `Origin`s are the server's own (DNS rebinding, cross-site publishes).
//! - [`stats`]: per-loop counters and the seeds' stats block; [`metrics`]: the
//!   same counters (and a few process figures) as Prometheus text for `/metrics`.
//! - [`bench`]: `throng bench`, the load generator; [`client`]: a minimal HTTP/1.1
//!   client for the API (`throng pub`).
//! - [`units`]: durations and byte sizes as the command lines write them;
//!   [`rate`]: how fast a connection may chat (`--chat-rate`).
//! - [`os`]: the open-files limit and the connection ceiling it gives; [`tune`]:
//!   `throng tune`, what N connections need from the OS, and `--apply`.
//! - [`workers`]: `--workers N`, a master that keeps N serving processes running.
//! - [`timing`]: the server's fixed timers (timeouts, sweeps, the Redis node
//!   TTL, back-offs), each with why it has its value, and the hidden
//!   `--test-time-scale` that shortens the ones tests wait on.
//! - [`feed`]: the dashboard's once-a-second view of this node (`throng:stats`,
//!   `/api/stats/history`); [`web`]: the embedded browser pages (`/`, `/chat`,
//!   `/throng.js`).

pub mod auth;
pub mod bench;
pub mod broker;
pub mod client;
pub mod config;
pub mod feed;
pub mod history;
pub mod hub;
pub mod ids;
pub mod metrics;
pub mod os;
pub mod outbound;
pub mod protocol;
pub mod proxy;
pub mod pusher;
pub mod rate;
pub mod rules;
pub mod server;
pub mod site;
pub mod stats;
pub mod timing;
pub mod tls;
pub mod transport;
pub mod tune;
pub mod units;
pub mod web;
pub mod webhooks;
pub mod workers;
