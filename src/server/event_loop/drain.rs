//! The drain (SIGTERM/SIGINT): no new connections, every open one told goodbye
//! in its transport's way, plain HTTP connections a short grace for a request on
//! its way, and the loop's end once all are gone or the drain timeout passed. It
//! must not decide how a transport says goodbye.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::EventLoop;
use crate::server::conn::{Mode, Phase};
use crate::timing::DRAIN_GRACE;
use crate::transport::CloseReason;

/// Where the loop is in a drain.
#[derive(Debug, Default)]
pub(super) struct Drain {
    deadline: Option<Instant>,
    /// Until when plain HTTP connections may still send a request.
    grace: Option<Instant>,
}

impl Drain {
    pub(super) fn started(&self) -> bool {
        self.deadline.is_some()
    }
}

impl EventLoop {
    /// The drain's step at the end of a turn: starts it once shutdown is asked,
    /// ends the grace, and says whether the loop is done.
    pub(super) fn drain_step(&mut self) -> bool {
        if self.shared.shutdown.load(Ordering::Acquire) && !self.drain.started() {
            self.begin_drain();
        }
        if let Some(grace) = self.drain.grace
            && Instant::now() >= grace
        {
            self.drain.grace = None;
            self.close_idle_http();
        }
        self.drain
            .deadline
            .is_some_and(|deadline| self.conns.is_empty() || Instant::now() >= deadline)
    }

    fn begin_drain(&mut self) {
        let now = Instant::now();
        self.drain.deadline = Some(now + self.shared.config.drain_timeout);
        self.drain.grace = Some(now + DRAIN_GRACE);
        // Closing a listener resets the connections still in its accept queue,
        // requests and all: take them in first, to answer them.
        if self.accept.is_open() {
            for index in 0..self.accept.listeners.len() {
                self.accept_from(index);
            }
        }
        for mut listener in self.accept.listeners.drain(..) {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        let keys: Vec<(usize, bool)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.phase == Phase::Active)
            .map(|(k, c)| (k, c.mode.is_counted()))
            .collect();
        for (key, open) in keys {
            if !open {
                // A request already in the socket is answered first (with
                // `Connection: close`, as the server drains): closing over unread
                // input resets the connection, and a proxy cannot retry a POST
                // that met a reset.
                self.on_readable(key, false);
            }
            let Some(conn) = self.conns.get(key) else {
                continue;
            };
            if conn.phase != Phase::Active {
                // Closing after its last answer.
                continue;
            }
            if conn.mode.is_counted() {
                self.close_with(key, CloseReason::Shutdown);
            }
            // Plain HTTP connections get DRAIN_GRACE for a request on its way.
        }
    }

    /// The drain's grace is over: closes the plain HTTP connections that are idle
    /// (one answering its last request closes when that is written; one waiting
    /// on the broker is answered first, and closes then).
    fn close_idle_http(&mut self) {
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(k, c)| {
                c.phase == Phase::Active
                    && !c.mode.is_counted()
                    && !matches!(c.mode, Mode::Asking(_))
                    && c.is_flushed(self.tls.get(*k))
            })
            .map(|(k, _)| k)
            .collect();
        for key in idle {
            self.drop_conn(key);
        }
    }
}
