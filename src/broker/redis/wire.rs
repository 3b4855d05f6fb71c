//! The bytes on Redis: a message as kept in a channel's history and published
//! on its pubsub channel, what a node reads back from pubsub (its own data and
//! presence events, or what another program published), and the names of the
//! pubsub channels. The data message itself is put together by `publish.lua`
//! (`MAGIC`, `D`, seq, epoch, the encoded message); this file reads it. It must
//! not talk to Redis nor touch the hub: pure encoding and parsing.

use super::Outgoing;
use crate::history::Tags;
use crate::hub::{ConnRef, PresenceChange, SocketId};
use crate::protocol::DataKind;

/// What a node's own messages start with on the pubsub channel; anything else came
/// from another program.
pub(super) const MAGIC: &[u8] = b"\x00throng1";

/// The kind byte's flag for a message with an event name.
const WITH_EVENT: u8 = 0x80;
/// The kind byte's flag for a message that leaves a connection out.
const WITH_SKIP: u8 = 0x40;

/// A message as kept and published: kind, the sender's name, the event name and
/// the connection it leaves out (each only when it has one, flagged in the kind
/// byte, so messages without stay as they were), the payload. Names are cut at
/// 255 bytes, what their length byte can say.
pub(super) fn encode_message(message: &Outgoing<'_>) -> Vec<u8> {
    let cut = |name: Option<&str>| -> Vec<u8> {
        let name = name.unwrap_or("").as_bytes();
        name[..name.len().min(255)].to_vec()
    };
    let (from, event) = (cut(message.from), cut(message.event));
    let mut out = Vec::with_capacity(3 + from.len() + event.len() + message.payload.len());
    let kind = match message.kind {
        DataKind::Text => 0,
        DataKind::Binary => 1,
    };
    let mut flags = kind;
    if message.event.is_some() {
        flags |= WITH_EVENT;
    }
    if message.skip.is_some() {
        flags |= WITH_SKIP;
    }
    out.push(flags);
    out.push(from.len() as u8);
    out.extend_from_slice(&from);
    if message.event.is_some() {
        out.push(event.len() as u8);
        out.extend_from_slice(&event);
    }
    if let Some(skip) = message.skip {
        out.extend_from_slice(&skip.node.to_be_bytes());
        out.extend_from_slice(&skip.client.to_be_bytes());
    }
    out.extend_from_slice(message.payload);
    out
}

/// A decoded message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Decoded<'a> {
    pub kind: DataKind,
    pub tags: Tags<'a>,
    pub skip: Option<SocketId>,
    pub payload: &'a [u8],
}

pub(super) fn decode_message(bytes: &[u8]) -> Option<Decoded<'_>> {
    let (&flags, rest) = bytes.split_first()?;
    let kind = match flags & !(WITH_EVENT | WITH_SKIP) {
        0 => DataKind::Text,
        1 => DataKind::Binary,
        _ => return None,
    };
    let (from, rest) = length_prefixed(rest)?;
    let (event, rest) = if flags & WITH_EVENT != 0 {
        length_prefixed(rest)?
    } else {
        (None, rest)
    };
    let (skip, payload) = if flags & WITH_SKIP != 0 {
        let (id, rest) = rest.split_at_checked(8)?;
        let (node, client) = id.split_at(4);
        let skip = SocketId {
            node: u32::from_be_bytes(node.try_into().ok()?),
            client: u32::from_be_bytes(client.try_into().ok()?),
        };
        (Some(skip), rest)
    } else {
        (None, rest)
    };
    Some(Decoded {
        kind,
        tags: Tags { from, event },
        skip,
        payload,
    })
}

impl<'a> Decoded<'a> {
    /// What another program published: the payload alone.
    pub fn foreign(kind: DataKind, payload: &'a [u8]) -> Self {
        Decoded {
            kind,
            tags: Tags::default(),
            skip: None,
            payload,
        }
    }
}

/// A name after its length byte (`None` when empty or not UTF-8), and the rest.
fn length_prefixed(bytes: &[u8]) -> Option<(Option<&str>, &[u8])> {
    let (&len, rest) = bytes.split_first()?;
    let (name, rest) = rest.split_at_checked(usize::from(len))?;
    let name = (!name.is_empty())
        .then(|| std::str::from_utf8(name).ok())
        .flatten();
    Some((name, rest))
}

pub(super) fn epoch_of(text: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(text).ok()?, 16).ok()
}

/// What came on a pubsub channel.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Incoming<'a> {
    /// A message published through a node.
    Data {
        seq: u64,
        epoch: u64,
        message: Decoded<'a>,
    },
    /// A member joined or left on `node` (`exclude`: its connection there).
    Event {
        node: &'a str,
        exclude: Option<ConnRef>,
        event: &'static str,
        client: &'a str,
        count: u64,
    },
    /// A presence channel's user came or went (`member`: its JSON on the
    /// wire, see [`member_json`]).
    Presence {
        change: PresenceChange,
        skip: Option<SocketId>,
        member: &'a [u8],
    },
    /// Every subscriber of the channel is to be closed.
    CloseAll,
    /// Something another program published: the payload alone.
    Foreign(&'a [u8]),
}

/// A Pusher presence event as published: `P`, `a` (added) or `r` (removed), the
/// connection it leaves out (`NODE CLIENT`, or `- -`), then its data.
pub(super) fn encode_presence(added: bool, skip: Option<SocketId>, member: &str) -> Vec<u8> {
    let mut message = presence_head(added, skip);
    message.extend_from_slice(member.as_bytes());
    message
}

/// A presence member as the nodes tell each other of it (and the Lua scripts
/// store it): `{"user_id":ID,"user_info":INFO}` with a join, `{"user_id":ID}`
/// with a leave. `user_info` is JSON text already.
pub(super) fn member_json(user_id: &str, user_info: Option<&str>) -> String {
    let id = serde_json::Value::from(user_id);
    match user_info {
        Some(info) => format!("{{\"user_id\":{id},\"user_info\":{info}}}"),
        None => format!("{{\"user_id\":{id}}}"),
    }
}

/// The user id and `user_info` (JSON text) of a member as [`member_json`]
/// wrote it; `None` for anything else.
pub(super) fn parse_member(member: &[u8]) -> Option<(Box<str>, Option<Box<str>>)> {
    let value: serde_json::Value = serde_json::from_slice(member).ok()?;
    let id = value.get("user_id")?.as_str()?.into();
    let info = value
        .get("user_info")
        .map(|i| i.to_string().into_boxed_str());
    Some((id, info))
}

/// What a presence event's message starts with (its data follows).
pub(super) fn presence_head(added: bool, skip: Option<SocketId>) -> Vec<u8> {
    let mut message = MAGIC.to_vec();
    let kind = if added { 'a' } else { 'r' };
    let skip = match skip {
        Some(s) => format!("{} {}", s.node, s.client),
        None => "- -".to_string(),
    };
    message.extend_from_slice(format!("P{kind} {skip}\n").as_bytes());
    message
}

pub(super) fn parse_incoming(bytes: &[u8]) -> Option<Incoming<'_>> {
    let Some(rest) = bytes.strip_prefix(MAGIC) else {
        return Some(Incoming::Foreign(bytes));
    };
    let (&tag, rest) = rest.split_first()?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let head = std::str::from_utf8(&rest[..nl]).ok()?;
    let body = &rest[nl + 1..];
    match tag {
        b'D' => {
            let (seq, epoch) = head.split_once(' ')?;
            Some(Incoming::Data {
                seq: seq.parse().ok()?,
                epoch: epoch_of(epoch.as_bytes())?,
                message: decode_message(body)?,
            })
        }
        b'K' => Some(Incoming::CloseAll),
        b'P' => {
            let mut parts = head.split(' ');
            let change = match parts.next()? {
                "a" => PresenceChange::Joined,
                "r" => PresenceChange::Left,
                _ => return None,
            };
            let skip = match (parts.next()?, parts.next()?) {
                ("-", "-") => None,
                (node, client) => Some(SocketId {
                    node: node.parse().ok()?,
                    client: client.parse().ok()?,
                }),
            };
            Some(Incoming::Presence {
                change,
                skip,
                member: body,
            })
        }
        b'E' => {
            // node loop key|- count event, then the client's name as the body.
            let mut parts = head.split(' ');
            let node = parts.next()?;
            let loop_index = parts.next()?.parse().ok()?;
            let exclude = match parts.next()? {
                "-" => None,
                key => Some(ConnRef {
                    loop_index,
                    key: key.parse().ok()?,
                }),
            };
            let count = parts.next()?.parse().ok()?;
            let event = match parts.next()? {
                "join" => "join",
                "leave" => "leave",
                _ => return None,
            };
            Some(Incoming::Event {
                node,
                exclude,
                event,
                client: std::str::from_utf8(body).ok()?,
                count,
            })
        }
        _ => None,
    }
}

/// A join or leave of `client` on `node` (`exclude`: its connection there, which
/// is not told), `count` members in all: as [`parse_incoming`] reads it.
pub(super) fn encode_event(
    node: &str,
    exclude: Option<ConnRef>,
    count: u64,
    event: &str,
    client: &str,
) -> Vec<u8> {
    let (loop_index, key) = match exclude {
        Some(c) => (c.loop_index, c.key.to_string()),
        None => (0, "-".to_string()),
    };
    let mut message = MAGIC.to_vec();
    message.extend_from_slice(
        format!("E{node} {loop_index} {key} {count} {event}\n{client}").as_bytes(),
    );
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_encode_and_decode() {
        let m = Outgoing {
            payload: b"hi",
            kind: DataKind::Text,
            from: Some("c7"),
            event: None,
            skip: None,
        };
        let bytes = encode_message(&m);
        let c7 = Tags {
            from: Some("c7"),
            event: None,
        };
        let decoded = |kind, tags, skip, payload| {
            Some(Decoded {
                kind,
                tags,
                skip,
                payload,
            })
        };
        assert_eq!(
            decode_message(&bytes),
            decoded(DataKind::Text, c7, None, &b"hi"[..])
        );
        let e = Outgoing {
            event: Some("price"),
            ..m
        };
        let both = Tags {
            from: Some("c7"),
            event: Some("price"),
        };
        assert_eq!(
            decode_message(&encode_message(&e)),
            decoded(DataKind::Text, both, None, &b"hi"[..])
        );
        let sender = SocketId {
            node: 7,
            client: u32::MAX,
        };
        let skipping = Outgoing {
            skip: Some(sender),
            ..e
        };
        assert_eq!(
            decode_message(&encode_message(&skipping)),
            decoded(DataKind::Text, both, Some(sender), &b"hi"[..])
        );
        let mut short = encode_message(&skipping);
        short.truncate(short.len() - 2 - 3);
        assert_eq!(decode_message(&short), None);
        let b = Outgoing {
            payload: &[0, 255],
            kind: DataKind::Binary,
            from: None,
            event: None,
            skip: None,
        };
        assert_eq!(
            decode_message(&encode_message(&b)),
            decoded(DataKind::Binary, Tags::default(), None, &[0u8, 255][..])
        );
        assert_eq!(decode_message(&[0x80, 0, 3, b'a']), None);
        assert_eq!(decode_message(&[9, 0]), None);
        assert_eq!(decode_message(&[0, 5, b'a']), None);
    }

    #[test]
    fn a_member_on_the_wire_reads_back_as_it_was_written() {
        let joined = member_json("ann \"a\"", Some(r#"{"n":[1,2]}"#));
        assert_eq!(joined, r#"{"user_id":"ann \"a\"","user_info":{"n":[1,2]}}"#);
        let (id, info) = parse_member(joined.as_bytes()).unwrap();
        assert_eq!(
            (&*id, info.as_deref()),
            ("ann \"a\"", Some(r#"{"n":[1,2]}"#))
        );
        let left = member_json("ann", None);
        assert_eq!(parse_member(left.as_bytes()), Some(("ann".into(), None)));
        for bad in [&b"{}"[..], b"not json", br#"{"user_id":7}"#] {
            assert_eq!(parse_member(bad), None);
        }
    }

    #[test]
    fn presence_events_encode_and_parse() {
        let joiner = SocketId {
            node: 12,
            client: 34,
        };
        let added = encode_presence(true, Some(joiner), r#"{"user_id":"u"}"#);
        assert_eq!(
            parse_incoming(&added),
            Some(Incoming::Presence {
                change: PresenceChange::Joined,
                skip: Some(joiner),
                member: br#"{"user_id":"u"}"#,
            })
        );
        let mut removed = presence_head(false, None);
        removed.extend_from_slice(b"{}");
        assert_eq!(
            parse_incoming(&removed),
            Some(Incoming::Presence {
                change: PresenceChange::Left,
                skip: None,
                member: b"{}",
            })
        );
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(b"Px - -\n{}");
        assert_eq!(parse_incoming(&bad), None);
    }

    #[test]
    fn incoming_messages_are_ours_or_foreign() {
        let mut data = MAGIC.to_vec();
        data.extend_from_slice(b"D12 00000000000000ff\n");
        data.extend_from_slice(&encode_message(&Outgoing {
            payload: b"x",
            kind: DataKind::Text,
            from: None,
            event: None,
            skip: None,
        }));
        assert_eq!(
            parse_incoming(&data),
            Some(Incoming::Data {
                seq: 12,
                epoch: 255,
                message: Decoded::foreign(DataKind::Text, &b"x"[..])
            })
        );
        let mut event = MAGIC.to_vec();
        event.extend_from_slice(b"Eabc 1 42 3 join\nc9");
        assert_eq!(
            parse_incoming(&event),
            Some(Incoming::Event {
                node: "abc",
                exclude: Some(ConnRef {
                    loop_index: 1,
                    key: 42
                }),
                event: "join",
                client: "c9",
                count: 3
            })
        );
        assert_eq!(parse_incoming(b"hello"), Some(Incoming::Foreign(b"hello")));
        let mut broken = MAGIC.to_vec();
        broken.extend_from_slice(b"Dnot a header");
        assert_eq!(parse_incoming(&broken), None);
    }

    #[test]
    fn events_encode_as_they_parse() {
        let exclude = Some(ConnRef {
            loop_index: 1,
            key: 42,
        });
        let event = encode_event("abc", exclude, 3, "join", "c9");
        assert_eq!(&event[MAGIC.len()..], b"Eabc 1 42 3 join\nc9");
        assert_eq!(
            encode_event("abc", None, 2, "leave", "c9"),
            [MAGIC, b"Eabc 0 - 2 leave\nc9"].concat()
        );
    }
}
