//! `throng bench`'s flags: [`BenchArgs`] (each doc line is its `--help` text),
//! the kinds they choose from ([`Mode`], [`Transport`], [`Protocol`],
//! [`SeqFrom`]), the parsers of their values, and the server URL ([`WsUrl`]).
//!
//! It owns what a flag accepts, nothing more: what the flags mean together
//! (validation, plans, children's arguments) is `setup`'s.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::client::HttpUrl;
use crate::units::{parse_duration, parse_size};

/// What the connections do once open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Send a message, wait for its echo, send the next (one in flight per connection)
    Echo,
    /// Open, hold, answer pings; count pings and drops
    Idle,
    /// Subscribe over --channels; a publisher POSTs --publish-rate messages/s; check seqs
    Push,
    /// Rooms of --room-size; a --senders fraction sends every --send-interval
    Chat,
    /// TLS handshakes/s: --conns connections one after another per thread (each a
    /// handshake, a GET of --url's path, a close), without and then with session
    /// resumption; reports how many resumed (--url https://HOST:PORT/healthz)
    Handshakes,
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Echo => "echo",
            Mode::Idle => "idle",
            Mode::Push => "push",
            Mode::Chat => "chat",
            Mode::Handshakes => "handshakes",
        }
    }

    pub(super) fn default_size(self) -> usize {
        match self {
            Mode::Echo | Mode::Idle | Mode::Handshakes => 32,
            Mode::Push => 64,
            Mode::Chat => 1024,
        }
    }
}

/// How push-mode subscribers reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// WebSocket (`/ws/{channel}?format=json`)
    Ws,
    /// Server-Sent Events (`/sse/{channel}`), plain or chunked
    Sse,
    /// HTTP long-polling (`/poll/{channel}?timeout=30`), polling again with `since=next`
    Poll,
}

impl Transport {
    pub(super) fn name(self) -> &'static str {
        match self {
            Transport::Ws => "ws",
            Transport::Sse => "sse",
            Transport::Poll => "poll",
        }
    }

    pub(super) fn default_path(self) -> &'static str {
        match self {
            Transport::Ws => "/ws/{channel}?format=json",
            Transport::Sse => "/sse/{channel}",
            Transport::Poll => "/poll/{channel}?timeout=30",
        }
    }
}

/// What the connections speak on top of their transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    /// throng's own (and any plain WebSocket, SSE or long-poll server's)
    Throng,
    /// Pusher Channels protocol 7 over WebSocket (/app/KEY): push and idle
    /// subscribe to their channel; push publishes through the signed HTTP API
    Pusher,
}

impl Protocol {
    pub(super) fn name(self) -> &'static str {
        match self {
            Protocol::Throng => "throng",
            Protocol::Pusher => "pusher",
        }
    }
}

/// Where push mode reads a delivery's position in its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SeqFrom {
    /// The server's seq: json `seq`, the leading number of an SSE `id:`, a poll's `seq`
    Server,
    /// The publisher's own count, written in each payload (`<unix ns> <n> ...`); for
    /// servers without seqs (Nchan, say)
    Payload,
}

/// A port range `A-B` (or one port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange(pub u16, pub u16);

fn parse_ports(s: &str) -> Result<PortRange, String> {
    let bad = || format!("'{s}' is not a port or a port range like 9000-9099");
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: u16 = a.trim().parse().map_err(|_| bad())?;
    let b: u16 = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || b < a {
        return Err(bad());
    }
    Ok(PortRange(a, b))
}

/// Source addresses: `127.0.0.2-127.0.0.40`, `10.0.0.1,10.0.0.2`, or both mixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceIps(pub Vec<IpAddr>);

/// Most source addresses one range may expand to.
const MAX_SOURCE_IPS: u32 = 65_536;

fn parse_source_ips(s: &str) -> Result<SourceIps, String> {
    let mut ips = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let bad = || format!("'{part}' is not an IPv4 range like 127.0.0.2-127.0.0.40");
            let a: Ipv4Addr = a.trim().parse().map_err(|_| bad())?;
            let b: Ipv4Addr = b.trim().parse().map_err(|_| bad())?;
            let (a, b) = (u32::from(a), u32::from(b));
            if b < a || b - a >= MAX_SOURCE_IPS {
                return Err(format!(
                    "'{part}': the range must go upwards and hold at most {MAX_SOURCE_IPS} addresses"
                ));
            }
            ips.extend((a..=b).map(|v| IpAddr::V4(Ipv4Addr::from(v))));
        } else {
            ips.push(
                part.parse::<IpAddr>()
                    .map_err(|_| format!("'{part}' is not an IP address"))?,
            );
        }
    }
    if ips.is_empty() {
        return Err("no source addresses given".into());
    }
    Ok(SourceIps(ips))
}

/// `--report FILE.html`: refused (before anything runs) unless its directory exists
/// and can be written to.
fn parse_report_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("give the report's file name, such as report.html".into());
    }
    let path = PathBuf::from(s);
    if s.ends_with('/') || path.is_dir() {
        return Err(format!(
            "'{s}' is a directory; give a file name, such as {}/report.html",
            s.trim_end_matches('/')
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "directory '{}' does not exist (the report is written at the end of the run; create the directory first)",
            dir.display()
        ));
    }
    if !writable(&dir) {
        return Err(format!("directory '{}' is not writable", dir.display()));
    }
    Ok(path)
}

/// Whether this process may create files in `dir`.
fn writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// `ws://host[:port][/path]` (or `http://` for the comet transports; `wss://` and
/// `https://` for the same over TLS), split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsUrl {
    /// Written as `http://` or `https://`.
    pub http: bool,
    /// Written as `wss://` or `https://`: every connection speaks TLS.
    pub tls: bool,
    pub host: String,
    /// As written, or the scheme's (80; 443 under TLS).
    pub port: u16,
    /// `host:port` as written, for the Host header.
    pub authority: String,
    /// Path and query, at least `/`.
    pub path: String,
}

impl WsUrl {
    pub fn parse(url: &str) -> Result<WsUrl, String> {
        let (rest, http, tls) = [
            ("ws://", false, false),
            ("http://", true, false),
            ("wss://", false, true),
            ("https://", true, true),
        ]
        .into_iter()
        .find_map(|(scheme, http, tls)| url.strip_prefix(scheme).map(|r| (r, http, tls)))
        .ok_or_else(|| format!("'{url}' is not a ws:// or wss://host:port/path URL"))?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let parsed = HttpUrl::parse(&format!("http://{}", with_port(authority, tls)))
            .map_err(|e| e.to_string())?;
        Ok(WsUrl {
            http,
            tls,
            host: parsed.host.clone(),
            port: parsed.port,
            authority: authority.to_string(),
            path,
        })
    }

    /// The scheme as written (`ws`, `wss`, `http`, `https`).
    pub fn scheme(&self) -> &'static str {
        match (self.http, self.tls) {
            (false, false) => "ws",
            (false, true) => "wss",
            (true, false) => "http",
            (true, true) => "https",
        }
    }
}

/// `authority` with 443 added when it names no port and `tls` is on (80, the
/// plain default, is what an `http://` URL without a port already means).
pub(super) fn with_port(authority: &str, tls: bool) -> std::borrow::Cow<'_, str> {
    let has_port = match authority.rsplit_once(':') {
        // `[::1]` alone ends in `]`; `[::1]:9` and `h:9` end in digits.
        Some((host, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!host.contains(':') || host.ends_with(']'))
        }
        None => false,
    };
    if tls && !has_port {
        std::borrow::Cow::Owned(format!("{authority}:443"))
    } else {
        std::borrow::Cow::Borrowed(authority)
    }
}

pub(super) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The flags of TLS runs (`wss://`, `https://` in --url or --publish-url).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "TLS (wss://, https://)")]
pub struct TlsArgs {
    /// Accept any server certificate (self-signed test certificates); the
    /// handshake's signatures are still checked
    #[arg(long, conflicts_with = "ca")]
    pub insecure: bool,

    /// Trust the CA certificates in this PEM file instead of the Mozilla roots
    /// built into the bench
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,

    /// handshakes: only the pass without session resumption
    #[arg(long)]
    pub no_resume: bool,
}

/// `throng bench` flags. Each doc line is its `--help` text.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What each connection does
    #[arg(value_enum)]
    pub mode: Mode,

    /// Server URL: ws:// or wss:// (TLS; http:// or https:// for --transport sse
    /// and poll); in push and chat modes `{channel}` in the path is replaced by the
    /// channel (default path then: /ws/{channel}?format=json)
    #[arg(long, default_value = "ws://127.0.0.1:8080/")]
    pub url: String,

    /// Spread connections over this port range of the URL's host [default: the URL's port]
    #[arg(long, value_name = "A-B", value_parser = parse_ports)]
    pub ports: Option<PortRange>,

    /// Connections to open (over all --procs)
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub conns: u64,

    /// New connections per second; 0 = as fast as possible
    #[arg(long, value_name = "PER_SEC", default_value_t = 1000.0)]
    pub rate: f64,

    /// At most this many connections opening (TCP connect + upgrade) at once, over
    /// all --procs; new ones wait for a place, so a server slower than --rate is
    /// never sent more than it can take (otherwise its queue grows until the
    /// connect timeout fails them all); 0 = no limit
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub max_opening: u64,

    /// How long the load runs once every connection is open
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,

    /// Message size in bytes [default: echo 32, push 64, chat 1KiB]
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub size: Option<usize>,

    /// Bind connections round-robin to these source addresses (127.0.0.2-127.0.0.40,
    /// or a comma list), so one machine holds more than 64k client sockets
    #[arg(long, value_name = "IPS", value_parser = parse_source_ips)]
    pub source_ips: Option<SourceIps>,

    /// Split the connections over this many child processes and merge their results
    #[arg(long, value_name = "P", default_value_t = 1)]
    pub procs: usize,

    /// Event-loop threads per process [default: cores, divided among --procs]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Print a status line this often (stderr); 0 = never
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,

    /// Print one JSON object with every figure instead of the text report
    #[arg(long)]
    pub json: bool,

    /// Also write the report as one self-contained HTML page: settings, machine,
    /// latency percentiles and histogram, messages/s and open connections per
    /// second, failures (the directory must exist)
    #[arg(long, value_name = "FILE.html", value_parser = parse_report_path)]
    pub report: Option<PathBuf>,

    /// Exit 0 even when connections failed or dropped
    #[arg(long)]
    pub allow_failures: bool,

    /// A connection not open (TCP connect, TLS handshake, upgrade) within this time
    /// counts as timed out
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// After the load: how long to wait for messages still in flight
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub grace: Duration,

    /// push (and idle under --protocol pusher): number of channels; subscribers are
    /// spread round-robin over them
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub channels: u64,

    /// push (and idle under --protocol pusher): channel names are this prefix plus
    /// 0..K (under pusher, a private- or presence- prefix makes the bench sign each
    /// subscription; in a presence- channel each connection is a user of its own,
    /// u<index>, so --conns / --channels must stay within the server's member limit)
    #[arg(long, value_name = "PREFIX", default_value = "bench-")]
    pub channel_prefix: String,

    /// push: messages per second published in total (over all channels)
    #[arg(long, value_name = "PER_SEC", default_value_t = 100.0)]
    pub publish_rate: f64,

    /// push: the server's HTTP API [default: http://HOST:PORT of --url, https://
    /// under wss:// or https://] (under
    /// pusher, the signed events API is /apps/ID/events after it)
    #[arg(long, value_name = "URL")]
    pub publish_url: Option<String>,

    /// push: bearer key for the publish API
    #[arg(
        long,
        env = "THRONG_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,

    /// push and chat: a subscription token (JWT) for a server run with
    /// --token-secret, sent as ?token= on every subscribing connection
    #[arg(long, env = "THRONG_TOKEN", value_name = "JWT", hide_env_values = true)]
    pub token: Option<String>,

    /// push: publisher threads (each one request at a time) [default: rate / 200, 1..32]
    #[arg(long, value_name = "N")]
    pub publishers: Option<usize>,

    /// push: how subscribers connect; with sse or poll, --url may be http:// and its
    /// path defaults to /sse/{channel} or /poll/{channel}?timeout=30
    #[arg(long, value_enum, value_name = "T", default_value = "ws")]
    pub transport: Transport,

    /// push and idle: the protocol spoken; pusher needs --pusher-app (or --pusher-key,
    /// --pusher-secret and --pusher-app-id), numbers messages in their payload
    /// (--seq-from payload) and publishes through POST /apps/ID/events
    #[arg(long, value_enum, value_name = "P", default_value = "throng")]
    pub protocol: Protocol,

    /// pusher: the app, ID:KEY:SECRET (as `throng serve --pusher-app`)
    #[arg(
        long,
        env = "THRONG_PUSHER_APP",
        value_name = "ID:KEY:SECRET",
        hide_env_values = true
    )]
    pub pusher_app: Option<crate::pusher::App>,

    /// pusher: the app's key (with --pusher-secret and --pusher-app-id, instead of
    /// --pusher-app)
    #[arg(long, value_name = "KEY")]
    pub pusher_key: Option<String>,

    /// pusher: the app's secret, which signs private-* subscriptions and API requests
    #[arg(
        long,
        env = "THRONG_PUSHER_SECRET",
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub pusher_secret: Option<String>,

    /// pusher: the app's id (in the API's path, /apps/ID/events)
    #[arg(long, value_name = "ID")]
    pub pusher_app_id: Option<String>,

    /// push: where each delivery's position comes from (payload: the bench numbers
    /// its messages itself, for servers without seqs; over ws a frame that is not
    /// throng's JSON envelope then counts as the published body itself)
    #[arg(long, value_enum, value_name = "FROM", default_value = "server")]
    pub seq_from: SeqFrom,

    /// push: every publish carries its own idempotency key (`Idempotency-Key`, or
    /// the Pusher event's "idempotency_key"), to measure what remembering keys costs
    #[arg(long)]
    pub idempotency_keys: bool,

    /// push: this fraction of subscribers drops its connection every
    /// --reconnect-interval and resumes from the last message it got (ws: since=,
    /// sse: Last-Event-ID, poll: since=); loss and duplicates are checked across
    #[arg(long, value_name = "FRACTION", default_value_t = 0.0)]
    pub reconnect: f64,

    /// push: how often each --reconnect subscriber drops and resumes
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub reconnect_interval: Duration,

    /// push: a subscriber the server lets go with a "come back" signal (close
    /// 1001, 1011, 1012, 1013 or 1008 "slow consumer", a reset, a refused connect,
    /// an ended stream, a 5xx) comes back after a random delay in
    /// [0, DURATION * 2^tries) (at most --backoff-cap) and resumes; 0: it is dropped
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_duration)]
    pub backoff: Duration,

    /// push: the longest a subscriber let go waits before trying to come back
    /// (the ceiling of --backoff's doubling); at least --backoff
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub backoff_cap: Duration,

    /// chat: members per room (room i holds connections i*size ..)
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub room_size: u64,

    /// chat: fraction of members that send
    #[arg(long, value_name = "FRACTION", default_value_t = 0.8)]
    pub senders: f64,

    /// chat: each sender sends one message this often
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub send_interval: Duration,

    /// chat: room names are chat:PREFIX0, chat:PREFIX1, ...
    #[arg(long, value_name = "PREFIX", default_value = "bench-room-")]
    pub room_prefix: String,

    /// Internal: this process is child I of a --procs run
    // u32 (there are never 4 billion children) keeps `BenchArgs` within
    // clippy's `large_enum_variant` margin over the other commands' flags.
    #[arg(long, hide = true)]
    pub child_index: Option<u32>,

    /// Internal: global index of the first connection of this child
    #[arg(long, hide = true, default_value_t = 0)]
    pub conn_offset: u64,

    /// TLS (wss://, https://): what to trust, and `handshakes`' passes. Last: its
    /// help heading holds for the flags after it. Boxed: most runs are plain.
    #[command(flatten)]
    pub tls: Box<TlsArgs>,
}
