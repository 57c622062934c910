//! Zero-copy packet views and the parser that fills [`PacketMeta`].
//!
//! Modelled on smoltcp's `wire`: each header type is a view over a byte slice whose
//! `new_checked` constructor verifies the length once; accessors after that cannot panic.
//! [`parse`] walks Ethernet, up to two VLAN tags, IPv4/IPv6 (every IPv6 extension header, to the
//! end of the chain) and TCP/UDP ports, and rejects (never panics on) runts, truncated headers and
//! inconsistent lengths.
//!
//! One crate for every reader and writer of frames: the switch core's parser, the plugin SDK's
//! native harness and its ABI flag bits, the TAP flow hash, the traffic generator and the fuzz
//! harness. It is `no_std` (with `alloc`, for the frame builders) so the SDK can build it for
//! wasm32.

#![cfg_attr(not(test), no_std)]
// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
// Every public item says what it is; casts that could drop bits say why they cannot.
#![warn(missing_docs)]
#![warn(clippy::cast_possible_truncation)]

extern crate alloc;

pub mod build;
pub mod checksum;
pub mod ethernet;
pub mod ip;

pub use ethernet::{EthernetFrame, MacAddr};
pub use ip::{Ipv4Packet, Ipv6Packet, UpperLayer};

/// Ethertypes the parser understands.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP (switched, never parsed past L2).
    pub const ARP: u16 = 0x0806;
    /// An 802.1Q tag's TPID (a C-tag).
    pub const VLAN: u16 = 0x8100;
    /// An 802.1ad tag's TPID (an S-tag, the outer tag of Q-in-Q).
    pub const QINQ: u16 = 0x88a8;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
}

/// IP protocol numbers the parser extracts ports for.
pub mod ipproto {
    /// TCP: ports parsed, 20-byte minimum header.
    pub const TCP: u8 = 6;
    /// UDP: ports parsed, 8-byte header.
    pub const UDP: u8 = 17;
    /// ICMP (no ports).
    pub const ICMP: u8 = 1;
    /// ICMPv6 (no ports).
    pub const ICMPV6: u8 = 58;
}

/// Why a frame could not be parsed. Each maps to a drop reason with its own counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than an Ethernet header (14 bytes).
    Runt,
    /// A VLAN tag is announced but cut short.
    TruncatedVlan,
    /// The IPv4/IPv6 header is cut short or inconsistent (version, IHL, lengths), or an IPv6
    /// extension header runs past the packet.
    BadL3,
    /// The TCP/UDP header is cut short.
    TruncatedL4,
    /// Longer than the port's maximum frame size.
    Oversize,
}

/// Flags in [`PacketMeta::flags`].
pub mod flags {
    /// The frame has at least one VLAN tag; [`PacketMeta::vlan`] is the outer one's VID.
    pub const VLAN: u16 = 1 << 0;
    /// An IPv4 header that passed [`crate::Ipv4Packet::new_checked`].
    pub const IPV4: u16 = 1 << 1;
    /// An IPv6 header that passed [`crate::Ipv6Packet::new_checked`].
    pub const IPV6: u16 = 1 << 2;
    /// A whole TCP/UDP header lies inside the IP packet at [`PacketMeta::l4_offset`]:
    /// [`PacketMeta::ports`] answers.
    pub const L4_PORTS: u16 = 1 << 3;
    /// An IP fragment, first or later (an atomic IPv6 fragment is not one).
    pub const FRAGMENT: u16 = 1 << 4;
    /// Destination MAC has the group bit (broadcast or multicast).
    pub const GROUP_DST: u16 = 1 << 5;
    /// The outer tag is an 802.1Q tag (TPID 0x8100), the one VLAN bridging switches on.
    pub const CTAG: u16 = 1 << 6;
}

/// Per-packet metadata produced by the parser: 16 bytes, four to a cache line. Only what the
/// datapath and the plugin batch use is stored; addresses and ports are read from the frame
/// when asked for ([`PacketMeta::ports`], [`PacketMeta::addrs`]), not copied for every packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketMeta {
    /// Frame length in bytes.
    pub len: u16,
    /// See [`flags`].
    pub flags: u16,
    /// VLAN id of the outer tag (0 when untagged) as parsed; the pipeline replaces it with the
    /// VLAN the frame is switched in before any plugin sees it.
    pub vlan: u16,
    /// Ethertype after the VLAN tags.
    pub ethertype: u16,
    /// Offset of the L3 header (0 when there is none).
    pub l3_offset: u16,
    /// Offset of the L4 header (0 when not parsed).
    pub l4_offset: u16,
    /// IP protocol (IPv4) or final next-header (IPv6); 0 when not IP.
    pub ip_proto: u8,
    /// Pads the struct to 16 bytes; the parser never writes it.
    pub _reserved: [u8; 3],
}

impl PacketMeta {
    /// Whether `flag` (one of [`flags`]) is set.
    #[inline]
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// As [`L2Info::ctag`], from the metadata [`parse_l2_into`] wrote.
    #[inline]
    pub fn ctag(&self) -> Option<u16> {
        self.has(flags::CTAG).then_some(self.vlan)
    }

    /// The TCP/UDP (source, destination) ports of `frame`, the frame this was parsed from;
    /// `None` when they were not parsed ([`flags::L4_PORTS`]).
    #[inline]
    pub fn ports(&self, frame: &[u8]) -> Option<(u16, u16)> {
        if !self.has(flags::L4_PORTS) {
            return None;
        }
        let l4 = frame.get(self.l4_offset as usize..)?.get(..4)?;
        Some((u16::from_be_bytes([l4[0], l4[1]]), u16::from_be_bytes([l4[2], l4[3]])))
    }

    /// The (source, destination) IP addresses of `frame`, the frame this was parsed from, IPv4
    /// as IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`); `None` when it is not IP.
    #[inline]
    pub fn addrs(&self, frame: &[u8]) -> Option<([u8; 16], [u8; 16])> {
        let l3 = frame.get(self.l3_offset as usize..)?;
        if self.has(flags::IPV4) {
            let ip = Ipv4Packet::new_checked(l3).ok()?;
            Some((mapped_v4(ip.src()), mapped_v4(ip.dst())))
        } else if self.has(flags::IPV6) {
            let ip = Ipv6Packet::new_checked(l3).ok()?;
            Some((ip.src(), ip.dst()))
        } else {
            None
        }
    }
}

impl PacketMeta {
    /// The Ethernet part of the metadata of a frame of `len` bytes, from [`parse_l2`]; the L3
    /// and L4 offsets are reset to 0 for [`parse_l3_into`] to fill.
    #[inline]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "frames are at most 64 KiB (the datapath's fit a 2 or 4 KiB pool frame)"
    )]
    pub fn set_l2(&mut self, len: usize, l2: &L2Info) {
        self.len = len as u16;
        self.flags = l2.flags;
        self.vlan = l2.vlan;
        self.ethertype = l2.ethertype;
        self.l3_offset = 0;
        self.l4_offset = 0;
    }
}

#[inline]
fn mapped_v4(a: [u8; 4]) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[10] = 0xff;
    m[11] = 0xff;
    m[12..].copy_from_slice(&a);
    m
}

/// Parses `frame` (at most `max_len` bytes long) into metadata.
#[inline]
pub fn parse(frame: &[u8], max_len: usize) -> Result<PacketMeta, ParseError> {
    let mut m = PacketMeta::default();
    parse_into(frame, max_len, &mut m)?;
    Ok(m)
}

/// Parses `frame` into `m` in place (the datapath's form: the metadata is written straight
/// into the batch, never returned by value through the stack): [`parse_l2_into`], then
/// [`parse_l3_into`].
#[inline]
pub fn parse_into(frame: &[u8], max_len: usize, m: &mut PacketMeta) -> Result<(), ParseError> {
    let l3 = parse_l2_into(frame, max_len, m)?;
    parse_l3_into(frame, l3, m)
}

/// What the Ethernet header and its tags say: [`parse_l2`]'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2Info {
    /// [`flags::GROUP_DST`], [`flags::VLAN`] and [`flags::CTAG`], as they apply.
    pub flags: u16,
    /// The outer tag's VLAN id; 0 untagged.
    pub vlan: u16,
    /// The ethertype after the tags.
    pub ethertype: u16,
    /// Where the L3 header starts.
    pub l3_offset: usize,
}

impl L2Info {
    /// The VID of an outer 802.1Q tag (0 for a priority tag); `None` untagged, or when the
    /// outer tag is 802.1ad's.
    #[inline]
    pub fn ctag(&self) -> Option<u16> {
        (self.flags & flags::CTAG != 0).then_some(self.vlan)
    }
}

/// The Ethernet part of [`parse_into`]: length, up to two VLAN tags and the ethertype after
/// them. Writes no metadata: a port nobody inspects past L2 (no plugin, no checksum to
/// complete) needs only this.
#[inline]
pub fn parse_l2(frame: &[u8], max_len: usize) -> Result<L2Info, ParseError> {
    if frame.len() > max_len {
        return Err(ParseError::Oversize);
    }
    let eth = EthernetFrame::new_checked(frame).map_err(|_| ParseError::Runt)?;
    let mut flags = if eth.dst().is_group() { flags::GROUP_DST } else { 0 };
    let mut vlan = 0;
    let mut ethertype = eth.ethertype();
    let mut off = ethernet::HEADER_LEN;
    // Up to two tags (802.1ad outer + 802.1Q inner); the outer VLAN id is the one reported.
    for _ in 0..2 {
        if ethertype != ethertype::VLAN && ethertype != ethertype::QINQ {
            break;
        }
        let tag = frame.get(off..off + 4).ok_or(ParseError::TruncatedVlan)?;
        if flags & flags::VLAN == 0 {
            vlan = u16::from_be_bytes([tag[0], tag[1]]) & 0x0fff;
            flags |= flags::VLAN;
            if ethertype == ethertype::VLAN {
                flags |= flags::CTAG;
            }
        }
        ethertype = u16::from_be_bytes([tag[2], tag[3]]);
        off += 4;
    }
    Ok(L2Info { flags, vlan, ethertype, l3_offset: off })
}

/// [`parse_l2`] into `m`; returns where the L3 header starts. Writes only `len`, `flags`,
/// `vlan`, `ethertype`, `l3_offset` and `l4_offset` (the first 12 bytes of `m`), see
/// [`PacketMeta::set_l2`].
#[inline]
pub fn parse_l2_into(frame: &[u8], max_len: usize, m: &mut PacketMeta) -> Result<usize, ParseError> {
    let l2 = parse_l2(frame, max_len)?;
    m.set_l2(frame.len(), &l2);
    Ok(l2.l3_offset)
}

/// The IP and TCP/UDP part of [`parse_into`], for a frame whose L3 header starts at `off`
/// (as [`parse_l2_into`] returned it): fills the rest of `m`.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "each offset is at most `frame.len()`, and frames are at most 64 KiB"
)]
pub fn parse_l3_into(frame: &[u8], off: usize, m: &mut PacketMeta) -> Result<(), ParseError> {
    m.ip_proto = 0;
    let l3 = &frame[off..];
    // Where the IP packet ends (Ethernet pads short frames): the L4 header must lie before it.
    let (proto, l4_rel, is_first_fragment, ip_len) = match m.ethertype {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(l3).map_err(|_| ParseError::BadL3)?;
            m.flags |= flags::IPV4;
            if ip.is_fragment() {
                m.flags |= flags::FRAGMENT;
            }
            (ip.protocol(), ip.header_len(), ip.fragment_offset() == 0, ip.total_len())
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(l3).map_err(|_| ParseError::BadL3)?;
            m.flags |= flags::IPV6;
            let up = ip.upper_layer().map_err(|_| ParseError::BadL3)?;
            if up.fragment {
                m.flags |= flags::FRAGMENT;
            }
            (up.proto, up.offset, up.first, ip.packet_len())
        }
        _ => return Ok(()),
    };
    m.l3_offset = off as u16;
    m.ip_proto = proto;
    let l4_off = off + l4_rel;
    if is_first_fragment && (proto == ipproto::TCP || proto == ipproto::UDP) {
        let need = if proto == ipproto::TCP { 20 } else { 8 };
        if off + ip_len < l4_off + need {
            return Err(ParseError::TruncatedL4);
        }
        m.l4_offset = l4_off as u16;
        m.flags |= flags::L4_PORTS;
    } else if is_first_fragment {
        m.l4_offset = l4_off.min(frame.len()) as u16;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    #[test]
    fn parses_udp_over_ipv4() {
        let f = udp4_frame(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            1234,
            53,
            64,
        );
        let m = parse(&f, 1518).unwrap();
        assert_eq!(m.len, 64);
        assert!(m.has(flags::IPV4) && m.has(flags::L4_PORTS));
        assert_eq!((m.ports(&f), m.ip_proto), (Some((1234, 53)), ipproto::UDP));
        assert_eq!(&m.addrs(&f).unwrap().0[..], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(m.l3_offset, 14);
        assert_eq!(m.l4_offset, 34);
        assert!(Ipv4Packet::new_checked(&f[14..]).unwrap().checksum_ok());
    }

    #[test]
    fn parses_vlan_tag() {
        let mut f = udp4_frame(MacAddr::BROADCAST, MacAddr([2, 0, 0, 0, 0, 2]), [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 64);
        insert_vlan(&mut f, 42);
        let m = parse(&f, 1522).unwrap();
        assert!(m.has(flags::VLAN) && m.has(flags::GROUP_DST));
        assert_eq!(m.vlan, 42);
        assert_eq!(m.l3_offset, 18);
        assert_eq!(m.ports(&f), Some((1, 2)));
    }

    #[test]
    fn the_l2_parse_alone_says_what_the_metadata_says() {
        let untagged =
            udp4_frame(MacAddr::BROADCAST, MacAddr([2, 0, 0, 0, 0, 2]), [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 64);
        let mut ctagged = untagged.clone();
        insert_vlan(&mut ctagged, 42);
        let mut stagged = ctagged.clone();
        stagged[12..14].copy_from_slice(&0x88a8u16.to_be_bytes());
        for (f, ctag) in [(&untagged, None), (&ctagged, Some(42)), (&stagged, None)] {
            let l2 = parse_l2(f, 1522).unwrap();
            let mut m = PacketMeta { ip_proto: 9, ..Default::default() };
            assert_eq!(parse_l2_into(f, 1522, &mut m), Ok(l2.l3_offset));
            assert_eq!((l2.ctag(), m.ctag()), (ctag, ctag));
            assert_eq!((m.flags, m.vlan, m.ethertype, m.len as usize), (l2.flags, l2.vlan, l2.ethertype, f.len()));
            // Only the Ethernet part is written.
            assert_eq!((m.l3_offset, m.ip_proto), (0, 9));
        }
        assert_eq!(parse_l2(&untagged, 63), Err(ParseError::Oversize));
    }

    #[test]
    fn parses_tcp_over_ipv6() {
        let f = tcp6_frame(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), [0x20; 16], [0x30; 16], 443, 5555);
        let m = parse(&f, 1518).unwrap();
        assert!(m.has(flags::IPV6) && m.has(flags::L4_PORTS));
        assert_eq!((m.ports(&f), m.ip_proto), (Some((443, 5555)), ipproto::TCP));
        assert_eq!(m.addrs(&f), Some(([0x20; 16], [0x30; 16])));
        // Nothing past L4 for an ARP frame: neither addresses nor ports.
        let arp = build::ethernet_frame(MacAddr::BROADCAST, MacAddr([2, 0, 0, 0, 0, 1]), 0x0806, &[0; 46]);
        let m = parse(&arp, 1518).unwrap();
        assert_eq!((m.addrs(&arp), m.ports(&arp)), (None, None));
    }

    #[test]
    fn rejects_malformed_frames() {
        assert_eq!(parse(&[0u8; 13], 1518), Err(ParseError::Runt));
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        assert_eq!(parse(&f, 1518), Err(ParseError::TruncatedVlan));
        let good =
            udp4_frame(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), [1, 1, 1, 1], [2, 2, 2, 2], 1, 2, 64);
        assert_eq!(parse(&good[..30], 1518), Err(ParseError::BadL3), "truncated IPv4 header");
        let mut bad_ihl = good.clone();
        bad_ihl[14] = 0x43;
        assert_eq!(parse(&bad_ihl, 1518), Err(ParseError::BadL3), "IHL below 5");
        assert_eq!(parse(&good[..38], 1518), Err(ParseError::BadL3), "total length beyond the frame");
        assert_eq!(parse(&good, 63), Err(ParseError::Oversize));
        let mut short_udp = good[..40].to_vec();
        short_udp[16..18].copy_from_slice(&26u16.to_be_bytes());
        assert_eq!(parse(&short_udp, 1518), Err(ParseError::TruncatedL4));
    }

    #[test]
    fn non_ip_frames_are_fine() {
        let mut f = vec![0xffu8; 60];
        f[12..14].copy_from_slice(&ethertype::ARP.to_be_bytes());
        let m = parse(&f, 1518).unwrap();
        assert_eq!(m.ethertype, ethertype::ARP);
        assert_eq!(m.l3_offset, 0);
    }

    #[test]
    fn parse_into_a_used_meta_leaves_nothing_of_the_last_frame() {
        let tcp = tcp6_frame(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), [0x20; 16], [0x30; 16], 1, 2);
        let mut arp = vec![0xffu8; 60];
        arp[12..14].copy_from_slice(&ethertype::ARP.to_be_bytes());
        let mut m = parse(&tcp, 1518).unwrap();
        parse_into(&arp, 1518, &mut m).unwrap();
        assert_eq!(m, parse(&arp, 1518).unwrap());
        // The L2 part alone writes the L2 fields and clears the offsets.
        let mut m = parse(&tcp, 1518).unwrap();
        assert_eq!(parse_l2_into(&arp, 1518, &mut m), Ok(14));
        assert_eq!(
            (m.len, m.flags, m.vlan, m.ethertype, m.l3_offset, m.l4_offset),
            (60, flags::GROUP_DST, 0, ethertype::ARP, 0, 0)
        );
    }

    #[test]
    fn meta_is_a_quarter_of_a_cache_line() {
        assert_eq!(std::mem::size_of::<PacketMeta>(), 16);
    }

    /// A TCP SYN over IPv6 behind `chain` (each extension header's type and length in bytes),
    /// and where its TCP header starts.
    fn tcp6_behind(chain: &[(u8, usize)], dport: u16) -> (Vec<u8>, usize) {
        let f =
            tcp6_frame(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), [0x20; 16], [0x30; 16], 40000, dport);
        let tcp = f[54..].to_vec();
        let mut ext = Vec::new();
        for (i, &(t, len)) in chain.iter().enumerate() {
            let next = chain.get(i + 1).map_or(ipproto::TCP, |c| c.0);
            let mut h = vec![0u8; len];
            h[0] = next;
            h[1] = match t {
                ip::ext::AH => u8::try_from(len / 4 - 2).unwrap(),
                ip::ext::FRAGMENT => 0,
                _ => u8::try_from(len / 8 - 1).unwrap(),
            };
            ext.extend_from_slice(&h);
        }
        let mut out = f[..54].to_vec();
        out[20] = chain.first().map_or(ipproto::TCP, |c| c.0);
        out[18..20].copy_from_slice(&u16::try_from(ext.len() + tcp.len()).unwrap().to_be_bytes());
        out.extend_from_slice(&ext);
        out.extend_from_slice(&tcp);
        (out, 54 + ext.len())
    }

    #[test]
    fn ipv6_ports_are_found_behind_any_number_of_extension_headers() {
        // Five or more used to report the fifth header's type as the protocol: no ports.
        for n in [0, 1, 4, 5, 8, 20, 180] {
            let (f, l4) = tcp6_behind(&vec![(ip::ext::DEST_OPTS, 8); n], 5201);
            let m = parse(&f, 9000).unwrap();
            assert_eq!((m.ip_proto, m.l4_offset as usize, m.ports(&f)), (ipproto::TCP, l4, Some((40000, 5201))), "{n}");
            assert!(!m.has(flags::FRAGMENT));
        }
        let mixed = [(0, 8), (43, 24), (44, 8), (51, 16), (60, 16), (135, 8), (139, 8), (140, 8)];
        let (f, l4) = tcp6_behind(&mixed, 22);
        let m = parse(&f, 1518).unwrap();
        assert_eq!((m.ip_proto, m.l4_offset as usize, m.ports(&f)), (ipproto::TCP, l4, Some((40000, 22))));
    }

    #[test]
    fn an_ipv6_chain_cut_short_is_a_bad_l3_header() {
        let (mut f, _) = tcp6_behind(&[(60, 8); 6], 5201);
        // The last header claims more than the packet holds.
        f[54 + 5 * 8 + 1] = 200;
        assert_eq!(parse(&f, 9000), Err(ParseError::BadL3));
        // The payload length ends the packet inside the chain; padding after it does not count.
        let (mut f, _) = tcp6_behind(&[(60, 8); 6], 5201);
        f[18..20].copy_from_slice(&44u16.to_be_bytes());
        assert_eq!(parse(&f, 9000), Err(ParseError::BadL3));
        // A chain that ends exactly at the packet's end, before any TCP header: cut L4.
        f[18..20].copy_from_slice(&48u16.to_be_bytes());
        assert_eq!(parse(&f, 9000), Err(ParseError::TruncatedL4));
    }

    #[test]
    fn ipv6_fragments() {
        // A first fragment carries the chain and the ports, and is a fragment.
        let (mut f, l4) = tcp6_behind(&[(60, 8), (44, 8), (60, 8)], 80);
        let frag = 54 + 8;
        f[frag + 3] = 1; // offset 0, more fragments
        let m = parse(&f, 1518).unwrap();
        assert!(m.has(flags::FRAGMENT) && m.has(flags::L4_PORTS));
        assert_eq!((m.l4_offset as usize, m.ports(&f)), (l4, Some((40000, 80))));
        // A later fragment: what follows the fragment header is payload, never walked.
        f[frag + 2] = 0x01; // offset 32 bytes
        f[frag + 8] = 0xff; // would be a destination options header of 2 KiB if walked
        f[frag + 9] = 0xff;
        let m = parse(&f, 1518).unwrap();
        assert!(m.has(flags::FRAGMENT) && !m.has(flags::L4_PORTS));
        assert_eq!((m.ip_proto, m.l4_offset), (60, 0));
        // An atomic fragment (offset 0, no more) is a whole packet (RFC 6946).
        f[frag + 2] = 0;
        f[frag + 3] = 0;
        f[frag + 8] = ipproto::TCP;
        f[frag + 9] = 0;
        let m = parse(&f, 1518).unwrap();
        assert!(!m.has(flags::FRAGMENT) && m.has(flags::L4_PORTS));
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse(&bytes, 150);
        }

        /// A plugin sees the ports exactly when the frame has them: behind any chain of
        /// extension headers that fits the packet, the parser finds the TCP header where it was
        /// put; a packet that ends inside the chain or the TCP header is refused, never passed
        /// on without its ports.
        #[test]
        fn ipv6_ports_exactly_when_the_frame_has_them(
            chain in proptest::collection::vec((0usize..8, 0usize..4), 0..40),
            first_fragment in proptest::bool::ANY,
            cut in proptest::option::of(0usize..400),
        ) {
            const TYPES: [u8; 8] = [0, 43, 44, 51, 60, 135, 139, 140];
            let chain: Vec<(u8, usize)> = chain
                .iter()
                .map(|&(t, n)| match TYPES[t] {
                    ip::ext::FRAGMENT => (44, 8),
                    ty => (ty, 8 * (n + 1)),
                })
                .collect();
            let (mut f, l4) = tcp6_behind(&chain, 5201);
            let frags: Vec<usize> = {
                let mut at = 54;
                chain.iter().map(|&(t, len)| { let here = at; at += len; (t, here) }).filter(|&(t, _)| t == 44).map(|(_, h)| h).collect()
            };
            if first_fragment {
                for &h in &frags { f[h + 3] = 1; }
            }
            let packet_end = match cut {
                Some(c) if c < f.len() - 54 => {
                    f[18..20].copy_from_slice(&u16::try_from(c).unwrap().to_be_bytes());
                    54 + c
                }
                _ => f.len(),
            };
            let r = parse(&f, 9000);
            if l4 + 20 <= packet_end {
                let m = r.unwrap();
                proptest::prop_assert_eq!((m.ip_proto, m.l4_offset as usize, m.ports(&f)), (ipproto::TCP, l4, Some((40000, 5201))));
                proptest::prop_assert_eq!(m.has(flags::FRAGMENT), first_fragment && !frags.is_empty());
            } else if l4 <= packet_end {
                // The chain fits, the TCP header does not: bytes past the packet's end
                // (Ethernet padding) are no header.
                proptest::prop_assert_eq!(r, Err(ParseError::TruncatedL4));
            } else {
                proptest::prop_assert_eq!(r, Err(ParseError::BadL3));
            }
        }

        #[test]
        fn parse_never_panics_on_mutated_ip(seed in proptest::num::u64::ANY, cut in 0usize..80) {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut f = udp4_frame(MacAddr([2,0,0,0,0,1]), MacAddr([2,0,0,0,0,2]), [1,1,1,1], [2,2,2,2], 1, 2, 80);
            for _ in 0..4 { let i = rng.usize(12..f.len()); f[i] = rng.u8(..); }
            f.truncate(cut);
            let _ = parse(&f, 1518);
        }
    }
}
