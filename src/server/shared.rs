//! State every I/O thread of one server reads: its configuration, the connection
//! limits, the shutdown flag, the counters, the hub and the broker.
//!
//! It must not know about sockets or event loops; the loops hold it in an `Arc`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::auth::Verifier;
use crate::broker::Broker;
use crate::config::ServeConfig;
use crate::feed::{self, Feed};
use crate::hub::Hub;
use crate::stats::ServerStats;

/// A handshake refused by a connection limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
}

/// `--max-conns` and `--max-conns-per-ip`, shared by every I/O thread.
#[derive(Debug)]
pub struct Admission {
    open: AtomicUsize,
    max: Option<usize>,
    per_ip_max: Option<u32>,
    /// Only touched at handshake and close, never per message: a std Mutex is enough.
    per_ip: Mutex<HashMap<IpAddr, u32>>,
}

impl Admission {
    pub fn new(max: Option<usize>, per_ip_max: Option<u32>) -> Self {
        Admission {
            open: AtomicUsize::new(0),
            max,
            per_ip_max,
            per_ip: Mutex::new(HashMap::new()),
        }
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Counts one more WebSocket from `ip`, or says which limit refuses it.
    pub fn try_admit(&self, ip: IpAddr) -> Result<(), Refusal> {
        let before = self.open.fetch_add(1, Ordering::AcqRel);
        if let Some(max) = self.max
            && before >= max
        {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal {
                status: 503,
                reason: format!("server is full: --max-conns {max} connections are open"),
            });
        }
        if let Some(per_ip_max) = self.per_ip_max {
            let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
            let count = map.entry(ip).or_insert(0);
            if *count >= per_ip_max {
                self.open.fetch_sub(1, Ordering::AcqRel);
                return Err(Refusal {
                    status: 429,
                    reason: format!(
                        "too many connections from {ip}: --max-conns-per-ip is {per_ip_max}"
                    ),
                });
            }
            *count += 1;
        }
        Ok(())
    }

    pub fn release(&self, ip: IpAddr) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        if self.per_ip_max.is_some() {
            let mut map = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = map.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    map.remove(&ip);
                }
            }
        }
    }
}

/// State every I/O thread reads.
#[derive(Debug)]
pub struct Shared {
    pub config: ServeConfig,
    pub admission: Admission,
    /// Set once on SIGINT/SIGTERM or [`ServerHandle::shutdown`]; loops then drain.
    pub shutdown: AtomicBool,
    pub stats: ServerStats,
    pub hub: Arc<Hub>,
    pub broker: Arc<dyn Broker>,
    /// The last minutes of counters, for the dashboard.
    pub feed: Feed,
    /// Checks subscription tokens, with `--token-secret`.
    pub verifier: Option<Verifier>,
    /// The next client id (a chat member's name is `c<id>`).
    next_client: AtomicU32,
    /// Pusher webhooks, when an app has any: the transports hear of them as
    /// their [`crate::transport::Hooks`].
    pub webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// With `--tls-cert`: what new TLS handshakes use (SIGHUP replaces it).
    pub tls: Option<Arc<crate::tls::config::Certificates>>,
}

impl Shared {
    pub fn new(config: ServeConfig, hub: Arc<Hub>, broker: Arc<dyn Broker>) -> Self {
        Shared {
            verifier: config.token_secret.as_deref().map(Verifier::new),
            admission: Admission::new(config.max_conns, config.max_conns_per_ip),
            shutdown: AtomicBool::new(false),
            stats: ServerStats::new(config.threads),
            config,
            hub,
            broker,
            feed: Feed::default(),
            next_client: AtomicU32::new(1),
            webhooks: None,
            tls: None,
        }
    }

    /// Wraps after 2^32 subscriptions: a `c<id>` name may then come round again.
    /// What the dashboard's feed reads.
    pub fn feed_view(&self) -> feed::View<'_> {
        feed::View {
            feed: &self.feed,
            stats: &self.stats,
            hub: &self.hub,
            broker: &*self.broker,
            config: &self.config,
        }
    }

    pub fn next_client_id(&self) -> u32 {
        self.next_client.fetch_add(1, Ordering::Relaxed)
    }
}

/// A Pusher app's webhooks hear of client events through the transports'
/// neutral hook (here, where the server knows both).
impl crate::transport::Hooks for crate::webhooks::Webhooks {
    fn client_event(
        &self,
        channel: &str,
        event: &str,
        data: &str,
        socket: &str,
        user_id: Option<&str>,
    ) {
        crate::webhooks::Webhooks::client_event(self, channel, event, data, socket, user_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_limits_total_and_per_ip() {
        let a = Admission::new(Some(3), Some(2));
        let one: IpAddr = [127, 0, 0, 1].into();
        let two: IpAddr = [127, 0, 0, 2].into();
        assert!(a.try_admit(one).is_ok());
        assert!(a.try_admit(one).is_ok());
        assert_eq!(a.try_admit(one).unwrap_err().status, 429);
        assert!(a.try_admit(two).is_ok());
        assert_eq!(a.try_admit(two).unwrap_err().status, 503);
        a.release(one);
        assert!(a.try_admit(two).is_ok());
        assert_eq!(a.open(), 3);
    }
}
