//! Who may subscribe: HS256 JSON Web Tokens (`--token-secret`) and browser origins
//! (`--allowed-origin`).
//!
//! A token grants channels (`channels`: names, or prefixes ending in `*`) from
//! its `nbf` (optional) until it expires (`exp`, required); its `sub` is the
//! client's name in chat. Only HS256 is
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
    /// Not before (Unix seconds): a token is refused until then.
    #[serde(default)]
    nbf: Option<u64>,
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

/// Whether `channel` is one of `granted`: an exact name, or a prefix ending in `*`
/// when `wildcards` may cover it (a Pusher app's channels are granted by name only:
/// `*` or `4242*` must not reach into an app's namespace).
pub fn grants(granted: &[String], channel: &str, wildcards: Wildcards) -> bool {
    granted.iter().any(|g| match g.strip_suffix('*') {
        Some(prefix) => wildcards == Wildcards::Cover && channel.starts_with(prefix),
        None => g == channel,
    })
}

/// Whether a token's prefix grants (`news*`) may cover a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wildcards {
    Cover,
    /// Only a grant of the channel's exact name counts.
    ExactOnly,
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
        // `nbf` is checked below against the caller's clock, as `exp` is kept in
        // one visible place too.
        validation.validate_nbf = false;
        validation.set_required_spec_claims(&["exp"]);
        Verifier {
            key: DecodingKey::from_secret(secret.as_bytes()),
            validation,
        }
    }

    /// Checks `token` for a subscription to `channel` at `now` (Unix seconds).
    pub fn check(
        &self,
        token: &str,
        channel: &str,
        now: u64,
        wildcards: Wildcards,
    ) -> Result<Grant, AuthError> {
        let bad = |why: String| AuthError::Unauthorized(format!("invalid token: {why}"));
        let not_yet = || AuthError::Unauthorized("token not valid yet (nbf)".into());
        if token.is_empty() {
            return Err(bad("the token is empty".into()));
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthError::Unauthorized("token expired".into()),
                ErrorKind::ImmatureSignature => not_yet(),
                ErrorKind::InvalidToken => {
                    bad("not a JWT: three base64url parts joined by '.' are expected".into())
                }
                ErrorKind::Base64(_) => bad("a part is not valid base64url".into()),
                ErrorKind::Utf8(_) => bad("a part is not UTF-8".into()),
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
        if claims.nbf.is_some_and(|nbf| nbf > now) {
            return Err(not_yet());
        }
        if !grants(&claims.channels, channel, wildcards) {
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
        Some(origin) => origin_listed(allowed, origin),
    }
}

/// Whether `origin` is one of the `--allowed-origin` list (case-insensitive).
pub fn origin_listed(allowed: &[String], origin: &[u8]) -> bool {
    allowed
        .iter()
        .any(|a| a.as_bytes().eq_ignore_ascii_case(origin))
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
        let grant = v.check(&t, "chat:lobby", now, Wildcards::Cover).unwrap();
        assert_eq!(grant.name.as_deref(), Some("alice"));
        assert_eq!(u64::from(grant.expires), now + 60);
        assert!(v.check(&t, "news", now, Wildcards::Cover).is_ok());
        let err = v.check(&t, "sports", now, Wildcards::Cover).unwrap_err();
        assert_eq!(err.status(), 403);
        assert!(
            v.check(&t, "newsroom", now, Wildcards::Cover).is_err(),
            "exact names are exact"
        );
    }

    #[test]
    fn every_bad_token_is_refused_with_its_reason() {
        let v = Verifier::new(SECRET);
        let now = now_secs();
        let expired = token(json!({"exp": now - 1, "channels": ["*"]}));
        assert_eq!(
            v.check(&expired, "x", now, Wildcards::Cover)
                .unwrap_err()
                .to_string(),
            "token expired"
        );
        let no_exp = token(json!({"channels": ["*"]}));
        assert!(
            v.check(&no_exp, "x", now, Wildcards::Cover)
                .unwrap_err()
                .to_string()
                .contains("exp")
        );
        let no_channels = token(json!({"exp": now + 60}));
        assert!(
            v.check(&no_channels, "x", now, Wildcards::Cover)
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
            v.check(&other_secret, "x", now, Wildcards::Cover)
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
            v.check(&hs512, "x", now, Wildcards::Cover)
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
        assert_eq!(
            v.check(&none, "x", now, Wildcards::Cover)
                .unwrap_err()
                .status(),
            401
        );
        let bad_sub = token(json!({"exp": now + 60, "channels": ["*"], "sub": "a b"}));
        assert!(
            v.check(&bad_sub, "x", now, Wildcards::Cover)
                .unwrap_err()
                .to_string()
                .contains("sub")
        );
        for garbage in ["", "a.b.c", "not a token", "...."] {
            let err = v.check(garbage, "x", now, Wildcards::Cover).unwrap_err();
            assert_eq!(err.status(), 401);
            // The reason is words, never a library's enum name.
            assert!(!err.to_string().contains("InvalidToken"), "{err}");
        }
        assert!(
            v.check("", "x", now, Wildcards::Cover)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        assert!(
            v.check("not a token", "x", now, Wildcards::Cover)
                .unwrap_err()
                .to_string()
                .contains("not a JWT")
        );
    }

    #[test]
    fn a_token_is_refused_before_its_nbf() {
        let v = Verifier::new(SECRET);
        let now = now_secs();
        let later = token(json!({"exp": now + 600, "nbf": now + 300, "channels": ["*"]}));
        let err = v.check(&later, "x", now, Wildcards::Cover).unwrap_err();
        assert_eq!(err.status(), 401);
        assert!(err.to_string().contains("not valid yet"), "{err}");
        let began = token(json!({"exp": now + 600, "nbf": now - 1, "channels": ["*"]}));
        assert!(v.check(&began, "x", now, Wildcards::Cover).is_ok());
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
        let cover = Wildcards::Cover;
        assert!(grants(&g(&["*"]), "anything", cover));
        assert!(grants(&g(&["chat:*"]), "chat:", cover));
        assert!(!grants(&g(&["chat:*"]), "chatter", cover));
        assert!(!grants(&g(&[]), "x", cover));
        // Where wildcards may not reach, only the exact name grants.
        let exact = Wildcards::ExactOnly;
        assert!(!grants(&g(&["*", "4242*", "4242:*"]), "4242:news", exact));
        assert!(grants(&g(&["*", "4242:news"]), "4242:news", exact));
    }
}
