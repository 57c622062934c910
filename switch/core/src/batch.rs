//! Packet batches: the unit of work of every stage.

use crate::verdict::Verdict;
use crate::wire::PacketMeta;

/// Packets per RX burst and per pipeline batch.
pub const BATCH_SIZE: usize = 64;

/// A frame descriptor: where a packet lies in the UMEM. Same shape as the kernel's `xdp_desc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    /// Byte offset of the packet's first byte in the UMEM.
    pub addr: u64,
    /// Packet length in bytes.
    pub len: u32,
    /// Driver-specific flags (AF_XDP `options`); zero when unused.
    pub options: u32,
}

/// Up to [`BATCH_SIZE`] received packets with their parsed metadata and verdicts, stored as
/// parallel arrays so each stage walks one dense array. Allocated once per worker, reused.
pub struct Batch {
    pub len: usize,
    pub descs: [Desc; BATCH_SIZE],
    pub meta: [PacketMeta; BATCH_SIZE],
    pub verdicts: [Verdict; BATCH_SIZE],
}

impl Default for Batch {
    fn default() -> Self {
        Self {
            len: 0,
            descs: [Desc::default(); BATCH_SIZE],
            meta: [PacketMeta::default(); BATCH_SIZE],
            verdicts: [Verdict::Pass; BATCH_SIZE],
        }
    }
}

impl Batch {
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn descs(&self) -> &[Desc] {
        &self.descs[..self.len]
    }
}
