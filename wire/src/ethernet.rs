//! Ethernet II header view.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// An untagged Ethernet II header (two addresses and the ethertype), in bytes.
pub const HEADER_LEN: usize = 14;
/// Length of an 802.1Q tag (TPID and TCI), inserted between the source MAC and the ethertype.
pub const TAG_LEN: usize = 4;

/// Byte ranges of the header (and of an 802.1Q tag where there is one).
pub mod field {
    use core::ops::Range;
    /// Destination address.
    pub const DST: Range<usize> = 0..6;
    /// Source address.
    pub const SRC: Range<usize> = 6..12;
    /// The ethertype, or the TPID of the outer tag.
    pub const ETHERTYPE: Range<usize> = 12..14;
    /// The outer tag's TCI (PCP, DEI, VID) when the frame is tagged.
    pub const TCI: Range<usize> = 14..16;
    /// Both addresses: what moves when a tag is pushed or popped in place.
    pub const ADDRS: Range<usize> = 0..12;
}

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Group (broadcast or multicast) address: I/G bit set.
    #[inline]
    pub fn is_group(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// An address a station can have: neither a group address nor all zeros (the bridge's
    /// `is_valid_ether_addr`).
    #[inline]
    pub fn is_station(&self) -> bool {
        !self.is_group() && self.0 != [0; 6]
    }

    /// IEEE 802.1D link-local group address (01:80:C2:00:00:00 to 0F: STP, LACP, LLDP, 802.1X,
    /// pause): never forwarded by a bridge.
    #[inline]
    pub fn is_link_local(&self) -> bool {
        let b = self.0;
        b[..5] == [0x01, 0x80, 0xc2, 0x00, 0x00] && b[5] & 0xf0 == 0
    }

    /// The address as the low 48 bits of a `u64`, its first byte the most significant.
    #[inline]
    pub fn to_u64(self) -> u64 {
        let b = self.0;
        u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    /// The inverse of [`MacAddr::to_u64`]: the low 48 bits of `v` (the rest is ignored).
    #[inline]
    pub fn from_u64(v: u64) -> Self {
        let b = v.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// Reads the address from the first 6 bytes of `b` (which must be that long).
    #[inline]
    pub fn from_bytes(b: &[u8]) -> Self {
        let mut a = [0u8; 6];
        a.copy_from_slice(&b[..6]);
        MacAddr(a)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl core::str::FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(format!("`{s}` is not a MAC address (expected six hex bytes like 02:00:00:00:00:01)"));
        }
        let mut a = [0u8; 6];
        for (d, p) in a.iter_mut().zip(parts) {
            // One or two hex digits, nothing else: `from_str_radix` alone would take `+c` or
            // `0001` as a byte.
            let bad = || format!("`{s}` is not a MAC address (bad byte `{p}`: expected 1-2 hex digits)");
            if !(1..=2).contains(&p.len()) || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *d = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        Ok(MacAddr(a))
    }
}

/// The destination and source addresses of `frame` as [`MacAddr::to_u64`] gives them (the form
/// the FDB hashes and compares), each read with one 8-byte load: 8 bytes from either address's
/// start lie inside a whole header. `None` when `frame` is shorter than a header.
#[inline]
pub fn addr_bits(frame: &[u8]) -> Option<(u64, u64)> {
    let at = |start: usize| -> Option<u64> {
        let b: [u8; 8] = frame.get(start..start + 8)?.try_into().ok()?;
        Some(u64::from_be_bytes(b) >> 16)
    };
    Some((at(field::DST.start)?, at(field::SRC.start)?))
}

/// The frame was shorter than the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

/// A checked view of an Ethernet II frame.
#[derive(Clone, Copy)]
pub struct EthernetFrame<'a> {
    buf: &'a [u8],
}

impl<'a> EthernetFrame<'a> {
    /// Views `buf`; `Err` when it is shorter than [`HEADER_LEN`].
    #[inline]
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, Truncated> {
        if buf.len() < HEADER_LEN {
            return Err(Truncated);
        }
        Ok(Self { buf })
    }

    /// Destination address.
    #[inline]
    pub fn dst(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf[0..6])
    }

    /// Source address.
    #[inline]
    pub fn src(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf[6..12])
    }

    /// The ethertype field: the outer tag's TPID when the frame is tagged.
    #[inline]
    pub fn ethertype(&self) -> u16 {
        u16::from_be_bytes([self.buf[12], self.buf[13]])
    }

    /// Everything after the 14-byte header (the tag's TCI and inner ethertype first, when tagged).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buf[HEADER_LEN..]
    }
}

/// Pushes an 802.1Q tag with `tci` in place: `buf` is [`TAG_LEN`] bytes of headroom followed by
/// an untagged frame of at least [`HEADER_LEN`] bytes, and becomes the tagged frame. Only the
/// two addresses move. Returns false (and changes nothing) when `buf` is too short.
#[inline]
pub fn push_tag(buf: &mut [u8], tci: u16) -> bool {
    if buf.len() < TAG_LEN + HEADER_LEN {
        return false;
    }
    buf.copy_within(TAG_LEN..TAG_LEN + field::ADDRS.end, 0);
    buf[field::ETHERTYPE].copy_from_slice(&crate::ethertype::VLAN.to_be_bytes());
    buf[field::TCI].copy_from_slice(&tci.to_be_bytes());
    true
}

/// Pops the outer tag in place: `frame` is a tagged frame, and `frame[TAG_LEN..]` becomes the
/// untagged one. Returns false (and changes nothing) when `frame` is too short to hold a tag.
#[inline]
pub fn pop_tag(frame: &mut [u8]) -> bool {
    if frame.len() < TAG_LEN + HEADER_LEN {
        return false;
    }
    frame.copy_within(field::ADDRS, TAG_LEN);
    true
}

/// The outer tag's TCI, when the frame has a tag (whatever its TPID) long enough to read.
#[inline]
pub fn tci(frame: &[u8]) -> Option<u16> {
    frame.get(field::TCI).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// Rewrites the VID of the outer tag, keeping its priority and DEI bits.
#[inline]
pub fn set_vid(frame: &mut [u8], vid: u16) {
    if let Some(b) = frame.get_mut(field::TCI) {
        let tci = (u16::from_be_bytes([b[0], b[1]]) & 0xf000) | (vid & 0x0fff);
        b.copy_from_slice(&tci.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_then_pop_restores_the_frame() {
        let frame: Vec<u8> = (0..60u8).collect();
        let mut buf = vec![0xee; TAG_LEN];
        buf.extend_from_slice(&frame);
        assert!(push_tag(&mut buf, 0xa00a));
        assert_eq!(&buf[0..12], &frame[0..12]);
        assert_eq!(&buf[12..16], &[0x81, 0x00, 0xa0, 0x0a]);
        assert_eq!(&buf[16..], &frame[12..]);
        assert_eq!(tci(&buf), Some(0xa00a));
        set_vid(&mut buf, 20);
        assert_eq!(tci(&buf), Some(0xa014), "priority and DEI bits kept");
        assert!(pop_tag(&mut buf));
        assert_eq!(&buf[TAG_LEN..], &frame[..]);
        assert!(!push_tag(&mut [0u8; 17], 1), "too short: nothing changes");
        assert!(!pop_tag(&mut [0u8; 17]));
    }

    #[test]
    fn addr_bits_are_the_two_addresses_as_to_u64_gives_them() {
        let frame: Vec<u8> = (1..=u8::try_from(HEADER_LEN).unwrap()).collect();
        let eth = EthernetFrame::new_checked(&frame).unwrap();
        assert_eq!(addr_bits(&frame), Some((eth.dst().to_u64(), eth.src().to_u64())));
        assert_eq!(addr_bits(&frame), Some((0x0102_0304_0506, 0x0708_090a_0b0c)));
        assert_eq!(addr_bits(&frame[..HEADER_LEN - 1]), None, "one byte short of a header");
        assert_eq!(addr_bits(&[]), None);
    }

    #[test]
    fn parses_only_six_bytes_of_one_or_two_hex_digits() {
        let ok = |t: &str| t.parse::<MacAddr>().unwrap();
        assert_eq!(ok("02:00:5e:AB:cd:0f"), MacAddr([2, 0, 0x5e, 0xab, 0xcd, 0x0f]));
        assert_eq!(ok("2:0:0:0:0:1"), MacAddr([2, 0, 0, 0, 0, 1]), "one digit, as `ip` takes it");
        for bad in ["+2:00:00:00:00:01", "02:00:00:00:00:0001", "02:00:00:00::01", "02:00:00:00:00:1g", "02 :0:0:0:0:1"]
        {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
        }
        assert!(ok("02:00:00:00:00:01").to_string().parse::<MacAddr>().is_ok(), "round trip");
    }

    #[test]
    fn link_local_range() {
        let ll = |last| MacAddr([0x01, 0x80, 0xc2, 0, 0, last]);
        assert!(ll(0x00).is_link_local() && ll(0x0e).is_link_local() && ll(0x0f).is_link_local());
        assert!(!ll(0x10).is_link_local());
        assert!(!MacAddr::BROADCAST.is_link_local());
    }
}
