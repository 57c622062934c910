//! Packet batches: the unit of work of every stage.

use crate::fdb::Place;
pub use crate::types::Desc;
use crate::verdict::Verdict;
use crate::vlan::Vid;
use crate::wire::PacketMeta;

/// Most packets in one batch: what a batch's arrays hold. A pipeline takes up to its
/// [`crate::pipeline::PipelineOptions::batch`] of them per RX burst (VPP's vectors are 256).
pub const BATCH_SIZE: usize = 256;

/// Packets per RX burst unless configured otherwise (`switch.batch`).
pub const DEFAULT_BATCH: usize = 64;

/// What the L2 stage needs of a frame: where the FDB keeps its source and destination (worked
/// out by the parser, which prefetches both buckets as it goes, so the misses of a batch overlap
/// and are over by the time the forwarding pass learns and looks up) and the VLAN it is switched
/// in. Kept in a dense array of its own so that the passes over a batch after parsing never
/// touch the frame again: frames lie 2 KiB apart, so a batch's headers compete for a few cache
/// sets and would be reloaded from L2 on every pass.
///
/// Packed into 32 bytes (two places would be 32 with their padding alone): the two keys, the
/// two buckets, the VLAN and the tag, each stored and loaded once per frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct L2Header {
    keys: [u64; 2],
    buckets: [u32; 2],
    vlan: u16,
    /// The tag's VID, or [`NO_TAG`].
    tag: u16,
}

/// [`L2Header::tag_raw`] of an untagged frame: no 12-bit VID is this.
pub const NO_TAG: u16 = u16::MAX;

impl L2Header {
    /// `tag`: the VID of the 802.1Q tag the frame arrived with (0 for a priority tag); `None`
    /// untagged.
    #[inline]
    pub fn new(src: Place, dst: Place, vlan: Vid, tag: Option<u16>) -> Self {
        let (s, sb) = src.parts();
        let (d, db) = dst.parts();
        debug_assert!(tag.is_none_or(|t| t <= 0x0fff), "a VID is 12 bits");
        Self { keys: [s, d], buckets: [sb, db], vlan: vlan.get(), tag: tag.unwrap_or(NO_TAG) }
    }

    /// Where the FDB keeps the frame's source address.
    #[inline]
    pub fn src(&self) -> Place {
        Place::from_parts(self.keys[0], self.buckets[0])
    }

    /// Where the FDB keeps the frame's destination address.
    #[inline]
    pub fn dst(&self) -> Place {
        Place::from_parts(self.keys[1], self.buckets[1])
    }

    /// The VLAN the frame is switched in.
    #[inline]
    pub fn vlan(&self) -> u16 {
        self.vlan
    }

    /// The VID of the 802.1Q tag it arrived with (0 for a priority tag), [`NO_TAG`] untagged.
    #[inline]
    pub fn tag_raw(&self) -> u16 {
        self.tag
    }
}

/// Up to [`BATCH_SIZE`] received packets with their parsed metadata and verdicts, stored as
/// parallel arrays so each stage walks one dense array. Allocated once per worker, reused.
pub struct Batch {
    /// Packets in the batch (at most [`BATCH_SIZE`]): the first `len` entries of each array.
    pub len: usize,
    /// Where each packet lies in its UMEM.
    pub descs: [Desc; BATCH_SIZE],
    /// Each packet's parsed headers.
    pub meta: [PacketMeta; BATCH_SIZE],
    /// Each packet's FDB places and VLAN, for the L2 stage.
    pub l2: [L2Header; BATCH_SIZE],
    /// What the verdict stage decided for each packet.
    pub verdicts: [Verdict; BATCH_SIZE],
}

impl Default for Batch {
    fn default() -> Self {
        Self {
            len: 0,
            descs: [Desc::default(); BATCH_SIZE],
            meta: [PacketMeta::default(); BATCH_SIZE],
            l2: [L2Header::default(); BATCH_SIZE],
            verdicts: [Verdict::Pass; BATCH_SIZE],
        }
    }
}

impl Batch {
    /// Empties the batch (the arrays keep their stale contents).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// `0..len`, bounded by [`BATCH_SIZE`] where the compiler can see it: a loop over these
    /// indexes the batch's arrays without a bounds check per packet.
    #[inline]
    pub fn indices(&self) -> std::ops::Range<usize> {
        0..self.len.min(BATCH_SIZE)
    }

    /// The descriptors of the batch's packets.
    pub fn descs(&self) -> &[Desc] {
        &self.descs[..self.len]
    }
}
