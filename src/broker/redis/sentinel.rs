//! Where the broker's connections go ([`Target`]): the one Redis of a `redis://`
//! URL, or, for `redis-sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/MASTER`,
//! the master that Redis Sentinel names now, and the thread that follows
//! Sentinel's failovers (`+switch-master`).
//!
//! A connection to a Sentinel-named master is made like this: the Sentinels are
//! asked in the URL's order (starting with the one that answered last) for
//! `SENTINEL get-master-addr-by-name MASTER`; the first that names an address
//! whose Redis answers `ROLE` with `master` wins. A Sentinel mid-failover may still
//! name the old master, now a replica: then the next Sentinel is asked, and if
//! none names a master the connect fails (and is tried again, as when a plain
//! Redis is down). The password in the URL is the Redis servers' (`AUTH`);
//! Sentinels are asked without one.
//!
//! The [`Target`]'s generation counts the times the master changed, or may have:
//! a `+switch-master` of our master, a `READONLY` answer (a demoted master, see
//! `connection`), a Sentinel naming another master than the last connect found,
//! or every Sentinel unreachable (then no master is trusted until one answers).
//! Connections made in an older generation are not used again: the pool drops
//! them and the listener resubscribes (see `listener`).
//!
//! Every contact with a Sentinel or a Redis here has `REDIS_TIMEOUT`, and asking
//! the Sentinels stops after `timing::SENTINEL_ASK_BUDGET` (a host name's lookup is the system
//! resolver's, without a timeout of ours: the `redis` crate's). This file must not
//! run the broker's commands (channels, presence, scripts) nor touch the pool
//! beyond [`Shared::forget_master`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::{Client, Connection, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value};

use super::connection::{REDIS_TIMEOUT, unavailable};
use super::{BrokerError, Shared, lock, redact};
use crate::timing::{
    SENTINEL_ASK_BUDGET, SENTINEL_BACKOFF_FIRST, SENTINEL_BACKOFF_MAX, SENTINEL_TICK,
};

pub(super) const SCHEME: &str = "redis-sentinel://";
/// Sentinel's own port, for hosts written without one.
const SENTINEL_PORT: u16 = 26379;
const PING_AFTER_QUIET_TICKS: u32 = 5;

/// A `redis-sentinel://` URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentinelUrl {
    pub(super) sentinels: Vec<(String, u16)>,
    pub(super) master: String,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
}

const FORM: &str = "redis-sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/MASTER";

impl SentinelUrl {
    /// The error names the URL without its password and the form expected.
    pub(super) fn parse(url: &str) -> Result<SentinelUrl, String> {
        let bad = |why: &str| format!("'{}': {why} (expected {FORM})", redact(url));
        let rest = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("not a redis-sentinel:// URL"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pass) = u
                    .split_once(':')
                    .ok_or_else(|| bad("a user without a password (write USER:PASSWORD@)"))?;
                let user = percent_decode(user).ok_or_else(|| bad("a bad %-escape in the user"))?;
                let pass =
                    percent_decode(pass).ok_or_else(|| bad("a bad %-escape in the password"))?;
                ((!user.is_empty()).then_some(user), Some(pass))
            }
        };
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                continue;
            }
            sentinels.push(parse_host(host).map_err(|why| bad(&why))?);
        }
        if sentinels.is_empty() {
            return Err(bad("no Sentinel host"));
        }
        let master = path.strip_suffix('/').unwrap_or(path);
        if master.is_empty() {
            return Err(bad("no master name"));
        }
        if master.contains(['/', '?', '#']) || master.contains(char::is_whitespace) {
            return Err(bad(&format!(
                "'{master}' is not a master name (no '/', '?', '#' or spaces; no options)"
            )));
        }
        Ok(SentinelUrl {
            sentinels,
            master: master.to_string(),
            username,
            password,
        })
    }
}

fn parse_host(host: &str) -> Result<(String, u16), String> {
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (name, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("'{host}' has no closing ']'"))?;
        match after {
            "" => (name, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (name, Some(port)),
                None => return Err(format!("'{host}': what follows ']' is not :PORT")),
            },
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() {
        return Err(format!("'{host}' has no host name"));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("'{p}' in '{host}' is not a port"))?,
    };
    Ok((name.to_string(), port))
}

/// `%XX` escapes, as in any URL's user and password.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Where new connections go, and how many times the master changed.
pub(super) struct Target {
    place: Place,
    generation: AtomicU64,
}

enum Place {
    Redis(Client),
    Sentinel(Sentinels),
}

/// The Sentinels of one master, and what the last connect learnt from them.
struct Sentinels {
    url: SentinelUrl,
    /// The index of the Sentinel that answered last: asked first next time.
    first: AtomicUsize,
    /// The master the last connect found, to notice a switch the watch missed.
    master: Mutex<Option<(String, u16)>>,
}

impl Target {
    /// `url` as the configuration accepted it (`redis://…` or `redis-sentinel://…`).
    pub(super) fn open(url: &str) -> Result<Target, BrokerError> {
        let place = if url.starts_with(SCHEME) {
            Place::Sentinel(Sentinels {
                url: SentinelUrl::parse(url).map_err(unavailable)?,
                first: AtomicUsize::new(0),
                master: Mutex::new(None),
            })
        } else {
            Place::Redis(Client::open(url).map_err(unavailable)?)
        };
        Ok(Target {
            place,
            generation: AtomicU64::new(0),
        })
    }

    pub(super) fn is_sentinel(&self) -> bool {
        matches!(self.place, Place::Sentinel(_))
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The master changed, or may have: connections made before are not to be used.
    pub(super) fn next_generation(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Sleeps `pause`, or less if the master changes meanwhile (a thread waiting
    /// to reconnect goes to the new master at once).
    pub(super) fn pause(&self, generation: u64, pause: Duration) {
        let until = Instant::now() + pause;
        while self.generation() == generation {
            let now = Instant::now();
            if now >= until {
                return;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }

    /// A new connection, with `REDIS_TIMEOUT` on reads and writes: to the Redis, or
    /// to the master the Sentinels name now.
    pub(super) fn connect(&self) -> Result<Connection, BrokerError> {
        let con = match &self.place {
            Place::Redis(client) => client
                .get_connection_with_timeout(REDIS_TIMEOUT)
                .map_err(unavailable)?,
            Place::Sentinel(sentinels) => sentinels.connect_master()?,
        };
        with_timeouts(con)
    }
}

fn with_timeouts(con: Connection) -> Result<Connection, BrokerError> {
    con.set_read_timeout(Some(REDIS_TIMEOUT))
        .map_err(unavailable)?;
    con.set_write_timeout(Some(REDIS_TIMEOUT))
        .map_err(unavailable)?;
    Ok(con)
}

impl Sentinels {
    fn connect_master(&self) -> Result<Connection, BrokerError> {
        let n = self.url.sentinels.len();
        let start = self.first.load(Ordering::Relaxed) % n;
        let mut why = Vec::new();
        let mut not_masters: Vec<(String, u16)> = Vec::new();
        let deadline = Instant::now() + SENTINEL_ASK_BUDGET;
        for at in (start..n).chain(0..start) {
            let (host, port) = &self.url.sentinels[at];
            if Instant::now() >= deadline {
                why.push(format!("Sentinel {host}:{port} not asked: out of time"));
                continue;
            }
            let named = match self.ask(at) {
                Ok(Some(named)) => named,
                Ok(None) => {
                    why.push(format!(
                        "Sentinel {host}:{port} does not know '{}'",
                        self.url.master
                    ));
                    continue;
                }
                Err(e) => {
                    why.push(format!("Sentinel {host}:{port}: {e}"));
                    continue;
                }
            };
            self.first.store(at, Ordering::Relaxed);
            if not_masters.contains(&named) {
                continue;
            }
            match self.open_master(&named) {
                Ok(con) => {
                    *lock(&self.master) = Some(named);
                    return Ok(con);
                }
                Err(e) => {
                    why.push(format!(
                        "{}:{} (named by Sentinel {host}:{port}): {e}",
                        named.0, named.1
                    ));
                    not_masters.push(named);
                }
            }
        }
        Err(unavailable(format!(
            "no master '{}' found through Sentinel: {}",
            self.url.master,
            why.join("; ")
        )))
    }

    /// The address Sentinel `at` names for the master; None if it does not know it.
    fn ask(&self, at: usize) -> ::redis::RedisResult<Option<(String, u16)>> {
        let mut con = self.sentinel(at)?;
        ::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.url.master)
            .query(&mut con)
    }

    fn sentinel(&self, at: usize) -> ::redis::RedisResult<Connection> {
        let (host, port) = &self.url.sentinels[at];
        let info = (host.as_str(), *port)
            .into_connection_info()?
            .set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name());
        let con = Client::open(info)?.get_connection_with_timeout(REDIS_TIMEOUT)?;
        con.set_read_timeout(Some(REDIS_TIMEOUT))?;
        con.set_write_timeout(Some(REDIS_TIMEOUT))?;
        Ok(con)
    }

    /// A connection to `addr` if it is a master (`ROLE`), authenticated.
    fn open_master(&self, (host, port): &(String, u16)) -> Result<Connection, BrokerError> {
        let mut settings = RedisConnectionInfo::default();
        if let Some(password) = &self.url.password {
            settings = settings.set_password(password);
        }
        if let Some(user) = &self.url.username {
            settings = settings.set_username(user);
        }
        let info: ConnectionInfo = (host.as_str(), *port)
            .into_connection_info()
            .map_err(unavailable)?
            .set_redis_settings(settings);
        let con = Client::open(info)
            .and_then(|c| c.get_connection_with_timeout(REDIS_TIMEOUT))
            .map_err(unavailable)?;
        let mut con = with_timeouts(con)?;
        let role: Vec<Value> = ::redis::cmd("ROLE").query(&mut con).map_err(unavailable)?;
        match role.first() {
            Some(Value::BulkString(r)) if r == b"master" => Ok(con),
            Some(Value::BulkString(r)) => Err(unavailable(format!(
                "its ROLE is {} (a failover under way?)",
                String::from_utf8_lossy(r)
            ))),
            _ => Err(unavailable("an unreadable ROLE answer")),
        }
    }
}

/// The watch: one thread per node with a Sentinel URL. Subscribed on one Sentinel
/// (the first in order that answers) to `+switch-master`; a switch of our master
/// starts a new generation and empties the pool. While every Sentinel is
/// unreachable no master is trusted (the node is unhealthy, as when Redis is
/// down) and the Sentinels are asked again with back-off.
pub(super) fn watch(shared: Arc<Shared>) {
    let Place::Sentinel(sentinels) = &shared.target.place else {
        return;
    };
    let mut backoff = SENTINEL_BACKOFF_FIRST;
    let mut trusted = true;
    loop {
        let mut followed = false;
        let mut why = Vec::new();
        // In order; after losing one, the next.
        for (at, (host, port)) in sentinels.url.sentinels.iter().enumerate() {
            match follow(&shared, sentinels, at) {
                Ok(()) => followed = true,
                Err(e) => why.push(format!("{host}:{port}: {e}")),
            }
        }
        if followed {
            trusted = true;
            backoff = SENTINEL_BACKOFF_FIRST;
        } else if trusted {
            tracing::warn!(
                master = %sentinels.url.master,
                errors = %why.join("; "),
                "every Sentinel is unreachable: no Redis master is trusted until one answers"
            );
            shared.forget_master();
            trusted = false;
        }
        std::thread::sleep(backoff);
        if !followed {
            backoff = (backoff * 2).min(SENTINEL_BACKOFF_MAX);
        }
    }
}

/// Subscribes on Sentinel `at` and follows it until it is lost: Ok after a
/// subscription that ended, Err if there was none.
fn follow(shared: &Shared, sentinels: &Sentinels, at: usize) -> Result<(), ::redis::RedisError> {
    let (host, port) = &sentinels.url.sentinels[at];
    let mut con = sentinels.sentinel(at)?;
    con.set_read_timeout(Some(SENTINEL_TICK))?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe("+switch-master")?;
    tracing::debug!(sentinel = %format!("{host}:{port}"), "watching for failovers");
    // A switch while nobody watched (this thread was between Sentinels).
    match sentinels.ask(at) {
        Ok(named) => {
            let known = lock(&sentinels.master).clone();
            if known.is_some() && named != known {
                tracing::info!(master = %sentinels.url.master, "Sentinel names another master than this node's connections use: reconnecting");
                shared.forget_master();
            }
        }
        Err(e) => tracing::debug!(error = %e, "asking Sentinel for the master after subscribing"),
    }
    let mut quiet = 0;
    loop {
        let msg = match pubsub.get_message() {
            Ok(msg) => msg,
            Err(e) if e.is_timeout() => {
                quiet += 1;
                if quiet >= PING_AFTER_QUIET_TICKS {
                    quiet = 0;
                    if let Err(e) = pubsub.ping::<Value>() {
                        tracing::warn!(sentinel = %format!("{host}:{port}"), error = %e, "Sentinel stopped answering; asking the others");
                        return Ok(());
                    }
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(sentinel = %format!("{host}:{port}"), error = %e, "Sentinel connection lost; asking the others");
                return Ok(());
            }
        };
        quiet = 0;
        let payload = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
        let mut words = payload.split_whitespace();
        if words.next() != Some(sentinels.url.master.as_str()) {
            continue;
        }
        let from: Vec<&str> = words.by_ref().take(2).collect();
        let to: Vec<&str> = words.take(2).collect();
        tracing::warn!(
            master = %sentinels.url.master,
            from = %from.join(":"),
            to = %to.join(":"),
            "Sentinel switched the Redis master: reconnecting to the new one"
        );
        shared.forget_master();
    }
}

#[cfg(test)]
mod tests;
