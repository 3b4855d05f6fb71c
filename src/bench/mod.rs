//! `throng bench`: a load generator for any RFC 6455 WebSocket server (and, in
//! push mode, for Server-Sent Events and long-polling servers).
//!
//! This module owns the command's flags ([`BenchArgs`]), their validation, and the
//! run's timeline: open every connection at `--rate` (progress bar), start the
//! load once all are open, print a status line every `--interval`, stop after
//! `--duration`, let in-flight messages land, close, and report. The pieces:
//! - [`client`]: the mio event loops that hold the connections and run each mode;
//! - `comet`: reading event streams and long-poll answers for push mode;
//! - `fleet`: this process's loops, or `--procs` child processes and their protocol;
//! - `publish`: push mode's HTTP publisher;
//! - [`report`]: counters, seq tracking, histogram merging, the timeline, the
//!   printed report;
//! - [`html`] (in `report/`): the report as one self-contained HTML page
//!   (`--report FILE.html`).
//!
//! It must not touch the server's code or state; it talks to servers only over
//! the network, so it works against throng and any other WebSocket server.

pub mod client;
mod comet;
mod fleet;
mod publish;
pub mod report;

pub use report::html;

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::client::HttpUrl;
use crate::config::{parse_duration, parse_size};
use client::{Plan, phase};
use fleet::{ChildFleet, Fleet, LocalFleet};
use publish::{PublishPlan, Publisher};
use report::{
    Counters, Machine, Phase, PublishSummary, RawResult, Report, RunInfo, Timeline, TimelineSample,
};

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
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Echo => "echo",
            Mode::Idle => "idle",
            Mode::Push => "push",
            Mode::Chat => "chat",
        }
    }

    fn default_size(self) -> usize {
        match self {
            Mode::Echo | Mode::Idle => 32,
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
    fn name(self) -> &'static str {
        match self {
            Transport::Ws => "ws",
            Transport::Sse => "sse",
            Transport::Poll => "poll",
        }
    }

    fn default_path(self) -> &'static str {
        match self {
            Transport::Ws => "/ws/{channel}?format=json",
            Transport::Sse => "/sse/{channel}",
            Transport::Poll => "/poll/{channel}?timeout=30",
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

/// `ws://host[:port][/path]` (or `http://` for the comet transports), split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsUrl {
    /// Written as `http://`.
    pub http: bool,
    pub host: String,
    pub port: u16,
    /// `host:port` as written, for the Host header.
    pub authority: String,
    /// Path and query, at least `/`.
    pub path: String,
}

impl WsUrl {
    pub fn parse(url: &str) -> Result<WsUrl, String> {
        if url.starts_with("wss://") || url.starts_with("https://") {
            return Err(format!(
                "'{url}': TLS is not supported; use ws:// (or http:// for sse and poll)"
            ));
        }
        let http = url.starts_with("http://");
        let rest = url
            .strip_prefix("ws://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(|| format!("'{url}' is not a ws://host:port/path URL"))?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let parsed = HttpUrl::parse(&format!("http://{authority}")).map_err(|e| e.to_string())?;
        Ok(WsUrl {
            http,
            host: parsed.host.clone(),
            port: parsed.port,
            authority: authority.to_string(),
            path,
        })
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `throng bench` flags. Each doc line is its `--help` text.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What each connection does
    #[arg(value_enum)]
    pub mode: Mode,

    /// Server URL; in push and chat modes `{channel}` in the path is replaced by the
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

    /// A connection not open (TCP connect + upgrade) within this time counts as timed out
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// After the load: how long to wait for messages still in flight
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub grace: Duration,

    /// push: number of channels; subscribers are spread round-robin over them
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub channels: u64,

    /// push: channel names are this prefix plus 0..K
    #[arg(long, value_name = "PREFIX", default_value = "bench-")]
    pub channel_prefix: String,

    /// push: messages per second published in total (over all channels)
    #[arg(long, value_name = "PER_SEC", default_value_t = 100.0)]
    pub publish_rate: f64,

    /// push: the server's HTTP API [default: http://HOST:PORT of --url]
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

    /// push: where each delivery's position comes from (payload: the bench numbers
    /// its messages itself, for servers without seqs; over ws a frame that is not
    /// throng's JSON envelope then counts as the published body itself)
    #[arg(long, value_enum, value_name = "FROM", default_value = "server")]
    pub seq_from: SeqFrom,

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
    /// [0, DURATION * 2^tries) (at most 15 s) and resumes; 0: it is dropped
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_duration)]
    pub backoff: Duration,

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
    #[arg(long, hide = true)]
    pub child_index: Option<usize>,

    /// Internal: global index of the first connection of this child
    #[arg(long, hide = true, default_value_t = 0)]
    pub conn_offset: u64,
}

/// Descriptors a bench process keeps for itself (epoll, wakers, stdio, publisher).
const RESERVED_FDS: u64 = 100;

impl BenchArgs {
    fn size(&self) -> usize {
        self.size.unwrap_or(self.mode.default_size())
    }

    fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| (default_threads() / self.procs.max(1)).max(1))
    }

    fn validate(&self) -> Result<WsUrl, BenchError> {
        let bad = |m: String| Err(BenchError::BadArgs(m));
        let url = WsUrl::parse(&self.url).map_err(BenchError::BadArgs)?;
        if self.conns == 0 {
            return bad("--conns must be at least 1".into());
        }
        if !self.rate.is_finite() || self.rate < 0.0 {
            return bad(format!(
                "--rate {} must be 0 (unpaced) or a positive number",
                self.rate
            ));
        }
        if self.procs == 0 || self.procs as u64 > self.conns {
            return bad(format!(
                "--procs {} must be between 1 and --conns ({})",
                self.procs, self.conns
            ));
        }
        if self.threads == Some(0) {
            return bad("--threads must be at least 1".into());
        }
        if self.duration.is_zero() {
            return bad("--duration must be more than 0".into());
        }
        if self.connect_timeout.is_zero() {
            return bad("--connect-timeout must be more than 0".into());
        }
        if self.size() > 16 * 1024 * 1024 {
            return bad("--size is at most 16MiB".into());
        }
        match self.mode {
            Mode::Push => {
                if self.channels == 0 || self.channels > 1_000_000 {
                    return bad("--channels must be between 1 and 1000000".into());
                }
                if !self.publish_rate.is_finite() || self.publish_rate <= 0.0 {
                    return bad("--publish-rate must be a positive number".into());
                }
                if self.publishers == Some(0) {
                    return bad("--publishers must be at least 1".into());
                }
                if !(0.0..=1.0).contains(&self.reconnect) {
                    return bad(format!(
                        "--reconnect {} must be between 0 and 1",
                        self.reconnect
                    ));
                }
                if self.reconnect > 0.0 && self.reconnect_interval.is_zero() {
                    return bad("--reconnect-interval must be more than 0".into());
                }
                if self.reconnect > 0.0
                    && self.seq_from == SeqFrom::Payload
                    && self.transport == Transport::Ws
                {
                    return bad(
                        "--reconnect with --seq-from payload does not work over --transport ws: a WebSocket resumes from the server's seq (sse resumes from Last-Event-ID, poll from the answer's next)".into(),
                    );
                }
                self.publish_url()?;
            }
            Mode::Chat => {
                if self.room_size == 0 {
                    return bad("--room-size must be at least 1".into());
                }
                if !(0.0..=1.0).contains(&self.senders) {
                    return bad(format!(
                        "--senders {} must be between 0 and 1",
                        self.senders
                    ));
                }
                if self.send_interval.is_zero() {
                    return bad("--send-interval must be more than 0".into());
                }
            }
            Mode::Echo | Mode::Idle => {}
        }
        if self.mode != Mode::Push && self.transport != Transport::Ws {
            return bad(format!(
                "--transport {} is for push mode; {} speaks WebSocket",
                self.transport.name(),
                self.mode.name()
            ));
        }
        if url.http && self.transport == Transport::Ws {
            return bad(format!(
                "--url '{}': http:// is for --transport sse or poll; WebSocket needs ws://",
                self.url
            ));
        }
        let per_proc = self.conns.div_ceil(self.procs as u64);
        if let Ok(limit) = crate::os::raise_open_files_limit() {
            let ceiling = limit.soft.saturating_sub(RESERVED_FDS);
            if per_proc > ceiling {
                return bad(format!(
                    "{per_proc} connections per process is over this process's open-files limit ({} -> at most {ceiling}); use --procs {} or raise `ulimit -n`\n{}",
                    limit.soft,
                    self.conns.div_ceil(ceiling.max(1)),
                    crate::tune::hint(self.conns)
                ));
            }
        }
        // One source address reaches one server port from at most the ephemeral range.
        let sources = self.source_ips.as_ref().map_or(1, |s| s.0.len().max(1)) as u64;
        let targets = self
            .ports
            .map_or(1, |PortRange(a, b)| u64::from(b.saturating_sub(a)) + 1);
        if let Some(ports) = crate::tune::ephemeral_ports()
            && self.child_index.is_none()
            && self.conns > ports * sources * targets
        {
            eprintln!(
                "warning: {} connections over {sources} source address(es) and {targets} server port(s) need more than the {ports} ephemeral ports each pair has; the rest will fail to connect. {}",
                self.conns,
                crate::tune::hint(self.conns)
            );
        }
        Ok(url)
    }

    fn publish_url(&self) -> Result<HttpUrl, BenchError> {
        let text = match &self.publish_url {
            Some(u) => u.clone(),
            None => {
                let url = WsUrl::parse(&self.url).map_err(BenchError::BadArgs)?;
                format!("http://{}", url.authority)
            }
        };
        HttpUrl::parse(&text).map_err(|e| BenchError::BadArgs(format!("--publish-url: {e}")))
    }

    /// The loops' plan for this process (`conns` of them from `conn_offset`).
    fn plan(&self, url: &WsUrl) -> Result<Plan, BenchError> {
        let ip = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| BenchError::BadArgs(format!("cannot resolve '{}': {e}", url.host)))?
            .map(|a| a.ip())
            .min_by_key(|ip| !ip.is_ipv4())
            .ok_or_else(|| BenchError::BadArgs(format!("'{}' has no address", url.host)))?;
        let PortRange(first_port, last_port) = self.ports.unwrap_or(PortRange(url.port, url.port));
        let path = match self.mode {
            Mode::Push if !url.path.contains("{channel}") => {
                self.transport.default_path().to_string()
            }
            Mode::Chat if !url.path.contains("{channel}") => {
                "/ws/{channel}?format=json".to_string()
            }
            _ => url.path.clone(),
        };
        let path = match (&self.token, self.mode) {
            (Some(token), Mode::Push | Mode::Chat) => {
                let sep = if path.contains('?') { '&' } else { '?' };
                format!("{path}{sep}token={token}")
            }
            _ => path,
        };
        let procs = self.procs.max(1) as f64;
        Ok(Plan {
            mode: self.mode,
            ip,
            first_port,
            last_port,
            host_header: url.authority.clone(),
            path,
            source_ips: self.source_ips.clone().map(|s| s.0).unwrap_or_default(),
            size: self.size(),
            connect_timeout: self.connect_timeout,
            send_interval: self.send_interval,
            room_size: self.room_size,
            senders: self.senders,
            channels: self.channels,
            channel_prefix: self.channel_prefix.clone(),
            room_prefix: self.room_prefix.clone(),
            transport: self.transport,
            seq_from: self.seq_from,
            reconnect: self.reconnect,
            reconnect_interval: self.reconnect_interval,
            comeback_backoff: self.backoff,
            conn_offset: self.conn_offset,
            conns: self.conns,
            threads: self.threads(),
            rate: if self.child_index.is_some() {
                self.rate
            } else {
                self.rate / procs
            },
            max_opening: if self.child_index.is_some() {
                self.max_opening
            } else {
                self.max_opening_per_proc()
            },
        })
    }

    /// Each process's share of `--max-opening` (0 stays "no limit").
    fn max_opening_per_proc(&self) -> u64 {
        if self.max_opening == 0 {
            0
        } else {
            (self.max_opening / self.procs.max(1) as u64).max(1)
        }
    }

    /// Arguments (after `throng bench`) for child `index` of a `--procs` run.
    fn child_args(
        &self,
        index: usize,
        offset: u64,
        conns: u64,
        ips: Option<&[IpAddr]>,
    ) -> Vec<String> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut a: Vec<String> = vec![
            self.mode.name().into(),
            "--url".into(),
            self.url.clone(),
            "--conns".into(),
            conns.to_string(),
            "--rate".into(),
            (self.rate / self.procs as f64).to_string(),
            "--max-opening".into(),
            self.max_opening_per_proc().to_string(),
            "--duration".into(),
            ms(self.duration),
            "--size".into(),
            self.size().to_string(),
            "--threads".into(),
            self.threads().to_string(),
            "--connect-timeout".into(),
            ms(self.connect_timeout),
            "--channels".into(),
            self.channels.to_string(),
            "--channel-prefix".into(),
            self.channel_prefix.clone(),
            "--room-size".into(),
            self.room_size.to_string(),
            "--senders".into(),
            self.senders.to_string(),
            "--send-interval".into(),
            ms(self.send_interval),
            "--room-prefix".into(),
            self.room_prefix.clone(),
            "--transport".into(),
            self.transport.name().into(),
            "--seq-from".into(),
            match self.seq_from {
                SeqFrom::Server => "server",
                SeqFrom::Payload => "payload",
            }
            .into(),
            "--reconnect".into(),
            self.reconnect.to_string(),
            "--reconnect-interval".into(),
            ms(self.reconnect_interval),
            "--backoff".into(),
            ms(self.backoff),
            "--child-index".into(),
            index.to_string(),
            "--conn-offset".into(),
            offset.to_string(),
            "--json".into(),
            "--allow-failures".into(),
        ];
        if let Some(PortRange(x, y)) = self.ports {
            a.push("--ports".into());
            a.push(format!("{x}-{y}"));
        }
        if let Some(ips) = ips {
            a.push("--source-ips".into());
            a.push(
                ips.iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        a
    }

    /// The run's settings as the HTML report lists them: (name, value).
    fn report_settings(&self) -> Vec<(&'static str, String)> {
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let mut s = vec![("mode", self.mode.name().to_string())];
        s.push(("url", self.url.clone()));
        if self.mode == Mode::Push {
            s.push(("transport", self.transport.name().to_string()));
        }
        s.push(("connections", crate::os::thousands(self.conns)));
        s.push((
            "connect rate",
            if self.rate == 0.0 {
                "unpaced".into()
            } else {
                format!("{} /s", self.rate)
            },
        ));
        s.push(("load duration", d(self.duration)));
        s.push(("message size", format!("{} B", self.size())));
        s.push((
            "processes × threads",
            format!("{} × {}", self.procs, self.threads()),
        ));
        if let Some(PortRange(a, b)) = self.ports {
            s.push(("ports", format!("{a}-{b}")));
        }
        if let Some(ips) = &self.source_ips {
            s.push(("source addresses", ips.0.len().to_string()));
        }
        match self.mode {
            Mode::Push => {
                s.push(("channels", crate::os::thousands(self.channels)));
                s.push(("publish rate", format!("{} /s", self.publish_rate)));
                if let Some(u) = &self.publish_url {
                    s.push(("publish url", u.clone()));
                }
                s.push((
                    "seq from",
                    match self.seq_from {
                        SeqFrom::Server => "server",
                        SeqFrom::Payload => "payload",
                    }
                    .into(),
                ));
                if self.reconnect > 0.0 {
                    s.push((
                        "reconnect",
                        format!(
                            "{} of subscribers every {}",
                            self.reconnect,
                            d(self.reconnect_interval)
                        ),
                    ));
                }
                s.push((
                    "come back",
                    if self.backoff.is_zero() {
                        "no: a subscriber let go is dropped".into()
                    } else {
                        format!("full-jitter backoff from {}", d(self.backoff))
                    },
                ));
            }
            Mode::Chat => {
                s.push(("room size", self.room_size.to_string()));
                s.push(("senders", self.senders.to_string()));
                s.push(("send interval", d(self.send_interval)));
            }
            Mode::Echo | Mode::Idle => {}
        }
        s.push(("grace", d(self.grace)));
        s
    }

    fn publish_plan(&self) -> Result<PublishPlan, BenchError> {
        let (url, path) = PublishPlan::target(self.publish_url()?);
        Ok(PublishPlan {
            url,
            path,
            api_key: self.api_key.clone(),
            channel_prefix: self.channel_prefix.clone(),
            channels: self.channels,
            rate: self.publish_rate,
            threads: self
                .publishers
                .unwrap_or_else(|| ((self.publish_rate / 200.0).ceil() as usize).clamp(1, 32)),
            size: self.size(),
            seq_from: self.seq_from,
        })
    }
}

/// Splits `conns` over `procs`: (offset, count) per child.
fn split_conns(conns: u64, procs: usize) -> Vec<(u64, u64)> {
    let p = procs.max(1) as u64;
    let mut out = Vec::new();
    let mut offset = 0;
    for i in 0..p {
        let n = conns / p + u64::from(i < conns % p);
        out.push((offset, n));
        offset += n;
    }
    out
}

/// Runs `throng bench`. Prints the report (or JSON) on stdout; returns
/// [`BenchError::Failures`] after the report when connections failed or dropped.
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    let started = SystemTime::now();
    let url = args.validate()?;
    let plan = args.plan(&url)?;
    // Ctrl-C (or SIGTERM) ends the load early and still prints the report; a second
    // one exits at once. Children ignore the terminal's Ctrl-C: their parent, which
    // got it too, tells them when to stop.
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if args.child_index.is_none() {
            signal_hook::flag::register_conditional_shutdown(
                signal,
                130,
                Arc::clone(&interrupted),
            )?;
        }
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    if args.child_index.is_some() {
        return fleet::run_child(plan);
    }
    let mut fleet: Box<dyn Fleet> = if args.procs > 1 {
        let ips = args.source_ips.as_ref().map(|s| s.0.as_slice());
        let lists = split_conns(args.conns, args.procs)
            .into_iter()
            .enumerate()
            .map(|(i, (offset, n))| {
                let slice = ips.map(|ips| {
                    if ips.len() >= args.procs {
                        let per = ips.len() / args.procs;
                        &ips[i * per..(i + 1) * per]
                    } else {
                        ips
                    }
                });
                args.child_args(i, offset, n, slice)
            })
            .collect();
        let secrets: Vec<(&str, &str)> = args
            .token
            .as_deref()
            .map(|t| ("THRONG_TOKEN", t))
            .into_iter()
            .collect();
        Box::new(ChildFleet::spawn(lists, &secrets)?)
    } else {
        Box::new(LocalFleet::start(plan)?)
    };
    let publisher = if args.mode == Mode::Push {
        Some(args.publish_plan()?)
    } else {
        None
    };
    let Driven {
        timing,
        publish,
        timeline,
    } = drive(&args, fleet.as_mut(), publisher, &interrupted)?;
    let raw = {
        let mut merged = fleet.finish()?;
        merged.at_load_start = timing.at_load_start;
        merged.at_load_end = timing.at_load_end;
        merged.load_secs = timing.load_secs;
        merged.connect_secs = timing.connect_secs;
        if args.procs > 1 {
            // The parent's own share: the publisher and the bookkeeping.
            merged.cpu_secs += report::self_cpu_secs();
            merged.max_rss_kb += report::proc_status_kb("VmHWM");
        }
        merged
    };
    let info = RunInfo {
        mode: args.mode.name().into(),
        url: args.url.clone(),
        conns: args.conns,
        threads: args.threads() as u64,
        echo: args.mode == Mode::Echo,
        chat: args.mode == Mode::Chat,
        transport: (args.mode == Mode::Push).then(|| args.transport.name().to_string()),
    };
    let mut report = Report::build(&info, &raw, publish.as_ref());
    report.timeline = timeline;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| BenchError::Loop(format!("cannot encode the report: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", report.to_text());
    }
    if let Some(path) = &args.report {
        write_html(&args, &report, &raw.latency_us, started, path)?;
    }
    let failures = report.errors;
    if failures > 0 && !args.allow_failures {
        return Err(BenchError::Failures(failures));
    }
    Ok(())
}

/// `--report`: renders the HTML page and writes it.
fn write_html(
    args: &BenchArgs,
    report: &Report,
    latency_pairs: &[[u64; 2]],
    started: SystemTime,
    path: &Path,
) -> Result<(), BenchError> {
    let argv: Vec<String> = std::env::args().collect();
    let page = html::Page {
        report,
        latency_pairs,
        settings: &args.report_settings(),
        machine: &Machine::detect(),
        command: &html::command_line(&argv),
        started_unix_secs: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let text = html::render(&page);
    std::fs::write(path, &text).map_err(|source| BenchError::Report {
        path: path.display().to_string(),
        source,
    })?;
    eprintln!(
        "HTML report written to {} ({} kB)",
        path.display(),
        text.len().div_ceil(1024)
    );
    Ok(())
}

/// How often the driver samples the fleet's counters for the timeline.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What [`drive`] hands back; the caller then finishes the fleet.
struct Driven {
    /// The timing figures, in a `RawResult` whose other fields are empty.
    timing: RawResult,
    /// Push: the publisher's summary.
    publish: Option<PublishSummary>,
    timeline: Vec<TimelineSample>,
}

/// The next sampling moment after `now`, on the `from + k * SAMPLE_EVERY` grid
/// (a late wake-up skips the moments it missed rather than sampling in a burst).
fn next_sample_after(from: Instant, now: Instant) -> Instant {
    let k = (now.saturating_duration_since(from).as_secs_f64() / SAMPLE_EVERY.as_secs_f64()).floor()
        as u32;
    from + SAMPLE_EVERY * (k + 1)
}

/// The timeline: connect, load, drain, close; the counters sampled once a second.
fn drive(
    args: &BenchArgs,
    fleet: &mut dyn Fleet,
    publish: Option<PublishPlan>,
    interrupted: &AtomicBool,
) -> Result<Driven, BenchError> {
    let t0 = Instant::now();
    let secs = |at: Instant| at.saturating_duration_since(t0).as_secs_f64();
    let mut timeline = Timeline::default();
    let mut next_sample = t0 + SAMPLE_EVERY;
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(Some(args.conns), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "connecting {bar:40} {pos}/{len} ({per_sec}, {elapsed}) {msg}",
        ) {
            bar.set_style(style);
        }
        bar
    };
    // With --json there is no bar: a status line every --interval says how far it got.
    let mut next_status = (args.json && !args.interval.is_zero()).then(|| t0 + args.interval);
    loop {
        if let Some(why) = fleet.broken() {
            bar.abandon();
            return Err(BenchError::Child {
                index: 0,
                reason: why,
            });
        }
        let c = fleet.live();
        let now = Instant::now();
        if now >= next_sample {
            timeline.record(secs(now), Phase::Connect, &c, c.messages_out);
            next_sample = next_sample_after(t0, now);
        }
        if let Some(at) = next_status
            && now >= at
        {
            eprintln!(
                "[connecting {:6.1}s] open {} of {} | failed {}",
                secs(now),
                c.open_now,
                args.conns,
                c.failed
            );
            next_status = Some(at + args.interval);
        }
        bar.set_position(c.opened + c.failed);
        if c.failed > 0 {
            bar.set_message(format!("{} failed", c.failed));
        }
        if c.target >= args.conns && c.connecting_done() {
            break;
        }
        if interrupted.load(Ordering::Relaxed) {
            eprintln!("interrupted while connecting: reporting what is open");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bar.finish_and_clear();
    let connect_secs = t0.elapsed().as_secs_f64();
    let at_load_start = fleet.live();
    // Push's senders are the publisher's threads, which start with the load.
    let push = args.mode == Mode::Push;
    let start_sent = if push { 0 } else { at_load_start.messages_out };
    timeline.close_phase(connect_secs, Phase::Connect, &at_load_start, start_sent);
    eprintln!(
        "opened {}/{} connections in {connect_secs:.2} s ({} failed); load for {:?}",
        at_load_start.opened, args.conns, at_load_start.failed, args.duration
    );
    fleet.set_phase(phase::LOAD)?;
    let load_t0 = Instant::now();
    let publisher = match publish {
        Some(p) => Some(Publisher::start(p)?),
        None => None,
    };
    let sent = |c: &Counters, publisher: &Option<Publisher>| match publisher {
        Some(p) => p.published(),
        None if push => 0,
        None => c.messages_out,
    };
    let end = load_t0 + args.duration;
    let mut last = at_load_start;
    // Sent (push: published) as of the last status line.
    let mut last_sent = start_sent;
    let mut last_t = load_t0;
    let mut next_status = (!args.interval.is_zero()).then(|| load_t0 + args.interval);
    let mut next_sample = load_t0 + SAMPLE_EVERY;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if interrupted.load(Ordering::Relaxed) {
            eprintln!("interrupted: ending the load early (Ctrl-C again exits at once)");
            break;
        }
        if let Some(why) = fleet.broken() {
            return Err(BenchError::Child {
                index: 0,
                reason: why,
            });
        }
        if now >= next_sample {
            let c = fleet.live();
            timeline.record(secs(now), Phase::Load, &c, sent(&c, &publisher));
            next_sample = next_sample_after(load_t0, now);
        }
        if let Some(at) = next_status
            && now >= at
        {
            let c = fleet.live();
            let sent_now = sent(&c, &publisher);
            eprintln!(
                "{}",
                status_line(
                    &c,
                    &last,
                    (sent_now, last_sent),
                    (now - last_t).as_secs_f64(),
                    (now - load_t0).as_secs_f64()
                )
            );
            last = c;
            last_sent = sent_now;
            last_t = now;
            next_status = Some(at + args.interval);
        }
        let mut wait = (end - now).min(next_sample.saturating_duration_since(now));
        if let Some(at) = next_status {
            wait = wait.min(at.saturating_duration_since(now));
        }
        std::thread::sleep(wait.min(Duration::from_millis(200)));
    }
    let at_load_end = fleet.live();
    let load_end = Instant::now();
    let load_secs = (load_end - load_t0).as_secs_f64();
    timeline.close_phase(
        secs(load_end),
        Phase::Load,
        &at_load_end,
        sent(&at_load_end, &publisher),
    );
    let summary = publisher.map(Publisher::stop);
    fleet.set_phase(phase::DRAIN)?;
    // Let what is in flight land: echoes come back, deliveries arrive.
    let grace_end = Instant::now() + args.grace;
    while Instant::now() < grace_end {
        if args.mode == Mode::Echo && fleet.live().in_flight == 0 {
            break;
        }
        if args.mode == Mode::Idle {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    fleet.set_phase(phase::CLOSE)?;
    let timing = RawResult {
        at_load_start,
        at_load_end,
        load_secs,
        connect_secs,
        ..RawResult::default()
    };
    Ok(Driven {
        timing,
        publish: summary,
        timeline: timeline.into_samples(connect_secs),
    })
}

/// One status line: open sockets, rates over the last interval, failures.
/// `sent`: messages sent (push: published) now and at the previous line.
fn status_line(
    c: &Counters,
    last: &Counters,
    sent: (u64, u64),
    secs: f64,
    since_start: f64,
) -> String {
    let secs = secs.max(1e-9);
    let samples = c.latency_samples.saturating_sub(last.latency_samples);
    let latency = if samples > 0 {
        let sum = c.latency_us_sum.saturating_sub(last.latency_us_sum);
        format!(
            " | latency avg {:.3} ms",
            sum as f64 / samples as f64 / 1000.0
        )
    } else {
        String::new()
    };
    format!(
        "[{since_start:6.1}s] open {} | received {} msgs ({:.0}/s) | sent {} ({:.0}/s){latency} | pings {} | failed {} dropped {}",
        c.open_now,
        c.messages_in,
        c.messages_in.saturating_sub(last.messages_in) as f64 / secs,
        sent.0,
        sent.0.saturating_sub(sent.1) as f64 / secs,
        c.pings,
        c.failed,
        c.dropped
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn status_lines_show_the_interval_average_latency() {
        let last = Counters {
            latency_samples: 10,
            latency_us_sum: 10_000,
            ..Counters::default()
        };
        let now = Counters {
            messages_in: 30,
            latency_samples: 30,
            latency_us_sum: 70_000,
            ..Counters::default()
        };
        let line = status_line(&now, &last, (12, 2), 1.0, 5.0);
        assert!(line.contains("latency avg 3.000 ms"), "{line}");
        assert!(line.contains("sent 12 (10/s)"), "{line}");
        assert!(!status_line(&last, &last, (0, 0), 1.0, 5.0).contains("latency"));
    }

    #[test]
    fn defaults_and_flags() {
        let a = parse(&["echo"]).unwrap();
        assert_eq!(a.mode, Mode::Echo);
        assert_eq!(a.conns, 100);
        assert_eq!(a.size(), 32);
        assert_eq!(a.duration, Duration::from_secs(10));
        let a = parse(&[
            "chat",
            "--url",
            "ws://h:9/x",
            "--ports",
            "9000-9003",
            "--size",
            "2KiB",
            "--source-ips",
            "127.0.0.2-127.0.0.4,10.0.0.1",
            "--senders",
            "0.5",
        ])
        .unwrap();
        assert_eq!(a.size(), 2048);
        assert_eq!(a.ports, Some(PortRange(9000, 9003)));
        assert_eq!(a.source_ips.as_ref().map(|s| s.0.len()), Some(4));
        assert_eq!(parse(&["chat"]).unwrap().size(), 1024);
    }

    #[test]
    fn bad_flags_are_errors_not_panics() {
        assert!(parse(&["flood"]).is_err());
        assert!(parse(&["echo", "--ports", "9-3"]).is_err());
        assert!(parse(&["echo", "--ports", "x"]).is_err());
        assert!(parse(&["echo", "--duration", "ten"]).is_err());
        assert!(parse(&["echo", "--source-ips", "127.0.0.9-127.0.0.1"]).is_err());
        assert!(parse(&["echo", "--source-ips", "nope"]).is_err());
        let bad =
            |args: &[&str]| matches!(parse(args).unwrap().validate(), Err(BenchError::BadArgs(_)));
        assert!(bad(&["echo", "--conns", "0"]));
        assert!(bad(&["echo", "--url", "http://x"]));
        assert!(bad(&["echo", "--url", "wss://x"]));
        assert!(bad(&["echo", "--rate=-1"]));
        assert!(bad(&["echo", "--conns", "2", "--procs", "3"]));
        assert!(bad(&["chat", "--senders", "1.5"]));
        assert!(bad(&["push", "--publish-rate", "0"]));
        assert!(bad(&["echo", "--conns", "100000000"]));
        assert!(parse(&["echo"]).unwrap().validate().is_ok());
    }

    #[test]
    fn urls() {
        let u = WsUrl::parse("ws://127.0.0.1:9000/echo?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 9000, "/echo?x=1")
        );
        let u = WsUrl::parse("ws://example.com").unwrap();
        assert_eq!(
            (u.port, u.path.as_str(), u.authority.as_str()),
            (80, "/", "example.com")
        );
        let u = WsUrl::parse("ws://h:1?q").unwrap();
        assert_eq!(u.path, "/?q");
        assert!(WsUrl::parse("ws://h:99999/").is_err());
    }

    #[test]
    fn procs_split_connections_and_children_get_their_share() {
        assert_eq!(split_conns(10, 3), vec![(0, 4), (4, 3), (7, 3)]);
        let a = parse(&["push", "--conns", "10", "--procs", "2", "--rate", "100"]).unwrap();
        let args = a.child_args(1, 5, 5, None);
        let child = parse(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!(child.child_index, Some(1));
        assert_eq!(child.conn_offset, 5);
        assert_eq!(child.conns, 5);
        assert_eq!(child.rate, 50.0);
        assert_eq!(child.size(), 64);
        assert!(child.json);
        let u = WsUrl::parse(&child.url).unwrap();
        let plan = child.plan(&u).unwrap();
        assert_eq!(plan.rate, 50.0);
        assert_eq!(plan.path, "/ws/{channel}?format=json");
    }
}
