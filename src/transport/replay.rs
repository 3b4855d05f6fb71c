//! A returning subscriber's replay made into frames a slice at a time: what a
//! stream transport (WebSocket, SSE) writes of history beyond its first
//! [`FEED_SLICE`] waits as the kept messages themselves (payloads shared with
//! history), not as frames, and is encoded only as the socket takes what came
//! before ([`crate::outbound::Feed`]). It owns the encoding's order and its
//! deflate counts; framing is the transport's, the socket the event loop's.

use std::sync::Arc;

use crate::broker::Stored;
use crate::outbound::{FEED_SLICE, Feed};
use crate::stats::{LoopCounters, TurnCounts};

/// What a transport made of a replay.
#[derive(Debug)]
pub enum Replayed {
    /// Wholly in the output; then this (`Close`: that was the whole answer).
    Written(super::After),
    /// Its head and first slice are in the output; this makes the rest.
    Fed(Box<dyn Feed>),
}

/// The messages of a replay still to be encoded, and how.
pub struct ReplayFeed<E> {
    messages: std::vec::IntoIter<Stored>,
    /// Payload bytes of `messages`.
    left: usize,
    encode: E,
    /// Where the deflate counts of slices made after the first go.
    counters: Option<Arc<LoopCounters>>,
}

impl<E> std::fmt::Debug for ReplayFeed<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayFeed")
            .field("messages", &self.messages.len())
            .field("left", &self.left)
            .finish()
    }
}

impl<E> ReplayFeed<E>
where
    E: FnMut(&mut Vec<u8>, &Stored, &mut TurnCounts) + Send + 'static,
{
    /// `encode` appends one message's frame, counting what it compressed.
    pub fn new(messages: Vec<Stored>, counters: Option<Arc<LoopCounters>>, encode: E) -> Self {
        let left = messages.iter().map(|m| m.payload.len()).sum();
        ReplayFeed {
            messages: messages.into_iter(),
            left,
            encode,
            counters,
        }
    }

    /// Writes the first slice into `out`, counted in this turn's `counts`:
    /// [`Replayed::Written`] if that was all of it.
    pub fn start(mut self, out: &mut Vec<u8>, counts: &mut TurnCounts) -> Replayed {
        if self.fill_counted(out, FEED_SLICE, counts) {
            Replayed::Fed(Box::new(self))
        } else {
            Replayed::Written(super::After::Nothing)
        }
    }

    fn fill_counted(&mut self, out: &mut Vec<u8>, budget: usize, counts: &mut TurnCounts) -> bool {
        let start = out.len();
        while out.len() - start < budget {
            let Some(message) = self.messages.next() else {
                break;
            };
            self.left -= message.payload.len();
            (self.encode)(out, &message, counts);
        }
        self.messages.len() > 0
    }
}

impl<E> Feed for ReplayFeed<E>
where
    E: FnMut(&mut Vec<u8>, &Stored, &mut TurnCounts) + Send + 'static,
{
    fn fill(&mut self, out: &mut Vec<u8>, budget: usize) -> bool {
        let mut counts = TurnCounts::default();
        let more = self.fill_counted(out, budget, &mut counts);
        if let Some(counters) = &self.counters {
            LoopCounters::add(&counters.deflate_plain, counts.deflate_plain);
            LoopCounters::add(&counters.deflate_wire, counts.deflate_wire);
        }
        more
    }

    fn remaining(&self) -> usize {
        self.left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::DataKind;
    use bytes::Bytes;

    fn stored(seq: u64, size: usize) -> Stored {
        Stored {
            seq,
            payload: Bytes::from(vec![b'x'; size]),
            kind: DataKind::Text,
            from: None,
            event: None,
            skip: None,
        }
    }

    #[test]
    fn a_short_replay_is_written_whole_and_a_long_one_a_slice_at_a_time() {
        let encode = |out: &mut Vec<u8>, m: &Stored, _: &mut TurnCounts| {
            out.extend_from_slice(&m.payload);
        };
        let mut out = Vec::new();
        let short = ReplayFeed::new(vec![stored(1, 10), stored(2, 10)], None, encode);
        let done = short.start(&mut out, &mut TurnCounts::default());
        assert!(matches!(
            done,
            Replayed::Written(super::super::After::Nothing)
        ));
        assert_eq!(out.len(), 20);

        let size = FEED_SLICE / 4;
        let messages = (1..=10).map(|seq| stored(seq, size)).collect();
        let mut out = Vec::new();
        let long = ReplayFeed::new(messages, None, encode);
        let Replayed::Fed(mut feed) = long.start(&mut out, &mut TurnCounts::default()) else {
            panic!("ten slices' quarters are more than one slice");
        };
        assert_eq!(out.len(), 4 * size);
        assert_eq!(feed.remaining(), 6 * size);
        let mut rest = Vec::new();
        assert!(feed.fill(&mut rest, FEED_SLICE));
        assert!(!feed.fill(&mut rest, FEED_SLICE));
        assert_eq!((rest.len(), feed.remaining()), (6 * size, 0));
    }
}
