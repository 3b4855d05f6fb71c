//! Requests that open a transport: finds the transport's endpoint for a path (the
//! table in `transport`), gives it the server's origin and token rules as a
//! [`Gate`], and turns a refusal into its HTTP answer and failure count. What each
//! transport reads from its request is its own file's; this module names none.

use super::Outcome;
use crate::auth::{self, AuthError, Grant, Wildcards};
use crate::protocol::handshake::HandshakeError;
use crate::protocol::http::{self, Request};
use crate::pusher;
use crate::server::shared::Shared;
use crate::stats::{HandshakeFailure, TurnCounts};
use crate::transport::request::query_param;
use crate::transport::{ENDPOINTS, Endpoint, Gate, Refused};

/// The transport endpoint `path` belongs to, and what follows its prefix.
pub(super) fn endpoint(path: &str) -> Option<(&'static Endpoint, &str)> {
    ENDPOINTS
        .iter()
        .flat_map(|endpoints| endpoints.iter())
        .find_map(|e| e.path.matches(path).map(|rest| (e, rest)))
}

/// Opens the transport `endpoint` serves, or writes and counts its refusal.
pub(super) fn open(
    req: &Request<'_>,
    endpoint: &Endpoint,
    rest: &str,
    shared: &Shared,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    match (endpoint.open)(req, rest, &Rules { shared }) {
        Ok(opening) => Outcome::Open(opening),
        Err(refused) => {
            refuse(out, counts, refused);
            Outcome::Responded
        }
    }
}

/// The server's token and Pusher-namespace rules (the origin and host rules
/// are the router's, kept for every request before a transport is asked).
struct Rules<'a> {
    shared: &'a Shared,
}

impl Gate for Rules<'_> {
    /// A token comes as `?token=` or `Authorization: Bearer`. A Pusher app's
    /// private, presence, encrypted and user channels are never opened here, with
    /// or without a token: only the Pusher protocol, with the app's signatures,
    /// subscribes to them; its public channels need a token that names them.
    fn admit(&self, req: &Request<'_>, channel: &str) -> Result<Option<Grant>, AuthError> {
        let app = pusher::app_channel(&self.shared.config.pusher_apps, channel);
        if let Some((app, kind)) = app
            && kind != pusher::ChannelKind::Public
        {
            return Err(AuthError::Forbidden(pusher_only(channel, &app.id, kind)));
        }
        let Some(verifier) = &self.shared.verifier else {
            return Ok(None);
        };
        let wildcards = match app {
            Some(_) => Wildcards::ExactOnly,
            None => Wildcards::Cover,
        };
        let header = req
            .header("authorization")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let token = query_param(req, "token").or(header).ok_or_else(|| {
            AuthError::Unauthorized(
                "a token is needed: ?token=JWT or Authorization: Bearer JWT".into(),
            )
        })?;
        verifier
            .check(token, channel, auth::now_secs(), wildcards)
            .map(Some)
    }

    fn app_by_key(&self, key: &str) -> Option<u16> {
        crate::pusher::app_by_key(&self.shared.config.pusher_apps, key).map(|(i, _)| i)
    }
}

/// Why a Pusher app's non-public channel is refused outside the Pusher protocol.
pub(super) fn pusher_only(channel: &str, app: &str, kind: pusher::ChannelKind) -> String {
    format!(
        "'{channel}' is Pusher app {app}'s {} channel: it is reached only through the \
         Pusher protocol (/app/KEY, signed)",
        kind.describe()
    )
}

/// Writes a refused transport request's answer; one that asked for a transport
/// counts as a failed handshake, by reason.
fn refuse(out: &mut Vec<u8>, counts: &mut TurnCounts, refused: Refused) {
    match refused {
        Refused::Bad { reason, counted } => {
            if counted {
                counts.handshake_failed(HandshakeFailure::BadRequest);
            }
            http::write_error(out, 400, &reason, &[]);
        }
        Refused::Method { counted } => {
            if counted {
                counts.handshake_failed(HandshakeFailure::BadRequest);
            }
            http::write_error(out, 405, "method not allowed: use GET", &[("Allow", "GET")]);
        }
        Refused::NotUpgrade => http::write_error(
            out,
            426,
            "this is a WebSocket endpoint: send an Upgrade: websocket request",
            &[("Upgrade", "websocket")],
        ),
        Refused::Auth(e) => {
            counts.handshake_failed(match e {
                AuthError::Origin => HandshakeFailure::Origin,
                _ => HandshakeFailure::Unauthorized,
            });
            let extra: &[(&str, &str)] = match e {
                AuthError::Unauthorized(_) => &[("WWW-Authenticate", "Bearer")],
                _ => &[],
            };
            http::write_error(out, e.status(), &e.to_string(), extra);
        }
        Refused::Handshake(err) => {
            counts.handshake_failed(match err {
                HandshakeError::UnsupportedVersion => HandshakeFailure::UnsupportedVersion,
                _ => HandshakeFailure::BadRequest,
            });
            let extra: &[(&str, &str)] = match err {
                HandshakeError::UnsupportedVersion => &[("Sec-WebSocket-Version", "13")],
                HandshakeError::NotGet => &[("Allow", "GET")],
                _ => &[],
            };
            http::write_error(out, err.status(), &err.to_string(), extra);
        }
    }
}
