//! Native test harness: craft frames, batch them the way the switch does, run a plugin.
//!
//! ```
//! # use wasmswitch_plugin_sdk::{Packet, Plugin, Verdict};
//! # struct MyPlugin { port: u16 }
//! # impl Plugin for MyPlugin {
//! #     fn init(config: &str) -> Result<Self, String> {
//! #         let port = config.trim().strip_prefix("drop-dport ").and_then(|p| p.parse().ok());
//! #         Ok(MyPlugin { port: port.ok_or("expected `drop-dport N`")? })
//! #     }
//! #     fn verdict(&mut self, p: &Packet<'_>) -> Verdict {
//! #         if p.ports().map(|(_, d)| d) == Some(self.port) { Verdict::Drop } else { Verdict::Pass }
//! #     }
//! # }
//! use wasmswitch_plugin_sdk::harness::{self, Harness};
//! let mut h = Harness::<MyPlugin>::init("drop-dport 53").unwrap();
//! let f = harness::udp4([10, 0, 0, 1], [10, 0, 0, 2], 1234, 53);
//! assert_eq!(h.run_one(&f), Verdict::Drop);
//! ```
//!
//! The batch bytes are built with the same writer ([`crate::abi::write_record`]) the switch
//! uses, the metadata by the switch's own parser and the frames by its builders (both in
//! `wasmswitch-wire`), so a plugin sees here what it sees in the switch.

use wasmswitch_wire::build::{self, IpPair, L4};
use wasmswitch_wire::{self as wire, ethernet, ipproto, MacAddr};

use crate::abi::Verdict;
use crate::abi::{self, RecordMeta};
use crate::host::{backend::NATIVE, Level};
use crate::plugin::Plugin;

/// Default source MAC of crafted frames.
pub const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Default destination MAC of crafted frames.
pub const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// A batch under construction.
#[derive(Clone, Debug)]
pub struct BatchBuilder {
    /// Snapshot size N written in each record: the plugin's `header-bytes`, 0 to 1024 (the
    /// switch's default is 128).
    pub header_bytes: usize,
    /// Ingress port id the batch arrives on (0 unless set with [`BatchBuilder::in_port`]).
    pub in_port: u16,
    /// Ingress queue index on that port (0 unless set with [`BatchBuilder::queue`]).
    pub queue: u16,
    /// Whole Ethernet frames, one packet each, in batch order.
    pub frames: Vec<Vec<u8>>,
}

impl BatchBuilder {
    /// An empty batch whose records carry `header_bytes` of each frame.
    pub fn new(header_bytes: usize) -> Self {
        Self { header_bytes, in_port: 0, queue: 0, frames: Vec::new() }
    }

    /// Sets the ingress port id the batch arrives on.
    pub fn in_port(mut self, port: u16) -> Self {
        self.in_port = port;
        self
    }

    /// Sets the ingress queue index.
    pub fn queue(mut self, q: u16) -> Self {
        self.queue = q;
        self
    }

    /// Appends a whole Ethernet frame (from [`udp4`], [`ethernet()`], ...) as the next packet.
    pub fn push(mut self, frame: Vec<u8>) -> Self {
        self.frames.push(frame);
        self
    }

    /// Encodes the batch exactly as the switch would.
    pub fn encode(&self) -> Vec<u8> {
        let n = self.header_bytes;
        let stride = abi::stride(n);
        let mut out = vec![0u8; abi::batch_len(self.frames.len(), n)];
        abi::write_batch_header(&mut out, self.frames.len() as u16, n as u16, self.in_port, self.queue);
        for (i, f) in self.frames.iter().enumerate() {
            let start = abi::BATCH_HEADER_LEN + i * stride;
            abi::write_record(&mut out[start..start + stride], &parse(f), f, n);
        }
        out
    }
}

/// A plugin instance under test, with the switch's host functions recorded per thread.
pub struct Harness<P: Plugin> {
    /// The plugin as `P::init` built it: inspect or change its state between batches.
    pub plugin: P,
    /// Header bytes used by [`Harness::run_one`] and [`Harness::run_frames`].
    pub header_bytes: usize,
    out: Vec<u8>,
}

impl<P: Plugin> Harness<P> {
    /// Resets this thread's recorded logs/counters/clock and runs `P::init(config)`.
    pub fn init(config: &str) -> Result<Self, String> {
        reset();
        let plugin = P::init(config)?;
        crate::host::flush_counters();
        Ok(Self { plugin, header_bytes: 128, out: Vec::new() })
    }

    /// Runs one batch; returns one verdict per frame.
    pub fn run(&mut self, batch: &BatchBuilder) -> Vec<Verdict> {
        let bytes = batch.encode();
        crate::rt::run_batch(&mut self.plugin, &bytes, &mut self.out).expect("harness batch is well formed");
        // Apply the result as the switch does: check its lengths, count the deltas.
        let (verdicts, trailer) =
            crate::abi::split_result(&self.out, batch.frames.len()).expect("plugin returned a malformed result");
        for (id, delta) in crate::abi::counter_deltas(trailer) {
            crate::host::backend::counter_add(id, delta);
        }
        verdicts
            .chunks_exact(4)
            .map(|r| Verdict::decode([r[0], r[1], r[2], r[3]]).expect("plugin wrote an unknown verdict kind"))
            .collect()
    }

    /// Runs `frames` as one batch arriving on `in_port`.
    pub fn run_frames(&mut self, in_port: u16, frames: &[Vec<u8>]) -> Vec<Verdict> {
        let mut b = BatchBuilder::new(self.header_bytes).in_port(in_port);
        b.frames = frames.to_vec();
        self.run(&b)
    }

    /// Runs a batch of one frame arriving on port 0.
    pub fn run_one(&mut self, frame: &[u8]) -> Verdict {
        self.run_frames(0, &[frame.to_vec()])[0]
    }
}

/// Clears this thread's recorded logs, counters and fake clock.
pub fn reset() {
    NATIVE.with(|h| {
        let mut h = h.borrow_mut();
        h.logs.clear();
        h.names.clear();
        h.values.clear();
        h.clock = None;
    });
}

/// Log lines the plugin wrote on this thread.
pub fn logs() -> Vec<(Level, String)> {
    NATIVE.with(|h| h.borrow().logs.clone())
}

/// Value of the named counter (0 when never registered).
pub fn counter(name: &str) -> u64 {
    NATIVE.with(|h| {
        let h = h.borrow();
        h.names.iter().position(|n| n == name).map_or(0, |i| h.values[i])
    })
}

/// Fixes the clock `now_ns` returns (for time-dependent plugins such as rate limiters).
pub fn set_clock_ns(ns: u64) {
    NATIVE.with(|h| h.borrow_mut().clock = Some(ns));
}

/// The metadata the switch's parser gives `f` (it is the same parser): length only for a frame
/// the switch would drop as malformed before any plugin saw it.
pub fn parse(f: &[u8]) -> RecordMeta {
    match wire::parse(f, usize::MAX) {
        Ok(m) => RecordMeta::from(&m),
        Err(_) => RecordMeta { len: f.len() as u16, ..Default::default() },
    }
}

/// An Ethernet frame with `payload` after the header, zero-padded to 60 bytes.
pub fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    build::ethernet_frame(MacAddr(dst), MacAddr(src), ethertype, payload)
}

/// An IPv4 frame carrying a TCP (6) or UDP (17) header, valid checksums; another protocol
/// carries just the two ports as its payload.
pub fn ip4(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    proto: u8,
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
) -> Vec<u8> {
    let (d, s) = (MacAddr(dst_mac), MacAddr(src_mac));
    match l4_of(proto) {
        Some(l4) => build::l4_frame(d, s, IpPair::V4(src, dst), l4, sport, dport, 0),
        None => build::ipv4_frame(d, s, src, dst, proto, &ports(sport, dport)),
    }
}

/// A UDP/IPv4 frame between the default MACs.
pub fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    ip4(SRC_MAC, DST_MAC, ipproto::UDP, src, dst, sport, dport)
}

/// A TCP/IPv4 frame between the default MACs.
pub fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    ip4(SRC_MAC, DST_MAC, ipproto::TCP, src, dst, sport, dport)
}

/// A TCP (6) or UDP (17) over IPv6 frame between the default MACs; another protocol carries
/// just the two ports as its payload.
pub fn ip6(proto: u8, src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16) -> Vec<u8> {
    let (d, s) = (MacAddr(DST_MAC), MacAddr(SRC_MAC));
    match l4_of(proto) {
        Some(l4) => build::l4_frame(d, s, IpPair::V6(src, dst), l4, sport, dport, 0),
        None => build::ipv6_frame(d, s, src, dst, proto, &ports(sport, dport)),
    }
}

/// TCP without flags (a bare header) or UDP; `None` for any other protocol.
fn l4_of(proto: u8) -> Option<L4> {
    match proto {
        ipproto::TCP => Some(L4::Tcp(0)),
        ipproto::UDP => Some(L4::Udp),
        _ => None,
    }
}

fn ports(sport: u16, dport: u16) -> [u8; 4] {
    let (s, d) = (sport.to_be_bytes(), dport.to_be_bytes());
    [s[0], s[1], d[0], d[1]]
}

/// Inserts an 802.1Q tag with VLAN id `vid` after the MAC addresses.
pub fn with_vlan(mut f: Vec<u8>, vid: u16) -> Vec<u8> {
    build::insert_vlan(&mut f, vid);
    f
}

/// Replaces the source MAC.
pub fn with_src_mac(mut f: Vec<u8>, mac: [u8; 6]) -> Vec<u8> {
    f[ethernet::field::SRC].copy_from_slice(&mac);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::Batch;

    #[test]
    fn batch_round_trip() {
        let b = BatchBuilder::new(64)
            .in_port(3)
            .queue(1)
            .push(with_vlan(udp4([10, 0, 0, 1], [10, 0, 0, 2], 1000, 53), 42))
            .push(ip6(6, [0x20; 16], [0x30; 16], 443, 80))
            .push(vec![0u8; 10]);
        let bytes = b.encode();
        let batch = Batch::new(&bytes).unwrap();
        assert_eq!((batch.len(), batch.in_port(), batch.queue(), batch.header_bytes()), (3, 3, 1, 64));
        let p0 = batch.get(0).unwrap();
        assert_eq!(p0.vlan(), Some(42));
        assert_eq!(p0.l3_offset(), 18);
        assert_eq!(p0.ipv4().unwrap().src(), [10, 0, 0, 1]);
        assert_eq!(p0.ports(), Some((1000, 53)));
        assert_eq!(p0.ip_proto(), Some(17));
        let p1 = batch.get(1).unwrap();
        assert_eq!(p1.ip_addrs().unwrap().0, [0x20; 16]);
        assert_eq!(p1.ports(), Some((443, 80)));
        let p2 = batch.get(2).unwrap();
        assert!(p2.ethernet().is_none() && p2.ports().is_none() && p2.ip_proto().is_none());
        assert!(batch.get(3).is_none());
    }

    #[test]
    fn small_snapshot_hides_ports() {
        let bytes = BatchBuilder::new(20).push(udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2)).encode();
        let p = Batch::new(&bytes).unwrap().get(0).unwrap();
        assert_eq!(p.headers().len(), 20);
        assert!(p.ipv4().is_none(), "IPv4 header lies beyond the 20-byte snapshot");
        assert!(p.ports().is_none());
        assert_eq!(p.len(), 42);
    }

    #[test]
    fn malformed_batches_are_rejected() {
        let mut bytes = BatchBuilder::new(8).push(udp4([1, 1, 1, 1], [2, 2, 2, 2], 1, 2)).encode();
        assert!(Batch::new(&bytes[..bytes.len() - 1]).is_err());
        bytes[0] = 9;
        assert!(Batch::new(&bytes).is_err());
        assert!(Batch::new(&[]).is_err());
    }

    #[test]
    fn verdicts_round_trip() {
        for v in [Verdict::Pass, Verdict::Drop, Verdict::Redirect(513), Verdict::Host, Verdict::HostCopy] {
            assert_eq!(Verdict::decode(v.encode()), Some(v));
        }
        assert_eq!(Verdict::decode([9, 0, 0, 0]), None);
    }

    #[test]
    fn counters_and_logs_are_recorded() {
        reset();
        let c = crate::Counter::register("hits").unwrap();
        assert!(crate::Counter::register("Bad-Name").is_err());
        c.add(3);
        c.inc();
        crate::host::flush_counters();
        assert_eq!(counter("hits"), 4);
        crate::log(Level::Warn, "hello");
        assert_eq!(logs(), vec![(Level::Warn, "hello".to_string())]);
        set_clock_ns(77);
        assert_eq!(crate::now_ns(), 77);
    }

    /// The harness parses as the switch does: ports behind IPv6 extension headers are found
    /// (the harness's own parser stopped at the fixed header), a later fragment has none.
    #[test]
    fn ports_behind_ipv6_extension_headers() {
        let mut f = ip6(17, [0x20; 16], [0x30; 16], 1234, 53);
        // Two 8-byte Destination Options headers between the fixed header and UDP.
        let at = 14 + 40;
        for _ in 0..2 {
            let next = f[14 + 6];
            f.splice(at..at, [next, 0, 1, 4, 0, 0, 0, 0]);
            f[14 + 6] = wasmswitch_wire::ip::ext::DEST_OPTS;
        }
        let plen = (f.len() - at) as u16;
        f[18..20].copy_from_slice(&plen.to_be_bytes());
        let m = parse(&f);
        assert_ne!(m.flags & abi::flags::L4_PORTS, 0, "{m:?}");
        assert_eq!((m.ip_proto, m.l4_offset), (17, at as u16 + 16));
        let bytes = BatchBuilder::new(128).push(f).encode();
        assert_eq!(Batch::new(&bytes).unwrap().get(0).unwrap().ports(), Some((1234, 53)));
    }
}
