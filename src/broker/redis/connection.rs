//! Commands to Redis and the circuit breaker around them: a pool of connections
//! with timeouts, what counts as a failure on the wire (a `READONLY` answer too:
//! the master was demoted), failing fast while Redis is down, and when the
//! heartbeat (written by `presence`) runs: it is also the probe finding Redis
//! back. Where a new connection goes (one Redis, or the master Sentinel names) is
//! `sentinel`'s; on a cluster, the redis crate's cluster client. It must not know
//! what the commands mean (channels, presence, liveness, subscriptions).

use std::sync::atomic::Ordering;

use ::redis::{Connection, ConnectionLike, ErrorKind, RedisError, ServerErrorKind};

use super::{BrokerError, Shared, lock};
pub(super) use crate::timing::REDIS_TIMEOUT;

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

/// Runs `pipe` on `con`: in one round trip where the connection pipelines, and
/// command by command on a cluster connection (whose commands may each go to
/// another master), answering as the pipeline would: every command's reply, an
/// ignored one's too, which callers here only ever read as `()`.
pub(super) fn query_pipeline<T: ::redis::FromRedisValue>(
    pipe: &::redis::Pipeline,
    con: &mut dyn ConnectionLike,
) -> ::redis::RedisResult<T> {
    if con.supports_pipelining() {
        return pipe.query(con);
    }
    let mut replies = Vec::new();
    for cmd in pipe.cmd_iter() {
        replies.push(cmd.query::<::redis::Value>(con)?);
    }
    Ok(::redis::from_redis_value(::redis::Value::Array(replies))?)
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {e}"))
}

/// A command connection: to the one Redis, or the redis crate's cluster
/// connection (which routes each command to its key's master and follows
/// `MOVED`, `ASK` and failovers).
pub(super) type Link = Box<dyn ConnectionLike + Send>;

/// A connection taken from the pool, and the generation it was taken in.
struct Pooled {
    con: Link,
    generation: u64,
}

/// The connection is gone, or goes to a Redis that is no master any more: either
/// way the next command needs a new connection (to wherever the master is now).
pub(super) fn is_wire_failure(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || is_demoted(e)
}

fn is_demoted(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
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
        f: impl Fn(&mut dyn ConnectionLike) -> ::redis::RedisResult<T>,
    ) -> Result<T, BrokerError> {
        if !self.commands_ok.load(Ordering::Relaxed) {
            return Err(unavailable("unreachable (retrying every second)"));
        }
        // Taken before the pop: a connection from before a switch is not given back.
        let generation = self.target.generation();
        let pooled = lock(&self.pool).pop().map(|con| Pooled { con, generation });
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
        pooled: Option<Pooled>,
        f: &impl Fn(&mut dyn ConnectionLike) -> ::redis::RedisResult<T>,
    ) -> Result<T, Failure> {
        let (mut con, generation) = match pooled {
            Some(Pooled { con, generation }) => (con, generation),
            None => {
                let generation = self.target.generation();
                let con = self.connect_link().map_err(|e| {
                    self.commands_ok.store(false, Ordering::Relaxed);
                    Failure::Wire(e)
                })?;
                (con, generation)
            }
        };
        match f(&mut *con) {
            Ok(v) => {
                self.commands_ok.store(true, Ordering::Relaxed);
                self.give_back(con, generation);
                Ok(v)
            }
            Err(e) if is_wire_failure(&e) => {
                self.commands_ok.store(false, Ordering::Relaxed);
                if is_demoted(&e) {
                    tracing::warn!(error = %e, "redis is no master any more; reconnecting");
                    if self.target.is_sentinel() {
                        self.forget_master();
                    } else {
                        // The same URL again (its name may point at the new master
                        // by now); the listener reconnecting there would gain nothing.
                        lock(&self.pool).clear();
                    }
                }
                Err(Failure::Wire(unavailable(e)))
            }
            Err(e) => {
                // Redis answered with an error: the connection is fine.
                self.give_back(con, generation);
                Err(Failure::Answer(unavailable(e)))
            }
        }
    }

    /// Into the pool, unless the master changed since the connection was taken.
    fn give_back(&self, con: Link, generation: u64) {
        let mut pool = lock(&self.pool);
        if self.target.generation() == generation {
            pool.push(con);
        }
    }

    /// The master changed, or may have (Sentinel said so, or Redis answered
    /// `READONLY`): no connection made before is used again, and the next connect
    /// asks where the master is. The listener notices the new generation itself.
    pub(super) fn forget_master(&self) {
        // Counted before the pool is emptied: a connection given back between the
        // two is either cleared here or refused by `give_back`.
        self.target.next_generation();
        lock(&self.pool).clear();
    }

    /// A command connection for the pool.
    fn connect_link(&self) -> Result<Link, BrokerError> {
        match &self.cluster {
            Some(cluster) => Ok(Box::new(cluster.get_connection().map_err(unavailable)?)),
            None => Ok(Box::new(self.connect()?)),
        }
    }

    /// A connection to the one Redis, or the master Sentinel names (not on a
    /// cluster); whether it is durable is noted (see `origin`).
    pub(super) fn connect(&self) -> Result<Connection, BrokerError> {
        let mut con = self.target.connect()?;
        self.probe_durability(&mut con);
        Ok(con)
    }

    /// This node is alive ([`Shared::beat`]). It is also the probe that finds
    /// Redis back after a failure, so it always tries, on a fresh connection then.
    pub(super) fn heartbeat(&self) -> Result<(), BrokerError> {
        let beat = |con: &mut dyn ConnectionLike| self.beat(con);
        if self.commands_ok.load(Ordering::Relaxed) {
            return self.with_connection(beat);
        }
        lock(&self.pool).clear();
        self.run_on(None, &beat).map_err(Failure::into_error)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::super::sentinel::Target;
    use super::super::{Scheme, Subscribe};
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
        let mut shared = Shared::new(
            Arc::new(Hub::new(vec![waker])),
            Target::open(&url).unwrap(),
            Scheme {
                mode: Subscribe::Pattern,
                wait_replicas: 0,
                history: Limits {
                    size: 0,
                    ttl: std::time::Duration::ZERO,
                },
                namespaces: Namespaces::default(),
                prefix: "throng".into(),
            },
            None,
            None,
        );
        shared.commands_ok = AtomicBool::new(true);
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
