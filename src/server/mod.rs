//! The server: listeners, I/O threads, admission limits and shutdown.
//!
//! [`start`] binds every listen address once per I/O thread (SO_REUSEPORT, so the
//! kernel spreads accepted connections over the threads and, later, over worker
//! processes), runs one [`event_loop::EventLoop`] per thread, and returns a
//! [`ServerHandle`] that can stop it. Tests start it on port 0 and stop it through
//! the handle; `main` stops it on SIGINT/SIGTERM. This module must not parse bytes
//! (that is `protocol`) or decide routes (that is `routes`).

pub mod conn;
pub mod event_loop;
pub mod http;
pub mod routes;
pub mod subscribers;
pub mod timer;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mio::{Poll, Waker};
use socket2::{Domain, Protocol, Socket, Type};

use crate::broker::{Broker, MemoryBroker};
use crate::config::ServeConfig;
use crate::hub::Hub;
use crate::stats::ServerStats;
use crate::transport::Format;

/// Pending connections the kernel may queue per listener (capped by somaxconn).
const LISTEN_BACKLOG: i32 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("cannot create the event loop: {0}")]
    Poll(io::Error),
    #[error("cannot start I/O thread: {0}")]
    Spawn(io::Error),
    #[error("I/O thread failed: {0}")]
    Thread(io::Error),
    #[error("I/O thread panicked")]
    Panicked,
}

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
    /// The next client id (a chat member's name is `c<id>`).
    next_client: AtomicU64,
}

impl Shared {
    fn new(config: ServeConfig, hub: Arc<Hub>, broker: Arc<dyn Broker>) -> Self {
        Shared {
            admission: Admission::new(config.max_conns, config.max_conns_per_ip),
            shutdown: AtomicBool::new(false),
            stats: ServerStats::new(config.threads),
            config,
            hub,
            broker,
            next_client: AtomicU64::new(1),
        }
    }

    pub fn next_client_id(&self) -> u64 {
        self.next_client.fetch_add(1, Ordering::Relaxed)
    }
}

/// A running server.
pub struct ServerHandle {
    stopper: Stopper,
    threads: Vec<JoinHandle<io::Result<()>>>,
    local_addrs: Vec<SocketAddr>,
}

impl ServerHandle {
    /// The addresses actually bound (port 0 resolved), one per listen address.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stopper.shared.stats
    }

    /// The broker in use, as logs and stats name it.
    pub fn broker(&self) -> String {
        self.stopper.shared.broker.describe()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.stopper.shared.shutdown.load(Ordering::Acquire)
    }

    /// A cheap, thread-safe way to request shutdown from elsewhere (signal handler).
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Stops accepting, closes every client with 1001 and lets the loops drain.
    pub fn shutdown(&self) {
        self.stopper.stop();
    }

    /// Waits for every I/O thread to finish.
    pub fn join(self) -> Result<(), ServerError> {
        let mut result = Ok(());
        for thread in self.threads {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(ServerError::Thread(e)),
                Err(_) => result = Err(ServerError::Panicked),
            }
        }
        result
    }
}

/// Requests shutdown; can be moved to a signal-handling thread.
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
}

impl Stopper {
    pub fn stop(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for waker in &self.wakers {
            let _ = waker.wake();
        }
    }
}

fn bind_listener(addr: SocketAddr) -> io::Result<mio::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(mio::net::TcpListener::from_std(socket.into()))
}

/// Binds the listeners, starts the I/O threads and returns at once.
pub fn start(config: ServeConfig) -> Result<ServerHandle, ServerError> {
    let threads = config.threads;
    let mut per_thread: Vec<Vec<mio::net::TcpListener>> =
        (0..threads).map(|_| Vec::new()).collect();
    let mut local_addrs = Vec::with_capacity(config.listen.len());
    for &addr in &config.listen {
        // The first bind resolves port 0; the other threads join that port.
        let first = bind_listener(addr).map_err(|source| ServerError::Bind { addr, source })?;
        let bound = first
            .local_addr()
            .map_err(|source| ServerError::Bind { addr, source })?;
        local_addrs.push(bound);
        per_thread[0].push(first);
        for listeners in per_thread.iter_mut().skip(1) {
            let l = bind_listener(bound).map_err(|source| ServerError::Bind {
                addr: bound,
                source,
            })?;
            listeners.push(l);
        }
    }
    let mut polls = Vec::with_capacity(threads);
    let mut wakers = Vec::with_capacity(threads);
    for _ in 0..threads {
        let poll = Poll::new().map_err(ServerError::Poll)?;
        let waker = Waker::new(poll.registry(), event_loop::WAKER).map_err(ServerError::Poll)?;
        polls.push(poll);
        wakers.push(Arc::new(waker));
    }
    let hub = Arc::new(Hub::new(wakers.clone(), Format::COUNT));
    let broker: Arc<dyn Broker> = Arc::new(MemoryBroker::new(Arc::clone(&hub), 0));
    let shared = Arc::new(Shared::new(config, hub, broker));
    let mut handles = Vec::with_capacity(threads);
    for (index, (listeners, poll)) in per_thread.into_iter().zip(polls).enumerate() {
        let event_loop = event_loop::EventLoop::new(poll, listeners, Arc::clone(&shared), index)
            .map_err(ServerError::Poll)?;
        let handle = std::thread::Builder::new()
            .name(format!("throng-io-{index}"))
            .spawn(move || event_loop.run())
            .map_err(ServerError::Spawn)?;
        handles.push(handle);
    }
    Ok(ServerHandle {
        stopper: Stopper { shared, wakers },
        threads: handles,
        local_addrs,
    })
}

/// Builds the shared state without threads or listeners, for unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    pub fn test_shared(api_key: Option<&str>) -> (Shared, Vec<Poll>) {
        let polls: Vec<Poll> = (0..2).map(|_| Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| Arc::new(Waker::new(p.registry(), event_loop::WAKER).unwrap()))
            .collect();
        let hub = Arc::new(Hub::new(wakers, Format::COUNT));
        let config = ServeConfig {
            api_key: api_key.map(String::from),
            threads: 2,
            ..ServeConfig::default()
        };
        let broker = Arc::new(MemoryBroker::new(Arc::clone(&hub), 0));
        let shared = Shared::new(config, hub, broker);
        (shared, polls)
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
