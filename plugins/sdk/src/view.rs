//! Zero-copy, panic-free views of a batch and of the packet headers in it.
//!
//! Every view borrows the batch buffer the host wrote; nothing is copied or allocated. Header
//! accessors return `Option`: `None` when the packet has no such header or when the header
//! lies beyond the plugin's snapshot (`header-bytes` in the YAML was set too small).

use crate::abi::{self, flags, hdr, rec};

#[inline(always)]
fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Why a byte string is not a valid batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than the 16-byte batch header.
    TooShort,
    /// The header's layout version (carried here) is not [`abi::LAYOUT_VERSION`]: the batch was
    /// written for another ABI version.
    BadVersion(u16),
    /// `header-bytes` is over [`abi::MAX_HEADER_BYTES`], or the stride is not
    /// [`abi::stride`]`(header-bytes)`.
    BadStride,
    /// The byte length is not 16 + count × stride.
    BadLength,
}

/// One batch as the host wrote it (see the BATCH LAYOUT in `wit/plugin.wit`).
#[derive(Clone, Copy)]
pub struct Batch<'a> {
    bytes: &'a [u8],
    count: usize,
    stride: usize,
}

impl<'a> Batch<'a> {
    /// Checks the header once; after that no accessor can panic.
    pub fn new(bytes: &'a [u8]) -> Result<Self, BatchError> {
        if bytes.len() < abi::BATCH_HEADER_LEN {
            return Err(BatchError::TooShort);
        }
        let version = u16_at(bytes, hdr::VERSION);
        if version != abi::LAYOUT_VERSION {
            return Err(BatchError::BadVersion(version));
        }
        let count = u16_at(bytes, hdr::COUNT) as usize;
        let stride = u16_at(bytes, hdr::STRIDE) as usize;
        let n = u16_at(bytes, hdr::HEADER_BYTES) as usize;
        if n > abi::MAX_HEADER_BYTES || stride != abi::stride(n) {
            return Err(BatchError::BadStride);
        }
        if bytes.len() != abi::BATCH_HEADER_LEN + count * stride {
            return Err(BatchError::BadLength);
        }
        Ok(Self { bytes, count, stride })
    }

    /// Packets in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the batch has no packets (the switch never sends an empty one).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Ingress port of every packet in the batch.
    #[inline]
    pub fn in_port(&self) -> u16 {
        u16_at(self.bytes, hdr::IN_PORT)
    }

    /// Ingress queue of every packet in the batch.
    #[inline]
    pub fn queue(&self) -> u16 {
        u16_at(self.bytes, hdr::QUEUE)
    }

    /// The per-plugin header snapshot size N.
    #[inline]
    pub fn header_bytes(&self) -> usize {
        u16_at(self.bytes, hdr::HEADER_BYTES) as usize
    }

    /// Packet `i`, or `None` past the end.
    #[inline]
    pub fn get(&self, i: usize) -> Option<Packet<'a>> {
        if i >= self.count {
            return None;
        }
        let start = abi::BATCH_HEADER_LEN + i * self.stride;
        Some(Packet::from_record(&self.bytes[start..start + self.stride]))
    }

    /// The packets in order.
    #[inline]
    pub fn packets(&self) -> impl ExactSizeIterator<Item = Packet<'a>> + 'a {
        self.bytes[abi::BATCH_HEADER_LEN..].chunks_exact(self.stride).map(Packet::from_record)
    }
}

/// One packet: its metadata and the snapshot of its first bytes.
#[derive(Clone, Copy)]
pub struct Packet<'a> {
    rec: &'a [u8],
    /// The valid snapshot bytes (`caplen` long).
    headers: &'a [u8],
}

impl<'a> Packet<'a> {
    #[inline]
    fn from_record(rec: &'a [u8]) -> Self {
        let cap = (u16_at(rec, rec::CAPLEN) as usize).min(rec.len() - abi::RECORD_META_LEN);
        Self { rec, headers: &rec[rec::HEADERS..rec::HEADERS + cap] }
    }

    /// Frame length in bytes (the whole frame, not only the snapshot).
    #[inline]
    pub fn len(&self) -> usize {
        u16_at(self.rec, rec::LEN) as usize
    }

    /// Whether the frame length is 0, which no frame from the switch has.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Raw flags (see [`abi::flags`]).
    #[inline]
    pub fn flags(&self) -> u16 {
        u16_at(self.rec, rec::FLAGS)
    }

    /// Whether `flag`, one of the [`abi::flags`] bits (for example `flags::FRAGMENT`), is set.
    #[inline]
    pub fn has(&self, flag: u16) -> bool {
        self.flags() & flag != 0
    }

    /// The VLAN the switch switches this frame in: its 802.1Q tag's VID, or the ingress port's
    /// PVID for an untagged or priority-tagged frame. `None` only where no VLAN is known (a
    /// switch not in `l2` mode, or an untagged frame in the test harness).
    #[inline]
    pub fn vlan(&self) -> Option<u16> {
        Some(u16_at(self.rec, rec::VLAN)).filter(|&v| v != 0)
    }

    /// Whether the frame arrived with a VLAN tag (802.1Q or 802.1ad).
    #[inline]
    pub fn tagged(&self) -> bool {
        self.has(flags::VLAN)
    }

    /// Ethertype after the VLAN tags.
    #[inline]
    pub fn ethertype(&self) -> u16 {
        u16_at(self.rec, rec::ETHERTYPE)
    }

    /// IP protocol number, `None` when not IP.
    #[inline]
    pub fn ip_proto(&self) -> Option<u8> {
        (self.has(flags::IPV4) || self.has(flags::IPV6)).then(|| self.rec[rec::IP_PROTO])
    }

    /// Offset of the IPv4/IPv6 header in the frame and in [`Packet::headers`]; 0 when not IP. It
    /// may lie past the snapshot: prefer [`Packet::ipv4`] and [`Packet::ipv6`].
    #[inline]
    pub fn l3_offset(&self) -> usize {
        u16_at(self.rec, rec::L3_OFFSET) as usize
    }

    /// Offset of the TCP/UDP header in the frame and in [`Packet::headers`]; 0 when not parsed. It
    /// may lie past the snapshot: prefer [`Packet::ports`], which also checks the flag.
    #[inline]
    pub fn l4_offset(&self) -> usize {
        u16_at(self.rec, rec::L4_OFFSET) as usize
    }

    /// The snapshot: the frame's first `min(len, header-bytes)` bytes.
    #[inline]
    pub fn headers(&self) -> &'a [u8] {
        self.headers
    }

    /// The Ethernet header, when the snapshot holds it.
    #[inline]
    pub fn ethernet(&self) -> Option<Ethernet<'a>> {
        self.headers.get(..14).map(|b| Ethernet { b })
    }

    /// The IPv4 header (fixed 20 bytes), when the packet is IPv4 and the snapshot holds it.
    #[inline]
    pub fn ipv4(&self) -> Option<Ipv4<'a>> {
        if !self.has(flags::IPV4) {
            return None;
        }
        let o = self.l3_offset();
        self.headers.get(o..o + 20).map(|b| Ipv4 { b })
    }

    /// The IPv6 header (fixed 40 bytes), when the packet is IPv6 and the snapshot holds it.
    #[inline]
    pub fn ipv6(&self) -> Option<Ipv6<'a>> {
        if !self.has(flags::IPV6) {
            return None;
        }
        let o = self.l3_offset();
        self.headers.get(o..o + 40).map(|b| Ipv6 { b })
    }

    /// Source and destination addresses as 16 bytes each (IPv4 as `::ffff:a.b.c.d`).
    #[inline]
    pub fn ip_addrs(&self) -> Option<([u8; 16], [u8; 16])> {
        if let Some(ip) = self.ipv4() {
            Some((mapped(ip.src()), mapped(ip.dst())))
        } else {
            self.ipv6().map(|ip| (ip.src(), ip.dst()))
        }
    }

    /// TCP/UDP source and destination ports, when parsed and inside the snapshot. A packet
    /// whose IP header is inside the snapshot and whose ports are not is dropped by the switch
    /// whatever the plugin answers, so `None` here never lets a port rule be skipped.
    #[inline]
    pub fn ports(&self) -> Option<(u16, u16)> {
        if !self.has(flags::L4_PORTS) {
            return None;
        }
        let o = self.l4_offset();
        let b = self.headers.get(o..o + 4)?;
        Some((u16::from_be_bytes([b[0], b[1]]), u16::from_be_bytes([b[2], b[3]])))
    }
}

/// `a.b.c.d` as the IPv4-mapped IPv6 address `::ffff:a.b.c.d`.
#[inline]
pub fn mapped(a: [u8; 4]) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[10] = 0xff;
    m[11] = 0xff;
    m[12..].copy_from_slice(&a);
    m
}

/// An Ethernet II header.
#[derive(Clone, Copy)]
pub struct Ethernet<'a> {
    b: &'a [u8],
}

impl Ethernet<'_> {
    /// Destination MAC address, in wire order.
    #[inline]
    pub fn dst(&self) -> [u8; 6] {
        [self.b[0], self.b[1], self.b[2], self.b[3], self.b[4], self.b[5]]
    }
    /// Source MAC address, in wire order.
    #[inline]
    pub fn src(&self) -> [u8; 6] {
        [self.b[6], self.b[7], self.b[8], self.b[9], self.b[10], self.b[11]]
    }
    /// The ethertype field of the outer header (0x8100 when VLAN-tagged).
    #[inline]
    pub fn ethertype(&self) -> u16 {
        u16::from_be_bytes([self.b[12], self.b[13]])
    }
}

/// The fixed part of an IPv4 header.
#[derive(Clone, Copy)]
pub struct Ipv4<'a> {
    b: &'a [u8],
}

impl Ipv4<'_> {
    /// Source address in wire order: `a.b.c.d` is `[a, b, c, d]`.
    #[inline]
    pub fn src(&self) -> [u8; 4] {
        [self.b[12], self.b[13], self.b[14], self.b[15]]
    }
    /// Destination address in wire order: `a.b.c.d` is `[a, b, c, d]`.
    #[inline]
    pub fn dst(&self) -> [u8; 4] {
        [self.b[16], self.b[17], self.b[18], self.b[19]]
    }
    /// The source address as one load: `u32::from_ne_bytes(src())`. Compare it with constants
    /// built the same way (`u32::from_ne_bytes(octets)`), masks included: no byte swap per
    /// packet, which matters in Wasm (it has no byte-swap instruction).
    #[inline]
    pub fn src_ne(&self) -> u32 {
        u32::from_ne_bytes(self.src())
    }
    /// The destination address as one load (see [`Ipv4::src_ne`]).
    #[inline]
    pub fn dst_ne(&self) -> u32 {
        u32::from_ne_bytes(self.dst())
    }
    /// Protocol field (6 TCP, 17 UDP, 1 ICMP, ...); the same as [`Packet::ip_proto`].
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.b[9]
    }
    /// Time to live, as the packet arrived (0 to 255).
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.b[8]
    }
    /// DSCP, the top 6 bits of the DS (formerly TOS) byte: 0 to 63.
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.b[1] >> 2
    }
    /// Total length field: IP header and payload in bytes, without the Ethernet header or padding.
    #[inline]
    pub fn total_len(&self) -> u16 {
        u16::from_be_bytes([self.b[2], self.b[3]])
    }
}

/// The fixed IPv6 header.
#[derive(Clone, Copy)]
pub struct Ipv6<'a> {
    b: &'a [u8],
}

impl Ipv6<'_> {
    /// Source address, 16 bytes in wire order.
    #[inline]
    pub fn src(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b[8..24]);
        a
    }
    /// Destination address, 16 bytes in wire order.
    #[inline]
    pub fn dst(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b[24..40]);
        a
    }
    /// Next header of the fixed header: the first extension header when there is one;
    /// [`Packet::ip_proto`] gives the final upper-layer protocol.
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.b[6]
    }
    /// Hop limit, as the packet arrived (0 to 255).
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.b[7]
    }
}

/// The verdicts being written for one batch; every entry starts as [`crate::Verdict::Pass`].
pub struct Verdicts<'a> {
    out: &'a mut [u8],
}

impl<'a> Verdicts<'a> {
    /// Wraps a zeroed buffer of `4 * count` bytes (the SDK runtime and harness do this).
    #[inline]
    pub fn new(out: &'a mut [u8]) -> Self {
        Self { out }
    }

    /// Packets in the batch: one verdict each.
    #[inline]
    pub fn len(&self) -> usize {
        self.out.len() / abi::VERDICT_LEN
    }

    /// Whether the batch has no packets.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Sets the verdict of packet `i` (ignored past the end of the batch).
    #[inline]
    pub fn set(&mut self, i: usize, v: crate::Verdict) {
        if let Some(r) = self.out.get_mut(i * 4..i * 4 + 4) {
            r.copy_from_slice(&v.encode());
        }
    }

    /// The verdict of packet `i` as set so far.
    #[inline]
    pub fn get(&self, i: usize) -> Option<crate::Verdict> {
        let r = self.out.get(i * 4..i * 4 + 4)?;
        crate::Verdict::decode([r[0], r[1], r[2], r[3]])
    }
}
