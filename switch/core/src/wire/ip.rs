//! IPv4 and IPv6 header views.

use super::checksum::checksum;
use super::ethernet::Truncated;

pub const IPV4_MIN_HEADER_LEN: usize = 20;
pub const IPV6_HEADER_LEN: usize = 40;

/// A checked IPv4 header: version 4, IHL ≥ 5, header and total length inside the buffer.
#[derive(Clone, Copy)]
pub struct Ipv4Packet<'a> {
    buf: &'a [u8],
}

impl<'a> Ipv4Packet<'a> {
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, Truncated> {
        if buf.len() < IPV4_MIN_HEADER_LEN || buf[0] >> 4 != 4 {
            return Err(Truncated);
        }
        let hl = ((buf[0] & 0x0f) as usize) * 4;
        let total = u16::from_be_bytes([buf[2], buf[3]]) as usize;
        if hl < IPV4_MIN_HEADER_LEN || hl > buf.len() || total < hl || total > buf.len() {
            return Err(Truncated);
        }
        Ok(Self { buf })
    }

    pub fn header_len(&self) -> usize {
        ((self.buf[0] & 0x0f) as usize) * 4
    }

    pub fn total_len(&self) -> usize {
        u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize
    }

    pub fn protocol(&self) -> u8 {
        self.buf[9]
    }

    pub fn src(&self) -> [u8; 4] {
        [self.buf[12], self.buf[13], self.buf[14], self.buf[15]]
    }

    pub fn dst(&self) -> [u8; 4] {
        [self.buf[16], self.buf[17], self.buf[18], self.buf[19]]
    }

    /// Fragment offset in 8-byte units.
    pub fn fragment_offset(&self) -> u16 {
        u16::from_be_bytes([self.buf[6], self.buf[7]]) & 0x1fff
    }

    pub fn is_fragment(&self) -> bool {
        self.fragment_offset() != 0 || self.buf[6] & 0x20 != 0
    }

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
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, Truncated> {
        if buf.len() < IPV6_HEADER_LEN || buf[0] >> 4 != 6 {
            return Err(Truncated);
        }
        let payload = u16::from_be_bytes([buf[4], buf[5]]) as usize;
        if IPV6_HEADER_LEN + payload > buf.len() {
            return Err(Truncated);
        }
        Ok(Self { buf })
    }

    pub fn next_header(&self) -> u8 {
        self.buf[6]
    }

    pub fn src(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf[8..24]);
        a
    }

    pub fn dst(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf[24..40]);
        a
    }

    /// Walks up to four extension headers (hop-by-hop, routing, fragment, destination options)
    /// and returns (upper-layer protocol, its offset from the IPv6 header, first fragment?).
    pub fn upper_layer(&self) -> Result<(u8, usize, bool), Truncated> {
        let mut nh = self.next_header();
        let mut off = IPV6_HEADER_LEN;
        let mut first = true;
        for _ in 0..4 {
            match nh {
                0 | 43 | 60 => {
                    let h = self.buf.get(off..off + 2).ok_or(Truncated)?;
                    nh = h[0];
                    off += (h[1] as usize + 1) * 8;
                }
                44 => {
                    let h = self.buf.get(off..off + 8).ok_or(Truncated)?;
                    nh = h[0];
                    first = u16::from_be_bytes([h[2], h[3]]) >> 3 == 0;
                    off += 8;
                }
                _ => break,
            }
        }
        if off > self.buf.len() {
            return Err(Truncated);
        }
        Ok((nh, off, first))
    }
}
