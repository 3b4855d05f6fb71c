//! A channel's seq, epoch and history as Redis keeps them, read in one instant
//! (`snapshot.lua`): for a resuming subscriber's replay, the history API, channel
//! info and the listener's fill-in after a reconnect. It must not write anything
//! but a new channel's epoch (the script's `create`), nor deliver.

use std::time::Duration;

use ::redis::Value;
use bytes::Bytes;

use super::connection::unavailable;
use super::keys::key_life;
use super::wire::{decode_message, epoch_of};
use super::{BrokerError, RedisBroker, Replay, Shared, Stored, new_epoch};
use crate::history::{self, Limits};

/// A channel's seq, epoch and kept messages in one instant. KEYS and ARGV are in
/// the file's header.
pub(super) const SNAPSHOT_LUA: &str = super::origin::with_origin!("snapshot.lua");

/// A channel's state in Redis at one instant.
pub(super) struct Snapshot {
    pub(super) last_seq: u64,
    pub(super) epoch: Option<u64>,
    /// Kept messages, oldest first (expired ones included: the caller filters).
    pub(super) kept: Vec<(Stored, u64)>,
}

impl Snapshot {
    /// The kept messages younger than `ttl`, oldest first.
    pub(super) fn fresh(self, ttl: Duration) -> impl Iterator<Item = Stored> {
        let ttl = ttl.as_secs();
        let now = u64::from(history::now_secs());
        self.kept
            .into_iter()
            .filter(move |(_, t)| ttl > 0 && now.saturating_sub(*t) < ttl)
            .map(|(m, _)| m)
    }
}

pub(super) fn parse_snapshot(value: Value) -> Result<Snapshot, BrokerError> {
    let bad = || unavailable("unexpected snapshot answer");
    let Value::Array(items) = value else {
        return Err(bad());
    };
    let mut items = items.into_iter();
    let last_seq = match items.next() {
        Some(Value::Int(n)) => u64::try_from(n).map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    let epoch = match items.next() {
        Some(Value::BulkString(b)) => Some(epoch_of(&b).ok_or_else(bad)?),
        Some(Value::Nil) | Some(Value::Boolean(false)) => None,
        _ => return Err(bad()),
    };
    let mut kept = Vec::new();
    if let Some(Value::Array(entries)) = items.next() {
        for entry in entries {
            if let Some(stored) = parse_entry(entry) {
                kept.push(stored);
            }
        }
    }
    Ok(Snapshot {
        last_seq,
        epoch,
        kept,
    })
}

/// One stream entry `[id, [m, message, t, secs]]` as a kept message and its time.
pub(super) fn parse_entry(entry: Value) -> Option<(Stored, u64)> {
    let Value::Array(parts) = entry else {
        return None;
    };
    let mut parts = parts.into_iter();
    let Some(Value::BulkString(id)) = parts.next() else {
        return None;
    };
    let Some(Value::Array(fields)) = parts.next() else {
        return None;
    };
    let id = std::str::from_utf8(&id).ok()?;
    let seq: u64 = id.split_once('-')?.0.parse().ok()?;
    let mut message = None;
    let mut time = 0;
    let mut fields = fields.into_iter();
    while let (Some(Value::BulkString(name)), Some(Value::BulkString(value))) =
        (fields.next(), fields.next())
    {
        match name.as_slice() {
            b"m" => message = Some(value),
            b"t" => time = std::str::from_utf8(&value).ok()?.parse().ok()?,
            _ => {}
        }
    }
    let message = message?;
    let decoded = decode_message(&message)?;
    let (kind, tags, payload) = (decoded.kind, decoded.tags, decoded.payload);
    Some((
        Stored {
            seq,
            payload: Bytes::copy_from_slice(payload),
            kind,
            from: tags.from.map(Box::from),
            event: tags.event.map(Box::from),
            skip: decoded.skip,
        },
        time,
    ))
}

impl Shared {
    /// The channel's seq, epoch and kept messages (starting the channel's epoch if
    /// it has none and `create`).
    pub(super) fn snapshot(&self, channel: &str, create: bool) -> Result<Snapshot, BrokerError> {
        let keys = self.names.keys(channel);
        let durable = self.durable_arg();
        let value: Value = self.with_connection(|con| {
            self.snapshot
                .key(&keys.seq)
                .key(&keys.epoch)
                .key(&keys.hist)
                .key(&keys.held)
                .key(&keys.released)
                .arg(format!("{:016x}", new_epoch()))
                .arg(key_life(Duration::ZERO))
                .arg(if create { "1" } else { "0" })
                .arg(&durable)
                .invoke(con)
        })?;
        parse_snapshot(value)
    }

    pub(super) fn limits(&self, channel: &str) -> Limits {
        let (size, ttl) = self.namespaces.history(channel);
        Limits {
            size: size.unwrap_or(self.history.size),
            ttl: ttl.unwrap_or(self.history.ttl),
        }
    }
}

impl RedisBroker {
    /// Replay of the channel's history in Redis, without expired messages.
    pub(super) fn replay(&self, channel: &str, since: u64) -> Result<Replay, BrokerError> {
        let snapshot = self.shared.snapshot(channel, true)?;
        let (last_seq, epoch) = (snapshot.last_seq, snapshot.epoch.unwrap_or(0));
        let mut messages: Vec<Stored> = snapshot.fresh(self.shared.limits(channel).ttl).collect();
        let oldest = messages.first().map_or(last_seq + 1, |m| m.seq);
        messages.retain(|m| m.seq > since);
        Ok(Replay {
            messages,
            last_seq,
            oldest,
            epoch,
        })
    }
}
