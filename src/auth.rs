//! Who may subscribe: HS256 JSON Web Tokens (`--token-secret`) and browser origins
//! (`--allowed-origin`).
//!
//! A token grants channels (`channels`: names, or prefixes ending in `*`) until it
//! expires (`exp`, required); its `sub` is the client's name in chat. Only HS256 is
//! accepted: `alg: none`, every other algorithm, a bad signature, a missing or
//! malformed claim, an expired token are refused with the reason. This module
//! decides; it must not touch connections, and it never logs a token.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::rules::validate_client_name;

/// Why a subscription is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token, or one that is not valid (401).
    #[error("{0}")]
    Unauthorized(String),
    /// A valid token that does not grant this channel (403).
    #[error("{0}")]
    Forbidden(String),
    /// A browser page from an origin `--allowed-origin` does not list (403).
    #[error("origin not allowed: the server's --allowed-origin does not list it")]
    Origin,
}

impl AuthError {
    pub fn status(&self) -> u16 {
        match self {
            AuthError::Unauthorized(_) => 401,
            AuthError::Forbidden(_) | AuthError::Origin => 403,
        }
    }
}

/// What a valid token lets its holder do on one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// When the token expires (Unix seconds): the connection is closed then.
    pub expires: u32,
    /// The client's name in chat (`sub`), if the token names it.
    pub name: Option<Box<str>>,
}

#[derive(Debug, serde::Deserialize)]
struct Claims {
    exp: u64,
    channels: Vec<String>,
    #[serde(default)]
    sub: Option<String>,
}

/// Checks subscription tokens against one secret.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str("Verifier(HS256)")
    }
}

/// Whether `channel` is one of `granted`: an exact name, or a prefix ending in `*`.
pub fn grants(granted: &[String], channel: &str) -> bool {
    granted.iter().any(|g| match g.strip_suffix('*') {
        Some(prefix) => channel.starts_with(prefix),
        None => g == channel,
    })
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Verifier {
    pub fn new(secret: &str) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        // Exactly HS256; expiry to the second, with no grace.
        validation.algorithms = vec![Algorithm::HS256];
        validation.leeway = 0;
        validation.validate_exp = true;
        validation.set_required_spec_claims(&["exp"]);
        Verifier {
            key: DecodingKey::from_secret(secret.as_bytes()),
            validation,
        }
    }

    /// Checks `token` for a subscription to `channel` at `now` (Unix seconds).
    pub fn check(&self, token: &str, channel: &str, now: u64) -> Result<Grant, AuthError> {
        let bad = |why: String| AuthError::Unauthorized(format!("invalid token: {why}"));
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthError::Unauthorized("token expired".into()),
                ErrorKind::InvalidSignature => bad("bad signature".into()),
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
                    bad("only HS256 is accepted".into())
                }
                ErrorKind::MissingRequiredClaim(claim) => bad(format!("no '{claim}' claim")),
                ErrorKind::Json(e) => bad(format!("claims: {e}")),
                _ => bad(e.to_string()),
            },
        )?;
        let claims = data.claims;
        // The library checks `exp` too; this keeps the rule in one visible place.
        if claims.exp <= now {
            return Err(AuthError::Unauthorized("token expired".into()));
        }
        if !grants(&claims.channels, channel) {
            return Err(AuthError::Forbidden(format!(
                "the token does not grant channel '{channel}'"
            )));
        }
        let name = match claims.sub {
            None => None,
            Some(sub) => match validate_client_name(&sub) {
                Ok(()) => Some(sub.into_boxed_str()),
                Err(e) => return Err(bad(format!("'sub' is not a usable name: {e}"))),
            },
        };
        Ok(Grant {
            expires: u32::try_from(claims.exp).unwrap_or(u32::MAX),
            name,
        })
    }
}

/// Whether a request's `Origin` may use the server: any when `allowed` is empty,
/// and a request without `Origin` (not from a browser page) always.
pub fn origin_allowed(allowed: &[String], origin: Option<&[u8]>) -> bool {
    match origin {
        None => true,
        Some(_) if allowed.is_empty() => true,
        Some(origin) => allowed
            .iter()
            .any(|a| a.as_bytes().eq_ignore_ascii_case(origin)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    const SECRET: &str = "test-secret";

    fn token(claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    fn b64(value: serde_json::Value) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
    }

    #[test]
    fn a_valid_token_grants_its_channels_and_names_its_holder() {
        let v = Verifier::new(SECRET);
        let now = now_secs();
        let t = token(json!({"exp": now + 60, "channels": ["news", "chat:*"], "sub": "alice"}));
        let grant = v.check(&t, "chat:lobby", now).unwrap();
        assert_eq!(grant.name.as_deref(), Some("alice"));
        assert_eq!(u64::from(grant.expires), now + 60);
        assert!(v.check(&t, "news", now).is_ok());
        let err = v.check(&t, "sports", now).unwrap_err();
        assert_eq!(err.status(), 403);
        assert!(
            v.check(&t, "newsroom", now).is_err(),
            "exact names are exact"
        );
    }

    #[test]
    fn every_bad_token_is_refused_with_its_reason() {
        let v = Verifier::new(SECRET);
        let now = now_secs();
        let expired = token(json!({"exp": now - 1, "channels": ["*"]}));
        assert_eq!(
            v.check(&expired, "x", now).unwrap_err().to_string(),
            "token expired"
        );
        let no_exp = token(json!({"channels": ["*"]}));
        assert!(
            v.check(&no_exp, "x", now)
                .unwrap_err()
                .to_string()
                .contains("exp")
        );
        let no_channels = token(json!({"exp": now + 60}));
        assert!(
            v.check(&no_channels, "x", now)
                .unwrap_err()
                .to_string()
                .contains("channels")
        );
        let other_secret = encode(
            &Header::new(Algorithm::HS256),
            &json!({"exp": now + 60, "channels": ["*"]}),
            &EncodingKey::from_secret(b"another"),
        )
        .unwrap();
        assert!(
            v.check(&other_secret, "x", now)
                .unwrap_err()
                .to_string()
                .contains("signature")
        );
        let hs512 = encode(
            &Header::new(Algorithm::HS512),
            &json!({"exp": now + 60, "channels": ["*"]}),
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        assert!(
            v.check(&hs512, "x", now)
                .unwrap_err()
                .to_string()
                .contains("HS256")
        );
        // alg: none, no signature at all.
        let none = format!(
            "{}.{}.",
            b64(json!({"alg": "none", "typ": "JWT"})),
            b64(json!({"exp": now + 60, "channels": ["*"]}))
        );
        assert_eq!(v.check(&none, "x", now).unwrap_err().status(), 401);
        let bad_sub = token(json!({"exp": now + 60, "channels": ["*"], "sub": "a b"}));
        assert!(
            v.check(&bad_sub, "x", now)
                .unwrap_err()
                .to_string()
                .contains("sub")
        );
        for garbage in ["", "a.b.c", "not a token", "...."] {
            assert_eq!(v.check(garbage, "x", now).unwrap_err().status(), 401);
        }
    }

    #[test]
    fn origins() {
        let allowed = vec!["https://app.example".to_string()];
        assert!(origin_allowed(&allowed, None));
        assert!(origin_allowed(&allowed, Some(b"https://APP.example")));
        assert!(!origin_allowed(&allowed, Some(b"https://evil.example")));
        assert!(origin_allowed(&[], Some(b"https://anything")));
    }

    #[test]
    fn wildcards() {
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(grants(&g(&["*"]), "anything"));
        assert!(grants(&g(&["chat:*"]), "chat:"));
        assert!(!grants(&g(&["chat:*"]), "chatter"));
        assert!(!grants(&g(&[]), "x"));
    }
}
