//! TLS for every listener (`--tls-cert`, `--tls-key`), at a few hundred bytes per
//! idle connection: rustls does the handshake through its unbuffered API over
//! the event loop's own buffers ([`handshake`]), and once it is done hands the
//! traffic keys over; from then on the connection's records are sealed and
//! opened here ([`record`]), so an idle connection keeps its keys and sequence
//! numbers and nothing else. The certificate and rustls's configuration, and
//! reloading them, are [`config`]'s.
//!
//! This module owns the bytes between the socket and the transports: it must not
//! read or write a socket itself, nor know what the plaintext means.

pub mod config;
pub mod connection;
pub mod handshake;
pub mod record;
pub mod stream;
pub mod tickets;
pub mod traffic;
