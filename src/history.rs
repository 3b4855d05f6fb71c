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
    pub skip: Option<crate::ids::SocketId>,
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
mod tests;
