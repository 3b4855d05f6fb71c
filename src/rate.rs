//! How fast one connection may send chat messages (`--chat-rate`, `--chat-burst`):
//! a token bucket per connection, kept as the one number GCRA needs (when the
//! bucket will be full again), and only for connections that chatted lately.
//!
//! A loop keeps one [`ChatLimiter`] for all its connections, keyed by client id,
//! so a connection that never chats costs nothing here, and one whose bucket
//! has filled up again is forgotten (a full bucket and no entry are the same).
//! Forgotten entries are swept when the table has doubled since the last sweep:
//! O(1) amortized per message. Pure logic on a clock it is given; it must not
//! know what a message is or how a refusal is said.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `--chat-rate`'s default: messages per second, sustained.
pub const DEFAULT_RATE: u32 = 20;
/// `--chat-burst`'s default: messages at once after a quiet spell.
pub const DEFAULT_BURST: u32 = 40;

/// The rate one connection may chat at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatRate {
    /// Messages per second, sustained; 0: unlimited.
    pub per_second: u32,
    /// Messages allowed back to back (at least 1).
    pub burst: u32,
}

impl Default for ChatRate {
    fn default() -> Self {
        ChatRate {
            per_second: DEFAULT_RATE,
            burst: DEFAULT_BURST,
        }
    }
}

impl ChatRate {
    fn interval_ns(self) -> u64 {
        1_000_000_000 / u64::from(self.per_second.max(1))
    }

    /// How far ahead of now a bucket's "full again" time may be and still allow
    /// one more message.
    fn tolerance_ns(self) -> u64 {
        self.interval_ns() * u64::from(self.burst.max(1) - 1)
    }
}

/// Nanoseconds on a monotonic clock (from its first reading in this process).
pub fn now_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let elapsed = ORIGIN.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

/// One loop's chat buckets.
#[derive(Debug, Default)]
pub struct ChatLimiter {
    rate: ChatRate,
    /// Client id → when its bucket is full again (see [`now_ns`]); only while
    /// that is in the future.
    full_at: HashMap<u32, u64>,
    /// Entries after the last sweep (the next sweep comes at twice that).
    swept_len: usize,
}

impl ChatLimiter {
    pub fn new(rate: ChatRate) -> Self {
        ChatLimiter {
            rate,
            full_at: HashMap::new(),
            swept_len: 0,
        }
    }

    pub fn rate(&self) -> ChatRate {
        self.rate
    }

    /// Whether `client` may send a chat message at `now` (ns, see [`now_ns`]);
    /// if so it is counted.
    pub fn allow(&mut self, client: u32, now: u64) -> bool {
        if self.rate.per_second == 0 {
            return true;
        }
        let full_at = self.full_at.get(&client).copied().unwrap_or(0).max(now);
        if full_at - now > self.rate.tolerance_ns() {
            return false;
        }
        self.full_at
            .insert(client, full_at + self.rate.interval_ns());
        if self.full_at.len() > (2 * self.swept_len).max(64) {
            self.full_at.retain(|_, &mut at| at > now);
            self.swept_len = self.full_at.len();
        }
        true
    }

    /// Connections it keeps an entry for (those that chatted lately).
    pub fn len(&self) -> usize {
        self.full_at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.full_at.is_empty()
    }

    /// How long a refused client waits before its next message may go.
    pub fn wait(&self, client: u32, now: u64) -> Duration {
        let full_at = self.full_at.get(&client).copied().unwrap_or(0);
        let ahead = full_at.saturating_sub(now);
        Duration::from_nanos(ahead.saturating_sub(self.rate.tolerance_ns()))
    }
}

/// Parses `--chat-rate`: `20` or `20/s` (messages per second); `0`: unlimited.
pub fn parse_rate(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let n = s.strip_suffix("/s").unwrap_or(s);
    n.trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a rate like 20 or 20/s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_burst_goes_then_the_sustained_rate() {
        let mut limiter = ChatLimiter::new(ChatRate {
            per_second: 10,
            burst: 3,
        });
        let t0 = 5 * SECOND;
        assert!((0..3).all(|_| limiter.allow(7, t0)));
        assert!(!limiter.allow(7, t0));
        // Another connection has its own bucket.
        assert!(limiter.allow(8, t0));
        assert_eq!(limiter.wait(7, t0), Duration::from_millis(100));
        assert!(!limiter.allow(7, t0 + SECOND / 10 - 1));
        assert!(limiter.allow(7, t0 + SECOND / 10));
        assert!(!limiter.allow(7, t0 + SECOND / 10));
        // Quiet for long enough, the whole burst is back.
        let later = t0 + 2 * SECOND;
        assert!((0..3).all(|_| limiter.allow(7, later)));
        assert!(!limiter.allow(7, later));
    }

    #[test]
    fn connections_that_stopped_chatting_are_forgotten() {
        let mut limiter = ChatLimiter::new(ChatRate {
            per_second: 100,
            burst: 1,
        });
        for client in 0..1000 {
            assert!(limiter.allow(client, 0));
        }
        // A second on, every bucket is full again: the table is swept as it grows.
        for client in 1000..1100 {
            assert!(limiter.allow(client, SECOND));
        }
        assert!(limiter.len() <= 200, "{}", limiter.len());
    }

    #[test]
    fn a_rate_of_zero_is_unlimited() {
        let mut limiter = ChatLimiter::new(ChatRate {
            per_second: 0,
            burst: 1,
        });
        assert!((0..10_000).all(|_| limiter.allow(1, 0)));
        assert!(limiter.is_empty());
    }

    #[test]
    fn rates_parse_with_or_without_a_unit() {
        assert_eq!(parse_rate("20"), Ok(20));
        assert_eq!(parse_rate("35/s"), Ok(35));
        assert_eq!(parse_rate("0"), Ok(0));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1").is_err());
    }
}
