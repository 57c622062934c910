//! Ethernet II header view.

use std::fmt;

pub const HEADER_LEN: usize = 14;

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Group (broadcast or multicast) address: I/G bit set.
    pub fn is_group(&self) -> bool {
        self.0[0] & 1 != 0
    }

    pub fn to_u64(self) -> u64 {
        let b = self.0;
        u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]])
    }

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

impl std::str::FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(format!("`{s}` is not a MAC address (expected six hex bytes like 02:00:00:00:00:01)"));
        }
        let mut a = [0u8; 6];
        for (d, p) in a.iter_mut().zip(parts) {
            *d = u8::from_str_radix(p, 16).map_err(|_| format!("`{s}` is not a MAC address (bad byte `{p}`)"))?;
        }
        Ok(MacAddr(a))
    }
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
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, Truncated> {
        if buf.len() < HEADER_LEN {
            return Err(Truncated);
        }
        Ok(Self { buf })
    }

    pub fn dst(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf[0..6])
    }

    pub fn src(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buf[6..12])
    }

    pub fn ethertype(&self) -> u16 {
        u16::from_be_bytes([self.buf[12], self.buf[13]])
    }

    pub fn payload(&self) -> &'a [u8] {
        &self.buf[HEADER_LEN..]
    }
}
