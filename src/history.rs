//! A channel's recent messages, kept so a client that comes back can be given what
//! it missed: bounded by a count and an age, and compact.
//!
//! Payloads are stored back to back in one byte ring per channel, and each message
//! adds an 8-byte entry (its length, kind and whether it has a sender, and when it
//! was kept), so a kept 32-byte message costs about 40 bytes; seqs are not stored,
//! since a channel's kept messages are consecutive. A chat message's sender name
//! (`c123`) goes into the ring just ahead of its payload, after one length byte, so
//! it costs its length plus one; a message without a sender (every push channel's)
//! costs nothing more. Expired messages are dropped (and their memory given
//! back once the ring empties). A payload of [`SHARE_FROM`] bytes or more is not
//! copied into the ring: the entry is marked and the publish's own buffer is kept
//! beside it, so every reader given it back (a replay) shares that one buffer
//! instead of copying it out per request. This module owns no lock and does no
//! I/O: the broker holds a channel's history under the channel's own lock.
//!
//! Every history of a process may also count against one [`Budget`]
//! (`--history-max-bytes`), so that no number of channels can hold more than it
//! between them. A push that finds the process over its budget drops its own
//! channel's oldest messages until the process is back under it, down to none
//! (the message just pushed too): a channel that grows pays for its growth at
//! once, in O(1) amortized, and the budget is never exceeded by more than the
//! push under way. Room is made again by the broker's housekeeping, which cuts
//! the largest channels down to one level ([`trim_level`]). A dropped message is
//! dropped as an expired one is: the channel's oldest seq moves on, so a returning
//! reader is told exactly what is gone.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::DataKind;

/// The high bit of an entry's length marks a binary message.
const BINARY: u32 = 1 << 31;
/// The next bit marks a message kept with its sender's name (see [`Entry`]).
const FROM: u32 = 1 << 30;
/// The next marks a message kept with an event name (a Pusher event's), after the
/// sender's name if it has one.
const EVENT: u32 = 1 << 29;
/// The next marks a payload kept by reference, in [`History`]'s `shared`, not
/// in the ring.
const SHARED: u32 = 1 << 28;
/// Every flag an entry's length carries.
const FLAGS: u32 = BINARY | FROM | EVENT | SHARED;
/// Payloads this long or longer are kept by reference (shared with the
/// publish and with every replay), shorter ones copied into the ring, where
/// they cost less than a shared buffer's bookkeeping.
pub const SHARE_FROM: usize = 1024;
/// Longest sender name kept (its length is one byte); the server's are `c<id>`,
/// at most 21 bytes. Event names have the same bound.
pub const MAX_FROM: usize = u8::MAX as usize;

/// The names a message may carry besides its payload: who sent it (a chat
/// client) and what event it is (a Pusher event's name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tags<'a> {
    pub from: Option<&'a str>,
    pub event: Option<&'a str>,
}

/// `--history-max-bytes`'s default: 256 MiB.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// What one entry costs besides its ring bytes, as counted against a [`Budget`].
const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();

/// The history bytes one process may hold across all its channels
/// (`--history-max-bytes`): payloads, names and entries as stored, not the
/// rings' rounding up (up to twice that on the heap while a channel grows).
#[derive(Debug)]
pub struct Budget {
    max: usize,
    held: AtomicUsize,
}

impl Budget {
    pub fn new(max: usize) -> Self {
        Budget {
            max,
            held: AtomicUsize::new(0),
        }
    }

    /// The most it allows.
    pub fn max(&self) -> usize {
        self.max
    }

    /// What the histories counting against it hold now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn is_over(&self) -> bool {
        self.held() > self.max
    }

    fn add(&self, n: usize) {
        self.held.fetch_add(n, Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The level to cut channels holding `sizes` bytes down to so that together they
/// hold at most `target`: the largest `L` with `sum(min(size, L)) <= target`
/// (every channel below it keeps all it has). None when they already fit.
pub fn trim_level(sizes: &mut [usize], target: usize) -> Option<usize> {
    let total: usize = sizes.iter().sum();
    if total <= target {
        return None;
    }
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    // With the k largest cut to L: k·L + the rest's sum <= target, and L no lower
    // than the next largest (else more than k are cut).
    let mut rest = total;
    for k in 1..=sizes.len() {
        rest -= sizes[k - 1];
        let next = sizes.get(k).copied().unwrap_or(0);
        if rest <= target {
            let level = (target - rest) / k;
            if level >= next {
                return Some(level);
            }
        }
    }
    Some(0)
}

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

/// A name with its length byte, if it fits one.
fn with_len(name: &str) -> Option<(u8, &str)> {
    Some((u8::try_from(name.len()).ok()?, name))
}

/// One kept message, as given back to a reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub seq: u64,
    pub payload: Bytes,
    pub kind: DataKind,
    /// The chat client that sent it.
    pub from: Option<Box<str>>,
    /// Its event name (a Pusher event's).
    pub event: Option<Box<str>>,
    /// The connection it leaves out (kept by the Redis broker, which gives kept
    /// messages to live subscribers after a reconnect; never here).
    pub skip: Option<crate::hub::SocketId>,
}

/// One kept message's place in the byte ring: with [`FROM`] set, a length byte
/// and the sender's name come first, with [`EVENT`] a length byte and the event
/// name next, then the payload.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Payload length, with [`BINARY`] set for binary messages and [`FROM`] for
    /// messages kept with a sender.
    len_kind: u32,
    /// When it was kept ([`now_secs`]).
    at: u32,
}

impl Entry {
    /// The payload's length.
    fn len(self) -> usize {
        (self.len_kind & !FLAGS) as usize
    }

    fn is_shared(self) -> bool {
        self.len_kind & SHARED != 0
    }

    /// The payload's bytes in the ring: none when it is kept by reference.
    fn ring_len(self) -> usize {
        if self.is_shared() { 0 } else { self.len() }
    }

    fn has_from(self) -> bool {
        self.len_kind & FROM != 0
    }

    fn has_event(self) -> bool {
        self.len_kind & EVENT != 0
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
    /// The payloads kept by reference, one per [`SHARED`] entry, in order.
    shared: VecDeque<Bytes>,
    /// Their bytes.
    shared_bytes: usize,
    /// The seq of `entries[0]`.
    first_seq: u64,
    /// The process's budget this history counts against, if any: what it holds
    /// is added there as it comes and taken off as it goes (and when dropped).
    budget: Option<Arc<Budget>>,
}

impl Drop for History {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.sub(self.held_bytes());
        }
    }
}

impl History {
    /// An empty history that counts against `budget`.
    pub fn with_budget(budget: Arc<Budget>) -> Self {
        History {
            bytes: VecDeque::new(),
            entries: VecDeque::new(),
            shared: VecDeque::new(),
            shared_bytes: 0,
            first_seq: 0,
            budget: Some(budget),
        }
    }

    /// What it holds as counted against its budget: ring bytes, payloads kept
    /// by reference, and entries.
    pub fn held_bytes(&self) -> usize {
        self.bytes.len() + self.shared_bytes + self.entries.len() * ENTRY_BYTES
    }

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
        self.bytes.capacity()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.shared.capacity() * std::mem::size_of::<Bytes>()
            + self.shared_bytes
    }

    /// Keeps message `seq` (the channel's next) with its sender and event name,
    /// if it has them, dropping the oldest beyond `limits.size` and any older than `limits.ttl`.
    pub fn push(
        &mut self,
        seq: u64,
        payload: &[u8],
        kind: DataKind,
        tags: Tags<'_>,
        now: u32,
        limits: Limits,
    ) {
        self.keep(seq, payload, None, kind, tags, now, limits);
    }

    /// As [`History::push`], where `payload` is the publish's own buffer: a
    /// long one is kept by reference, not copied.
    pub fn push_bytes(
        &mut self,
        seq: u64,
        payload: &Bytes,
        kind: DataKind,
        tags: Tags<'_>,
        now: u32,
        limits: Limits,
    ) {
        self.keep(seq, payload, Some(payload), kind, tags, now, limits);
    }

    #[allow(clippy::too_many_arguments)]
    fn keep(
        &mut self,
        seq: u64,
        payload: &[u8],
        buffer: Option<&Bytes>,
        kind: DataKind,
        tags: Tags<'_>,
        now: u32,
        limits: Limits,
    ) {
        if !limits.enabled() {
            self.clear();
            return;
        }
        // Larger than a length field can say (1 GiB and up): not kept (such a
        // message is far beyond any sensible --max-message-size).
        let Ok(len) = u32::try_from(payload.len()) else {
            return;
        };
        if len & FLAGS != 0 {
            return;
        }
        // A name longer than its length byte can say is not kept (the message is).
        let from = tags.from.and_then(with_len);
        let event = tags.event.and_then(with_len);
        if self.entries.is_empty() || self.first_seq + self.entries.len() as u64 != seq {
            // The first message, or seqs that do not follow on (the channel's
            // history started afresh): what was kept no longer lines up.
            self.clear();
            self.first_seq = seq;
        }
        let mut len_kind = match kind {
            DataKind::Text => len,
            DataKind::Binary => len | BINARY,
        };
        let before = self.bytes.len();
        if let Some((name_len, name)) = from {
            len_kind |= FROM;
            self.bytes.push_back(name_len);
            self.bytes.extend(name.as_bytes());
        }
        if let Some((name_len, name)) = event {
            len_kind |= EVENT;
            self.bytes.push_back(name_len);
            self.bytes.extend(name.as_bytes());
        }
        let mut shared = 0;
        if payload.len() >= SHARE_FROM {
            len_kind |= SHARED;
            let kept = buffer.map_or_else(|| Bytes::copy_from_slice(payload), Bytes::clone);
            shared = kept.len();
            self.shared_bytes += shared;
            self.shared.push_back(kept);
        } else {
            self.bytes.extend(payload);
        }
        self.entries.push_back(Entry { len_kind, at: now });
        if let Some(budget) = &self.budget {
            budget.add(self.bytes.len() - before + shared + ENTRY_BYTES);
        }
        while self.entries.len() > limits.size {
            self.pop_front();
        }
        self.expire(now, limits.ttl);
        // Over the process's budget: this channel pays, oldest first (this
        // message last).
        if self.budget.as_deref().is_some_and(Budget::is_over) {
            while !self.entries.is_empty() && self.budget.as_deref().is_some_and(Budget::is_over) {
                self.pop_front();
            }
            if self.entries.is_empty() {
                self.give_back();
            }
        }
    }

    /// Drops the oldest messages until at most `level` bytes are held (see
    /// [`History::held_bytes`]); a gap they leave is told as expiry's is.
    pub fn trim_to(&mut self, level: usize) {
        while !self.entries.is_empty() && self.held_bytes() > level {
            self.pop_front();
        }
        if self.entries.is_empty() {
            self.give_back();
        }
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
            self.give_back();
        } else if self.bytes.capacity() > 4 * self.bytes.len().max(64) {
            self.bytes.shrink_to_fit();
            self.entries.shrink_to_fit();
            self.shared.shrink_to_fit();
        }
    }

    /// Once nothing is kept: the rings' memory goes back, the next seq stays.
    fn give_back(&mut self) {
        let next = self.first_seq;
        self.clear();
        self.first_seq = next;
    }

    fn pop_front(&mut self) {
        if let Some(front) = self.entries.pop_front() {
            let span = self.span(front, 0);
            self.bytes.drain(..span);
            let mut shared = 0;
            if front.is_shared()
                && let Some(payload) = self.shared.pop_front()
            {
                shared = payload.len();
                self.shared_bytes -= shared;
            }
            self.first_seq += 1;
            if let Some(budget) = &self.budget {
                budget.sub(span + shared + ENTRY_BYTES);
            }
        }
    }

    /// The name at `offset` (after its length byte) if `present`, and where what
    /// follows it starts.
    fn name_at(&self, present: bool, offset: usize) -> (Option<Box<str>>, usize) {
        if !present {
            return (None, offset);
        }
        let len = self.bytes.get(offset).map_or(0, |&n| usize::from(n));
        let start = offset + 1;
        let name: Vec<u8> = self.bytes.range(start..start + len).copied().collect();
        // Kept from a str: always UTF-8.
        let name = String::from_utf8(name).ok().map(String::into_boxed_str);
        (name, start + len)
    }

    /// How many ring bytes `entry`, starting at `offset`, takes up: its names
    /// (each with its length byte), if any, and its payload unless it is kept
    /// by reference.
    fn span(&self, entry: Entry, offset: usize) -> usize {
        let mut at = offset;
        for present in [entry.has_from(), entry.has_event()] {
            if present {
                at += 1 + self.bytes.get(at).map_or(0, |&n| usize::from(n));
            }
        }
        at - offset + entry.ring_len()
    }

    fn clear(&mut self) {
        if let Some(budget) = &self.budget {
            budget.sub(self.held_bytes());
        }
        self.bytes = VecDeque::new();
        self.entries = VecDeque::new();
        self.shared = VecDeque::new();
        self.shared_bytes = 0;
        self.first_seq = 0;
    }

    /// Every kept message with a seq above `since`, oldest first: short
    /// payloads copied out, long ones shared.
    pub fn after(&self, since: u64) -> Vec<Stored> {
        let skip = since.saturating_add(1).saturating_sub(self.first_seq);
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        let mut offset = 0;
        let mut shared = 0;
        for &entry in self.entries.iter().take(skip) {
            offset += self.span(entry, offset);
            shared += usize::from(entry.is_shared());
        }
        let mut out = Vec::with_capacity(self.entries.len().saturating_sub(skip));
        for (i, &entry) in self.entries.iter().enumerate().skip(skip) {
            let (from, at) = self.name_at(entry.has_from(), offset);
            let (event, at) = self.name_at(entry.has_event(), at);
            offset = at;
            let payload = if entry.is_shared() {
                shared += 1;
                self.shared.get(shared - 1).cloned().unwrap_or_default()
            } else {
                let end = offset + entry.len();
                let copied: Vec<u8> = self.bytes.range(offset..end).copied().collect();
                offset = end;
                Bytes::from(copied)
            };
            out.push(Stored {
                seq: self.first_seq + i as u64,
                payload,
                kind: entry.kind(),
                from,
                event,
                skip: None,
            });
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
            h.push(
                seq,
                format!("m{seq}").as_bytes(),
                DataKind::Text,
                Tags::default(),
                0,
                KEEP_3,
            );
        }
        h.push(6, &[0, 255], DataKind::Binary, Tags::default(), 0, KEEP_3);
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
        h.push(1, &[7; 1000], DataKind::Binary, Tags::default(), 0, limits);
        h.push(2, b"b", DataKind::Text, Tags::default(), 5, limits);
        h.expire(10, limits.ttl);
        assert_eq!(seqs(&h, 0), vec![2]);
        h.expire(15, limits.ttl);
        assert!(h.is_empty());
        assert_eq!(h.heap_bytes(), 0);
        // The next message follows on from the expired ones.
        h.push(3, b"c", DataKind::Text, Tags::default(), 16, limits);
        assert_eq!(seqs(&h, 0), vec![3]);
    }

    #[test]
    fn a_gap_in_seqs_starts_the_history_afresh() {
        let mut h = History::default();
        h.push(1, b"a", DataKind::Text, Tags::default(), 0, KEEP_3);
        h.push(2, b"b", DataKind::Text, Tags::default(), 0, KEEP_3);
        h.push(1, b"again", DataKind::Text, Tags::default(), 0, KEEP_3);
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
        h.push(1, b"a", DataKind::Text, Tags::default(), 0, off);
        assert!(h.is_empty());
        let no_ttl = Limits {
            size: 10,
            ttl: Duration::ZERO,
        };
        h.push(1, b"a", DataKind::Text, Tags::default(), 0, no_ttl);
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
            h.push(seq, &[b'x'; 32], DataKind::Text, Tags::default(), 0, limits);
        }
        // A message without a sender keeps its payload alone in the byte ring.
        assert_eq!(h.bytes.len(), 100 * 32);
        // 100 × (32 + 8) = 4,000 bytes of content; the rings may round up.
        assert!(h.heap_bytes() <= 2 * 4_000, "{}", h.heap_bytes());

        // A chat message adds its sender's name and one length byte.
        let mut chat = History::default();
        for seq in 1..=100 {
            chat.push(
                seq,
                &[b'x'; 32],
                DataKind::Text,
                Tags {
                    from: Some("c123"),
                    event: None,
                },
                0,
                limits,
            );
        }
        assert_eq!(chat.bytes.len(), 100 * (32 + 1 + 4));
        assert!(chat.heap_bytes() <= 2 * 4_500, "{}", chat.heap_bytes());
    }

    #[test]
    fn a_chat_message_keeps_its_sender() {
        let mut h = History::default();
        h.push(1, b"hi", DataKind::Text, from("c7"), 0, KEEP_3);
        h.push(2, b"news", DataKind::Text, Tags::default(), 0, KEEP_3);
        h.push(3, &[0, 255], DataKind::Binary, from("c12345"), 0, KEEP_3);
        h.push(4, b"", DataKind::Text, from("c8"), 0, KEEP_3);
        // seq 1 (with a sender) fell out: the ring lines up on the next one.
        let kept = h.after(0);
        let got: Vec<(u64, &[u8], DataKind, Option<&str>)> = kept
            .iter()
            .map(|m| (m.seq, &m.payload[..], m.kind, m.from.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, &b"news"[..], DataKind::Text, None),
                (3, &[0u8, 255][..], DataKind::Binary, Some("c12345")),
                (4, &b""[..], DataKind::Text, Some("c8")),
            ]
        );
        // Skipping a message with a sender finds the next one's bytes.
        let after_3 = h.after(3);
        assert_eq!(
            (after_3[0].seq, after_3[0].from.as_deref()),
            (4, Some("c8"))
        );
        h.push(5, b"x", DataKind::Text, Tags::default(), 0, KEEP_3);
        h.push(6, b"y", DataKind::Text, Tags::default(), 0, KEEP_3);
        assert_eq!(h.bytes.len(), 1 + 2 + 2);
        h.push(7, b"z", DataKind::Text, Tags::default(), 0, KEEP_3);
        assert_eq!(h.bytes.len(), 3);
    }

    fn from(name: &str) -> Tags<'_> {
        Tags {
            from: Some(name),
            event: None,
        }
    }

    #[test]
    fn event_names_are_kept_beside_senders_and_skipped_over_like_them() {
        let mut h = History::default();
        let both = Tags {
            from: Some("c1"),
            event: Some("price"),
        };
        let event = Tags {
            from: None,
            event: Some("client-typing"),
        };
        h.push(1, b"a", DataKind::Text, both, 0, KEEP_3);
        h.push(2, b"b", DataKind::Text, event, 0, KEEP_3);
        h.push(3, b"c", DataKind::Text, Tags::default(), 0, KEEP_3);
        let kept = h.after(0);
        let got: Vec<_> = kept
            .iter()
            .map(|m| (m.seq, &m.payload[..], m.from.as_deref(), m.event.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, &b"a"[..], Some("c1"), Some("price")),
                (2, &b"b"[..], None, Some("client-typing")),
                (3, &b"c"[..], None, None),
            ]
        );
        assert_eq!(h.after(1)[0].event.as_deref(), Some("client-typing"));
        h.push(4, b"d", DataKind::Text, Tags::default(), 0, KEEP_3);
        assert_eq!(h.bytes.len(), 1 + 13 + 1 + 1 + 1);
    }

    #[test]
    fn a_name_too_long_for_its_length_byte_is_not_kept_but_its_message_is() {
        let mut h = History::default();
        let long = "n".repeat(MAX_FROM + 1);
        let longest = "m".repeat(MAX_FROM);
        h.push(1, b"a", DataKind::Text, from(&long), 0, KEEP_3);
        h.push(2, b"b", DataKind::Text, from(&longest), 0, KEEP_3);
        let kept = h.after(0);
        assert_eq!(
            (kept[0].payload.as_ref(), kept[0].from.as_deref()),
            (&b"a"[..], None)
        );
        assert_eq!(kept[1].from.as_deref(), Some(longest.as_str()));
        assert_eq!(kept[1].payload, Bytes::from_static(b"b"));
    }

    fn push_n(h: &mut History, seqs: std::ops::RangeInclusive<u64>, size: usize) {
        let limits = Limits {
            size: 100,
            ttl: Duration::from_secs(300),
        };
        for seq in seqs {
            h.push(
                seq,
                &vec![b'x'; size],
                DataKind::Text,
                Tags::default(),
                0,
                limits,
            );
        }
    }

    #[test]
    fn a_push_over_the_budget_drops_its_own_channels_oldest() {
        let budget = Arc::new(Budget::new(1_000));
        let mut other = History::with_budget(Arc::clone(&budget));
        push_n(&mut other, 1..=1, 392);
        let mut h = History::with_budget(Arc::clone(&budget));
        push_n(&mut h, 1..=1, 392);
        assert_eq!(budget.held(), 800);
        // 1,200 held: over. The pushing channel drops its own oldest.
        push_n(&mut h, 2..=2, 392);
        assert_eq!((h.len(), h.oldest_seq()), (1, Some(2)));
        assert_eq!((other.len(), budget.held()), (1, 800));
        // A message that cannot fit is not kept either; the next seq follows on.
        push_n(&mut h, 3..=3, 2_000);
        assert_eq!((h.len(), h.oldest_seq()), (0, None));
        assert_eq!(budget.held(), 400);
        assert_eq!(h.heap_bytes(), 0);
        push_n(&mut h, 4..=4, 92);
        assert_eq!(seqs(&h, 0), vec![4]);
        assert_eq!(budget.held(), 500);
    }

    #[test]
    fn a_long_payload_is_kept_by_reference_and_shared_by_every_reader() {
        let budget = Arc::new(Budget::new(usize::MAX));
        let mut h = History::with_budget(Arc::clone(&budget));
        let long = Bytes::from(vec![7u8; SHARE_FROM]);
        h.push(1, b"short", DataKind::Text, from("c1"), 0, KEEP_3);
        h.push_bytes(2, &long, DataKind::Binary, from("c2"), 0, KEEP_3);
        h.push(
            3,
            &[9u8; 2 * SHARE_FROM],
            DataKind::Text,
            Tags::default(),
            0,
            KEEP_3,
        );
        assert_eq!(budget.held(), h.held_bytes());
        assert_eq!(
            h.held_bytes(),
            (3 + 5 + 8) + (3 + SHARE_FROM + 8) + (2 * SHARE_FROM + 8)
        );
        let (first, second) = (h.after(0), h.after(1));
        assert_eq!(
            first[1].payload.as_ptr(),
            long.as_ptr(),
            "the publish's buffer"
        );
        assert_eq!(second[0].payload.as_ptr(), long.as_ptr());
        assert_eq!(first[2].payload.as_ptr(), second[1].payload.as_ptr());
        assert_eq!(first[0].payload, &b"short"[..]);
        assert_eq!(first[1].from.as_deref(), Some("c2"));
        assert_eq!(first[1].kind, DataKind::Binary);
        assert_eq!(first[2].payload.len(), 2 * SHARE_FROM);
        // The oldest go, shared or not, in order; what follows still lines up.
        h.push(4, b"tail", DataKind::Text, Tags::default(), 0, KEEP_3);
        h.push(5, b"end", DataKind::Text, Tags::default(), 0, KEEP_3);
        assert_eq!(seqs(&h, 0), vec![3, 4, 5]);
        assert_eq!(h.after(3)[0].payload, &b"tail"[..]);
        assert_eq!(budget.held(), (2 * SHARE_FROM + 8) + (4 + 8) + (3 + 8));
        drop(h);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn what_a_history_holds_goes_back_to_its_budget() {
        let budget = Arc::new(Budget::new(usize::MAX));
        let limits = Limits {
            size: 2,
            ttl: Duration::from_secs(10),
        };
        let mut h = History::with_budget(Arc::clone(&budget));
        h.push(1, b"abc", DataKind::Text, from("c1"), 0, limits);
        h.push(2, b"de", DataKind::Text, Tags::default(), 5, limits);
        assert_eq!(budget.held(), h.held_bytes());
        assert_eq!(budget.held(), (3 + 3 + 8) + (2 + 8));
        h.push(3, b"f", DataKind::Binary, Tags::default(), 5, limits);
        assert_eq!(budget.held(), h.held_bytes());
        // A gap in seqs starts afresh.
        h.push(9, b"g", DataKind::Text, Tags::default(), 5, limits);
        assert_eq!(budget.held(), 9);
        h.expire(20, limits.ttl);
        assert_eq!(budget.held(), 0);
        h.push(10, b"hi", DataKind::Text, Tags::default(), 20, limits);
        h.trim_to(0);
        assert_eq!((budget.held(), h.oldest_seq()), (0, None));
        h.push(11, b"jk", DataKind::Text, Tags::default(), 20, limits);
        assert_eq!(seqs(&h, 0), vec![11]);
        drop(h);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn trimming_to_a_level_tells_the_gap_as_expiry_does() {
        let mut h = History::default();
        push_n(&mut h, 1..=5, 92);
        h.trim_to(250);
        assert_eq!((h.len(), h.oldest_seq()), (2, Some(4)));
        assert_eq!(seqs(&h, 0), vec![4, 5]);
    }

    #[test]
    fn the_trim_level_cuts_the_largest_first() {
        assert_eq!(trim_level(&mut [10, 20], 30), None);
        // 50 + 30 + 10 into 60: the two largest cut to 25.
        assert_eq!(trim_level(&mut [10, 50, 30], 60), Some(25));
        // Into 80: only the largest, to 40.
        assert_eq!(trim_level(&mut [10, 50, 30], 80), Some(40));
        assert_eq!(trim_level(&mut [10, 50, 30], 0), Some(0));
        assert_eq!(trim_level(&mut [7, 7, 7], 20), Some(6));
        let mut sizes = vec![1_000, 3, 400, 400, 2];
        let level = trim_level(&mut sizes, 500).unwrap();
        let kept: usize = sizes.iter().map(|&s| s.min(level)).sum();
        assert!(kept <= 500 && kept + 5 > 500, "{level} keeps {kept}");
    }
}
