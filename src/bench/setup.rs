//! What `throng bench`'s flags mean for a run, worked out before anything starts.
//!
//! It owns [`BenchArgs::validate`] (a flag that makes no sense is a
//! [`BenchError::BadArgs`], and a limit that will stop the run is said up front,
//! with `throng tune`'s hint), each process's loop [`Plan`], the arguments of each
//! `--procs` child and its share of the connections, the publisher's plan, and the
//! settings the HTML report lists. It must not open sockets or start threads or
//! processes: the driver does, with what this hands it.

use std::net::{IpAddr, ToSocketAddrs};
use std::time::Duration;

use super::BenchError;
use super::args::{
    BenchArgs, Mode, PortRange, Protocol, SeqFrom, Transport, WsUrl, default_threads, with_port,
};
use super::client::Plan;
use super::publish::PublishPlan;
use super::tls::{TlsTarget, Trust, client_config};
use crate::client::HttpUrl;
use crate::pusher::{App, validate_channel_name};

/// Descriptors a bench process keeps for itself (epoll, wakers, stdio, publisher).
const RESERVED_FDS: u64 = 100;

impl BenchArgs {
    pub(super) fn size(&self) -> usize {
        self.size.unwrap_or(self.mode.default_size())
    }

    pub(super) fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| (default_threads() / self.procs.max(1)).max(1))
    }

    /// Where a delivery's position comes from: under Pusher, whose events carry
    /// no seq, always the count the publisher writes in the payload.
    pub(super) fn seq_from(&self) -> SeqFrom {
        match self.protocol {
            Protocol::Pusher => SeqFrom::Payload,
            Protocol::Throng => self.seq_from,
        }
    }

    /// What `--insecure` and `--ca` say to trust.
    pub(super) fn trust(&self) -> Trust {
        Trust {
            insecure: self.tls.insecure,
            ca: self.tls.ca.clone(),
        }
    }

    /// TLS to `host` as `--insecure` and `--ca` say; `resume`: keep sessions.
    pub(super) fn tls_target(&self, host: &str, resume: bool) -> Result<TlsTarget, BenchError> {
        let config = client_config(&self.trust(), resume).map_err(BenchError::BadArgs)?;
        TlsTarget::new(config, host).map_err(BenchError::BadArgs)
    }

    /// The Pusher app: --pusher-key, --pusher-secret and --pusher-app-id together
    /// (they take precedence), or --pusher-app; `None` when neither is given.
    pub(super) fn pusher(&self) -> Result<Option<App>, BenchError> {
        let parts = (&self.pusher_app_id, &self.pusher_key, &self.pusher_secret);
        match parts {
            (Some(id), Some(key), Some(secret)) => format!("{id}:{key}:{secret}")
                .parse::<App>()
                .map(Some)
                .map_err(|e| {
                    BenchError::BadArgs(format!(
                        "--pusher-app-id, --pusher-key, --pusher-secret: {e}"
                    ))
                }),
            (None, None, _) => Ok(self.pusher_app.clone()),
            _ => Err(BenchError::BadArgs(
                "give --pusher-key, --pusher-secret and --pusher-app-id together (or --pusher-app ID:KEY:SECRET)"
                    .into(),
            )),
        }
    }

    /// `--protocol pusher`'s own checks.
    fn validate_pusher(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::BadArgs(m));
        if !matches!(self.mode, Mode::Push | Mode::Idle) {
            return bad(format!(
                "--protocol pusher is for push and idle; {} speaks throng's protocol",
                self.mode.name()
            ));
        }
        if self.transport != Transport::Ws {
            return bad("--protocol pusher speaks WebSocket: leave --transport at ws".into());
        }
        if self.pusher()?.is_none() {
            return bad(
                "--protocol pusher needs the app: --pusher-app ID:KEY:SECRET (or --pusher-key, --pusher-secret and --pusher-app-id)".into(),
            );
        }
        if self.reconnect > 0.0 {
            return bad(
                "--reconnect resumes subscriptions, and Pusher's protocol cannot resume one".into(),
            );
        }
        if self.channels == 0 || self.channels > 1_000_000 {
            return bad("--channels must be between 1 and 1000000".into());
        }
        let last = format!("{}{}", self.channel_prefix, self.channels - 1);
        if let Err(e) = validate_channel_name(&last) {
            return bad(format!("--channel-prefix: Pusher channel '{last}': {e}"));
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<WsUrl, BenchError> {
        let bad = |m: String| Err(BenchError::BadArgs(m));
        let url = WsUrl::parse(&self.url).map_err(BenchError::BadArgs)?;
        if self.protocol == Protocol::Pusher {
            self.validate_pusher()?;
        }
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
                if !self.backoff.is_zero() && self.backoff_cap < self.backoff {
                    return bad(format!(
                        "--backoff-cap {} must be at least --backoff {}: the cap is the longest a backoff grows to",
                        humantime::format_duration(self.backoff_cap),
                        humantime::format_duration(self.backoff)
                    ));
                }
                if self.reconnect > 0.0 && self.reconnect_interval.is_zero() {
                    return bad("--reconnect-interval must be more than 0".into());
                }
                if self.reconnect > 0.0
                    && self.seq_from() == SeqFrom::Payload
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
            Mode::Handshakes => {
                if !url.tls {
                    return bad(format!(
                        "--url '{}': handshakes measures TLS; give https://HOST:PORT/PATH (or wss://)",
                        self.url
                    ));
                }
                if self.procs > 1 {
                    return bad("handshakes runs in one process: leave --procs at 1".into());
                }
            }
            Mode::Echo | Mode::Idle => {}
        }
        let tls_used =
            url.tls || (self.mode == Mode::Push && self.publish_url().is_ok_and(|(_, tls)| tls));
        if (self.tls.insecure || self.tls.ca.is_some()) && !tls_used {
            return bad(format!(
                "--insecure and --ca are for TLS: --url '{}' is not wss:// or https://",
                self.url
            ));
        }
        if tls_used {
            // A --ca file that cannot be read is refused before anything runs.
            client_config(&self.trust(), true).map_err(BenchError::BadArgs)?;
        }
        if self.mode != Mode::Push && self.transport != Transport::Ws {
            return bad(format!(
                "--transport {} is for push mode; {} speaks WebSocket",
                self.transport.name(),
                self.mode.name()
            ));
        }
        if url.http && self.transport == Transport::Ws && self.mode != Mode::Handshakes {
            return bad(format!(
                "--url '{}': {}:// is for --transport sse or poll; WebSocket needs ws:// (wss:// over TLS)",
                self.url,
                url.scheme()
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

    /// The publish API's URL, and whether it is `https://`: `--publish-url`, or
    /// the scheme (http or https, as --url is plain or TLS) and host of --url.
    fn publish_url(&self) -> Result<(HttpUrl, bool), BenchError> {
        let text = match &self.publish_url {
            Some(u) => u.clone(),
            None => {
                let url = WsUrl::parse(&self.url).map_err(BenchError::BadArgs)?;
                let scheme = if url.tls { "https" } else { "http" };
                format!("{scheme}://{}", url.authority)
            }
        };
        let bad = |e: String| BenchError::BadArgs(format!("--publish-url: {e}"));
        match text.strip_prefix("https://") {
            Some(rest) => {
                let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                let plain = format!("http://{}{path}", with_port(authority, true));
                Ok((
                    HttpUrl::parse(&plain).map_err(|e| bad(e.to_string()))?,
                    true,
                ))
            }
            None => Ok((
                HttpUrl::parse(&text).map_err(|e| bad(e.to_string()))?,
                false,
            )),
        }
    }

    /// The loops' plan for this process (`conns` of them from `conn_offset`).
    pub(super) fn plan(&self, url: &WsUrl) -> Result<Plan, BenchError> {
        let ip = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| BenchError::BadArgs(format!("cannot resolve '{}': {e}", url.host)))?
            .map(|a| a.ip())
            .min_by_key(|ip| !ip.is_ipv4())
            .ok_or_else(|| BenchError::BadArgs(format!("'{}' has no address", url.host)))?;
        let PortRange(first_port, last_port) = self.ports.unwrap_or(PortRange(url.port, url.port));
        let pusher = match self.protocol {
            Protocol::Pusher => self.pusher()?,
            Protocol::Throng => None,
        };
        let path = match (&pusher, self.mode) {
            // Pusher's endpoint, as pusher-js asks for it.
            (Some(app), _) if url.path == "/" => format!(
                "/app/{}?protocol=7&client=throng-bench&version={}",
                app.key,
                env!("CARGO_PKG_VERSION")
            ),
            (Some(app), _) => url.path.replace("{key}", &app.key),
            (None, Mode::Push) if !url.path.contains("{channel}") => {
                self.transport.default_path().to_string()
            }
            (None, Mode::Chat) if !url.path.contains("{channel}") => {
                "/ws/{channel}?format=json".to_string()
            }
            _ => url.path.clone(),
        };
        let path = match (&self.token, self.mode) {
            (Some(token), Mode::Push | Mode::Chat) if pusher.is_none() => {
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
            tls: match url.tls {
                true => Some(self.tls_target(&url.host, true)?),
                false => None,
            },
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
            protocol: self.protocol,
            pusher,
            seq_from: self.seq_from(),
            reconnect: self.reconnect,
            reconnect_interval: self.reconnect_interval,
            comeback_backoff: self.backoff,
            comeback_backoff_cap: self.backoff_cap,
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
    pub(super) fn child_args(
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
            // The Pusher app goes to children in THRONG_PUSHER_APP, not here.
            "--protocol".into(),
            self.protocol.name().into(),
            "--seq-from".into(),
            match self.seq_from() {
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
            "--backoff-cap".into(),
            ms(self.backoff_cap),
            "--child-index".into(),
            index.to_string(),
            "--conn-offset".into(),
            offset.to_string(),
            "--json".into(),
            "--allow-failures".into(),
        ];
        if self.tls.insecure {
            a.push("--insecure".into());
        }
        if let Some(ca) = &self.tls.ca {
            a.push("--ca".into());
            a.push(ca.display().to_string());
        }
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
    pub(super) fn report_settings(&self) -> Vec<(&'static str, String)> {
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let mut s = vec![("mode", self.mode.name().to_string())];
        s.push(("url", self.url.clone()));
        if let Ok(url) = WsUrl::parse(&self.url)
            && url.tls
        {
            let trust = match (&self.tls.ca, self.tls.insecure) {
                (_, true) => "any certificate (--insecure)".to_string(),
                (Some(ca), _) => format!("the CAs in {}", ca.display()),
                (None, false) => "the built-in Mozilla roots".to_string(),
            };
            s.push(("tls", format!("rustls, trusting {trust}")));
        }
        if self.mode == Mode::Push {
            s.push(("transport", self.transport.name().to_string()));
        }
        if self.protocol == Protocol::Pusher
            && let Ok(Some(app)) = self.pusher()
        {
            s.push((
                "protocol",
                format!("Pusher Channels 7 (app {}, key {})", app.id, app.key),
            ));
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
                    match self.seq_from() {
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
                        format!(
                            "full-jitter backoff from {}, at most {}",
                            d(self.backoff),
                            d(self.backoff_cap)
                        )
                    },
                ));
            }
            Mode::Idle if self.protocol == Protocol::Pusher => {
                s.push(("channels", crate::os::thousands(self.channels)));
            }
            Mode::Chat => {
                s.push(("room size", self.room_size.to_string()));
                s.push(("senders", self.senders.to_string()));
                s.push(("send interval", d(self.send_interval)));
            }
            Mode::Handshakes => {
                s.push(("resumption", (!self.tls.no_resume).to_string()));
            }
            Mode::Echo | Mode::Idle => {}
        }
        s.push(("grace", d(self.grace)));
        s
    }

    pub(super) fn publish_plan(&self) -> Result<PublishPlan, BenchError> {
        let pusher = match self.protocol {
            Protocol::Pusher => self.pusher()?,
            Protocol::Throng => None,
        };
        let (base, tls) = self.publish_url()?;
        let tls = match tls {
            true => Some(self.tls_target(&base.host, true)?),
            false => None,
        };
        let (url, path) = match &pusher {
            Some(app) => PublishPlan::pusher_target(base, app),
            None => PublishPlan::target(base),
        };
        Ok(PublishPlan {
            url,
            tls,
            path,
            pusher,
            api_key: self.api_key.clone(),
            channel_prefix: self.channel_prefix.clone(),
            channels: self.channels,
            rate: self.publish_rate,
            threads: self
                .publishers
                .unwrap_or_else(|| ((self.publish_rate / 200.0).ceil() as usize).clamp(1, 32)),
            size: self.size(),
            seq_from: self.seq_from(),
            idempotency_keys: self.idempotency_keys,
        })
    }
}

/// Splits `conns` over `procs`: (offset, count) per child.
pub(super) fn split_conns(conns: u64, procs: usize) -> Vec<(u64, u64)> {
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
