//! Traffic generator: a table of prebuilt frames cycled through, so generating a packet costs
//! one copy of its bytes (what a NIC's DMA would cost the memory system, no more).

use wasmswitch_core::wire::build::{insert_vlan, l4_frame, IpPair, L4};
use wasmswitch_core::wire::MacAddr;

use crate::Pacer;

/// The MAC address number `i` of generator port `port`: `02:00:PP:ii:ii:ii` (disjoint ranges per port, locally
/// administered), so a generator can address another port's hosts.
pub fn mac_for(port: u16, i: u32) -> MacAddr {
    MacAddr::from_u64(0x0200_0000_0000 | (port as u64) << 24 | (i as u64 & 0xff_ffff))
}

/// What a generator sends.
#[derive(Clone, Debug)]
pub struct TrafficSpec {
    /// This port's index: its source MACs are `mac_for(port, 0..src_macs)`.
    pub port: u16,
    /// Distinct source MACs.
    pub src_macs: u32,
    /// Ports whose hosts are destinations (their MACs are `mac_for(p, 0..src_macs)`).
    pub dst_ports: Vec<u16>,
    /// Frame sizes, cycled (e.g. `[64]`, or an IMIX `[64, 64, 64, 64, 64, 64, 64, 576, 576, 576, 1500]`).
    pub frame_sizes: Vec<usize>,
    /// Share of broadcast frames, 0.0..=1.0.
    pub broadcast: f64,
    /// Distinct source IPs / UDP ports (flow spread).
    pub flows: u32,
    /// VLAN tags: none when empty; otherwise source MAC `i` speaks in VLAN `vlans[i % len]`
    /// and addresses hosts of the same VLAN (so learned destinations are found).
    pub vlans: Vec<u16>,
    /// IPv6 instead of IPv4.
    pub ipv6: bool,
    /// UDP, or TCP with flags.
    pub l4: L4,
    /// Destination TCP/UDP port.
    pub dst_port: u16,
    /// Packets per second; `None` = as fast as the queue is polled.
    pub rate_pps: Option<u64>,
    /// Prebuilt frames to cycle through.
    pub templates: usize,
    /// Seeds the choice of sources, destinations and flows: one seed, one template table.
    pub seed: u64,
}

impl Default for TrafficSpec {
    fn default() -> Self {
        Self {
            port: 0,
            src_macs: 256,
            dst_ports: vec![1],
            frame_sizes: vec![64],
            broadcast: 0.05,
            flows: 1024,
            vlans: Vec::new(),
            ipv6: false,
            l4: L4::Udp,
            dst_port: 5001,
            rate_pps: None,
            templates: 1024,
            seed: 1,
        }
    }
}

/// A table of prebuilt frames, a cursor into it and an optional rate limit.
pub struct TrafficGen {
    frames: Vec<Vec<u8>>,
    next: usize,
    pacer: Option<Pacer>,
}

impl TrafficGen {
    /// Builds `spec.templates` frames (at least one) as `spec` describes.
    pub fn new(spec: &TrafficSpec) -> Self {
        let mut rng = fastrand::Rng::with_seed(spec.seed ^ (spec.port as u64) << 32);
        let n = spec.templates.max(1);
        let frames = (0..n)
            .map(|i| {
                let size = spec.frame_sizes[i % spec.frame_sizes.len().max(1)].max(60);
                let macs = spec.src_macs.max(1);
                let s = rng.u32(..macs);
                let src = mac_for(spec.port, s);
                // The VLAN of source `s`, and a destination index speaking in the same one.
                #[expect(clippy::cast_possible_truncation, reason = "a port carries at most 4094 VLANs")]
                let nv = spec.vlans.len().max(1) as u32;
                let lane = s % nv;
                let peer = |rng: &mut fastrand::Rng| {
                    let j = rng.u32(..macs.div_ceil(nv)) * nv + lane;
                    // Past the last MAC only when it is not in lane 0's row: one row back.
                    if j >= macs {
                        j - nv
                    } else {
                        j
                    }
                };
                // Broadcast share is exact over the template table, not just on average.
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "floors on purpose: `i` times a share of at most 1"
                )]
                let bcast = ((i + 1) as f64 * spec.broadcast) as usize > (i as f64 * spec.broadcast) as usize;
                let dst = if bcast || spec.dst_ports.is_empty() {
                    MacAddr::BROADCAST
                } else {
                    let port = spec.dst_ports[rng.usize(..spec.dst_ports.len())];
                    mac_for(port, peer(&mut rng))
                };
                let flow = rng.u32(..spec.flows.max(1));
                // The port's low byte and the flow's two low bytes.
                let [_, port_lo] = spec.port.to_be_bytes();
                let [.., flow_hi, flow_lo] = flow.to_be_bytes();
                let sip = [10, port_lo, flow_hi, flow_lo];
                let dip = [10, 200, flow_hi, flow_lo];
                let ip = if spec.ipv6 {
                    // fd77:<port>::<flow> to fd77:200::<flow>.
                    let v6 = |a: u8| [0xfd, 0x77, 0, a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, sip[2], sip[3]];
                    IpPair::V6(v6(port_lo), v6(200))
                } else {
                    IpPair::V4(sip, dip)
                };
                let sport = 1024 + (flow % 50000) as u16;
                let mut f = l4_frame(dst, src, ip, spec.l4, sport, spec.dst_port, size);
                if let Some(&vid) = spec.vlans.get(lane as usize) {
                    insert_vlan(&mut f, vid);
                }
                f
            })
            .collect();
        Self { frames, next: 0, pacer: spec.rate_pps.map(Pacer::new) }
    }

    /// A generator that cycles through the given frames (tests).
    pub fn from_frames(frames: Vec<Vec<u8>>) -> Self {
        assert!(!frames.is_empty(), "a generator needs at least one frame");
        Self { frames, next: 0, pacer: None }
    }

    /// The shared rate of a rate-limited generator (see [`crate::SimQueue::rate_handle`]).
    pub fn rate_handle(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        self.pacer.as_ref().map(|p| p.rate().clone())
    }

    /// How many packets to generate this burst (rate limiting happens here, once per burst).
    #[inline]
    pub fn budget(&mut self, max: usize) -> usize {
        match &mut self.pacer {
            None => max,
            Some(p) => p.budget(max),
        }
    }

    /// The frames from the cursor on, cycling without end; the cursor moves `n` frames now, so
    /// that a burst of `n` reads them with the position in a register, not in `self`.
    #[inline]
    pub fn burst(&mut self, n: usize) -> Frames<'_> {
        let at = self.next;
        self.next = (at + n) % self.frames.len();
        Frames { frames: &self.frames, at }
    }
}

/// The generator's frames in order from a position, cycling (see [`TrafficGen::burst`]).
pub struct Frames<'a> {
    frames: &'a [Vec<u8>],
    at: usize,
}

impl<'a> Iterator for Frames<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let f = &self.frames[self.at];
        self.at = if self.at + 1 == self.frames.len() { 0 } else { self.at + 1 };
        Some(f)
    }
}
