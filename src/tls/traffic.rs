//! TLS 1.3 application traffic secrets, kept so a peer's KeyUpdate can be
//! answered by the record layer itself: 2 × 48 bytes per connection where
//! rustls's kernel connection (which could do the same) keeps ~780.
//!
//! rustls hands the secrets out through its [`KeyLog`] hook as the handshake
//! derives them, on the thread driving that handshake; [`Capture`] parks them
//! in a thread-local slot that the handshake driver empties after each step,
//! so they belong to the connection that step was for. Next secrets, keys and
//! IVs follow RFC 8446 §7.1–7.3 (HKDF-Expand-Label). It must not touch
//! records, sockets or the handshake's own state.

use std::cell::RefCell;

use ring::hkdf;
use rustls::KeyLog;

const CLIENT_LABEL: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER_LABEL: &str = "SERVER_TRAFFIC_SECRET_0";
const MAX_SECRET: usize = 48;
pub const IV_LEN: usize = 12;

thread_local! {
    static CAPTURED: RefCell<Captured> = RefCell::new(Captured::default());
}

/// What rustls logged on this thread since the last [`take_captured`].
#[derive(Default)]
pub struct Captured {
    client: Option<Secret>,
    server: Option<Secret>,
}

impl Captured {
    /// Keeps what `newer` brought.
    pub fn merge(&mut self, newer: Captured) {
        if newer.client.is_some() {
            self.client = newer.client;
        }
        if newer.server.is_some() {
            self.server = newer.server;
        }
    }

    /// Both secrets, once the handshake has derived them.
    pub fn complete(self) -> Option<TrafficSecrets> {
        Some(TrafficSecrets {
            client: self.client?,
            server: self.server?,
        })
    }
}

/// Empties this thread's slot; called after every handshake step.
pub fn take_captured() -> Captured {
    CAPTURED.with_borrow_mut(std::mem::take)
}

/// The [`KeyLog`] rustls calls with each secret it derives.
#[derive(Debug)]
pub struct Capture;

impl KeyLog for Capture {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let Some(secret) = Secret::new(secret) else {
            return;
        };
        CAPTURED.with_borrow_mut(|c| match label {
            CLIENT_LABEL => c.client = Some(secret),
            SERVER_LABEL => c.server = Some(secret),
            _ => {}
        });
    }

    fn will_log(&self, label: &str) -> bool {
        label == CLIENT_LABEL || label == SERVER_LABEL
    }
}

/// One traffic secret; its hash is told by its length (SHA-256: 32 bytes,
/// SHA-384: 48), as the suite's.
struct Secret {
    bytes: [u8; MAX_SECRET],
    len: u8,
}

impl Drop for Secret {
    fn drop(&mut self) {
        for b in self.bytes.iter_mut() {
            // SAFETY: a valid, aligned, exclusive reference to a u8.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl Secret {
    fn new(secret: &[u8]) -> Option<Secret> {
        if secret.len() != 32 && secret.len() != 48 {
            return None;
        }
        let mut bytes = [0; MAX_SECRET];
        bytes[..secret.len()].copy_from_slice(secret);
        Some(Secret {
            bytes,
            len: secret.len() as u8,
        })
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    fn algorithm(&self) -> hkdf::Algorithm {
        if self.len == 48 {
            hkdf::HKDF_SHA384
        } else {
            hkdf::HKDF_SHA256
        }
    }

    /// HKDF-Expand-Label(self, label, "", out.len()).
    fn expand_label(&self, label: &[u8], out: &mut [u8]) -> Result<(), ring::error::Unspecified> {
        let prk = hkdf::Prk::new_less_safe(self.algorithm(), self.as_bytes());
        let length = (out.len() as u16).to_be_bytes();
        let label_len = [(b"tls13 ".len() + label.len()) as u8];
        let info: [&[u8]; 5] = [&length, &label_len, b"tls13 ", label, &[0]];
        prk.expand(&info, Len(out.len()))?.fill(out)
    }

    /// The next generation (RFC 8446 §7.2).
    fn next(&self) -> Result<Secret, ring::error::Unspecified> {
        let mut next = Secret {
            bytes: [0; MAX_SECRET],
            len: self.len,
        };
        let len = usize::from(self.len);
        self.expand_label(b"traffic upd", &mut next.bytes[..len])?;
        Ok(next)
    }

    /// The key (`key.len()` bytes) and IV this secret gives (RFC 8446 §7.3).
    fn key_and_iv(
        &self,
        key: &mut [u8],
        iv: &mut [u8; IV_LEN],
    ) -> Result<(), ring::error::Unspecified> {
        self.expand_label(b"key", key)?;
        self.expand_label(b"iv", iv)
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// Both directions' current traffic secrets.
pub struct TrafficSecrets {
    client: Secret,
    server: Secret,
}

impl std::fmt::Debug for TrafficSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrafficSecrets").finish_non_exhaustive()
    }
}

impl TrafficSecrets {
    /// The client moved to its next secret: the new receiving key and IV.
    pub fn update_client(
        &mut self,
        key: &mut [u8],
        iv: &mut [u8; IV_LEN],
    ) -> Result<(), ring::error::Unspecified> {
        self.client = self.client.next()?;
        self.client.key_and_iv(key, iv)
    }

    /// This side moves to its next secret: the new sending key and IV.
    pub fn update_server(
        &mut self,
        key: &mut [u8],
        iv: &mut [u8; IV_LEN],
    ) -> Result<(), ring::error::Unspecified> {
        self.server = self.server.next()?;
        self.server.key_and_iv(key, iv)
    }

    /// The current keys, for checking against what rustls handed over.
    #[cfg(test)]
    pub fn current_client(&self, key: &mut [u8], iv: &mut [u8; IV_LEN]) {
        self.client.key_and_iv(key, iv).unwrap();
    }
}
