//! `--workers N`: a master process that runs N worker processes of this same
//! binary with the same flags, all listening on the same ports (SO_REUSEPORT, so
//! the kernel spreads connections over them), and keeps them running. The
//! master checks first that no other process holds those ports
//! (`server::check_ports_free`); a worker skips that check, its siblings hold them.
//! A `--listen` port 0 is resolved here, once, before any worker starts
//! (`reserve_ports`): the master keeps that port bound for its whole life and
//! hands the addresses to every worker in `THRONG_WORKER_LISTEN`, so all of them,
//! and the ones restarted later, share one port.
//!
//! It owns the workers' lives: starting them (each marked by
//! `THRONG_WORKER_INDEX`), restarting one that dies (after a pause if it died
//! young, so a worker that cannot start does not spin), and on SIGTERM/SIGINT
//! passing the signal on for a graceful drain and waiting for them (a second
//! signal kills them). Workers reach each other only through the broker, so more
//! than one needs Redis. It must not serve connections or read the server's state.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::timing::{WORKER_RESTART_PAUSE, WORKER_YOUNG, WORKERS_TICK};

/// Set in a worker's environment to its index: the process serves instead of
/// supervising, whatever `--workers` says.
pub const WORKER_ENV: &str = "THRONG_WORKER_INDEX";
/// Set in a worker's environment to the addresses it listens on (comma
/// separated), port 0 already resolved by the master; it wins over `--listen`.
pub const LISTEN_ENV: &str = "THRONG_WORKER_LISTEN";

#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    #[error("cannot find this program to start workers: {0}")]
    Exe(std::io::Error),
    #[error("cannot start worker {index}: {source}")]
    Spawn {
        index: usize,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("cannot pick a port for {addr}: {source}")]
    Reserve {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{LISTEN_ENV} holds '{0}', not a list of host:port addresses")]
    BadListenEnv(String),
}

/// The master's hold on the ports it picked for `--listen` port 0: sockets bound
/// with SO_REUSEPORT but never listening, so the workers can join the port and
/// the kernel hands connections to the workers only. Dropping it lets them go.
pub struct ReservedPorts {
    /// Every listen address with port 0 replaced by the port the kernel picked.
    pub addrs: Vec<SocketAddr>,
    _held: Vec<socket2::Socket>,
}

/// Binds each port-0 address of `listen` once, so every worker gets the same
/// port; other addresses pass through untouched.
pub fn reserve_ports(listen: &[SocketAddr]) -> Result<ReservedPorts, WorkersError> {
    let mut addrs = Vec::with_capacity(listen.len());
    let mut held = Vec::new();
    for &addr in listen {
        if addr.port() != 0 {
            addrs.push(addr);
            continue;
        }
        let reserve = || -> std::io::Result<(socket2::Socket, SocketAddr)> {
            let socket = crate::server::bind_shared_port(addr)?;
            let bound = socket.local_addr()?.as_socket().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not an IP address")
            })?;
            Ok((socket, bound))
        };
        let (socket, bound) = reserve().map_err(|source| WorkersError::Reserve { addr, source })?;
        addrs.push(bound);
        held.push(socket);
    }
    Ok(ReservedPorts { addrs, _held: held })
}

/// In a worker: the addresses its master resolved (`LISTEN_ENV`), if it passed any.
pub fn inherited_listen() -> Result<Option<Vec<SocketAddr>>, WorkersError> {
    let Some(value) = std::env::var_os(LISTEN_ENV) else {
        return Ok(None);
    };
    let text = value.to_string_lossy();
    text.split(',')
        .map(|a| a.trim().parse::<SocketAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(|_| WorkersError::BadListenEnv(text.into_owned()))
}

/// This process is a worker of a master (`--workers` then means nothing here).
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

struct Worker {
    index: usize,
    child: Child,
    started: Instant,
}

fn spawn(
    exe: &std::path::Path,
    args: &[OsString],
    listen: &str,
    index: usize,
    ticket_secret: Option<&str>,
) -> Result<Worker, WorkersError> {
    let mut command = Command::new(exe);
    command.env(LISTEN_ENV, listen);
    if let Some(secret) = ticket_secret {
        // With TLS, a client resumes its session on whichever worker the
        // kernel hands its next connection to.
        command.env(crate::tls::tickets::SECRET_ENV, secret);
    }
    let child = command
        .args(args)
        .env(WORKER_ENV, index.to_string())
        // Its own process group: a terminal's Ctrl-C reaches the master only, which
        // passes one SIGTERM on (a second signal would make a worker skip its drain).
        .process_group(0)
        .spawn()
        .map_err(|source| WorkersError::Spawn { index, source })?;
    tracing::info!(worker = index, pid = child.id(), "worker started");
    Ok(Worker {
        index,
        child,
        started: Instant::now(),
    })
}

fn signal_all(workers: &[Worker], signal: libc::c_int) {
    for w in workers {
        if let Ok(pid) = libc::pid_t::try_from(w.child.id()) {
            // SAFETY: kill(2) on a child's pid; a child already gone gives ESRCH.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// Runs `count` workers with this process's own arguments, listening on
/// `listen` (ports resolved, see `reserve_ports`), until a signal, then drains
/// them (up to `drain` plus a margin) and returns. `started` runs once, when
/// every worker has been started.
pub fn supervise(
    count: usize,
    drain: Duration,
    listen: &[SocketAddr],
    started: impl FnOnce(),
) -> Result<(), WorkersError> {
    let exe = std::env::current_exe().map_err(WorkersError::Exe)?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let listen: String = listen
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let signals = Arc::new(AtomicUsize::new(0));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let seen = Arc::clone(&signals);
        // SAFETY: the handler only increments an atomic.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                seen.fetch_add(1, Ordering::SeqCst);
            })
        }
        .map_err(WorkersError::Signals)?;
    }
    let ticket_secret = std::env::var(crate::tls::tickets::SECRET_ENV)
        .ok()
        .or_else(crate::tls::tickets::random_secret_hex);
    let mut workers = Vec::with_capacity(count);
    for index in 0..count {
        workers.push(spawn(
            &exe,
            &args,
            &listen,
            index,
            ticket_secret.as_deref(),
        )?);
    }
    started();
    let reloads = Arc::new(AtomicUsize::new(0));
    {
        let seen = Arc::clone(&reloads);
        // SAFETY: the handler only increments an atomic.
        unsafe {
            signal_hook::low_level::register(signal_hook::consts::SIGHUP, move || {
                seen.fetch_add(1, Ordering::SeqCst);
            })
        }
        .map_err(WorkersError::Signals)?;
    }
    let mut restarts: Vec<(usize, Instant)> = Vec::new();
    loop {
        if signals.load(Ordering::SeqCst) > 0 {
            break;
        }
        if reloads.swap(0, Ordering::SeqCst) > 0 {
            // Each worker reads its certificates again itself.
            tracing::info!("SIGHUP: passing it on to {} worker(s)", workers.len());
            signal_all(&workers, libc::SIGHUP);
        }
        let mut i = 0;
        while i < workers.len() {
            match workers[i].child.try_wait() {
                Ok(Some(status)) => {
                    let w = workers.swap_remove(i);
                    tracing::warn!(worker = w.index, %status, "worker died; starting it again");
                    let at = if w.started.elapsed() < WORKER_YOUNG {
                        Instant::now() + WORKER_RESTART_PAUSE
                    } else {
                        Instant::now()
                    };
                    restarts.push((w.index, at));
                }
                Ok(None) => i += 1,
                Err(e) => {
                    tracing::warn!(worker = workers[i].index, error = %e, "cannot check worker");
                    i += 1;
                }
            }
        }
        let now = Instant::now();
        let mut j = 0;
        while j < restarts.len() {
            if restarts[j].1 <= now {
                let (index, _) = restarts.swap_remove(j);
                match spawn(&exe, &args, &listen, index, ticket_secret.as_deref()) {
                    Ok(w) => workers.push(w),
                    Err(e) => {
                        tracing::warn!(error = %e, "restart failed; trying again");
                        restarts.push((index, now + WORKER_RESTART_PAUSE));
                    }
                }
            } else {
                j += 1;
            }
        }
        std::thread::sleep(WORKERS_TICK);
    }
    tracing::info!("shutting down: draining {} worker(s)", workers.len());
    signal_all(&workers, libc::SIGTERM);
    let deadline = Instant::now() + drain + Duration::from_secs(5);
    let mut killed = false;
    while !workers.is_empty() {
        workers.retain_mut(|w| !matches!(w.child.try_wait(), Ok(Some(_))));
        if !killed && (signals.load(Ordering::SeqCst) > 1 || Instant::now() >= deadline) {
            tracing::warn!("workers still running: killing them");
            signal_all(&workers, libc::SIGKILL);
            killed = true;
        }
        std::thread::sleep(WORKERS_TICK);
    }
    tracing::info!("all workers stopped");
    Ok(())
}
