//! Idempotency keys: a publish that carries one (`Idempotency-Key` on the HTTP
//! API, `"idempotency_key"` in a Pusher API event) is published once per channel
//! while its key is remembered; a retry gets the first publish's seq back and
//! subscribers get the message once. This module owns what a key may be, how
//! long and how many are remembered, and the memory broker's record of them;
//! the Redis broker remembers them in Redis (`publish.lua`), for every node. It
//! must not publish.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::timing::IDEMPOTENCY_REMEMBERED_FOR;

/// Most keys one channel remembers at once in the memory broker; past it the
/// oldest is forgotten first.
pub const KEYS_PER_CHANNEL: usize = 10_000;

/// Longest key taken, in bytes.
pub const MAX_KEY_LEN: usize = 128;

/// What a publish with a key did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub seq: u64,
    /// The key was seen before: nothing was published now, `seq` is the first
    /// publish's.
    pub replayed: bool,
}

/// Why a key is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("an idempotency key is 1 to {MAX_KEY_LEN} bytes, not 0")]
    Empty,
    #[error("an idempotency key is 1 to {MAX_KEY_LEN} bytes, not {0}")]
    TooLong(usize),
    #[error("an idempotency key holds visible ASCII characters only (! to ~), not byte {0:#04x}")]
    BadByte(u8),
}

/// The key, if it is 1 to [`MAX_KEY_LEN`] visible ASCII characters (a UUID, a
/// hash, a business id).
pub fn validate_key(key: &[u8]) -> Result<&str, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong(key.len()));
    }
    if let Some(&bad) = key.iter().find(|b| !b.is_ascii_graphic()) {
        return Err(KeyError::BadByte(bad));
    }
    // Visible ASCII is UTF-8.
    std::str::from_utf8(key).map_err(|_| KeyError::BadByte(0))
}

/// One channel's remembered keys in the memory broker, oldest first.
#[derive(Debug, Default)]
pub struct Remembered {
    seqs: HashMap<Box<str>, u64>,
    order: VecDeque<(Instant, Box<str>)>,
}

impl Remembered {
    /// The seq the key's first publish got, if the key is still remembered.
    pub fn seq_of(&mut self, key: &str, now: Instant) -> Option<u64> {
        self.forget_old(now);
        self.seqs.get(key).copied()
    }

    /// Remembers `key` for a publish that got `seq`.
    pub fn remember(&mut self, key: &str, seq: u64, now: Instant) {
        self.forget_old(now);
        while self.order.len() >= KEYS_PER_CHANNEL {
            self.forget_oldest();
        }
        let key: Box<str> = key.into();
        self.seqs.insert(key.clone(), seq);
        self.order.push_back((now, key));
    }

    /// Whether nothing is remembered any more (the channel may be forgotten).
    pub fn is_empty(&mut self, now: Instant) -> bool {
        self.forget_old(now);
        self.order.is_empty()
    }

    fn forget_old(&mut self, now: Instant) {
        while self
            .order
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) >= IDEMPOTENCY_REMEMBERED_FOR)
        {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((_, key)) = self.order.pop_front() {
            self.seqs.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_of_bounded_length() {
        assert_eq!(validate_key(b"order-17:created"), Ok("order-17:created"));
        assert_eq!(validate_key(b""), Err(KeyError::Empty));
        assert_eq!(validate_key(&[b'k'; 129]), Err(KeyError::TooLong(129)));
        assert!(validate_key(&[b'k'; 128]).is_ok());
        assert_eq!(validate_key(b"a b"), Err(KeyError::BadByte(b' ')));
        assert_eq!(validate_key("é".as_bytes()), Err(KeyError::BadByte(0xc3)));
    }

    #[test]
    fn a_key_is_remembered_for_its_time_and_then_forgotten() {
        let mut r = Remembered::default();
        let t0 = Instant::now();
        r.remember("k", 7, t0);
        assert_eq!(
            r.seq_of("k", t0 + std::time::Duration::from_secs(299)),
            Some(7)
        );
        assert_eq!(r.seq_of("other", t0), None);
        assert_eq!(r.seq_of("k", t0 + IDEMPOTENCY_REMEMBERED_FOR), None);
        assert!(r.is_empty(t0 + IDEMPOTENCY_REMEMBERED_FOR));
    }

    #[test]
    fn past_the_bound_the_oldest_key_goes_first() {
        let mut r = Remembered::default();
        let t0 = Instant::now();
        for i in 0..=KEYS_PER_CHANNEL as u64 {
            r.remember(&format!("k{i}"), i + 1, t0);
        }
        assert_eq!(r.seq_of("k0", t0), None);
        assert_eq!(r.seq_of("k1", t0), Some(2));
        assert_eq!(r.order.len(), KEYS_PER_CHANNEL);
        assert_eq!(r.seqs.len(), KEYS_PER_CHANNEL);
    }
}
