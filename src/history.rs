//! A channel's recent messages, kept so a client that comes back can be given what
//! it missed: bounded by a count and an age, and compact.
//!
//! Payloads are stored back to back in one byte ring per channel, and each message
//! adds an 8-byte entry (its length and kind, and when it was kept), so a kept
//! 32-byte message costs about 40 bytes; seqs are not stored, since a channel's kept
//! messages are consecutive. Expired messages are dropped (and their memory given
//! back once the ring empties). This module owns no lock and does no I/O: the
//! broker holds a channel's history under the channel's own lock.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::DataKind;

/// The high bit of an entry's length marks a binary message.
const BINARY: u32 = 1 << 31;

/// How much history each channel keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most messages kept per channel; 0 keeps none.
    pub size: usize,
    /// Longest a message is kept (whole seconds; zero keeps none).
    pub ttl: Duration,
}

impl Limits {
    /// Whether anything is kept at all.
    pub fn enabled(&self) -> bool {
        self.size > 0 && self.ttl.as_secs() > 0
    }
}

/// Seconds since this process started counting, the clock history ages by.
pub fn now_secs() -> u32 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let elapsed = ORIGIN.get_or_init(Instant::now).elapsed().as_secs();
    u32::try_from(elapsed).unwrap_or(u32::MAX)
}

/// One kept message, as given back to a reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub seq: u64,
    pub payload: Bytes,
    pub kind: DataKind,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Payload length, with [`BINARY`] set for binary messages.
    len_kind: u32,
    /// When it was kept ([`now_secs`]).
    at: u32,
}

impl Entry {
    fn len(self) -> usize {
        (self.len_kind & !BINARY) as usize
    }

    fn kind(self) -> DataKind {
        if self.len_kind & BINARY != 0 {
            DataKind::Binary
        } else {
            DataKind::Text
        }
    }
}

/// The kept messages of one channel, oldest first.
#[derive(Debug, Default)]
pub struct History {
    bytes: VecDeque<u8>,
    entries: VecDeque<Entry>,
    /// The seq of `entries[0]`.
    first_seq: u64,
}

impl History {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The oldest seq still kept.
    pub fn oldest_seq(&self) -> Option<u64> {
        (!self.entries.is_empty()).then_some(self.first_seq)
    }

    /// Bytes this history holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// Keeps message `seq` (the channel's next), dropping the oldest beyond
    /// `limits.size` and any older than `limits.ttl`.
    pub fn push(&mut self, seq: u64, payload: &[u8], kind: DataKind, now: u32, limits: Limits) {
        if !limits.enabled() {
            self.clear();
            return;
        }
        // Larger than a length field can say: not kept (such a message is far
        // beyond any --max-message-size the server accepts).
        let Ok(len) = u32::try_from(payload.len()) else {
            return;
        };
        if len & BINARY != 0 {
            return;
        }
        if self.entries.is_empty() || self.first_seq + self.entries.len() as u64 != seq {
            // The first message, or seqs that do not follow on (the channel's
            // history started afresh): what was kept no longer lines up.
            self.clear();
            self.first_seq = seq;
        }
        let len_kind = match kind {
            DataKind::Text => len,
            DataKind::Binary => len | BINARY,
        };
        self.bytes.extend(payload);
        self.entries.push_back(Entry { len_kind, at: now });
        while self.entries.len() > limits.size {
            self.pop_front();
        }
        self.expire(now, limits.ttl);
    }

    /// Drops messages older than `ttl` at `now`; memory goes back once none is left.
    pub fn expire(&mut self, now: u32, ttl: Duration) {
        let ttl = u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX);
        while let Some(front) = self.entries.front()
            && now.saturating_sub(front.at) >= ttl
        {
            self.pop_front();
        }
        if self.entries.is_empty() {
            let next = self.first_seq;
            self.clear();
            self.first_seq = next;
        } else if self.bytes.capacity() > 4 * self.bytes.len().max(64) {
            self.bytes.shrink_to_fit();
            self.entries.shrink_to_fit();
        }
    }

    fn pop_front(&mut self) {
        if let Some(front) = self.entries.pop_front() {
            self.bytes.drain(..front.len());
            self.first_seq += 1;
        }
    }

    fn clear(&mut self) {
        *self = History::default();
    }

    /// Every kept message with a seq above `since`, oldest first (copied out).
    pub fn after(&self, since: u64) -> Vec<Stored> {
        let skip = since.saturating_add(1).saturating_sub(self.first_seq);
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        let mut offset: usize = self.entries.iter().take(skip).map(|e| e.len()).sum();
        let mut out = Vec::with_capacity(self.entries.len().saturating_sub(skip));
        for (i, entry) in self.entries.iter().enumerate().skip(skip) {
            let end = offset + entry.len();
            let payload: Vec<u8> = self.bytes.range(offset..end).copied().collect();
            out.push(Stored {
                seq: self.first_seq + i as u64,
                payload: Bytes::from(payload),
                kind: entry.kind(),
            });
            offset = end;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP_3: Limits = Limits {
        size: 3,
        ttl: Duration::from_secs(300),
    };

    fn seqs(history: &History, since: u64) -> Vec<u64> {
        history.after(since).iter().map(|m| m.seq).collect()
    }

    #[test]
    fn keeps_the_last_messages_in_order_with_their_kind() {
        let mut h = History::default();
        for seq in 1..=5 {
            h.push(seq, format!("m{seq}").as_bytes(), DataKind::Text, 0, KEEP_3);
        }
        h.push(6, &[0, 255], DataKind::Binary, 0, KEEP_3);
        assert_eq!(h.len(), 3);
        assert_eq!(h.oldest_seq(), Some(4));
        let kept = h.after(0);
        assert_eq!(kept[0].payload, Bytes::from_static(b"m4"));
        assert_eq!(kept[2].payload, Bytes::from_static(&[0, 255]));
        assert_eq!(kept[2].kind, DataKind::Binary);
        assert_eq!(kept[1].kind, DataKind::Text);
        assert_eq!(seqs(&h, 4), vec![5, 6]);
        assert_eq!(seqs(&h, 6), Vec::<u64>::new());
        assert_eq!(seqs(&h, 99), Vec::<u64>::new());
    }

    #[test]
    fn old_messages_expire_and_give_their_memory_back() {
        let mut h = History::default();
        let limits = Limits {
            size: 100,
            ttl: Duration::from_secs(10),
        };
        h.push(1, &[7; 1000], DataKind::Binary, 0, limits);
        h.push(2, b"b", DataKind::Text, 5, limits);
        h.expire(10, limits.ttl);
        assert_eq!(seqs(&h, 0), vec![2]);
        h.expire(15, limits.ttl);
        assert!(h.is_empty());
        assert_eq!(h.heap_bytes(), 0);
        // The next message follows on from the expired ones.
        h.push(3, b"c", DataKind::Text, 16, limits);
        assert_eq!(seqs(&h, 0), vec![3]);
    }

    #[test]
    fn a_gap_in_seqs_starts_the_history_afresh() {
        let mut h = History::default();
        h.push(1, b"a", DataKind::Text, 0, KEEP_3);
        h.push(2, b"b", DataKind::Text, 0, KEEP_3);
        h.push(1, b"again", DataKind::Text, 0, KEEP_3);
        assert_eq!(seqs(&h, 0), vec![1]);
        assert_eq!(h.after(0)[0].payload, Bytes::from_static(b"again"));
    }

    #[test]
    fn limits_of_zero_keep_nothing() {
        let mut h = History::default();
        let off = Limits {
            size: 0,
            ttl: Duration::from_secs(300),
        };
        h.push(1, b"a", DataKind::Text, 0, off);
        assert!(h.is_empty());
        let no_ttl = Limits {
            size: 10,
            ttl: Duration::ZERO,
        };
        h.push(1, b"a", DataKind::Text, 0, no_ttl);
        assert!(h.is_empty() && h.heap_bytes() == 0);
    }

    #[test]
    fn a_kept_message_costs_its_payload_and_an_entry() {
        assert_eq!(std::mem::size_of::<Entry>(), 8);
        let mut h = History::default();
        let limits = Limits {
            size: 100,
            ttl: Duration::from_secs(300),
        };
        for seq in 1..=100 {
            h.push(seq, &[b'x'; 32], DataKind::Text, 0, limits);
        }
        // 100 × (32 + 8) = 4,000 bytes of content; the rings may round up.
        assert!(h.heap_bytes() <= 2 * 4_000, "{}", h.heap_bytes());
    }
}
