//! The small value types every other module names: a port's and a pool's id, and the frame
//! descriptor. A leaf: it imports nothing of the crate, so the modules that share these types
//! (batches, ports, the FDB, VLANs, verdicts) need not import each other for them.

/// A port's id: its index among the switch's ports (the configured ports in file order, then
/// the host port). Tables indexed by port (per-worker counters, slots) use [`PortId::index`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortId(pub u16);

impl PortId {
    /// The port's index, for tables indexed by port.
    #[inline]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The id of the port at `index` among the switch's ports (at most 65 of them: the
    /// config's 64 and the host port).
    #[inline]
    pub fn from_index(index: usize) -> PortId {
        debug_assert!(index <= usize::from(u16::MAX), "a port index is small");
        #[expect(clippy::cast_possible_truncation, reason = "a switch has at most 65 ports")]
        PortId(index as u16)
    }
}

impl core::fmt::Display for PortId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.0.fmt(f)
    }
}

/// Identifies a pool (a UMEM group): its index among the switch's pools, below
/// [`crate::pool::MAX_POOLS`]. Frames of different pools are never returned in the same bulk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u16);

impl PoolId {
    /// The pool's index, for tables indexed by pool.
    #[inline]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl core::fmt::Display for PoolId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.0.fmt(f)
    }
}

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

impl Desc {
    /// The descriptor of a copy of this packet placed at `addr` (its flags start clear).
    #[inline]
    pub fn copy_at(self, addr: u64) -> Desc {
        Desc { addr, len: self.len, options: 0 }
    }
}
