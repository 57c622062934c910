//! The byte layouts of `wit/plugin.wit` as constants, shared by the guest SDK and the host
//! (`wasmswitch-plugin-host` depends on this module so the two sides cannot drift apart).
//!
//! All integers are little-endian. See the WIT file for the field-by-field description.

/// Layout version carried in every batch header.
pub const LAYOUT_VERSION: u16 = 2;
/// The WIT package this SDK implements.
pub const WIT_PACKAGE: &str = "wasmswitch:plugin@0.2.0";
/// Name of the host interface as it appears in a component's imports.
pub const HOST_INTERFACE: &str = "wasmswitch:plugin/host@0.2.0";

/// Size of the batch header.
pub const BATCH_HEADER_LEN: usize = 16;
/// Size of the fixed part of a packet record (before the header snapshot).
pub const RECORD_META_LEN: usize = 16;
/// Largest header snapshot a plugin may ask for.
pub const MAX_HEADER_BYTES: usize = 1024;
/// Largest batch the layout allows (the switch sends at most 64 today).
pub const MAX_BATCH: usize = 256;
/// Size of one verdict record.
pub const VERDICT_LEN: usize = 4;
/// Size of one counter-delta record in the trailer of a `process` result (id u32, delta u64).
pub const COUNTER_DELTA_LEN: usize = 12;
/// Most counter-delta records one result may carry (one per counter a plugin may register).
pub const MAX_COUNTER_DELTAS: usize = 64;

/// Batch header field offsets.
pub mod hdr {
    /// `u16`: the layout version, [`LAYOUT_VERSION`](super::LAYOUT_VERSION) for this SDK.
    pub const VERSION: usize = 0;
    /// `u16`: packets in the batch, 1 to [`MAX_BATCH`](super::MAX_BATCH) (at most the switch's
    /// `switch.batch`, 64 by default).
    pub const COUNT: usize = 2;
    /// `u16`: bytes per packet record, [`stride`](super::stride)`(header-bytes)`.
    pub const STRIDE: usize = 4;
    /// `u16`: the plugin's snapshot size N from its YAML `header-bytes`, 0 to
    /// [`MAX_HEADER_BYTES`](super::MAX_HEADER_BYTES).
    pub const HEADER_BYTES: usize = 6;
    /// `u16`: ingress port id, the port's position in the config's port list at start (the host
    /// port's is the one after them); a reload keeps running ports' ids.
    pub const IN_PORT: usize = 8;
    /// `u16`: ingress queue index on that port.
    pub const QUEUE: usize = 10;
}

/// Packet record field offsets.
pub mod rec {
    /// `u16`: frame length in bytes (the whole frame, not only the snapshot).
    pub const LEN: usize = 0;
    /// `u16`: the bits of [`flags`](super::flags) (VLAN-tagged, IPv4, IPv6, ports parsed, fragment,
    /// group destination MAC, 802.1Q outer tag); other bits are 0.
    pub const FLAGS: usize = 2;
    /// `u16`: the VLAN the frame is switched in: its 802.1Q tag's VID, or the ingress port's PVID
    /// for an untagged or priority-tagged frame; 0 when the switch is not in `l2` mode.
    pub const VLAN: usize = 4;
    /// `u16`: the ethertype after the VLAN tags (0x0800 IPv4, 0x86dd IPv6, ...).
    pub const ETHERTYPE: usize = 6;
    /// `u16`: offset of the IPv4/IPv6 header in the frame; 0 when the frame is not IP.
    pub const L3_OFFSET: usize = 8;
    /// `u16`: offset of the TCP/UDP header in the frame; 0 when not parsed (check
    /// [`flags::L4_PORTS`](super::flags::L4_PORTS) before reading ports there).
    pub const L4_OFFSET: usize = 10;
    /// `u8`: IP protocol, or the final IPv6 next header after any extension headers; 0 when not IP.
    pub const IP_PROTO: usize = 12;
    /// `u16`: valid snapshot bytes, `min(len, header-bytes)`.
    pub const CAPLEN: usize = 14;
    /// Start of the snapshot: the frame's first `caplen` bytes, zero-padded to `stride - 16`.
    pub const HEADERS: usize = 16;
}

/// Bits of the record's `flags` field: the switch parser's own flags, passed to the plugin as
/// they are (one definition, in `wasmswitch-wire`, for both sides).
pub use wasmswitch_wire::flags;

/// Verdict kinds (byte 0 of a verdict record).
pub mod kind {
    /// Continue to L2 forwarding.
    pub const PASS: u8 = 0;
    /// Discard the packet: it is neither forwarded nor delivered to the host.
    pub const DROP: u8 = 1;
    /// Send the packet out of the port in bytes 2..4 only, skipping the forwarding database.
    pub const REDIRECT: u8 = 2;
    /// Deliver the packet to the switch's host port instead of forwarding it.
    pub const HOST: u8 = 3;
    /// Forward as [`PASS`] and also send a copy to the host port.
    pub const HOST_COPY: u8 = 4;
}

/// Bytes per packet record for a given header snapshot size: 16 + N rounded up to 8, so that
/// every record starts 8-byte aligned.
#[inline]
pub const fn stride(header_bytes: usize) -> usize {
    RECORD_META_LEN + ((header_bytes + 7) & !7)
}

/// Total size of a batch of `count` packets.
#[inline]
pub const fn batch_len(count: usize, header_bytes: usize) -> usize {
    BATCH_HEADER_LEN + count * stride(header_bytes)
}

/// What happens to one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum Verdict {
    /// Continue to L2 forwarding (the default).
    #[default]
    Pass,
    /// Drop the packet.
    Drop,
    /// Send the packet out of this port only, skipping the forwarding database.
    Redirect(u16),
    /// Deliver the packet to the host instead of forwarding it.
    Host,
    /// Forward as `Pass` and also send a copy to the host (sampling, monitoring).
    HostCopy,
}

impl Verdict {
    /// The 4-byte wire record.
    #[inline]
    pub const fn encode(self) -> [u8; 4] {
        match self {
            Verdict::Pass => [kind::PASS, 0, 0, 0],
            Verdict::Drop => [kind::DROP, 0, 0, 0],
            Verdict::Redirect(p) => {
                let b = p.to_le_bytes();
                [kind::REDIRECT, 0, b[0], b[1]]
            }
            Verdict::Host => [kind::HOST, 0, 0, 0],
            Verdict::HostCopy => [kind::HOST_COPY, 0, 0, 0],
        }
    }

    /// Parses a 4-byte wire record; `None` for an unknown kind.
    #[inline]
    pub const fn decode(r: [u8; 4]) -> Option<Verdict> {
        Some(match r[0] {
            kind::PASS => Verdict::Pass,
            kind::DROP => Verdict::Drop,
            kind::REDIRECT => Verdict::Redirect(u16::from_le_bytes([r[2], r[3]])),
            kind::HOST => Verdict::Host,
            kind::HOST_COPY => Verdict::HostCopy,
            _ => return None,
        })
    }
}

/// Metadata of one packet as the host writes it into a record (everything but the snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordMeta {
    /// Frame length in bytes (the whole frame, not only the snapshot).
    pub len: u16,
    /// What the parser found, as [`flags`] bits (tagged, IPv4/IPv6, ports parsed, fragment, ...).
    pub flags: u16,
    /// The VLAN the frame is switched in (its 802.1Q VID, or the ingress port's PVID when
    /// untagged); 0 when none is known (not in `l2` mode, or untagged in the test harness).
    pub vlan: u16,
    /// Ethertype after any VLAN tags (0x0800 IPv4, 0x86dd IPv6, ...).
    pub ethertype: u16,
    /// Offset of the IPv4/IPv6 header in the frame; 0 when not IP.
    pub l3_offset: u16,
    /// Offset of the TCP/UDP header in the frame; 0 when not parsed (see [`flags::L4_PORTS`]).
    pub l4_offset: u16,
    /// IP protocol, or the final IPv6 next header; 0 when not IP.
    pub ip_proto: u8,
}

impl From<&wasmswitch_wire::PacketMeta> for RecordMeta {
    // Per packet, from the host's encoder in another crate.
    #[inline]
    fn from(m: &wasmswitch_wire::PacketMeta) -> Self {
        Self {
            len: m.len,
            flags: m.flags,
            vlan: m.vlan,
            ethertype: m.ethertype,
            l3_offset: m.l3_offset,
            l4_offset: m.l4_offset,
            ip_proto: m.ip_proto,
        }
    }
}

/// Writes a batch header into `out[..16]`.
#[inline]
pub fn write_batch_header(out: &mut [u8], count: u16, header_bytes: u16, in_port: u16, queue: u16) {
    let h = &mut out[..BATCH_HEADER_LEN];
    h[0..2].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
    h[2..4].copy_from_slice(&count.to_le_bytes());
    h[4..6].copy_from_slice(&(stride(header_bytes as usize) as u16).to_le_bytes());
    h[6..8].copy_from_slice(&header_bytes.to_le_bytes());
    h[8..10].copy_from_slice(&in_port.to_le_bytes());
    h[10..12].copy_from_slice(&queue.to_le_bytes());
    h[12..16].fill(0);
}

/// Writes one packet record (`out` is exactly one stride long): metadata, then the first
/// `min(frame.len(), header_bytes)` bytes of `frame`, then zeros up to the stride.
#[inline]
pub fn write_record(out: &mut [u8], m: &RecordMeta, frame: &[u8], header_bytes: usize) {
    let cap = frame.len().min(header_bytes);
    let (meta, snap) = out.split_at_mut(RECORD_META_LEN);
    // The 16 metadata bytes as two little-endian words: two stores, not nine.
    let lo = m.len as u64 | (m.flags as u64) << 16 | (m.vlan as u64) << 32 | (m.ethertype as u64) << 48;
    let hi = m.l3_offset as u64 | (m.l4_offset as u64) << 16 | (m.ip_proto as u64) << 32 | (cap as u64) << 48;
    meta[..8].copy_from_slice(&lo.to_le_bytes());
    meta[8..].copy_from_slice(&hi.to_le_bytes());
    let cap = cap.min(snap.len());
    snap[..cap].copy_from_slice(&frame[..cap]);
    // Usually nothing to clear: frames are at least 60 bytes and snapshots often 64 or less.
    if cap < snap.len() {
        snap[cap..].fill(0);
    }
}

/// Appends one counter-delta record (the trailer after the verdicts of a `process` result).
#[inline]
pub fn push_counter_delta(out: &mut Vec<u8>, id: u32, delta: u64) {
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&delta.to_le_bytes());
}

/// Splits a `process` result for a batch of `count` packets into its verdict records and its
/// counter-delta trailer, checking the lengths (the host treats an `Err` as a fault).
pub fn split_result(bytes: &[u8], count: usize) -> Result<(&[u8], &[u8]), String> {
    let want = count * VERDICT_LEN;
    let trailer = bytes.len().checked_sub(want).ok_or_else(|| {
        format!("returned {} bytes for {count} packets: fewer than the {want} verdict bytes", bytes.len())
    })?;
    if trailer % COUNTER_DELTA_LEN != 0 {
        return Err(format!(
            "returned {} bytes for {count} packets: {want} verdict bytes, then {trailer} that are not whole counter-delta records of {COUNTER_DELTA_LEN} bytes",
            bytes.len()
        ));
    }
    if trailer / COUNTER_DELTA_LEN > MAX_COUNTER_DELTAS {
        return Err(format!(
            "returned {} counter-delta records after the verdicts of {count} packets: at most {MAX_COUNTER_DELTAS} (one per counter a plugin may register)",
            trailer / COUNTER_DELTA_LEN
        ));
    }
    Ok(bytes.split_at(want))
}

/// The `(id, delta)` pairs of a trailer that [`split_result`] accepted.
#[inline]
pub fn counter_deltas(trailer: &[u8]) -> impl Iterator<Item = (u32, u64)> + '_ {
    trailer.chunks_exact(COUNTER_DELTA_LEN).map(|r| {
        let (id, delta) = r.split_at(4);
        (
            u32::from_le_bytes([id[0], id[1], id[2], id[3]]),
            u64::from_le_bytes([delta[0], delta[1], delta[2], delta[3], delta[4], delta[5], delta[6], delta[7]]),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_trailer_round_trips_and_bad_lengths_are_refused() {
        let mut out = vec![kind::DROP, 0, 0, 0, kind::PASS, 0, 0, 0];
        push_counter_delta(&mut out, 3, 1 << 40);
        push_counter_delta(&mut out, 0, 7);
        let (v, t) = split_result(&out, 2).unwrap();
        assert_eq!(v, &out[..8]);
        assert_eq!(counter_deltas(t).collect::<Vec<_>>(), vec![(3, 1 << 40), (0, 7)]);
        assert_eq!(split_result(&out[..8], 2).unwrap().1.len(), 0, "no trailer is fine");
        assert!(split_result(&out[..7], 2).is_err(), "a verdict byte short");
        let e = split_result(&out[..19], 2).unwrap_err();
        assert!(e.contains("not whole counter-delta records of 12 bytes"), "a partial counter record: {e}");
        let mut long = vec![0u8; 8];
        for i in 0..=MAX_COUNTER_DELTAS as u32 {
            push_counter_delta(&mut long, i, 1);
        }
        let e = split_result(&long, 2).unwrap_err();
        let want = format!(
            "returned {} counter-delta records after the verdicts of 2 packets: at most",
            MAX_COUNTER_DELTAS + 1
        );
        assert!(e.contains(&want), "more records than counters: {e}");
    }
}
