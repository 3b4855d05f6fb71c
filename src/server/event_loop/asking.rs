//! Requests waiting on the broker (a publish handed to Redis's lanes): the
//! connection is parked in [`Mode::Asking`] with a deadline while the loop goes
//! on with every other one; the broker's answer, posted to this loop's inbox,
//! is written when it comes and the client's next requests are served after
//! it; a broker that misses the deadline gets the client a 503, counted. It
//! must not decide what a request means (`routes` writes the answers).

use std::sync::atomic::Ordering;

use super::super::conn::{Asking, Mode, Phase};
use super::super::routes::{self, Awaited};
use super::super::timer::ticks;
use super::EventLoop;
use super::timers::set_deadline;
use crate::broker::BrokerError;
use crate::broker::asked::{Answer, Asker};
use crate::timing::BROKER_DEADLINE;
use crate::transport::{After, CloseReason};

impl EventLoop {
    /// Parks `key` until the broker answers its request (or the deadline
    /// passes); what the client sent after it waits with it.
    pub(super) fn wait_on_broker(&mut self, key: usize, awaited: Awaited, rest: Vec<u8>) {
        if let Some(conn) = self.conns.get_mut(key) {
            conn.mode = Mode::Asking(Box::new(Asking {
                awaited,
                pending: rest,
                peer_done: false,
            }));
            let due = self.clock.now + ticks(BROKER_DEADLINE).max(1);
            set_deadline(&mut self.clock.wheel, key, conn, due);
        }
        // Answers to requests before it, pipelined in the same read.
        self.send_out(key, After::Nothing);
    }

    /// Writes every answer the broker posted to this loop.
    pub(super) fn on_answers(&mut self) {
        let inbox = self.shared.hub.inbox(self.index);
        if !inbox.has_answers() {
            return;
        }
        let mut answers = std::mem::take(&mut self.buf.answers);
        inbox.take_answers(&mut answers);
        for answer in answers.drain(..) {
            self.on_answer(answer);
        }
        self.buf.answers = answers;
    }

    /// One answer: written to its connection if that still waits for it (one
    /// answered 503 at its deadline, or gone, no longer does).
    fn on_answer(&mut self, answer: Answer) {
        let key = answer.to.key as usize;
        if answer.to.asker == Asker::Sender {
            self.on_sender_answer(key, answer);
            return;
        }
        let waiting = self.conns.get(key).is_some_and(|conn| {
            matches!(&conn.mode, Mode::Asking(asking) if asking.awaited.serial == answer.to.serial)
        });
        if !waiting {
            self.tally.turn.broker_answers_late += 1;
            return;
        }
        self.answer(key, answer.outcome);
    }

    /// A chat member's message handed over: counted once published; a refusal
    /// closes its connection (try again later), as one on the loop did.
    fn on_sender_answer(&mut self, key: usize, answer: Answer) {
        let same = self.conns.get(key).is_some_and(|conn| {
            conn.mode
                .subscriptions()
                .iter()
                .any(|s| s.client == answer.to.serial)
        });
        if !same {
            self.tally.turn.broker_answers_late += 1;
            return;
        }
        match answer.outcome {
            Ok(published) => self.tally.turn.published += published.len() as u64,
            Err(e) => {
                tracing::debug!(error = %e, "a chat member's message was not published");
                self.close_with(key, CloseReason::Unavailable);
            }
        }
    }

    /// A waiting request's deadline passed: 503, and the connection closes
    /// (its answer, if it comes, is dropped).
    pub(super) fn on_broker_late(&mut self, key: usize) {
        self.tally.turn.broker_deadlines_missed += 1;
        let why = format!(
            "the broker did not answer within {} ms: the message may have been published \
             (publish again with an Idempotency-Key to have it published once)",
            BROKER_DEADLINE.as_millis()
        );
        self.answer(key, Err(BrokerError::Unavailable(why)));
    }

    /// Writes the answer to `key`'s waiting request from `outcome`, then serves
    /// what the client sent after it (or closes, when it does not stay open).
    fn answer(&mut self, key: usize, outcome: crate::broker::asked::Outcome) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.phase != Phase::Active {
            return;
        }
        let Mode::Asking(asking) = std::mem::replace(&mut conn.mode, Mode::Http(Vec::new())) else {
            return;
        };
        let Asking {
            mut awaited,
            mut pending,
            peer_done,
        } = *asking;
        if self.shared.shutdown.load(Ordering::Relaxed) {
            awaited.close_after();
        }
        self.buf.out.clear();
        if !routes::answer(&awaited, outcome, &mut self.buf.out, &mut self.tally.turn) {
            self.send_out(key, After::Close);
        } else {
            let due = self.clock.now + self.clock.handshake_ticks;
            set_deadline(&mut self.clock.wheel, key, conn, due);
            if pending.is_empty() {
                self.send_out(key, After::Nothing);
            } else {
                // Served as if just read: answers after this one's, in order.
                let n = pending.len();
                self.feed(key, Some(&mut pending), n);
            }
        }
        if peer_done {
            // The client sent all it will: once what it sent is answered, the
            // connection ends as a half-closed one does.
            self.on_peer_done(key);
        }
    }
}
