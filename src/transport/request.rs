//! What a transport's endpoint reads from the request that opens it: its query
//! parameters, where a returning subscriber left off, and the refusals it can
//! answer with. Each transport's file owns its endpoints ([`Endpoint`]) and parses
//! its own parameters with these helpers.
//!
//! The origin and token rules are the server's: an endpoint asks them through a
//! [`Gate`]. This module does no I/O, writes no response and counts nothing: the
//! server turns a [`Refused`] into the HTTP answer and the failure counter.

use crate::auth::{AuthError, Grant};
use crate::broker::Resume;
use crate::protocol::handshake::HandshakeError;
use crate::protocol::http::Request;

use super::Opening;

/// Where a transport's requests are found.
#[derive(Debug, Clone, Copy)]
pub enum Path {
    /// Exactly this path (echo: `/`, `/echo`).
    Exact(&'static str),
    /// `prefix` then a channel name (`/ws/`, `/sse/`, `/poll/`).
    Prefix(&'static str),
}

impl Path {
    /// What follows the endpoint's path in `path` (the channel; `""` for an exact
    /// path), if `path` is this endpoint's.
    pub fn matches(self, path: &str) -> Option<&str> {
        match self {
            Path::Exact(p) => (path == p).then_some(""),
            Path::Prefix(p) => path.strip_prefix(p),
        }
    }
}

/// One kind of request a transport opens connections from.
#[derive(Clone, Copy)]
pub struct Endpoint {
    pub path: Path,
    /// Reads the request (the channel is what followed the prefix) into what the
    /// connection opens as, or why it is refused.
    pub open: fn(&Request<'_>, &str, &dyn Gate) -> Result<Opening, Refused>,
}

/// The server's access rules, as a transport's endpoint asks them.
pub trait Gate {
    /// Who may subscribe to `channel`: with `--token-secret`, a token granting
    /// it. `Ok(None)`: no token is asked for. (A page's `Origin` was checked by
    /// the router before any transport is asked.)
    fn admit(&self, req: &Request<'_>, channel: &str) -> Result<Option<Grant>, AuthError>;
    /// The place among the server's configured applications (tenants with keys
    /// of their own) of the one whose public key is `key`, for a protocol whose
    /// clients name their application when they connect (Pusher's `/app/KEY`).
    /// Which protocol's apps they are is the server's business, not the seam's.
    fn app_by_key(&self, key: &str) -> Option<u16>;
}

/// Why a request for a transport is not opened.
#[derive(Debug)]
pub enum Refused {
    /// 400 with the reason; `counted`: the request asked for a transport, so it is
    /// a failed handshake.
    Bad { reason: String, counted: bool },
    /// 405: the transport is opened with GET; `counted` as `Bad`.
    Method { counted: bool },
    /// 426: a WebSocket path asked without an upgrade (no handshake to count).
    NotUpgrade,
    /// The origin or token rules said no (401/403).
    Auth(AuthError),
    /// Not a valid WebSocket upgrade.
    Handshake(HandshakeError),
}

impl Refused {
    /// A 400 counted as a failed handshake.
    pub fn bad(reason: impl Into<String>) -> Refused {
        Refused::Bad {
            reason: reason.into(),
            counted: true,
        }
    }
}

/// The value of one `key=value` pair of a query string.
pub fn query_param<'a>(req: &Request<'a>, key: &str) -> Option<&'a str> {
    req.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `since=SEQ[&epoch=E]`: where a returning subscriber left off.
pub fn resume_param(req: &Request<'_>) -> Result<Option<Resume>, String> {
    let since = match query_param(req, "since") {
        None => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            format!(
                "since must be a seq (a whole number from 0), not '{}'",
                truncate(v, 40)
            )
        })?),
    };
    let epoch = match query_param(req, "epoch") {
        None => None,
        Some(v) if v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(v, 16).ok()
        }
        Some(v) => {
            return Err(format!(
                "epoch must be 16 hex digits as the server gave it, not '{}'",
                truncate(v, 40)
            ));
        }
    };
    match (since, epoch) {
        (Some(since), epoch) => Ok(Some(Resume { since, epoch })),
        (None, Some(_)) => Err("epoch goes with since=SEQ".into()),
        (None, None) => Ok(None),
    }
}

/// What an event stream or a long-poll checks before it opens: a GET, a valid
/// channel name, and the origin and token rules.
pub fn admit_get(
    req: &Request<'_>,
    channel: &str,
    gate: &dyn Gate,
) -> Result<Option<Grant>, Refused> {
    if req.method != "GET" {
        return Err(Refused::Method { counted: true });
    }
    crate::rules::validate_channel_name(channel).map_err(|e| Refused::bad(e.to_string()))?;
    gate.admit(req, channel).map_err(Refused::Auth)
}

/// The first `max` bytes of `s` (fewer, to end on a character), for quoting a
/// client's value in an error.
pub fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
