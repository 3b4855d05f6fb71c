//! One server-side TLS handshake, driven by rustls's unbuffered API over the
//! caller's buffers: the event loop feeds what it received, this appends what
//! must be sent, and once the handshake is done hands the traffic keys over to
//! the record layer.
//!
//! It keeps no buffer of its own between calls (only rustls's state, boxed, and
//! the client's SNI): unconsumed input stays with the caller. It must not read
//! or write a socket, nor decrypt application data: records after the client's
//! Finished are left untouched for the record layer.

use std::sync::Arc;

use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, InsufficientSizeError, UnbufferedStatus,
};
use rustls::{ExtractedSecrets, ProtocolVersion, ServerConfig};
use rustls_pki_types::DnsName;

use super::traffic::{Captured, TrafficSecrets, take_captured};

/// TLS record header: content type, legacy version, length.
const RECORD_HEADER: usize = 5;
const CONTENT_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const SERVER_NAME_HOST: u8 = 0;

/// A fatal alert is one record; a few rounds cover the alert and its
/// TransmitTlsData without trusting a failed connection to stop by itself.
const ALERT_FLUSH_ROUNDS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum TlsHandshakeError {
    #[error("plain HTTP sent to a TLS port ({0})")]
    PlainHttp(#[source] rustls::Error),
    #[error("TLS handshake failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("the peer closed the connection during the TLS handshake")]
    PeerClosed,
    #[error("rustls offered application data before the handshake was done")]
    DataDuringHandshake,
    #[error(
        "rustls did not log the TLS 1.3 traffic secrets (the configuration lacks throng's key log)"
    )]
    NoTrafficSecrets,
    #[error("cannot encode a handshake record: {0}")]
    Encode(#[source] EncodeError),
}

#[derive(Debug)]
pub enum Progress {
    /// Needs more bytes from the peer (and `out` may hold bytes to send first).
    NeedMore,
    /// The handshake is done; call `finish`. Bytes of `input` past `consumed`
    /// are the peer's first records under the new keys (e.g. the HTTP request
    /// sent right after Finished): the caller keeps them for the record layer.
    Done,
    /// The handshake failed; `out` holds the alert to send (if any) and the
    /// connection must be closed.
    Failed(TlsHandshakeError),
}

/// The boxed state, so a connection in its handshake costs one pointer inline.
struct Conn {
    tls: UnbufferedServerConnection,
    /// rustls's unbuffered server does not expose the SNI, so it is read from
    /// the ClientHello on the way in.
    sni: Option<Box<str>>,
    /// TLS 1.3's traffic secrets as rustls logs them (see [`super::traffic`]).
    captured: Captured,
}

pub struct Handshake {
    conn: Box<Conn>,
}

/// What a rustls state asks of the loop, once the state (which borrows the
/// connection and the input) is gone.
enum Step {
    Again,
    Idle { write_traffic: bool },
    PeerClosed,
    Unexpected,
}

impl Handshake {
    pub fn new(config: Arc<ServerConfig>) -> Result<Self, TlsHandshakeError> {
        Ok(Self {
            conn: Box::new(Conn {
                tls: UnbufferedServerConnection::new(config)?,
                sni: None,
                captured: Captured::default(),
            }),
        })
    }

    /// Feeds everything received and not yet consumed (`input`, from its
    /// start; rustls may decrypt in place, hence &mut), appends whatever must
    /// be sent to `out`; returns how many bytes of `input` were consumed and
    /// the progress.
    ///
    /// Bytes past `consumed` may have been rewritten in place (a handshake
    /// message spread over several records is reassembled inside `input`):
    /// the next call must be given them exactly as they are now, followed by
    /// whatever arrived since.
    pub fn advance(&mut self, input: &mut [u8], out: &mut Vec<u8>) -> (usize, Progress) {
        // What rustls logs during this step is this connection's.
        drop(take_captured());
        let step = self.advance_records(input, out);
        self.conn.captured.merge(take_captured());
        step
    }

    fn advance_records(&mut self, input: &mut [u8], out: &mut Vec<u8>) -> (usize, Progress) {
        let conn = &mut *self.conn;
        if conn.sni.is_none() && conn.tls.protocol_version().is_none() {
            conn.sni = sni_from_client_hello(input);
        }
        let mut consumed = 0;
        // rustls is shown one record at a time: given more, it goes on from the
        // client's Finished to decrypting the records after it within the same
        // call, and those belong to the record layer. Once the handshake is
        // over it is shown nothing at all.
        let mut limit = if conn.tls.is_handshaking() {
            record_end(input, 0)
        } else {
            0
        };
        loop {
            let UnbufferedStatus { discard, state } =
                conn.tls.process_tls_records(&mut input[consumed..limit]);
            let step = match state {
                Ok(ConnectionState::EncodeTlsData(mut data)) => match encode(&mut data, out) {
                    Ok(()) => Step::Again,
                    Err(e) => {
                        consumed += discard;
                        return (consumed, Progress::Failed(TlsHandshakeError::Encode(e)));
                    }
                },
                Ok(ConnectionState::TransmitTlsData(transmit)) => {
                    // `out` is the caller's to send; it keeps what the socket
                    // does not take, so for rustls it is sent.
                    transmit.done();
                    Step::Again
                }
                Ok(ConnectionState::BlockedHandshake) => Step::Idle {
                    write_traffic: false,
                },
                Ok(ConnectionState::WriteTraffic(_)) => Step::Idle {
                    write_traffic: true,
                },
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => Step::PeerClosed,
                Ok(_) => Step::Unexpected,
                Err(e) => {
                    consumed += discard;
                    let plain_http = matches!(e, rustls::Error::InvalidMessage(_))
                        && conn.tls.protocol_version().is_none()
                        && looks_like_http(input);
                    consumed += flush_alert(&mut conn.tls, &mut input[consumed..limit], out);
                    let err = if plain_http {
                        TlsHandshakeError::PlainHttp(e)
                    } else {
                        TlsHandshakeError::Rustls(e)
                    };
                    return (consumed, Progress::Failed(err));
                }
            };
            consumed += discard;
            match step {
                Step::Again => {}
                // In TLS 1.3 the server may send from its own Finished on, so
                // WriteTraffic also shows up while it waits for the client's.
                Step::Idle { write_traffic } => {
                    if !conn.tls.is_handshaking() {
                        if write_traffic {
                            return (consumed, Progress::Done);
                        }
                        return (consumed, Progress::NeedMore);
                    }
                    if limit < input.len() {
                        limit = record_end(input, limit);
                    } else {
                        return (consumed, Progress::NeedMore);
                    }
                }
                Step::PeerClosed => {
                    return (consumed, Progress::Failed(TlsHandshakeError::PeerClosed));
                }
                Step::Unexpected => {
                    return (
                        consumed,
                        Progress::Failed(TlsHandshakeError::DataDuringHandshake),
                    );
                }
            }
        }
    }

    /// After `Done`: hands the traffic keys over, with TLS 1.3's traffic
    /// secrets (for key updates; none under TLS 1.2). rustls's own state is
    /// dropped here.
    pub fn finish(
        self,
    ) -> Result<(ProtocolVersion, ExtractedSecrets, Option<TrafficSecrets>), TlsHandshakeError>
    {
        let Conn { tls, captured, .. } = *self.conn;
        let version = tls
            .protocol_version()
            .ok_or(rustls::Error::HandshakeNotComplete)?;
        let (secrets, _kernel) = tls.dangerous_into_kernel_connection()?;
        let traffic = match version {
            ProtocolVersion::TLSv1_3 => Some(
                captured
                    .complete()
                    .ok_or(TlsHandshakeError::NoTrafficSecrets)?,
            ),
            _ => None,
        };
        Ok((version, secrets, traffic))
    }

    /// The name the client asked for (SNI), for logs.
    pub fn server_name(&self) -> Option<&str> {
        self.conn.sni.as_deref()
    }
}

/// After a fatal error rustls has queued its alert; it comes out of the next
/// call. That call is given the same unconsumed bytes as before rather than
/// an empty slice: rustls indexes the input at how far it had reassembled a
/// handshake message, and an empty slice would be out of range.
fn flush_alert(tls: &mut UnbufferedServerConnection, input: &mut [u8], out: &mut Vec<u8>) -> usize {
    let mut consumed = 0;
    for _ in 0..ALERT_FLUSH_ROUNDS {
        let UnbufferedStatus { discard, state } = tls.process_tls_records(&mut input[consumed..]);
        let more = match state {
            Ok(ConnectionState::EncodeTlsData(mut data)) => encode(&mut data, out).is_ok(),
            Ok(ConnectionState::TransmitTlsData(transmit)) => {
                transmit.done();
                true
            }
            _ => false,
        };
        consumed += discard;
        if !more {
            break;
        }
    }
    consumed
}

/// Encodes into `out`'s spare capacity, growing it to what rustls asks for.
fn encode(
    data: &mut EncodeTlsData<'_, ServerConnectionData>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.resize(out.capacity(), 0);
    let written = match data.encode(&mut out[start..]) {
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            out.resize(start + required_size, 0);
            data.encode(&mut out[start..])
        }
        other => other,
    };
    match written {
        Ok(n) => {
            out.truncate(start + n);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Where the record starting at `at` ends, or the end of `input` if it has
/// not fully arrived (rustls then waits for the rest, or rejects its header).
fn record_end(input: &[u8], at: usize) -> usize {
    let Some(header) = input.get(at..at + RECORD_HEADER) else {
        return input.len();
    };
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let end = at + RECORD_HEADER + len;
    if end <= input.len() { end } else { input.len() }
}

/// An HTTP/1.x request line starts with a method in capitals and a space; a
/// TLS record starts with a content type byte far below ASCII letters.
fn looks_like_http(input: &[u8]) -> bool {
    const METHODS: [&[u8]; 9] = [
        b"GET ", b"POST", b"HEAD", b"PUT ", b"OPTI", b"DELE", b"PATC", b"CONN", b"PRI ",
    ];
    METHODS.iter().any(|m| input.starts_with(m))
}

/// Reads a big-endian TLS structure without ever indexing past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }

    /// A vector with a length prefix of `prefix` bytes.
    fn vec(&mut self, prefix: usize) -> Option<Reader<'a>> {
        let len = match prefix {
            1 => usize::from(self.u8()?),
            _ => self.u16()?,
        };
        self.take(len).map(Reader)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The host name in a ClientHello that arrived whole in the first record.
/// Anything else (not yet complete, spread over records, no SNI, not a DNS
/// name) gives `None`: it is for logs, and rustls judges the hello itself.
fn sni_from_client_hello(input: &[u8]) -> Option<Box<str>> {
    let mut record = Reader(input);
    if record.u8()? != CONTENT_HANDSHAKE {
        return None;
    }
    record.take(2)?;
    let mut fragment = record.vec(2)?;
    if fragment.u8()? != HANDSHAKE_CLIENT_HELLO {
        return None;
    }
    let len = fragment.u24()?;
    let mut hello = Reader(fragment.take(len)?);
    hello.take(2 + 32)?; // legacy_version, random
    hello.vec(1)?; // legacy_session_id
    hello.vec(2)?; // cipher_suites
    hello.vec(1)?; // legacy_compression_methods
    let mut extensions = hello.vec(2)?;
    while !extensions.is_empty() {
        let kind = extensions.u16()?;
        let mut body = extensions.vec(2)?;
        if kind != usize::from(EXTENSION_SERVER_NAME) {
            continue;
        }
        let mut names = body.vec(2)?;
        while !names.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec(2)?;
            if name_type == SERVER_NAME_HOST {
                let name = std::str::from_utf8(name.0).ok()?;
                let name = DnsName::try_from(name).ok()?.to_lowercase_owned();
                return Some(name.as_ref().into());
            }
        }
        return None;
    }
    None
}

#[cfg(test)]
pub(crate) mod tests;
