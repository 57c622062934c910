//! Frame builders for the traffic generator, tests and the plugin test harness.

use super::checksum::{checksum, fill_l4_checksum};
use super::ethernet::MacAddr;
use super::{ethertype, ipproto};

fn eth_header(out: &mut Vec<u8>, dst: MacAddr, src: MacAddr, ethertype: u16) {
    out.extend_from_slice(&dst.0);
    out.extend_from_slice(&src.0);
    out.extend_from_slice(&ethertype.to_be_bytes());
}

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
    if let Ok(m) = super::parse(&f, usize::MAX) {
        fill_l4_checksum(&mut f, &m);
    }
    f
}

/// An Ethernet/IPv4/UDP frame of exactly `frame_len` bytes (at least 42), valid IP and UDP
/// checksums.
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

/// Inserts an 802.1Q tag with `vid` after the MAC addresses.
pub fn insert_vlan(frame: &mut Vec<u8>, vid: u16) {
    let tci = (vid & 0x0fff).to_be_bytes();
    let tag = [0x81, 0x00, tci[0], tci[1]];
    frame.splice(12..12, tag);
}
