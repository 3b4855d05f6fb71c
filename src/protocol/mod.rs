//! RFC 6455 framing without I/O: bytes in, events out; frames out as bytes.
//!
//! This module owns the wire format of WebSocket frames and the per-connection
//! [`Decoder`] state machine (fragmentation, control frames between fragments,
//! close-code and UTF-8 validation, size limits). It must not touch sockets, clocks
//! or connection bookkeeping: the server feeds it the bytes it read and acts on the
//! events and errors it returns, so unit tests and fuzzers can drive it directly.
//!
//! The decoder is designed for idle connections that own nothing: when a read ends
//! on a frame boundary the decoder is empty ([`Decoder::is_idle`]) and the server
//! drops it, keeping state only for connections with a partial frame pending.

pub mod deflate;
pub mod handshake;
pub mod http;

use std::str;

/// Frame opcodes (RFC 6455 §5.2).
pub mod opcode {
    pub const CONTINUATION: u8 = 0x0;
    pub const TEXT: u8 = 0x1;
    pub const BINARY: u8 = 0x2;
    pub const CLOSE: u8 = 0x8;
    pub const PING: u8 = 0x9;
    pub const PONG: u8 = 0xA;
}

/// Close status codes the server sends (RFC 6455 §7.4.1).
pub mod close_code {
    pub const NORMAL: u16 = 1000;
    pub const GOING_AWAY: u16 = 1001;
    pub const PROTOCOL_ERROR: u16 = 1002;
    pub const INVALID_PAYLOAD: u16 = 1007;
    pub const POLICY_VIOLATION: u16 = 1008;
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    pub const INTERNAL_ERROR: u16 = 1011;
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// throng's own (4000-4999 are for applications): the subscription's token
    /// expired; reconnect with a fresh one.
    pub const TOKEN_EXPIRED: u16 = 4001;
}

/// Largest frame header a client can send: 2 bytes, 8 bytes of length, 4 of mask.
const MAX_HEADER_LEN: usize = 14;
/// Control frames carry at most 125 payload bytes (§5.5).
const MAX_CONTROL_PAYLOAD: u64 = 125;

/// What a complete data message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    Text,
    Binary,
}

impl DataKind {
    pub fn opcode(self) -> u8 {
        match self {
            DataKind::Text => opcode::TEXT,
            DataKind::Binary => opcode::BINARY,
        }
    }
}

/// One thing the peer said. Payloads borrow from the caller's buffer or from the
/// decoder, so an event costs no allocation.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A whole data message (fragments already joined, text already UTF-8 checked).
    Message {
        kind: DataKind,
        payload: &'a [u8],
    },
    Ping(&'a [u8]),
    Pong(&'a [u8]),
    /// The peer's close frame; `code` is `None` for an empty close payload.
    Close {
        code: Option<u16>,
        reason: &'a str,
    },
}

/// A protocol violation. Each maps to the close code the connection must fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("reserved bits set without a negotiated extension")]
    ReservedBits,
    #[error("reserved opcode {0:#x}")]
    ReservedOpcode(u8),
    #[error("client frame is not masked")]
    Unmasked,
    #[error("server frame is masked")]
    MaskedFromServer,
    #[error("control frame is fragmented")]
    FragmentedControl,
    #[error("control frame payload is over 125 bytes")]
    ControlTooLong,
    #[error("continuation frame without a message in progress")]
    UnexpectedContinuation,
    #[error("new data frame while a fragmented message is in progress")]
    ExpectedContinuation,
    #[error("64-bit payload length has its most significant bit set")]
    BadLength,
    #[error("message is larger than {limit} bytes")]
    MessageTooBig { limit: usize },
    #[error("text message is not valid UTF-8")]
    InvalidUtf8,
    #[error("close frame has a 1-byte payload")]
    CloseTooShort,
    #[error("invalid close code {0}")]
    InvalidCloseCode(u16),
    #[error("close reason is not valid UTF-8")]
    InvalidCloseReason,
    #[error("compressed message: {0}")]
    Inflate(#[from] deflate::InflateError),
}

impl ProtocolError {
    /// The close code to fail the connection with (§7.4.1).
    pub fn close_code(&self) -> u16 {
        match self {
            ProtocolError::MessageTooBig { .. } => close_code::MESSAGE_TOO_BIG,
            ProtocolError::Inflate(e) => e.close_code(),
            ProtocolError::InvalidUtf8 | ProtocolError::InvalidCloseReason => {
                close_code::INVALID_PAYLOAD
            }
            _ => close_code::PROTOCOL_ERROR,
        }
    }
}

/// Whether a peer may send this close code (§7.4; 1004–1006 and 1015 are reserved
/// for local use, 1016–2999 are unassigned, 3000–4999 belong to applications).
pub fn is_valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// What one [`Decoder::feed`] call got through.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FeedStats {
    /// Frames completely received (data and control).
    pub frames: u64,
    /// Whole data messages delivered.
    pub messages: u64,
}

/// Why a feed stopped early at the consumer's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Ignore the rest of the input (after a close frame, say).
    Stop,
}

#[derive(Debug, Clone, Copy)]
struct FrameInProgress {
    opcode: u8,
    fin: bool,
    remaining: u64,
    mask: [u8; 4],
    /// Position in the mask for the next payload byte, so unmasking resumes across reads.
    mask_offset: u8,
}

/// Which end of the connection a decoder reads for: a server reads masked client
/// frames, a client (the load generator) reads unmasked server frames.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    #[default]
    Server,
    Client,
}

/// Per-connection receive state: only what a partially received frame or message needs.
#[derive(Debug, Default)]
pub struct Decoder {
    role: Role,
    /// Header bytes of a frame whose header has not fully arrived.
    header: [u8; MAX_HEADER_LEN],
    header_len: u8,
    frame: Option<FrameInProgress>,
    /// A control frame's payload that arrived across reads.
    control: Vec<u8>,
    /// The data message in progress, unmasked (fragments, or one frame across reads).
    message: Vec<u8>,
    message_kind: Option<DataKind>,
    /// How much of `message` is known valid UTF-8, so text fails fast mid-message.
    utf8_checked: usize,
    /// permessage-deflate was negotiated: a message's first frame may set RSV1.
    inflates: bool,
    /// The message in progress is compressed (its first frame set RSV1).
    compressed: bool,
}

struct Header {
    fin: bool,
    /// RSV1: the message is compressed (permessage-deflate, RFC 7692 §6).
    rsv1: bool,
    opcode: u8,
    len: u64,
    mask: [u8; 4],
}

/// Parses one frame header; `Ok(None)` when more bytes are needed. With
/// `inflates`, RSV1 is allowed on a message's first frame (RFC 7692 §6.1), never
/// on a continuation or control frame.
fn parse_header(
    buf: &[u8],
    role: Role,
    inflates: bool,
) -> Result<Option<(Header, usize)>, ProtocolError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let b0 = buf[0];
    let b1 = buf[1];
    let op = b0 & 0x0F;
    let rsv1 = b0 & 0x40 != 0;
    let rsv1_allowed = inflates && matches!(op, opcode::TEXT | opcode::BINARY);
    if b0 & 0x30 != 0 || (rsv1 && !rsv1_allowed) {
        return Err(ProtocolError::ReservedBits);
    }
    let fin = b0 & 0x80 != 0;
    match op {
        opcode::CONTINUATION | opcode::TEXT | opcode::BINARY => {}
        opcode::CLOSE | opcode::PING | opcode::PONG => {
            if !fin {
                return Err(ProtocolError::FragmentedControl);
            }
        }
        other => return Err(ProtocolError::ReservedOpcode(other)),
    }
    let masked = b1 & 0x80 != 0;
    match role {
        Role::Server if !masked => return Err(ProtocolError::Unmasked),
        Role::Client if masked => return Err(ProtocolError::MaskedFromServer),
        _ => {}
    }
    let len7 = b1 & 0x7F;
    let (len, mut pos) = match len7 {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4)
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let mut be = [0u8; 8];
            be.copy_from_slice(&buf[2..10]);
            let len = u64::from_be_bytes(be);
            if len >> 63 != 0 {
                return Err(ProtocolError::BadLength);
            }
            (len, 10)
        }
        n => (u64::from(n), 2),
    };
    if op >= opcode::CLOSE && len > MAX_CONTROL_PAYLOAD {
        return Err(ProtocolError::ControlTooLong);
    }
    let mut mask = [0u8; 4];
    if masked {
        if buf.len() < pos + 4 {
            return Ok(None);
        }
        mask.copy_from_slice(&buf[pos..pos + 4]);
        pos += 4;
    }
    Ok(Some((
        Header {
            fin,
            rsv1,
            opcode: op,
            len,
            mask,
        },
        pos,
    )))
}

/// XORs `data` with the mask starting at `offset`; returns the offset to resume at.
pub fn apply_mask(data: &mut [u8], mask: [u8; 4], offset: u8) -> u8 {
    let offset = usize::from(offset & 3);
    let mut rotated = [0u8; 4];
    for (i, byte) in rotated.iter_mut().enumerate() {
        *byte = mask[(offset + i) & 3];
    }
    let word = u32::from_ne_bytes(rotated);
    let mut chunks = data.chunks_exact_mut(4);
    for chunk in &mut chunks {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(chunk);
        let v = u32::from_ne_bytes(bytes) ^ word;
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, byte) in chunks.into_remainder().iter_mut().enumerate() {
        *byte ^= rotated[i];
    }
    ((offset + data.len()) & 3) as u8
}

/// Validates UTF-8 that may end in the middle of a character: `Ok(n)` is how many
/// leading bytes are complete and valid; an error means no continuation can fix it.
fn check_utf8_prefix(bytes: &[u8]) -> Result<usize, ProtocolError> {
    match str::from_utf8(bytes) {
        Ok(_) => Ok(bytes.len()),
        Err(e) if e.error_len().is_none() => Ok(e.valid_up_to()),
        Err(_) => Err(ProtocolError::InvalidUtf8),
    }
}

fn parse_close(payload: &[u8]) -> Result<(Option<u16>, &str), ProtocolError> {
    match payload.len() {
        0 => Ok((None, "")),
        1 => Err(ProtocolError::CloseTooShort),
        _ => {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            if !is_valid_close_code(code) {
                return Err(ProtocolError::InvalidCloseCode(code));
            }
            let reason =
                str::from_utf8(&payload[2..]).map_err(|_| ProtocolError::InvalidCloseReason)?;
            Ok((Some(code), reason))
        }
    }
}

fn control_event(op: u8, payload: &[u8]) -> Result<Event<'_>, ProtocolError> {
    Ok(match op {
        opcode::PING => Event::Ping(payload),
        opcode::PONG => Event::Pong(payload),
        _ => {
            let (code, reason) = parse_close(payload)?;
            Event::Close { code, reason }
        }
    })
}

impl Decoder {
    /// A decoder for the client end: reads unmasked server frames.
    pub fn client() -> Self {
        Decoder {
            role: Role::Client,
            ..Decoder::default()
        }
    }

    /// A server decoder for a connection that negotiated permessage-deflate:
    /// compressed messages are inflated, within the same size limit.
    pub fn inflating() -> Self {
        Decoder {
            inflates: true,
            ..Decoder::default()
        }
    }

    /// True when no partial frame or message is pending: the state can be dropped.
    pub fn is_idle(&self) -> bool {
        self.header_len == 0 && self.frame.is_none() && self.message_kind.is_none()
    }

    /// Bytes this decoder holds on the heap (for memory accounting).
    pub fn buffered_bytes(&self) -> usize {
        self.control.capacity() + self.message.capacity()
    }

    /// Feeds bytes read from the peer. Payloads are unmasked in place in `data`.
    /// `on_event` sees each event in order and may stop the feed. After an error
    /// the connection must be failed with [`ProtocolError::close_code`].
    pub fn feed<F>(
        &mut self,
        data: &mut [u8],
        max_message: usize,
        mut on_event: F,
    ) -> Result<FeedStats, ProtocolError>
    where
        F: FnMut(Event<'_>) -> Flow,
    {
        let mut stats = FeedStats::default();
        let mut pos = 0;
        loop {
            if self.frame.is_none() {
                if pos == data.len() {
                    return Ok(stats);
                }
                let Some(consumed) = self.take_header(&data[pos..], max_message)? else {
                    return Ok(stats);
                };
                pos += consumed;
            }
            let Some(mut frame) = self.frame else {
                continue;
            };
            let available = (data.len() - pos) as u64;
            let take = frame.remaining.min(available) as usize;
            let chunk = &mut data[pos..pos + take];
            pos += take;
            frame.mask_offset = apply_mask(chunk, frame.mask, frame.mask_offset);
            frame.remaining -= take as u64;
            let done = frame.remaining == 0;
            self.frame = if done { None } else { Some(frame) };

            let flow = if frame.opcode >= opcode::CLOSE {
                self.control_chunk(frame.opcode, chunk, done, &mut stats, &mut on_event)?
            } else {
                self.data_chunk(
                    frame.fin,
                    chunk,
                    done,
                    max_message,
                    &mut stats,
                    &mut on_event,
                )?
            };
            if flow == Flow::Stop {
                return Ok(stats);
            }
            if !done {
                // The frame continues in a later read.
                return Ok(stats);
            }
        }
    }

    /// Collects and validates a header; returns bytes consumed, `None` if incomplete.
    fn take_header(
        &mut self,
        input: &[u8],
        max_message: usize,
    ) -> Result<Option<usize>, ProtocolError> {
        let (header, consumed) = if self.header_len == 0 {
            match parse_header(input, self.role, self.inflates)? {
                Some(parsed) => parsed,
                None => {
                    self.header[..input.len()].copy_from_slice(input);
                    self.header_len = input.len() as u8;
                    return Ok(None);
                }
            }
        } else {
            let have = usize::from(self.header_len);
            let copy = (MAX_HEADER_LEN - have).min(input.len());
            self.header[have..have + copy].copy_from_slice(&input[..copy]);
            match parse_header(&self.header[..have + copy], self.role, self.inflates)? {
                Some((header, used)) => {
                    self.header_len = 0;
                    (header, used - have)
                }
                None => {
                    self.header_len = (have + copy) as u8;
                    return Ok(None);
                }
            }
        };
        match header.opcode {
            opcode::CONTINUATION if self.message_kind.is_none() => {
                return Err(ProtocolError::UnexpectedContinuation);
            }
            opcode::TEXT | opcode::BINARY => {
                if self.message_kind.is_some() {
                    return Err(ProtocolError::ExpectedContinuation);
                }
                self.message_kind = Some(if header.opcode == opcode::TEXT {
                    DataKind::Text
                } else {
                    DataKind::Binary
                });
                self.compressed = header.rsv1;
            }
            _ => {}
        }
        if header.opcode < opcode::CLOSE
            && (self.message.len() as u64).saturating_add(header.len) > max_message as u64
        {
            return Err(ProtocolError::MessageTooBig { limit: max_message });
        }
        self.frame = Some(FrameInProgress {
            opcode: header.opcode,
            fin: header.fin,
            remaining: header.len,
            mask: header.mask,
            mask_offset: 0,
        });
        Ok(Some(consumed))
    }

    fn control_chunk<F>(
        &mut self,
        op: u8,
        chunk: &[u8],
        done: bool,
        stats: &mut FeedStats,
        on_event: &mut F,
    ) -> Result<Flow, ProtocolError>
    where
        F: FnMut(Event<'_>) -> Flow,
    {
        if done && self.control.is_empty() {
            stats.frames += 1;
            return Ok(on_event(control_event(op, chunk)?));
        }
        self.control.extend_from_slice(chunk);
        if !done {
            return Ok(Flow::Continue);
        }
        stats.frames += 1;
        let payload = std::mem::take(&mut self.control);
        let flow = on_event(control_event(op, &payload)?);
        Ok(flow)
    }

    fn data_chunk<F>(
        &mut self,
        fin: bool,
        chunk: &[u8],
        done: bool,
        max_message: usize,
        stats: &mut FeedStats,
        on_event: &mut F,
    ) -> Result<Flow, ProtocolError>
    where
        F: FnMut(Event<'_>) -> Flow,
    {
        let kind = self.message_kind.unwrap_or(DataKind::Binary);
        if done {
            stats.frames += 1;
        }
        if self.compressed {
            return self.compressed_chunk(kind, fin, chunk, done, max_message, stats, on_event);
        }
        if done && fin && self.message.is_empty() {
            // The whole message is in this read: deliver it where it lies.
            if kind == DataKind::Text && str::from_utf8(chunk).is_err() {
                return Err(ProtocolError::InvalidUtf8);
            }
            self.message_kind = None;
            stats.messages += 1;
            return Ok(on_event(Event::Message {
                kind,
                payload: chunk,
            }));
        }
        self.message.extend_from_slice(chunk);
        if kind == DataKind::Text {
            let checked = self.utf8_checked;
            self.utf8_checked = checked + check_utf8_prefix(&self.message[checked..])?;
        }
        if !(done && fin) {
            return Ok(Flow::Continue);
        }
        if self.utf8_checked != self.message.len() && kind == DataKind::Text {
            return Err(ProtocolError::InvalidUtf8);
        }
        let message = std::mem::take(&mut self.message);
        self.message_kind = None;
        self.utf8_checked = 0;
        stats.messages += 1;
        Ok(on_event(Event::Message {
            kind,
            payload: &message,
        }))
    }
}

impl Decoder {
    /// A chunk of a compressed message: gathered until its last frame ends, then
    /// inflated (at most `max_message` bytes) into a per-thread buffer and handed
    /// on. Text is checked once inflated: compressed bytes are not text.
    #[allow(clippy::too_many_arguments)]
    fn compressed_chunk<F>(
        &mut self,
        kind: DataKind,
        fin: bool,
        chunk: &[u8],
        done: bool,
        max_message: usize,
        stats: &mut FeedStats,
        on_event: &mut F,
    ) -> Result<Flow, ProtocolError>
    where
        F: FnMut(Event<'_>) -> Flow,
    {
        let whole_here = done && fin && self.message.is_empty();
        if !whole_here {
            self.message.extend_from_slice(chunk);
            if !(done && fin) {
                return Ok(Flow::Continue);
            }
        }
        let gathered = std::mem::take(&mut self.message);
        let compressed = if whole_here { chunk } else { &gathered[..] };
        self.message_kind = None;
        self.compressed = false;
        let mut inflated = INFLATED.with(|cell| cell.take());
        inflated.clear();
        let result = deflate::inflate(compressed, max_message, &mut inflated)
            .map_err(ProtocolError::from)
            .and_then(|()| match kind {
                DataKind::Text if str::from_utf8(&inflated).is_err() => {
                    Err(ProtocolError::InvalidUtf8)
                }
                _ => Ok(()),
            });
        let flow = result.map(|()| {
            stats.messages += 1;
            on_event(Event::Message {
                kind,
                payload: &inflated,
            })
        });
        // A bomb's worth is not kept for the next message.
        if inflated.capacity() > INFLATED_KEPT {
            inflated = Vec::new();
        }
        INFLATED.with(|cell| cell.replace(inflated));
        flow
    }
}

/// The most capacity the per-thread inflate buffer keeps between messages.
const INFLATED_KEPT: usize = 256 * 1024;

thread_local! {
    /// Where compressed messages are inflated: one buffer per thread, not per
    /// connection (taken while in use, so a nested feed would get its own).
    static INFLATED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Appends an unmasked server frame header for a payload of `len` bytes.
pub fn encode_header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(0x80 | opcode);
    if len < 126 {
        out.push(len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// Appends an unmasked server frame header with RSV1 set: its payload of `len`
/// bytes is a message compressed with permessage-deflate (RFC 7692 §6).
pub fn encode_compressed_header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    let at = out.len();
    encode_header(out, opcode, len);
    out[at] |= 0x40;
}

/// Appends a whole unmasked, unfragmented server frame.
pub fn encode_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    encode_header(out, opcode, payload.len());
    out.extend_from_slice(payload);
}

/// Appends a close frame; the reason is cut to fit the 125-byte control limit on a
/// character boundary.
pub fn encode_close(out: &mut Vec<u8>, code: u16, reason: &str) {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    encode_header(out, opcode::CLOSE, 2 + end);
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(&reason.as_bytes()[..end]);
}

/// Encodes a masked client frame (used by the load generator and by tests).
pub fn encode_client_frame(
    out: &mut Vec<u8>,
    opcode: u8,
    fin: bool,
    payload: &[u8],
    mask: [u8; 4],
) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    let len = payload.len();
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if len <= usize::from(u16::MAX) {
        out.push(0x80 | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    let start = out.len();
    out.extend_from_slice(payload);
    apply_mask(&mut out[start..], mask, 0);
}

#[cfg(test)]
mod tests;
