//! Accepting: the loop's listeners, new connections into the slab, and the
//! back-off when the open-files limit refuses one. It must not read a request:
//! a new connection is handed to the loop's reads in the turn that accepted it.

use std::io;
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Token};

use super::EventLoop;
use super::timers::set_deadline;
use crate::server::conn::Conn;
use crate::server::timer::{Tick, ticks};
use crate::stats::LoopCounters;
use crate::timing::{ACCEPT_BACKOFF, ACCEPT_LOG_EVERY};

/// The listeners and the accept back-off at the open-files limit.
pub(super) struct Acceptor {
    pub(super) listeners: Vec<TcpListener>,
    paused_until: Option<Tick>,
    failures: u64,
    log_at: Tick,
}

impl Acceptor {
    pub(super) fn new(listeners: Vec<TcpListener>) -> Self {
        Acceptor {
            listeners,
            paused_until: None,
            failures: 0,
            log_at: 0,
        }
    }

    /// Not paused by the back-off.
    pub(super) fn is_open(&self) -> bool {
        self.paused_until.is_none()
    }
}

impl EventLoop {
    pub(super) fn accept_from(&mut self, index: usize) {
        loop {
            let Some(listener) = self.accept.listeners.get(index) else {
                return;
            };
            match listener.accept() {
                Ok((socket, addr)) => self.add_conn(socket, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    // EMFILE/ENFILE/ENOMEM: wait for descriptors to free up rather
                    // than spin on a listener that stays readable. Logged at most
                    // every ACCEPT_LOG_EVERY, with how often it happened meanwhile.
                    let now = self.clock.now;
                    let accept = &mut self.accept;
                    accept.failures += 1;
                    if now >= accept.log_at {
                        tracing::warn!(
                            error = %e,
                            failures = accept.failures,
                            "accept failed (at the open-files limit?); pausing accepts for {ACCEPT_BACKOFF:?} at a time"
                        );
                        accept.failures = 0;
                        accept.log_at = now + ticks(ACCEPT_LOG_EVERY);
                    }
                    accept.paused_until = Some(now + ticks(ACCEPT_BACKOFF).max(1));
                    return;
                }
            }
        }
    }

    /// Takes whatever queued meanwhile once the back-off is over.
    pub(super) fn resume_accepting(&mut self) {
        if let Some(until) = self.accept.paused_until
            && self.clock.now >= until
            && !self.drain.started()
        {
            self.accept.paused_until = None;
            // Edge-triggered listeners will not report connections that queued
            // while we were paused: look at every listener once.
            for index in 0..self.accept.listeners.len() {
                self.accept_from(index);
            }
        }
    }

    fn add_conn(&mut self, mut socket: TcpStream, addr: SocketAddr) {
        LoopCounters::add(&self.tally.shared.accepted, 1);
        let _ = socket.set_nodelay(true);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if let Err(e) = self.poll.registry().register(
            &mut socket,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!(error = %e, "cannot register a new connection");
            return;
        }
        self.ring.opened(key);
        let conn = entry.insert(Conn::new(socket, addr.ip(), self.clock.now));
        if self.shared.tls.is_some() {
            self.tls.start(key);
        }
        let due = self.clock.now + self.clock.handshake_ticks;
        set_deadline(&mut self.clock.wheel, key, conn, due);
        // The listener defers accepts until the request's first bytes are in
        // (`os::defer_accept`): read them in this turn, not after another wait.
        self.unfinished.push(key);
    }
}
