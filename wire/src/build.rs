//! Frame builders for the traffic generator, tests and the plugin test harness.
//!
//! They build frames of at most 64 KiB (the generator's fit a pool frame): the IP and UDP
//! length fields are 16 bits, and a longer frame would get them wrapped.

use alloc::vec::Vec;

use crate::checksum::{checksum, fill_l4_checksum};
use crate::ethernet::MacAddr;
use crate::{ethertype, ipproto};

fn eth_header(out: &mut Vec<u8>, dst: MacAddr, src: MacAddr, ethertype: u16) {
    out.extend_from_slice(&dst.0);
    out.extend_from_slice(&src.0);
    out.extend_from_slice(&ethertype.to_be_bytes());
}

#[expect(clippy::cast_possible_truncation, reason = "frames are at most 64 KiB: header length fields are 16 bits")]
fn ipv4_header(out: &mut Vec<u8>, src: [u8; 4], dst: [u8; 4], proto: u8, payload_len: usize) {
    let start = out.len();
    let total = (20 + payload_len) as u16;
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
    out.extend_from_slice(&src);
    out.extend_from_slice(&dst);
    let c = checksum(&out[start..start + 20]);
    out[start + 10..start + 12].copy_from_slice(&c.to_be_bytes());
}

/// Stores the complete TCP/UDP checksum, as a sender without offload would.
fn with_l4_checksum(mut f: Vec<u8>) -> Vec<u8> {
    if let Ok(m) = crate::parse(&f, usize::MAX) {
        fill_l4_checksum(&mut f, &m);
    }
    f
}

/// An Ethernet frame: the header, then `payload`, zero-padded to 60 bytes (a non-IP frame,
/// an ARP request).
pub fn ethernet_frame(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity((14 + payload.len()).max(60));
    eth_header(&mut f, dst, src, ethertype);
    f.extend_from_slice(payload);
    f.resize(f.len().max(60), 0);
    f
}

/// An Ethernet/IPv4 frame carrying `payload` as protocol `proto` (ICMP, say), valid IP
/// checksum, not padded: the IP length covers `payload` exactly.
pub fn ipv4_frame(dst: MacAddr, src: MacAddr, sip: [u8; 4], dip: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(34 + payload.len());
    eth_header(&mut f, dst, src, ethertype::IPV4);
    ipv4_header(&mut f, sip, dip, proto, payload.len());
    f.extend_from_slice(payload);
    f
}

/// An Ethernet/IPv6 frame carrying `payload` as next header `proto` (no extension headers),
/// not padded: the payload length covers `payload` exactly.
#[expect(clippy::cast_possible_truncation, reason = "frames are at most 64 KiB: header length fields are 16 bits")]
pub fn ipv6_frame(dst: MacAddr, src: MacAddr, sip: [u8; 16], dip: [u8; 16], proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(54 + payload.len());
    eth_header(&mut f, dst, src, ethertype::IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[proto, 64]);
    f.extend_from_slice(&sip);
    f.extend_from_slice(&dip);
    f.extend_from_slice(payload);
    f
}

/// An Ethernet/IPv4/UDP frame of exactly `frame_len` bytes (at least 42), valid IP and UDP
/// checksums.
#[expect(clippy::cast_possible_truncation, reason = "frames are at most 64 KiB: header length fields are 16 bits")]
pub fn udp4_frame(
    dst: MacAddr,
    src: MacAddr,
    sip: [u8; 4],
    dip: [u8; 4],
    sport: u16,
    dport: u16,
    frame_len: usize,
) -> Vec<u8> {
    let frame_len = frame_len.max(42);
    let udp_len = frame_len - 34;
    let mut f = Vec::with_capacity(frame_len);
    eth_header(&mut f, dst, src, ethertype::IPV4);
    ipv4_header(&mut f, sip, dip, ipproto::UDP, udp_len);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.resize(frame_len, 0);
    with_l4_checksum(f)
}

/// An Ethernet/IPv4/TCP SYN frame (54 bytes, padded to 60).
pub fn tcp4_frame(dst: MacAddr, src: MacAddr, sip: [u8; 4], dip: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    eth_header(&mut f, dst, src, ethertype::IPV4);
    ipv4_header(&mut f, sip, dip, ipproto::TCP, 20);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(60, 0);
    with_l4_checksum(f)
}

/// An Ethernet/IPv6/TCP frame.
pub fn tcp6_frame(dst: MacAddr, src: MacAddr, sip: [u8; 16], dip: [u8; 16], sport: u16, dport: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(74);
    eth_header(&mut f, dst, src, ethertype::IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0, 0, 20, ipproto::TCP, 64]);
    f.extend_from_slice(&sip);
    f.extend_from_slice(&dip);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    with_l4_checksum(f)
}

/// TCP flag bits, as in the header's 13th byte.
pub mod tcp_flags {
    /// No more data from the sender.
    pub const FIN: u8 = 0x01;
    /// Synchronise sequence numbers (opens a connection).
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push buffered data to the application.
    pub const PSH: u8 = 0x08;
    /// The acknowledgment number is valid.
    pub const ACK: u8 = 0x10;
}

/// Source and destination addresses of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpPair {
    /// IPv4 (source, destination).
    V4([u8; 4], [u8; 4]),
    /// IPv6 (source, destination).
    V6([u8; 16], [u8; 16]),
}

/// What a generated packet carries above IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4 {
    /// UDP with a zero-filled payload.
    Udp,
    /// TCP with these flags ([`tcp_flags`]).
    Tcp(u8),
}

/// An Ethernet/IPv4-or-IPv6/TCP-or-UDP frame of `frame_len` bytes (at least the headers; short
/// IPv4 frames are padded to 60), valid checksums.
#[expect(clippy::cast_possible_truncation, reason = "frames are at most 64 KiB: header length fields are 16 bits")]
pub fn l4_frame(dst: MacAddr, src: MacAddr, ip: IpPair, l4: L4, sport: u16, dport: u16, frame_len: usize) -> Vec<u8> {
    let (proto, l4_hdr) = match l4 {
        L4::Udp => (ipproto::UDP, 8),
        L4::Tcp(_) => (ipproto::TCP, 20),
    };
    let ip_hdr = match ip {
        IpPair::V4(..) => 20,
        IpPair::V6(..) => 40,
    };
    let frame_len = frame_len.max(14 + ip_hdr + l4_hdr);
    let payload = frame_len - 14 - ip_hdr;
    let mut f = Vec::with_capacity(frame_len);
    match ip {
        IpPair::V4(s, d) => {
            eth_header(&mut f, dst, src, ethertype::IPV4);
            ipv4_header(&mut f, s, d, proto, payload);
        }
        IpPair::V6(s, d) => {
            eth_header(&mut f, dst, src, ethertype::IPV6);
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(payload as u16).to_be_bytes());
            f.extend_from_slice(&[proto, 64]);
            f.extend_from_slice(&s);
            f.extend_from_slice(&d);
        }
    }
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    match l4 {
        L4::Udp => {
            f.extend_from_slice(&(payload as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        L4::Tcp(flags) => f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]),
    }
    f.resize(frame_len, 0);
    with_l4_checksum(f)
}

/// Inserts an 802.1Q tag with `vid` after the MAC addresses.
pub fn insert_vlan(frame: &mut Vec<u8>, vid: u16) {
    let tci = (vid & 0x0fff).to_be_bytes();
    let tag = [0x81, 0x00, tci[0], tci[1]];
    frame.splice(12..12, tag);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l4_frames_parse_back() {
        let (a, b) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        for (ip, l4, len) in [
            (IpPair::V4([10, 0, 0, 1], [10, 0, 0, 2]), L4::Tcp(tcp_flags::SYN | tcp_flags::ACK), 64),
            (IpPair::V6([0x20; 16], [0x30; 16]), L4::Udp, 100),
            (IpPair::V6([0x20; 16], [0x30; 16]), L4::Tcp(tcp_flags::RST), 60),
        ] {
            let f = l4_frame(a, b, ip, l4, 1234, 80, len);
            let m = crate::parse(&f, 1518).unwrap();
            assert_eq!(m.ports(&f), Some((1234, 80)));
            assert!(f.len() >= len);
            if let L4::Tcp(flags) = l4 {
                assert_eq!(m.ip_proto, ipproto::TCP);
                assert_eq!(f[m.l4_offset as usize + 13], flags);
            } else {
                assert_eq!(m.ip_proto, ipproto::UDP);
            }
            let completion = crate::checksum::complete_partial(&mut f.clone(), &m);
            assert_eq!(completion, crate::checksum::Completion::Untouched, "checksums complete");
        }
    }
}
