//! The RFC 6455 opening handshake, without I/O: what makes an HTTP request a valid
//! WebSocket upgrade (§4.2.1), the accept key, and the 101 answer.
//!
//! It must not decide routes or limits, and leaves HTTP itself (parsing heads,
//! writing responses) to [`super::http`].

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha1::{Digest, Sha1};

use super::http::Request;

/// The GUID every accept key is derived with (§1.3).
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A defect that makes a request not a valid WebSocket upgrade.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("WebSocket upgrade needs HTTP/1.1")]
    NotHttp11,
    #[error("WebSocket upgrade needs method GET")]
    NotGet,
    #[error("missing Host header")]
    MissingHost,
    #[error("Upgrade header must be 'websocket'")]
    BadUpgrade,
    #[error("Connection header must contain the 'upgrade' token")]
    BadConnection,
    #[error("missing Sec-WebSocket-Version header")]
    MissingVersion,
    #[error("unsupported Sec-WebSocket-Version (only 13 is supported)")]
    UnsupportedVersion,
    #[error("missing Sec-WebSocket-Key header")]
    MissingKey,
    #[error("Sec-WebSocket-Key must be base64 of 16 bytes")]
    BadKey,
}

impl HandshakeError {
    /// The HTTP status to refuse with: 426 tells the client which version we speak
    /// (§4.2.2), 405 names the method, everything else is a 400.
    pub fn status(&self) -> u16 {
        match self {
            HandshakeError::UnsupportedVersion => 426,
            HandshakeError::NotGet => 405,
            _ => 400,
        }
    }
}

/// Validates an upgrade request (§4.2.1) and returns the `Sec-WebSocket-Accept` value.
/// Subprotocols are declined by not echoing them; extensions are the transport's
/// to accept (permessage-deflate, `super::deflate`).
pub fn validate_upgrade(req: &Request<'_>) -> Result<[u8; 28], HandshakeError> {
    if req.minor_version < 1 {
        return Err(HandshakeError::NotHttp11);
    }
    if req.method != "GET" {
        return Err(HandshakeError::NotGet);
    }
    if req.header("host").is_none() {
        return Err(HandshakeError::MissingHost);
    }
    if !req.header_has_token("upgrade", "websocket") {
        return Err(HandshakeError::BadUpgrade);
    }
    if !req.header_has_token("connection", "upgrade") {
        return Err(HandshakeError::BadConnection);
    }
    match req.header("sec-websocket-version") {
        None => return Err(HandshakeError::MissingVersion),
        Some(v) if v.trim_ascii() != b"13" => return Err(HandshakeError::UnsupportedVersion),
        Some(_) => {}
    }
    let key = req
        .header("sec-websocket-key")
        .ok_or(HandshakeError::MissingKey)?
        .trim_ascii();
    match BASE64.decode(key) {
        Ok(raw) if raw.len() == 16 => {}
        _ => return Err(HandshakeError::BadKey),
    }
    Ok(accept_key(key))
}

/// `base64(sha1(key + GUID))` (§4.2.2).
pub fn accept_key(key: &[u8]) -> [u8; 28] {
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(WEBSOCKET_GUID);
    let digest = sha.finalize();
    let mut out = [0u8; 28];
    // 20 bytes always encode to exactly 28 base64 characters.
    let written = BASE64
        .encode_slice(digest.as_slice(), &mut out)
        .unwrap_or_default();
    debug_assert_eq!(written, 28);
    out
}

/// Appends the 101 response that completes the handshake, accepting the
/// extensions in `extensions` (a `Sec-WebSocket-Extensions` value) if any.
pub fn write_switching_protocols(out: &mut Vec<u8>, accept: &[u8; 28], extensions: Option<&str>) {
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    out.extend_from_slice(accept);
    if let Some(extensions) = extensions {
        out.extend_from_slice(b"\r\nSec-WebSocket-Extensions: ");
        out.extend_from_slice(extensions.as_bytes());
    }
    out.extend_from_slice(b"\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::http::parse_request;

    fn request(raw: &str) -> Result<[u8; 28], HandshakeError> {
        let (req, _) = parse_request(raw.as_bytes()).unwrap().unwrap();
        validate_upgrade(&req)
    }

    const GOOD: &str = "GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn accept_key_matches_rfc_example() {
        assert_eq!(
            &accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
    #[test]
    fn valid_upgrade_is_accepted() {
        assert_eq!(&request(GOOD).unwrap(), b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
    #[test]
    fn headers_are_case_insensitive_and_connection_is_a_list() {
        let raw = "GET / HTTP/1.1\r\nhost: x\r\nupgrade: WebSocket\r\nconnection: keep-alive, UPGRADE\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n";
        assert!(request(raw).is_ok());
    }
    #[test]
    fn an_upgrade_without_host_is_refused_when_its_head_is_parsed() {
        // HTTP/1.1 needs Host: the head parser refuses it before any handshake.
        let raw = GOOD.replace("Host: x\r\n", "");
        assert!(parse_request(raw.as_bytes()).is_err());
    }
    #[test]
    fn each_defect_has_its_own_error() {
        let cases = [
            (
                GOOD.replace("HTTP/1.1", "HTTP/1.0"),
                HandshakeError::NotHttp11,
            ),
            (GOOD.replace("GET", "POST"), HandshakeError::NotGet),
            (
                GOOD.replace("Upgrade: websocket", "Upgrade: h2c"),
                HandshakeError::BadUpgrade,
            ),
            (
                GOOD.replace("Connection: Upgrade", "Connection: keep-alive"),
                HandshakeError::BadConnection,
            ),
            (
                GOOD.replace("Sec-WebSocket-Version: 13\r\n", ""),
                HandshakeError::MissingVersion,
            ),
            (
                GOOD.replace("Version: 13", "Version: 8"),
                HandshakeError::UnsupportedVersion,
            ),
            (
                GOOD.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""),
                HandshakeError::MissingKey,
            ),
            (
                GOOD.replace("dGhlIHNhbXBsZSBub25jZQ==", "c2hvcnQ="),
                HandshakeError::BadKey,
            ),
            (
                GOOD.replace("dGhlIHNhbXBsZSBub25jZQ==", "not base64!!"),
                HandshakeError::BadKey,
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(request(&raw), Err(expected.clone()), "{raw}");
        }
        assert_eq!(HandshakeError::UnsupportedVersion.status(), 426);
        assert_eq!(HandshakeError::BadKey.status(), 400);
    }
}
