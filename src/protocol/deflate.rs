//! RFC 7692 permessage-deflate without I/O: choosing an offer from a client's
//! `Sec-WebSocket-Extensions` header ([`negotiate`]), compressing a message once so
//! every subscriber can be sent the same bytes ([`compress`]), and inflating a
//! client's message within a byte budget ([`inflate`]).
//!
//! The server always runs without context takeover in both directions: a published
//! message is compressed once and that one frame goes to every subscriber, so no
//! connection keeps a compressor or a 32 KiB window between messages. The only
//! compression state is per thread: one compressor per window size (9..=15) and
//! one decompressor, each reset for every message. By zlib's formula for memory
//! use (zlib.h's; zlib-rs follows it, and nothing here was measured) a compressor
//! with a 15-bit window at the default memLevel holds about 256 KiB that must be
//! allocated and initialised, and a decompressor about 40 KiB; keeping them per
//! thread leaves the output buffer as the only allocation per message.
//!
//! This module must not touch sockets, frame headers, the RSV1 bit, the HTTP of the
//! handshake or any connection state: the handshake calls [`negotiate`] and answers
//! with [`Agreement::response`]; the frame path sets RSV1 and hands whole message
//! payloads to [`compress`] and [`inflate`].

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt::Write as _;

use flate2::{Compress, Decompress, FlushCompress, FlushDecompress, Status};

use super::close_code;

/// How WebSocket messages are compressed for the connections that negotiated
/// permessage-deflate (`--deflate-min-size`, `--deflate-level`): a setting of
/// the server, read by the transports that compress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    /// Frames whose payload is shorter go uncompressed.
    pub min_size: usize,
    /// zlib's level, 0..=9.
    pub level: u32,
}

/// The extension's registered name (§5).
pub const EXTENSION_NAME: &str = "permessage-deflate";

/// The largest LZ77 window RFC 7692 allows (32 KiB), and what a peer assumes when
/// no `*_max_window_bits` says otherwise.
pub const MAX_WINDOW_BITS: u8 = 15;

/// The smallest window zlib can compress a raw stream with, which is why an offer
/// of `server_max_window_bits=8` is declined.
pub const MIN_COMPRESS_WINDOW_BITS: u8 = 9;

/// What a sync flush ends with: the sender strips it (§7.2.1), the receiver puts it
/// back before inflating (§7.2.2).
const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The most output one inflate step may produce. Inflating in steps is what lets a
/// decompression bomb stop at the budget instead of after it.
const INFLATE_CHUNK: usize = 16 * 1024;

/// Parameters that may appear at most once in an offer, as bits of [`Offer::seen`].
const SERVER_NO_CONTEXT_TAKEOVER: u8 = 1;
const CLIENT_NO_CONTEXT_TAKEOVER: u8 = 2;
const SERVER_MAX_WINDOW_BITS: u8 = 4;
const CLIENT_MAX_WINDOW_BITS: u8 = 8;

/// The permessage-deflate configuration agreed with one client. Both directions run
/// without context takeover, always, so nothing about them is stored here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// The window the server must compress with (9..=15): the client's
    /// `server_max_window_bits`, or 15 when it named none.
    pub server_window_bits: u8,
    /// Whether the offer named `server_max_window_bits`. The response must then
    /// name it too, even at 15: §7.1.2.1 counts an answer without it as declining
    /// the parameter, and Python's websockets fails the handshake on one.
    pub server_window_bits_requested: bool,
    /// The `client_max_window_bits` to answer with; `None` when the offer did not
    /// name it, because then the response must not either (§7.1.2.2). The server
    /// inflates with a 15-bit window, which reads any smaller one, so this only
    /// echoes what the client chose (15 when it left the choice to us).
    pub client_window_bits: Option<u8>,
}

impl Agreement {
    /// The `Sec-WebSocket-Extensions` value that accepts the offer.
    pub fn response(&self) -> String {
        let mut out = String::from(
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        );
        // Writing to a String cannot fail.
        if self.server_window_bits < MAX_WINDOW_BITS || self.server_window_bits_requested {
            let _ = write!(out, "; server_max_window_bits={}", self.server_window_bits);
        }
        if let Some(bits) = self.client_window_bits {
            let _ = write!(out, "; client_max_window_bits={bits}");
        }
        out
    }
}

/// Picks the first permessage-deflate offer in `offers` (the `Sec-WebSocket-Extensions`
/// values, several header lines joined with `,`) that the server can accept. Other
/// extensions, and offers with an unknown, repeated or ill-formed parameter, are
/// skipped. `None` means: answer without the extension.
pub fn negotiate(offers: &str) -> Option<Agreement> {
    Elements { rest: Some(offers) }.find_map(accept_offer)
}

/// The elements of a comma-separated header list, split at commas outside
/// quoted-strings (a parameter value may hold a comma). Empty elements are yielded
/// and skipped by the caller, since `a,,b` is a legal list (RFC 9110 §5.6.1).
struct Elements<'a> {
    rest: Option<&'a str>,
}

impl<'a> Iterator for Elements<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest?;
        let mut quoted = false;
        let mut escaped = false;
        for (i, b) in rest.bytes().enumerate() {
            if escaped {
                escaped = false;
            } else if quoted {
                match b {
                    b'\\' => escaped = true,
                    b'"' => quoted = false,
                    _ => {}
                }
            } else if b == b'"' {
                quoted = true;
            } else if b == b',' {
                // A comma is ASCII, so both slices end on character boundaries.
                self.rest = Some(&rest[i + 1..]);
                return Some(&rest[..i]);
            }
        }
        self.rest = None;
        Some(rest)
    }
}

/// One list element as an offer we accept, or `None` (another extension, an
/// ill-formed element, or parameters we cannot honour).
fn accept_offer(element: &str) -> Option<Agreement> {
    let mut cur = Cursor { s: element, pos: 0 };
    cur.skip_ws();
    let name = cur.token()?;
    if !name.eq_ignore_ascii_case(EXTENSION_NAME) {
        return None;
    }
    let mut offer = Offer::default();
    loop {
        cur.skip_ws();
        if cur.at_end() {
            return offer.agreement();
        }
        if !cur.eat(b';') {
            return None;
        }
        cur.skip_ws();
        // A lone or trailing `;` has no token here and declines the offer.
        let param = cur.token()?;
        cur.skip_ws();
        let value = if cur.eat(b'=') {
            cur.skip_ws();
            Some(cur.value()?)
        } else {
            None
        };
        offer.add(param, value.as_deref())?;
    }
}

/// What one offer asked for, gathered parameter by parameter.
#[derive(Default)]
struct Offer {
    /// Which parameters appeared, so a repeat declines the offer (§7).
    seen: u8,
    server_max_window_bits: Option<u8>,
    /// `Some(None)`: named without a value, the server may choose.
    client_max_window_bits: Option<Option<u8>>,
}

impl Offer {
    /// Records one parameter; `None` declines the offer.
    fn add(&mut self, name: &str, value: Option<&str>) -> Option<()> {
        let bit = if name.eq_ignore_ascii_case("server_no_context_takeover") {
            SERVER_NO_CONTEXT_TAKEOVER
        } else if name.eq_ignore_ascii_case("client_no_context_takeover") {
            CLIENT_NO_CONTEXT_TAKEOVER
        } else if name.eq_ignore_ascii_case("server_max_window_bits") {
            SERVER_MAX_WINDOW_BITS
        } else if name.eq_ignore_ascii_case("client_max_window_bits") {
            CLIENT_MAX_WINDOW_BITS
        } else {
            return None;
        };
        if self.seen & bit != 0 {
            return None;
        }
        self.seen |= bit;
        match bit {
            // The server uses no context takeover either way; these only have to
            // be well formed.
            SERVER_NO_CONTEXT_TAKEOVER | CLIENT_NO_CONTEXT_TAKEOVER => {
                value.is_none().then_some(())
            }
            // A value is required here (§7.1.2.1).
            SERVER_MAX_WINDOW_BITS => {
                self.server_max_window_bits = Some(window_bits(value?)?);
                Some(())
            }
            // Optional here (§7.1.2.2).
            _ => {
                self.client_max_window_bits = Some(match value {
                    None => None,
                    Some(v) => Some(window_bits(v)?),
                });
                Some(())
            }
        }
    }

    fn agreement(&self) -> Option<Agreement> {
        let server_window_bits = match self.server_max_window_bits {
            // A 256-byte window (8) is legal in RFC 7692 but zlib cannot compress a
            // raw stream with one: deflateInit2 rejects windowBits -8 (since zlib
            // 1.2.9 it widens 8 to 9 only for zlib-wrapped streams), zlib-rs does
            // the same, and flate2 asserts 9..=15. A 9-bit stream may refer 512
            // bytes back, which a client holding a 256-byte window cannot follow,
            // so the honest answer is to decline and try the next offer.
            Some(bits) if bits < MIN_COMPRESS_WINDOW_BITS => return None,
            Some(bits) => bits,
            None => MAX_WINDOW_BITS,
        };
        Some(Agreement {
            server_window_bits,
            server_window_bits_requested: self.server_max_window_bits.is_some(),
            client_window_bits: self
                .client_max_window_bits
                .map(|bits| bits.unwrap_or(MAX_WINDOW_BITS)),
        })
    }
}

/// A `*_max_window_bits` value: a decimal 8..=15 without leading zeros (§7.1.2.1).
fn window_bits(value: &str) -> Option<u8> {
    match *value.as_bytes() {
        [d @ b'8'..=b'9'] => Some(d - b'0'),
        [b'1', d @ b'0'..=b'5'] => Some(10 + d - b'0'),
        _ => None,
    }
}

/// A read position in one list element (RFC 9110 §5.6 tokens and quoted-strings,
/// with optional whitespace between them as RFC 6455 §9.1 allows).
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.peek() == Some(byte);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// A non-empty run of token characters.
    fn token(&mut self) -> Option<&'a str> {
        let start = self.pos;
        while self.peek().is_some_and(is_tchar) {
            self.pos += 1;
        }
        // Token characters are ASCII, so both ends are character boundaries.
        (self.pos > start).then(|| &self.s[start..self.pos])
    }

    /// A parameter value: a token, or a quoted-string with its escapes removed.
    fn value(&mut self) -> Option<Cow<'a, str>> {
        if !self.eat(b'"') {
            return self.token().map(Cow::Borrowed);
        }
        let start = self.pos;
        let mut unescaped: Option<Vec<u8>> = None;
        loop {
            let b = self.peek()?; // an unterminated quote declines the offer
            self.pos += 1;
            match b {
                b'"' => {
                    return match unescaped {
                        None => Some(Cow::Borrowed(&self.s[start..self.pos - 1])),
                        // Removing ASCII backslashes keeps UTF-8 valid; checked anyway.
                        Some(bytes) => String::from_utf8(bytes).ok().map(Cow::Owned),
                    };
                }
                b'\\' => {
                    let escaped = self.peek()?;
                    let bytes = unescaped
                        .get_or_insert_with(|| self.s.as_bytes()[start..self.pos - 1].to_vec());
                    bytes.push(escaped);
                    self.pos += 1;
                }
                other => {
                    if let Some(bytes) = unescaped.as_mut() {
                        bytes.push(other);
                    }
                }
            }
        }
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Why [`compress`] could not compress; all are caller mistakes or a broken
/// compressor, never anything a client sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeflateError {
    #[error("window bits {0} outside 9..=15")]
    WindowBits(u8),
    #[error("compression level {0} outside 0..=9")]
    Level(u32),
    #[error("compressor failed: {0}")]
    Compressor(String),
}

/// Why a client's compressed message was refused. Each maps to the close code the
/// connection must fail with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    #[error("inflated message is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("compressed message is not valid DEFLATE data")]
    Corrupt,
}

impl InflateError {
    /// The close code to fail the connection with: 1009 for the budget, as for an
    /// uncompressed message; 1007 for bad data, since the frame itself was well
    /// formed and only its payload was not.
    pub fn close_code(&self) -> u16 {
        match self {
            InflateError::TooLarge { .. } => close_code::MESSAGE_TOO_BIG,
            InflateError::Corrupt => close_code::INVALID_PAYLOAD,
        }
    }
}

thread_local! {
    /// One compressor per window size 9..=15, with the level it was made for.
    /// Made on first use, reset for every message (no context takeover).
    static COMPRESSORS: RefCell<[Option<(u32, Compress)>; 7]> = RefCell::new(Default::default());
    /// The inflater: raw DEFLATE with a 15-bit window, which reads streams made with
    /// any smaller one. Reset for every message (no context takeover).
    static INFLATER: RefCell<Decompress> =
        RefCell::new(Decompress::new_with_window_bits(false, MAX_WINDOW_BITS));
}

/// Appends `payload` compressed as one permessage-deflate message (§7.2.1): raw
/// DEFLATE with a window of `window_bits` (9..=15) at `level` (0..=9), ended by a
/// sync flush whose `00 00 ff ff` is stripped. The same input always gives the same
/// bytes, so one compressed frame can be shared by every subscriber that agreed to
/// the same window. `out` grows once, to about the payload's size, before
/// compressing; on error it is left as it was.
pub fn compress(
    payload: &[u8],
    window_bits: u8,
    level: u32,
    out: &mut Vec<u8>,
) -> Result<(), DeflateError> {
    if !(MIN_COMPRESS_WINDOW_BITS..=MAX_WINDOW_BITS).contains(&window_bits) {
        return Err(DeflateError::WindowBits(window_bits));
    }
    if level > 9 {
        return Err(DeflateError::Level(level));
    }
    COMPRESSORS.with(|cell| {
        // Nothing below calls back out of this module, so the borrow cannot nest.
        let mut slots = cell.borrow_mut();
        let slot = &mut slots[usize::from(window_bits - MIN_COMPRESS_WINDOW_BITS)];
        // Levels come from configuration and rarely change; a new one costs one
        // new compressor rather than a level switch on a reused stream.
        if slot
            .as_ref()
            .is_some_and(|(made_for, _)| *made_for != level)
        {
            *slot = None;
        }
        let (_, compressor) = slot.get_or_insert_with(|| {
            (
                level,
                Compress::new_with_window_bits(flate2::Compression::new(level), false, window_bits),
            )
        });
        // Also undoes whatever a failed earlier call left behind.
        compressor.reset();
        let start = out.len();
        let result = deflate_sync(compressor, payload, out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    })
}

fn deflate_sync(c: &mut Compress, payload: &[u8], out: &mut Vec<u8>) -> Result<(), DeflateError> {
    let start = out.len();
    // zlib's deflateBound for a raw stream, plus the flush's empty stored block:
    // enough for any payload, so `out` grows once. For compressible payloads this
    // over-reserves; the caller's buffer keeps the capacity for the next message.
    let n = payload.len();
    out.reserve(n + (n >> 12) + (n >> 14) + (n >> 25) + 7 + 8);
    let mut input = payload;
    loop {
        if out.len() == out.capacity() {
            out.reserve(64.max(out.len() / 8));
        }
        let (in_before, out_before) = (c.total_in(), c.total_out());
        c.compress_vec(input, out, FlushCompress::Sync)
            .map_err(|e| DeflateError::Compressor(e.to_string()))?;
        let read = (c.total_in() - in_before) as usize;
        input = input.get(read..).unwrap_or_default();
        // zlib has finished a sync flush when it returns with output space left
        // over (zlib.h, deflate()); otherwise it has more to write.
        if input.is_empty() && out.len() < out.capacity() {
            break;
        }
        if read == 0 && c.total_out() == out_before {
            return Err(DeflateError::Compressor("no progress".into()));
        }
    }
    if !out[start..].ends_with(&SYNC_TAIL) {
        return Err(DeflateError::Compressor(
            "sync flush did not end with 00 00 ff ff".into(),
        ));
    }
    out.truncate(out.len() - SYNC_TAIL.len());
    Ok(())
}

/// Appends the message a client compressed (§7.2.2): `00 00 ff ff` is put back
/// and the data inflated with a 15-bit window. Output is produced in steps of at
/// most 16 KiB and never past `max + 1` bytes, so a decompression bomb costs at
/// most that much memory and work in proportion to what was read, never the whole
/// expansion. A stream with a final block (BFINAL) ends the message there and
/// anything after it is ignored: a sender that sets BFINAL still appends an empty
/// block before stripping the tail (§7.2.1 step 2; §7.2.3 has an example).
/// Truncation is not always detectable: the tail put back is then read as block
/// data and may inflate to wrong bytes instead of failing, as with any receiver
/// built on zlib; text messages still get their UTF-8 check. On error `out` is
/// left as it was.
pub fn inflate(compressed: &[u8], max: usize, out: &mut Vec<u8>) -> Result<(), InflateError> {
    INFLATER.with(|cell| {
        // Nothing below calls back out of this module, so the borrow cannot nest.
        let mut inflater = cell.borrow_mut();
        // Reset before rather than after, so a failed message cannot leak state.
        inflater.reset(false);
        let start = out.len();
        let result = inflate_with(&mut inflater, compressed, max, out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    })
}

/// [`inflate`] on a given, freshly reset decompressor; on error `out` keeps what
/// was produced (at most `max + 1` bytes), which the tests look at.
fn inflate_with(
    d: &mut Decompress,
    compressed: &[u8],
    max: usize,
    out: &mut Vec<u8>,
) -> Result<(), InflateError> {
    let start = out.len();
    // Small messages should not zero 16 KiB: start near the likely size and double.
    let mut chunk = compressed.len().saturating_mul(4).clamp(256, INFLATE_CHUNK);
    for part in [compressed, &SYNC_TAIL[..]] {
        let mut input = part;
        loop {
            let produced = out.len() - start;
            // One byte past the budget is enough to tell "exactly max" from "more".
            let room = max.saturating_add(1).saturating_sub(produced).min(chunk);
            let len = out.len();
            out.resize(len + room, 0);
            let (in_before, out_before) = (d.total_in(), d.total_out());
            let status = d.decompress(input, &mut out[len..], FlushDecompress::Sync);
            let read = (d.total_in() - in_before) as usize;
            let wrote = (d.total_out() - out_before) as usize;
            out.truncate(len + wrote.min(room));
            let status = status.map_err(|_| InflateError::Corrupt)?;
            if out.len() - start > max {
                return Err(InflateError::TooLarge { limit: max });
            }
            if status == Status::StreamEnd {
                return Ok(());
            }
            input = input.get(read..).unwrap_or_default();
            // All input read and output space left over: nothing more to come.
            if input.is_empty() && wrote < room {
                break;
            }
            // Guards the loop against input zlib will neither read nor reject.
            if read == 0 && wrote == 0 {
                return Err(InflateError::Corrupt);
            }
            chunk = (chunk * 2).min(INFLATE_CHUNK);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
