//! Server configuration: the `serve` flags, their `THRONG_<NAME>` environment
//! variables and `--config FILE.toml` keys, one name for all three.
//!
//! It owns parsing and validating settings (durations, sizes, listen specs) and the
//! precedence command line > environment > config file > built-in default. It must
//! not start anything: [`ServeConfig`] is plain data the server is built from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgMatches, Args, FromArgMatches};

use crate::proxy::Network;
use crate::rules::Namespaces;

mod specs;
pub use specs::{BrokerSpec, ListenSpec};

pub use crate::units::{parse_duration, parse_size};

/// Largest server frame header: 2 bytes plus an 8-byte length.
const MAX_FRAME_HEADER: usize = 10;

/// The built-in defaults, written once: `--help` shows these strings and
/// [`ServeConfig::default`] parses the same ones.
pub mod defaults {
    pub const LISTEN: &str = "127.0.0.1:8080";
    pub const PING_INTERVAL: &str = "25s";
    pub const IDLE_TIMEOUT: &str = "60s";
    pub const HANDSHAKE_TIMEOUT: &str = "10s";
    pub const MAX_MESSAGE_SIZE: &str = "64KiB";
    pub const MAX_QUEUE: &str = "1MiB";
    pub const ECHO_PREFIX: &str = "";
    pub const DRAIN_TIMEOUT: &str = "10s";
    pub const HISTORY_SIZE: &str = "100";
    pub const HISTORY_TTL: &str = "5m";
    pub const HISTORY_MAX_BYTES: &str = "256MiB";
    pub const CHAT_RATE: &str = "20/s";
    pub const CHAT_BURST: &str = "40";
    pub const STATS_INTERVAL: &str = "10s";
    pub const BROKER: &str = "memory";
    pub const WORKERS: &str = "1";
    pub const REUSE_PORT: &str = "off";
    pub const REDIS_SUBSCRIBE: &str = "channels";
    pub const REDIS_WAIT_REPLICAS: &str = "0";
    pub const REDIS_PREFIX: &str = crate::broker::RedisBroker::DEFAULT_PREFIX;
    pub const IO_URING: &str = "auto";
    pub const PERMESSAGE_DEFLATE: &str = "off";
    pub const DEFLATE_MIN_SIZE: &str = "256";
    pub const DEFLATE_LEVEL: &str = "6";
}

fn parse_io_uring(s: &str) -> Result<bool, String> {
    match s {
        "auto" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}' is not auto or off")),
    }
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        // A config file's `true`/`false` arrive as these.
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

fn parse_redis_subscribe(s: &str) -> Result<crate::broker::Subscribe, String> {
    match s {
        "channels" => Ok(crate::broker::Subscribe::Channels),
        "pattern" => Ok(crate::broker::Subscribe::Pattern),
        _ => Err(format!("'{s}' is not channels or pattern")),
    }
}

fn parse_redis_prefix(s: &str) -> Result<String, String> {
    crate::broker::RedisBroker::check_prefix(s).map(|()| s.to_string())
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `throng serve` flags. Each doc line is its `--help` text; each flag is also
/// `THRONG_<NAME>` in the environment and `<name>` in the config file.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// TOML file whose keys are these flags' names (e.g. `echo-prefix = "hi"`)
    #[arg(long, env = "THRONG_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// host:port, or host:first-last for one listener per port (repeatable). Port 0:
    /// the kernel picks a free one, and `serve` prints `listening on ADDR…` on stdout
    #[arg(
        long,
        env = "THRONG_LISTEN",
        value_name = "ADDR",
        default_value = defaults::LISTEN,
        value_delimiter = ','
    )]
    pub listen: Vec<ListenSpec>,

    /// I/O threads [default: the number of cores]
    #[arg(long, env = "THRONG_THREADS", value_name = "N")]
    pub threads: Option<usize>,

    /// Server pings, spread evenly over this interval; 0 = no pings
    #[arg(long, env = "THRONG_PING_INTERVAL", value_name = "DURATION", default_value = defaults::PING_INTERVAL, value_parser = parse_duration)]
    pub ping_interval: Duration,

    /// Close a client that sent no frame or pong for this long; 0 = never
    #[arg(long, env = "THRONG_IDLE_TIMEOUT", value_name = "DURATION", default_value = defaults::IDLE_TIMEOUT, value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Drop a connection whose HTTP request has not completed in this time (slowloris)
    #[arg(long, env = "THRONG_HANDSHAKE_TIMEOUT", value_name = "DURATION", default_value = defaults::HANDSHAKE_TIMEOUT, value_parser = parse_duration)]
    pub handshake_timeout: Duration,

    /// Largest message a client may send (all fragments together); larger: close 1009
    #[arg(long, env = "THRONG_MAX_MESSAGE_SIZE", value_name = "BYTES", default_value = defaults::MAX_MESSAGE_SIZE, value_parser = parse_size)]
    pub max_message_size: usize,

    /// Outbound bytes queued for one connection; past it: close 1008 "slow consumer"
    /// (never below one largest message; a since= replay being written does not count)
    #[arg(long, env = "THRONG_MAX_QUEUE", value_name = "BYTES", default_value = defaults::MAX_QUEUE, value_parser = parse_size)]
    pub max_queue: usize,

    /// Compress WebSocket messages with permessage-deflate (RFC 7692) for clients
    /// that offer it (on|off; bare flag: on). Each message is compressed once and
    /// shared by every subscriber; no connection keeps a compressor
    #[arg(long, env = "THRONG_PERMESSAGE_DEFLATE", value_name = "ON|OFF", default_value = defaults::PERMESSAGE_DEFLATE, default_missing_value = "on", num_args = 0..=1, require_equals = false, value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub permessage_deflate: bool,

    /// With --permessage-deflate: messages shorter than this go uncompressed
    #[arg(long, env = "THRONG_DEFLATE_MIN_SIZE", value_name = "BYTES", default_value = defaults::DEFLATE_MIN_SIZE, value_parser = parse_size)]
    pub deflate_min_size: usize,

    /// With --permessage-deflate: zlib's compression level, 0 (store) to 9 (smallest)
    #[arg(long, env = "THRONG_DEFLATE_LEVEL", value_name = "0-9", default_value = defaults::DEFLATE_LEVEL, value_parser = clap::value_parser!(u32).range(0..=9))]
    pub deflate_level: u32,

    /// Most concurrent WebSocket connections; more handshakes get 503
    #[arg(long, env = "THRONG_MAX_CONNS", value_name = "N")]
    pub max_conns: Option<usize>,

    /// Most concurrent WebSocket connections from one IP address; more get 429
    #[arg(long, env = "THRONG_MAX_CONNS_PER_IP", value_name = "N")]
    pub max_conns_per_ip: Option<u32>,

    /// The publish API needs `Authorization: Bearer KEY`; unset: loopback peers
    /// only. A secret: on the command line `ps` shows it to every local user, so
    /// prefer THRONG_API_KEY or `api-key` in the config file
    #[arg(
        long,
        env = "THRONG_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,

    /// Subscribing needs an HS256 JWT signed with this secret (`?token=` or
    /// `Authorization: Bearer`), with `exp` and `channels`; `sub` names a chat
    /// member. A secret: on the command line `ps` shows it to every local user,
    /// so prefer THRONG_TOKEN_SECRET or `token-secret` in the config file
    #[arg(
        long,
        env = "THRONG_TOKEN_SECRET",
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub token_secret: Option<String>,

    /// A browser page from another Origin gets 403 (repeatable; default: any origin)
    #[arg(
        long,
        env = "THRONG_ALLOWED_ORIGIN",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    pub allowed_origin: Vec<String>,

    /// Host names requests may name (repeatable; port ignored; IP literals always
    /// pass). Default: any, except that a browser on this machine reaching a
    /// loopback socket directly must name localhost or an address (DNS rebinding)
    #[arg(
        long,
        env = "THRONG_ALLOWED_HOST",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub allowed_host: Vec<String>,

    /// A reverse proxy (address or network, repeatable) whose X-Forwarded-For is
    /// believed: the client's address from it is what the publish rule, per-IP limits
    /// and logs use. Default: none, the header is ignored
    #[arg(
        long,
        env = "THRONG_TRUSTED_PROXY",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub trusted_proxy: Vec<Network>,

    /// A Pusher Channels app, ID:KEY:SECRET (repeatable): Pusher clients connect
    /// to /app/KEY, the signed Pusher HTTP API answers under /apps/ID. Default:
    /// none. It holds a secret: on the command line `ps` shows it to every local
    /// user, so prefer THRONG_PUSHER_APP or `pusher-app` in the config file
    #[arg(
        long,
        env = "THRONG_PUSHER_APP",
        value_name = "ID:KEY:SECRET",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub pusher_app: Vec<crate::pusher::App>,

    /// Whether Pusher clients may send client events (client-*) on the private and
    /// presence channels they are subscribed to (on|off; off, as Pusher's default)
    #[arg(long, env = "THRONG_PUSHER_CLIENT_EVENTS", value_name = "ON|OFF", default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub pusher_client_events: bool,

    /// Where Pusher webhooks go (repeatable): every event of every app the config
    /// file gives no webhooks of its own. Default: none
    #[arg(
        long,
        env = "THRONG_PUSHER_WEBHOOK",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub pusher_webhook: Vec<crate::pusher::webhook_events::Target>,

    /// Most users one Pusher presence channel may have; a new one beyond gets
    /// pusher:subscription_error (Pusher's limit is 100)
    #[arg(
        long,
        env = "THRONG_PUSHER_MAX_PRESENCE_MEMBERS",
        value_name = "N",
        default_value = "100"
    )]
    pub pusher_max_presence_members: usize,

    /// Text prepended to every echoed text message
    #[arg(
        long,
        env = "THRONG_ECHO_PREFIX",
        value_name = "TEXT",
        default_value = defaults::ECHO_PREFIX
    )]
    pub echo_prefix: String,

    /// Messages each channel keeps for clients that come back; 0 = no history
    #[arg(long, env = "THRONG_HISTORY_SIZE", value_name = "N", default_value = defaults::HISTORY_SIZE)]
    pub history_size: usize,

    /// How long a channel keeps a message (whole seconds); 0 = no history
    #[arg(long, env = "THRONG_HISTORY_TTL", value_name = "DURATION", default_value = defaults::HISTORY_TTL, value_parser = parse_duration)]
    pub history_ttl: Duration,

    /// Most history bytes all channels of this process keep together (memory
    /// broker); past it the oldest messages of the growing and the largest
    /// channels go first, and a returning client is told of the gap
    #[arg(long, env = "THRONG_HISTORY_MAX_BYTES", value_name = "BYTES", default_value = defaults::HISTORY_MAX_BYTES, value_parser = parse_size)]
    pub history_max_bytes: usize,

    /// Chat messages one connection may send per second, sustained (`N` or
    /// `N/s`); one over it is refused with close 1008 and not published. 0: no limit
    #[arg(long, env = "THRONG_CHAT_RATE", value_name = "N/s", default_value = defaults::CHAT_RATE, value_parser = crate::rate::parse_rate)]
    pub chat_rate: u32,

    /// Chat messages one connection may send back to back after a quiet spell
    #[arg(long, env = "THRONG_CHAT_BURST", value_name = "N", default_value = defaults::CHAT_BURST)]
    pub chat_burst: u32,

    /// Where channels live: memory (this process), redis://host[:port][/db] (every
    /// node sharing that Redis: one seq and history per channel, cluster-wide delivery)
    /// or redis-sentinel://host:port[,host:port…]/master (the master Sentinel names).
    /// A URL with a password holds a secret: on the command line `ps` shows it to
    /// every local user, so prefer THRONG_BROKER or `broker` in the config file
    #[arg(long, env = "THRONG_BROKER", value_name = "BROKER", default_value = defaults::BROKER, hide_env_values = true)]
    pub broker: BrokerSpec,

    /// With a Redis broker: channels (each node subscribes to the channels it has
    /// subscribers of) or pattern (one PSUBSCRIBE: every node gets every message)
    #[arg(long, env = "THRONG_REDIS_SUBSCRIBE", value_name = "HOW", default_value = defaults::REDIS_SUBSCRIBE, value_parser = parse_redis_subscribe)]
    pub redis_subscribe: crate::broker::Subscribe,

    /// With a Redis broker: hold each message in Redis, unseen, until this many
    /// replicas have it (Redis WAIT, at most 500 ms, else 503 and it stays held),
    /// so that a failover keeps it and its channel's epoch; 0 publishes at once (a
    /// failover then starts a new epoch on each channel, and subscribers are told
    /// of the gap)
    #[arg(long, env = "THRONG_REDIS_WAIT_REPLICAS", value_name = "N", default_value = defaults::REDIS_WAIT_REPLICAS)]
    pub redis_wait_replicas: u32,

    /// With a Redis broker: what every Redis key and pubsub channel name starts
    /// with, so that several deployments (or environments, or tests) share one
    /// Redis without seeing each other's nodes, channels or messages. Letters,
    /// digits, '_', '.' and '-', at most 64 bytes
    #[arg(long, env = "THRONG_REDIS_PREFIX", value_name = "NAME", default_value = defaults::REDIS_PREFIX, value_parser = parse_redis_prefix)]
    pub redis_prefix: String,

    /// Serve TLS (wss://, https://) on every --listen address with this
    /// certificate chain (PEM); needs --tls-key. SIGHUP reads both again
    #[arg(
        long,
        env = "THRONG_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The certificate's private key (PEM: PKCS#8, RSA or EC); needs --tls-cert
    #[arg(
        long,
        env = "THRONG_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// Seal TLS session tickets with keys derived from this file (at least 32
    /// random bytes): every process and node given the same file resumes the
    /// others' sessions, also after a restart [default: --workers share a
    /// random one; a single process keeps its own in memory]
    #[arg(
        long,
        env = "THRONG_TLS_TICKET_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_ticket_key: Option<PathBuf>,

    /// Processes sharing the listeners (SO_REUSEPORT), each with --threads I/O
    /// threads; above 1 they reach each other through the broker (needs redis://)
    #[arg(long, env = "THRONG_WORKERS", value_name = "N", default_value = defaults::WORKERS)]
    pub workers: usize,

    /// Share --listen ports another process already listens on (on|off; bare
    /// flag: on), e.g. for a blue/green handoff: the kernel then splits new
    /// connections between the two. Off: such a port stops the start. Each
    /// server sharing a port must say so (--workers share theirs anyway)
    #[arg(long, env = "THRONG_REUSE_PORT", value_name = "ON|OFF", default_value = defaults::REUSE_PORT, default_missing_value = "on", num_args = 0..=1, require_equals = false, value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub reuse_port: bool,

    /// How loops receive and fan out: auto (busy connections through io_uring
    /// multishot receives where the kernel has them, quiet ones through epoll;
    /// a fan-out's sends and each turn's replies batched through an io_uring
    /// send ring) or off (epoll, recv and send for all)
    #[arg(long, env = "THRONG_IO_URING", value_name = "HOW", default_value = defaults::IO_URING, value_parser = parse_io_uring, action = clap::ArgAction::Set)]
    pub io_uring: bool,

    /// On SIGTERM/SIGINT: close clients with 1001 and exit within this time
    #[arg(long, env = "THRONG_DRAIN_TIMEOUT", value_name = "DURATION", default_value = defaults::DRAIN_TIMEOUT, value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Print the stats block this often; 0 = never
    #[arg(long, env = "THRONG_STATS_INTERVAL", value_name = "DURATION", default_value = defaults::STATS_INTERVAL, value_parser = parse_duration)]
    pub stats_interval: Duration,

    /// Testing only, hidden: multiplies the timers tests wait on (`timing`'s
    /// scaled ones: the Redis node TTL and keeper, close and linger timeouts,
    /// housekeeping, webhook retries) by this factor, above 0 and at most 1
    #[arg(long, env = "THRONG_TEST_TIME_SCALE", value_name = "FACTOR", default_value = "1", value_parser = parse_time_scale, hide = true)]
    pub test_time_scale: f64,
}

fn parse_time_scale(s: &str) -> Result<f64, String> {
    let factor: f64 = s.parse().map_err(|e| format!("'{s}': {e}"))?;
    crate::timing::check_test_time_scale(factor).map_err(|e| e.to_string())
}

/// Validated settings the server runs on. `Default` gives the built-in defaults
/// ([`defaults`]); the command line, `THRONG_*` variables and the config file
/// override them through [`ServeArgs::into_config`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeConfig {
    /// Every listener address, port ranges expanded. Default `127.0.0.1:8080`. Each
    /// I/O thread binds every address (SO_REUSEPORT), so a port range of 500 costs
    /// 500 descriptors per thread.
    pub listen: Vec<SocketAddr>,
    /// I/O threads, each one event loop. Default: the number of cores. More threads
    /// than cores only add context switches.
    pub threads: usize,
    /// Server pings, spread evenly over this interval. Default 25 s; zero turns pings
    /// off. Shorter finds dead peers sooner at the cost of a frame per connection per
    /// interval.
    pub ping_interval: Duration,
    /// A connection that sent nothing (not even a pong) for this long is closed with
    /// 1001. Default 60 s; zero: never.
    pub idle_timeout: Duration,
    /// An HTTP request (or a kept-alive connection's next one) must arrive whole
    /// within this. Default 10 s; must be above zero (slowloris protection).
    pub handshake_timeout: Duration,
    /// Largest message a client may send, all fragments together; larger: close 1009.
    /// Default 64 KiB. A message in progress is buffered, so this bounds the memory
    /// one client can make the server hold while reading.
    pub max_message_size: usize,
    /// Outbound bytes that may wait for one connection; past it the client is a slow
    /// consumer and is closed with 1008. Default 1 MiB, never below one largest echo.
    /// This bounds the memory a reader that stopped reading can cost, beyond its
    /// replay of history (`since=`), which does not count while it is being written
    /// and is itself bounded by the history limits, until its reader takes nothing
    /// of it for 5 s: then it counts, and a reader past the limit is dropped.
    pub max_queue: usize,
    /// Most concurrent WebSocket connections; more handshakes get 503. Default: none
    /// (the open-files limit is the ceiling).
    pub max_conns: Option<usize>,
    /// Most concurrent WebSocket connections from one IP address; more get 429.
    /// Default: none.
    pub max_conns_per_ip: Option<u32>,
    /// Bearer key for the publish API. Default: none, and then only loopback peers
    /// may publish.
    pub api_key: Option<String>,
    /// The secret subscription tokens are signed with (HS256). Default: none, and
    /// then anyone may subscribe.
    pub token_secret: Option<String>,
    /// Origins whose browser pages may connect. Default: empty, any origin.
    pub allowed_origins: Vec<String>,
    /// Host names a request's `Host` may be (`--allowed-host`), lower-case.
    /// Default: empty, see [`crate::origin`].
    pub allowed_hosts: Vec<String>,
    /// Peers whose `X-Forwarded-For` names the client (`--trusted-proxy`).
    /// Default: none, every client is its socket's peer.
    pub trusted_proxies: Vec<Network>,
    /// Prepended to every echoed text message. Default: empty.
    pub echo_prefix: String,
    /// permessage-deflate for clients that offer it (`--permessage-deflate`).
    /// Default: off.
    pub permessage_deflate: bool,
    /// How it compresses (`--deflate-min-size`, `--deflate-level`).
    pub compression: crate::protocol::deflate::Compression,
    /// Pusher Channels apps (`--pusher-app`). Default: none.
    pub pusher_apps: Vec<crate::pusher::App>,
    /// Pusher clients may send client events (`--pusher-client-events on`).
    /// Default: off.
    pub pusher_client_events: bool,
    /// Most users of one presence channel. Default 100 (Pusher's).
    pub pusher_max_presence_members: usize,
    /// On SIGTERM/SIGINT, how long clients get to receive their 1001 and go before
    /// the process exits anyway. Default 10 s.
    pub drain_timeout: Duration,
    /// How often the stats block is printed. Default 10 s; zero: never.
    pub stats_interval: Duration,
    /// Testing only (`--test-time-scale`, hidden): the factor on `timing`'s
    /// scaled timers. Default 1, the timers as they are.
    pub test_time_scale: f64,
    /// Messages each channel keeps for clients that come back. Default 100; zero
    /// keeps none. A kept message costs its payload, an 8-byte entry and ring rounding
    /// (about 55 bytes for a 32-byte payload, measured).
    pub history_size: usize,
    /// How long a kept message stays, in whole seconds. Default 5 min; zero keeps
    /// none. Expired messages give their memory back.
    pub history_ttl: Duration,
    /// What every channel's history of this process may hold together (payloads,
    /// names and 8-byte entries; the rings may round that up to twice on the heap).
    /// Default 256 MiB. Past it a growing channel drops its own oldest, and the
    /// broker's housekeeping (every 10 s) cuts the largest channels to 7/8 of it;
    /// what goes is told as a gap like expiry. The memory broker's only: with Redis
    /// the history is Redis's.
    pub history_max_bytes: usize,
    /// How fast one connection may send chat messages (`--chat-rate`,
    /// `--chat-burst`). Default 20/s, 40 at once; a rate of zero: no limit. The
    /// loop keeps a bucket only for connections that chatted lately.
    pub chat_rate: crate::rate::ChatRate,
    /// Where channels live. Default `memory` (this process only); `redis://…` shares
    /// seq, history, presence and delivery with every node on that Redis, at one
    /// Redis round trip per publish and per resuming subscribe; `redis-sentinel://…`
    /// does that on the master Sentinel names, following its failovers.
    pub broker: BrokerSpec,
    /// How a node listens to Redis. Default `channels`: it subscribes to the
    /// channels it has subscribers of (the first subscriber of a channel on a node
    /// waits for Redis to confirm); `pattern`: one PSUBSCRIBE, nothing to wait for,
    /// but every node gets every message.
    pub redis_subscribe: crate::broker::Subscribe,
    /// Replicas a publish waits for (`--redis-wait-replicas`).
    pub redis_wait_replicas: u32,
    /// What every Redis name starts with (`--redis-prefix`).
    pub redis_prefix: String,
    /// Receive through io_uring where the kernel allows it (`auto`, the default):
    /// each loop keeps a multishot receive armed per busy connection (8 reads in a
    /// second; a quiet second moves it back to epoll), into a pool of buffers it
    /// shares among them (128 KiB from the first one, doubling up to 2 MiB while
    /// receives find it empty), and waits for both those and epoll in one
    /// `io_uring_enter` (docs/BENCHMARKS.md §16–17). False (`off`), or a kernel
    /// without it: epoll and `recv` for every connection.
    pub io_uring: bool,
    /// TLS on every listener: the certificate chain and key files (read at
    /// start and again on SIGHUP). Default: none (plain ws:// and http://).
    pub tls: Option<TlsFiles>,
    /// Worker processes sharing the listeners. Default 1 (this process serves);
    /// above 1 a master runs that many and restarts any that dies, each holding up
    /// to its own open-files limit. Needs a Redis broker.
    pub workers: usize,
    /// Share listen ports another process already listens on (`--reuse-port`).
    /// Default: off, and such a port stops the start, so that a second server
    /// started by mistake on a port does not take half of its connections. A
    /// worker of `--workers` shares its master's ports whatever this says.
    pub reuse_port: bool,
    /// Namespaces the config file declares (`[namespaces.NAME]`), each overriding
    /// the built-in rules and the history flags for its channels. Default: none
    /// (`chat:*` channels are chat rooms, every other channel is push-only).
    pub namespaces: Namespaces,
}

/// Where TLS's certificate chain and private key are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `--tls-ticket-key`: the secret session tickets are sealed with.
    pub ticket_key: Option<PathBuf>,
}

/// A built-in default from [`defaults`]; a unit test proves every one parses.
fn builtin<T>(parse: fn(&str) -> Result<T, String>, value: &str) -> T {
    match parse(value) {
        Ok(v) => v,
        Err(e) => panic!("built-in default {value:?} does not parse: {e}"),
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        let listen: ListenSpec = builtin(str::parse, defaults::LISTEN);
        ServeConfig {
            listen: listen.addrs().collect(),
            threads: default_threads(),
            ping_interval: builtin(parse_duration, defaults::PING_INTERVAL),
            idle_timeout: builtin(parse_duration, defaults::IDLE_TIMEOUT),
            handshake_timeout: builtin(parse_duration, defaults::HANDSHAKE_TIMEOUT),
            max_message_size: builtin(parse_size, defaults::MAX_MESSAGE_SIZE),
            max_queue: builtin(parse_size, defaults::MAX_QUEUE),
            max_conns: None,
            max_conns_per_ip: None,
            api_key: None,
            token_secret: None,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            trusted_proxies: Vec::new(),
            echo_prefix: defaults::ECHO_PREFIX.to_string(),
            pusher_apps: Vec::new(),
            pusher_client_events: false,
            pusher_max_presence_members: 100,
            permessage_deflate: builtin(parse_on_off, defaults::PERMESSAGE_DEFLATE),
            compression: crate::protocol::deflate::Compression {
                min_size: builtin(parse_size, defaults::DEFLATE_MIN_SIZE),
                level: builtin(
                    |s| s.parse().map_err(|e| format!("{e}")),
                    defaults::DEFLATE_LEVEL,
                ),
            },
            drain_timeout: builtin(parse_duration, defaults::DRAIN_TIMEOUT),
            stats_interval: builtin(parse_duration, defaults::STATS_INTERVAL),
            test_time_scale: 1.0,
            history_size: builtin(
                |s| s.parse().map_err(|e| format!("{e}")),
                defaults::HISTORY_SIZE,
            ),
            history_ttl: builtin(parse_duration, defaults::HISTORY_TTL),
            history_max_bytes: builtin(parse_size, defaults::HISTORY_MAX_BYTES),
            chat_rate: crate::rate::ChatRate {
                per_second: builtin(crate::rate::parse_rate, defaults::CHAT_RATE),
                burst: builtin(
                    |s| s.parse().map_err(|e| format!("{e}")),
                    defaults::CHAT_BURST,
                ),
            },
            broker: builtin(str::parse, defaults::BROKER),
            workers: builtin(|s| s.parse().map_err(|e| format!("{e}")), defaults::WORKERS),
            reuse_port: builtin(parse_on_off, defaults::REUSE_PORT),
            redis_subscribe: builtin(parse_redis_subscribe, defaults::REDIS_SUBSCRIBE),
            redis_wait_replicas: builtin(
                |s| s.parse().map_err(|e| format!("{e}")),
                defaults::REDIS_WAIT_REPLICAS,
            ),
            redis_prefix: defaults::REDIS_PREFIX.into(),
            io_uring: builtin(parse_io_uring, defaults::IO_URING),
            tls: None,
            namespaces: Namespaces::default(),
        }
    }
}

/// A setting that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML")]
    Toml {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error(
        "config file {path}: unknown key '{key}' (keys are the serve flags' names, e.g. echo-prefix)"
    )]
    UnknownKey { path: PathBuf, key: String },
    #[error(
        "config file {path}: key '{key}' must be a string, number or boolean (or an array of them for listen)"
    )]
    BadValue { path: PathBuf, key: String },
    #[error("config file {path}: [namespaces.{name}]: {reason}")]
    Namespace {
        path: PathBuf,
        name: String,
        reason: String,
    },
    #[error("--pusher-app {id}")]
    AppId {
        id: Box<str>,
        source: crate::pusher::IdClash,
    },
    #[error("{0}")]
    Invalid(String),
}

impl ServeArgs {
    pub fn into_config(self) -> Result<ServeConfig, ConfigError> {
        let threads = self.threads.unwrap_or_else(default_threads);
        if threads == 0 || threads > 1024 {
            return Err(ConfigError::Invalid(format!(
                "--threads must be 1..=1024, not {threads}"
            )));
        }
        let listen: Vec<SocketAddr> = self.listen.iter().flat_map(|s| s.addrs()).collect();
        if listen.is_empty() {
            return Err(ConfigError::Invalid("--listen names no address".into()));
        }
        if self.max_message_size == 0 {
            return Err(ConfigError::Invalid(
                "--max-message-size must be above 0".into(),
            ));
        }
        if self.max_queue == 0 {
            return Err(ConfigError::Invalid("--max-queue must be above 0".into()));
        }
        if self.handshake_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "--handshake-timeout must be above 0".into(),
            ));
        }
        let file_apps = match &self.config {
            Some(path) => pusher_apps_from_file(path)?,
            None => Vec::new(),
        };
        if self.pusher_max_presence_members == 0 {
            return Err(ConfigError::Invalid(
                "--pusher-max-presence-members must be above 0".into(),
            ));
        }
        let mut pusher_apps = self.pusher_app;
        for app in &mut pusher_apps {
            app.client_events = self.pusher_client_events;
            app.max_presence_members = self.pusher_max_presence_members;
            app.webhooks = self.pusher_webhook.clone();
        }
        for file_app in file_apps {
            let mut app = file_app.app;
            app.client_events = file_app.client_events.unwrap_or(self.pusher_client_events);
            app.max_presence_members = file_app
                .max_presence_members
                .unwrap_or(self.pusher_max_presence_members);
            app.webhooks = file_app
                .webhooks
                .unwrap_or_else(|| self.pusher_webhook.clone());
            pusher_apps.push(app);
        }
        for (i, app) in pusher_apps.iter().enumerate() {
            let earlier = &pusher_apps[..i];
            if earlier.iter().any(|a| a.id == app.id || a.key == app.key) {
                return Err(ConfigError::Invalid(format!(
                    "--pusher-app {}: another app has the same id or key",
                    app.id
                )));
            }
        }
        let namespaces = match &self.config {
            Some(path) => namespaces_from_file(path)?,
            None => Namespaces::default(),
        };
        for app in &pusher_apps {
            if let Some(source) = crate::pusher::id_clash(&app.id, &namespaces) {
                return Err(ConfigError::AppId {
                    id: app.id.clone(),
                    source,
                });
            }
        }
        if pusher_apps.len() > usize::from(u16::MAX) {
            return Err(ConfigError::Invalid("too many --pusher-app".into()));
        }
        if self.chat_burst == 0 {
            return Err(ConfigError::Invalid(
                "--chat-burst must be at least 1".into(),
            ));
        }
        if self.history_ttl.subsec_nanos() != 0 {
            return Err(ConfigError::Invalid(format!(
                "--history-ttl must be whole seconds (or 0 for no history), not {:?}",
                self.history_ttl
            )));
        }
        // One echoed message of the largest size must fit in the queue, or every
        // large echo would look like a slow consumer.
        let largest_reply = self.max_message_size + self.echo_prefix.len() + MAX_FRAME_HEADER;
        let max_queue = self.max_queue.max(largest_reply);
        Ok(ServeConfig {
            listen,
            threads,
            ping_interval: self.ping_interval,
            idle_timeout: self.idle_timeout,
            handshake_timeout: self.handshake_timeout,
            max_message_size: self.max_message_size,
            max_queue,
            max_conns: self.max_conns,
            max_conns_per_ip: self.max_conns_per_ip,
            api_key: self.api_key.filter(|k| !k.is_empty()),
            token_secret: self.token_secret.filter(|k| !k.is_empty()),
            allowed_origins: self
                .allowed_origin
                .into_iter()
                .map(|o| o.trim_end_matches('/').to_string())
                .filter(|o| !o.is_empty())
                .collect(),
            allowed_hosts: self
                .allowed_host
                .into_iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            trusted_proxies: self.trusted_proxy,
            echo_prefix: self.echo_prefix,
            pusher_apps,
            pusher_client_events: self.pusher_client_events,
            pusher_max_presence_members: self.pusher_max_presence_members,
            permessage_deflate: self.permessage_deflate,
            compression: crate::protocol::deflate::Compression {
                min_size: self.deflate_min_size,
                level: self.deflate_level,
            },
            drain_timeout: self.drain_timeout,
            stats_interval: self.stats_interval,
            test_time_scale: self.test_time_scale,
            history_size: self.history_size,
            history_ttl: self.history_ttl,
            history_max_bytes: self.history_max_bytes,
            chat_rate: crate::rate::ChatRate {
                per_second: self.chat_rate,
                burst: self.chat_burst,
            },
            broker: self.broker,
            workers: self.workers,
            reuse_port: self.reuse_port,
            redis_subscribe: self.redis_subscribe,
            redis_wait_replicas: self.redis_wait_replicas,
            redis_prefix: self.redis_prefix,
            io_uring: self.io_uring,
            tls: match (self.tls_cert, self.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert,
                    key,
                    ticket_key: self.tls_ticket_key,
                }),
                (None, None) => None,
                _ => {
                    return Err(ConfigError::Invalid(
                        "--tls-cert and --tls-key go together".into(),
                    ));
                }
            },
            namespaces,
        })
    }
}

/// Reads `ServeArgs` back out of matches parsed with a file-adjusted command.
pub fn serve_args_from(matches: &ArgMatches) -> Result<ServeArgs, clap::Error> {
    ServeArgs::from_arg_matches(matches)
}

mod file;
pub use file::{
    FileApp, apply_config_file, config_path_from, namespaces_from_file, pusher_apps_from_file,
};

#[cfg(test)]
mod tests;
