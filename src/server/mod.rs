//! The server: listeners, I/O threads and shutdown.
//!
//! [`start`] binds every listen address once per I/O thread (SO_REUSEPORT, so the
//! kernel spreads accepted connections over the threads and, later, over worker
//! processes; an address another process already listens on is refused first
//! unless `--reuse-port` says to share it: [`check_ports_free`]), runs one
//! [`event_loop::EventLoop`] per thread, and returns a
//! [`ServerHandle`] that can stop it. Tests start it on port 0 and stop it through
//! the handle; `main` stops it on SIGINT/SIGTERM.
//!
//! Inside: [`event_loop`] polls, dispatches and keeps time; [`conn`] is the
//! per-connection record and its transport session; [`http`] serves HTTP
//! connections (buffering, keep-alive, pipelining) and [`routes`] decides what each
//! path means; [`subscribers`] holds a loop's subscriber lists and fans out its
//! inbox; [`shared`] is what every loop reads; [`timer`] the deadline wheel. This
//! module must not parse bytes (that is `protocol`) or decide routes.

pub mod conn;
pub mod event_loop;
pub mod http;
pub mod routes;
pub mod shared;
pub mod subscribers;
pub mod timer;
pub mod uring;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use mio::{Poll, Waker};
use socket2::{Domain, Protocol, Socket, Type};

use crate::broker::{Broker, MemoryBroker, RedisBroker};
use crate::config::BrokerSpec;
use crate::config::ServeConfig;
use crate::history::Limits;
use crate::hub::Hub;
use crate::stats::ServerStats;
use shared::Shared;
pub use shared::{Admission, Refusal};

pub use crate::os::LISTEN_BACKLOG;
/// A connection that sends nothing is accepted after about this long anyway (one
/// SYN-ACK retransmission), and its handshake timeout starts then.
pub const DEFER_ACCEPT_SECS: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error(
        "{addr} is already in use by another process (pass --reuse-port to share it on purpose)"
    )]
    PortInUse { addr: SocketAddr },
    #[error("cannot create the event loop: {0}")]
    Poll(io::Error),
    #[error("cannot start I/O thread: {0}")]
    Spawn(io::Error),
    #[error("I/O thread failed: {0}")]
    Thread(io::Error),
    #[error("I/O thread panicked")]
    Panicked,
    #[error("cannot start the broker: {0}")]
    Broker(#[from] crate::broker::BrokerError),
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] crate::tls::config::TlsConfigError),
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

    /// With `--tls-cert`: the certificates, to reload on SIGHUP.
    pub fn tls(&self) -> Option<Arc<crate::tls::config::Certificates>> {
        self.stopper.shared.tls.clone()
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

/// Refuses an address another process listens on. The listeners share their
/// ports (SO_REUSEPORT, for the I/O threads and the workers), which would let a
/// second server on the same port start and take half of its connections; a
/// bind without SO_REUSEPORT fails while any socket listens there, so each
/// address is tried that way first and let go. SO_REUSEADDR stays on, so the
/// connections of an earlier run still in TIME_WAIT do not count. Port 0 is
/// skipped (the kernel picks a free one). The caller that holds the ports
/// already (a worker of `--workers`, whose master checked) or means to share
/// them (`--reuse-port`) does not call this.
pub fn check_ports_free(addrs: &[SocketAddr]) -> Result<(), ServerError> {
    for &addr in addrs.iter().filter(|a| a.port() != 0) {
        let probe = || -> io::Result<()> {
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            socket.set_reuse_address(true)?;
            if addr.is_ipv6() {
                socket.set_only_v6(true)?;
            }
            socket.bind(&addr.into())
        };
        match probe() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                return Err(ServerError::PortInUse { addr });
            }
            Err(source) => return Err(ServerError::Bind { addr, source }),
        }
    }
    Ok(())
}

/// A TCP socket bound to `addr` with the options every listener of a port
/// shares (SO_REUSEADDR, SO_REUSEPORT, IPv6 only on an IPv6 address): the I/O
/// threads' listeners, the workers', and the port-0 reservation of `--workers`'
/// master (`workers::reserve_ports`), which could not share the port otherwise.
pub fn bind_shared_port(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn bind_listener(addr: SocketAddr) -> io::Result<mio::net::TcpListener> {
    let socket = bind_shared_port(addr)?;
    // Not fatal: without it a connection is accepted at once, as before.
    if let Err(e) =
        crate::os::defer_accept(std::os::fd::AsRawFd::as_raw_fd(&socket), DEFER_ACCEPT_SECS)
    {
        tracing::debug!(error = %e, "TCP_DEFER_ACCEPT not set");
    }
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(mio::net::TcpListener::from_std(socket.into()))
}

/// Binds the listeners, starts the I/O threads and returns at once.
pub fn start(config: ServeConfig) -> Result<ServerHandle, ServerError> {
    let threads = config.threads;
    // Bad certificate files stop the start, before any port answers.
    let tls = match &config.tls {
        Some(files) => {
            let secret = crate::tls::config::ticket_secret(files.ticket_key.as_deref())?;
            Some(Arc::new(crate::tls::config::Certificates::load(
                &files.cert,
                &files.key,
                secret.as_deref(),
            )?))
        }
        None => None,
    };
    if !config.reuse_port {
        check_ports_free(&config.listen)?;
    }
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
    let hub = Arc::new(Hub::new(wakers.clone()));
    let history = Limits {
        size: config.history_size,
        ttl: config.history_ttl,
    };
    let broker: Arc<dyn Broker> = match &config.broker {
        BrokerSpec::Memory => Arc::new(
            MemoryBroker::new(Arc::clone(&hub), history, config.namespaces.clone())
                .with_history_budget(config.history_max_bytes),
        ),
        BrokerSpec::Redis(url) => Arc::new(RedisBroker::start(
            Arc::clone(&hub),
            url,
            config.redis_subscribe,
            config.redis_wait_replicas,
            history,
            config.namespaces.clone(),
            &config.redis_prefix,
        )?),
    };
    let webhooks = crate::webhooks::Webhooks::start(&config.pusher_apps)
        .map_err(ServerError::Spawn)?
        .map(Arc::new);
    if let Some(hooks) = &webhooks {
        broker.set_watch(Arc::clone(hooks) as Arc<dyn crate::broker::ChannelWatch>);
    }
    let mut shared = Shared::new(config, hub, broker);
    shared.webhooks = webhooks;
    shared.tls = tls;
    let shared = Arc::new(shared);
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
    let feed_shared = Arc::clone(&shared);
    let feed = std::thread::Builder::new()
        .name("throng-feed".into())
        .spawn(move || {
            crate::feed::run(&feed_shared.shutdown, feed_shared.feed_view());
            Ok(())
        })
        .map_err(ServerError::Spawn)?;
    handles.push(feed);
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
        let hub = Arc::new(Hub::new(wakers));
        let config = ServeConfig {
            api_key: api_key.map(String::from),
            threads: 2,
            ..ServeConfig::default()
        };
        let history = Limits {
            size: 100,
            ttl: std::time::Duration::from_secs(300),
        };
        let broker = Arc::new(MemoryBroker::new(
            Arc::clone(&hub),
            history,
            Default::default(),
        ));
        let shared = Shared::new(config, hub, broker);
        (shared, polls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_socket_listens_on_is_refused_and_let_go_after() {
        // Another throng's listener (SO_REUSEPORT) and any other program's.
        let shared = bind_listener(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = shared.local_addr().unwrap();
        assert!(matches!(
            check_ports_free(&[addr]),
            Err(ServerError::PortInUse { addr: a }) if a == addr
        ));
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = plain.local_addr().unwrap();
        let refused = check_ports_free(&[other]).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("{other} is already in use"))
                && refused.contains("--reuse-port"),
            "{refused}"
        );
        drop(shared);
        drop(plain);
        check_ports_free(&[addr, other]).unwrap();
        // Port 0 is never held: the kernel picks a free port.
        check_ports_free(&[SocketAddr::from(([127, 0, 0, 1], 0))]).unwrap();
    }
}
