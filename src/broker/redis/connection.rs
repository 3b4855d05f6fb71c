//! Commands to Redis and the circuit breaker around them: a pool of connections
//! with timeouts, what counts as a failure on the wire, failing fast while Redis
//! is down, and when the heartbeat (written by `presence`) runs: it is also the
//! probe finding Redis back. It must not know what the commands mean (channels,
//! presence, liveness, subscriptions).

use std::sync::atomic::Ordering;
use std::time::Duration;

use ::redis::Connection;

use super::{BrokerError, Shared, lock};

/// How long a Redis connect or command may take before it counts as a failure.
/// Event loops wait this long at most once: after a failure they fail fast while
/// the keeper thread probes (see [`Shared::with_connection`]).
pub(super) const REDIS_TIMEOUT: Duration = Duration::from_secs(1);

/// How a Redis command failed: on the wire (the connection is gone), or with an
/// error Redis answered.
enum Failure {
    Wire(BrokerError),
    Answer(BrokerError),
}

impl Failure {
    fn into_error(self) -> BrokerError {
        match self {
            Failure::Wire(e) | Failure::Answer(e) => e,
        }
    }
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {e}"))
}

impl Shared {
    /// Runs `f` on a pooled connection (a new one if none is idle); a connection
    /// that failed on the wire is dropped, not returned. A pooled connection found
    /// broken (Redis restarted since it was last used) empties the pool and `f`
    /// runs once more on a new one.
    ///
    /// While the last command failed, this answers at once without trying: the
    /// event loops that call it must not wait out a timeout per request while
    /// Redis is down or hung. The keeper thread probes every second
    /// ([`Shared::heartbeat`]) and the listener marks Redis reachable when it is
    /// back.
    pub(super) fn with_connection<T>(
        &self,
        f: impl Fn(&mut Connection) -> ::redis::RedisResult<T>,
    ) -> Result<T, BrokerError> {
        if !self.commands_ok.load(Ordering::Relaxed) {
            return Err(unavailable("unreachable (retrying every second)"));
        }
        let pooled = lock(&self.pool).pop();
        let reused = pooled.is_some();
        match self.run_on(pooled, &f) {
            Err(Failure::Wire(_)) if reused => {
                lock(&self.pool).clear();
                self.run_on(None, &f).map_err(Failure::into_error)
            }
            result => result.map_err(Failure::into_error),
        }
    }

    fn run_on<T>(
        &self,
        pooled: Option<Connection>,
        f: &impl Fn(&mut Connection) -> ::redis::RedisResult<T>,
    ) -> Result<T, Failure> {
        let mut con = match pooled {
            Some(con) => con,
            None => self.connect().map_err(|e| {
                self.commands_ok.store(false, Ordering::Relaxed);
                Failure::Wire(e)
            })?,
        };
        match f(&mut con) {
            Ok(v) => {
                self.commands_ok.store(true, Ordering::Relaxed);
                lock(&self.pool).push(con);
                Ok(v)
            }
            Err(e)
                if e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error() =>
            {
                self.commands_ok.store(false, Ordering::Relaxed);
                Err(Failure::Wire(unavailable(e)))
            }
            Err(e) => {
                // Redis answered with an error: the connection is fine.
                lock(&self.pool).push(con);
                Err(Failure::Answer(unavailable(e)))
            }
        }
    }

    pub(super) fn connect(&self) -> Result<Connection, BrokerError> {
        let con = self
            .client
            .get_connection_with_timeout(REDIS_TIMEOUT)
            .map_err(unavailable)?;
        con.set_read_timeout(Some(REDIS_TIMEOUT))
            .map_err(unavailable)?;
        con.set_write_timeout(Some(REDIS_TIMEOUT))
            .map_err(unavailable)?;
        Ok(con)
    }

    /// This node is alive ([`Shared::beat`]). It is also the probe that finds
    /// Redis back after a failure, so it always tries, on a fresh connection then.
    pub(super) fn heartbeat(&self) -> Result<(), BrokerError> {
        let beat = |con: &mut Connection| self.beat(con);
        if self.commands_ok.load(Ordering::Relaxed) {
            return self.with_connection(beat);
        }
        lock(&self.pool).clear();
        self.run_on(None, &beat).map_err(Failure::into_error)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Condvar, Mutex};

    use ::redis::{Client, Script};

    use super::super::Subscribe;
    use super::super::listener::Subs;
    use super::super::presence::MEMBERS_LUA;
    use super::super::snapshot::SNAPSHOT_LUA;
    use super::*;
    use crate::history::Limits;
    use crate::hub::Hub;
    use crate::rules::Namespaces;

    #[test]
    fn after_a_failure_commands_fail_fast_until_a_probe_succeeds() {
        // A port that takes connections and never answers: a hung Redis.
        let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}", hung.local_addr().unwrap());
        let polls = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(polls.registry(), mio::Token(0)).unwrap());
        let shared = Shared {
            hub: Arc::new(Hub::new(vec![waker])),
            client: Client::open(url.as_str()).unwrap(),
            node: "n".into(),
            listening: AtomicBool::new(false),
            commands_ok: AtomicBool::new(true),
            pool: Mutex::new(Vec::new()),
            snapshot: Script::new(SNAPSHOT_LUA),
            members: Script::new(MEMBERS_LUA),
            users_join: Script::new(crate::broker::redis::users::JOIN_LUA),
            users_leave: Script::new(crate::broker::redis::users::LEAVE_LUA),
            users_sweep: Script::new(crate::broker::redis::users::SWEEP_LUA),
            presence_channels: Mutex::new(HashMap::new()),
            history: Limits {
                size: 0,
                ttl: Duration::ZERO,
            },
            namespaces: Namespaces::default(),
            written_members: Mutex::new(HashMap::new()),
            mode: Subscribe::Pattern,
            subs: Mutex::new(Subs::default()),
            confirmed: Condvar::new(),
            watch: std::sync::OnceLock::new(),
            occupy: Script::new(crate::broker::redis::occupancy::OCCUPY_LUA),
            vacate: Script::new(crate::broker::redis::occupancy::VACATE_LUA),
            occupying: Mutex::new(Default::default()),
            gone: Mutex::new(Arc::from([])),
        };
        // The first command waits out the timeout and fails ...
        let first = shared.heartbeat().unwrap_err().to_string();
        assert!(!first.contains("retrying"), "{first}");
        // ... then every other caller is answered at once, without trying.
        let next = shared.members("c", 1).unwrap_err().to_string();
        assert!(next.contains("retrying every second"), "{next}");
        // The probe itself always tries (and fails again against the same port).
        let probe = shared.heartbeat().unwrap_err().to_string();
        assert!(!probe.contains("retrying"), "{probe}");
        drop(hung);
    }
}
