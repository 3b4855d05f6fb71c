//! Pusher webhooks as the protocol defines them: the kinds of event an app is
//! told of its channels (`channel_occupied`, `channel_vacated`, `member_added`,
//! `member_removed`, `client_event`), which of them a URL is sent ([`Target`],
//! from `--pusher-webhook` and the config file), one event as a body carries it,
//! and the body itself (`{"time_ms": …, "events": […]}`) with its headers
//! (`X-Pusher-Key`, `X-Pusher-Signature`: HMAC-SHA256 of the body under the
//! app's secret, in hex).
//!
//! Pure values and functions: no I/O, no thread, no clock (the caller passes the
//! time). Queues, threads, HTTP requests and retries are the server's
//! ([`crate::webhooks`]).

use std::str::FromStr;

use serde::Serialize;

/// The header naming the app whose webhook a request is.
pub const KEY_HEADER: &str = "X-Pusher-Key";
/// The header carrying the body's signature under the app's secret.
pub const SIGNATURE_HEADER: &str = "X-Pusher-Signature";

/// A kind of webhook event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ChannelOccupied,
    ChannelVacated,
    MemberAdded,
    MemberRemoved,
    ClientEvent,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::ChannelOccupied,
        Kind::ChannelVacated,
        Kind::MemberAdded,
        Kind::MemberRemoved,
        Kind::ClientEvent,
    ];

    /// Its name in a webhook body and in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Kind::ChannelOccupied => "channel_occupied",
            Kind::ChannelVacated => "channel_vacated",
            Kind::MemberAdded => "member_added",
            Kind::MemberRemoved => "member_removed",
            Kind::ClientEvent => "client_event",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// Which kinds of event one URL is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kinds(u8);

impl Kinds {
    pub const ALL: Kinds = Kinds(0b1_1111);

    pub fn has(self, kind: Kind) -> bool {
        self.0 & kind.bit() != 0
    }

    /// The kinds named, e.g. `["channel_occupied", "member_added"]`.
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Kinds, String> {
        let mut kinds = Kinds(0);
        for name in names {
            let kind = Kind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "unknown webhook event '{name}' (known: {})",
                        known.join(", ")
                    )
                })?;
            kinds.0 |= kind.bit();
        }
        if kinds.0 == 0 {
            return Err("a webhook needs at least one event".into());
        }
        Ok(kinds)
    }
}

/// One webhook URL and the kinds of event it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: Box<str>,
    pub kinds: Kinds,
}

/// Why a webhook URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a webhook URL is http://HOST[:PORT]/PATH or https://…, without spaces: '{0}'")]
pub struct TargetError(String);

impl FromStr for Target {
    type Err = TargetError;

    /// A URL (`--pusher-webhook`), sent every kind of event.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("http://")
            .or_else(|| s.strip_prefix("https://"));
        let host_given = rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/'));
        if !host_given || s.len() > 2048 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TargetError(s.chars().take(100).collect()));
        }
        Ok(Target {
            url: s.into(),
            kinds: Kinds::ALL,
        })
    }
}

/// One event of a webhook body, as Pusher sends it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    pub name: &'static str,
    pub channel: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_id: Option<String>,
}

impl Event {
    /// `kind` on `channel` (a Pusher channel name), for a user or for none.
    pub fn of_channel(kind: Kind, channel: String, user_id: Option<&str>) -> Event {
        Event {
            name: kind.name(),
            channel,
            user_id: user_id.map(str::to_string),
            event: None,
            data: None,
            socket_id: None,
        }
    }

    /// A client event `event` with `data` on `channel` (a Pusher channel name),
    /// sent by connection `socket_id` (signed in as `user_id`, on a presence
    /// channel).
    pub fn client_event(
        channel: String,
        event: &str,
        data: &str,
        socket_id: &str,
        user_id: Option<&str>,
    ) -> Event {
        Event {
            name: Kind::ClientEvent.name(),
            channel,
            user_id: user_id.map(str::to_string),
            event: Some(event.to_string()),
            data: Some(data.to_string()),
            socket_id: Some(socket_id.to_string()),
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    time_ms: u64,
    events: &'a [Event],
}

/// One request's body and the signature its [`SIGNATURE_HEADER`] carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedBody {
    pub body: Vec<u8>,
    pub signature: String,
}

/// The body of a request carrying `events`, made at `time_ms` (milliseconds
/// since the Unix epoch), signed with `secret`.
pub fn signed_body(
    secret: &str,
    time_ms: u64,
    events: &[Event],
) -> Result<SignedBody, serde_json::Error> {
    let body = serde_json::to_vec(&Body { time_ms, events })?;
    let signature = super::sign::sign(secret, &body);
    Ok(SignedBody { body, signature })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_pusher_name() {
        let kinds = Kinds::parse(["channel_occupied", "member_added"]).unwrap();
        assert!(kinds.has(Kind::ChannelOccupied) && kinds.has(Kind::MemberAdded));
        assert!(!kinds.has(Kind::ClientEvent));
        assert!(Kinds::parse(["occupied"]).unwrap_err().contains("known"));
        assert!(Kinds::parse([]).is_err());
        assert!(Kind::ALL.iter().all(|k| Kinds::ALL.has(*k)));
    }

    #[test]
    fn targets_are_http_urls() {
        let t: Target = "http://127.0.0.1:9/hook".parse().unwrap();
        assert_eq!((&*t.url, t.kinds), ("http://127.0.0.1:9/hook", Kinds::ALL));
        assert!("https://example.com".parse::<Target>().is_ok());
        for bad in [
            "",
            "ftp://x",
            "http://",
            "http:///x",
            "http://a b",
            "127.0.0.1:9",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }

    #[test]
    fn events_serialize_as_pusher_sends_them() {
        let e = Event::of_channel(Kind::MemberAdded, "presence-a".into(), Some("7"));
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"name":"member_added","channel":"presence-a","user_id":"7"}"#
        );
    }

    #[test]
    fn a_body_is_signed_with_the_apps_secret() {
        let events = [Event::client_event(
            "private-a".into(),
            "client-x",
            "{}",
            "1.2",
            None,
        )];
        let signed = signed_body("secret", 1234, &events).unwrap();
        assert_eq!(
            std::str::from_utf8(&signed.body).unwrap(),
            r#"{"time_ms":1234,"events":[{"name":"client_event","channel":"private-a","event":"client-x","data":"{}","socket_id":"1.2"}]}"#
        );
        assert!(super::super::sign::verify(
            "secret",
            &signed.body,
            &signed.signature
        ));
        assert!(!super::super::sign::verify(
            "other",
            &signed.body,
            &signed.signature
        ));
    }
}
