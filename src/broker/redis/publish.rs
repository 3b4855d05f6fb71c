//! A publish on Redis: one run of `publish.lua` per message (what a caller on
//! its own thread waits for, and what runs with `--redis-wait-replicas` or on a
//! Cluster), or many messages in one run of `publish_batch.lua` (the lanes'
//! way: one round trip and one `INFO replication` for all of them). Both keep
//! the same promises, since the batch runs `publish.lua`'s own text for each
//! message in turn: one seq order per channel, idempotency keys, epochs. It must
//! not hold subscriptions.

use ::redis::{ConnectionLike, Script, Value};

use super::keys::{Keys, key_life};
use super::pipes::{ClusterPipes, run_again};
use super::wire::{MAGIC, encode_message};
use super::{BrokerError, Outgoing, Shared, new_epoch, origin};
use crate::broker::asked::Publish;
use crate::broker::idempotency::Published;
use crate::history;

/// Next seq, keep, publish: atomic, so every node sees one order. KEYS and ARGV
/// are in the file's header.
pub(super) const PUBLISH_LUA: &str = origin::with_origin!("publish.lua");

/// `publish.lua` for many messages in one run (see the driver's header).
pub(super) const PUBLISH_BATCH_LUA: &str = concat!(
    include_str!("origin.lua"),
    "local function throng_publish_one(KEYS, ARGV)\n",
    include_str!("publish.lua"),
    "\nend\n",
    include_str!("publish_batch.lua"),
);

/// `publish.lua`'s keys and arguments per message (the batch's stride).
const KEYS_PER_MESSAGE: usize = 6;
const ARGS_PER_MESSAGE: usize = 12;

/// `publish.lua`'s how: a new publish, or a key seen before whose message was
/// published; 2 (neither constant) is a key seen before whose message is still
/// held, released like a new one.
const NEW: u8 = 0;
const REPLAYED: u8 = 1;

/// One message's keys and arguments, as both scripts take them.
struct Prepared<'a> {
    keys: Keys,
    idempotency_key: Option<String>,
    key: Option<&'a str>,
    encoded: Vec<u8>,
    size: usize,
    life: u64,
    pubsub: String,
}

impl Shared {
    fn prepare<'a>(
        &self,
        channel: &str,
        message: &Outgoing<'_>,
        key: Option<&'a str>,
    ) -> Prepared<'a> {
        let keys = self.names.keys(channel);
        let limits = self.limits(channel);
        // Without a key the script never touches its key slot: any key of the
        // channel's slot fills it, without a name made per publish.
        let idempotency_key = key.map(|k| keys.idempotency(k));
        Prepared {
            keys,
            idempotency_key,
            key,
            encoded: encode_message(message),
            size: if limits.enabled() { limits.size } else { 0 },
            life: key_life(limits.ttl),
            pubsub: self.pubsub_channel(channel),
        }
    }

    /// One publish script run (and with `--redis-wait-replicas`, its WAIT and
    /// release); with an idempotency key, a key seen before answers for itself.
    pub(super) fn publish_keyed(
        &self,
        script: &Script,
        channel: &str,
        message: Outgoing<'_>,
        key: Option<&str>,
    ) -> Result<Published, BrokerError> {
        let p = self.prepare(channel, &message, key);
        let waits = self.wait_replicas > 0;
        let durable = self.durable_arg();
        let (seq, _epoch, _stamp, how): (u64, String, String, u8) =
            self.with_connection(|con| {
                let mut run = script.prepare_invoke();
                p.add_keys(&mut run);
                p.add_args(&mut run, &durable, waits, self.wait_replicas);
                let answer: (u64, String, String, u8) = run.invoke(con)?;
                if waits && answer.3 != REPLAYED {
                    let held = origin::Held {
                        channel,
                        keys: &p.keys,
                        seq: answer.0,
                        epoch: &answer.1,
                        history_size: p.size,
                        life: p.life,
                    };
                    self.wait_and_release(con, &held)?;
                }
                Ok(answer)
            })?;
        Ok(Published {
            seq,
            replayed: how != NEW,
        })
    }

    /// Publishes every message of `publishes` in one run of
    /// `publish_batch.lua`, in order; each gets its own answer (a message Redis
    /// refused does not stop the others). Not with `--redis-wait-replicas`
    /// (each message's WAIT is its own) and not on a Cluster (one script's keys
    /// are in one slot).
    pub(super) fn publish_batch(
        &self,
        script: &Script,
        publishes: &[&Publish],
    ) -> Result<Vec<Result<Published, BrokerError>>, BrokerError> {
        let prepared = self.prepare_all(publishes);
        let all: Vec<&Prepared<'_>> = prepared.iter().collect();
        let durable = self.durable_arg();
        let answer: Value = self.with_connection(|con: &mut dyn ConnectionLike| {
            let mut run = script.prepare_invoke();
            fill(&mut run, &all, &durable);
            run.invoke(con)
        })?;
        read_batch(answer, prepared.len())
    }

    /// [`Shared::publish_batch`] on a Redis Cluster: one run per slot (a
    /// script's keys are in one slot), all of them sent at once through
    /// `pipes` (one write and one read per master). A run that ran nothing
    /// where it went (the slot moved, the script not loaded there yet) is run
    /// again alone through the cluster client `con`, which follows the cluster
    /// and loads the script; `con_failed` is set when that connection failed on
    /// the wire (it must be made again: its view of the cluster may be gone).
    pub(super) fn publish_batch_on_cluster(
        &self,
        pipes: &mut ClusterPipes,
        con: &mut dyn ConnectionLike,
        con_failed: &mut bool,
        script: &Script,
        publishes: &[&Publish],
    ) -> Vec<Result<Published, BrokerError>> {
        let prepared = self.prepare_all(publishes);
        // Grouped by the slot of the keys (the channel's hash tag).
        let mut slots: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, p) in prepared.iter().enumerate() {
            let slot = super::cluster::slot_of(p.keys.seq.as_bytes());
            match slots.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(i),
                None => slots.push((slot, vec![i])),
            }
        }
        let durable = self.durable_arg();
        let groups: Vec<Vec<&Prepared<'_>>> = slots
            .iter()
            .map(|(_, members)| members.iter().map(|&i| &prepared[i]).collect())
            .collect();
        let commands: Vec<(u16, ::redis::Cmd)> = slots
            .iter()
            .zip(&groups)
            .map(|((slot, _), group)| {
                let mut cmd = ::redis::cmd("EVALSHA");
                cmd.arg(script.get_hash())
                    .arg(group.len() * KEYS_PER_MESSAGE);
                fill(&mut cmd, group, &durable);
                (*slot, cmd)
            })
            .collect();
        let Some(seeds) = &self.seeds else {
            return publishes
                .iter()
                .map(|_| Err(super::unavailable("not a cluster")))
                .collect();
        };
        let replies = pipes.run(seeds, &commands);
        let mut answers: Vec<Option<Result<Published, BrokerError>>> =
            (0..publishes.len()).map(|_| None).collect();
        for (((_, members), group), reply) in slots.iter().zip(&groups).zip(replies) {
            let reply = match reply {
                Err(e) if run_again(&e) => {
                    let mut run = script.prepare_invoke();
                    fill(&mut run, group, &durable);
                    let again = run.invoke::<Value>(con);
                    if again
                        .as_ref()
                        .is_err_and(super::connection::is_wire_failure)
                    {
                        *con_failed = true;
                    }
                    again
                }
                other => other,
            };
            let group_answers = match reply {
                Ok(value) => read_batch(value, group.len()),
                Err(e) => Err(super::unavailable(e)),
            };
            match group_answers {
                Ok(each) => {
                    for (&i, answer) in members.iter().zip(each) {
                        answers[i] = Some(answer);
                    }
                }
                Err(e) => {
                    for &i in members {
                        answers[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(super::unavailable("no answer for a message"))))
            .collect()
    }

    fn prepare_all<'a>(&self, publishes: &[&'a Publish]) -> Vec<Prepared<'a>> {
        publishes
            .iter()
            .map(|p| self.prepare(&p.channel, &p.outgoing(), p.key.as_deref()))
            .collect()
    }
}

/// `publish_batch.lua`'s keys and arguments for `prepared`, in its order.
fn fill(run: &mut impl Run, prepared: &[&Prepared<'_>], durable: &str) {
    for p in prepared {
        p.add_keys(run);
    }
    run.arg(prepared.len());
    for p in prepared {
        p.add_args(run, durable, false, 0);
    }
}

/// `publish_batch.lua`'s answer: one per message of `expected`.
fn read_batch(
    answer: Value,
    expected: usize,
) -> Result<Vec<Result<Published, BrokerError>>, BrokerError> {
    let Value::Array(answers) = answer else {
        return Err(super::unavailable(format!(
            "publish_batch.lua answered {answer:?}, not one answer per message"
        )));
    };
    if answers.len() != expected {
        return Err(super::unavailable(format!(
            "publish_batch.lua answered {} of {expected} messages",
            answers.len()
        )));
    }
    Ok(answers.into_iter().map(read_one).collect())
}

/// Where a script run's keys and arguments go: a [`::redis::ScriptInvocation`]
/// (EVALSHA, loading the script on `NOSCRIPT`), or an `EVALSHA` command built
/// for a pipeline, where keys are arguments like any other.
trait Run {
    fn key(&mut self, key: &str) -> &mut Self;
    fn arg<T: ::redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self;
}

impl Run for ::redis::ScriptInvocation<'_> {
    fn key(&mut self, key: &str) -> &mut Self {
        ::redis::ScriptInvocation::key(self, key)
    }

    fn arg<T: ::redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        ::redis::ScriptInvocation::arg(self, arg)
    }
}

impl Run for ::redis::Cmd {
    fn key(&mut self, key: &str) -> &mut Self {
        ::redis::Cmd::arg(self, key)
    }

    fn arg<T: ::redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        ::redis::Cmd::arg(self, arg)
    }
}

impl Prepared<'_> {
    fn add_keys(&self, run: &mut impl Run) {
        run.key(&self.keys.seq)
            .key(&self.keys.epoch)
            .key(&self.keys.hist)
            .key(&self.keys.held)
            .key(&self.keys.released)
            .key(self.idempotency_key.as_deref().unwrap_or(&self.keys.seq));
        debug_assert_eq!(KEYS_PER_MESSAGE, 6);
    }

    fn add_args(&self, run: &mut impl Run, durable: &str, waits: bool, wait_replicas: u32) {
        run.arg(&self.encoded)
            .arg(history::now_secs())
            .arg(self.size)
            .arg(self.life)
            .arg(format!("{:016x}", new_epoch()))
            .arg(&self.pubsub)
            .arg(MAGIC)
            .arg(durable)
            .arg(if waits { "w" } else { "" })
            .arg(wait_replicas)
            .arg(self.key.unwrap_or_default())
            .arg(crate::timing::IDEMPOTENCY_REMEMBERED_FOR.as_secs());
        debug_assert_eq!(ARGS_PER_MESSAGE, 12);
    }
}

/// One message's answer in a batch: `{seq, epoch, stamp, how}`, or `{-1, why}`.
fn read_one(answer: Value) -> Result<Published, BrokerError> {
    let parts = match answer {
        Value::Array(parts) => parts,
        other => return Err(super::unavailable(format!("a batch answer {other:?}"))),
    };
    match parts.as_slice() {
        [Value::Int(-1), why, ..] => {
            let why = match why {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            };
            Err(super::unavailable(why))
        }
        [Value::Int(seq), _, _, Value::Int(how)] if *seq > 0 => Ok(Published {
            seq: *seq as u64,
            replayed: *how != i64::from(NEW),
        }),
        other => Err(super::unavailable(format!(
            "a batch answer {other:?}, not {{seq, epoch, stamp, how}}"
        ))),
    }
}
