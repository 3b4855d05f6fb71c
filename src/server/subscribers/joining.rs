//! What a subscriber that just joined must not be given: live copies of the
//! messages its history replay already gave it ([`Fresh`]), and a chat room's
//! join/leave events announced before its own join was ([`Joiner`]). Both are
//! kept per loop, only while they matter, never in the subscription itself (an
//! idle subscriber owns nothing for them). This module decides what passes the
//! filters; it must not write to connections.

use std::time::Instant;

use crate::hub::Body;

/// A returning subscriber that joined since the last inbox batch was taken:
/// history gave it every message up to `live_after`, so older deliveries still
/// waiting in the inbox (or in the batch being delivered) must not reach it a
/// second time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fresh {
    pub key: usize,
    pub channel: usize,
    pub live_after: u64,
    /// Kept until batch number `until` (the next one taken after the join) is
    /// delivered: everything published before the join is in it or before it.
    /// [`UNTIL_NEWER`] with a broker whose deliveries come later (Redis's
    /// listener): then until a message newer than `live_after` arrives, or `expires`.
    pub until: u64,
    pub expires: Instant,
}

/// A filter kept until the channel's next newer message (see [`Fresh::until`]).
pub(super) const UNTIL_NEWER: u64 = u64::MAX;

/// An announced member (a chat client) whose join's own announcement has not come
/// back yet through a broker that delivers later (Redis's listener). The channel
/// events it would get meanwhile were announced before its join was, with the
/// counts of before: it was welcomed with a newer count, and an older one after
/// it would be a lie (on another node, a join from just before its own, still on
/// its way when it subscribed). Its own announcement is the marker: every node
/// sees one channel's announcements in the order Redis took them, so what comes
/// after it is newer than its welcome.
#[derive(Debug, Clone, Copy)]
pub(super) struct Joiner {
    pub key: usize,
    pub channel: usize,
    /// Its announcement was lost (a Redis error, an overloaded loop): events reach
    /// it again from then on.
    pub expires: Instant,
}

/// Whether `body` still goes to a subscriber that history gave every message up
/// to `live_after` (if it is returning) and that waits for its own join's
/// announcement (`joining`).
pub(super) fn passes(body: &Body, live_after: Option<u64>, joining: bool) -> bool {
    match *body {
        // Seq 0 was never sequenced, so never replayed.
        Body::Data { seq, .. } => !live_after.is_some_and(|after| seq != 0 && seq <= after),
        Body::Event { .. } => !joining,
        _ => true,
    }
}

/// Whether `body` is newer than all that history gave a returning subscriber:
/// every live copy of what it gave came before it.
pub(super) fn newer_than(body: &Body, live_after: u64) -> bool {
    matches!(*body, Body::Data { seq, .. } if seq > live_after)
}

#[cfg(test)]
mod tests;
