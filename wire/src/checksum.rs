//! Internet checksums (RFC 1071), and completing an L4 checksum that a sender left to offload.
//!
//! A Linux sender whose device offloads the transmit checksum (veth by default, and any local
//! socket behind a virtual device) hands the frame over with `CHECKSUM_PARTIAL`: the TCP/UDP
//! checksum field holds only the folded pseudo-header sum, and the skb carries "finish the sum
//! from `csum_start`, store it at `csum_offset`". XDP, and so AF_XDP, carries the bytes without
//! that state; a receiver then sees a wrong checksum and drops the segment. [`complete_partial`]
//! recognises such a frame by its field (it equals the pseudo-header sum) and finishes the sum in
//! place, as `skb_checksum_help` would have. A frame whose checksum is already complete is left
//! untouched: its field equals the pseudo-header sum only by a 1-in-65536 coincidence, and in that
//! case completing it rewrites the same value (the sum over the segment is then the complement of
//! the pseudo-header sum), so even the coincidence changes no byte.

use crate::{flags, ipproto, PacketMeta};

/// Offset of the checksum field inside a TCP header.
pub const TCP_CHECKSUM_OFFSET: usize = 16;
/// Offset of the checksum field inside a UDP header.
pub const UDP_CHECKSUM_OFFSET: usize = 6;

/// One's complement sum of `data` read as 16-bit words in memory (native) byte order, added to
/// `acc`, not folded. The sum is byte-order independent (RFC 1071, 2.B): [`fold`] swaps once at
/// the end. Words may be added
/// at any 16-bit lane of the accumulator: 2^16 = 1 modulo 0xffff, so only the final odd byte
/// needs care (it is the high-order byte of a zero-padded word).
#[inline]
pub fn sum_native(data: &[u8], mut acc: u64) -> u64 {
    // The two 32-bit halves of each 8-byte word go into a 64-bit sum that cannot overflow for
    // any frame (2^31 words), so no carry chain serialises the loop and the compiler vectorises it.
    let mut chunks = data.chunks_exact(8);
    let mut wide = 0u64;
    for c in &mut chunks {
        let v = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        wide += (v & 0xffff_ffff) + (v >> 32);
    }
    let (s, carry) = acc.overflowing_add(wide);
    acc = s + carry as u64;
    // Up to 7 bytes left: a 4-, a 2- and a 1-byte piece, each far below the carry limit.
    let mut rest = chunks.remainder();
    let mut tail = 0u64;
    if let [a, b, c, d, more @ ..] = rest {
        tail += u32::from_ne_bytes([*a, *b, *c, *d]) as u64;
        rest = more;
    }
    if let [a, b, more @ ..] = rest {
        tail += u16::from_ne_bytes([*a, *b]) as u64;
        rest = more;
    }
    if let [a] = rest {
        tail += u16::from_ne_bytes([*a, 0]) as u64;
    }
    let (s, carry) = acc.overflowing_add(tail);
    s + carry as u64
}

/// Folds a native-order sum from [`sum_native`] to 16 bits, in network order as a number.
#[inline]
#[expect(clippy::cast_possible_truncation, reason = "the five folds leave at most 0xffff")]
pub fn fold(mut acc: u64) -> u16 {
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    u16::from_be(acc as u16)
}

/// The Internet checksum of `data`, folded and complemented.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum_native(data, 0))
}

/// The native-order sum of the TCP/UDP pseudo-header (addresses, protocol, L4 length): at most
/// ten 32-bit adds, no loop over a byte tail (this runs for every TCP/UDP frame of a port that
/// completes checksums).
#[inline]
#[expect(
    clippy::cast_possible_truncation,
    reason = "an L4 length ends within a 16-bit L3 offset plus 40 plus a 16-bit IP length: under 2^18"
)]
fn pseudo_header_sum(src: &[u8], dst: &[u8], proto: u8, l4_len: usize) -> u64 {
    // Length and protocol as IPv6 writes them: two 32-bit big-endian words (the same sum for
    // IPv4's 16-bit length and zero-padded protocol).
    let mut acc =
        u32::from_ne_bytes((l4_len as u32).to_be_bytes()) as u64 + u32::from_ne_bytes([0, 0, 0, proto]) as u64;
    for w in src.chunks_exact(4).chain(dst.chunks_exact(4)) {
        acc += u32::from_ne_bytes([w[0], w[1], w[2], w[3]]) as u64;
    }
    acc
}

/// What [`complete_partial`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Not a first-fragment TCP/UDP datagram over IP, or too short to hold its L4 length.
    NotApplicable,
    /// The field is not the pseudo-header sum: the checksum was complete (or is corrupt, which
    /// the receiver will judge); no byte was touched.
    Untouched,
    /// The field held the pseudo-header sum; the checksum was computed and stored.
    Completed,
}

/// Where a frame's L4 segment and checksum field are, and its pseudo-header sum.
struct L4Span {
    /// The segment: from the L4 header to the end given by the IP length (Ethernet pads short
    /// frames, so the frame's own length is not it).
    start: usize,
    end: usize,
    /// The checksum field, relative to `start`.
    field: usize,
    pseudo: u64,
}

fn l4_span(frame: &[u8], meta: &PacketMeta) -> Option<L4Span> {
    if meta.flags & flags::L4_PORTS == 0 || meta.flags & flags::FRAGMENT != 0 {
        return None;
    }
    let field = match meta.ip_proto {
        ipproto::TCP => TCP_CHECKSUM_OFFSET,
        ipproto::UDP => UDP_CHECKSUM_OFFSET,
        _ => return None,
    };
    let (l3, start) = (meta.l3_offset as usize, meta.l4_offset as usize);
    let (end, src, dst) = if meta.flags & flags::IPV4 != 0 {
        let h = frame.get(l3..l3 + 20)?;
        (l3 + u16::from_be_bytes([h[2], h[3]]) as usize, &h[12..16], &h[16..20])
    } else if meta.flags & flags::IPV6 != 0 {
        let h = frame.get(l3..l3 + 40)?;
        (l3 + 40 + u16::from_be_bytes([h[4], h[5]]) as usize, &h[8..24], &h[24..40])
    } else {
        return None;
    };
    let len = end.checked_sub(start)?;
    if end > frame.len() || field + 2 > len {
        return None;
    }
    Some(L4Span { start, end, field, pseudo: pseudo_header_sum(src, dst, meta.ip_proto, len) })
}

/// Completes the TCP/UDP checksum of `frame` in place when its sender left it to offload (see
/// the module docs). `meta` is the frame's parse. Never panics: every offset is checked.
pub fn complete_partial(frame: &mut [u8], meta: &PacketMeta) -> Completion {
    let Some(s) = l4_span(frame, meta) else { return Completion::NotApplicable };
    let seg = &mut frame[s.start..s.end];
    let have = u16::from_be_bytes([seg[s.field], seg[s.field + 1]]);
    let want = fold(s.pseudo);
    // 0x0000 and 0xffff are the same one's complement number; UDP's 0 means "no checksum".
    let is_pseudo = have == want || (have == 0xffff && want == 0) || (have == 0 && want == 0xffff);
    if !is_pseudo || (have == 0 && meta.ip_proto == ipproto::UDP) {
        return Completion::Untouched;
    }
    // The field already holds the pseudo-header sum, so the sum over the segment is the whole
    // checksum's input (what skb_checksum_help computes from csum_start).
    let c = finish(!fold(sum_native(seg, 0)), meta.ip_proto);
    seg[s.field..s.field + 2].copy_from_slice(&c.to_be_bytes());
    Completion::Completed
}

/// RFC 768: a computed UDP checksum of 0 is sent as all ones (0 means "none").
fn finish(c: u16, proto: u8) -> u16 {
    if c == 0 && proto == ipproto::UDP {
        0xffff
    } else {
        c
    }
}

/// Computes and stores the full TCP/UDP checksum of `frame` (frame builders); false when the
/// frame has no checksummed L4 header.
pub fn fill_l4_checksum(frame: &mut [u8], meta: &PacketMeta) -> bool {
    let Some(s) = l4_span(frame, meta) else { return false };
    let seg = &mut frame[s.start..s.end];
    seg[s.field..s.field + 2].copy_from_slice(&[0, 0]);
    let c = finish(!fold(sum_native(seg, s.pseudo)), meta.ip_proto);
    seg[s.field..s.field + 2].copy_from_slice(&c.to_be_bytes());
    true
}

/// True when the TCP/UDP checksum of `frame` verifies (tests and diagnostics; the datapath does
/// not verify complete checksums, that is the receiver's job).
pub fn l4_checksum_ok(frame: &[u8], meta: &PacketMeta) -> Option<bool> {
    let s = l4_span(frame, meta)?;
    Some(fold(sum_native(&frame[s.start..s.end], s.pseudo)) == 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::*;
    use crate::{parse, MacAddr};

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    /// Reference RFC 1071 sum, 16 bits at a time in network order.
    fn reference(data: &[u8]) -> u16 {
        let mut sum = 0u32;
        let mut chunks = data.chunks_exact(2);
        for c in &mut chunks {
            sum += u16::from_be_bytes([c[0], c[1]]) as u32;
        }
        if let [b] = chunks.remainder() {
            sum += (*b as u32) << 8;
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !u16::try_from(sum).unwrap()
    }

    /// The pseudo-header (as bytes) and the L4 segment of `f`, computed without this module.
    fn pseudo_and_segment(f: &[u8]) -> (Vec<u8>, std::ops::Range<usize>, usize) {
        let m = parse(f, 9000).unwrap();
        let (l3, l4) = (m.l3_offset as usize, m.l4_offset as usize);
        let mut p = Vec::new();
        let end = if m.has(flags::IPV4) {
            p.extend_from_slice(&f[l3 + 12..l3 + 20]);
            l3 + u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]) as usize
        } else {
            p.extend_from_slice(&f[l3 + 8..l3 + 40]);
            l3 + 40 + u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]) as usize
        };
        p.extend_from_slice(&u32::try_from(end - l4).unwrap().to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, m.ip_proto]);
        let field = l4 + if m.ip_proto == ipproto::TCP { 16 } else { 6 };
        (p, l4..end, field)
    }

    /// Verifies with the reference sum over pseudo-header and segment.
    fn reference_ok(f: &[u8]) -> bool {
        let (mut p, seg, _) = pseudo_and_segment(f);
        p.extend_from_slice(&f[seg]);
        reference(&p) == 0
    }

    /// Turns a frame with a complete L4 checksum into what an offloading sender emits: the
    /// field holds the folded (uncomplemented) pseudo-header sum.
    fn make_partial(f: &mut [u8]) {
        let (p, _, field) = pseudo_and_segment(f);
        f[field..field + 2].copy_from_slice(&(!reference(&p)).to_be_bytes());
    }

    fn frames() -> Vec<Vec<u8>> {
        let mut v = vec![
            udp4_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 1234, 53, 64),
            udp4_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 1234, 53, 1514),
            udp4_frame(A, B, [192, 168, 7, 9], [10, 200, 0, 2], 1, 2, 333),
            tcp4_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 40000, 5201),
            tcp6_frame(A, B, [0x20; 16], [0x30; 16], 443, 5555),
        ];
        let mut tagged = tcp4_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 4, 5);
        insert_vlan(&mut tagged, 7);
        v.push(tagged);
        v
    }

    #[test]
    fn sum_matches_the_rfc_1071_reference_at_every_length_and_alignment() {
        let mut rng = fastrand::Rng::with_seed(7);
        let buf: Vec<u8> = (0..1600).map(|_| rng.u8(..)).collect();
        for start in 0..9 {
            for len in (0..200).chain([1499, 1500, 1501, 1590]) {
                let d = &buf[start..start + len];
                assert_eq!(checksum(d), reference(d), "start {start} len {len}");
            }
        }
        assert_eq!(checksum(&[0xff; 64]), 0, "all ones sums to negative zero");
    }

    #[test]
    fn builder_frames_carry_complete_checksums_and_are_left_untouched() {
        for f in frames() {
            let m = parse(&f, 9000).unwrap();
            assert!(reference_ok(&f), "builder frame must verify");
            assert_eq!(l4_checksum_ok(&f, &m), Some(true));
            let mut g = f.clone();
            assert_eq!(complete_partial(&mut g, &m), Completion::Untouched);
            assert_eq!(g, f, "a complete frame changes no byte");
        }
    }

    #[test]
    fn partial_checksums_are_completed_to_the_builders_value() {
        for f in frames() {
            let m = parse(&f, 9000).unwrap();
            let mut g = f.clone();
            make_partial(&mut g);
            assert_ne!(g, f, "the partial frame differs in its checksum field");
            assert_eq!(l4_checksum_ok(&g, &m), Some(false));
            assert_eq!(complete_partial(&mut g, &m), Completion::Completed);
            assert_eq!(g, f, "completed frame equals the one built with a full checksum");
            assert!(reference_ok(&g));
        }
    }

    #[test]
    fn corrupt_payload_is_not_masked() {
        let f = udp4_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 1234, 53, 200);
        let m = parse(&f, 9000).unwrap();
        let mut g = f.clone();
        g[100] ^= 0x40;
        assert_eq!(complete_partial(&mut g, &m), Completion::Untouched);
        assert_eq!(l4_checksum_ok(&g, &m), Some(false), "the corruption stays visible to the receiver");
    }

    #[test]
    fn udp_without_checksum_and_padded_frames() {
        let mut f = udp4_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 1, 2, 60);
        let m = parse(&f, 9000).unwrap();
        let off = m.l4_offset as usize + 6;
        f[off..off + 2].copy_from_slice(&[0, 0]);
        let g = f.clone();
        assert_eq!(complete_partial(&mut f, &m), Completion::Untouched, "UDP checksum 0: none");
        assert_eq!(f, g);
        // A short UDP datagram in a padded 60-byte frame: the sum must stop at the IP length.
        let mut short = udp4_frame(A, B, [10, 0, 0, 1], [10, 0, 0, 2], 9, 10, 46);
        let l3 = 14;
        let total = u16::from_be_bytes([short[l3 + 2], short[l3 + 3]]);
        short.extend_from_slice(&[0xaa; 14]);
        assert_eq!(u16::from_be_bytes([short[l3 + 2], short[l3 + 3]]), total);
        let want = short.clone();
        make_partial(&mut short);
        let m = parse(&short, 9000).unwrap();
        assert_eq!(complete_partial(&mut short, &m), Completion::Completed);
        assert_eq!(short, want);
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_touches_only_the_checksum_field(
            seed in proptest::num::u64::ANY, cut in 0usize..120, flips in 0usize..4,
        ) {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut f = if seed % 2 == 0 {
                udp4_frame(A, B, [1, 2, 3, 4], [5, 6, 7, 8], 1, 2, 100)
            } else {
                tcp6_frame(A, B, [9; 16], [8; 16], 3, 4)
            };
            for _ in 0..flips {
                let i = rng.usize(12..f.len());
                f[i] = rng.u8(..);
            }
            f.truncate(cut.max(14));
            if let Ok(m) = parse(&f, 9000) {
                let before = f.clone();
                if complete_partial(&mut f, &m) == Completion::Completed {
                    let off = m.l4_offset as usize + if m.ip_proto == ipproto::TCP { 16 } else { 6 };
                    for (i, (a, b)) in before.iter().zip(&f).enumerate() {
                        if i != off && i != off + 1 {
                            proptest::prop_assert_eq!(a, b, "byte {} changed", i);
                        }
                    }
                    proptest::prop_assert_eq!(l4_checksum_ok(&f, &m), Some(true));
                } else {
                    proptest::prop_assert_eq!(&before, &f);
                }
            }
        }
    }
}
