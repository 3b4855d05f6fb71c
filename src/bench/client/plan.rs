//! What every loop of one process knows about the run ([`Plan`]), and where each
//! connection goes: its server port, source address, channel or room (and its
//! name), and request path.
//!
//! Pure arithmetic on connection indexes: it must not touch sockets or counters.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::bench::tls::TlsTarget;
use crate::bench::{Mode, Protocol, SeqFrom, Transport};
use crate::pusher::App;

/// What every loop of one process needs to know about the run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: Mode,
    pub ip: IpAddr,
    pub first_port: u16,
    pub last_port: u16,
    /// The `Host` header value.
    pub host_header: String,
    /// `wss://`, `https://`: every connection speaks TLS to this server.
    pub tls: Option<TlsTarget>,
    /// Request path; `{channel}` is replaced in push and chat modes.
    pub path: String,
    /// Source addresses this process binds to, round-robin.
    pub source_ips: Vec<IpAddr>,
    pub size: usize,
    pub connect_timeout: Duration,
    pub send_interval: Duration,
    pub room_size: u64,
    pub senders: f64,
    pub channels: u64,
    pub channel_prefix: String,
    pub room_prefix: String,
    /// Push: how subscribers connect, and where a delivery's position comes from.
    pub transport: Transport,
    /// What the connections speak; under Pusher, push and idle subscribe to
    /// their channel with a `pusher:subscribe` once the server greets them.
    pub protocol: Protocol,
    /// Pusher: the app (its secret signs `private-` subscriptions).
    pub pusher: Option<App>,
    pub seq_from: SeqFrom,
    /// Push: the fraction of subscribers that drop and resume every interval.
    pub reconnect: f64,
    pub reconnect_interval: Duration,
    /// Push: the first backoff of a subscriber the server lets go with a "come
    /// back" signal; it doubles per failed try (zero: such a subscriber is dropped).
    pub comeback_backoff: Duration,
    /// Push: the longest that backoff grows to (`--backoff-cap`).
    pub comeback_backoff_cap: Duration,
    /// Global index of this process's first connection (children get a slice).
    pub conn_offset: u64,
    /// Connections this process opens.
    pub conns: u64,
    pub threads: usize,
    /// Connects per second for this process (0: as fast as possible).
    pub rate: f64,
    /// Connections of this process opening at once (0: no limit), shared by its loops.
    pub max_opening: u64,
}

impl Plan {
    pub(super) fn target(&self, global: u64) -> SocketAddr {
        let span = u64::from(self.last_port - self.first_port) + 1;
        let port = self.first_port + (global % span) as u16;
        SocketAddr::new(self.ip, port)
    }

    pub(super) fn source(&self, local: u64) -> Option<IpAddr> {
        if self.source_ips.is_empty() {
            return None;
        }
        Some(self.source_ips[(local % self.source_ips.len() as u64) as usize])
    }

    /// Push: the channel index a connection subscribes to.
    pub fn channel_of(&self, global: u64) -> usize {
        (global % self.channels.max(1)) as usize
    }

    /// The channel a connection subscribes to (push; idle under Pusher).
    pub fn channel_name(&self, global: u64) -> String {
        format!("{}{}", self.channel_prefix, self.channel_of(global))
    }

    /// Whether `name` is connection `global`'s channel (without building its name:
    /// it is asked at every delivery).
    pub fn is_channel_of(&self, global: u64, name: &str) -> bool {
        name.strip_prefix(self.channel_prefix.as_str())
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok())
            == Some(self.channel_of(global) as u64)
    }

    /// Chat: whether this connection is one of the `--senders` fraction. Spreads
    /// senders evenly so every room gets its share.
    pub fn is_sender(&self, global: u64) -> bool {
        in_fraction(global, self.senders)
    }

    /// Push: whether this subscriber is one of the `--reconnect` fraction.
    pub fn is_reconnecter(&self, global: u64) -> bool {
        in_fraction(global, self.reconnect)
    }

    /// The request path for one connection.
    pub fn path_for(&self, global: u64) -> Cow<'_, str> {
        match self.mode {
            Mode::Push => Cow::Owned(self.path.replace(
                "{channel}",
                &format!("{}{}", self.channel_prefix, self.channel_of(global)),
            )),
            Mode::Chat => Cow::Owned(self.path.replace(
                "{channel}",
                &format!(
                    "chat:{}{}",
                    self.room_prefix,
                    global / self.room_size.max(1)
                ),
            )),
            Mode::Echo | Mode::Idle | Mode::Handshakes => Cow::Borrowed(&self.path),
        }
    }
}

/// Whether `index` is one of an evenly spread `fraction` of all indexes.
fn in_fraction(index: u64, fraction: f64) -> bool {
    let f = fraction.clamp(0.0, 1.0);
    ((index + 1) as f64 * f).floor() > (index as f64 * f).floor()
}

/// `path` without any `name=` parameter in its query.
pub(super) fn without_param(path: &str, name: &str) -> String {
    let Some((base, query)) = path.split_once('?') else {
        return path.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| p.split('=').next() != Some(name))
        .collect();
    if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// `path` with `name=value` added to its query.
pub(super) fn with_query(path: &str, name: &str, value: impl std::fmt::Display) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{path}{sep}{name}={value}")
}
