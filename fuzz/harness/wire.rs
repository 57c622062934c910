// The `wire` fuzz target's body, shared verbatim (via `include!`) by the libFuzzer target and by
// `switch/core/tests/fuzz_corpus.rs`, which replays the committed corpus on stable.
//
// Input: byte 0..2 pick the port's maximum frame size, the rest is the frame.

use wasmswitch_core::wire::checksum::{complete_partial, fill_l4_checksum, l4_checksum_ok, Completion};
use wasmswitch_core::wire::{flags, parse_into, parse_l2, parse_l2_into, PacketMeta, ParseError};

pub fn check(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    // Mostly realistic limits, sometimes below the frame so `Oversize` is reached.
    let max_len = u16::from_le_bytes([data[0], data[1]]) as usize;
    let frame = &data[2..];
    // A stale meta (the datapath reuses batch slots) must not leak into the result.
    let stale = PacketMeta {
        len: 0xffff,
        flags: 0xffff,
        vlan: 0xffff,
        ethertype: 0xffff,
        l3_offset: 0xffff,
        l4_offset: 0xffff,
        ip_proto: 0xff,
        ..Default::default()
    };
    let mut m = stale;
    let full = parse_into(frame, max_len, &mut m);
    if full.is_ok() {
        // Every field the parser owns was rewritten: the result is that of a fresh meta.
        let mut fresh = PacketMeta::default();
        assert_eq!(parse_into(frame, max_len, &mut fresh), Ok(()));
        assert_eq!(m, fresh, "a stale meta leaked into the result");
    }
    // The datapath's L2-only parse (ports nobody inspects past the tags) fails where the full
    // parse fails on the Ethernet part, and agrees with it on the fields it writes.
    let mut l2 = stale;
    match (parse_l2_into(frame, max_len, &mut l2), full) {
        (Ok(l3), Ok(())) => {
            assert!((14..=22).contains(&l3) && l3 <= frame.len());
            assert_eq!((l2.len, l2.vlan, l2.ethertype), (m.len, m.vlan, m.ethertype));
            let l2_flags = flags::VLAN | flags::CTAG | flags::GROUP_DST;
            assert_eq!(l2.flags, m.flags & l2_flags);
            assert_eq!((l2.l3_offset, l2.l4_offset), (0, 0));
            // What a bridge port (no metadata written) switches on: the same answer.
            let eth = parse_l2(frame, max_len).expect("parse_l2 agrees with parse_l2_into");
            assert_eq!((eth.l3_offset, eth.flags, eth.vlan, eth.ctag()), (l3, l2.flags, l2.vlan, l2.ctag()));
        }
        (Ok(_), Err(e)) => assert!(matches!(e, ParseError::BadL3 | ParseError::TruncatedL4), "{e:?} after L2"),
        (Err(e), r) => {
            assert_eq!(r, Err(e), "the L2 part decides alone");
            assert_eq!(parse_l2(frame, max_len), Err(e));
        }
    }
    match full {
        Err(ParseError::Oversize) => assert!(frame.len() > max_len),
        Err(ParseError::Runt) => assert!(frame.len() < 14),
        Err(_) => {}
        Ok(()) => {
            assert_eq!(m.len as usize, frame.len());
            let (l3, l4) = (m.l3_offset as usize, m.l4_offset as usize);
            assert!(l3 <= frame.len() && l4 <= frame.len(), "offsets inside the frame: {m:?}");
            if m.has(flags::IPV4) || m.has(flags::IPV6) {
                assert!(!(m.has(flags::IPV4) && m.has(flags::IPV6)));
                assert!(l3 >= 14, "an IP header after the Ethernet header");
            }
            if m.has(flags::L4_PORTS) {
                assert!(l4 > l3, "L4 after L3: {m:?}");
                assert!(l4 + 8 <= frame.len(), "ports read inside the frame");
                let p = &frame[l4..l4 + 4];
                assert_eq!(
                    m.ports(frame),
                    Some((u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])))
                );
            } else {
                assert_eq!(m.ports(frame), None);
            }
            let ip = m.has(flags::IPV4) || m.has(flags::IPV6);
            assert_eq!(m.addrs(frame).is_some(), ip, "addresses for IP and only for IP: {m:?}");
            if let Some((src, dst)) = m.addrs(frame) {
                let v4 = m.has(flags::IPV4);
                let (s, d) = if v4 { (l3 + 12, l3 + 16) } else { (l3 + 8, l3 + 24) };
                let n = if v4 { 4 } else { 16 };
                assert_eq!((&src[16 - n..], &dst[16 - n..]), (&frame[s..s + n], &frame[d..d + n]));
            }
            if m.has(flags::IPV6) {
                ipv6_chain(frame, &m);
            }
            checksums(frame, &m);
        }
    }
}

/// A second, plainer walk of the IPv6 extension headers (RFC 8200, RFC 4302 for AH): the
/// parser must agree with it on the upper layer, and report ports exactly when the packet holds
/// a whole TCP/UDP header there (the chain is never cut off at some count).
fn ipv6_chain(frame: &[u8], m: &PacketMeta) {
    let l3 = m.l3_offset as usize;
    let end = l3 + 40 + u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]) as usize;
    let (mut nh, mut at, mut later_fragment) = (frame[l3 + 6], l3 + 40, false);
    while !later_fragment && [0u8, 43, 44, 51, 60, 135, 139, 140].contains(&nh) {
        assert!(at + 8 <= end, "the parser accepted a chain that runs past the packet: {m:?}");
        let len = match nh {
            44 => {
                later_fragment = u16::from_be_bytes([frame[at + 2], frame[at + 3]]) >> 3 != 0;
                8
            }
            51 => (frame[at + 1] as usize + 2) * 4,
            _ => (frame[at + 1] as usize + 1) * 8,
        };
        nh = frame[at];
        at += len;
        assert!(at <= end || later_fragment, "the parser accepted a chain that runs past the packet: {m:?}");
    }
    assert_eq!(m.ip_proto, nh, "upper layer");
    let ports = !later_fragment && (nh == 6 || nh == 17);
    assert_eq!(m.has(flags::L4_PORTS), ports, "ports exactly when the packet has them: {m:?}");
    if ports {
        assert_eq!(m.l4_offset as usize, at);
        assert!(at + if nh == 6 { 20 } else { 8 } <= end, "the L4 header inside the packet");
    }
}

fn checksums(frame: &[u8], m: &PacketMeta) {
    let was_ok = l4_checksum_ok(frame, m);
    let mut f = frame.to_vec();
    let c = complete_partial(&mut f, m);
    let changed: Vec<usize> = (0..f.len()).filter(|&i| f[i] != frame[i]).collect();
    match c {
        Completion::NotApplicable => {
            assert!(changed.is_empty());
            assert_eq!(was_ok, None, "no L4 span for completion, none for verification either");
        }
        Completion::Untouched => assert!(changed.is_empty()),
        Completion::Completed => {
            // Only the two checksum bytes, which sit inside the L4 header.
            let l4 = m.l4_offset as usize;
            assert!(changed.iter().all(|&i| i >= l4 + 6 && i < l4 + 18), "changed {changed:?}, l4 at {l4}");
            assert!(changed.len() <= 2 && changed.windows(2).all(|w| w[1] == w[0] + 1));
            assert_eq!(l4_checksum_ok(&f, m), Some(true), "a completed checksum verifies");
        }
    }
    if was_ok == Some(true) {
        assert_eq!(l4_checksum_ok(&f, m), Some(true), "completion broke a valid checksum");
    }
    // Filling computes a verifying checksum whenever there is an L4 span.
    let mut g = frame.to_vec();
    let filled = fill_l4_checksum(&mut g, m);
    assert_eq!(filled, was_ok.is_some());
    if filled {
        assert_eq!(l4_checksum_ok(&g, m), Some(true));
        assert!((0..g.len()).filter(|&i| g[i] != frame[i]).count() <= 2);
    } else {
        assert_eq!(g, frame);
    }
}
