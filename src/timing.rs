//! The server's timers in one place: every fixed duration the server waits,
//! sweeps or gives up on, each with what it times and why it has that value,
//! and the hidden test setting (`--test-time-scale`) that shortens the ones
//! tests wait on.
//!
//! It owns the values and the process-wide scale, set once from the config
//! before any loop or thread starts ([`set_test_time_scale`]); the scaled timers
//! are read through functions ([`node_ttl`], [`close_timeout`], ...), which at
//! the default scale return the constant unchanged. It must not start anything
//! or know what the timers are used for beyond their docs. The load generator's
//! own timers (`src/bench/`) stay there: they are the client's, not the
//! server's, and the bench shares only protocol, write path, client, pusher, os
//! and units with the server (tests/structure.rs), so it must not reach into a
//! server setting. Durations the user sets (`--ping-interval`, `--drain-timeout`,
//! ...) are flags, in `config`, and are never scaled.

use std::sync::OnceLock;
use std::time::Duration;

// ---- The event loop ----------------------------------------------------

/// Timer wheel resolution: timeouts fire at most this late. Fine enough for
/// second-scale deadlines, coarse enough that the wheel turns rarely.
pub const WHEEL_TICK: Duration = Duration::from_millis(20);
/// How long a closing connection may take to flush and say goodbye (scaled:
/// [`close_timeout`]). A peer that never answers a close is cut off then.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for the peer's FIN after ours (scaled: [`linger_timeout`]):
/// long enough for a client's close to cross a slow link, short enough that a
/// crowd of vanished peers does not hold sockets.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(2);
/// A ping sent this much after its time was held up by the loop, not the client.
pub const LATE_PING: Duration = Duration::from_secs(1);
/// A returning subscriber whose replay of history has waited this long without
/// the reader taking a byte of it is given up: what is left of it counts against
/// `--max-queue` from then on, and a reader past that is dropped at once (no
/// close frame, which would wait behind the replay). Long enough for TCP's
/// retransmissions over a lossy link (four lost in a row), short enough that a
/// crowd of readers asking for replays they never read pins each one for
/// seconds, not for a ping interval or two.
pub const REPLAY_STALL: Duration = Duration::from_secs(5);
/// How often a loop looks at its waiting replays.
pub const CATCH_UP_SWEEP_EVERY: Duration = Duration::from_millis(500);
/// How often loop 0 gives the broker its housekeeping turn (scaled:
/// [`maintain_every`]): expiry, the history budget's cuts, forgotten channels.
pub const MAINTAIN_EVERY: Duration = Duration::from_secs(10);
/// How often a loop with io_uring weighs which connections are busy enough to
/// receive through the ring.
pub const RECEIVE_SWEEP_EVERY: Duration = Duration::from_secs(1);
/// A turn at least this long is logged (at most four lines a second per loop).
pub const SLOW_TURN: Duration = Duration::from_millis(250);
/// How long a turn may spend on a fan-out before the loop looks at its other
/// connections again (accepts, requests, pings, a publisher waiting for its answer).
/// This thread's CPU time, counted from the turn's first delivery: on a crowded
/// box a turn's 256 events took hundreds of milliseconds of wall time and 2 ms of
/// wall time were a few subscribers' sends, so a deadline in wall time (from the
/// wake-up, or even from the fan-out's start) left a fan-out 16 subscribers a turn
/// while the turn's other work went on at its full count.
pub const FAN_OUT_TIME: Duration = Duration::from_millis(2);
/// During a drain, plain HTTP connections (a proxy's kept-alive ones, those just
/// taken from the accept queue) get this long to send a request already on its
/// way; it is answered with `Connection: close`, the idle ones then close.
pub const DRAIN_GRACE: Duration = Duration::from_millis(250);
/// Pause before retrying accept when out of file descriptors: a retry at once
/// would spin on the same error.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Accept failures are logged at most this often, so a descriptor shortage does
/// not flood the log.
pub const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a replay's filter of live copies waits for the channel's next newer
/// message: a live copy of a replayed message later than this was held up far
/// longer than any delivery path takes.
pub const FRESH_LIFE: Duration = Duration::from_secs(30);
/// How long a chat member waits for its own join's announcement to come back
/// through Redis before channel events reach it again anyway (the announcement
/// was lost): longer than a Redis round trip under any load that still serves.
pub const JOIN_ECHO_LIFE: Duration = Duration::from_secs(5);
/// io_uring: the window in which a loop counts events to decide whether it is
/// busy enough to wait for batches (`uring::COALESCE_FROM` events in it, 20,000
/// a second): short, so a burst of handshakes gets there too.
pub const COALESCE_WINDOW: Duration = Duration::from_millis(10);

// ---- Brokers -----------------------------------------------------------

/// How long an unused channel (no subscribers, no publishes) keeps its `seq`
/// (scaled: [`channel_retention`]); on Redis the least life of a channel's keys.
pub const CHANNEL_RETENTION: Duration = Duration::from_secs(300);
/// How long an idempotency key is remembered after its first publish: longer
/// than any client's retries take (Centrifugo and Stripe-style APIs keep theirs
/// minutes to hours), short enough that memory stays bounded by the publish rate.
pub const IDEMPOTENCY_REMEMBERED_FOR: Duration = Duration::from_secs(300);
/// How long a Redis connect or command may take before it counts as a failure.
/// Event loops wait this long at most once: after a failure they fail fast while
/// the keeper thread probes.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a request handed to the broker (a publish through Redis) waits for
/// its answer before it is answered 503 (counted), and the longest one waits
/// queued before the broker gives up on it unsent. Past one Redis timeout, for a
/// reconnect's round trip and the queue ahead of it.
pub const BROKER_DEADLINE: Duration = Duration::from_secs(3);
/// A node whose last beat is older than this is gone (scaled: [`node_ttl`]):
/// what it holds no longer counts, and is taken out by whoever comes across it.
/// Six beats ([`KEEPER_TICK`] × 5): a node busy or briefly cut off is not taken
/// for dead.
pub const NODE_TTL: Duration = Duration::from_secs(30);
/// A gone node is forgotten (taken out of the nodes' set) this long after its
/// last beat (scaled: [`node_forget`]). By then nothing of it is left: whatever
/// keeps a channel's key alive takes gone nodes out of it, and a key nothing
/// keeps alive expires within [`NODE_TTL`] and the key life
/// ([`CHANNEL_RETENTION`]) of the node's death.
pub const NODE_FORGET: Duration = Duration::from_secs(600);
const _: () = assert!(
    NODE_FORGET.as_secs() > NODE_TTL.as_secs() + CHANNEL_RETENTION.as_secs(),
    "a node must stay listed gone while its shares may still be in Redis"
);
/// The Redis keeper's tick (scaled: [`keeper_tick`]): each tick it writes this
/// node's counts; every 5th it beats and sweeps for gone nodes, every 60th it
/// refreshes the keys of channels with subscribers here. Once a second keeps
/// counts current for people watching, at one round trip a second.
pub const KEEPER_TICK: Duration = Duration::from_secs(1);
/// The Redis listener's reconnect backoff, doubling from the first to the last.
pub const LISTENER_BACKOFF_FIRST: Duration = Duration::from_millis(100);
pub const LISTENER_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The Redis listener's read timeout: at least this often it looks whether the
/// master changed (Sentinel's failover), however quiet its channels are.
pub const LISTENER_TICK: Duration = Duration::from_secs(1);
/// How long a publish waits for its replicas (`WAIT`) before it is answered
/// as not published (held: see `release.lua`). Below the connection's read
/// timeout ([`REDIS_TIMEOUT`]), so a short WAIT is an answer, not a failure.
pub const REDIS_WAIT_TIMEOUT: Duration = Duration::from_millis(500);
/// Asking Sentinels for the master stops after this long (each contact has its own
/// [`REDIS_TIMEOUT`]): an event loop waits out a connect at most once, and with
/// several hung Sentinels that once must still be short.
pub const SENTINEL_ASK_BUDGET: Duration = Duration::from_secs(2);
/// The `+switch-master` watch reads with this timeout; after a few quiet reads
/// in a row it PINGs its Sentinel (a hung one must not look alive).
pub const SENTINEL_TICK: Duration = Duration::from_secs(1);
/// The watch's back-off between rounds of asking every Sentinel.
pub const SENTINEL_BACKOFF_FIRST: Duration = Duration::from_millis(100);
pub const SENTINEL_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often the Cluster supervisor reads the topology when nothing went wrong,
/// and wakes every shard thread (so a silent connection is a dead one).
pub const SHARDS_CHECK_EVERY: Duration = Duration::from_secs(5);
/// A shard connection silent this long (it is woken every
/// [`SHARDS_CHECK_EVERY`]) is taken for dead.
pub const SHARD_SILENCE: Duration = Duration::from_secs(20);
/// Back-off between topology reads while the cluster is unreachable.
pub const SHARDS_RETRY_FIRST: Duration = Duration::from_millis(100);
pub const SHARDS_RETRY_MAX: Duration = Duration::from_secs(2);

// ---- Webhooks, workers, the dashboard feed -------------------------------

/// How long a webhook batch waits for more events once it has one: short
/// enough that a receiver hears at once, long enough to group a burst.
pub const WEBHOOK_BATCH_WINDOW: Duration = Duration::from_millis(50);
/// Waits between tries of one webhook batch (scaled: [`webhook_retry_delay`]):
/// it is given up after the last, half a minute in all, which covers a
/// receiver's restart.
pub const WEBHOOK_RETRY_DELAYS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];
/// How long one webhook request may take.
pub const WEBHOOK_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A worker that dies sooner than this after its start waits
/// [`WORKER_RESTART_PAUSE`] before the next try, so a worker that cannot start
/// does not spin.
pub const WORKER_YOUNG: Duration = Duration::from_secs(2);
pub const WORKER_RESTART_PAUSE: Duration = Duration::from_secs(1);
/// How often the master looks at its workers.
pub const WORKERS_TICK: Duration = Duration::from_millis(100);
/// How often the dashboard feed takes a sample of this node.
pub const FEED_INTERVAL: Duration = Duration::from_secs(1);

// ---- The test time scale -----------------------------------------------

/// The scale, when one other than 1 was set; unset is the default 1.
static SCALE: OnceLock<f64> = OnceLock::new();

/// A `--test-time-scale` that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimingError {
    #[error("--test-time-scale must be above 0 and at most 1, not {0}")]
    OutOfRange(f64),
    #[error("the test time scale is already {set}, it cannot become {asked}")]
    AlreadySet { set: f64, asked: f64 },
}

/// Checks a test time scale: above 0 (a timer must still run) and at most 1
/// (it exists to make tests faster, never a server slower).
pub fn check_test_time_scale(factor: f64) -> Result<f64, TimingError> {
    if factor > 0.0 && factor <= 1.0 {
        Ok(factor)
    } else {
        Err(TimingError::OutOfRange(factor))
    }
}

/// Sets the process-wide scale, once, before any loop or thread reads a timer.
/// A scale of 1 sets nothing, so the timers stay the constants.
pub fn set_test_time_scale(factor: f64) -> Result<(), TimingError> {
    let factor = check_test_time_scale(factor)?;
    if factor == 1.0 {
        return Ok(());
    }
    let set = *SCALE.get_or_init(|| factor);
    if set == factor {
        Ok(())
    } else {
        Err(TimingError::AlreadySet { set, asked: factor })
    }
}

/// The scale in force: 1 unless a test set one.
pub fn test_time_scale() -> f64 {
    SCALE.get().copied().unwrap_or(1.0)
}

/// `base` under `factor`: unchanged at 1, else at least a millisecond (a
/// timer of zero would spin or never wait).
pub fn scale_by(base: Duration, factor: f64) -> Duration {
    if factor == 1.0 {
        base
    } else {
        base.mul_f64(factor).max(Duration::from_millis(1))
    }
}

fn scaled(base: Duration) -> Duration {
    match SCALE.get() {
        Some(&factor) => scale_by(base, factor),
        None => base,
    }
}

/// [`NODE_TTL`] under the test scale; Redis's heartbeat script is handed this.
pub fn node_ttl() -> Duration {
    scaled(NODE_TTL)
}

/// [`NODE_FORGET`] under the test scale.
pub fn node_forget() -> Duration {
    scaled(NODE_FORGET)
}

/// [`KEEPER_TICK`] under the test scale.
pub fn keeper_tick() -> Duration {
    scaled(KEEPER_TICK)
}

/// [`CHANNEL_RETENTION`] under the test scale; scaled with the node TTL and the
/// forget time so that [`NODE_FORGET`]'s invariant holds at every scale.
pub fn channel_retention() -> Duration {
    scaled(CHANNEL_RETENTION)
}

/// [`CLOSE_TIMEOUT`] under the test scale.
pub fn close_timeout() -> Duration {
    scaled(CLOSE_TIMEOUT)
}

/// [`LINGER_TIMEOUT`] under the test scale.
pub fn linger_timeout() -> Duration {
    scaled(LINGER_TIMEOUT)
}

/// [`MAINTAIN_EVERY`] under the test scale.
pub fn maintain_every() -> Duration {
    scaled(MAINTAIN_EVERY)
}

/// The `n`th of [`WEBHOOK_RETRY_DELAYS`] under the test scale, none past the last.
pub fn webhook_retry_delay(n: usize) -> Option<Duration> {
    WEBHOOK_RETRY_DELAYS.get(n).copied().map(scaled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scale_leaves_every_timer_as_it_is() {
        for base in [NODE_TTL, KEEPER_TICK, CLOSE_TIMEOUT, WHEEL_TICK] {
            assert_eq!(scale_by(base, 1.0), base);
        }
    }

    #[test]
    fn a_scale_shortens_timers_in_proportion_never_to_zero() {
        assert_eq!(scale_by(NODE_TTL, 0.1), Duration::from_secs(3));
        assert_eq!(scale_by(KEEPER_TICK, 0.1), Duration::from_millis(100));
        assert_eq!(scale_by(CLOSE_TIMEOUT, 0.5), Duration::from_millis(2500));
        assert_eq!(
            scale_by(Duration::from_millis(5), 0.001),
            Duration::from_millis(1)
        );
        // The forget time's invariant holds scaled too.
        let f = 0.01;
        assert!(scale_by(NODE_FORGET, f) > scale_by(NODE_TTL, f) + scale_by(CHANNEL_RETENTION, f));
    }

    #[test]
    fn a_scale_at_or_below_zero_or_above_one_is_refused() {
        for bad in [0.0, -0.5, 1.01, 10.0, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(check_test_time_scale(bad), Err(TimingError::OutOfRange(_))),
                "{bad}"
            );
        }
        assert_eq!(check_test_time_scale(1.0), Ok(1.0));
        assert_eq!(check_test_time_scale(0.05), Ok(0.05));
        assert!(
            check_test_time_scale(0.0)
                .unwrap_err()
                .to_string()
                .contains("above 0 and at most 1")
        );
    }

    #[test]
    fn a_scale_of_one_sets_nothing() {
        // The only call that touches the process-wide value in unit tests: other
        // tests of this binary see the constants.
        assert_eq!(set_test_time_scale(1.0), Ok(()));
        assert_eq!(test_time_scale(), 1.0);
        assert_eq!(node_ttl(), NODE_TTL);
        assert_eq!(webhook_retry_delay(0), Some(WEBHOOK_RETRY_DELAYS[0]));
        assert_eq!(webhook_retry_delay(WEBHOOK_RETRY_DELAYS.len()), None);
    }
}
