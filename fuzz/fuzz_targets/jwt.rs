//! Subscription tokens (`auth::Verifier::check`): whatever a client sends as a
//! token, the answer is a grant only when the token is an HS256 JWT signed with
//! the server's secret whose claims grant the channel, have begun (`nbf`) and have
//! not expired.
//!
//! Input: a mode byte, then data. Modes:
//! - 0: the data as the token, as sent (mostly garbage: must be refused, never panic);
//! - 1: the data split into a header and a claims text, both base64url-encoded and
//!   signed with the right secret (HMAC-SHA256): a grant must come only for a header
//!   saying `"alg":"HS256"` and claims the reference rules accept;
//! - 2: well-formed claims built from the data (`exp` around now, channel patterns,
//!   an optional `sub`), encoded by the `jsonwebtoken` crate: a grant must come
//!   exactly when the reference rules say so, with the right name and expiry.

#![no_main]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use throng::auth::{AuthError, Verifier, Wildcards, grants};
use throng::rules::validate_client_name;

const SECRET: &str = "fuzzing-secret-of-at-least-32-bytes!";
const CHANNEL: &str = "chat:lobby";
const NOW: u64 = 1_800_000_000;

/// What the reference rules make of a claims object: `Some(name)` for a grant.
fn reference(claims: &Value) -> Option<Option<String>> {
    let obj = claims.as_object()?;
    let exp = obj.get("exp")?.as_u64()?;
    if exp <= NOW {
        return None;
    }
    let channels: Vec<String> = obj
        .get("channels")?
        .as_array()?
        .iter()
        .map(|c| c.as_str().map(String::from))
        .collect::<Option<_>>()?;
    match obj.get("nbf") {
        None | Some(Value::Null) => {}
        Some(nbf) if nbf.as_u64()? <= NOW => {}
        Some(_) => return None,
    }
    if !grants(&channels, CHANNEL, Wildcards::Cover) {
        return None;
    }
    match obj.get("sub") {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) if validate_client_name(s).is_ok() => Some(Some(s.clone())),
        Some(_) => None,
    }
}

fn check(verifier: &Verifier, token: &str) -> Result<throng::auth::Grant, AuthError> {
    let result = verifier.check(token, CHANNEL, NOW, Wildcards::Cover);
    if let Err(e) = &result {
        assert!(matches!(e.status(), 401 | 403), "{e:?}");
        assert!(!e.to_string().is_empty());
    }
    result
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let verifier = Verifier::new(SECRET);
    match mode % 3 {
        0 => {
            let token = String::from_utf8_lossy(data);
            // Unsigned garbage: nothing can carry a valid signature by chance.
            assert!(check(&verifier, &token).is_err(), "granted {token:?}");
        }
        1 => {
            let text = String::from_utf8_lossy(data);
            let (header, claims) = text.split_once('\u{0}').unwrap_or((&text, "{}"));
            let signing_input = format!(
                "{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(claims)
            );
            let key = EncodingKey::from_secret(SECRET.as_bytes());
            let Ok(signature) =
                jsonwebtoken::crypto::sign(signing_input.as_bytes(), &key, Algorithm::HS256)
            else {
                return;
            };
            let token = format!("{signing_input}.{signature}");
            if let Ok(grant) = check(&verifier, &token) {
                let header: Value = serde_json::from_str(header).expect("granted: header is JSON");
                assert_eq!(header["alg"], "HS256", "granted with {header}");
                let claims: Value = serde_json::from_str(claims).expect("granted: claims are JSON");
                let name = reference(&claims).unwrap_or_else(|| panic!("granted {claims}"));
                assert_eq!(grant.name.as_deref(), name.as_deref());
            }
        }
        _ => {
            let text = String::from_utf8_lossy(data);
            let mut parts = text.split('\u{0}');
            let exp_offset = parts.next().map_or(0, |p| p.len() as i64) - 4;
            let sub = parts.next().filter(|s| !s.is_empty());
            let channels: Vec<&str> = parts.collect();
            let exp = (NOW as i64 + exp_offset * 1000) as u64;
            let mut claims = json!({"exp": exp, "channels": channels});
            if let Some(sub) = sub {
                claims["sub"] = json!(sub);
            }
            let token = jsonwebtoken::encode(
                &Header::new(Algorithm::HS256),
                &claims,
                &EncodingKey::from_secret(SECRET.as_bytes()),
            )
            .expect("encodes");
            let got = check(&verifier, &token);
            match (reference(&claims), got) {
                (Some(name), Ok(grant)) => {
                    assert_eq!(grant.name.as_deref(), name.as_deref());
                    assert_eq!(u64::from(grant.expires), exp.min(u64::from(u32::MAX)));
                }
                (None, Err(_)) => {}
                (want, got) => panic!("{claims}: reference {want:?}, server {got:?}"),
            }
        }
    }
});
