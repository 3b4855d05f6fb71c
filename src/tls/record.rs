//! The TLS record layer after the handshake: sealing what a connection sends and
//! opening what it receives, for TLS 1.3 and TLS 1.2 with AES-GCM or
//! ChaCha20-Poly1305 (the suites rustls's ring provider negotiates).
//!
//! rustls does the handshake and hands the traffic keys over
//! (`dangerous_into_kernel_connection`); a [`Session`] then keeps, per
//! direction, the raw key, the IV and the sequence number, about a hundred bytes,
//! and builds the AEAD key object only while it seals or opens (a few hundred
//! nanoseconds), instead of keeping ring's 544-byte key per direction for every
//! idle connection. Under TLS 1.3 the two traffic secrets are kept too (boxed,
//! [`TrafficSecrets`]) for key updates, the one thing after the handshake that
//! needs them.
//!
//! It works on the caller's buffers and keeps none; it must not touch sockets,
//! and it does not know what the plaintext means.

use super::traffic::{IV_LEN, TrafficSecrets};
use ring::aead;
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets, ProtocolVersion};

/// Most plaintext in one record (RFC 8446 §5.1, RFC 5246 §6.2.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Most ciphertext a TLS 1.3 record may carry (RFC 8446 §5.2).
const MAX_CIPHERTEXT_13: usize = MAX_PLAINTEXT + 256;
/// Most ciphertext a TLS 1.2 record may carry (RFC 5246 §6.2.3).
const MAX_CIPHERTEXT_12: usize = MAX_PLAINTEXT + 2048;
/// A record's header: type, legacy version, length.
pub const HEADER: usize = 5;
/// AEAD tag length of every suite here.
const TAG: usize = 16;
/// TLS 1.2 AES-GCM's explicit nonce, sent in each record.
const EXPLICIT_NONCE: usize = 8;

mod content {
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    pub const ALERT: u8 = 21;
    pub const HANDSHAKE: u8 = 22;
    pub const APPLICATION_DATA: u8 = 23;
}

/// Alert descriptions this layer sends or reads (RFC 8446 §6).
pub mod alert {
    pub const CLOSE_NOTIFY: u8 = 0;
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    pub const BAD_RECORD_MAC: u8 = 20;
    pub const RECORD_OVERFLOW: u8 = 22;
    pub const DECODE_ERROR: u8 = 50;
    pub const INTERNAL_ERROR: u8 = 80;
}

const HANDSHAKE_KEY_UPDATE: u8 = 24;

/// Why a connection's records cannot go on; the alert to tell the peer, if any.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("a record failed authentication (bad_record_mac)")]
    BadRecordMac,
    #[error("a record is longer than TLS allows ({0} bytes)")]
    Overflow(usize),
    #[error("unexpected TLS message: {0}")]
    Unexpected(&'static str),
    #[error("malformed TLS message: {0}")]
    Malformed(&'static str),
    #[error("the peer sent a fatal alert ({0})")]
    PeerAlert(u8),
    #[error("the connection's sequence numbers are used up")]
    Exhausted,
    #[error("key update refused: {0}")]
    KeyUpdate(String),
    #[error("cipher suite or version not handled by the record layer: {0}")]
    Unsupported(&'static str),
}

impl RecordError {
    /// The alert to send before closing (none after the peer's own alert).
    pub fn alert(&self) -> Option<u8> {
        Some(match self {
            RecordError::BadRecordMac => alert::BAD_RECORD_MAC,
            RecordError::Overflow(_) => alert::RECORD_OVERFLOW,
            RecordError::Unexpected(_) => alert::UNEXPECTED_MESSAGE,
            RecordError::Malformed(_) => alert::DECODE_ERROR,
            RecordError::PeerAlert(_) => return None,
            RecordError::Exhausted | RecordError::KeyUpdate(_) | RecordError::Unsupported(_) => {
                alert::INTERNAL_ERROR
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Cipher {
    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::Aes128Gcm => &aead::AES_128_GCM,
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }

    /// TLS 1.2 AES-GCM sends part of its nonce in each record.
    fn explicit_nonce(self, version: Version) -> usize {
        match (version, self) {
            (Version::Tls12, Cipher::Aes128Gcm | Cipher::Aes256Gcm) => EXPLICIT_NONCE,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    Tls12,
    Tls13,
}

/// One direction's keys: what an idle connection keeps of them.
struct Direction {
    cipher: Cipher,
    key: [u8; 32],
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

impl std::fmt::Debug for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys stay out of logs.
        f.debug_struct("Direction")
            .field("cipher", &self.cipher)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Drop for Direction {
    fn drop(&mut self) {
        // Key bytes do not outlive the connection in freed memory.
        for b in self.key.iter_mut().chain(self.iv.iter_mut()) {
            // SAFETY: `b` is a valid, aligned, exclusive reference to a u8.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl Direction {
    fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> Result<Direction, RecordError> {
        let (cipher, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (Cipher::Chacha20Poly1305, key, iv)
            }
            _ => {
                return Err(RecordError::Unsupported(
                    "a cipher other than AES-GCM or ChaCha20",
                ));
            }
        };
        let (key, iv) = (key.as_ref(), iv.as_ref());
        if key.len() != cipher.algorithm().key_len() || iv.len() != aead::NONCE_LEN {
            return Err(RecordError::Unsupported(
                "key or IV of an unexpected length",
            ));
        }
        let mut direction = Direction {
            cipher,
            key: [0; 32],
            iv: [0; aead::NONCE_LEN],
            seq,
        };
        direction.key[..key.len()].copy_from_slice(key);
        direction.iv.copy_from_slice(iv);
        Ok(direction)
    }

    /// The same cipher under new keys, from sequence number 0 (a key update).
    fn rekeyed(&self, key: &[u8], iv: &[u8; aead::NONCE_LEN]) -> Direction {
        let mut direction = Direction {
            cipher: self.cipher,
            key: [0; 32],
            iv: *iv,
            seq: 0,
        };
        direction.key[..key.len()].copy_from_slice(key);
        direction
    }

    /// The AEAD key, built for this use only.
    fn aead_key(&self) -> Result<aead::LessSafeKey, RecordError> {
        let algorithm = self.cipher.algorithm();
        aead::UnboundKey::new(algorithm, &self.key[..algorithm.key_len()])
            .map(aead::LessSafeKey::new)
            .map_err(|_| RecordError::Unsupported("ring refused the key"))
    }

    /// The IV with the sequence number folded in (RFC 8446 §5.3; TLS 1.2's
    /// ChaCha20 does the same, and its AES-GCM sends the last 8 bytes).
    fn nonce_bytes(&self) -> [u8; aead::NONCE_LEN] {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    fn advance(&mut self) -> Result<(), RecordError> {
        self.seq = self.seq.checked_add(1).ok_or(RecordError::Exhausted)?;
        Ok(())
    }
}

/// What opening a run of records did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Bytes of the input that were whole records (a partial one is left).
    pub consumed: usize,
    /// The peer sent close_notify: it sends nothing more.
    pub peer_closed: bool,
}

/// A connection's record layer once its handshake is done.
pub struct Session {
    version: Version,
    tx: Direction,
    rx: Direction,
    /// For TLS 1.3 key updates; `None` under TLS 1.2, which has none.
    traffic: Option<Box<TrafficSecrets>>,
    peer_closed: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("version", &self.version)
            .field("tx", &self.tx)
            .field("rx", &self.rx)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Takes over from rustls: the negotiated version, the traffic keys and,
    /// under TLS 1.3, the traffic secrets (see [`Handshake::finish`]).
    ///
    /// [`Handshake::finish`]: super::handshake::Handshake::finish
    pub fn new(
        version: ProtocolVersion,
        secrets: ExtractedSecrets,
        traffic: Option<TrafficSecrets>,
    ) -> Result<Session, RecordError> {
        let version = match version {
            ProtocolVersion::TLSv1_3 => Version::Tls13,
            ProtocolVersion::TLSv1_2 => Version::Tls12,
            _ => {
                return Err(RecordError::Unsupported(
                    "a version other than TLS 1.2 or 1.3",
                ));
            }
        };
        let traffic = match (version, traffic) {
            (Version::Tls13, Some(traffic)) => Some(Box::new(traffic)),
            (Version::Tls13, None) => {
                return Err(RecordError::Unsupported(
                    "TLS 1.3 without its traffic secrets",
                ));
            }
            (Version::Tls12, _) => None,
        };
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        Ok(Session {
            version,
            tx: Direction::new(tx_seq, tx)?,
            rx: Direction::new(rx_seq, rx)?,
            traffic,
            peer_closed: false,
        })
    }

    /// Whether the peer said close_notify.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Appends `plain` to `out` as application-data records.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        if plain.is_empty() {
            return Ok(());
        }
        let key = self.tx.aead_key()?;
        for chunk in plain.chunks(MAX_PLAINTEXT) {
            self.seal_one(&key, content::APPLICATION_DATA, chunk, out)?;
        }
        Ok(())
    }

    /// How many bytes sealing `plain` adds to `out`.
    pub fn sealed_len(&self, plain: usize) -> usize {
        let records = plain.div_ceil(MAX_PLAINTEXT);
        plain + records * self.overhead()
    }

    /// Bytes each record adds to its plaintext.
    fn overhead(&self) -> usize {
        let inner_type = usize::from(self.version == Version::Tls13);
        HEADER + self.tx.cipher.explicit_nonce(self.version) + inner_type + TAG
    }

    /// Appends an alert record (close_notify is a warning, the rest fatal).
    pub fn seal_alert(&mut self, description: u8, out: &mut Vec<u8>) -> Result<(), RecordError> {
        let level = if description == alert::CLOSE_NOTIFY {
            1
        } else {
            2
        };
        let key = self.tx.aead_key()?;
        self.seal_one(&key, content::ALERT, &[level, description], out)
    }

    fn seal_one(
        &mut self,
        key: &aead::LessSafeKey,
        content_type: u8,
        chunk: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let nonce = self.tx.nonce_bytes();
        let explicit = self.tx.cipher.explicit_nonce(self.version);
        let start = out.len();
        match self.version {
            Version::Tls13 => {
                let length = chunk.len() + 1 + TAG;
                let header = header(content::APPLICATION_DATA, length);
                out.extend_from_slice(&header);
                out.extend_from_slice(chunk);
                out.push(content_type);
                let tag = key
                    .seal_in_place_separate_tag(
                        aead::Nonce::assume_unique_for_key(nonce),
                        aead::Aad::from(header),
                        &mut out[start + HEADER..],
                    )
                    .map_err(|_| RecordError::Unsupported("ring refused to seal"))?;
                out.extend_from_slice(tag.as_ref());
            }
            Version::Tls12 => {
                let length = explicit + chunk.len() + TAG;
                out.extend_from_slice(&header(content_type, length));
                out.extend_from_slice(&nonce[aead::NONCE_LEN - explicit..]);
                out.extend_from_slice(chunk);
                let aad = aad12(self.tx.seq, content_type, chunk.len());
                let tag = key
                    .seal_in_place_separate_tag(
                        aead::Nonce::assume_unique_for_key(nonce),
                        aead::Aad::from(aad),
                        &mut out[start + HEADER + explicit..],
                    )
                    .map_err(|_| RecordError::Unsupported("ring refused to seal"))?;
                out.extend_from_slice(tag.as_ref());
            }
        }
        self.tx.advance()
    }

    /// Opens the whole records at the start of `input` (in place), appending
    /// their application data to `plain`; answers a TLS 1.3 key update that asks
    /// for one by appending this side's to `out`. A partial record at the end is
    /// left for the next call.
    pub fn open(
        &mut self,
        input: &mut [u8],
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Opened, RecordError> {
        let mut opened = Opened::default();
        let mut key = None;
        while !self.peer_closed {
            let rest = &mut input[opened.consumed..];
            if rest.len() < HEADER {
                break;
            }
            let outer = rest[0];
            let length = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            let most = match self.version {
                Version::Tls13 => MAX_CIPHERTEXT_13,
                Version::Tls12 => MAX_CIPHERTEXT_12,
            };
            if length > most {
                return Err(RecordError::Overflow(length));
            }
            if rest[1] != 3 {
                return Err(RecordError::Malformed("record version is not 3.x"));
            }
            if rest.len() < HEADER + length {
                break;
            }
            let record = &mut rest[..HEADER + length];
            if key.is_none() {
                key = Some(self.rx.aead_key()?);
            }
            let Some(aead_key) = key.as_ref() else {
                return Err(RecordError::Unsupported("no key"));
            };
            let (content_type, body) = self.open_one(aead_key, outer, record)?;
            opened.consumed += HEADER + length;
            match content_type {
                content::APPLICATION_DATA => plain.extend_from_slice(body),
                content::ALERT => {
                    let [_level, description] = body else {
                        return Err(RecordError::Malformed("an alert is two bytes"));
                    };
                    if *description != alert::CLOSE_NOTIFY {
                        return Err(RecordError::PeerAlert(*description));
                    }
                    self.peer_closed = true;
                    opened.peer_closed = true;
                }
                content::HANDSHAKE => {
                    let request = key_update(body, self.version)?;
                    self.take_key_update(request, out)?;
                    // The receiving key changed: build it anew for the next record.
                    key = None;
                }
                _ => {
                    return Err(RecordError::Unexpected(
                        "a record of an unknown content type",
                    ));
                }
            }
        }
        Ok(opened)
    }

    /// Opens one whole record; its content type and plaintext.
    fn open_one<'a>(
        &mut self,
        key: &aead::LessSafeKey,
        outer: u8,
        record: &'a mut [u8],
    ) -> Result<(u8, &'a [u8]), RecordError> {
        let (header_bytes, fragment) = record.split_at_mut(HEADER);
        let mut nonce = self.rx.nonce_bytes();
        let opened = match self.version {
            Version::Tls13 => {
                if outer != content::APPLICATION_DATA {
                    // A change_cipher_spec after the handshake, or plaintext.
                    return Err(RecordError::Unexpected(
                        "an unprotected record after the handshake",
                    ));
                }
                if fragment.len() < TAG + 1 {
                    return Err(RecordError::Malformed("a record shorter than its tag"));
                }
                let aad: [u8; HEADER] = [
                    header_bytes[0],
                    header_bytes[1],
                    header_bytes[2],
                    header_bytes[3],
                    header_bytes[4],
                ];
                let inner = key
                    .open_in_place(
                        aead::Nonce::assume_unique_for_key(nonce),
                        aead::Aad::from(aad),
                        fragment,
                    )
                    .map_err(|_| RecordError::BadRecordMac)?;
                // The real type is the last non-zero byte; zeros after it are padding.
                let Some(at) = inner.iter().rposition(|&b| b != 0) else {
                    return Err(RecordError::Unexpected("a record of padding only"));
                };
                let content_type = inner[at];
                (content_type, &inner[..at])
            }
            Version::Tls12 => {
                if outer == content::CHANGE_CIPHER_SPEC {
                    return Err(RecordError::Unexpected(
                        "change_cipher_spec after the handshake",
                    ));
                }
                let explicit = self.rx.cipher.explicit_nonce(self.version);
                if fragment.len() < explicit + TAG {
                    return Err(RecordError::Malformed("a record shorter than its tag"));
                }
                if explicit > 0 {
                    nonce[aead::NONCE_LEN - explicit..].copy_from_slice(&fragment[..explicit]);
                }
                let aad = aad12(self.rx.seq, outer, fragment.len() - explicit - TAG);
                let inner = key
                    .open_in_place(
                        aead::Nonce::assume_unique_for_key(nonce),
                        aead::Aad::from(aad),
                        &mut fragment[explicit..],
                    )
                    .map_err(|_| RecordError::BadRecordMac)?;
                (outer, &*inner)
            }
        };
        if opened.1.len() > MAX_PLAINTEXT {
            return Err(RecordError::Overflow(opened.1.len()));
        }
        self.rx.advance()?;
        Ok(opened)
    }

    /// The peer updated its sending key (so this side's receiving key moves on);
    /// if it asked, this side updates its own and says so first.
    fn take_key_update(&mut self, request: bool, out: &mut Vec<u8>) -> Result<(), RecordError> {
        let Some(traffic) = self.traffic.as_mut() else {
            return Err(RecordError::Unexpected("a handshake message under TLS 1.2"));
        };
        let (mut key, mut iv) = ([0u8; 32], [0u8; IV_LEN]);
        let len = self.rx.cipher.algorithm().key_len();
        traffic
            .update_client(&mut key[..len], &mut iv)
            .map_err(|_| RecordError::KeyUpdate("cannot derive the client's next keys".into()))?;
        self.rx = self.rx.rekeyed(&key[..len], &iv);
        if request {
            // KeyUpdate(update_not_requested), under the old sending key.
            let sealing = self.tx.aead_key()?;
            self.seal_one(
                &sealing,
                content::HANDSHAKE,
                &[HANDSHAKE_KEY_UPDATE, 0, 0, 1, 0],
                out,
            )?;
            let Some(traffic) = self.traffic.as_mut() else {
                return Err(RecordError::Exhausted);
            };
            let len = self.tx.cipher.algorithm().key_len();
            traffic
                .update_server(&mut key[..len], &mut iv)
                .map_err(|_| {
                    RecordError::KeyUpdate("cannot derive this side's next keys".into())
                })?;
            self.tx = self.tx.rekeyed(&key[..len], &iv);
        }
        zero(&mut key);
        zero(&mut iv);
        Ok(())
    }
}

/// Overwrites key material that is going out of scope.
fn zero(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: a valid, aligned, exclusive reference to a u8.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

fn header(content_type: u8, length: usize) -> [u8; HEADER] {
    let [hi, lo] = (length as u16).to_be_bytes();
    [content_type, 3, 3, hi, lo]
}

/// TLS 1.2's additional data: seq, type, version, plaintext length.
fn aad12(seq: u64, content_type: u8, plain_len: usize) -> [u8; 13] {
    let mut aad = [0u8; 13];
    aad[..8].copy_from_slice(&seq.to_be_bytes());
    aad[8] = content_type;
    aad[9] = 3;
    aad[10] = 3;
    aad[11..].copy_from_slice(&(plain_len as u16).to_be_bytes());
    aad
}

/// The one handshake message a server takes after the handshake: a TLS 1.3
/// KeyUpdate; whether it asks for this side's update too.
fn key_update(body: &[u8], version: Version) -> Result<bool, RecordError> {
    if version != Version::Tls13 {
        return Err(RecordError::Unexpected("renegotiation is not offered"));
    }
    match body {
        [HANDSHAKE_KEY_UPDATE, 0, 0, 1, 0] => Ok(false),
        [HANDSHAKE_KEY_UPDATE, 0, 0, 1, 1] => Ok(true),
        [HANDSHAKE_KEY_UPDATE, ..] => Err(RecordError::Malformed("a KeyUpdate of the wrong shape")),
        _ => Err(RecordError::Unexpected(
            "a handshake message other than KeyUpdate after the handshake",
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests;
