//! A group's frames, encoded once per format and compression for every
//! subscriber of a fan-out that takes them, and where they are kept during it.
//! It must not write to anyone or decide who gets what.

use smallvec::SmallVec;

use crate::hub::Delivery;
use crate::transport::{Compression, Format};

/// One subscriber's frames of a group: held inline for the usual short runs, so a
/// lone message reaches its subscribers without an allocation.
pub(super) type Frames<'a> = SmallVec<[&'a bytes::Bytes; 4]>;

/// Ways a format's frames can go: plain, or compressed with a window of 9..=15 bits.
pub(super) const WINDOWS: usize = 8;

/// A group's frames in one format and compression, gathered once for every
/// subscriber that takes them, with what compression saved on them.
#[derive(Default)]
pub(super) struct Gathered<'a> {
    pub(super) frames: Frames<'a>,
    /// The plain size of the frames that went compressed, and their size.
    pub(super) deflate_plain: u64,
    pub(super) deflate_wire: u64,
    /// All the frames' bytes.
    pub(super) bytes: usize,
}

impl<'a> Gathered<'a> {
    pub(super) fn of(
        messages: impl Iterator<Item = &'a Delivery>,
        format: Format,
        window_bits: u8,
        compression: Compression,
    ) -> Self {
        let mut gathered = Gathered::default();
        for message in messages {
            let Some(frame) = format.frame_for(message, window_bits, compression) else {
                continue;
            };
            if window_bits != 0
                && let Some(plain) = format.frame(message)
                && !std::ptr::eq(plain, frame)
            {
                gathered.deflate_plain += plain.len() as u64;
                gathered.deflate_wire += frame.len() as u64;
            }
            gathered.bytes += frame.len();
            gathered.frames.push(frame);
        }
        gathered
    }
}

/// Where a format and compression's frames are kept during one fan-out.
pub(super) fn gathered_slot(format: Format, window_bits: u8) -> usize {
    let window = match window_bits {
        0 => 0,
        bits => usize::from(bits.saturating_sub(8)).min(WINDOWS - 1),
    };
    format as usize * WINDOWS + window
}
