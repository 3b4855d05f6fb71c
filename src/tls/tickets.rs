//! Session tickets every process of a deployment can open: the ticket keys
//! derive from one secret, so a client that comes back to another `--workers`
//! process, another node sharing `--tls-ticket-key`, or the same server after a
//! restart, resumes instead of paying for a full handshake.
//!
//! Keys rotate: each [`PERIOD`] has its own AES-256-GCM key,
//! HKDF-SHA256(secret, period number); a ticket is sealed under the current
//! period's key and opened under it or the previous one's, so a ticket lives
//! one to two periods. A ticket is `period (4 bytes) ‖ nonce (12) ‖ sealed`.
//! Without a secret rustls's own in-memory ticketer is used instead. This
//! module must not know about connections or the handshake.

use std::time::{SystemTime, UNIX_EPOCH};

use ring::aead::{self, AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

/// How long one ticket key seals new tickets; it opens them one period more.
pub const PERIOD: u64 = 6 * 3600;
/// Bytes of secret a ticket-key file must hold at least.
pub const MIN_SECRET: usize = 32;
/// The environment variable a `--workers` master hands its workers the
/// secret in (hex), when no `--tls-ticket-key` file gives one.
pub const SECRET_ENV: &str = "THRONG_TLS_TICKET_SECRET";
const SALT: &[u8] = b"throng tls session tickets v1";
const PERIOD_LEN: usize = 4;

/// Ticket keys derived from a shared secret.
pub struct SharedTicketer {
    prk: hkdf::Prk,
    rng: SystemRandom,
}

impl std::fmt::Debug for SharedTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTicketer").finish_non_exhaustive()
    }
}

impl SharedTicketer {
    /// `secret`: at least [`MIN_SECRET`] random bytes (the caller checks).
    pub fn new(secret: &[u8]) -> Self {
        SharedTicketer {
            prk: hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(secret),
            rng: SystemRandom::new(),
        }
    }

    fn key(&self, period: u32) -> Option<LessSafeKey> {
        let info = period.to_be_bytes();
        let info: [&[u8]; 1] = [&info];
        let okm = self.prk.expand(&info, &AES_256_GCM).ok()?;
        Some(LessSafeKey::new(UnboundKey::from(okm)))
    }

    fn seal_at(&self, period: u32, plain: &[u8]) -> Option<Vec<u8>> {
        let key = self.key(period)?;
        let mut nonce = [0u8; aead::NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let head = period.to_be_bytes();
        let mut out = Vec::with_capacity(PERIOD_LEN + nonce.len() + plain.len() + 16);
        out.extend_from_slice(&head);
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(head),
            &mut body,
        )
        .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    fn open_at(&self, now: u32, ticket: &[u8]) -> Option<Vec<u8>> {
        let (head, rest) = ticket.split_first_chunk::<PERIOD_LEN>()?;
        let (nonce, sealed) = rest.split_first_chunk::<{ aead::NONCE_LEN }>()?;
        let period = u32::from_be_bytes(*head);
        if period != now && Some(period) != now.checked_sub(1) {
            return None;
        }
        let key = self.key(period)?;
        let mut body = sealed.to_vec();
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(*head),
                &mut body,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

fn current_period() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (secs / PERIOD) as u32
}

impl ProducesTickets for SharedTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        PERIOD as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal_at(current_period(), plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open_at(current_period(), cipher)
    }
}

/// A fresh random secret, hex-encoded, for a `--workers` master to hand on.
pub fn random_secret_hex() -> Option<String> {
    let mut secret = [0u8; MIN_SECRET];
    SystemRandom::new().fill(&mut secret).ok()?;
    Some(secret.iter().map(|b| format!("{b:02x}")).collect())
}

/// Decodes a secret handed on in [`SECRET_ENV`].
pub fn secret_from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    bytes.filter(|b| b.len() >= MIN_SECRET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_process_with_the_secret_opens_a_ticket_for_two_periods_only() {
        let secret = [7u8; 32];
        let (a, b) = (SharedTicketer::new(&secret), SharedTicketer::new(&secret));
        let ticket = a.seal_at(100, b"session state").unwrap();
        assert_eq!(b.open_at(100, &ticket).unwrap(), b"session state");
        assert_eq!(b.open_at(101, &ticket).unwrap(), b"session state");
        assert!(
            b.open_at(102, &ticket).is_none(),
            "a ticket two periods old"
        );
        assert!(b.open_at(99, &ticket).is_none(), "a ticket from the future");
        let stranger = SharedTicketer::new(&[8u8; 32]);
        assert!(stranger.open_at(100, &ticket).is_none());
    }

    #[test]
    fn tampered_or_short_tickets_are_refused() {
        let t = SharedTicketer::new(&[1u8; 32]);
        let ticket = t.seal_at(5, b"x").unwrap();
        for i in 0..ticket.len() {
            let mut bad = ticket.clone();
            bad[i] ^= 0x20;
            assert!(t.open_at(5, &bad).is_none(), "byte {i}");
        }
        for n in 0..ticket.len() {
            assert!(t.open_at(5, &ticket[..n]).is_none());
        }
        assert!(t.open_at(5, b"").is_none());
    }

    #[test]
    fn the_hex_secret_round_trips_and_short_ones_are_refused() {
        let hex = random_secret_hex().unwrap();
        assert_eq!(secret_from_hex(&hex).unwrap().len(), MIN_SECRET);
        assert!(secret_from_hex("abcd").is_none());
        assert!(secret_from_hex("zz").is_none());
        assert!(secret_from_hex(&"a".repeat(63)).is_none());
    }
}
