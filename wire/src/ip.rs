//! IPv4 and IPv6 header views.

use crate::checksum::checksum;
use crate::ethernet::Truncated;

/// An IPv4 header without options (IHL 5), in bytes.
pub const IPV4_MIN_HEADER_LEN: usize = 20;
/// The IPv6 fixed header, in bytes; extension headers follow it.
pub const IPV6_HEADER_LEN: usize = 40;

/// IPv4 header fields (RFC 791), as offsets into the header.
pub mod ipv4_field {
    use core::ops::Range;
    /// Version (high nibble) and header length in 32-bit words (low nibble).
    pub const VER_IHL: usize = 0;
    /// Total length in bytes, header included (Ethernet padding may follow it).
    pub const TOTAL_LEN: Range<usize> = 2..4;
    /// Flags (3 bits, `MF` is 0x20 of the first byte) and fragment offset (13 bits).
    pub const FLAGS_FRAG: Range<usize> = 6..8;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Upper-layer protocol ([`crate::ipproto`]).
    pub const PROTOCOL: usize = 9;
    /// Header checksum (over the header only).
    pub const CHECKSUM: Range<usize> = 10..12;
    /// Source address.
    pub const SRC: Range<usize> = 12..16;
    /// Destination address.
    pub const DST: Range<usize> = 16..20;
}

/// IPv6 fixed header fields (RFC 8200), as offsets into the header.
pub mod ipv6_field {
    use core::ops::Range;
    /// Version (high nibble of the first byte), traffic class and flow label.
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    /// Payload length in bytes: all that follows the fixed header, extension headers included.
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    /// The first extension header's type, or the upper-layer protocol.
    pub const NEXT_HEADER: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC: Range<usize> = 8..24;
    /// Destination address.
    pub const DST: Range<usize> = 24..40;
}

#[inline]
fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    u16::from_be_bytes([b[r.start], b[r.start + 1]])
}

/// A checked IPv4 header: version 4, IHL ≥ 5, header and total length inside the buffer.
#[derive(Clone, Copy)]
pub struct Ipv4Packet<'a> {
    buf: &'a [u8],
}

impl<'a> Ipv4Packet<'a> {
    /// Views `buf` (starting at the IPv4 header) after the checks [`Ipv4Packet`] lists.
    #[inline]
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, Truncated> {
        if buf.len() < IPV4_MIN_HEADER_LEN || buf[ipv4_field::VER_IHL] >> 4 != 4 {
            return Err(Truncated);
        }
        let hl = ((buf[ipv4_field::VER_IHL] & 0x0f) as usize) * 4;
        let total = be16(buf, ipv4_field::TOTAL_LEN) as usize;
        if hl < IPV4_MIN_HEADER_LEN || hl > buf.len() || total < hl || total > buf.len() {
            return Err(Truncated);
        }
        Ok(Self { buf })
    }

    /// Header length in bytes (IHL × 4: 20 to 60).
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.buf[ipv4_field::VER_IHL] & 0x0f) as usize) * 4
    }

    /// The total length field: header and payload in bytes, at most the buffer's length.
    #[inline]
    pub fn total_len(&self) -> usize {
        be16(self.buf, ipv4_field::TOTAL_LEN) as usize
    }

    /// The upper-layer protocol ([`crate::ipproto`]).
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buf[ipv4_field::PROTOCOL]
    }

    /// Source address.
    #[inline]
    pub fn src(&self) -> [u8; 4] {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.buf[ipv4_field::SRC]);
        a
    }

    /// Destination address.
    #[inline]
    pub fn dst(&self) -> [u8; 4] {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.buf[ipv4_field::DST]);
        a
    }

    /// Fragment offset in 8-byte units.
    #[inline]
    pub fn fragment_offset(&self) -> u16 {
        be16(self.buf, ipv4_field::FLAGS_FRAG) & 0x1fff
    }

    /// A fragment: a non-zero offset or the more-fragments bit.
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.fragment_offset() != 0 || self.buf[ipv4_field::FLAGS_FRAG.start] & 0x20 != 0
    }

    /// Whether the header checksum verifies.
    #[inline]
    pub fn checksum_ok(&self) -> bool {
        checksum(&self.buf[..self.header_len()]) == 0
    }
}

/// A checked IPv6 header: version 6, payload length inside the buffer.
#[derive(Clone, Copy)]
pub struct Ipv6Packet<'a> {
    buf: &'a [u8],
}

impl<'a> Ipv6Packet<'a> {
    /// Views `buf` (starting at the IPv6 header) after the checks [`Ipv6Packet`] lists.
    #[inline]
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, Truncated> {
        if buf.len() < IPV6_HEADER_LEN || buf[ipv6_field::VER_TC_FLOW.start] >> 4 != 6 {
            return Err(Truncated);
        }
        let payload = be16(buf, ipv6_field::PAYLOAD_LEN) as usize;
        if IPV6_HEADER_LEN + payload > buf.len() {
            return Err(Truncated);
        }
        Ok(Self { buf })
    }

    /// The fixed header's next header: the first extension header's type, or the upper-layer
    /// protocol.
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.buf[ipv6_field::NEXT_HEADER]
    }

    /// Source address.
    #[inline]
    pub fn src(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf[ipv6_field::SRC]);
        a
    }

    /// Destination address.
    #[inline]
    pub fn dst(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf[ipv6_field::DST]);
        a
    }

    /// The IPv6 packet's end: the fixed header plus its payload length (Ethernet may pad the
    /// frame past it; [`Ipv6Packet::new_checked`] made sure the buffer holds it).
    #[inline]
    pub fn packet_len(&self) -> usize {
        IPV6_HEADER_LEN + be16(self.buf, ipv6_field::PAYLOAD_LEN) as usize
    }

    /// Follows the extension-header chain to the upper layer, as far as the packet goes: no
    /// count limit (Linux accepts any number), each header at least 8 bytes long, so the walk
    /// takes at most `payload length / 8` steps. `Err` when a header runs past the packet.
    ///
    /// Stops at the first header that is not an extension header ([`ext`]: TCP, UDP, ICMPv6,
    /// ESP, No Next Header, or a protocol it does not know), which is reported as the upper
    /// layer, and at a fragment header with a non-zero offset (what follows it is the middle
    /// of a payload, not headers), which reports that header's next header.
    #[inline]
    pub fn upper_layer(&self) -> Result<UpperLayer, Truncated> {
        let end = self.packet_len();
        let mut up = UpperLayer { proto: self.next_header(), offset: IPV6_HEADER_LEN, fragment: false, first: true };
        loop {
            if !ext::is_extension(up.proto) {
                return Ok(up);
            }
            // Every extension header starts with its next header and is at least 8 bytes long.
            let h = self.buf.get(up.offset..up.offset + 8).filter(|_| up.offset + 8 <= end).ok_or(Truncated)?;
            let len = match up.proto {
                // RFC 4302: the length is in 4-byte units, minus 2.
                ext::AH => (h[1] as usize + 2) * 4,
                ext::FRAGMENT => {
                    let offset_and_more = u16::from_be_bytes([h[2], h[3]]);
                    // An atomic fragment (offset 0, no more fragments; RFC 6946) is a whole packet.
                    up.fragment |= offset_and_more & 0xfff9 != 0;
                    if offset_and_more >> 3 != 0 {
                        up.first = false;
                        up.proto = h[0];
                        up.offset += 8;
                        return Ok(up);
                    }
                    8
                }
                // Hop-by-hop, routing, destination options, mobility, HIP, shim6: RFC 6564's
                // uniform format, the length in 8-byte units, minus 1.
                _ => (h[1] as usize + 1) * 8,
            };
            if up.offset + len > end {
                return Err(Truncated);
            }
            up.proto = h[0];
            up.offset += len;
        }
    }
}

/// What [`Ipv6Packet::upper_layer`] found at the end of the extension-header chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpperLayer {
    /// The upper-layer protocol (the last next-header value).
    pub proto: u8,
    /// Where its header starts, from the start of the IPv6 header.
    pub offset: usize,
    /// A fragment header that makes this a fragment (not an atomic one) was on the way.
    pub fragment: bool,
    /// Not a later fragment: the upper-layer header is here (RFC 8200 puts the whole chain in
    /// the first fragment).
    pub first: bool,
}

/// The IPv6 extension headers [`Ipv6Packet::upper_layer`] walks through: RFC 7045's list less
/// ESP (50), whose contents are encrypted, and No Next Header (59).
pub mod ext {
    /// Hop-by-hop options (RFC 8200).
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing header (RFC 8200).
    pub const ROUTING: u8 = 43;
    /// Fragment header (RFC 8200): always 8 bytes.
    pub const FRAGMENT: u8 = 44;
    /// Authentication header (RFC 4302): its length is in 4-byte units.
    pub const AH: u8 = 51;
    /// Destination options (RFC 8200).
    pub const DEST_OPTS: u8 = 60;
    /// Mobility header (RFC 6275).
    pub const MOBILITY: u8 = 135;
    /// Host Identity Protocol (RFC 7401).
    pub const HIP: u8 = 139;
    /// Shim6 (RFC 5533).
    pub const SHIM6: u8 = 140;

    /// Whether the walk goes through a header of type `nh`.
    #[inline]
    pub const fn is_extension(nh: u8) -> bool {
        matches!(nh, HOP_BY_HOP | ROUTING | FRAGMENT | AH | DEST_OPTS | MOBILITY | HIP | SHIM6)
    }
}
