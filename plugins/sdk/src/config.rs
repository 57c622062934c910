//! Small helpers for parsing a plugin's config string without pulling a parser into the guest.
//!
//! The example plugins use a line format that also reads well as a YAML block scalar:
//!
//! ```yaml
//! config: |
//!   default deny
//!   allow proto=udp dport=53        # comments run to the end of the line
//!   - deny src=10.0.0.0/8           # a leading "- " is ignored
//! ```

/// Non-empty lines with comments and a leading `- ` removed, with their 1-based numbers.
pub fn lines(config: &str) -> impl Iterator<Item = (usize, &str)> {
    config.lines().enumerate().filter_map(|(i, l)| {
        let l = l.split('#').next().unwrap_or("").trim();
        let l = l.strip_prefix("- ").unwrap_or(l).trim();
        (!l.is_empty()).then_some((i + 1, l))
    })
}

/// Splits `key=value`.
pub fn kv(token: &str) -> Option<(&str, &str)> {
    token.split_once('=')
}

/// An IP prefix over 16-byte addresses (IPv4 as `::ffff:a.b.c.d/96+len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// Network address as a big-endian `u128` of the 16-byte address, host bits zero (IPv4 as
    /// `::ffff:a.b.c.d`).
    pub net: u128,
    /// Ones over the prefix bits, zeros over the host bits; an IPv4 `/n` covers 96 + n bits, and
    /// [`Cidr::ANY`]'s mask is 0.
    pub mask: u128,
}

impl Cidr {
    /// Matches every address.
    pub const ANY: Cidr = Cidr { net: 0, mask: 0 };

    /// Whether `addr`, a 16-byte address as a big-endian `u128` (IPv4 mapped, as
    /// `u128::from_be_bytes(src)` for `src` from [`crate::Packet::ip_addrs`]), lies in the prefix.
    #[inline]
    pub fn contains(&self, addr: u128) -> bool {
        addr & self.mask == self.net
    }

    /// Parses `any`, `a.b.c.d[/len]` or an IPv6 address `x:y::z[/len]`.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        if s == "any" || s == "*" {
            return Ok(Cidr::ANY);
        }
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l.parse::<u32>().map_err(|_| format!("bad prefix length in {s:?}"))?)),
            None => (s, None),
        };
        let (bits, max) = if let Ok(v4) = addr.parse::<std::net::Ipv4Addr>() {
            (u128::from_be_bytes(crate::view::mapped(v4.octets())), 32)
        } else if let Ok(v6) = addr.parse::<std::net::Ipv6Addr>() {
            (u128::from(v6), 128)
        } else {
            return Err(format!("bad address {addr:?}"));
        };
        let len = len.unwrap_or(max);
        if len > max {
            return Err(format!("prefix length {len} too long in {s:?}"));
        }
        let len = len + (128 - max);
        let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
        Ok(Cidr { net: bits & mask, mask })
    }
}

/// An inclusive port range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    /// Lowest port in the range, inclusive.
    pub lo: u16,
    /// Highest port in the range, inclusive; never below `lo` after [`PortRange::parse`].
    pub hi: u16,
}

impl PortRange {
    /// Every port, 0 to 65535 (what `any` and `*` parse to).
    pub const ANY: PortRange = PortRange { lo: 0, hi: u16::MAX };

    /// Whether port `p` lies in `lo..=hi`.
    #[inline]
    pub fn contains(&self, p: u16) -> bool {
        self.lo <= p && p <= self.hi
    }

    /// Parses `any`, `N` or `N-M`.
    pub fn parse(s: &str) -> Result<PortRange, String> {
        if s == "any" || s == "*" {
            return Ok(PortRange::ANY);
        }
        // The whole value is quoted: in `-1` or `80-` the bad part alone would be `""`.
        let p = |x: &str| {
            x.parse::<u16>()
                .map_err(|_| format!("bad port {s:?}: expected a port 0-65535, a range N-M of them, or any"))
        };
        let r = match s.split_once('-') {
            Some((a, b)) => PortRange { lo: p(a)?, hi: p(b)? },
            None => {
                let v = p(s)?;
                PortRange { lo: v, hi: v }
            }
        };
        if r.lo > r.hi {
            return Err(format!("empty port range {s:?}: in N-M, N must not be above M"));
        }
        Ok(r)
    }
}

/// Parses `aa:bb:cc:dd:ee:ff` (one or two hex digits per byte), with the switch's own parser.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    s.parse::<wasmswitch_wire::MacAddr>().map(|m| m.0).map_err(|_| {
        format!("bad MAC address {s:?}: expected six hex octets separated by colons, like 02:00:00:00:00:0a")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cidrs_ranges_macs() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains(u128::from_be_bytes(crate::view::mapped([10, 9, 8, 7]))));
        assert!(!c.contains(u128::from_be_bytes(crate::view::mapped([11, 0, 0, 0]))));
        assert!(Cidr::parse("2001:db8::/32")
            .unwrap()
            .contains(u128::from("2001:db8::1".parse::<std::net::Ipv6Addr>().unwrap())));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(u128::from_be_bytes(crate::view::mapped([1, 2, 3, 4]))));
        assert!(Cidr::parse("1.2.3.4/33").is_err());
        assert!(Cidr::parse("nope").is_err());
        assert_eq!(PortRange::parse("10-20").unwrap(), PortRange { lo: 10, hi: 20 });
        assert!(PortRange::parse("20-10").is_err());
        assert_eq!(parse_mac("02:00:00:00:00:0a").unwrap(), [2, 0, 0, 0, 0, 10]);
        assert!(parse_mac("02:00:00:00:00").is_err());
        let l: Vec<_> = lines("a\n  # c\n- b # x\n").collect();
        assert_eq!(l, vec![(1, "a"), (3, "b")]);
    }
}
