//! Pusher's signatures: a subscriber's channel auth (`KEY:HMAC-SHA256(secret,
//! "socket_id:channel[:channel_data]")`) and the HTTP API's request signing
//! (`auth_key`, `auth_timestamp` within 600 s, `auth_version` 1.0, `body_md5`,
//! `auth_signature` over "METHOD\nPATH\nsorted query"), checked for the server
//! and made for a client ([`signed_query`], which `throng bench` publishes with).
//! Every comparison of a signature takes time that does not depend on where it
//! differs. Pure functions: no I/O, no clock (the caller passes the time).

use hmac::{KeyInit, Mac};
use md5::Digest;

use super::App;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How far a request's `auth_timestamp` may be from the server's clock.
pub const MAX_CLOCK_SKEW_SECS: u64 = 600;

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

fn mac(secret: &str, message: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(message);
    mac
}

/// HMAC-SHA256 of `message` under `secret`, in lowercase hex.
pub fn sign(secret: &str, message: &[u8]) -> String {
    hex(&mac(secret, message).finalize().into_bytes())
}

/// Whether `given` (hex) is the HMAC-SHA256 of `message` under `secret`.
pub fn verify(secret: &str, message: &[u8], given: &str) -> bool {
    unhex(given).is_some_and(|given| mac(secret, message).verify_slice(&given).is_ok())
}

/// What a subscriber signs for a private or presence channel.
fn channel_message(socket_id: &str, channel: &str, channel_data: Option<&str>) -> String {
    match channel_data {
        Some(data) => format!("{socket_id}:{channel}:{data}"),
        None => format!("{socket_id}:{channel}"),
    }
}

/// The `auth` a subscriber of a private or presence channel must give.
pub fn channel_auth(
    app: &App,
    socket_id: &str,
    channel: &str,
    channel_data: Option<&str>,
) -> String {
    let message = channel_message(socket_id, channel, channel_data);
    format!("{}:{}", app.key, sign(&app.secret, message.as_bytes()))
}

/// Why a subscription's or a request's signature is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("auth is KEY:SIGNATURE; got none")]
    Missing,
    #[error("auth names key '{0}', not this app's")]
    WrongKey(String),
    #[error("invalid signature: expected HMAC-SHA256 hex of '{0}'")]
    Signature(String),
    #[error("missing query parameter {0}")]
    MissingParam(&'static str),
    #[error("auth_version must be 1.0")]
    Version,
    #[error(
        "auth_timestamp {given} is not within {MAX_CLOCK_SKEW_SECS} s of the server's time {now}"
    )]
    Stale { given: String, now: u64 },
    #[error("body_md5 does not match the body")]
    BodyMd5,
}

/// Checks a subscriber's `auth` for `channel`.
pub fn check_channel_auth(
    app: &App,
    socket_id: &str,
    channel: &str,
    channel_data: Option<&str>,
    auth: Option<&str>,
) -> Result<(), SignError> {
    check_auth(app, channel_message(socket_id, channel, channel_data), auth)
}

/// Checks a `pusher:signin`'s `auth` (`KEY:HMAC-SHA256(secret,
/// "socket_id::user::user_data")`).
pub fn check_signin(
    app: &App,
    socket_id: &str,
    user_data: &str,
    auth: Option<&str>,
) -> Result<(), SignError> {
    check_auth(app, format!("{socket_id}::user::{user_data}"), auth)
}

/// Checks that `auth` is `KEY:` and the app's signature of `message`.
fn check_auth(app: &App, message: String, auth: Option<&str>) -> Result<(), SignError> {
    let (key, signature) = auth
        .and_then(|a| a.split_once(':'))
        .ok_or(SignError::Missing)?;
    if key != &*app.key {
        return Err(SignError::WrongKey(key.chars().take(64).collect()));
    }
    if verify(&app.secret, message.as_bytes(), signature) {
        Ok(())
    } else {
        Err(SignError::Signature(message))
    }
}

/// One signed API request: its method, path, decoded query pairs and body.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a [(String, String)],
    pub body: &'a [u8],
}

impl Request<'_> {
    fn param(&self, name: &'static str) -> Result<&str, SignError> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .ok_or(SignError::MissingParam(name))
    }

    /// "METHOD\nPATH\nk=v&…", the query sorted by key, keys lowercase, without
    /// `auth_signature`.
    pub fn string_to_sign(&self) -> String {
        let mut pairs: Vec<(String, &str)> = self
            .query
            .iter()
            .filter(|(k, _)| k != "auth_signature")
            .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
            .collect();
        pairs.sort();
        let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}\n{}\n{}", self.method, self.path, query.join("&"))
    }
}

/// The key a request says it is signed with (`auth_key`), to find its app.
pub fn request_key<'a>(req: &Request<'a>) -> Result<&'a str, SignError> {
    req.query
        .iter()
        .find(|(k, _)| k == "auth_key")
        .map(|(_, v)| v.as_str())
        .ok_or(SignError::MissingParam("auth_key"))
}

/// Checks a request's signature by `app` at `now` (Unix seconds).
pub fn check_request(app: &App, req: &Request<'_>, now: u64) -> Result<(), SignError> {
    let key = req.param("auth_key")?;
    if key != &*app.key {
        return Err(SignError::WrongKey(key.chars().take(64).collect()));
    }
    let timestamp = req.param("auth_timestamp")?;
    let fresh = timestamp
        .parse::<u64>()
        .is_ok_and(|t| t.abs_diff(now) <= MAX_CLOCK_SKEW_SECS);
    if !fresh {
        return Err(SignError::Stale {
            given: timestamp.chars().take(24).collect(),
            now,
        });
    }
    if req.param("auth_version")? != "1.0" {
        return Err(SignError::Version);
    }
    if !req.body.is_empty() || req.query.iter().any(|(k, _)| k == "body_md5") {
        let given = req.param("body_md5")?;
        if !given.eq_ignore_ascii_case(&hex(&md5::Md5::digest(req.body))) {
            return Err(SignError::BodyMd5);
        }
    }
    let signature = req.param("auth_signature")?;
    let message = req.string_to_sign();
    if verify(&app.secret, message.as_bytes(), signature) {
        Ok(())
    } else {
        Err(SignError::Signature(message))
    }
}

/// The query string that signs a request to the HTTP API by `app` at `timestamp`
/// (Unix seconds): `auth_key`, `auth_timestamp`, `auth_version`, `body_md5` (when
/// there is a body) and `auth_signature`, as Pusher's SDKs send them. `path` is
/// the request's path without its query. The values need no percent-encoding:
/// app keys are `A-Z a-z 0-9 _ - .` and the rest are digits and hex.
pub fn signed_query(app: &App, method: &str, path: &str, body: &[u8], timestamp: u64) -> String {
    let mut query: Vec<(String, String)> = vec![
        ("auth_key".into(), app.key.to_string()),
        ("auth_timestamp".into(), timestamp.to_string()),
        ("auth_version".into(), "1.0".into()),
    ];
    if !body.is_empty() {
        query.push(("body_md5".into(), hex(&md5::Md5::digest(body))));
    }
    let request = Request {
        method,
        path,
        query: &query,
        body,
    };
    let signature = sign(&app.secret, request.string_to_sign().as_bytes());
    let mut out: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    out.push(format!("auth_signature={signature}"));
    out.join("&")
}

/// A query string's pairs, percent-decoded (`+` is a space); `None` when an
/// escape is broken or a value is not UTF-8.
pub fn decode_query(query: &str) -> Option<Vec<(String, String)>> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let pair = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(pair, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> App {
        "3:278d425bdf160c739803:7ad3773142a6692b25b8"
            .parse()
            .unwrap()
    }

    #[test]
    fn private_channel_auth_matches_pushers_documented_example() {
        // From Pusher's "Channel authorization" documentation.
        let auth = channel_auth(&app(), "1234.1234", "private-foobar", None);
        assert_eq!(
            auth,
            "278d425bdf160c739803:58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4"
        );
        assert!(
            check_channel_auth(&app(), "1234.1234", "private-foobar", None, Some(&auth)).is_ok()
        );
        let other = check_channel_auth(&app(), "1234.1235", "private-foobar", None, Some(&auth));
        assert!(matches!(other, Err(SignError::Signature(_))));
        let key = check_channel_auth(&app(), "1234.1234", "private-foobar", None, Some("k:00"));
        assert_eq!(key, Err(SignError::WrongKey("k".into())));
        assert_eq!(
            check_channel_auth(&app(), "1.1", "private-a", None, None),
            Err(SignError::Missing)
        );
    }

    #[test]
    fn presence_auth_signs_the_channel_data_too() {
        let data = r#"{"user_id":10,"user_info":{"name":"Mr. Channels"}}"#;
        let auth = channel_auth(&app(), "1234.1234", "presence-foobar", Some(data));
        assert_eq!(
            auth,
            "278d425bdf160c739803:31935e7d86dba64c2a90aed31fdc61869f9b22ba9d8863bba239c03ca481bc80"
        );
        let without = check_channel_auth(&app(), "1234.1234", "presence-foobar", None, Some(&auth));
        assert!(without.is_err());
    }

    #[test]
    fn api_requests_are_checked_like_pushers_documented_example() {
        // From Pusher's "HTTP API reference", "Worked example".
        let body = br#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#;
        let query: Vec<(String, String)> = [
            ("auth_key", "278d425bdf160c739803"),
            ("auth_timestamp", "1353088179"),
            ("auth_version", "1.0"),
            ("body_md5", "ec365a775a4cd0599faeb73354201b6f"),
            (
                "auth_signature",
                "da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c",
            ),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let req = Request {
            method: "POST",
            path: "/apps/3/events",
            query: &query,
            body,
        };
        assert_eq!(
            req.string_to_sign(),
            "POST\n/apps/3/events\nauth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0&body_md5=ec365a775a4cd0599faeb73354201b6f"
        );
        assert_eq!(check_request(&app(), &req, 1353088179 + 600), Ok(()));
        assert!(matches!(
            check_request(&app(), &req, 1353088179 + 601),
            Err(SignError::Stale { .. })
        ));
        let tampered = Request {
            body: br#"{"name":"foo","channels":["project-4"],"data":"{}"}"#,
            ..req
        };
        assert_eq!(
            check_request(&app(), &tampered, 1353088179),
            Err(SignError::BodyMd5)
        );
        let unsigned = Request {
            query: &query[..4],
            ..req
        };
        assert_eq!(
            check_request(&app(), &unsigned, 1353088179),
            Err(SignError::MissingParam("auth_signature"))
        );
    }

    #[test]
    fn a_client_signs_requests_as_pushers_documented_example_and_the_server_accepts_them() {
        // The "Worked example" of Pusher's HTTP API reference, signed from scratch.
        let body = br#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#;
        let query = signed_query(&app(), "POST", "/apps/3/events", body, 1353088179);
        assert_eq!(
            query,
            "auth_key=278d425bdf160c739803&auth_timestamp=1353088179&auth_version=1.0\
             &body_md5=ec365a775a4cd0599faeb73354201b6f\
             &auth_signature=da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c"
        );
        let pairs = decode_query(&query).unwrap();
        let req = Request {
            method: "POST",
            path: "/apps/3/events",
            query: &pairs,
            body,
        };
        assert_eq!(check_request(&app(), &req, 1353088179), Ok(()));
        // Without a body there is no body_md5, and the server takes that too.
        let get = signed_query(&app(), "GET", "/apps/3/channels", b"", 1353088179);
        assert!(!get.contains("body_md5"), "{get}");
        let pairs = decode_query(&get).unwrap();
        let req = Request {
            method: "GET",
            path: "/apps/3/channels",
            query: &pairs,
            body: b"",
        };
        assert_eq!(check_request(&app(), &req, 1353088179), Ok(()));
    }

    #[test]
    fn queries_are_percent_decoded() {
        assert_eq!(
            decode_query("a=b%20c&d=e+f&g"),
            Some(vec![
                ("a".into(), "b c".into()),
                ("d".into(), "e f".into()),
                ("g".into(), "".into())
            ])
        );
        assert_eq!(decode_query("a=%zz"), None);
        assert_eq!(decode_query("a=%f"), None);
        assert_eq!(decode_query("a=%ff"), None);
    }
}
